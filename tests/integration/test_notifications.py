"""Event notifications on queues: QUEUE_ACTIVATION (event-based activation) and the rules of
spec 19 (T-EN-01)."""

from __future__ import annotations

import datetime as dt

import psycopg
import pytest

from airflow_broker import Broker, BrokerError
from airflow_broker.events import QUEUE_ACTIVATION, EventInstance
from airflow_broker.worker import BrokerWorker
from tests.support.brokers import App
from tests.support.helpers import snapshot

POST_EVENT = "http://schemas.microsoft.com/SQL/Notifications/PostEventNotification"


def notifications(broker: Broker, queue: str) -> list[EventInstance]:
    with broker.transaction() as tx:
        return [EventInstance.from_message(m) for m in tx.receive(queue)
                if m.message_type_name.endswith("EventNotification")]


@pytest.fixture
def subscribed(app: App) -> App:
    with app.broker.transaction() as tx:
        for name in ("N1", "N2"):
            tx.create_queue(f"q_{name}")
            tx.create_service(name, f"q_{name}", [POST_EVENT])
        tx.create_event_notification("activate 1", "q_t", ["QUEUE_ACTIVATION"], "N1")
    return app


def test_T_EN_01_queue_activation(subscribed: App) -> None:
    broker = subscribed.broker
    worker = BrokerWorker(broker)
    assert worker.run_once().readers_started == 0
    assert notifications(broker, "q_N1") == []  # nothing to activate for

    handle = subscribed.dialog()
    with broker.transaction() as tx:
        tx.send(handle, "Req", "first")
    worker.run_once()
    (event,) = notifications(broker, "q_N1")
    assert event.event_type == QUEUE_ACTIVATION
    assert (event.schema_name, event.object_name, event.object_type) == ("public", "q_t", "QUEUE")
    with psycopg.connect(broker.dsn) as conn:
        row = conn.execute("SELECT current_database()").fetchone()
    assert row is not None and event.database_name == row[0]
    assert [child.tag for child in event.document] == [
        "EventType", "PostTime", "SPID", "ServerName", "LoginName", "UserName", "DatabaseName",
        "SchemaName", "ObjectName", "ObjectType"]

    # No second notification while nobody RECEIVEs, even as messages keep arriving...
    with broker.transaction() as tx:
        tx.send(handle, "Req", "second")
    broker.advance_clock(dt.timedelta(seconds=30))
    worker.run_once()
    assert notifications(broker, "q_N1") == []
    # ...until the notification time-out passes.
    broker.advance_clock(dt.timedelta(seconds=31))
    worker.run_once()
    assert len(notifications(broker, "q_N1")) == 1

    # RECEIVEs happen and the backlog stays: one more notification per ramp-up interval.
    with broker.transaction() as tx:
        tx.send(handle, "Req", "third")
        assert tx.receive("q_t", 1)
    worker.run_once()
    assert notifications(broker, "q_N1") == []
    broker.advance_clock(dt.timedelta(seconds=6))
    worker.run_once()
    assert len(notifications(broker, "q_N1")) == 1

    # Emptying the queue makes the monitor INACTIVE; the next message notifies again.
    with broker.transaction() as tx:
        while tx.receive("q_t"):
            pass
    worker.run_once()
    with psycopg.connect(broker.dsn) as conn:
        state = conn.execute("SELECT state FROM broker.dm_broker_queue_monitors"
                             " WHERE queue_name = 'q_t'").fetchone()
    assert state == ("INACTIVE",)
    with broker.transaction() as tx:
        tx.send(handle, "Req", "again")
    worker.run_once()
    assert len(notifications(broker, "q_N1")) == 1


def test_T_EN_01_every_subscription_is_notified(subscribed: App) -> None:
    with subscribed.broker.transaction() as tx:
        tx.create_event_notification("activate 2", "q_t", ["QUEUE_ACTIVATION"], "N2")
        handle = tx.begin_dialog("I", "T", "C")
        tx.send(handle, "Req", "x")
    BrokerWorker(subscribed.broker).run_once()
    assert len(notifications(subscribed.broker, "q_N1")) == 1
    assert len(notifications(subscribed.broker, "q_N2")) == 1


def test_T_EN_01_exclusive_with_internal_activation(subscribed: App) -> None:
    broker = subscribed.broker
    before = snapshot(broker)
    with pytest.raises(BrokerError) as enabling, broker.transaction() as tx:
        tx.alter_queue("q_t", activation_status=True, activation_procedure="pkg.mod:reader",
                       max_queue_readers=1)
    assert enabling.value.number == 9717
    with broker.transaction() as tx:
        tx.create_queue("q_active", activation_procedure="pkg.mod:reader", max_queue_readers=1)
    with pytest.raises(BrokerError) as creating, broker.transaction() as tx:
        tx.create_event_notification("clash", "q_active", ["QUEUE_ACTIVATION"], "N1")
    assert creating.value.number == 9718
    with broker.transaction() as tx:  # BROKER_QUEUE_DISABLED is allowed there
        tx.create_event_notification("disabled", "q_active", ["BROKER_QUEUE_DISABLED"], "N1")
    for events, number in ((["ALTER_TABLE"], 50110), ([], 50110)):
        with pytest.raises(BrokerError) as bad, broker.transaction() as tx:
            tx.create_event_notification("bad", "q_t", events, "N1")
        assert bad.value.number == number
    with pytest.raises(BrokerError) as duplicate, broker.transaction() as tx:
        tx.create_event_notification("activate 1", "q_t", ["BROKER_QUEUE_DISABLED"], "N1")
    assert duplicate.value.number == 2714
    after = snapshot(broker)
    assert after["endpoints"] == before["endpoints"]


def test_dropping_the_notification_ends_its_dialog(subscribed: App) -> None:
    broker = subscribed.broker
    with broker.transaction() as tx:
        tx.send(tx.begin_dialog("I", "T", "C"), "Req", "x")
    BrokerWorker(broker).run_once()
    assert len(notifications(broker, "q_N1")) == 1
    with broker.transaction() as tx:
        tx.drop_event_notification("activate 1", "q_t")
    with broker.transaction() as tx:
        (end,) = tx.receive("q_N1")
    assert end.is_end_dialog
    with psycopg.connect(broker.dsn) as conn:
        assert conn.execute("SELECT count(*) FROM broker.event_notifications").fetchone() == (0,)


def test_subscriber_ending_the_dialog_drops_the_notification(subscribed: App) -> None:
    broker = subscribed.broker
    with broker.transaction() as tx:
        tx.send(tx.begin_dialog("I", "T", "C"), "Req", "x")
    worker = BrokerWorker(broker)
    worker.run_once()
    with broker.transaction() as tx:
        (message,) = tx.receive("q_N1")
        tx.end_conversation(message.conversation_handle)
    assert worker.run_once().notification_replies == 1
    with psycopg.connect(broker.dsn) as conn:
        assert conn.execute("SELECT count(*) FROM broker.event_notifications").fetchone() == (0,)
