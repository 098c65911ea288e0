"""Routes through Airflow: the setup spec's routes section, and a route whose address is an
Airflow connection id (airflow://conn_id), resolved through Airflow's connections."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_broker.worker.transport import Transport
from tests.fixtures.airflow import connection_json
from tests.support.airflow_provider import apply_spec
from tests.support.brokers import Pair, receive_all


def test_setup_spec_creates_and_alters_routes(pair: Pair) -> None:
    spec = {"routes": [{"name": "to_T", "service_name": "T", "address": pair.b_uri}]}
    with pair.a.transaction() as tx:
        assert apply_spec(tx, spec).created == ["route to_T"]
    with pair.a.transaction() as tx:
        assert apply_spec(tx, spec).unchanged == ["route to_T"]
    spec["routes"][0]["address"] = "airflow://brokerage"
    with pair.a.transaction() as tx:
        assert apply_spec(tx, spec).altered == ["route to_T"]
    with pytest.raises(ValueError, match="needs an address"), pair.a.transaction() as tx:
        apply_spec(tx, {"routes": [{"name": "to_T", "service_name": "T"}]})


def test_route_to_an_airflow_connection(pair: Pair, far_dsn: str,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_BROKERAGE_DB", connection_json(far_dsn))
    with pair.a.transaction() as tx:
        tx.create_route("to_T", "airflow://brokerage_db", service_name="T")
    pair.routes(forward=False)
    with pair.a.transaction() as tx:
        h = tx.begin_dialog("I", "T", "C")
        tx.send(h, "Req", "via an Airflow connection")
    assert pair.ta.step().acknowledged == 1
    assert [m.text() for m in receive_all(pair.b, "q_t")] == ["via an Airflow connection"]


def test_route_to_a_connection_in_the_metadata_database(pair: Pair, far_dsn: str,
                                                        airflow_db: Path) -> None:
    """A connection added with ``airflow connections add`` lives only in Airflow's metadata
    database: a broker worker running as its own process (not a task) with Airflow's
    configuration resolves it and delivers. The worker runs as ``airflow-broker worker``
    does, in a process of its own, because this one read Airflow's configuration before
    ``airflow db migrate`` wrote it (and so has no Fernet key for the stored extras)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_CONN_")}
    subprocess.run([sys.executable, "-m", "airflow", "connections", "add", "broker_ui",
                    "--conn-json", connection_json(far_dsn)],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    try:
        with pair.a.transaction() as tx:
            tx.create_route("to_T", "airflow://broker_ui", service_name="T")
        pair.routes(forward=False)
        with pair.a.transaction() as tx:
            h = tx.begin_dialog("I", "T", "C")
            tx.send(h, "Req", "via the metadata database")
        worker = subprocess.run(
            [sys.executable, "-m", "airflow_broker.cli", "worker", "--dsn", pair.a.dsn, "--once"],
            env=env, capture_output=True, text=True, timeout=300)
        assert worker.returncode == 0, worker.stderr
        assert "isn't defined" not in worker.stderr
        with pair.a.transaction() as tx:
            assert tx.get_transmission_status(h) == ""
        assert [m.text() for m in receive_all(pair.b, "q_t")] == ["via the metadata database"]
    finally:
        subprocess.run([sys.executable, "-m", "airflow", "connections", "delete", "broker_ui"],
                       check=True, env=env, stdout=subprocess.DEVNULL)


def test_route_to_a_missing_airflow_connection_waits_with_the_reason(pair: Pair) -> None:
    with pair.a.transaction() as tx:
        tx.create_route("to_T", "airflow://no_such_conn", service_name="T")
        h = tx.begin_dialog("I", "T", "C")
        tx.send(h, "Req", "x")
    result = Transport(pair.a).step()
    assert result.held == 1
    with pair.a.transaction() as tx:
        status = tx.get_transmission_status(h)
    assert status.startswith("The target service broker is unreachable: airflow://no_such_conn")
