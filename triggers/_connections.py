"""What the triggers share: psycopg's AsyncConnection only, so nothing blocks the triggerer's
event loop, and WAITFOR's registration as the engine does it (:mod:`airflow_broker.waitfor`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
from airflow.triggers.base import TriggerEvent
from psycopg import sql

from airflow_broker import Message
from airflow_broker.errors import translate
from airflow_broker.queries import Queries
from airflow_broker.waitfor import queue_channel

AsyncConn = psycopg.AsyncConnection[Any]

log = logging.getLogger(__name__)


def trigger_event(payload: Any) -> TriggerEvent:
    """A TriggerEvent (its constructor is not annotated)."""
    return TriggerEvent(payload)  # type: ignore[no-untyped-call]


def stop_if_cancelled() -> None:
    """Raises the cancellation a wait below this task lost.

    psycopg up to 3.3.5 waits on its socket with ``asyncio.wait_for()``, which on Python 3.11
    returns the inner result, and drops the CancelledError, when the cancellation arrives as
    the socket becomes ready. The task stays marked as cancelling, so the loops of the
    triggers and the stream call this once a round: a cancelled watcher stops within one poll
    instead of running on until its next event.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def error_text(exc: BaseException) -> str:
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
        waiter_id = uuid.uuid4()
        await self.conn.execute(self.queries["waiter_register"], [waiter_id, queue_id, True])
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
    cursor = await conn.execute(Queries(schema)["airflow_queue_state"], [queue_name])
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
        Queries(schema)["peek"],
        [queue_name, limit, conversation_handle, conversation_group_id,
         list(message_type_names) if message_type_names else None])
    return [Message(*row) for row in await cursor.fetchall()]
