"""Test DAG: a ReceiveMessagesOperator whose callback fails, and what that leaves behind."""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import dag

from airflow_broker import Message, Transaction
from airflow_broker.operators import ReceiveMessagesOperator


def fail(messages: list[Message], tx: Transaction, context: Any) -> None:
    tx.send(messages[0].conversation_handle, "Resp", "never committed")
    raise RuntimeError(f"cannot process {messages[0].text()}")


@dag(dag_id="t_receive_fails", schedule=None,
     start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False)
def t_receive_fails() -> None:
    ReceiveMessagesOperator(task_id="receive", queue_name="q_t", max_messages=1, callback=fail)


t_receive_fails()
