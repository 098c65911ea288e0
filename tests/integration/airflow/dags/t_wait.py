"""Test DAG: WAITFOR in both modes, deferred, and the downstream use of handed-over messages."""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import dag, task

from airflow_broker.hooks.broker import BrokerHook
from airflow_broker.sensors.broker import WaitForReceiveSensor


@dag(dag_id="t_wait", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
     catchup=False)
def t_wait() -> None:
    ready = WaitForReceiveSensor(task_id="ready", queue_name="q_t", poll_interval=30,
                                 timeout=600)
    received = WaitForReceiveSensor(task_id="received", queue_name="q_t",
                                    receive_messages=True, max_messages=10, timeout=600)

    @task
    def use(messages: Any) -> list[str]:
        with BrokerHook() as hook, hook.consume(messages) as (tx, consumed):
            for message in consumed:
                tx.send(message.conversation_handle, "Resp", f"got {message.text()}")
            return [m.text() or "" for m in consumed]

    ready >> received
    use(received.output)


t_wait()
