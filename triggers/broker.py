"""Triggers of airflow-broker: WAITFOR in the triggerer, and message streams for AssetWatchers.

Every trigger here talks to PostgreSQL through psycopg's ``AsyncConnection`` only, so none of
them blocks the triggerer's event loop. Waiting follows the engine's WAITFOR: the trigger
registers itself in ``<schema>.queue_waiters`` (SEND only NOTIFYs queues that have a waiter),
LISTENs on the queue's channel, and checks again on every notification and at least every
``poll_interval`` seconds, since a notification is only a hint (one sent while the connection
was down is lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Hashable, Sequence
from typing import Any

import psycopg
from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent
from airflow.triggers.shared_stream import (
    AdvanceItem,
    AdvanceOutcome,
    SharedStreamProducer,
)
from psycopg import sql

from airflow_broker import Message
from airflow_broker.errors import translate
from airflow_broker.events import BROKER_QUEUE_DISABLED, EventInstance
from airflow_broker.hooks.broker import INBOX_COLUMNS, BrokerHook, inbox_row_to_dict
from airflow_broker.messages import EVENT_NOTIFICATION
from airflow_broker.queries import Queries
from airflow_broker.waitfor import queue_channel

AsyncConn = psycopg.AsyncConnection[Any]

# A watcher's message that no DAG run has consumed this long after its event was stored is
# handed out again (then after twice as long, and so on, up to an hour).
DEFAULT_REDELIVER_AFTER = 60.0

log = logging.getLogger(__name__)


def trigger_event(payload: Any) -> TriggerEvent:
    """A TriggerEvent (its constructor is not annotated)."""
    return TriggerEvent(payload)  # type: ignore[no-untyped-call]


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, psycopg.Error):
        broker_error = translate(exc)
        if broker_error is not None:
            return str(broker_error)
    return f"{type(exc).__name__}: {exc}"


class QueueListener:
    """LISTEN plus a ``queue_waiters`` registration on one autocommit AsyncConnection: the
    asynchronous counterpart of the engine's WakeUps."""

    def __init__(self, conn: AsyncConn, schema: str) -> None:
        self.conn = conn
        self.schema = schema
        self.queries = Queries(schema)
        self._waiters: list[uuid.UUID] = []

    async def listen(self, channel: str) -> None:
        await self.conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))

    async def wait_on_queue(self, queue_id: int) -> None:
        """Makes SEND to the queue NOTIFY this connection, from now on."""
        await self.listen(queue_channel(self.schema, queue_id))
        await self.conn.execute(self.queries["waiters_clear_stale"], [queue_id])
        waiter_id = uuid.uuid4()
        await self.conn.execute(self.queries["waiter_register"], [waiter_id, queue_id])
        self._waiters.append(waiter_id)

    async def wait(self, timeout: float) -> bool:
        """Waits up to ``timeout`` seconds for a notification; True when one came."""
        async for _ in self.conn.notifies(timeout=max(timeout, 0.0), stop_after=1):
            return True
        return False

    async def close(self) -> None:
        if self._waiters and not self.conn.closed:
            # On failure the session ends anyway; the next waiter cleans the stale row.
            with contextlib.suppress(psycopg.Error):
                await self.conn.execute(self.queries["waiters_remove"], [self._waiters])
        self._waiters.clear()


async def queue_state(conn: AsyncConn, schema: str, queue_name: str) -> dict[str, Any]:
    cursor = await conn.execute(
        sql.SQL("SELECT * FROM {}.airflow_queue_state(%s)").format(sql.Identifier(schema)),
        [queue_name])
    row = await cursor.fetchone()
    names = [d.name for d in cursor.description or ()]
    return dict(zip(names, row or (), strict=False))


async def peek(
    conn: AsyncConn,
    schema: str,
    queue_name: str,
    *,
    limit: int,
    conversation_handle: str | None = None,
    conversation_group_id: str | None = None,
    message_type_names: Sequence[str] | None = None,
) -> list[Message]:
    cursor = await conn.execute(
        sql.SQL("SELECT * FROM {}.airflow_peek(%s, %s, %s::uuid, %s::uuid, %s::text[])").format(
            sql.Identifier(schema)),
        [queue_name, limit, conversation_handle, conversation_group_id,
         list(message_type_names) if message_type_names else None])
    return [Message(*row) for row in await cursor.fetchall()]


