"""The demo's Airflow DAG: the stock-trade application of the Service Broker book chapter, with
Spark readers on the brokerage side.

1. ``setup``: a fresh ``broker_demo`` schema with the trading application, a settlement queue
   watched for BROKER_QUEUE_DISABLED, and the table the brokerage books trades into.
2. ``send_trades``: the trader side begins one dialog per account (accounts of a desk share a
   conversation group) and sends trade entries; some are invalid (a negative quantity).
3. ``brokerage_readers``: a SparkSubmit job of two readers (ActivatedReaderOperator) books each
   trade and acknowledges it in the transaction that received it; the brokerage ends each
   dialog after the account's final trade (the target ends first); invalid trades go to the
   quarantine table instead of stopping the queue. The handler is
   ``airflow_broker.demos.trading:book_trade``: Spark's Python workers import it, in processes where
   Airflow cannot be imported, which is why it does not live in this module.
4. ``trader_acknowledgements``: the trader side receives the acknowledgements and the EndDialog
   messages and ends its side of each dialog.
5. ``poison_settlement`` and ``settlement_alert``: a settlement that can never be processed
   rolls back five times, poison-message detection disables the queue, and the deferrable
   QueueDisabledSensor receives the BROKER_QUEUE_DISABLED notification: the alert.
6. ``reclaim``: the broker clock moves past the 30 minutes of replay protection and the worker
   reclaims the closed endpoints; ``summary`` reports everything and where to look.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import time
import uuid
from typing import Any

import pendulum
from airflow.sdk import Param, chain, dag, get_current_context, task
from psycopg import sql

from airflow_broker.demos.output import say as print_line
from airflow_broker.demos.trading import (
    BROKERAGE_SERVICE,
    CONTRACT,
    TRADE_ACK,
    TRADE_ENTRY,
    TRADER_SERVICE,
)
from airflow_broker.hooks import BrokerHook
from airflow_broker.migrations import install
from airflow_broker.operators import ActivatedReaderOperator
from airflow_broker.sensors import QueueDisabledSensor
from airflow_broker.worker import BrokerWorker

SCHEMA = "broker_demo"
SETTLEMENT = "//Trading/Settlement"
SYMBOLS = ("MSFT", "ORCL", "IBM", "SAP", "AAPL")
CONN_ID = "broker_demo"


def say(text: str) -> None:
    print_line(text, prefix="[demo] ")


def _count(tx: Any, query: str) -> int:
    rows = tx.conn.execute(sql.SQL(query).format(s=sql.Identifier(SCHEMA)), ()).fetchall()
    return int(rows[0][0]) if rows else 0


def build_demo_dag() -> Any:
    @dag(dag_id="broker_trading_demo", schedule=None,
         start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False,
         params={"accounts": Param(100, type="integer", minimum=1),
                 "trades_per_account": Param(30, type="integer", minimum=2)},
         tags=["airflow-broker", "demo"], doc_md=__doc__)
    def broker_trading_demo() -> None:
        @task
        def setup() -> float:
            with BrokerHook(CONN_ID) as hook:
                dsn = hook.get_conn_info().dsn
                with hook.get_broker().pool.connection() as conn:
                    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                        sql.Identifier(SCHEMA)))
                    conn.commit()
                install(dsn, SCHEMA)
                with hook.transaction() as tx:
                    tx.create_message_type(TRADE_ENTRY, "WELL_FORMED_XML")
                    tx.create_message_type(TRADE_ACK, "WELL_FORMED_XML")
                    tx.create_message_type(SETTLEMENT)
                    tx.create_contract(CONTRACT, {TRADE_ENTRY: "INITIATOR", TRADE_ACK: "TARGET"})
                    tx.create_contract("//Trading/SettlementContract", {SETTLEMENT: "ANY"})
                    for queue in ("TraderQueue", "BrokerageQueue", "SettlementQueue",
                                  "AirflowBrokerAlertQueue"):
                        tx.create_queue(queue, schema=SCHEMA)
                    tx.create_service(TRADER_SERVICE, "TraderQueue")
                    tx.create_service(BROKERAGE_SERVICE, "BrokerageQueue", [CONTRACT])
                    tx.create_service("//Trading/SettlementService", "SettlementQueue",
                                      ["//Trading/SettlementContract"])
                    tx.create_service(
                        "//airflow-broker/QueueDisabledAlerts", "AirflowBrokerAlertQueue",
                        ["http://schemas.microsoft.com/SQL/Notifications/PostEventNotification"])
                    tx.create_event_notification(
                        "airflow_broker_queue_disabled", "SettlementQueue",
                        ["BROKER_QUEUE_DISABLED"], "//airflow-broker/QueueDisabledAlerts")
                    tx.conn.execute(sql.SQL(
                        "CREATE TABLE {}.booked_trades (trade_id integer PRIMARY KEY,"
                        " account text NOT NULL, sequence bigint NOT NULL, symbol text,"
                        " quantity integer NOT NULL, pid integer,"
                        " booked_at timestamptz NOT NULL DEFAULT clock_timestamp())").format(
                            sql.Identifier(SCHEMA)))
            say(f"schema {SCHEMA}: the trading application, a settlement queue watched for "
                "BROKER_QUEUE_DISABLED, and a table for booked trades")
            return time.time()

        @task
        def send_trades() -> dict[str, int]:
            params = get_current_context()["params"]
            accounts, per_account = int(params["accounts"]), int(params["trades_per_account"])
            rng = random.Random(7)
            desks = [uuid.uuid4() for _ in range(max(1, accounts // 10))]
            sent = invalid = 0
            with BrokerHook(CONN_ID) as hook, hook.transaction() as tx:
                for account in range(accounts):
                    handle = tx.begin_dialog(TRADER_SERVICE, BROKERAGE_SERVICE, CONTRACT,
                                             related_conversation_group=desks[account % len(desks)],
                                             lifetime=3600)
                    bodies = []
                    for i in range(per_account):
                        trade_id = account * per_account + i
                        # About one in a hundred, and always the second trade of account 0.
                        bad = ((account, i) == (0, 1) or rng.random() < 0.01) \
                            and i < per_account - 1
                        invalid += bad
                        final = ' final="yes"' if i == per_account - 1 else ""
                        bodies.append(
                            f'<trade id="{trade_id}" account="ACC-{account:04d}"{final}>'
                            f"<symbol>{rng.choice(SYMBOLS)}</symbol>"
                            f"<quantity>{-5 if bad else rng.randint(1, 500)}</quantity></trade>")
                    tx.send_many(handle, TRADE_ENTRY, bodies)
                    sent += len(bodies)
            say(f"trader: {sent} trade entries on {accounts} dialogs in {len(desks)} desk "
                f"groups ({invalid} of them invalid)")
            return {"sent": sent, "invalid": invalid, "accounts": accounts}

        readers = ActivatedReaderOperator(
            task_id="brokerage_readers", broker_conn_id=CONN_ID, queue_name="BrokerageQueue",
            handler="airflow_broker.demos.trading:book_trade", readers=2, batch_size=50,
            idle_exit=2, poison_strategy="quarantine", conn_id="spark_local")

        @task
        def trader_acknowledgements() -> dict[str, int]:
            acknowledged = ended = 0
            with BrokerHook(CONN_ID) as hook:
                while True:
                    with hook.transaction() as tx:
                        replies = tx.receive("TraderQueue", 500, waitfor=True, timeout=1)
                        for reply in replies:
                            if reply.is_end_dialog or reply.is_error:
                                tx.end_conversation(reply.conversation_handle)
                                ended += 1
                            else:
                                acknowledged += 1
                    if not replies:
                        break
            say(f"trader: {acknowledged} acknowledgements; {ended} dialogs ended by the "
                "brokerage first, then by the trader")
            return {"acknowledged": acknowledged, "ended": ended}

        @task
        def poison_settlement() -> int:
            rollbacks = 0
            with BrokerHook(CONN_ID) as hook:
                with hook.transaction() as tx:
                    handle = tx.begin_dialog("//Trading/SettlementService",
                                             "//Trading/SettlementService",
                                             "//Trading/SettlementContract")
                    tx.send(handle, SETTLEMENT, "settle trade 17 against a closed account")
                for _ in range(5):
                    try:
                        with hook.transaction() as tx:
                            tx.receive("SettlementQueue")
                            raise RuntimeError("the settlement system rejects this message")
                    except RuntimeError:
                        rollbacks += 1
            say(f"settlement: the same message failed {rollbacks} times in a row")
            return rollbacks

        alert = QueueDisabledSensor(task_id="settlement_alert", broker_conn_id=CONN_ID,
                                    queue_names=["SettlementQueue"], timeout=120)

        @task
        def report_alert(event: dict[str, Any]) -> dict[str, Any]:
            say(f"ALERT: queue {event['queue_name']} was disabled ({event['reason']}) at "
                f"{event['disabled_at']}: {event.get('reason_text')}")
            return event

        @task
        def reclaim() -> int:
            with BrokerHook(CONN_ID) as hook:
                broker = hook.get_broker()
                broker.advance_clock(dt.timedelta(minutes=31))
                reclaimed = BrokerWorker(broker, activation=False).run_once().endpoints_reclaimed
            say(f"moved the broker clock 31 minutes on: {reclaimed} closed brokerage endpoints "
                "reclaimed")
            return reclaimed

        @task
        def summary(started: float, trades: dict[str, int], reading: dict[str, Any],
                    acks: dict[str, int], alert_event: dict[str, Any], reclaimed: int) -> None:
            with BrokerHook(CONN_ID) as hook, hook.transaction() as tx:
                booked = _count(tx, "SELECT count(*) FROM {s}.booked_trades")
                quarantined = _count(tx, "SELECT count(*) FROM {s}.quarantined_messages"
                                         " WHERE status = 'quarantined'")
                out_of_order = _count(tx, """
                    SELECT count(*) FROM (SELECT sequence, lag(sequence) OVER
                        (PARTITION BY account ORDER BY booked_at, sequence) AS previous
                      FROM {s}.booked_trades) x WHERE sequence <= previous""")
                # The trading dialogs' endpoints (not the settlement or notification ones).
                endpoints = _count(tx, "SELECT count(*) FROM {s}.conversation_endpoints e"
                                       " JOIN {s}.services v USING (service_id)"
                                       " WHERE v.name LIKE '//Trading/Tra%%'"
                                       " OR v.name LIKE '//Trading/Broker%%'")
            result = {
                "sent": trades["sent"], "processed": reading["processed"], "booked": booked,
                "acknowledged": acks["acknowledged"], "quarantined": quarantined,
                "in_order": out_of_order == 0, "alerts": 1 if alert_event else 0,
                "endpoints_left": endpoints, "reclaimed": reclaimed,
                "seconds": round(time.time() - started, 1),
            }
            lines = [
                "",
                "Summary",
                f"  trades sent ................ {result['sent']}",
                f"  processed by 2 Spark readers {reading['processed']} "
                f"(per reader: {[r['processed'] for r in reading['per_reader']]})",
                f"  booked, in sequence order .. {booked} "
                f"({'yes' if result['in_order'] else 'NO'})",
                f"  acknowledged ............... {result['acknowledged']}",
                f"  quarantined ................ {quarantined} (SELECT * FROM "
                f"{SCHEMA}.quarantined_messages, or airflow-broker quarantine list "
                f"--schema {SCHEMA})",
                f"  alerts ..................... {result['alerts']} "
                f"(queue {alert_event.get('queue_name')} disabled by poison detection)",
                f"  endpoints reclaimed / left . {reclaimed} / {endpoints}",
                f"  time ....................... {result['seconds']} s",
            ]
            for line in lines:
                say(line)
            say(f"DEMO_RESULT {json.dumps(result)}")

        started = setup()
        trades = send_trades()
        acks = trader_acknowledgements()
        poisoned = poison_settlement()
        event = report_alert(alert.output)  # type: ignore[arg-type]
        swept = reclaim()
        chain(started, trades, readers, acks, poisoned, alert, event, swept)
        summary(started, trades, readers.output, acks, event, swept)  # type: ignore[arg-type]

    return broker_trading_demo()
