"""Event-driven scheduling: every order message that arrives on OrderQueue starts one DAG run.

* ``broker_orders_setup`` creates the order application's message types, contract, queues and
  services (run it once).
* ``broker_orders`` is scheduled on the asset ``broker_orders``, which an AssetWatcher feeds
  from OrderQueue through ``MessageQueueTrigger(scheme="broker", ...)``. Each message becomes
  one asset event (the message is in ``extra["payload"]``); ``one_run_per_message`` releases
  the next message only after the run of the previous one has acknowledged it, so every
  message gets a DAG run of its own. The task confirms the order on the same conversation and
  ends the conversation (the target ends first), in the transaction that also removes the
  message from the Airflow inbox: processing and acknowledgement commit together.
* ``broker_orders_client`` places an order: it begins a dialog with a JSON order, waits for the
  service to end the conversation, then receives the confirmation and ends its own side.

A message leaves the broker's inbox only after Airflow has stored its asset event (Airflow
3.3's shared-stream acknowledgement); after a triggerer crash a message may produce a second
event, and the consume() below skips what an earlier run already processed.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pendulum
from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import Asset, AssetWatcher, Param, chain, dag, get_current_context, task

from airflow_broker import END_DIALOG, ERROR, Message, Transaction
from airflow_broker.hooks import BrokerHook
from airflow_broker.operators import (
    BrokerSetupOperator,
    ReceiveMessagesOperator,
    SendMessageOperator,
)
from airflow_broker.sensors import WaitForReceiveSensor

log = logging.getLogger(__name__)

ORDER = "//Shop/Order"
CONFIRMATION = "//Shop/OrderConfirmation"
START = pendulum.datetime(2026, 1, 1, tz="UTC")

SPEC: dict[str, Any] = {
    "message_types": [{"name": ORDER}, {"name": CONFIRMATION}],
    "contracts": [{"name": "//Shop/OrderContract",
                   "message_types": {ORDER: "INITIATOR", CONFIRMATION: "TARGET"}}],
    "queues": [{"name": "OrderQueue"}, {"name": "ShopClientQueue"}],
    "services": [
        {"name": "//Shop/OrderService", "queue_name": "OrderQueue",
         "contracts": ["//Shop/OrderContract"]},
        {"name": "//Shop/ClientService", "queue_name": "ShopClientQueue"},
    ],
}

# [START watcher]
orders = Asset(
    "broker_orders",
    uri="broker://broker_default/OrderQueue",
    watchers=[AssetWatcher(
        name="order_queue_watcher",
        trigger=MessageQueueTrigger(scheme="broker", queue_name="OrderQueue",
                                    one_run_per_message=True, poll_interval=5),
    )],
)
# [END watcher]


@dag(dag_id="broker_orders_setup", schedule=None, start_date=START, catchup=False,
     tags=["airflow-broker", "example"])
def broker_orders_setup() -> None:
    BrokerSetupOperator(task_id="setup", spec=SPEC)


@dag(dag_id="broker_orders", schedule=[orders], start_date=START, catchup=False,
     max_active_runs=1, tags=["airflow-broker", "example"], doc_md=__doc__)
def broker_orders() -> None:
    @task
    def process_order() -> list[str]:
        context: Any = get_current_context()
        events = context["triggering_asset_events"][orders]
        confirmed = []
        with BrokerHook() as hook, hook.consume(events) as (tx, messages):
            for message in messages:
                if message.message_type_name != ORDER:
                    # EndDialog or Error of a conversation the client gave up.
                    tx.end_conversation(message.conversation_handle)
                    continue
                order = message.json()
                log.info("order %s: %s", order["order_id"], order)
                tx.send(message.conversation_handle, CONFIRMATION, json.dumps({
                    "order_id": order["order_id"], "status": "accepted",
                    "run_id": context["run_id"]}))
                tx.end_conversation(message.conversation_handle)
                confirmed.append(str(order["order_id"]))
        return confirmed

    process_order()


def handle_confirmation(messages: list[Message], tx: Transaction, context: Any) -> None:
    for message in messages:
        if message.message_type_name == CONFIRMATION:
            log.info("confirmed: %s", message.json())
        elif message.is_end_dialog or message.is_error:
            tx.end_conversation(message.conversation_handle)


@dag(dag_id="broker_orders_client", schedule=None, start_date=START, catchup=False,
     params={"order_id": Param("A-1", type="string"), "item": Param("widget", type="string")},
     tags=["airflow-broker", "example"])
def broker_orders_client() -> None:
    place = SendMessageOperator(
        task_id="place_order",
        from_service_name="//Shop/ClientService",
        to_service_name="//Shop/OrderService",
        contract_name="//Shop/OrderContract",
        message_type_name=ORDER,
        body='{"order_id": "{{ params.order_id }}", "item": "{{ params.item }}"}',
        body_format="json",
    )
    done = WaitForReceiveSensor(task_id="wait_for_confirmation", queue_name="ShopClientQueue",
                                conversation_handle=place.output,
                                message_type_names=[END_DIALOG, ERROR], timeout=3600)
    receive = ReceiveMessagesOperator(task_id="receive_confirmation",
                                      queue_name="ShopClientQueue",
                                      conversation_handle=place.output,
                                      callback=handle_confirmation, until_empty=True)
    chain(place, done, receive)


broker_orders_setup()
broker_orders()
broker_orders_client()
