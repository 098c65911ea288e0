"""The queue-disabled alert: poison-message detection disables a queue, the alert DAG's sensor
(deferred) gets the BROKER_QUEUE_DISABLED notification, and the alert reaches a real SMTP
server on loopback. Then the queue is enabled again (operator and CLI)."""

from __future__ import annotations

import argparse
import email
import email.policy
import json
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

from airflow_broker import Broker, BrokerError
from airflow_broker.admin.enable_queue import run_enable_queue
from airflow_broker.migrations import install
from tests.fixtures.airflow import (
    Background,
    RunDag,
    connection_json,
    task_states,
    wait_for,
    waiters,
    xcom,
)
from tests.support.airflow_helpers import dag_file, free_port, poison, stock_trade_spec
from tests.support.airflow_provider import QueueDisabledNotifier, apply_spec

ALERT_QUEUE = "AirflowBrokerAlertQueue"


class Mailbox:
    """An aiosmtpd handler that keeps what it is sent."""

    def __init__(self) -> None:
        self.messages: list[email.message.EmailMessage] = []
        self.recipients: list[list[str]] = []

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        raw = envelope.original_content or b""
        message = email.message_from_bytes(raw, policy=email.policy.default)
        assert isinstance(message, email.message.EmailMessage)
        self.messages.append(message)
        self.recipients.append(list(envelope.rcpt_tos))
        return "250 Message accepted for delivery"


@pytest.fixture
def mailbox(monkeypatch: pytest.MonkeyPatch) -> Iterator[Mailbox]:
    handler = Mailbox()
    controller = Controller(handler, hostname="127.0.0.1", port=free_port())
    controller.start()
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", json.dumps({
        "conn_type": "smtp", "host": "127.0.0.1", "port": controller.port,
        "extra": {"disable_tls": True, "disable_ssl": True, "retry_limit": 0,
                  "from_email": "airflow@localhost"}}))
    monkeypatch.setenv("AIRFLOW_VAR_BROKER_ALERT_EMAIL", "ops@example.test")
    try:
        yield handler
    finally:
        controller.stop()


@pytest.fixture
def trading(broker_conn: str) -> Iterator[Broker]:
    broker = Broker(broker_conn, poll_interval=0.2)
    with broker.transaction() as tx:
        apply_spec(tx, stock_trade_spec())
    try:
        yield broker
    finally:
        broker.close()


def test_poisoned_queue_sends_an_alert_email(run_dag: RunDag, trading: Broker,
                                             broker_conn: str, mailbox: Mailbox) -> None:
    def poison_once_waiting() -> None:
        wait_for(lambda: waiters(broker_conn, ALERT_QUEUE) > 0, "the deferred alert sensor")
        poison(trading)

    poisoner = Background(poison_once_waiting)
    poisoner.start()
    dag_run = run_dag("broker_queue_alerts")
    poisoner.join()

    assert task_states(dag_run) == {"wait_for_queue_disabled": "success",
                                    "send_alert": "success", "ack_notification": "success"}
    event = xcom(dag_run, "wait_for_queue_disabled")
    assert event["queue_name"] == "BrokerageQueue"
    assert event["reason"] == "POISON"
    assert "5 consecutive transactions" in event["reason_text"]
    with psycopg.connect(broker_conn) as conn:
        database = conn.execute("SELECT current_database()").fetchone()
    assert database is not None and event["database_name"] == database[0]
    assert event["post_time"] and event["disabled_at"]

    (message,) = mailbox.messages
    assert mailbox.recipients == [["ops@example.test"]]
    assert "BrokerageQueue" in str(message["subject"])
    body = message.get_body(preferencelist=("html", "plain"))
    assert body is not None
    content = body.get_content()
    assert "BrokerageQueue" in content and "POISON" in content
    assert "airflow-broker enable-queue BrokerageQueue" in content

    with psycopg.connect(broker_conn) as conn:
        inbox = conn.execute("SELECT count(*) FROM broker.airflow_inbox").fetchone()
        notifications = conn.execute(
            "SELECT count(*) FROM broker.event_notifications").fetchone()
    assert inbox == (0,)  # acknowledged by the DAG's last task
    assert notifications == (2,)  # one per watched queue, created by the sensor

    # The fix is in: the operator enables the queue again.
    enable_run = run_dag("broker_enable_queue", run_conf={"queue_name": "BrokerageQueue"})
    assert task_states(enable_run) == {"enable_queue": "success"}
    result = xcom(enable_run, "enable_queue")
    assert result["changed"] and result["before"]["disabled_reason"] == "POISON"
    assert result["after"]["is_receive_enabled"] and result["after"]["ready_messages"] == 1


