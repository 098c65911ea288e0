"""The stock-trade application (the README's first dialog) as two DAGs, one per side.

* ``broker_stock_trade``, the trader (initiator), triggered by hand: begins a dialog to the
  brokerage, sends its trade entries (the last one marked ``final="yes"``), waits (deferred, no
  worker slot held) until the brokerage has acknowledged them and ended its side of the
  conversation, then receives the acknowledgements and the EndDialog and ends its own side.
* ``broker_stock_trade_brokerage``, the brokerage (target), continuous: waits (deferred) for
  trade entries on BrokerageQueue, then receives them and, in the RECEIVE's transaction,
  acknowledges each one and ends the conversation after the final trade
  (``airflow_broker.demos.trading.acknowledge_trades``). Unpause it and every trader run completes
  on its own; a run that finds nothing for a day is skipped and the next one waits again.

The target ends first and the initiator last, as Service Broker's authors recommend: no
endpoint leaks, and an error from the brokerage would reach the trader. Both DAGs apply the
application's catalogue (``airflow_broker.demos.trading.SPEC``) idempotently, so either may run
first.

``broker_spark_readers`` is the same brokerage as Spark readers, started by event-based
activation; run one brokerage or the other on BrokerageQueue.
"""

from __future__ import annotations

import logging
from typing import Any

import pendulum
from airflow.sdk import chain, dag

from airflow_broker import END_DIALOG, ERROR, Message, Transaction
from airflow_broker.demos.trading import (
    BROKERAGE_SERVICE,
    CONTRACT,
    TRADE_ACK,
    TRADE_ENTRY,
    TRADER_SERVICE,
    acknowledge_trades,
)
from airflow_broker.demos.trading import SPEC as TRADING_SPEC
from airflow_broker.operators import (
    BeginDialogOperator,
    BrokerSetupOperator,
    ReceiveMessagesOperator,
    SendMessageOperator,
)
from airflow_broker.sensors import WaitForReceiveSensor

log = logging.getLogger(__name__)

START = pendulum.datetime(2026, 1, 1, tz="UTC")

# Message types WELL_FORMED_XML, //Trading/TradeContract, TraderQueue and BrokerageQueue, and
# the services //Trading/TraderService and //Trading/BrokerageService.
SPEC: dict[str, Any] = TRADING_SPEC

TRADES = [
    '<trade id="1"><symbol>MSFT</symbol><side>BUY</side><quantity>100</quantity></trade>',
    '<trade id="2"><symbol>ORCL</symbol><side>SELL</side><quantity>40</quantity></trade>',
    '<trade id="3" final="yes"><symbol>IBM</symbol><side>BUY</side><quantity>15</quantity>'
    "</trade>",
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
    start_date=START,
    catchup=False,
    tags=["airflow-broker", "example"],
    doc_md=__doc__,
)
def broker_stock_trade() -> None:
    setup = BrokerSetupOperator(task_id="setup", spec=SPEC)
    begin = BeginDialogOperator(
        task_id="begin_dialog",
        from_service_name=TRADER_SERVICE,
        to_service_name=BROKERAGE_SERVICE,
        contract_name=CONTRACT,
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


@dag(
    dag_id="broker_stock_trade_brokerage",
    schedule="@continuous",
    max_active_runs=1,
    start_date=START,
    catchup=False,
    tags=["airflow-broker", "example"],
    doc_md=__doc__,
)
def broker_stock_trade_brokerage() -> None:
    setup = BrokerSetupOperator(task_id="setup", spec=SPEC)
    trades = WaitForReceiveSensor(
        task_id="wait_for_trades",
        queue_name="BrokerageQueue",
        timeout=24 * 3600,
        soft_fail=True,
    )
    # RECEIVE, the acknowledgements and END CONVERSATION commit together, one conversation
    # group per transaction: a failure rolls the batch back onto the queue, never half done.
    acknowledge = ReceiveMessagesOperator(
        task_id="acknowledge_trades",
        queue_name="BrokerageQueue",
        callback=acknowledge_trades,
        until_empty=True,
    )
    chain(setup, trades, acknowledge)


broker_stock_trade()
broker_stock_trade_brokerage()
