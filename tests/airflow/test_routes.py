"""Routes through Airflow: the setup spec's routes section, and a route whose address is an
Airflow connection id (airflow://conn_id), resolved through Airflow's connections."""

from __future__ import annotations

import pytest

from airflow_broker.transport import Transport
from tests.airflow.conftest import connection_json
from tests.airflow.provider import apply_spec
from tests.brokers import Pair, receive_all


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
