"""Test DAG: a SparkSubmit reader job on the test application's target queue, then the
quarantine handled by an operator. The handler lives in the repository's tests package, which
the operator ships to the Spark tasks (py_files)."""

from __future__ import annotations

import pendulum
from airflow.sdk import dag

from airflow_broker.operators import ActivatedReaderOperator, QuarantineOperator


@dag(dag_id="t_spark_reader", schedule=None, start_date=pendulum.datetime(2026, 1, 1),
     catchup=False)
def t_spark_reader() -> None:
    read = ActivatedReaderOperator(
        task_id="read", queue_name="q_t", handler="tests.support.reader_handlers:book_trade",
        readers=2, batch_size=20, idle_exit=2, reply_message_type="Resp",
        conn_id="spark_local")
    discard = QuarantineOperator(task_id="discard", action="discard", queue_name="q_t")
    read >> discard


t_spark_reader()
