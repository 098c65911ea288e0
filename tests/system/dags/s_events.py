"""DAGs of the system tier's delivery tests: every message of a queue processed through
``consume()`` into ``system_processed``, by an AssetWatcher in each mode and by a deferred
WaitForReceiveSensor. The table and the queues are created by the tests."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pendulum
from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import Asset, AssetWatcher, dag, get_current_context, task

from airflow_broker import Message, Transaction
from airflow_broker.hooks import BrokerHook
from airflow_broker.sensors import WaitForReceiveSensor

START = pendulum.datetime(2026, 1, 1, tz="UTC")
# A killed task (the scheduler or its worker SIGKILLed) is tried again.
RETRIES = {"retries": 3, "retry_delay": dt.timedelta(seconds=2)}


def record(tx: Transaction, messages: list[Message], run_id: str) -> list[str]:
    """What a user's DAG does with its messages, committed with their removal from the
    inbox: the row in system_processed, and the end of the conversation."""
    for message in messages:
        if message.message_type_name == "//System/Event":
            tx.conn.execute(
                "INSERT INTO system_processed (message_id, conversation_handle, body, run_id)"
                " VALUES (%s, %s, %s, %s)",
                [message.message_id, message.conversation_handle, message.text(), run_id])
        tx.end_conversation(message.conversation_handle)
    return [str(m.message_id) for m in messages]


def watched(queue_name: str, **kwargs: Any) -> Asset:
    return Asset(f"system_{queue_name}", uri=f"broker://broker_default/{queue_name}",
                 watchers=[AssetWatcher(name=f"system_{queue_name}_watcher",
                                        trigger=MessageQueueTrigger(
                                            scheme="broker", queue_name=queue_name,
                                            poll_interval=2, **kwargs))])


# Messages whose events Airflow stored without a run (the tail of a burst) are handed out again
# after 15 s, instead of the default minute, to keep the tier short.
burst = watched("SystemBurstQueue", redeliver_after=15)
each = watched("SystemEachQueue", one_run_per_message=True, redeliver_after=15)


def consumer(dag_id: str, asset: Asset) -> None:
    @dag(dag_id=dag_id, schedule=[asset], start_date=START, catchup=False,
         max_active_runs=4, default_args=RETRIES, tags=["airflow-broker", "system"])
    def consume_events() -> None:
        @task
        def process() -> list[str]:
            context: Any = get_current_context()
            events = context["triggering_asset_events"][asset]
            with BrokerHook() as hook, hook.consume(events) as (tx, messages):
                return record(tx, messages, context["run_id"])

        process()

    consume_events()


consumer("s_burst", burst)
consumer("s_each", each)


@dag(dag_id="s_wait", schedule=None, start_date=START, catchup=False, default_args=RETRIES,
     tags=["airflow-broker", "system"])
def s_wait() -> None:
    received = WaitForReceiveSensor(task_id="receive", queue_name="SystemWaitQueue",
                                    receive_messages=True, max_messages=10, poll_interval=2,
                                    timeout=900)

    @task
    def process(messages: Any) -> list[str]:
        context: Any = get_current_context()
        with BrokerHook() as hook, hook.consume(messages) as (tx, consumed):
            return record(tx, consumed, context["run_id"])

    process(received.output)


s_wait()
