"""WaitForReceiveSensor and QueueDisabledSensor through dag.test(): they defer (their trigger
registers as a WAITFOR waiter) and resume when messages arrive."""

from __future__ import annotations

import psycopg
import pytest

from tests.fixtures.airflow import (
    Background,
    RunDag,
    task_states,
    wait_for,
    waiters,
    xcom,
)
from tests.support.airflow_helpers import dag_file, poison, stock_trade_spec
from tests.support.airflow_provider import QueueDisabledSensor, apply_spec
from tests.support.brokers import App


def test_waitfor_defers_then_receives_into_the_inbox(run_dag: RunDag, app: App,
                                                     broker_conn: str) -> None:
    def send_once_waiting() -> None:
        wait_for(lambda: waiters(broker_conn, "q_t") > 0, "the deferred sensor's WAITFOR")
        with app.broker.transaction() as tx:
            handle = tx.begin_dialog("I", "T", "C")
            tx.send(handle, "Req", "one")
            tx.send(handle, "Req", "two")

    sender = Background(send_once_waiting)
    sender.start()
    dag_run = run_dag("t_wait")
    sender.join()
    assert task_states(dag_run) == {"ready": "success", "received": "success", "use": "success"}
    ready = xcom(dag_run, "ready")
    assert ready["queue_name"] == "q_t"
    assert [m["message_type_name"] for m in ready["messages"]] == ["Req", "Req"]
    received = xcom(dag_run, "received")
    assert [m["body"] for m in received] == ["one", "two"]
    assert xcom(dag_run, "use") == ["one", "two"]
    with psycopg.connect(broker_conn) as conn:
        inbox = conn.execute("SELECT state, count(*) FROM broker.airflow_inbox"
                             " GROUP BY state").fetchall()
        replies = conn.execute("SELECT count(*) FROM q_i").fetchone()
    assert inbox == [("consumed", 2)]  # downstream, in the transaction that replied
    assert replies == (2,)
    assert waiters(broker_conn, "q_t") == 0


def test_sensors_poke_and_time_out(run_dag: RunDag, app: App, broker_conn: str) -> None:
    notifications = QueueDisabledSensor(task_id="s", queue_names=["BrokerageQueue"])
    with app.broker.transaction() as tx:
        apply_spec(tx, stock_trade_spec())
        apply_spec(tx, notifications.notification_spec())
        handle = tx.begin_dialog("I", "T", "C")
        tx.send(handle, "Req", "waiting already")
    poison(app.broker)

    dag_run = run_dag("t_poke")
    assert task_states(dag_run) == {"poke_receive": "success", "poke_disabled": "success",
                                    "times_out": "skipped"}
    assert [m["body"] for m in xcom(dag_run, "poke_receive")] == ["waiting already"]
    assert xcom(dag_run, "poke_disabled")["queue_name"] == "BrokerageQueue"


def test_a_deferring_sensor_logs_what_it_waits_for(run_dag: RunDag, app: App,
                                                    capfd: pytest.CaptureFixture[str]) -> None:
    """Airflow itself logs only "Pausing task as DEFERRED"."""
    with app.broker.transaction() as tx:
        handle = tx.begin_dialog("I", "T", "C")
    with dag_file("t_logs_its_wait", f"""
            WaitForReceiveSensor(task_id="wait", queue_name="q_t",
                                 conversation_handle="{handle}", message_type_names=["Req"],
                                 timeout=1, soft_fail=True, poll_interval=0.2)
            """):
        dag_run = run_dag("t_logs_its_wait")
    assert task_states(dag_run) == {"wait": "skipped"}
    out = capfd.readouterr().out
    assert ("deferring to the triggerer: waiting for messages RECEIVE could take on queue q_t"
            f" (conversation_handle {handle}; message types Req) until ") in out
    assert "(timeout 1 s, " in out
