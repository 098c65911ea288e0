"""Sensors of airflow-broker: WAITFOR (RECEIVE) and BROKER_QUEUE_DISABLED.

Both defer by default: the wait runs in the triggerer (LISTEN/NOTIFY with a poll fallback),
so a waiting sensor holds no worker slot. With ``deferrable=False`` they poke instead.

**Receiving mode and the Airflow inbox.** A sensor that receives (``receive_messages=True``,
and QueueDisabledSensor always) does its RECEIVE when it resumes, in one transaction that also
writes the messages to ``<schema>.airflow_inbox`` under the task instance's key
(``task:<dag_id>/<run_id>/<task_id>/<map_index>``). Until that transaction commits the
messages are on their queue; afterwards they are in the inbox. A try that dies after the
commit (killed, OOM, lost worker, triggerer or scheduler down) therefore loses nothing: the
next try of the same task instance finds them in the inbox and returns exactly the same
messages instead of receiving again. They stay there until the run has used them:
``AckMessagesOperator``, ``BrokerHook.ack()``, or ``BrokerHook.consume()`` (which removes them
in the transaction that processes them), or the maintenance DAG's purge of finished runs.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout, AirflowSkipException
from psycopg import sql

from airflow_broker.admin.enable_queue import queue_status
from airflow_broker.events import BROKER_QUEUE_DISABLED, EventInstance
from airflow_broker.hooks.broker import BrokerHook, message_from_dict, task_consumer
from airflow_broker.messages import EVENT_NOTIFICATION
from airflow_broker.operators.setup import apply_spec
from airflow_broker.triggers.broker import (
    QueueDisabledTrigger,
    WaitForReceiveTrigger,
    event_to_dict,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

POST_EVENT_NOTIFICATION = "http://schemas.microsoft.com/SQL/Notifications/PostEventNotification"
# After the trigger's own deadline, the scheduler's deferral timeout is only a backstop.
DEFERRAL_GRACE = timedelta(minutes=5)


def _consumer(context: Context) -> str:
    ti = context["ti"]
    return task_consumer(ti.dag_id, ti.run_id, ti.task_id,
                         -1 if ti.map_index is None else ti.map_index)


class _BrokerWaitSensor(BaseSensorOperator):
    """What both sensors share: the deadline across deferrals, and the deferral itself."""

    def __init__(
        self,
        *,
        broker_conn_id: str = BrokerHook.default_conn_name,
        poll_interval: float | None = None,
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.broker_conn_id = broker_conn_id
        self.poll_interval = poll_interval
        self.deferrable = deferrable

    def _poll_interval(self) -> float:
        if self.poll_interval is not None:
            return float(self.poll_interval)
        # LISTEN/NOTIFY wakes the trigger; polling only covers notifications that got lost.
        return min(float(self.poke_interval), 5.0)

    def _deadline(self) -> str:
        timeout = float(self.timeout) if self.timeout is not None else 7 * 24 * 3600.0
        return (dt.datetime.now(dt.UTC) + timedelta(seconds=timeout)).isoformat()

    def _waiting_for(self) -> str:
        """What the trigger waits for, for the task log."""
        raise NotImplementedError

    def _defer_to(self, trigger: WaitForReceiveTrigger) -> None:
        remaining = timedelta(days=7)
        if trigger.deadline is not None:
            remaining = dt.datetime.fromisoformat(trigger.deadline) - dt.datetime.now(dt.UTC)
        remaining = max(remaining, timedelta(0))
        # Airflow logs only "Pausing task as DEFERRED": the log has to say what for.
        self.log.info("deferring to the triggerer: waiting for %s until %s (timeout %g s, "
                      "%d s left)", self._waiting_for(), trigger.deadline or "no deadline",
                      self.timeout, int(remaining.total_seconds()))
        self.defer(trigger=trigger, method_name="execute_complete",
                   timeout=remaining + DEFERRAL_GRACE)

    def _fail_on(self, event: dict[str, Any]) -> None:
        status = event.get("status")
        if status == "timeout":
            message = f"no message arrived on {event.get('queue_name')} before the timeout"
            if self.soft_fail:
                raise AirflowSkipException(message)
            raise AirflowSensorTimeout(message)
        if status == "disabled":
            # WAITFOR on a disabled queue ends with error 9617 in SQL Server too.
            raise AirflowException(
                f"Msg 9617: The service queue \"{event.get('queue_name')}\" is currently "
                f"disabled ({event.get('disabled_reason')} since {event.get('disabled_at')}).")
        if status != "ready":
            raise AirflowException(f"the broker trigger failed: {event.get('error', event)}")


class WaitForReceiveSensor(_BrokerWaitSensor):
    """WAITFOR (RECEIVE ...): waits until messages that RECEIVE could take are on
    ``queue_name``, optionally of one conversation or group and of some message types.

    Two modes:

    * ``receive_messages=False`` (default): waits only; downstream tasks RECEIVE in their own
      transactions (ReceiveMessagesOperator). Returns ``{"queue_name": ..., "messages": [...]}``
      with the ids and types of the first receivable messages.
    * ``receive_messages=True``: receives up to ``max_messages`` (one conversation group, or the
      given conversation; with ``message_type_names`` the conversation of the first message of
      those types, whose earlier messages come along in RECEIVE order) and returns them as
      dicts. They are kept in the Airflow inbox until the run has used them, so no message is
      lost if the task or Airflow fails after the RECEIVE (see the module documentation).

    ``timeout`` (seconds, from BaseSensorOperator) bounds the whole wait; ``soft_fail`` skips
    instead of failing. A queue that is disabled, or becomes disabled, fails the sensor
    (error 9617).
    """

    template_fields: Sequence[str] = (
        "queue_name", "conversation_handle", "conversation_group_id", "message_type_names",
        "broker_conn_id",
    )
    ui_color = "#e8d7f4"

    def __init__(
        self,
        *,
        queue_name: str,
        conversation_handle: Any = None,
        conversation_group_id: Any = None,
        message_type_names: Sequence[str] | None = None,
        receive_messages: bool = False,
        max_messages: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.queue_name = queue_name
        self.conversation_handle = conversation_handle
        self.conversation_group_id = conversation_group_id
        self.message_type_names = message_type_names
        self.receive_messages = receive_messages
        self.max_messages = max_messages

    def _types(self) -> list[str] | None:
        if not self.message_type_names:
            return None
        if isinstance(self.message_type_names, str):
            return [self.message_type_names]
        return list(self.message_type_names)

    def _attempt(self, hook: BrokerHook, context: Context) -> Any:
        """The sensor's result when messages are there now, else None."""
        if self.receive_messages:
            ti = context["ti"]
            claimed = hook.claim(
                _consumer(context), self.queue_name, top=self.max_messages,
                conversation_handle=self.conversation_handle or None,
                conversation_group_id=self.conversation_group_id or None,
                message_type_names=self._types(), dag_id=ti.dag_id, run_id=ti.run_id)
            if claimed:
                self.log.info("received %d message(s) from %s into the Airflow inbox",
                              len(claimed), self.queue_name)
                return claimed
            return None
        ready = hook.peek(self.queue_name, limit=self.max_messages or 10,
                          conversation_handle=self.conversation_handle or None,
                          conversation_group_id=self.conversation_group_id or None,
                          message_type_names=self._types())
        if not ready:
            return None
        return {"queue_name": self.queue_name, "messages": [{
            "message_id": str(m.message_id),
            "conversation_handle": str(m.conversation_handle),
            "conversation_group_id": str(m.conversation_group_id),
            "message_type_name": m.message_type_name,
            "message_sequence_number": m.message_sequence_number,
        } for m in ready]}

    def _check_enabled(self, hook: BrokerHook) -> None:
        state = hook.queue_state(self.queue_name)
        if not state.get("is_receive_enabled", True):
            self._fail_on({"status": "disabled", "queue_name": self.queue_name,
                           "disabled_reason": state.get("disabled_reason"),
                           "disabled_at": state.get("disabled_at")})

    def _waiting_for(self) -> str:
        filters = [f"{name} {value}" for name, value in (
            ("conversation_handle", self.conversation_handle),
            ("conversation_group_id", self.conversation_group_id),
            ("message types", ", ".join(self._types() or ()))) if value]
        return (f"messages RECEIVE could take on queue {self.queue_name}"
                f" ({'; '.join(filters) if filters else 'no filters'})")

    def _trigger(self, deadline: str) -> WaitForReceiveTrigger:
        return WaitForReceiveTrigger(
            queue_name=self.queue_name, broker_conn_id=self.broker_conn_id,
            conversation_handle=self.conversation_handle or None,
            conversation_group_id=self.conversation_group_id or None,
            message_type_names=self._types(), poll_interval=self._poll_interval(),
            deadline=deadline)

    def execute(self, context: Context) -> Any:
        if self.receive_messages:
            with BrokerHook(self.broker_conn_id) as hook:
                held = hook.claimed(_consumer(context))
            if held:
                self.log.info("an earlier try received %d message(s) that the run has not "
                              "used yet; returning them", len(held))
                return held
        if not self.deferrable:
            return super().execute(context)
        # A check right away saves a deferral when the messages are already there.
        with BrokerHook(self.broker_conn_id) as hook:
            self._check_enabled(hook)
            result = self._attempt(hook, context)
        if result is not None:
            return result
        self._defer_to(self._trigger(self._deadline()))
        return None

    def poke(self, context: Context) -> PokeReturnValue:
        with BrokerHook(self.broker_conn_id) as hook:
            self._check_enabled(hook)
            result = self._attempt(hook, context)
        return PokeReturnValue(is_done=result is not None, xcom_value=result)

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        event = event or {}
        self._fail_on(event)
        with BrokerHook(self.broker_conn_id) as hook:
            result = self._attempt(hook, context)
        if result is not None:
            return result
        # Another reader took them first: WAITFOR goes on until the same deadline.
        self.log.info("the messages were received by someone else; waiting again")
        self._defer_to(self._trigger(event.get("deadline") or self._deadline()))
        return None


