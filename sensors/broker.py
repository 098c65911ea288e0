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

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import PokeReturnValue

from airflow_broker.hooks.broker import BrokerHook
from airflow_broker.triggers.broker import (
    WaitForReceiveTrigger,
)

if TYPE_CHECKING:
    from airflow.sdk import Context
from airflow_broker.sensors._waiting import (
    BrokerWaitSensor,
    consumer_of,
)

# Also importable from here, where it was first.
from airflow_broker.sensors.queue_disabled import QueueDisabledSensor

__all__ = ["QueueDisabledSensor", "WaitForReceiveSensor"]


class WaitForReceiveSensor(BrokerWaitSensor):
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
                consumer_of(context), self.queue_name, top=self.max_messages,
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
                held = hook.claimed(consumer_of(context))
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