def event_to_dict(event: EventInstance) -> dict[str, Any]:
    return {
        "event_type": event.event_type,
        "post_time": event.post_time.isoformat() if event.post_time else None,
        "database_name": event.database_name,
        "database_id": event.database_id,
        "schema_name": event.schema_name,
        "object_name": event.object_name,
        "object_id": event.object_id,
        "object_type": event.object_type,
    }


class WaitForReceiveTrigger(BaseTrigger):
    """WAITFOR (RECEIVE ...) in the triggerer: fires once messages that RECEIVE could take are
    on the queue (optionally of one conversation or group, of some message types), when the
    queue is disabled, or at the deadline. It never receives: the task does, in its own
    transaction, when it resumes.

    Events: ``{"status": "ready", "messages": [...]}`` (metadata of the first receivable
    messages), ``{"status": "disabled", ...}``, ``{"status": "timeout"}`` or
    ``{"status": "error", "error": ...}``.
    """

    def __init__(
        self,
        *,
        queue_name: str,
        broker_conn_id: str = BrokerHook.default_conn_name,
        conversation_handle: str | None = None,
        conversation_group_id: str | None = None,
        message_type_names: Sequence[str] | None = None,
        poll_interval: float = 5.0,
        deadline: str | None = None,
        limit: int = 10,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.queue_name = queue_name
        self.broker_conn_id = broker_conn_id
        self.conversation_handle = conversation_handle
        self.conversation_group_id = conversation_group_id
        self.message_type_names = list(message_type_names) if message_type_names else None
        self.poll_interval = float(poll_interval)
        self.deadline = deadline
        self.limit = limit

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "queue_name": self.queue_name,
            "broker_conn_id": self.broker_conn_id,
            "conversation_handle": self.conversation_handle,
            "conversation_group_id": self.conversation_group_id,
            "message_type_names": self.message_type_names,
            "poll_interval": self.poll_interval,
            "deadline": self.deadline,
            "limit": self.limit,
        })

    def _remaining(self) -> float | None:
        if self.deadline is None:
            return None
        return (dt.datetime.fromisoformat(self.deadline) - _utcnow()).total_seconds()

    async def check(self, conn: AsyncConn, schema: str) -> dict[str, Any] | None:
        """The event to fire when the wait is over, or None to keep waiting. Its status is
        "ready" unless the dict names another."""
        found = await peek(conn, schema, self.queue_name, limit=self.limit,
                           conversation_handle=self.conversation_handle,
                           conversation_group_id=self.conversation_group_id,
                           message_type_names=self.message_type_names)
        if not found:
            return None
        return {"messages": [{
            "message_id": str(m.message_id),
            "conversation_handle": str(m.conversation_handle),
            "conversation_group_id": str(m.conversation_group_id),
            "message_type_name": m.message_type_name,
            "message_sequence_number": m.message_sequence_number,
        } for m in found]}

    def watched_queue(self) -> str:
        return self.queue_name

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # Every connection is closed before the event is yielded: the triggerer may drop the
        # generator right after the first event.
        yield trigger_event(await self.wait())

    async def wait(self) -> dict[str, Any]:
        """Waits as WAITFOR does; returns the event's payload."""
        hook = BrokerHook(self.broker_conn_id)
        base = {"queue_name": self.queue_name, "deadline": self.deadline}
        backoff = 0.5
        while True:
            try:
                info = await hook.aget_conn_info()
                async with await hook.aconnect() as conn:
                    listener = QueueListener(conn, info.schema)
                    try:
                        state = await queue_state(conn, info.schema, self.watched_queue())
                        # Registered before the first check, so a SEND committed after it
                        # always wakes this trigger.
                        await listener.wait_on_queue(int(state["queue_id"]))
                        backoff = 0.5
                        while True:
                            state = await queue_state(conn, info.schema, self.watched_queue())
                            if not state["is_receive_enabled"]:
                                disabled_at = state["disabled_at"]
                                return {**base, "status": "disabled",
                                        "disabled_reason": state["disabled_reason"],
                                        "disabled_at": None if disabled_at is None
                                        else disabled_at.isoformat()}
                            found = await self.check(conn, info.schema)
                            if found is not None:
                                return {**base, "status": "ready", **found}
                            remaining = self._remaining()
                            if remaining is not None and remaining <= 0:
                                return {**base, "status": "timeout"}
                            await listener.wait(self.poll_interval if remaining is None
                                                else min(self.poll_interval, remaining))
                    finally:
                        await listener.close()
            except psycopg.OperationalError as exc:
                # PostgreSQL restarted or the network failed: WAITFOR goes on after a
                # reconnect, as the engine's listener does.
                self.log.warning("broker trigger lost its connection (%s); reconnecting", exc)
                remaining = self._remaining()
                if remaining is not None and remaining <= 0:
                    return {**base, "status": "timeout"}
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
            except psycopg.Error as exc:
                return {**base, "status": "error", "error": _error_text(exc)}


