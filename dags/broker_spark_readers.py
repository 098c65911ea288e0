"""Event-based activation of Spark readers.

SQL Server's external activation, with Airflow as the activator: a QUEUE_ACTIVATION event
notification on BrokerageQueue sends a message to BrokerageActivationQueue whenever the queue
monitor decides a reader is needed (the first message after the queue was empty, then one more
per ramp-up interval while the backlog lasts). An AssetWatcher turns each notification into a
run of this DAG, which submits the Spark reader application; ``max_active_runs`` keeps the
number of concurrent reader jobs at the queue's cap.

Setup, once (for example with BrokerSetupOperator):

    queues: [{name: BrokerageActivationQueue}]
    services: [{name: //Trading/BrokerageActivation, queue_name: BrokerageActivationQueue,
                contracts: [http://schemas.microsoft.com/SQL/Notifications/PostEventNotification]}]
    event_notifications: [{name: activate_brokerage_readers, queue_name: BrokerageQueue,
                           events: [QUEUE_ACTIVATION],
                           service_name: //Trading/BrokerageActivation}]

and run `airflow-broker worker`, which runs the queue monitors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pendulum
from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import Asset, AssetWatcher, dag

if TYPE_CHECKING:
    from operators.spark import ActivatedReaderOperator
else:
    from airflow_broker.operators import ActivatedReaderOperator

activation = Asset(
    "brokerage_activation",
    uri="broker://broker_default/BrokerageActivationQueue",
    watchers=[AssetWatcher(
        name="brokerage_activation_watcher",
        trigger=MessageQueueTrigger(scheme="broker", queue_name="BrokerageActivationQueue"),
    )],
)


@dag(dag_id="broker_spark_readers", schedule=[activation],
     start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False, max_active_runs=2,
     tags=["airflow-broker", "example", "spark"], doc_md=__doc__)
def broker_spark_readers() -> None:
    ActivatedReaderOperator(
        task_id="brokerage_readers", queue_name="BrokerageQueue",
        handler="airflow_broker.demo_dag:book_trade", readers=2, idle_exit=10,
        poison_strategy="quarantine", conn_id="spark_local")


broker_spark_readers()
