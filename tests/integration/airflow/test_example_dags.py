"""The example DAGs of dags/ through dag.test(): the stock-trade trader against the shipped
brokerage DAG, the Spark readers' setup and its activation, the Spark readers themselves (slow),
the order client against an order service played by this test, the maintenance DAG (worker
pass, doctor, leak report, inbox purge), and every example closing the hooks it opens."""

from __future__ import annotations

import ast
import datetime as dt
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from airflow_broker import Broker
from airflow_broker.events import EventInstance
from airflow_broker.worker import BrokerWorker
from tests.fixtures.airflow import (
    DAGS_FOLDER,
    ROOT,
    Background,
    RunDag,
    task_states,
    wait_for,
    waiters,
    xcom,
)
from tests.support.airflow_helpers import example_module, stock_trade_spec
from tests.support.airflow_provider import BrokerHook, apply_spec

RUN_TRADER = f"""
import sys
from airflow.dag_processing.dagbag import DagBag

dag = DagBag({str(DAGS_FOLDER / "broker_stock_trade.py")!r}).get_dag("broker_stock_trade")
sys.exit(0 if str(dag.test().state) == "success" else 1)
"""


def test_stock_trade_completes_with_the_shipped_brokerage(
        run_dag: RunDag, broker_conn: str, scratch: Path) -> None:
    """Both sides of the example and nothing else: the trader runs in a process of its own
    (dag.test() runs one DAG at a time) and waits, deferred, for the brokerage DAG."""
    log_path = scratch / "trader.log"
    with log_path.open("w") as log:
        trader = subprocess.Popen([sys.executable, "-c", RUN_TRADER], stdout=log,
                                  stderr=subprocess.STDOUT, env=os.environ.copy())
    try:
        # Once the trader waits for the brokerage, all its trades are on BrokerageQueue.
        wait_for(lambda: waiters(broker_conn, "TraderQueue") > 0, "the trader's sensor",
                 alive=lambda: trader.poll() is None)
        brokerage_run = run_dag("broker_stock_trade_brokerage")
        assert trader.wait(timeout=120) == 0, log_path.read_text()[-4000:]
    finally:
        if trader.poll() is None:
            trader.kill()
            trader.wait()
    assert set(task_states(brokerage_run).values()) == {"success"}, task_states(brokerage_run)
    assert xcom(brokerage_run, "setup")["created"] == []  # the trader's setup made them
    received = xcom(brokerage_run, "acknowledge_trades")
    assert [m["message_type_name"] for m in received] == ["//Trading/TradeEntry"] * 3

    trader_run = latest_run("broker_stock_trade")
    assert set(task_states(trader_run).values()) == {"success"}, task_states(trader_run)
    replies = xcom(trader_run, "receive_acknowledgements")
    assert [m["body"] for m in replies[:3]] == [
        f'<ack trade="{n}" status="booked"/>' for n in (1, 2, 3)]
    assert replies[-1]["message_type_name"].endswith("/EndDialog")
    with psycopg.connect(broker_conn) as conn:
        endpoints = conn.execute(
            "SELECT is_initiator, state FROM broker.conversation_endpoints").fetchall()
        leaks = conn.execute("SELECT count(*) FROM broker.leaked_endpoints").fetchone()
    # The initiator is gone; the target waits, CLOSED, for reclaim; nothing leaked.
    assert endpoints == [(False, "CD")]
    assert leaks == (0,)


def latest_run(dag_id: str) -> Any:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        runs = DagRun.find(dag_id=dag_id, session=session)
        assert runs, f"no run of {dag_id}"
        run = max(runs, key=lambda r: r.id)
        session.expunge(run)
        return run


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
    # The server's release is the server check's own test (test_doctor.py).
    assert [f["check"] for f in report["findings"]
            if f["severity"] == "warning" and f["check"] != "server"] == ["endpoint leaks"]
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


def send_trades(broker: Broker) -> None:
    """A trader's dialog, as broker_stock_trade sends it."""
    trades = example_trades()
    with broker.transaction() as tx:
        handle = tx.begin_dialog("//Trading/TraderService", "//Trading/BrokerageService",
                                 "//Trading/TradeContract", lifetime=3600)
        tx.send_many(handle, "//Trading/TradeEntry", trades)


def example_trades() -> list[str]:
    trades: list[str] = example_module("broker_stock_trade").TRADES
    return trades


def activation_pass(broker: Broker) -> None:
    """One pass of `airflow-broker worker`, whose queue monitors send QUEUE_ACTIVATION."""
    worker = BrokerWorker(broker, transport=False)
    try:
        worker.run_once()
    finally:
        assert worker.activation is not None
        worker.activation.close()


def test_spark_readers_setup_makes_trades_activate_the_readers(
        run_dag: RunDag, broker_conn: str) -> None:
    setup = run_dag("broker_spark_readers_setup")
    assert task_states(setup) == {"setup": "success"}
    assert "event notification activate_brokerage_readers on BrokerageQueue" in xcom(
        setup, "setup")["created"]
    with Broker(broker_conn) as broker:
        activation_pass(broker)
        with broker.transaction() as tx:
            assert tx.receive("BrokerageActivationQueue") == []  # nothing to read yet
        send_trades(broker)
        activation_pass(broker)
        with broker.transaction() as tx:
            notifications = tx.receive("BrokerageActivationQueue")
    # What the broker_spark_readers DAG's AssetWatcher turns into a DAG run.
    events = [EventInstance.from_message(m) for m in notifications]
    assert [(e.event_type, e.object_name) for e in events] == [
        ("QUEUE_ACTIVATION", "BrokerageQueue")]


@pytest.mark.slow
def test_spark_readers_are_the_brokerage(run_dag: RunDag, broker_conn: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT",
                       json.dumps({"conn_type": "spark", "host": "local[2]"}))
    assert task_states(run_dag("broker_spark_readers_setup")) == {"setup": "success"}
    with Broker(broker_conn) as broker:
        send_trades(broker)
    dag_run = run_dag("broker_spark_readers")
    assert set(task_states(dag_run).values()) == {"success"}, task_states(dag_run)
    summary = xcom(dag_run, "brokerage_readers")
    assert (summary["processed"], summary["replied"], summary["ended"],
            summary["quarantined"]) == (3, 3, 1, 0)
    with Broker(broker_conn) as broker, broker.transaction() as tx:
        replies = tx.receive("TraderQueue")
    assert [m.text() for m in replies[:3]] == [
        f'<ack trade="{n}" status="booked"/>' for n in (1, 2, 3)]
    assert replies[-1].is_end_dialog


# Where the examples open hooks: the DAG files and the demo's modules.
EXAMPLE_SOURCES = [*sorted((ROOT / "dags").glob("*.py")),
                   *sorted((ROOT / "airflow_broker" / "demos").glob("*.py"))]


@pytest.mark.parametrize("path", EXAMPLE_SOURCES, ids=lambda p: p.name)
def test_examples_close_their_hooks(path: Path) -> None:
    """A hook that is never closed leaves its connection pool to the garbage collector, which
    logs "Exception ignored in: ConnectionPool.__del__" into the task's log; users copy the
    examples, so each one opens its hooks in a with statement."""
    tree = ast.parse(path.read_text(), str(path))
    managed = {id(item.context_expr) for node in ast.walk(tree)
               if isinstance(node, ast.With | ast.AsyncWith) for item in node.items}
    unclosed = [node.lineno for node in ast.walk(tree)
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("BrokerHook", "Broker") and id(node) not in managed]
    assert unclosed == [], f"{path.name}: hooks opened outside a with statement at {unclosed}"
