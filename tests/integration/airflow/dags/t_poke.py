"""Test DAG: the sensors without deferring (poke), and a deferred sensor's timeout."""

from __future__ import annotations

import pendulum
from airflow.sdk import dag

from airflow_broker.sensors import QueueDisabledSensor, WaitForReceiveSensor


@dag(dag_id="t_poke", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
     catchup=False)
def t_poke() -> None:
    WaitForReceiveSensor(task_id="poke_receive", queue_name="q_t", receive_messages=True,
                         deferrable=False, poke_interval=0.2, timeout=600)
    QueueDisabledSensor(task_id="poke_disabled", queue_names=["BrokerageQueue"],
                        create_notifications=True, deferrable=False, poke_interval=0.2,
                        timeout=600)
    WaitForReceiveSensor(task_id="times_out", queue_name="q_i", timeout=1, soft_fail=True)


t_poke()