class QueueDisabledSensor(_BrokerWaitSensor):
    """Waits for BROKER_QUEUE_DISABLED on ``queue_names`` (one name or a list; any queue when
    empty): the event notification SQL Server sends when poison-message detection disables a
    queue. Returns the parsed event::

        {"queue_name", "schema_name", "queue_id", "database_name", "post_time",
         "reason" ("POISON" or "ADMIN"), "reason_text", "disabled_at", "is_receive_enabled",
         "message_id", "conversation_handle", "event_type"}

    The notification arrives on ``notification_queue_name`` (service
    ``notification_service_name``). With ``create_notifications=True`` the sensor creates the
    queue (its view in the broker's own schema, so that brokers in several schemas of one
    database each have theirs), the service (accepting PostEventNotification) and an event
    notification named ``notification_name`` on every watched queue, when they do not exist.

    A watched queue that does not exist yet is waited for (its DAG may run before the setup
    that creates it): the log names it, and with ``create_notifications`` its event
    notification is created as soon as it exists.

    The notification is received into the Airflow inbox, so a try that fails after receiving
    it returns it again on retry (see the module documentation).
    """

    template_fields: Sequence[str] = ("queue_names", "notification_queue_name",
                                      "notification_service_name", "broker_conn_id")
    ui_color = "#f4d7d7"

    def __init__(
        self,
        *,
        queue_names: str | Sequence[str] | None = None,
        notification_queue_name: str = "AirflowBrokerAlertQueue",
        notification_service_name: str = "//airflow-broker/QueueDisabledAlerts",
        notification_name: str = "airflow_broker_queue_disabled",
        create_notifications: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.queue_names = queue_names
        self.notification_queue_name = notification_queue_name
        self.notification_service_name = notification_service_name
        self.notification_name = notification_name
        self.create_notifications = create_notifications
        # Watched queues that did not exist at the last look.
        self._missing: list[str] = []

    def _watched(self) -> list[str]:
        if not self.queue_names:
            return []
        if isinstance(self.queue_names, str):
            return [self.queue_names]
        return list(self.queue_names)

    def notification_spec(self, schema: str | None = None,
                          queue_names: Sequence[str] | None = None) -> dict[str, Any]:
        """The objects ``create_notifications`` makes sure of: the notification queue, with
        its view in ``schema`` (the broker's own schema; "public" when None, which a second
        broker schema in the same database cannot share), its service, and an event
        notification on each of ``queue_names`` (default: every watched queue)."""
        queue: dict[str, Any] = {"name": self.notification_queue_name}
        if schema is not None:
            queue["schema"] = schema
        return {
            "queues": [queue],
            "services": [{"name": self.notification_service_name,
                          "queue_name": self.notification_queue_name,
                          "contracts": [POST_EVENT_NOTIFICATION]}],
            "event_notifications": [{
                "name": self.notification_name, "queue_name": queue_name,
                "events": [BROKER_QUEUE_DISABLED],
                "service_name": self.notification_service_name,
            } for queue_name in (self._watched() if queue_names is None else queue_names)],
        }

    def _queue_ids(self, hook: BrokerHook) -> dict[str, int | None]:
        """The id of each watched queue, None for one that does not exist (yet)."""
        watched = self._watched()
        if not watched:
            return {}
        with hook.transaction() as tx:
            rows = tx.run(sql.SQL(
                "SELECT w.name, ({}.find_queue(w.name)).object_id"
                " FROM unnest(%s::text[]) AS w(name)").format(sql.Identifier(hook.schema)),
                [watched])
        return {str(name): queue_id for name, queue_id in rows}

    def _prepare(self, hook: BrokerHook) -> dict[str, int | None]:
        """Creates what ``create_notifications`` promises for the watched queues that exist,
        and notes (and logs) those that do not exist yet. Returns the queue ids."""
        ids = self._queue_ids(hook)
        missing = [name for name, queue_id in ids.items() if queue_id is None]
        if self.create_notifications:
            with hook.transaction() as tx:
                report = apply_spec(tx, self.notification_spec(
                    hook.schema, [name for name, queue_id in ids.items()
                                  if queue_id is not None]))
            for label in report.created:
                self.log.info("created %s", label)
        if missing and missing != self._missing:
            # CREATE EVENT NOTIFICATION on a missing queue fails with Msg 15151: wait instead.
            self.log.info(
                "waiting for queue(s) %s, which do not exist yet; %s", ", ".join(missing),
                f"their event notification {self.notification_name} is created once they do"
                if self.create_notifications else
                "no BROKER_QUEUE_DISABLED can be raised for them until they exist and have "
                "an event notification")
        self._missing = missing
        return ids

    def _waiting_for(self) -> str:
        watched = self._watched()
        about = f"queue(s) {', '.join(watched)}" if watched else "any queue"
        pending = (f"; not created yet: {', '.join(self._missing)}" if self._missing else "")
        return (f"BROKER_QUEUE_DISABLED about {about} on notification queue "
                f"{self.notification_queue_name}{pending}")

    def _trigger(self, deadline: str) -> QueueDisabledTrigger:
        return QueueDisabledTrigger(
            queue_name=self.notification_queue_name, queue_names=self._watched() or None,
            broker_conn_id=self.broker_conn_id, poll_interval=self._poll_interval(),
            deadline=deadline,
            missing_queue_names=(self._missing or None) if self.create_notifications else None)

    def _result(self, hook: BrokerHook, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The first BROKER_QUEUE_DISABLED about a watched queue among received rows."""
        watched = set(self._watched())
        schema = sql.Identifier(hook.schema)
        for row in rows:
            message = message_from_dict(row)
            if message.message_type_name != EVENT_NOTIFICATION:
                continue
            try:
                event = EventInstance.from_message(message)
            except ValueError:
                continue
            if event.event_type != BROKER_QUEUE_DISABLED:
                continue
            with hook.transaction() as tx:
                found = tx.run(sql.SQL(
                    "SELECT q.name, q.schema_name, d.datname FROM {}.queues q"
                    " LEFT JOIN pg_database d ON d.oid = %s"
                    " WHERE q.object_id = %s OR (q.name = %s AND %s::int IS NULL)").format(
                        schema), [event.database_id, event.object_id, event.object_name,
                                  event.object_id])
            queue_name = found[0][0] if found else event.object_name
            if watched and queue_name not in watched:
                continue
            parsed = event_to_dict(event)
            result: dict[str, Any] = {
                "event_type": event.event_type,
                "queue_name": queue_name,
                "schema_name": found[0][1] if found else event.schema_name,
                "queue_id": event.object_id,
                "database_name": event.database_name or (found[0][2] if found else None),
                "database_id": event.database_id,
                "post_time": parsed["post_time"],
                "message_id": row["message_id"],
                "conversation_handle": row["conversation_handle"],
                "reason": None, "reason_text": None, "disabled_at": None,
                "is_receive_enabled": None,
            }
            if queue_name is not None:
                status = queue_status(hook.get_broker(), queue_name)
                result.update(reason=status.disabled_reason or "POISON",
                              reason_text=status.poison_reason,
                              disabled_at=None if status.disabled_at is None
                              else status.disabled_at.isoformat(),
                              is_receive_enabled=status.is_receive_enabled)
            return result
        return None

    def _attempt(self, hook: BrokerHook, context: Context,
                 conversation_handle: str | None = None) -> dict[str, Any] | None:
        ti = context["ti"]
        rows = hook.claim(_consumer(context), self.notification_queue_name,
                          conversation_handle=conversation_handle,
                          message_type_names=None if conversation_handle
                          else [EVENT_NOTIFICATION],
                          dag_id=ti.dag_id, run_id=ti.run_id)
        return self._result(hook, rows) if rows else None

    def execute(self, context: Context) -> Any:
        with BrokerHook(self.broker_conn_id) as hook:
            self._prepare(hook)
            held = hook.claimed(_consumer(context))
            result = self._result(hook, held) if held else None
        if result is not None:
            self.log.info("an earlier try received the notification; returning it")
            return result
        if not self.deferrable:
            return super().execute(context)
        self._defer_to(self._trigger(self._deadline()))
        return None

    def _matching_conversation(self, hook: BrokerHook) -> str | None:
        """The conversation of the first waiting BROKER_QUEUE_DISABLED about a watched
        queue (what the trigger looks for, checked here without it)."""
        watched = self._watched()
        # A poking sensor creates the notifications of queues that appeared since.
        found = self._prepare(hook) if self._missing else self._queue_ids(hook)
        ids = {queue_id for queue_id in found.values() if queue_id is not None}
        for message in hook.peek(self.notification_queue_name, limit=100,
                                 message_type_names=[EVENT_NOTIFICATION]):
            try:
                event = EventInstance.from_message(message)
            except ValueError:
                continue
            if event.event_type == BROKER_QUEUE_DISABLED and (
                    not watched or event.object_id in ids or event.object_name in watched):
                return str(message.conversation_handle)
        return None

    def poke(self, context: Context) -> PokeReturnValue:
        with BrokerHook(self.broker_conn_id) as hook:
            handle = self._matching_conversation(hook)
            if handle is not None:
                result = self._attempt(hook, context, handle)
                if result is not None:
                    return PokeReturnValue(is_done=True, xcom_value=result)
        return PokeReturnValue(is_done=False)

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        event = event or {}
        if event.get("status") == "queues_created":
            self.log.info("queue(s) %s now exist", ", ".join(event.get("queue_names") or ()))
            with BrokerHook(self.broker_conn_id) as hook:
                self._prepare(hook)
            self._defer_to(self._trigger(event.get("deadline") or self._deadline()))
            return None
        self._fail_on(event)
        with BrokerHook(self.broker_conn_id) as hook:
            result = self._attempt(hook, context, event.get("conversation_handle"))
            if result is None:
                self._prepare(hook)
        if result is not None:
            self.log.warning("queue %s was disabled (%s): %s", result["queue_name"],
                             result["reason"], result["reason_text"])
            return result
        self.log.info("the notification was received by someone else; waiting again")
        self._defer_to(self._trigger(event.get("deadline") or self._deadline()))
        return None
