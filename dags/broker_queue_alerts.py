"""Alerts when poison-message detection disables a queue.

The sensor waits, deferred, for the BROKER_QUEUE_DISABLED event notification of the watched
queues (it creates the notification queue, its service and the event notifications on first
run), then the alert goes out by e-mail through the SMTP provider (connection ``smtp_default``,
recipients in the Variable ``broker_alert_email``). The DAG runs continuously: after an alert,
the next run waits for the next event.

After fixing the cause, enable the queue again with ``airflow-broker enable-queue <queue>`` or
the ``broker_enable_queue`` DAG.
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import dag, get_current_context, task

from airflow_broker.notifications import QueueDisabledNotifier
from airflow_broker.operators import AckMessagesOperator
from airflow_broker.sensors import QueueDisabledSensor

WATCHED_QUEUES = ["BrokerageQueue", "TraderQueue"]


@dag(
    dag_id="broker_queue_alerts",
    schedule="@continuous",
    max_active_runs=1,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["airflow-broker", "example"],
    doc_md=__doc__,
)
def broker_queue_alerts() -> None:
    disabled = QueueDisabledSensor(
        task_id="wait_for_queue_disabled",
        queue_names=WATCHED_QUEUES,
        create_notifications=True,
        timeout=24 * 3600,
        soft_fail=True,
    )

    @task(retries=3)
    def send_alert(event: Any) -> str:
        """A task rather than an on_success_callback, so that a failed e-mail is retried."""
        notifier = QueueDisabledNotifier(
            to="{{ var.value.get('broker_alert_email', 'broker-alerts@localhost') }}")
        context: Any = get_current_context()
        notifier({**context, "broker_event": event})
        return str(event["queue_name"])

    done = AckMessagesOperator(task_id="ack_notification",
                               sensor_task_ids="wait_for_queue_disabled")
    send_alert(disabled.output) >> done


broker_queue_alerts()
