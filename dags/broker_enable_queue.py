"""Enables a queue again (ALTER QUEUE ... WITH STATUS = ON) once the cause of its poison-message
disable is fixed. Trigger it with ``{"queue_name": "..."}``."""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag

from airflow_broker.operators import EnableQueueOperator


@dag(
    dag_id="broker_enable_queue",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={"queue_name": Param("BrokerageQueue", type="string", minLength=1)},
    tags=["airflow-broker", "example"],
    doc_md=__doc__,
)
def broker_enable_queue() -> None:
    EnableQueueOperator(task_id="enable_queue", queue_name="{{ params.queue_name }}")


broker_enable_queue()
