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
import datetime as dt
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import psycopg
from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_broker.events import EventInstance, queue_disabled_event
from airflow_broker.hooks.broker import BrokerHook
from airflow_broker.messages import EVENT_NOTIFICATION
from airflow_broker.queries import Queries
from airflow_broker.reconnect import Outage
from airflow_broker.triggers._connections import (
    AsyncConn,
    QueueListener,
    error_text,
    peek,
    queue_state,
    stop_if_cancelled,
    trigger_event,
    utcnow,
)

# The stream trigger's class path, stored by Airflow with every asset watcher (stream.CLASSPATH).
from airflow_broker.triggers.stream import BrokerMessageTrigger, BrokerStreamProducer

log = logging.getLogger(__name__)

__all__ = ["BrokerMessageTrigger", "BrokerStreamProducer", "QueueDisabledTrigger",
           "WaitForReceiveTrigger", "event_to_dict"]


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
        return (dt.datetime.fromisoformat(self.deadline) - utcnow()).total_seconds()

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
        outage = Outage(f"WAITFOR trigger on {self.queue_name}", logger=self.log)
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
                        outage.recovered()
                        while True:
                            stop_if_cancelled()
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
                remaining = self._remaining()
                if remaining is not None and remaining <= 0:
                    return {**base, "status": "timeout"}
                delay = outage.failed(exc)
                await asyncio.sleep(delay if remaining is None else min(delay, remaining))
            except psycopg.Error as exc:
                return {**base, "status": "error", "error": error_text(exc)}


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
        cursor = await conn.execute(Queries(schema)["queue_ids"], [self.queue_names])
        return {str(name): queue_id for name, queue_id in await cursor.fetchall()}

    async def check(self, conn: AsyncConn, schema: str) -> dict[str, Any] | None:
        ids = await self.queue_ids(conn, schema)
        wanted_ids = {queue_id for queue_id in ids.values() if queue_id is not None}
        for message in await peek(conn, schema, self.queue_name, limit=self.limit,
                                  message_type_names=[EVENT_NOTIFICATION]):
            event = queue_disabled_event(message)
            if event is None:
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
