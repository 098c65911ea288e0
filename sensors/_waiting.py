"""What both sensors share: the deadline across deferrals, the deferral itself, and the
inbox key of a task instance."""

from __future__ import annotations

import datetime as dt
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout, AirflowSkipException

from airflow_broker.hooks.broker import BrokerHook, task_consumer
from airflow_broker.triggers.broker import (
    WaitForReceiveTrigger,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

POST_EVENT_NOTIFICATION = "http://schemas.microsoft.com/SQL/Notifications/PostEventNotification"
# After the trigger's own deadline, the scheduler's deferral timeout is only a backstop.
DEFERRAL_GRACE = timedelta(minutes=5)


def consumer_of(context: Context) -> str:
    ti = context["ti"]
    return task_consumer(ti.dag_id, ti.run_id, ti.task_id,
                         -1 if ti.map_index is None else ti.map_index)


class BrokerWaitSensor(BaseSensorOperator):
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
