"""Event-driven scheduling end to end, under ``airflow standalone`` (API server, scheduler,
DAG processor and triggerer, LocalExecutor): orders sent to OrderQueue start exactly one DAG
run each, and each run's task gets its message as the asset event's payload.

The watcher is the example DAG's MessageQueueTrigger(scheme="broker", ...) with
one_run_per_message; the trigger runs in the real triggerer, in Airflow 3.3's shared-stream
ack mode.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from airflow_broker import Broker
from tests.airflow.conftest import ROOT, connection_json, wait_for, waiters
from tests.airflow.helpers import free_port, orders_spec
from tests.airflow.provider import apply_spec

DAG_FILE = ROOT / "dags" / "broker_event_driven.py"
ORDERS = ["A-1", "A-2", "A-3"]


class Standalone:
    def __init__(self, home: Path, dsn: str) -> None:
        self.home = home
        self.dags = home / "dags"
        self.dags.mkdir(parents=True)
        shutil.copy(DAG_FILE, self.dags / DAG_FILE.name)
        port = free_port()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        self.env.update({
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://localhost:{port}/execution/",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW_CONN_BROKER_DEFAULT": connection_json(dsn),
            # standalone starts each component as `airflow ...` from PATH.
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        })
        self.log_path = home / "standalone.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [str(Path(sys.executable).parent / "airflow"), "standalone"], env=self.env,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            # standalone and its components share the session started for them.
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        db = self.home / "airflow.db"
        if not db.exists():
            return []
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as conn:
            try:
                return conn.execute(sql, params).fetchall()
            except sqlite3.OperationalError:
                return []  # tables not created yet


@pytest.fixture
def standalone(scratch: Path, broker_conn: str) -> Iterator[Standalone]:
    airflow = Standalone(scratch / "airflow", broker_conn)
    try:
        yield airflow
    finally:
        airflow.stop()


def confirmations(dsn: str) -> list[dict[str, Any]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT convert_from(message_body, 'UTF8') FROM \"ShopClientQueue\""
            " WHERE message_type_name = '//Shop/OrderConfirmation' ORDER BY queuing_order"
        ).fetchall()
    return [json.loads(body) for (body,) in rows]


def test_one_dag_run_per_message(standalone: Standalone, broker_conn: str) -> None:
    with Broker(broker_conn) as broker, broker.transaction() as tx:
        apply_spec(tx, orders_spec())
    standalone.start()
    # The watcher's trigger runs in the triggerer once its DAG is parsed: it registers as a
    # WAITFOR waiter on the queue.
    wait_for(lambda: waiters(broker_conn, "OrderQueue") > 0, "the asset watcher's trigger",
             alive=standalone.alive)

    # All orders at once, in one transaction: without pacing they would share DAG runs.
    with Broker(broker_conn) as broker, broker.transaction() as tx:
        for order_id in ORDERS:
            handle = tx.begin_dialog("//Shop/ClientService", "//Shop/OrderService",
                                     "//Shop/OrderContract")
            tx.send(handle, "//Shop/Order", json.dumps({"order_id": order_id, "item": "x"}))

    wait_for(lambda: len(confirmations(broker_conn)) == len(ORDERS), "three confirmations",
             alive=standalone.alive)

    def finished_runs() -> list[tuple[Any, ...]]:
        return standalone.query(
            "SELECT id, run_id, state FROM dag_run WHERE dag_id = 'broker_orders'"
            " AND state IN ('success', 'failed') ORDER BY id")

    wait_for(lambda: len(finished_runs()) == len(ORDERS), "three finished DAG runs",
             alive=standalone.alive)
    runs = finished_runs()
    assert [state for _, _, state in runs] == ["success"] * 3, standalone.log_tail()
    assert all(run_id.startswith("asset_triggered__") for _, run_id, _ in runs)

    # Exactly one asset event per run, each carrying one message as its payload.
    consumed = standalone.query(
        "SELECT r.dag_run_id, e.extra FROM dagrun_asset_event r"
        " JOIN asset_event e ON e.id = r.event_id ORDER BY r.dag_run_id")
    assert sorted(run for run, _ in consumed) == sorted(run for run, _, _ in runs)
    payloads = [json.loads(extra)["payload"] for _, extra in consumed]
    assert sorted(json.loads(p["body"])["order_id"] for p in payloads) == ORDERS

    # Every order was confirmed once, each by a different DAG run, from the payload.
    confirmed = confirmations(broker_conn)
    assert sorted(c["order_id"] for c in confirmed) == ORDERS
    assert sorted(c["run_id"] for c in confirmed) == sorted(r for _, r, _ in runs)

    with psycopg.connect(broker_conn) as conn:
        inbox = conn.execute("SELECT count(*) FROM broker.airflow_inbox"
                             " WHERE state <> 'consumed'").fetchone()
        queued = conn.execute("SELECT count(*) FROM \"OrderQueue\"").fetchone()
    assert inbox == (0,) and queued == (0,)
