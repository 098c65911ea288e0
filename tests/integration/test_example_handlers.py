"""The reader handlers and activation procedures that the example DAGs, the demo and the tests
name (``package.module:function``) import where Airflow cannot be imported, as in the Spark
workers and activated readers that Airflow 3's task supervisor starts; and the stock-trade
brokerage that the Spark readers example runs does its job."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from psycopg import sql

from airflow_broker import Broker
from airflow_broker._statements import runner_of
from airflow_broker.demos.trading import (
    BROKERAGE_SERVICE,
    CONTRACT,
    TRADE_ACK,
    TRADE_ENTRY,
    TRADER_SERVICE,
)
from airflow_broker.readers.queue_reader import QueueReader, ReaderConfig

THIS_FILE = Path(__file__).resolve()
ROOT = THIS_FILE.parents[2]
# Where handler names are written: example DAGs, the demo and the rest of the package, tests.
SEARCHED = ("dags", "airflow_broker", "tests")
# Names of the Airflow side, which only Airflow's processes resolve (airflow:// routes).
AIRFLOW_SIDE = ("airflow_broker.hooks.", "airflow_broker.operators.", "airflow_broker.sensors.")
HANDLER_NAME = re.compile(r"(?:airflow_broker|tests)(?:\.\w+)+:\w+(?:\.\w+)*")

# The supervisor's environment for a task's child processes, and an import system that refuses
# Airflow outright: whichever way Airflow fails there, the handler module must not reach it.
LOAD_WITHOUT_AIRFLOW = """
import sys

class RefuseAirflow:
    def find_spec(self, name, path=None, target=None):
        if name == "airflow" or name.startswith("airflow."):
            raise ImportError(f"{name} is imported, and Airflow is unusable in this process")
        return None

sys.meta_path.insert(0, RefuseAirflow())
from airflow_broker.callables import load_callable

for name in sys.argv[1:]:
    load_callable(name)
"""


def handler_names() -> dict[str, list[str]]:
    """Every ``module:function`` string of the searched sources, by module."""
    found: dict[str, set[str]] = {}
    for folder in SEARCHED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == THIS_FILE:  # it names an Airflow module on purpose, below
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                        and HANDLER_NAME.fullmatch(node.value)):
                    module = node.value.partition(":")[0]
                    if module.startswith(AIRFLOW_SIDE):
                        continue
                    found.setdefault(module, set()).add(node.value)
    return {module: sorted(names) for module, names in sorted(found.items())}


HANDLERS = handler_names()


def load_without_airflow(*names: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "airflow-db-not-allowed:///"}
    return subprocess.run([sys.executable, "-c", LOAD_WITHOUT_AIRFLOW, *names], cwd=ROOT,
                          env=env, capture_output=True, text=True, check=False)


def test_the_search_finds_the_handlers_in_use() -> None:
    names = {name for module in HANDLERS.values() for name in module}
    # The Spark readers example, the demo, and the tests' reader and activation targets.
    assert {"airflow_broker.demos.trading:acknowledge_trade",
            "airflow_broker.demos.trading:book_trade", "tests.support.reader_handlers:book_trade",
            "tests.support.activation_readers:drain"} <= names


def test_a_module_that_imports_airflow_is_refused() -> None:
    """The check can fail: a module that imports Airflow does not load."""
    done = load_without_airflow("airflow_broker.hooks.broker:BrokerHook")
    assert done.returncode != 0
    assert "Airflow is unusable in this process" in done.stderr


@pytest.mark.parametrize("module", sorted(HANDLERS))
def test_handler_module_imports_without_airflow(module: str) -> None:
    done = load_without_airflow(*HANDLERS[module])
    assert done.returncode == 0, done.stderr[-3000:]


def test_brokerage_handler_acknowledges_and_ends_first(broker: Broker) -> None:
    """The Spark readers example's handler, run by a queue reader as each Spark task runs it:
    every trade acknowledged, the conversation ended by the brokerage after the final one, and
    the trader left to end its side."""
    with broker.transaction() as tx:
        tx.create_message_type(TRADE_ENTRY, "WELL_FORMED_XML")
        tx.create_message_type(TRADE_ACK, "WELL_FORMED_XML")
        tx.create_contract(CONTRACT, {TRADE_ENTRY: "INITIATOR", TRADE_ACK: "TARGET"})
        tx.create_queue("TraderQueue")
        tx.create_queue("BrokerageQueue")
        tx.create_service(TRADER_SERVICE, "TraderQueue")
        tx.create_service(BROKERAGE_SERVICE, "BrokerageQueue", [CONTRACT])
        handle = tx.begin_dialog(TRADER_SERVICE, BROKERAGE_SERVICE, CONTRACT)
        tx.send_many(handle, TRADE_ENTRY, ['<trade id="1"/>', '<trade id="2"/>',
                                           '<trade id="3" final="yes"/>'])
    config = ReaderConfig(queue_name="BrokerageQueue",
                          handler="airflow_broker.demos.trading:acknowledge_trade", idle_exit=0.5,
                          waitfor_timeout=0.2)
    stats = QueueReader(broker, config).run()
    assert (stats.processed, stats.replied, stats.ended, stats.quarantined) == (3, 3, 1, 0)
    with broker.transaction() as tx:
        replies = tx.receive("TraderQueue")
        assert [m.text() for m in replies[:3]] == [
            f'<ack trade="{n}" status="booked"/>' for n in (1, 2, 3)]
        assert [m.is_end_dialog for m in replies] == [False, False, False, True]
        tx.end_conversation(handle)
    with broker.transaction() as tx:
        rows = runner_of(tx).run(
            sql.SQL("SELECT is_initiator, state FROM broker.conversation_endpoints"))
    assert rows == [(False, "CD")]  # nothing left open on either side