class QueueDisabledTrigger(WaitForReceiveTrigger):
    """Waits for a BROKER_QUEUE_DISABLED event notification about one of ``queue_names`` (any
    queue when empty) on the notification queue ``queue_name``. Fires with the notification's
    conversation and the parsed event; the task receives it when it resumes.

    A watched queue that does not exist is waited for, as the AssetWatcher's trigger does.
    Once one of ``missing_queue_names`` exists, the trigger fires
    ``{"status": "queues_created", "queue_names": [...]}``, so that the sensor creates its event
    notification and defers again: no notification can be raised for a queue without one.
    """

    def __init__(
        self,
        *,
        queue_name: str,
        queue_names: Sequence[str] | None = None,
        broker_conn_id: str = BrokerHook.default_conn_name,
        poll_interval: float = 5.0,
        deadline: str | None = None,
        limit: int = 100,
        missing_queue_names: Sequence[str] | None = None,
    ) -> None:
        super().__init__(queue_name=queue_name, broker_conn_id=broker_conn_id,
                         message_type_names=[EVENT_NOTIFICATION], poll_interval=poll_interval,
                         deadline=deadline, limit=limit)
        self.queue_names = list(queue_names) if queue_names else None
        self.missing_queue_names = list(missing_queue_names) if missing_queue_names else None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "queue_name": self.queue_name,
            "queue_names": self.queue_names,
            "broker_conn_id": self.broker_conn_id,
            "poll_interval": self.poll_interval,
            "deadline": self.deadline,
            "limit": self.limit,
            "missing_queue_names": self.missing_queue_names,
        })

    async def queue_ids(self, conn: AsyncConn, schema: str) -> dict[str, int | None]:
        """The id of each watched queue, None for one that does not exist. find_queue()
        rather than airflow_queue_state(), whose error 208 would put an ERROR in the server's
        log on every poll while a queue is missing."""
        if not self.queue_names:
            return {}
        cursor = await conn.execute(sql.SQL(
            "SELECT w.name, ({}.find_queue(w.name)).object_id"
            " FROM unnest(%s::text[]) AS w(name)").format(sql.Identifier(schema)),
            [self.queue_names])
        return {str(name): queue_id for name, queue_id in await cursor.fetchall()}

    async def check(self, conn: AsyncConn, schema: str) -> dict[str, Any] | None:
        ids = await self.queue_ids(conn, schema)
        wanted_ids = {queue_id for queue_id in ids.values() if queue_id is not None}
        for message in await peek(conn, schema, self.queue_name, limit=self.limit,
                                  message_type_names=[EVENT_NOTIFICATION]):
            try:
                event = EventInstance.from_message(message)
            except ValueError:
                continue
            if event.event_type != BROKER_QUEUE_DISABLED:
                continue
            if self.queue_names and event.object_id not in wanted_ids and not (
                    event.object_name and event.object_name in self.queue_names):
                continue
            return {"conversation_handle": str(message.conversation_handle),
                    "message_id": str(message.message_id),
                    "event": event_to_dict(event)}
        created = [name for name in self.missing_queue_names or ()
                   if ids.get(name) is not None]
        if created:
            # Overrides wait()'s "ready": the sensor has notifications to create, no alert.
            return {"status": "queues_created", "queue_names": created}
        return None


# Event triggers for AssetWatchers.


