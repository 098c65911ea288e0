"""The stock-trade application's initiator side (the README's first dialog) as a DAG.

The trader begins a dialog to the brokerage, sends its trade entries, waits (deferred, no
worker slot held) until the brokerage has acknowledged them and ended its side of the
conversation, then receives the acknowledgements and the EndDialog and ends its own side. The
target ends first and the initiator last, as Service Broker's authors recommend: no endpoint
leaks, and an error from the brokerage would reach the trader.

The brokerage side is any reader of BrokerageQueue (an activated reader, a Spark job, another
DAG, ``airflow-broker demo``): for each TradeEntry it sends a TradeAcknowledgement, and after
the last one it ends the conversation.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import pendulum
from airflow.sdk import chain, dag

from airflow_broker import END_DIALOG, ERROR, Message, Transaction

if TYPE_CHECKING:
    from operators.broker import (
        BeginDialogOperator,
        BrokerSetupOperator,
        ReceiveMessagesOperator,
        SendMessageOperator,
    )
    from sensors.broker import WaitForReceiveSensor
else:
    from airflow_broker.operators import (
        BeginDialogOperator,
        BrokerSetupOperator,
        ReceiveMessagesOperator,
        SendMessageOperator,
    )
    from airflow_broker.sensors import WaitForReceiveSensor

log = logging.getLogger(__name__)

TRADE_ENTRY = "//Trading/TradeEntry"
TRADE_ACK = "//Trading/TradeAcknowledgement"

SPEC: dict[str, Any] = {
    "message_types": [
        {"name": TRADE_ENTRY, "validation": "WELL_FORMED_XML"},
        {"name": TRADE_ACK, "validation": "WELL_FORMED_XML"},
    ],
    "contracts": [
        {"name": "//Trading/TradeContract",
         "message_types": {TRADE_ENTRY: "INITIATOR", TRADE_ACK: "TARGET"}},
    ],
    "queues": [{"name": "TraderQueue"}, {"name": "BrokerageQueue"}],
    "services": [
        {"name": "//Trading/TraderService", "queue_name": "TraderQueue"},
        {"name": "//Trading/BrokerageService", "queue_name": "BrokerageQueue",
         "contracts": ["//Trading/TradeContract"]},
    ],
}

TRADES = [
    '<trade id="1"><symbol>MSFT</symbol><side>BUY</side><quantity>100</quantity></trade>',
    '<trade id="2"><symbol>ORCL</symbol><side>SELL</side><quantity>40</quantity></trade>',
    '<trade id="3"><symbol>IBM</symbol><side>BUY</side><quantity>15</quantity></trade>',
]


def handle_replies(messages: list[Message], tx: Transaction, context: Any) -> None:
    """Runs in the RECEIVE's transaction: acknowledgements are logged, and the brokerage's
    EndDialog (or an Error) ends the trader's side of the conversation."""
    for message in messages:
        if message.message_type_name == TRADE_ACK:
            log.info("acknowledged: %s", message.text())
        elif message.is_error:
            log.error("the brokerage refused the trades: %s", message.error())
            tx.end_conversation(message.conversation_handle)
        elif message.is_end_dialog:
            tx.end_conversation(message.conversation_handle)


@dag(
    dag_id="broker_stock_trade",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["airflow-broker", "example"],
    doc_md=__doc__,
)
def broker_stock_trade() -> None:
    setup = BrokerSetupOperator(task_id="setup", spec=SPEC)
    begin = BeginDialogOperator(
        task_id="begin_dialog",
        from_service_name="//Trading/TraderService",
        to_service_name="//Trading/BrokerageService",
        contract_name="//Trading/TradeContract",
        lifetime=3600,
    )
    sends = [
        SendMessageOperator(task_id=f"send_trade_{number}", conversation_handle=begin.output,
                            message_type_name=TRADE_ENTRY, body=trade, body_format="xml")
        for number, trade in enumerate(TRADES, start=1)
    ]
    # The EndDialog comes after every acknowledgement of the conversation, so once it is
    # there, all of them are.
    brokerage_done = WaitForReceiveSensor(
        task_id="wait_for_brokerage",
        queue_name="TraderQueue",
        conversation_handle=begin.output,
        message_type_names=[END_DIALOG, ERROR],
        timeout=3600,
    )
    receive = ReceiveMessagesOperator(
        task_id="receive_acknowledgements",
        queue_name="TraderQueue",
        conversation_handle=begin.output,
        callback=handle_replies,
        until_empty=True,
    )
    chain(setup, begin, *sends, brokerage_done, receive)


broker_stock_trade()
