"""The stock-trade application of the example DAGs and the demo, and its brokerage side.

The trader (//Trading/TraderService on TraderQueue) begins a dialog on //Trading/TradeContract
and sends TradeEntry messages, the last one marked ``final="yes"``. The brokerage
(//Trading/BrokerageService on BrokerageQueue) acknowledges each trade with a
TradeAcknowledgement and ends the conversation after the final one: the target ends first, and
the trader ends its side when the EndDialog arrives, so no endpoint leaks.

The brokerage's handlers run wherever a queue reader runs: in the Spark tasks of
ActivatedReaderOperator (``airflow_broker.demos.trading:acknowledge_trade``,
``airflow_broker.demos.trading:book_trade``), in an activated reader process, or in an Airflow task
(``acknowledge_trades``, a ReceiveMessagesOperator callback). Airflow 3's task supervisor gives
a task's child processes, Spark's Python workers among them, an environment in which importing
Airflow fails (``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=airflow-db-not-allowed:///``), so this
module must never import Airflow, directly or through what it imports.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from lxml import etree
from psycopg import sql

from airflow_broker.messages import Message
from airflow_broker.readers.queue_reader import ReaderContext
from airflow_broker.transaction import Transaction

TRADE_ENTRY = "//Trading/TradeEntry"
TRADE_ACK = "//Trading/TradeAcknowledgement"
CONTRACT = "//Trading/TradeContract"
TRADER_SERVICE = "//Trading/TraderService"
BROKERAGE_SERVICE = "//Trading/BrokerageService"

# The application's catalogue, as a BrokerSetupOperator / apply_spec spec.
SPEC: dict[str, Any] = {
    "message_types": [
        {"name": TRADE_ENTRY, "validation": "WELL_FORMED_XML"},
        {"name": TRADE_ACK, "validation": "WELL_FORMED_XML"},
    ],
    "contracts": [
        {"name": CONTRACT, "message_types": {TRADE_ENTRY: "INITIATOR", TRADE_ACK: "TARGET"}},
    ],
    "queues": [{"name": "TraderQueue"}, {"name": "BrokerageQueue"}],
    "services": [
        {"name": TRADER_SERVICE, "queue_name": "TraderQueue"},
        {"name": BROKERAGE_SERVICE, "queue_name": "BrokerageQueue", "contracts": [CONTRACT]},
    ],
}


def _trade(message: Message) -> etree._Element:
    trade = message.xml()
    if trade is None:
        raise ValueError(f"trade entry {message.message_id} has no body")
    return trade


def _acknowledgement(trade: etree._Element, status: str = "booked") -> str:
    return f'<ack trade="{trade.get("id")}" status="{status}"/>'


def acknowledge_trades(messages: list[Message], tx: Transaction, context: Any = None) -> None:
    """The brokerage as a ReceiveMessagesOperator callback, in the RECEIVE's transaction: each
    trade entry is acknowledged, the final one ends the conversation, and an EndDialog or Error
    from the trader (its lifetime ran out, it gave up) ends this side too."""
    ended: set[uuid.UUID] = set()
    for message in messages:
        handle = message.conversation_handle
        if handle in ended:
            continue
        if message.message_type_name == TRADE_ENTRY:
            trade = _trade(message)
            tx.send(handle, TRADE_ACK, _acknowledgement(trade))
            if trade.get("final") != "yes":
                continue
        elif not (message.is_end_dialog or message.is_error):
            continue
        tx.end_conversation(handle)
        ended.add(handle)


def acknowledge_trade(message: Message, ctx: ReaderContext) -> None:
    """The same brokerage as a queue reader's handler (QueueReader, the Spark readers); the
    reader itself ends conversations on EndDialog and Error."""
    trade = _trade(message)
    ctx.send(message.conversation_handle, TRADE_ACK, _acknowledgement(trade))
    if trade.get("final") == "yes":
        ctx.end_conversation(message.conversation_handle)


def book_trade(message: Message, ctx: ReaderContext) -> None:
    """The demo's brokerage handler: books the trade into ``booked_trades`` of the reader's
    broker schema, in the transaction that received it, then acknowledges it. A trade whose
    quantity is not positive raises, and the reader's poison strategy takes it."""
    trade = _trade(message)
    quantity = int(trade.findtext("quantity") or "0")
    if quantity <= 0:
        raise ValueError(f"trade {trade.get('id')}: quantity {quantity} is not positive")
    ctx.tx.conn.execute(sql.SQL(
        "INSERT INTO {}.booked_trades (trade_id, account, sequence, symbol, quantity, pid)"
        " VALUES (%s, %s, %s, %s, %s, %s)").format(sql.Identifier(ctx.schema)),
        [int(trade.get("id", "0")), trade.get("account"), message.message_sequence_number,
         trade.findtext("symbol"), quantity, os.getpid()])
    acknowledge_trade(message, ctx)
