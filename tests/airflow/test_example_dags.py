"""The example DAGs of dags/ through dag.test(): the stock-trade initiator against a brokerage
played by this test, the order client against an order service played by this test, and the
maintenance DAG (worker pass, doctor, leak report, inbox purge)."""

from __future__ import annotations

import datetime as dt
import json
import threading
from typing import Any

import psycopg

from airflow_broker import Broker
from tests.airflow.conftest import Background, RunDag, task_states, wait_for, waiters, xcom
from tests.airflow.helpers import stock_trade_spec
from tests.airflow.provider import BrokerHook, apply_spec

TRADE_ACK = "//Trading/TradeAcknowledgement"


def brokerage(broker: Broker, dsn: str, stop: threading.Event) -> None:
    """The target side: once the trader waits for it, it acknowledges every trade entry and
    then ends the conversation (the target ends first)."""
    wait_for(lambda: waiters(dsn, "TraderQueue") > 0 or stop.is_set(), "the trader's sensor")
    acknowledged = 0
    while acknowledged < 3 and not stop.is_set():
        with broker.transaction() as tx:
            for message in tx.receive("BrokerageQueue", waitfor=True, timeout=0.5):
                trade = message.xml()
                assert trade is not None
                tx.send(message.conversation_handle, TRADE_ACK,
                        f'<ack trade="{trade.get("id")}"/>')
                acknowledged += 1
                if acknowledged == 3:
                    tx.end_conversation(message.conversation_handle)


def test_stock_trade_initiator(run_dag: RunDag, broker_conn: str) -> None:
    broker = Broker(broker_conn, poll_interval=0.2)
    with broker.transaction() as tx:
        apply_spec(tx, stock_trade_spec())
    stop = threading.Event()
    target = Background(lambda: brokerage(broker, broker_conn, stop))
    target.start()
    try:
        dag_run = run_dag("broker_stock_trade")
    finally:
        stop.set()
        target.join()
        broker.close()
    states = task_states(dag_run)
    assert set(states.values()) == {"success"}, states
    assert xcom(dag_run, "setup")["created"] == []  # the test created them; setup is idempotent
    replies = xcom(dag_run, "receive_acknowledgements")
    assert [m["body"] for m in replies[:3]] == [f'<ack trade="{n}"/>' for n in (1, 2, 3)]
    assert replies[-1]["message_type_name"].endswith("/EndDialog")
    with psycopg.connect(broker_conn) as conn:
        endpoints = conn.execute(
            "SELECT is_initiator, state FROM broker.conversation_endpoints").fetchall()
        leaks = conn.execute("SELECT count(*) FROM broker.leaked_endpoints").fetchone()
    # The initiator is gone; the target waits, CLOSED, for reclaim; nothing leaked.
    assert endpoints == [(False, "CD")]
    assert leaks == (0,)


def test_maintenance(run_dag: RunDag, broker_conn: str) -> None:
    broker = Broker(broker_conn)
    try:
        with broker.transaction() as tx:
            apply_spec(tx, stock_trade_spec())
            # A fire-and-forget dialog leaks its target endpoint.
            handle = tx.begin_dialog("//Trading/TraderService", "//Trading/BrokerageService",
                                     "//Trading/TradeContract")
            tx.send(handle, "//Trading/TradeEntry", "<trade id='9'/>")
            tx.end_conversation(handle)
        with broker.transaction() as tx:
            for message in tx.receive("BrokerageQueue"):
                if message.is_end_dialog:
                    tx.end_conversation(message.conversation_handle)
        with broker.transaction() as tx:
            handle = tx.begin_dialog("//Trading/TraderService", "//Trading/BrokerageService",
                                     "//Trading/TradeContract")
            tx.send(handle, "//Trading/TradeEntry", "<trade id='10'/>")
            # A dialog with a due timer.
            timed = tx.begin_dialog("//Trading/TraderService", "//Trading/BrokerageService",
                                    "//Trading/TradeContract")
            tx.begin_conversation_timer(timed, 1)
        broker.advance_clock(dt.timedelta(seconds=5))
    finally:
        broker.close()
    finished = run_dag("broker_enable_queue", run_conf={"queue_name": "TraderQueue"})
    with BrokerHook() as hook:
        held = hook.claim(f"task:broker_enable_queue/{finished.run_id}/enable_queue/-1",
                          "BrokerageQueue", dag_id="broker_enable_queue",
                          run_id=finished.run_id)
    assert [m["body"] for m in held] == ["<trade id='10'/>"]

    dag_run = run_dag("broker_maintenance")
    states = task_states(dag_run)
    assert set(states.values()) == {"success"}, states
    passed: dict[str, Any] = xcom(dag_run, "worker_pass")
    assert passed["timers_fired"] == 1
    leaks = xcom(dag_run, "leak_report")
    assert [(r["service_name"], r["leaked"]) for r in leaks] == [
        ("//Trading/BrokerageService", 1)]
    report = xcom(dag_run, "doctor")
    assert not report["healthy"]  # the leak is a warning; no error fails the task
    assert [f["check"] for f in report["findings"] if f["severity"] == "warning"] == [
        "endpoint leaks"]
    inbox = xcom(dag_run, "inbox_report")
    assert inbox == {"purged": 1, "held": []}  # the DAG run that held them has succeeded
    with psycopg.connect(broker_conn) as conn:
        timer = conn.execute("SELECT count(*) FROM \"TraderQueue\" WHERE message_type_name ="
                             " 'http://schemas.microsoft.com/SQL/ServiceBroker/DialogTimer'"
                             ).fetchone()
    assert timer == (1,)


def order_service(broker: Broker, dsn: str, stop: threading.Event) -> None:
    """The order service, played by the test: confirms the order and ends the conversation."""
    wait_for(lambda: waiters(dsn, "ShopClientQueue") > 0 or stop.is_set(), "the client's sensor")
    while not stop.is_set():
        with broker.transaction() as tx:
            for message in tx.receive("OrderQueue", waitfor=True, timeout=0.5):
                order = message.json()
                tx.send(message.conversation_handle, "//Shop/OrderConfirmation",
                        json.dumps({"order_id": order["order_id"], "status": "accepted"}))
                tx.end_conversation(message.conversation_handle)
                return


def test_order_client(run_dag: RunDag, broker_conn: str) -> None:
    setup = run_dag("broker_orders_setup")
    assert task_states(setup) == {"setup": "success"}
    broker = Broker(broker_conn, poll_interval=0.2)
    stop = threading.Event()
    service = Background(lambda: order_service(broker, broker_conn, stop))
    service.start()
    try:
        dag_run = run_dag("broker_orders_client", run_conf={"order_id": "B-7", "item": "gear"})
    finally:
        stop.set()
        service.join()
        broker.close()
    assert set(task_states(dag_run).values()) == {"success"}
    replies = xcom(dag_run, "receive_confirmation")
    assert json.loads(replies[0]["body"]) == {"order_id": "B-7", "status": "accepted"}
    assert replies[-1]["message_type_name"].endswith("/EndDialog")
    with psycopg.connect(broker_conn) as conn:
        endpoints = conn.execute(
            "SELECT is_initiator, state FROM broker.conversation_endpoints").fetchall()
    assert endpoints == [(False, "CD")]  # the client ended last; no leak
