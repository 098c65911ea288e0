"""The demo: the stock-trade application of the Service Broker book chapter, on the embedded
PostgreSQL (or AIRFLOW_BROKER_DSN).

The trader side begins one dialog per account, in one conversation group per desk, and sends
trade entries; two brokerage readers receive them under conversation-group locks, book them in
a table in the same transaction and acknowledge each trade, and end the conversation after an
account's final trade (the target ends first); the trader side receives the acknowledgements
and the EndDialog and ends its side. One malformed trade is refused by the brokerage's XML
validation, and the trader receives the Error. Finally the broker clock is moved past the
30 minutes of replay protection and the worker reclaims every closed endpoint.
"""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from airflow_broker import Broker
from airflow_broker.demos.output import say
from airflow_broker.worker import BrokerWorker

SCHEMA = "broker_demo"
TRADE_ENTRY = "//Trading/TradeEntry"
TRADE_ACK = "//Trading/TradeAcknowledgement"
CONTRACT = "//Trading/TradeContract"
TRADER_SERVICE = "//Trading/TraderService"
BROKERAGE_SERVICE = "//Trading/BrokerageService"
SYMBOLS = ("MSFT", "ORCL", "IBM", "SAP", "AAPL")


@dataclass
class DemoResult:
    sent: int = 0
    booked: int = 0
    acknowledged: int = 0
    ended: int = 0
    reclaimed: int = 0
    endpoints_left: int = -1
    errors: list[str] = field(default_factory=list)
    booked_in_order: bool = True
    readers: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0



