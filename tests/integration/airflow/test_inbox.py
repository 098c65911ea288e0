"""Receiving mode: no message is lost when the task dies after its RECEIVE. The task is
SIGKILLed right after the RECEIVE committed; the retry gets exactly the same messages from the
Airflow inbox, and they are processed once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pendulum
import psycopg

from tests.fixtures.airflow import (
    DAGS_FOLDER,
    RunDag,
    task_states,
    wait_for,
    waiters,
    xcom,
)
from tests.support.brokers import App

LOGICAL_DATE = "2026-02-01T00:00:00+00:00"

RUN_ONCE = f"""
import pendulum
from airflow.dag_processing.dagbag import DagBag

dag = DagBag({str(DAGS_FOLDER / "t_kill.py")!r}).get_dag("t_kill")
when = pendulum.parse({LOGICAL_DATE!r})
dag.test(logical_date=when, run_after=when)
"""


def test_messages_survive_a_task_killed_after_its_receive(
        run_dag: RunDag, app: App, broker_conn: str, scratch: Path) -> None:
    with psycopg.connect(broker_conn) as conn:
        conn.execute("CREATE TABLE processed (message_id uuid PRIMARY KEY, body text)")

    with (scratch / "first-try.log").open("w") as log:
        first = subprocess.Popen([sys.executable, "-c", RUN_ONCE], stdout=log,
                                 stderr=subprocess.STDOUT,
                                 env={**os.environ, "T_KILL_AFTER_RECEIVE": "1"})
    # The sensor defers; once its trigger waits on the queue, the messages arrive.
    wait_for(lambda: waiters(broker_conn, "q_t") > 0, "the deferred sensor",
             alive=lambda: first.poll() is None)
    handle = app.dialog()
    with app.broker.transaction() as tx:
        for n in range(3):
            tx.send(handle, "Req", f"trade {n}")
    assert first.wait() == -signal.SIGKILL, (scratch / "first-try.log").read_text()[-3000:]

    with psycopg.connect(broker_conn) as conn:
        left_on_queue = conn.execute("SELECT count(*) FROM q_t").fetchone()
        held = conn.execute(
            "SELECT consumer, message_id::text FROM broker.airflow_inbox ORDER BY inbox_id"
        ).fetchall()
    run_id = f"manual__{LOGICAL_DATE}"
    assert left_on_queue == (0,)  # the RECEIVE committed before the kill
    assert [c for c, _ in held] == [f"task:t_kill/{run_id}/receive/-1"] * 3

    # The retry (same DAG run, next try) finds them in the inbox instead of receiving again.
    when = pendulum.parse(LOGICAL_DATE)
    dag_run = run_dag("t_kill", logical_date=when, run_after=when)
    assert dag_run.run_id == run_id
    assert task_states(dag_run) == {"receive": "success", "process": "success"}
    handed_over = [m["message_id"] for m in xcom(dag_run, "receive")]
    assert handed_over == [m for _, m in held]
    assert [m["body"] for m in xcom(dag_run, "receive")] == ["trade 0", "trade 1", "trade 2"]
    assert xcom(dag_run, "process") == handed_over
    with psycopg.connect(broker_conn) as conn:
        processed = conn.execute("SELECT message_id::text FROM processed").fetchall()
        inbox = conn.execute("SELECT state, count(*) FROM broker.airflow_inbox"
                             " GROUP BY state").fetchall()
    assert sorted(m for (m,) in processed) == sorted(handed_over)
    assert inbox == [("consumed", 3)]  # in the transaction that processed them
