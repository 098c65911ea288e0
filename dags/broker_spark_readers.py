"""Event-based activation of Spark readers: the stock-trade brokerage as a SparkSubmit job.

SQL Server's external activation, with Airflow as the activator: a QUEUE_ACTIVATION event
notification on BrokerageQueue sends a message to BrokerageActivationQueue whenever the queue
monitor decides a reader is needed (the first message after the queue was empty, then one more
per ramp-up interval while the backlog lasts). An AssetWatcher turns each notification into a
run of ``broker_spark_readers``, which submits the Spark reader application (unless the readers
already running left nothing to receive: then the run ends without a job); ``max_active_runs``
caps the number of concurrent reader jobs. Each Spark task is a queue reader running
``airflow_broker.demos.trading:acknowledge_trade``: it acknowledges every trade entry and ends the
conversation after the final one (the target ends first), in the transaction of its RECEIVE.
The run then removes the notifications that started it from the Airflow inbox.

To run it:

1. Trigger ``broker_spark_readers_setup`` once. It creates the stock-trade application
   (``airflow_broker.demos.trading.SPEC``), BrokerageActivationQueue, the service
   //Trading/BrokerageActivation (contract PostEventNotification) and the event notification
   ``activate_brokerage_readers`` (QUEUE_ACTIVATION on BrokerageQueue).
2. Keep ``airflow-broker worker`` running against the same database: its queue monitors send
   the QUEUE_ACTIVATION notifications (``broker_maintenance`` leaves activation to it).
3. Point the Spark connection ``spark_default`` at your cluster, in JSON form:
   ``{"conn_type": "spark", "host": "spark://spark-master:7077"}`` for a standalone master
   (``yarn``, ``k8s://https://...``, or ``local[2]`` to try it on the Airflow worker; the URI
   form spark://local[2] silently means yarn). The operator ships the engine, its
   dependencies and the DSN to the executors itself (docs/spark.md).
4. Unpause ``broker_spark_readers`` and trigger ``broker_stock_trade``: its trades start a
   reader job, and the trader receives the acknowledgements.

``broker_stock_trade_brokerage`` is the same brokerage as Airflow tasks; run one brokerage or
the other on BrokerageQueue.
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import Asset, AssetWatcher, chain, dag, get_current_context, task

from airflow_broker.demos.trading import SPEC as TRADING_SPEC
from airflow_broker.events import QUEUE_ACTIVATION
from airflow_broker.hooks import BrokerHook
from airflow_broker.operators import ActivatedReaderOperator, BrokerSetupOperator

START = pendulum.datetime(2026, 1, 1, tz="UTC")
POST_EVENT_NOTIFICATION = "http://schemas.microsoft.com/SQL/Notifications/PostEventNotification"
SPARK_CONN_ID = "spark_default"

# The stock-trade application, and the event-based activation of BrokerageQueue's readers.
SPEC: dict[str, Any] = {
    **TRADING_SPEC,
    "queues": [*TRADING_SPEC["queues"], {"name": "BrokerageActivationQueue"}],
    "services": [
        *TRADING_SPEC["services"],
        {"name": "//Trading/BrokerageActivation", "queue_name": "BrokerageActivationQueue",
         "contracts": [POST_EVENT_NOTIFICATION]},
    ],
    "event_notifications": [
        {"name": "activate_brokerage_readers", "queue_name": "BrokerageQueue",
         "events": [QUEUE_ACTIVATION], "service_name": "//Trading/BrokerageActivation"},
    ],
}

activation = Asset(
    "brokerage_activation",
    uri="broker://broker_default/BrokerageActivationQueue",
    watchers=[AssetWatcher(
        name="brokerage_activation_watcher",
        trigger=MessageQueueTrigger(scheme="broker", queue_name="BrokerageActivationQueue"),
    )],
)


@dag(dag_id="broker_spark_readers_setup", schedule=None, start_date=START, catchup=False,
     tags=["airflow-broker", "example", "spark"], doc_md=__doc__)
def broker_spark_readers_setup() -> None:
    BrokerSetupOperator(task_id="setup", spec=SPEC)


@dag(dag_id="broker_spark_readers", schedule=[activation], start_date=START, catchup=False,
     max_active_runs=2, tags=["airflow-broker", "example", "spark"], doc_md=__doc__)
def broker_spark_readers() -> None:
    readers = ActivatedReaderOperator(
        task_id="brokerage_readers", queue_name="BrokerageQueue",
        handler="airflow_broker.demos.trading:acknowledge_trade", readers=2, idle_exit=10,
        poison_strategy="quarantine", conn_id=SPARK_CONN_ID)

    @task
    def acknowledge_activation() -> int:
        """The notifications have done their job once the readers have run; unacknowledged,
        they would stay in the Airflow inbox."""
        context: Any = get_current_context()
        with BrokerHook() as hook:
            return hook.ack(context["triggering_asset_events"].get(activation, []))

    chain(readers, acknowledge_activation())


broker_spark_readers_setup()
broker_spark_readers()