class BrokerStreamProducer(SharedStreamProducer):
    """The broker side of a message stream in Airflow's shared-stream ack mode.

    A message is received into ``airflow_inbox`` (RECEIVE and INSERT in one transaction) and
    handed out; once Airflow has stored the asset event made from it, ``advance`` marks it
    ``delivered``. It stays in the inbox until a DAG run consumes it (``BrokerHook.consume``,
    which removes it in the run's own transaction) or acknowledges it: settling it any earlier
    would leave the message only in an asset event, processed by nobody if the run did not get
    to it. A failed event is handed out again; a rejected one stays in the inbox as
    ``rejected`` (a dead letter). Rows claimed by a producer whose session is gone (the
    triggerer died) are handed out again by the next producer.
    """

    def __init__(self, kwargs: dict[str, Any]) -> None:
        self.queue_name: str = kwargs["queue_name"]
        self.broker_conn_id: str = kwargs.get("broker_conn_id") or BrokerHook.default_conn_name
        self.consumer: str = kwargs.get("consumer_name") or f"watcher:{self.queue_name}"
        self.batch_size = int(kwargs.get("batch_size") or 10)
        self.poll_interval = float(kwargs.get("poll_interval") or 5.0)
        self.one_run_per_message = bool(kwargs.get("one_run_per_message"))
        ack_timeout = kwargs.get("ack_timeout")
        self.ack_timeout = None if ack_timeout is None else float(ack_timeout)
        redeliver_after = kwargs.get("redeliver_after", DEFAULT_REDELIVER_AFTER)
        self.redeliver_after = None if redeliver_after is None else float(redeliver_after)
        self._next_stale_check = 0.0
        self._hook = BrokerHook(self.broker_conn_id)
        self._conn: AsyncConn | None = None
        self._settle_conn: AsyncConn | None = None
        self._listener: QueueListener | None = None
        self._schema = ""
        self._in_flight: set[int] = set()
        self._redeliver: deque[int] = deque()

    @property
    def inbox_channel(self) -> str:
        return f"{self._schema}_airflow_inbox"

    def _columns(self) -> sql.Composed:
        return sql.SQL(", ").join(map(sql.Identifier, INBOX_COLUMNS))

    async def _rows(self, query: sql.Composed, params: Sequence[Any]) -> list[dict[str, Any]]:
        assert self._conn is not None
        async with self._conn.transaction():
            cursor = await self._conn.execute(query, params)
            rows = await cursor.fetchall()
        return [inbox_row_to_dict(row) for row in rows]

    async def _claim(self, top: int) -> list[dict[str, Any]]:
        return await self._rows(sql.SQL(
            "SELECT {} FROM {}.airflow_claim(%s, %s, %s, NULL, NULL, NULL, true)").format(
                self._columns(), sql.Identifier(self._schema)),
            [self.consumer, self.queue_name, top])

    async def _reclaim(self) -> list[dict[str, Any]]:
        return await self._rows(sql.SQL("SELECT {} FROM {}.airflow_reclaim(%s)").format(
            self._columns(), sql.Identifier(self._schema)), [self.consumer])

    async def _stale(self) -> list[dict[str, Any]]:
        """A delivered message no DAG run has consumed in ``redeliver_after`` seconds (doubling
        with each time), handed out again."""
        if self.redeliver_after is None or time.monotonic() < self._next_stale_check:
            return []
        self._next_stale_check = time.monotonic() + min(self.poll_interval,
                                                        self.redeliver_after)
        assert self._conn is not None
        async with self._conn.transaction():
            cursor = await self._conn.execute(sql.SQL(
                "SELECT {}, redeliveries FROM {}.airflow_redeliver(%s, %s)").format(
                    self._columns(), sql.Identifier(self._schema)),
                [self.consumer, self.redeliver_after])
            rows = await cursor.fetchall()
        batch = []
        for row in rows:
            payload = inbox_row_to_dict(row[:-1])
            log.warning("message %s of %s: no DAG run has consumed it since its event was "
                        "stored; handing it out again (time %d)", payload["message_id"],
                        self.queue_name, row[-1])
            batch.append(payload)
        return batch

    async def _fetch(self, inbox_id: int) -> list[dict[str, Any]]:
        return await self._rows(sql.SQL(
            "SELECT {} FROM {}.airflow_inbox WHERE consumer = %s AND inbox_id = %s"
            " AND state = 'claimed'").format(self._columns(), sql.Identifier(self._schema)),
            [self.consumer, inbox_id])

    async def _awaiting_ack(self) -> bool:
        assert self._conn is not None
        cursor = await self._conn.execute(sql.SQL(
            "SELECT EXISTS (SELECT 1 FROM {schema}.airflow_inbox WHERE consumer = %s"
            " AND state = 'delivered' AND (%s::float8 IS NULL"
            " OR delivered_at > {schema}.utc_now() - make_interval(secs => %s::float8)))").format(
                schema=sql.Identifier(self._schema)),
            [self.consumer, self.ack_timeout, self.ack_timeout])
        row = await cursor.fetchone()
        return bool(row and row[0])

    async def _connect(self) -> None:
        info = await self._hook.aget_conn_info()
        self._schema = info.schema
        conn = await self._hook.aconnect()
        try:
            state = await self._wait_for_queue(conn)
        except BaseException:
            await conn.close()
            raise
        self._conn = conn
        self._listener = QueueListener(conn, info.schema)
        await self._listener.wait_on_queue(int(state["queue_id"]))
        await self._listener.listen(self.inbox_channel)
        if self._in_flight:
            # Events handed out before a reconnect are still the manager's: this session
            # takes them over so that airflow_reclaim() does not hand them out twice.
            await conn.execute(sql.SQL(
                "UPDATE {}.airflow_inbox SET holder_pid = pg_backend_pid(),"
                " holder_started = (SELECT backend_start FROM pg_stat_activity"
                "                    WHERE pid = pg_backend_pid())"
                " WHERE consumer = %s AND inbox_id = ANY(%s)").format(
                    sql.Identifier(self._schema)), [self.consumer, sorted(self._in_flight)])

    async def _wait_for_queue(self, conn: AsyncConn) -> dict[str, Any]:
        """The queue's state. The watcher may start before its queue exists (its DAG was
        parsed before the setup ran): it waits for the queue rather than failing."""
        waiting = False
        while True:
            try:
                return await queue_state(conn, self._schema, self.queue_name)
            except psycopg.Error as exc:
                broker_error = translate(exc)
                if broker_error is None or broker_error.number != 208:
                    raise
            if not waiting:
                log.warning("queue %s does not exist (yet); waiting for it", self.queue_name)
                waiting = True
            await asyncio.sleep(self.poll_interval)

    async def _disconnect(self) -> None:
        if self._listener is not None:
            await self._listener.close()
            self._listener = None
        if self._conn is not None and not self._conn.closed:
            await self._conn.close()
        self._conn = None

    async def _next_batch(self, check_orphans: bool) -> list[dict[str, Any]]:
        if self._redeliver:
            return await self._fetch(self._redeliver.popleft())
        batch = (await self._reclaim() if check_orphans else []) or await self._stale()
        if batch:
            return batch
        if self.one_run_per_message and (self._in_flight or await self._awaiting_ack()):
            return []  # the DAG run of the previous message has not acknowledged it yet
        return await self._claim(1 if self.one_run_per_message else self.batch_size)

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        check_orphans = True
        backoff = 0.5
        while True:
            try:
                if self._conn is None:
                    await self._connect()
                    check_orphans = True
                batch = await self._next_batch(check_orphans)
                check_orphans = False
                if not batch:
                    assert self._listener is not None
                    woken = await self._listener.wait(self.poll_interval)
                    # Orphans appear only when another producer dies: checked on the poll,
                    # not on every wake-up.
                    check_orphans = not woken
                    continue
                backoff = 0.5
            except psycopg.OperationalError as exc:
                # PostgreSQL restarted or the network failed: the stream goes on after a
                # reconnect; what this session had claimed is taken over, not lost.
                log.warning("broker stream on %s lost its connection (%s); reconnecting",
                            self.queue_name, exc)
                await self._disconnect()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            for payload in batch:
                self._in_flight.add(int(payload["inbox_id"]))
                yield payload, int(payload["inbox_id"])

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        if self._settle_conn is None or self._settle_conn.closed:
            self._schema = (await self._hook.aget_conn_info()).schema
            self._settle_conn = await self._hook.aconnect()
        settle = sql.SQL("SELECT {}.airflow_settle(%s, %s::bigint[], %s)").format(
            sql.Identifier(self._schema))
        outcomes: dict[str, list[int]] = {"delivered": [], "rejected": []}
        for item in batch:
            inbox_id = int(item.broker_payload)
            self._in_flight.discard(inbox_id)
            outcome: AdvanceOutcome = item.outcome
            if outcome.rejected:
                outcomes["rejected"].append(inbox_id)
            elif outcome.is_clean:
                outcomes["delivered"].append(inbox_id)
            else:
                # Not stored (ack timeout, overflow, nobody subscribed): hand it out again.
                self._redeliver.append(inbox_id)
        async with self._settle_conn.transaction():
            for state, ids in outcomes.items():
                if ids:
                    await self._settle_conn.execute(settle, [self.consumer, ids, state])
            # Wakes open_stream, which may be waiting for this advance.
            await self._settle_conn.execute("SELECT pg_notify(%s, %s)",
                                            [self.inbox_channel, self.consumer[:7000]])

    async def aclose(self) -> None:
        await self._disconnect()
        if self._settle_conn is not None and not self._settle_conn.closed:
            await self._settle_conn.close()


