"""Helpers shared by the Airflow provider tests."""

from __future__ import annotations

import importlib.util
import socket
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from airflow_broker import Broker
from tests.fixtures.airflow import DAGS_FOLDER, ROOT


def example_module(name: str) -> Any:
    """An example DAG file of dags/, imported under a name of its own."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "dags" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stock_trade_spec() -> dict[str, Any]:
    """The stock-trade application's catalogue, from its example DAG."""
    result: dict[str, Any] = example_module("broker_stock_trade").SPEC
    return result


def orders_spec() -> dict[str, Any]:
    """The order application's catalogue, from the event-driven example DAG."""
    result: dict[str, Any] = example_module("broker_event_driven").SPEC
    return result


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def poison(broker: Broker, queue_name: str = "BrokerageQueue") -> None:
    """Five receiving transactions that roll back: poison-message detection disables the
    queue, as in SQL Server."""
    with broker.transaction() as tx:
        handle = tx.begin_dialog("//Trading/TraderService", "//Trading/BrokerageService",
                                 "//Trading/TradeContract")
        tx.send(handle, "//Trading/TradeEntry", "<trade id='666'><symbol>BAD</symbol></trade>")
    for _ in range(5):
        with pytest.raises(RuntimeError), broker.transaction() as tx:
            assert tx.receive(queue_name, 1)
            raise RuntimeError("the reader cannot process this trade")


DAG_HEADER = """\
from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_broker.operators import EndConversationOperator
from airflow_broker.sensors import QueueDisabledSensor, WaitForReceiveSensor

with DAG({dag_id!r}, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
         catchup=False):
"""


@contextmanager
def dag_file(dag_id: str, tasks: str) -> Iterator[None]:
    """A DAG of one test, written into the DAG folder for as long as the test runs it:
    dag.test() runs only DAGs that Airflow parsed from there. ``tasks`` is the body of its
    ``with DAG(...)`` block, which has the sensors and EndConversationOperator at hand."""
    path = DAGS_FOLDER / f"{dag_id}.py"
    path.write_text(DAG_HEADER.format(dag_id=dag_id)
                    + textwrap.indent(textwrap.dedent(tasks).strip() + "\n", "    "))
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