@pytest.mark.parametrize("deferrable", [True, False], ids=["deferred", "poking"])
def test_alert_sensor_waits_for_a_queue_created_later(
        run_dag: RunDag, broker_conn: str, capfd: pytest.CaptureFixture[str],
        deferrable: bool) -> None:
    """The alert DAG may run before the setup that creates the queues it watches: the sensor
    waits for them (CREATE EVENT NOTIFICATION on a missing queue is Msg 15151), creates the
    event notification once the queue exists, and then raises the alert."""
    broker = Broker(broker_conn, poll_interval=0.2)

    def sensor_waits() -> bool:
        if deferrable:
            return waiters(broker_conn, ALERT_QUEUE) > 0
        with psycopg.connect(broker_conn) as conn:  # a poking sensor has no waiter
            row = conn.execute("SELECT count(*) FROM broker.queues WHERE name = %s",
                               [ALERT_QUEUE]).fetchone()
        return row == (1,)

    def notification_exists() -> bool:
        with psycopg.connect(broker_conn) as conn:
            row = conn.execute(
                "SELECT count(*) FROM broker.event_notifications n JOIN broker.queues q"
                " ON q.object_id = n.parent_id WHERE q.name = 'BrokerageQueue'").fetchone()
        return row == (1,)

    ran = threading.Event()

    def set_up_and_poison() -> None:
        wait_for(sensor_waits, "the waiting alert sensor", alive=lambda: not ran.is_set())
        with broker.transaction() as tx:
            apply_spec(tx, stock_trade_spec())
        wait_for(notification_exists, "the event notification on the new queue",
                 alive=lambda: not ran.is_set())
        poison(broker)

    worker = Background(set_up_and_poison)
    try:
        with dag_file("t_alert_on_a_later_queue", f"""
                QueueDisabledSensor(task_id="alert", queue_names=["BrokerageQueue"],
                                    create_notifications=True, poll_interval=0.2,
                                    poke_interval=0.2, timeout=600, soft_fail=True,
                                    deferrable={deferrable})
                """):
            worker.start()
            try:
                dag_run = run_dag("t_alert_on_a_later_queue")
            finally:
                ran.set()
            assert task_states(dag_run) == {"alert": "success"}
            worker.join()
    finally:
        broker.close()
    event = xcom(dag_run, "alert")
    assert (event["queue_name"], event["reason"]) == ("BrokerageQueue", "POISON")
    out = capfd.readouterr().out
    assert ("waiting for queue(s) BrokerageQueue, which do not exist yet (or which this "
            "connection's role holds no permission on); their event notification "
            "airflow_broker_queue_disabled is created once they do") in out
    assert deferrable == (
        "deferring to the triggerer: waiting for BROKER_QUEUE_DISABLED about queue(s) "
        f"BrokerageQueue on notification queue {ALERT_QUEUE}; not created yet: BrokerageQueue"
        in out)
    assert "created event notification airflow_broker_queue_disabled on BrokerageQueue" in out


def test_alert_objects_of_two_broker_schemas_in_one_database(
        run_dag: RunDag, broker_conn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each broker schema gets its own alert queue, whose view is in that schema: in
    "public", the second one was Msg 2714."""
    install(broker_conn, "broker_two")
    monkeypatch.setenv("AIRFLOW_CONN_BROKER_TWO",
                       connection_json(broker_conn, broker_schema="broker_two"))
    with dag_file("t_alerts_in_two_schemas", """
            for conn_id in ("broker_default", "broker_two"):
                QueueDisabledSensor(task_id=conn_id, broker_conn_id=conn_id,
                                    create_notifications=True, poll_interval=0.2, timeout=1,
                                    soft_fail=True)
            """):
        dag_run = run_dag("t_alerts_in_two_schemas")
    assert task_states(dag_run) == {"broker_default": "skipped", "broker_two": "skipped"}
    with psycopg.connect(broker_conn) as conn:
        views = conn.execute(
            "SELECT table_schema FROM information_schema.views WHERE table_name = %s"
            " ORDER BY 1", [ALERT_QUEUE]).fetchall()
    assert views == [("broker",), ("broker_two",)]


def test_enable_queue_command(trading: Broker, broker_conn: str,
                              capsys: pytest.CaptureFixture[str]) -> None:
    with trading.transaction() as tx:
        tx.alter_queue("TraderQueue", status=False)
    args = argparse.Namespace(dsn=broker_conn, schema=None, queue="TraderQueue")
    assert run_enable_queue(args) == 0
    assert "queue TraderQueue enabled" in capsys.readouterr().out
    assert run_enable_queue(args) == 0
    assert "already enabled" in capsys.readouterr().out
    with trading.transaction() as tx:
        assert tx.receive("TraderQueue") == []  # RECEIVE works again
    with pytest.raises(BrokerError, match="208"):
        run_enable_queue(argparse.Namespace(dsn=broker_conn, schema=None, queue="NoSuchQueue"))


def test_notifier_sends_through_any_notifier() -> None:
    from airflow.sdk import BaseNotifier

    sent: list[str] = []

    class Collect(BaseNotifier):
        template_fields = ("text",)

        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

        def notify(self, context: Any) -> None:
            sent.append(self.text)

    notifier = QueueDisabledNotifier(
        notifier=Collect("{{ broker_event.queue_name }} is {{ broker_event.reason }}"))
    context: Any = {"broker_event": {"queue_name": "q_t", "reason": "POISON"}}
    notifier(context)
    assert sent == ["q_t is POISON"]
    with pytest.raises(ValueError, match="recipients"):
        QueueDisabledNotifier()
