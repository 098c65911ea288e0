"""Test DAG: a receiving WaitForReceiveSensor whose task dies right after its RECEIVE
committed (when T_KILL_AFTER_RECEIVE is set), and a task that processes what it handed over."""

from __future__ import annotations

import os
import signal
from typing import Any

import pendulum
from airflow.sdk import dag, task

from airflow_broker.hooks import BrokerHook
from airflow_broker.sensors import WaitForReceiveSensor


def die_after_receive(context: Any, result: Any) -> None:
    """Airflow's post_execute hook runs after execute() returned: the RECEIVE has committed,
    the XCom is not pushed and the task is not marked done yet."""
    if os.environ.get("T_KILL_AFTER_RECEIVE") == "1":
        os.kill(os.getpid(), signal.SIGKILL)


@dag(dag_id="t_kill", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
     catchup=False)
def t_kill() -> None:
    received = WaitForReceiveSensor(task_id="receive", queue_name="q_t", receive_messages=True,
                                    timeout=600, post_execute=die_after_receive)

    @task
    def process(messages: Any) -> list[str]:
        with BrokerHook() as hook, hook.consume(messages) as (tx, consumed):
            for message in consumed:
                tx.conn.execute("INSERT INTO processed (message_id, body) VALUES (%s, %s)",
                                [message.message_id, message.text()])
            return [str(m.message_id) for m in consumed]

    process(received.output)


t_kill()
