"""Event triggers for AssetWatchers: messages on a queue as a stream in Airflow's shared-stream
ack mode (the ``broker`` scheme of common-messaging resolves to BrokerMessageTrigger).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Hashable, Sequence
from typing import Any

import psycopg
from airflow.triggers.base import BaseEventTrigger, TriggerEvent
from airflow.triggers.shared_stream import (
    AdvanceItem,
    AdvanceOutcome,
    SharedStreamProducer,
)

from airflow_broker.errors import InvalidObjectName, translate
from airflow_broker.hooks.broker import BrokerHook, inbox_row_to_dict
from airflow_broker.queries import Queries
from airflow_broker.reconnect import Outage, connection_lost, usable
from airflow_broker.triggers._connections import (
    AsyncConn,
    QueueListener,
    queue_state,
    stop_if_cancelled,
    trigger_event,
)

# A watcher's message that no DAG run has consumed this long after its event was stored is
# handed out again (then after twice as long, and so on, up to an hour).
DEFAULT_REDELIVER_AFTER = 60.0

log = logging.getLogger(__name__)


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

    A lost database (a restart, a terminated backend, a failover) ends neither the stream nor
    an ``advance``: both reconnect in place with the policy of :mod:`airflow_broker.reconnect`,
    and ``advance`` settles its batch once the server is back (settling twice changes nothing),
    so the manager never sees the outage.
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
        self._outage = Outage(f"broker stream on {self.queue_name}", logger=log)

    @property
    def inbox_channel(self) -> str:
        return f"{self._schema}_airflow_inbox"

    def _query(self, name: str) -> bytes:
        return Queries(self._schema)[name]

    async def _rows(self, query: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        assert self._conn is not None
        async with self._conn.transaction():
            cursor = await self._conn.execute(self._query(query), params)
            rows = await cursor.fetchall()
        return [inbox_row_to_dict(row) for row in rows]

    async def _claim(self, top: int) -> list[dict[str, Any]]:
        return await self._rows("inbox_stream_claim", [self.consumer, self.queue_name, top])

    async def _reclaim(self) -> list[dict[str, Any]]:
        return await self._rows("inbox_reclaim", [self.consumer])

    async def _stale(self) -> list[dict[str, Any]]:
        """A delivered message no DAG run has consumed in ``redeliver_after`` seconds (doubling
        with each time), handed out again."""
        if self.redeliver_after is None or time.monotonic() < self._next_stale_check:
            return []
        self._next_stale_check = time.monotonic() + min(self.poll_interval,
                                                        self.redeliver_after)
        assert self._conn is not None
        async with self._conn.transaction():
            cursor = await self._conn.execute(
                self._query("inbox_redeliver"), [self.consumer, self.redeliver_after])
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
        return await self._rows("inbox_fetch", [self.consumer, inbox_id])

    async def _awaiting_ack(self) -> bool:
        assert self._conn is not None
        cursor = await self._conn.execute(
            self._query("inbox_awaiting_ack"), [self.consumer, self.ack_timeout])
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
        held = self._in_flight | set(self._redeliver)
        if held:
            # Events handed out before a reconnect are still the manager's, and failed ones
            # wait here to go out again: this session takes them over so that
            # airflow_reclaim() does not hand them out a second time.
            await conn.execute(self._query("inbox_take_over"), [self.consumer, sorted(held)])

    async def _wait_for_queue(self, conn: AsyncConn) -> dict[str, Any]:
        """The queue's state. The watcher may start before its queue exists (its DAG was
        parsed before the setup ran): it waits for the queue rather than failing."""
        waiting = False
        while True:
            stop_if_cancelled()
            try:
                return await queue_state(conn, self._schema, self.queue_name)
            except psycopg.Error as exc:
                broker_error = translate(exc)
                if not isinstance(broker_error, InvalidObjectName):
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
        while True:
            stop_if_cancelled()
            try:
                if self._conn is None:
                    await self._connect()
                    check_orphans = True
                batch = await self._next_batch(check_orphans)
                self._outage.recovered()
                check_orphans = False
                if not batch:
                    assert self._listener is not None
                    woken = await self._listener.wait(self.poll_interval)
                    # Orphans appear only when another producer dies: checked on the poll,
                    # not on every wake-up.
                    check_orphans = not woken
                    continue
            except psycopg.OperationalError as exc:
                # PostgreSQL restarted or the network failed: the stream goes on after a
                # reconnect; what this session had claimed is taken over, not lost.
                await self._disconnect()
                await self._outage.await_retry(exc)
                continue
            for payload in batch:
                self._in_flight.add(int(payload["inbox_id"]))
                yield payload, int(payload["inbox_id"])

    async def _settle_connection(self) -> AsyncConn:
        """The acknowledgements' connection, a new one when the server ended the last."""
        conn = self._settle_conn
        if conn is None or not usable(conn):
            if conn is not None and not conn.closed:
                await conn.close()
            self._settle_conn = None
            self._schema = (await self._hook.aget_conn_info()).schema
            self._settle_conn = conn = await self._hook.aconnect()
        return conn

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Marks stored events ``delivered`` and rejected ones ``rejected``, and queues failed
        ones to go out again. A lost connection is replaced and the batch settled on the new
        one, however long the server is away: an advance that raised would end the whole
        shared stream."""
        outcomes: dict[str, list[int]] = {"delivered": [], "rejected": []}
        failed: list[int] = []
        for item in batch:
            inbox_id = int(item.broker_payload)
            outcome: AdvanceOutcome = item.outcome
            if outcome.rejected:
                outcomes["rejected"].append(inbox_id)
            elif outcome.is_clean:
                outcomes["delivered"].append(inbox_id)
            else:
                # Not stored (ack timeout, overflow, nobody subscribed): hand it out again.
                failed.append(inbox_id)
        while True:
            try:
                await self._settle(outcomes)
                break
            except psycopg.OperationalError as exc:
                conn = self._settle_conn
                if not connection_lost(exc) and conn is not None and usable(conn):
                    raise  # the statement failed on a working connection
                # Gone, or none could be made (the server starting up, out of connections).
                await self._outage.await_retry(exc)
        self._outage.recovered()
        # Until settled, the rows stay this producer's: a reconnecting stream takes them over
        # instead of handing them out as orphans.
        for inbox_id in (*outcomes["delivered"], *outcomes["rejected"], *failed):
            self._in_flight.discard(inbox_id)
        self._redeliver.extend(failed)

    async def _settle(self, outcomes: dict[str, list[int]]) -> None:
        conn = await self._settle_connection()
        settle = self._query("inbox_settle")
        async with conn.transaction():
            for state, ids in outcomes.items():
                if ids:
                    await conn.execute(settle, [self.consumer, ids, state])
            # Wakes open_stream, which may be waiting for this advance.
            await conn.execute(self._query("inbox_notify"),
                               [self.inbox_channel, self.consumer[:7000]])

    async def aclose(self) -> None:
        await self._disconnect()
        if self._settle_conn is not None and not self._settle_conn.closed:
            await self._settle_conn.close()


# Airflow stores a trigger's class path with every asset watcher, and a new path would
# replace each watcher's trigger: the class keeps the path it had before it moved here (the
# module re-exports it).
CLASSPATH = "airflow_broker.triggers.broker.BrokerMessageTrigger"


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
        return (CLASSPATH, {
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
