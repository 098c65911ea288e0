"""QueueDisabledSensor: waits for BROKER_QUEUE_DISABLED, the event notification sent when
poison-message detection disables a queue (see :mod:`airflow_broker.sensors.broker` on the
receiving mode and the Airflow inbox)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import PokeReturnValue

from airflow_broker._statements import runner_of
from airflow_broker.admin.enable_queue import queue_status
from airflow_broker.events import BROKER_QUEUE_DISABLED, EventInstance, queue_disabled_event
from airflow_broker.hooks.broker import BrokerHook, message_from_dict
from airflow_broker.messages import EVENT_NOTIFICATION
from airflow_broker.operators.setup import apply_spec
from airflow_broker.triggers.broker import (
    QueueDisabledTrigger,
    event_to_dict,
)

if TYPE_CHECKING:
    from airflow.sdk import Context
from airflow_broker.sensors._waiting import (
    POST_EVENT_NOTIFICATION,
    BrokerWaitSensor,
    consumer_of,
)


class QueueDisabledSensor(BrokerWaitSensor):
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
            runner = runner_of(tx)
            rows = runner.run(runner.queries["queue_ids"], [watched])
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
                "waiting for queue(s) %s, which do not exist yet (or which this connection's "
                "role holds no permission on); %s", ", ".join(missing),
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
        for row in rows:
            message = message_from_dict(row)
            event = queue_disabled_event(message)
            if event is None:
                continue
            with hook.transaction() as tx:
                runner = runner_of(tx)
                found = runner.run(runner.queries["disabled_queue_of_event"],
                                   [event.database_id, event.object_id, event.object_name])
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
        rows = hook.claim(consumer_of(context), self.notification_queue_name,
                          conversation_handle=conversation_handle,
                          message_type_names=None if conversation_handle
                          else [EVENT_NOTIFICATION],
                          dag_id=ti.dag_id, run_id=ti.run_id)
        return self._result(hook, rows) if rows else None

    def execute(self, context: Context) -> Any:
        with BrokerHook(self.broker_conn_id) as hook:
            self._prepare(hook)
            held = hook.claimed(consumer_of(context))
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
