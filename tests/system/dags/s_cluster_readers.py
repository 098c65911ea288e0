"""The system tier's Spark cluster DAG: ActivatedReaderOperator with its default settings on
the deployment's ``spark_default`` (a standalone cluster whose Python has neither the project
nor psycopg), draining ClusterQueue with the handler s_cluster_book:book, which lives next to
this file in the DAGs folder, as users keep their own modules. The queue, the results table
and the messages are created by tests/system/test_spark_cluster.py."""

from __future__ import annotations

import datetime as dt

import pendulum
from airflow.sdk import dag

from airflow_broker.operators import ActivatedReaderOperator


@dag(dag_id="s_cluster_readers", schedule=None, start_date=pendulum.datetime(2026, 1, 1),
     catchup=False, max_active_runs=1)
def s_cluster_readers() -> None:
    ActivatedReaderOperator(task_id="read", queue_name="ClusterQueue",
                            handler="s_cluster_book:book", idle_exit=3,
                            retries=0, execution_timeout=dt.timedelta(minutes=10))


s_cluster_readers()