def define_application(broker: Broker) -> None:
    """The book chapter's objects, in GA syntax (spec 2.2)."""
    with broker.transaction() as tx:
        tx.create_message_type(TRADE_ENTRY, "WELL_FORMED_XML")
        tx.create_message_type(TRADE_ACK, "WELL_FORMED_XML")
        tx.create_contract(CONTRACT, {TRADE_ENTRY: "INITIATOR", TRADE_ACK: "TARGET"})
        tx.create_queue("TraderQueue", schema=SCHEMA)
        tx.create_queue("BrokerageQueue", schema=SCHEMA)
        tx.create_service(TRADER_SERVICE, "TraderQueue")
        tx.create_service(BROKERAGE_SERVICE, "BrokerageQueue", [CONTRACT])
        tx.conn.execute(sql.SQL(
            "CREATE TABLE {}.booked_trades (trade_id integer PRIMARY KEY, account text NOT NULL,"
            " sequence bigint NOT NULL, symbol text NOT NULL, quantity integer NOT NULL,"
            " reader text NOT NULL, booked_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        ).format(sql.Identifier(SCHEMA)))


def send_trades(broker: Broker, accounts: int, trades_per_account: int, desks: int,
                result: DemoResult) -> None:
    rng = random.Random(7)
    desk_groups = [uuid.uuid4() for _ in range(desks)]
    trade_id = 0
    with broker.transaction() as tx:
        handles = [
            tx.begin_dialog(TRADER_SERVICE, BROKERAGE_SERVICE, CONTRACT,
                            related_conversation_group=desk_groups[a % desks], lifetime=3600)
            for a in range(accounts)
        ]
    for round_number in range(trades_per_account):
        with broker.transaction() as tx:
            for account, handle in enumerate(handles):
                trade_id += 1
                final = ' final="yes"' if round_number == trades_per_account - 1 else ""
                body = (f'<trade id="{trade_id}" account="ACC-{account:03d}"{final}>'
                        f"<symbol>{rng.choice(SYMBOLS)}</symbol>"
                        f"<quantity>{rng.randint(1, 500)}</quantity></trade>")
                tx.send(handle, TRADE_ENTRY, body)
                result.sent += 1
        if round_number == 0:
            say(f"  trader: sent the first {accounts} trades on {accounts} dialogs "
                f"in {desks} desk groups")
    say(f"  trader: sent {result.sent} trades ({trades_per_account} per account)")
    with broker.transaction() as tx:
        rogue = tx.begin_dialog(TRADER_SERVICE, BROKERAGE_SERVICE, CONTRACT, lifetime=3600)
        tx.send(rogue, TRADE_ENTRY, "<trade id='bad'><symbol>MSFT</trade>")
        result.sent += 1
    say("  trader: sent one malformed trade entry (its XML is not well-formed)")


def brokerage_reader(broker: Broker, name: str, result: DemoResult, lock: threading.Lock) -> None:
    """An activated-procedure style loop: RECEIVE a group's trades, book them and acknowledge
    them in one transaction; stop after the queue stays empty for a second."""
    booked = sql.SQL(
        "INSERT INTO {}.booked_trades (trade_id, account, sequence, symbol, quantity, reader)"
        " VALUES (%s, %s, %s, %s, %s, %s)"
    ).format(sql.Identifier(SCHEMA))
    while True:
        with broker.transaction() as tx:
            trades = tx.receive("BrokerageQueue", 50, waitfor=True, timeout=1.0)
            for trade in trades:
                doc = trade.xml()
                assert doc is not None
                tx.conn.execute(booked, [int(doc.get("id", "0")), doc.get("account"),
                                         trade.message_sequence_number, doc.findtext("symbol"),
                                         int(doc.findtext("quantity") or 0), name])
                tx.send(trade.conversation_handle, TRADE_ACK,
                        f'<ack trade="{doc.get("id")}" status="booked"/>')
                if doc.get("final") == "yes":
                    # The target ends first: the pattern that leaks nothing (spec 15.3).
                    tx.end_conversation(trade.conversation_handle)
        if not trades:
            return
        with lock:
            result.booked += len(trades)
            result.readers[name] += len(trades)


def receive_acknowledgements(broker: Broker, result: DemoResult) -> None:
    while True:
        with broker.transaction() as tx:
            replies = tx.receive("TraderQueue", 100, waitfor=True, timeout=1.0)
            for reply in replies:
                if reply.is_error:
                    error = reply.error()
                    result.errors.append(f"{error.code}: {error.description}")
                    say(f"  trader: Error {error.code} on a dialog: "
                        f"{error.description[:80]}...")
                    tx.end_conversation(reply.conversation_handle)
                elif reply.is_end_dialog:
                    tx.end_conversation(reply.conversation_handle)
                    result.ended += 1
                else:
                    result.acknowledged += 1
        if not replies:
            return


def run_demo(dsn: str | None = None, *, accounts: int = 40, trades_per_account: int = 25,
             desks: int = 8) -> DemoResult:
    started = time.monotonic()
    result = DemoResult()
    say("airflow-broker demo: the stock-trade application on PostgreSQL")
    with Broker(dsn, schema=SCHEMA, max_connections=8) as broker:
        where = "embedded PostgreSQL" if broker.embedded else "PostgreSQL from AIRFLOW_BROKER_DSN"
        say(f"- using the {where}, schema {SCHEMA} (recreated for this run)")
        with psycopg.connect(broker.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                sql.Identifier(SCHEMA)))
        broker.install()
        define_application(broker)
        say(f"- defined message types {TRADE_ENTRY} and {TRADE_ACK}, contract {CONTRACT},")
        say("  queues TraderQueue and BrokerageQueue, services TraderService and "
            "BrokerageService")
        say("- trader side:")
        send_trades(broker, accounts, trades_per_account, desks, result)
        say("- brokerage side: 2 readers RECEIVE under conversation-group locks, book each "
            "trade and acknowledge it in the same transaction, and end each dialog after its "
            "final trade")
        lock = threading.Lock()
        readers = [threading.Thread(target=brokerage_reader, args=(broker, f"reader-{i}",
                                                                    result, lock))
                   for i in (1, 2)]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join()
        say(f"  brokerage: booked {result.booked} trades "
            f"({', '.join(f'{k} {v}' for k, v in sorted(result.readers.items()))})")
        say("- trader side: receiving acknowledgements and errors")
        receive_acknowledgements(broker, result)
        with psycopg.connect(broker.dsn) as conn:
            out_of_order = conn.execute(sql.SQL(
                "SELECT count(*) FROM (SELECT sequence, lag(sequence) OVER"
                " (PARTITION BY account ORDER BY booked_at, sequence) AS previous"
                " FROM {}.booked_trades) s WHERE previous IS NOT NULL AND sequence <= previous"
            ).format(sql.Identifier(SCHEMA))).fetchone()
            endpoints = conn.execute(sql.SQL(
                "SELECT state_desc, count(*) FROM {}.conversation_endpoints"
                " GROUP BY state_desc ORDER BY 1").format(sql.Identifier(SCHEMA))).fetchall()
        result.booked_in_order = out_of_order is not None and out_of_order[0] == 0
        closed = sum(n for state, n in endpoints if state == "CLOSED")
        say(f"  trader: {result.acknowledged} acknowledgements, {result.ended} dialogs ended by "
            f"the brokerage and then by the trader; {closed} brokerage endpoints are CLOSED")
        say("- moving the broker clock 31 minutes on: closed target endpoints are kept 30 "
            "minutes against replays, then reclaimed")
        broker.advance_clock(dt.timedelta(minutes=31))
        result.reclaimed = BrokerWorker(broker).run_once().endpoints_reclaimed
        with psycopg.connect(broker.dsn) as conn:
            left = conn.execute(sql.SQL("SELECT count(*) FROM {}.conversation_endpoints")
                                .format(sql.Identifier(SCHEMA))).fetchone()
        result.endpoints_left = int(left[0]) if left else -1
        result.seconds = time.monotonic() - started
        say("")
        say("Summary")
        say(f"  trades sent ............. {result.sent}")
        say(f"  trades booked ........... {result.booked} "
            f"(each account's trades in sequence order: "
            f"{'yes' if result.booked_in_order else 'NO'})")
        say(f"  acknowledgements ........ {result.acknowledged}")
        say(f"  errors received ......... {len(result.errors)} "
            "(the malformed trade, refused with -9615)")
        say(f"  dialogs ended ........... {result.ended} (target first, then initiator)")
        say(f"  endpoints reclaimed ..... {result.reclaimed}")
        say(f"  endpoints left .......... {result.endpoints_left}")
        say(f"  time .................... {result.seconds:.1f} s")
        say("")
        if broker.embedded is not None:
            say("Look around: `airflow-broker server start` keeps the embedded PostgreSQL "
                "running and prints its URI; then, with psql on that URI:")
        else:
            say("Look around, with psql on the same database:")
        say(f"  SELECT * FROM {SCHEMA}.conversation_endpoints;  -- empty after reclaim")
        say(f"  SELECT * FROM {SCHEMA}.booked_trades ORDER BY account, sequence;")
        say(f"  SELECT * FROM {SCHEMA}.\"TraderQueue\";  -- the queue's own view")
    return result
