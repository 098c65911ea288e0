"""The provider's long-lived connections when the database goes away under them: a
PostgreSQL restart, or its sessions terminated (what a crash-restart, an administrator or a
failover does to a client). Each goes on in place: nothing ends the work it serves, and
nothing is lost or handed out twice."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncGenerator, Callable
from typing import Any, cast

import psycopg
from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

from airflow_broker import Broker
from tests.fixtures.airflow import waiters
from tests.support.airflow_provider import (
    BrokerHook,
    BrokerStreamProducer,
    WaitForReceiveTrigger,
)
from tests.support.brokers import App


def rows(dsn: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query).fetchall()


def send(broker: Broker, bodies: list[str]) -> None:
    with broker.transaction() as tx:
        handle = tx.begin_dialog("I", "T", "C")
        for body in bodies:
            tx.send(handle, "Req", body)


def send_anew(dsn: str, bodies: list[str]) -> None:
    with Broker(dsn) as broker:
        send(broker, bodies)


def clean() -> AdvanceOutcome:
    return AdvanceOutcome(acked=1, failed=0)


def test_the_stream_and_its_acknowledgements_survive_a_database_fault(
        app: App, broker_conn: str, database_fault: Callable[[], None]) -> None:
    """The producer's acknowledgement connection and its stream connection are both dead
    after the fault, but not yet marked closed: the next advance settles its event on a new
    connection, the stream reconnects, and every message is handed out once."""
    send(app.broker, ["one", "two", "three", "four"])

    async def scenario() -> list[str]:
        stream = BrokerStreamProducer({"queue_name": "q_t", "poll_interval": 0.2,
                                       "batch_size": 2})
        events = cast("AsyncGenerator[tuple[Any, Any], None]", stream.open_stream())
        bodies = []
        try:
            first, first_id = await anext(events)
            await stream.advance([AdvanceItem(first_id, clean())])
            second, second_id = await anext(events)
            bodies += [first["body"], second["body"]]
            await asyncio.to_thread(database_fault)
            # The stream reconnects while the acknowledgement of "two" is on its way: the
            # event still in flight is taken over, not handed out again.
            following = asyncio.ensure_future(anext(events))
            await stream.advance([AdvanceItem(second_id, clean())])
            third, third_id = await following
            await stream.advance([AdvanceItem(third_id, clean())])
            fourth, fourth_id = await anext(events)
            await stream.advance([AdvanceItem(fourth_id, clean())])
            bodies += [third["body"], fourth["body"]]
            # Nothing more comes: no duplicate of an event handed out before the fault.
            extra = asyncio.ensure_future(anext(events))
            done, _ = await asyncio.wait({extra}, timeout=1.0)
            assert not done, extra.result()
            extra.cancel()
            await asyncio.gather(extra, return_exceptions=True)
        finally:
            await events.aclose()
            await stream.aclose()
        return bodies

    assert asyncio.run(scenario()) == ["one", "two", "three", "four"]
    assert rows(broker_conn, "SELECT state, count(*) FROM broker.airflow_inbox"
                             " GROUP BY state") == [("delivered", 4)]
    assert rows(broker_conn, "SELECT count(*) FROM q_t") == [(0,)]


def test_a_deferred_wait_survives_a_database_fault(
        app: App, broker_conn: str, database_fault: Callable[[], None]) -> None:
    """A WaitForReceiveTrigger registered as a waiter when the server goes: it registers
    again and fires on a message sent after the fault (by a Broker of its own, so that only
    the trigger's recovery is tested here)."""
    trigger = WaitForReceiveTrigger(queue_name="q_t", poll_interval=0.5,
                                    deadline=(dt.datetime.now(dt.UTC)
                                              + dt.timedelta(seconds=300)).isoformat())

    async def scenario() -> dict[str, Any]:
        waiting = asyncio.create_task(trigger.wait())
        while waiters(broker_conn, "q_t") == 0:
            assert not waiting.done(), waiting.result()
            await asyncio.sleep(0.05)
        await asyncio.to_thread(database_fault)
        while waiters(broker_conn, "q_t") == 0:
            assert not waiting.done(), waiting.result()
            await asyncio.sleep(0.05)
        await asyncio.to_thread(send_anew, broker_conn, ["after the fault"])
        return await waiting

    event = asyncio.run(scenario())
    assert event["status"] == "ready"
    assert len(event["messages"]) == 1


def test_the_inbox_of_a_running_task_survives_a_database_fault(
        app: App, broker_conn: str, database_fault: Callable[[], None]) -> None:
    """A hook kept by a running task: its pool's connections die with the fault, and the next
    claim, consume and ack go through on new ones."""
    send(app.broker, ["before"])
    with BrokerHook() as hook:
        (before,) = hook.claim("task:d/r/t/-1", "q_t")
        database_fault()
        send_anew(broker_conn, ["after"])
        (after,) = hook.claim("task:d/r/t/-1", "q_t")
        with hook.consume([before, after]) as (_, messages):
            assert [m.text() for m in messages] == ["before", "after"]
        assert hook.ack([before, after]) == 2
    assert rows(broker_conn, "SELECT count(*) FROM broker.airflow_inbox") == [(0,)]
