"""The triggers on their own, in an event loop, against the test's PostgreSQL database:
serialisation, WAITFOR semantics (filters, locked groups, disabled queues, NOTIFY wake-ups,
reconnects), and the AssetWatcher stream's acknowledgement protocol."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import uuid
from collections.abc import AsyncGenerator, Iterator
from typing import Any, cast

import psycopg
import pytest
from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

from airflow_broker import END_DIALOG, Broker, BrokerError
from airflow_broker.worker import BrokerWorker
from tests.fixtures.airflow import BROKER_CONN_ENV, connection_json, waiters
from tests.support import roles
from tests.support.airflow_helpers import poison, stock_trade_spec
from tests.support.airflow_provider import (
    BrokerHook,
    BrokerMessageTrigger,
    BrokerStreamProducer,
    QueueDisabledSensor,
    QueueDisabledTrigger,
    WaitForReceiveTrigger,
    apply_spec,
)
from tests.support.brokers import App


def in_(seconds: float) -> str:
    return (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)).isoformat()


def fire(trigger: WaitForReceiveTrigger) -> dict[str, Any]:
    """Runs the trigger to its (single) event."""
    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            payload: dict[str, Any] = event.payload
            return payload
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(first())


def rows(dsn: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query).fetchall()


@pytest.mark.parametrize("trigger", [
    WaitForReceiveTrigger(queue_name="q", conversation_handle=str(uuid.uuid4()),
                          message_type_names=["A", "B"], poll_interval=2.5, deadline=in_(60)),
    QueueDisabledTrigger(queue_name="alerts", queue_names=["q1", "q2"], deadline=in_(5)),
    BrokerMessageTrigger(queue_name="q", broker_conn_id="other", consumer_name="c",
                         batch_size=3, one_run_per_message=True, ack_timeout=60.0),
])
def test_triggers_serialize(trigger: Any) -> None:
    classpath, kwargs = trigger.serialize()
    assert classpath.startswith("airflow_broker.triggers.broker.")
    module, _, name = classpath.rpartition(".")
    rebuilt = getattr(__import__(module, fromlist=[name]), name)(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)


def test_waitfor_filters(app: App, broker_conn: str) -> None:
    handle = app.dialog()
    other = app.dialog()
    with app.broker.transaction() as tx:
        tx.send(handle, "Req", "x")

    def once(**filters: Any) -> str:
        return str(fire(WaitForReceiveTrigger(queue_name="q_t", deadline=in_(0),
                                              **filters))["status"])

    assert once() == "ready"
    assert once(message_type_names=["Req"]) == "ready"
    assert once(message_type_names=[END_DIALOG]) == "timeout"
    with psycopg.connect(broker_conn) as conn:
        row = conn.execute("SELECT conversation_handle FROM broker.conversation_endpoints"
                           " WHERE NOT is_initiator").fetchone()
    assert row is not None
    assert once(conversation_handle=str(row[0])) == "ready"
    assert once(conversation_handle=str(other)) == "timeout"
    # A group that a reader holds is not receivable; the check leaves no lock behind.
    with app.broker.transaction() as tx:
        assert tx.get_conversation_group("q_t") is not None
        assert once() == "timeout"
    assert once() == "ready"
    with app.broker.transaction() as tx:
        assert [m.text() for m in tx.receive("q_t")] == ["x"]


def test_waitfor_wakes_on_notify(app: App, broker_conn: str) -> None:
    """With an hour between polls, only the NOTIFY of the SEND can wake the trigger before
    its deadline; if it did not, the event would be a timeout."""
    handle = app.dialog()
    trigger = WaitForReceiveTrigger(queue_name="q_t", poll_interval=3600, deadline=in_(300))

    async def scenario() -> dict[str, Any]:
        waiting = asyncio.create_task(trigger.wait())
        while waiters(broker_conn, "q_t") == 0:
            assert not waiting.done(), waiting.result()
            await asyncio.sleep(0.05)
        await asyncio.to_thread(send, app.broker, handle)
        return await waiting

    event = asyncio.run(scenario())
    assert event["status"] == "ready"
    assert waiters(broker_conn, "q_t") == 0  # unregistered


def send(broker: Broker, handle: uuid.UUID, body: str = "hello") -> None:
    with broker.transaction() as tx:
        tx.send(handle, "Req", body)


def test_waitfor_survives_a_lost_connection(app: App, broker_conn: str) -> None:
    handle = app.dialog()
    trigger = WaitForReceiveTrigger(queue_name="q_t", poll_interval=0.5, deadline=in_(300))

    async def scenario() -> dict[str, Any]:
        waiting = asyncio.create_task(trigger.wait())
        while waiters(broker_conn, "q_t") == 0:
            await asyncio.sleep(0.05)
        # What a PostgreSQL restart looks like to the trigger.
        rows(broker_conn, "SELECT pg_terminate_backend(backend_pid) FROM broker.queue_waiters")
        await asyncio.to_thread(send, app.broker, handle)
        return await waiting

    assert asyncio.run(scenario())["status"] == "ready"


def test_waitfor_on_a_disabled_queue(app: App, broker_conn: str) -> None:
    with app.broker.transaction() as tx:
        tx.alter_queue("q_t", status=False)
    event = fire(WaitForReceiveTrigger(queue_name="q_t", deadline=in_(300)))
    assert (event["status"], event["disabled_reason"]) == ("disabled", "ADMIN")
    event = fire(WaitForReceiveTrigger(queue_name="no_such_queue", deadline=in_(300)))
    assert event["status"] == "error" and "208" in event["error"]


def test_queue_disabled_trigger_matches_watched_queues(broker_conn: str) -> None:
    sensor = QueueDisabledSensor(task_id="s", queue_names=["BrokerageQueue", "TraderQueue"])
    with Broker(broker_conn) as broker:
        with broker.transaction() as tx:
            apply_spec(tx, stock_trade_spec())
            apply_spec(tx, sensor.notification_spec())
        poison(broker)
    watched_other = QueueDisabledTrigger(queue_name="AirflowBrokerAlertQueue",
                                         queue_names=["TraderQueue"], deadline=in_(0))
    assert fire(watched_other)["status"] == "timeout"
    event = fire(QueueDisabledTrigger(queue_name="AirflowBrokerAlertQueue",
                                      queue_names=["BrokerageQueue"], deadline=in_(0)))
    assert event["status"] == "ready"
    assert event["event"]["event_type"] == "BROKER_QUEUE_DISABLED"
    (queue_id,) = rows(broker_conn, "SELECT object_id FROM broker.queues"
                                    " WHERE name = 'BrokerageQueue'")[0]
    assert event["event"]["object_id"] == queue_id


# The AssetWatcher stream.


def producer(**kwargs: Any) -> BrokerStreamProducer:
    return BrokerStreamProducer({"queue_name": "q_t", "poll_interval": 0.2, **kwargs})


def stream_of(stream: BrokerStreamProducer) -> AsyncGenerator[tuple[Any, Any], None]:
    return cast("AsyncGenerator[tuple[Any, Any], None]", stream.open_stream())


def clean() -> AdvanceOutcome:
    return AdvanceOutcome(acked=1, failed=0)


def inbox(dsn: str) -> list[tuple[Any, ...]]:
    return rows(dsn, "SELECT inbox_id, state FROM broker.airflow_inbox ORDER BY inbox_id")


def test_stream_keeps_a_stored_event_in_the_inbox_until_a_run_consumes_it(
        app: App, broker_conn: str) -> None:
    handle = app.dialog()
    for body in ("one", "two", "three"):
        send(app.broker, handle, body)

    async def scenario() -> None:
        stream = producer(batch_size=1)
        events = stream_of(stream)
        try:
            first, first_id = await anext(events)
            assert first["body"] == "one"
            # Received into the inbox, not yet stored as an asset event.
            assert rows(broker_conn, "SELECT count(*) FROM q_t") == [(2,)]
            assert inbox(broker_conn) == [(first_id, "claimed")]
            await stream.advance([AdvanceItem(first_id, clean())])
            # Stored: still there until a DAG run has used it.
            assert inbox(broker_conn) == [(first_id, "delivered")]

            _, second_id = await anext(events)
            await stream.advance([AdvanceItem(second_id, AdvanceOutcome(acked=0, failed=1))])
            again, again_id = await anext(events)  # not stored: handed out again
            assert (again_id, again["body"]) == (second_id, "two")
            await stream.advance([AdvanceItem(again_id, clean())])

            _, third_id = await anext(events)
            await stream.advance([AdvanceItem(third_id, AdvanceOutcome(0, 0, rejected=1))])
            assert inbox(broker_conn) == [(first_id, "delivered"), (second_id, "delivered"),
                                          (third_id, "rejected")]  # the dead letter stays
        finally:
            await events.aclose()
            await stream.aclose()

    asyncio.run(scenario())
    assert waiters(broker_conn, "q_t") == 0


@pytest.fixture(params=["superuser", "reader login"])
def connection_login(request: pytest.FixtureRequest, app: App, broker_conn: str,
                     monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """broker_default as the superuser, or as a login holding only RECEIVE on q_t (the recipe
    of docs/security.md for an Airflow deployment that reads q_t)."""
    if request.param == "superuser":
        yield request.param
        return
    with roles.role(broker_conn, *roles.APPLICATION_GRANTS,
                    roles.broker_grant("RECEIVE", "QUEUE::q_t"), prefix="airflow",
                    login=True) as name:
        monkeypatch.setenv(BROKER_CONN_ENV,
                           connection_json(roles.login_dsn(broker_conn, name)))
        yield name


def test_a_burst_folded_into_one_run_is_consumed_exactly_once(
        app: App, broker_conn: str, connection_login: str) -> None:
    """Without one_run_per_message Airflow folds a burst into few DAG runs: every message of
    the burst reaches the run's consume(), once, whatever order the acknowledgements and the
    runs come in. The stream and the runs need no more than RECEIVE on the queue."""
    handles = [app.dialog() for _ in range(20)]
    for number, handle in enumerate(handles):
        send(app.broker, handle, f"order {number}")

    async def stream_all() -> list[dict[str, Any]]:
        stream = producer(batch_size=7)
        events = stream_of(stream)
        payloads: list[dict[str, Any]] = []
        try:
            while len(payloads) < 20:
                payload, inbox_id = await anext(events)
                payloads.append(payload)
                if len(payloads) != 20:  # the last one's acknowledgement comes after its run
                    await stream.advance([AdvanceItem(inbox_id, clean())])
        finally:
            await events.aclose()
            await stream.aclose()
        return payloads

    payloads = asyncio.run(stream_all())
    first_run, second_run = payloads[:1], payloads[1:]
    with BrokerHook() as hook:
        with hook.consume(first_run) as (tx, messages):
            assert [m.text() for m in messages] == ["order 0"]
            for message in messages:
                tx.end_conversation(message.conversation_handle)
        # A try that fails rolls back: the messages stay to be consumed by the next try.
        with pytest.raises(RuntimeError), hook.consume(second_run) as (tx, messages):
            assert len(messages) == 19
            raise RuntimeError("the task failed")
        with hook.consume(second_run) as (tx, messages):
            assert [m.text() for m in messages] == [f"order {n}" for n in range(1, 20)]
            for message in messages:
                tx.end_conversation(message.conversation_handle)
        # A second event for the same messages (after a triggerer crash) finds them consumed.
        with hook.consume(payloads) as (tx, messages):
            assert messages == []

    async def late_acknowledgement() -> None:
        stream = producer()
        try:
            await stream.advance([AdvanceItem(payloads[-1]["inbox_id"], clean())])
        finally:
            await stream.aclose()

    asyncio.run(late_acknowledgement())
    assert {state for _, state in inbox(broker_conn)} == {"consumed"}
    ended = rows(broker_conn, "SELECT count(*) FROM broker.conversation_endpoints"
                              " WHERE state_desc = 'DISCONNECTED_INBOUND'")
    assert ended == [(20,)]


def test_a_delivered_message_no_run_consumed_is_handed_out_again(app: App,
                                                                  broker_conn: str) -> None:
    """Airflow can store an event and start no run for it; a run can fail for good. The
    message is handed out again as a new event, each time later than the last; one a run
    consumed meanwhile is never handed out again."""
    send(app.broker, app.dialog(), "stranded")
    send(app.broker, app.dialog(), "consumed")

    async def scenario() -> None:
        stream = producer(redeliver_after=0.3)
        events = stream_of(stream)
        try:
            stranded, stranded_id = await anext(events)
            consumed, consumed_id = await anext(events)
            await stream.advance([AdvanceItem(stranded_id, clean()),
                                  AdvanceItem(consumed_id, clean())])
            await asyncio.to_thread(consume_all, [consumed])
            for _ in range(2):  # after 0.3 s, then after 0.6 s, with no new message
                again, again_id = await anext(events)
                assert (again_id, again["body"]) == (stranded_id, "stranded")
                await stream.advance([AdvanceItem(again_id, clean())])
            await asyncio.to_thread(consume_all, [stranded])
        finally:
            await events.aclose()
            await stream.aclose()

    asyncio.run(scenario())
    assert [state for _, state in inbox(broker_conn)] == ["consumed", "consumed"]
    assert rows(broker_conn, "SELECT redeliveries FROM broker.airflow_inbox"
                             " ORDER BY inbox_id") == [(2,), (0,)]


def consume_all(payloads: list[dict[str, Any]]) -> None:
    with BrokerHook() as hook, hook.consume(payloads):
        pass


def test_consume_refuses_messages_that_are_not_in_the_inbox(app: App,
                                                            broker_conn: str) -> None:
    handle = app.dialog()
    send(app.broker, handle, "held")
    with BrokerHook() as hook:
        (held,) = hook.claim("task:d/r/t/-1", "q_t")
        unknown = {**held, "inbox_id": held["inbox_id"] + 1000}
        with pytest.raises(BrokerError) as failure, hook.consume([held, unknown]):
            pytest.fail("the block ran")
        assert failure.value.number == 50120
        assert str(held["inbox_id"] + 1000) in str(failure.value)
        # Nothing was consumed: the message that is in the inbox is still there to use.
        assert [state for _, state in inbox(broker_conn)] == ["claimed"]
        with hook.consume([held]) as (_, messages):
            assert [m.text() for m in messages] == ["held"]


def test_worker_purges_consumed_rows_after_a_week(app: App, broker_conn: str) -> None:
    handle = app.dialog()
    send(app.broker, handle, "done")
    with BrokerHook() as hook:
        claimed = hook.claim("task:d/r/t/-1", "q_t")
        with hook.consume(claimed):
            pass
    worker = BrokerWorker(app.broker, activation=False, transport=False)
    assert worker.run_once().inbox_rows_purged == 0
    app.broker.advance_clock(dt.timedelta(days=7, seconds=1))
    assert worker.run_once().inbox_rows_purged == 1
    assert inbox(broker_conn) == []


def test_stream_hands_out_again_what_a_dead_producer_held(app: App, broker_conn: str) -> None:
    handle = app.dialog()
    send(app.broker, handle, "in flight")

    async def scenario() -> None:
        crashed = producer()
        events = stream_of(crashed)
        payload, inbox_id = await anext(events)
        # The triggerer dies before Airflow stored the event: its sessions go.
        rows(broker_conn, "SELECT pg_terminate_backend(holder_pid) FROM broker.airflow_inbox")
        successor = producer()
        redelivered = stream_of(successor)
        try:
            again, again_id = await anext(redelivered)
            assert (again_id, again["message_id"]) == (inbox_id, payload["message_id"])
            await successor.advance([AdvanceItem(again_id, clean())])
        finally:
            await redelivered.aclose()
            await successor.aclose()
            await crashed.aclose()

    asyncio.run(scenario())
    assert [state for _, state in inbox(broker_conn)] == ["delivered"]


def test_one_run_per_message_waits_for_the_acknowledgement(app: App,
                                                            broker_conn: str) -> None:
    handle = app.dialog()
    send(app.broker, handle, "first")
    send(app.broker, handle, "second")

    async def scenario() -> None:
        stream = producer(one_run_per_message=True)
        events = stream_of(stream)
        try:
            first, first_id = await anext(events)
            await stream.advance([AdvanceItem(first_id, clean())])
            assert inbox(broker_conn) == [(first_id, "delivered")]
            following = asyncio.ensure_future(anext(events))
            # Several poll intervals go by: the next message stays on the queue.
            done, _ = await asyncio.wait({following}, timeout=1.0)
            assert not done
            assert rows(broker_conn, "SELECT count(*) FROM q_t") == [(1,)]
            # The DAG run that got the first message acknowledges it.
            await asyncio.to_thread(lambda: BrokerHook().ack([first]))
            second, _ = await following
            assert second["body"] == "second"
        finally:
            await events.aclose()
            await stream.aclose()

    asyncio.run(scenario())


def test_standalone_run_keeps_delivered_messages(app: App, broker_conn: str) -> None:
    """Outside the shared-stream manager nothing tells the trigger that an event is stored:
    the message stays in the inbox, delivered, until a DAG run acknowledges it."""
    handle = app.dialog()
    send(app.broker, handle, "kept")
    trigger = BrokerMessageTrigger(queue_name="q_t", poll_interval=0.2)

    async def scenario() -> None:
        events = cast("AsyncGenerator[Any, None]", trigger.run())
        first = await anext(events)
        assert first.payload["body"] == "kept"
        following = asyncio.ensure_future(anext(events))
        while inbox(broker_conn)[0][1] != "delivered":
            await asyncio.sleep(0.05)
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
        await events.aclose()

    asyncio.run(scenario())
    assert [state for _, state in inbox(broker_conn)] == ["delivered"]


async def lose_a_cancellation(entered: asyncio.Event) -> None:
    """A wait that drops the cancellation it gets, as ``asyncio.wait_for()`` in psycopg's
    socket waits (up to 3.3.5) does on Python 3.11 when the socket becomes ready as the
    cancellation arrives."""
    entered.set()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(3600)


async def cancelled_in_a_lost_wait(awaitable: Any, entered: asyncio.Event) -> str:
    """Cancels the task running ``awaitable`` inside the wait that loses it; what became of the
    task at most 30 s later (a poll takes 0.2 s)."""
    task = asyncio.ensure_future(awaitable)
    await entered.wait()
    task.cancel()
    await asyncio.wait({task}, timeout=30)
    if not task.done():
        task.cancel()  # cancelled again, outside the wait that lost the first
        await asyncio.gather(task, return_exceptions=True)
        return "still running 30 s after its cancellation"
    return "cancelled" if task.cancelled() else f"ended with {task.result()!r}"


def test_a_stream_whose_cancellation_a_wait_lost_stops_at_its_next_poll(
        app: App, broker_conn: str) -> None:
    """Without the check, the stream would poll on until a message arrived and hand it out to
    a watcher that was cancelled."""
    entered = asyncio.Event()

    class LosingClaim(BrokerStreamProducer):
        async def _claim(self, top: int) -> list[dict[str, Any]]:
            if not entered.is_set():
                await lose_a_cancellation(entered)
            return await super()._claim(top)

    async def scenario() -> str:
        stream = LosingClaim({"queue_name": "q_t", "poll_interval": 0.2})
        events = stream_of(stream)
        try:
            return await cancelled_in_a_lost_wait(anext(events), entered)
        finally:
            await events.aclose()
            await stream.aclose()

    assert asyncio.run(scenario()) == "cancelled"
    assert waiters(broker_conn, "q_t") == 0


def test_a_waitfor_whose_cancellation_a_wait_lost_stops_at_its_next_poll(
        app: App, broker_conn: str) -> None:
    entered = asyncio.Event()

    class LosingCheck(WaitForReceiveTrigger):
        async def check(self, conn: Any, schema: str) -> dict[str, Any] | None:
            if not entered.is_set():
                await lose_a_cancellation(entered)
            return await super().check(conn, schema)

    trigger = LosingCheck(queue_name="q_t", poll_interval=0.2)
    assert asyncio.run(cancelled_in_a_lost_wait(trigger.wait(), entered)) == "cancelled"
    assert waiters(broker_conn, "q_t") == 0  # unregistered on the way out


def test_stream_waits_for_its_queue_and_survives_a_lost_connection(
        app: App, broker_conn: str) -> None:
    async def scenario() -> None:
        stream = BrokerStreamProducer({"queue_name": "q_later", "poll_interval": 0.2})
        events = stream_of(stream)
        first = asyncio.ensure_future(anext(events))
        try:
            # The watcher started before its queue existed.
            with app.broker.transaction() as tx:
                tx.create_queue("q_later")
                tx.create_service("Later", "q_later", ["C"])
            while waiters(broker_conn, "q_later") == 0:
                await asyncio.sleep(0.05)
            # What a PostgreSQL restart looks like to the producer.
            rows(broker_conn, "SELECT pg_terminate_backend(backend_pid)"
                              " FROM broker.queue_waiters")
            with app.broker.transaction() as tx:
                handle = tx.begin_dialog("I", "Later", "C")
                tx.send(handle, "Req", "after the reconnect")
            payload, inbox_id = await first
            assert payload["body"] == "after the reconnect"
            await stream.advance([AdvanceItem(inbox_id, clean())])
        finally:
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
            await events.aclose()
            await stream.aclose()

    asyncio.run(scenario())
    assert [state for _, state in inbox(broker_conn)] == ["delivered"]