class BrokerMessageTrigger(BaseEventTrigger):
    """Messages arriving on a queue, one trigger event per message, for AssetWatchers.

    The event's payload is the message as a dict (:func:`airflow_broker.hooks.broker.
    message_to_dict`), also found in the asset event's ``extra["payload"]``.

    The trigger runs in Airflow 3.3's shared-stream ack mode: a message moves from the queue
    into ``airflow_inbox``, becomes an asset event, and stays in the inbox until a DAG run
    processes it with ``BrokerHook.consume(triggering_asset_events[asset])``, in the run's own
    transaction: exactly once, whatever the settings. Events themselves are at least once
    (after a triggerer crash a message can produce a second event); ``consume()`` skips a
    message an earlier transaction consumed.

    :param queue_name: the queue to watch
    :param consumer_name: names the inbox consumer (default ``watcher:<queue_name>``).
        Watchers with the same connection, queue and consumer share one stream and each gets
        every message; different consumers compete for messages.
    :param batch_size: messages received per transaction
    :param poll_interval: seconds between checks when no notification arrives
    :param one_run_per_message: release the next message only after the DAG run started by
        the previous one has acknowledged it (``BrokerHook.ack`` or ``BrokerHook.consume``);
        without it, Airflow may fold messages that arrive close together into one DAG run
    :param ack_timeout: with ``one_run_per_message``, seconds after which an unacknowledged
        message no longer holds back the next (None: wait for the acknowledgement)
    :param redeliver_after: seconds after which a message whose event no DAG run has consumed
        is handed out again as a new event, then after twice as long, up to an hour (None:
        never). Airflow stores an event that arrives while the scheduler creates the previous
        event's run without starting a run for it; without a new event such a message would
        wait for the next message to arrive. A run that failed for good is started again so.
    """

    def __init__(
        self,
        *,
        queue_name: str,
        broker_conn_id: str = BrokerHook.default_conn_name,
        consumer_name: str | None = None,
        batch_size: int = 10,
        poll_interval: float = 5.0,
        one_run_per_message: bool = False,
        ack_timeout: float | None = None,
        redeliver_after: float | None = DEFAULT_REDELIVER_AFTER,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.queue_name = queue_name
        self.broker_conn_id = broker_conn_id
        self.consumer_name = consumer_name or f"watcher:{queue_name}"
        self.batch_size = batch_size
        self.poll_interval = float(poll_interval)
        self.one_run_per_message = one_run_per_message
        self.ack_timeout = ack_timeout
        self.redeliver_after = redeliver_after

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "queue_name": self.queue_name,
            "broker_conn_id": self.broker_conn_id,
            "consumer_name": self.consumer_name,
            "batch_size": self.batch_size,
            "poll_interval": self.poll_interval,
            "one_run_per_message": self.one_run_per_message,
            "ack_timeout": self.ack_timeout,
            "redeliver_after": self.redeliver_after,
        })

    def shared_stream_key(self) -> Hashable | None:
        return ("airflow-broker", self.broker_conn_id, self.queue_name, self.consumer_name,
                self.one_run_per_message)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> BrokerStreamProducer:
        return BrokerStreamProducer(kwargs)

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        async for payload in shared_stream:
            yield trigger_event(payload)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Outside the shared-stream manager the trigger cannot learn when Airflow has stored
        an event: a message is marked ``delivered`` as soon as its event is yielded, and stays
        in the inbox until a DAG run consumes it, as in ack mode."""
        producer = BrokerStreamProducer(self.serialize()[1])
        try:
            async for payload, inbox_id in producer.open_stream():
                yield trigger_event(payload)
                await producer.advance([AdvanceItem(inbox_id, AdvanceOutcome(acked=1, failed=0))])
        finally:
            await producer.aclose()
