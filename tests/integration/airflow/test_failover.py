"""The provider's long-lived connections through a failover: the tests of
test_database_faults.py, with the primary killed and its synchronous standby promoted as the
fault, and the broker connection naming both servers the way docs/airflow.md shows for servers
on different ports (a ``pg_service.conf`` service in the ``service`` extra)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.fixtures.airflow import BROKER_CONN_ENV
from tests.integration.airflow.test_database_faults import (
    test_a_deferred_wait_survives_a_database_fault,
    test_the_inbox_of_a_running_task_survives_a_database_fault,
    test_the_stream_and_its_acknowledgements_survive_a_database_fault,
)
from tests.support.standby_pair import StandbyPair

__all__ = [
    "test_a_deferred_wait_survives_a_database_fault",
    "test_the_inbox_of_a_running_task_survives_a_database_fault",
    "test_the_stream_and_its_acknowledgements_survive_a_database_fault",
]

SERVICE = "broker_failover"


@pytest.fixture
def dsn(standby_pair: StandbyPair) -> str:
    return standby_pair.dsn


@pytest.fixture
def database_fault(standby_pair: StandbyPair) -> Callable[[], None]:
    return standby_pair.fail_over


@pytest.fixture
def broker_conn(standby_pair: StandbyPair, monkeypatch: pytest.MonkeyPatch) -> str:
    """``broker_default`` as a connection whose only field is the ``service`` extra."""
    params = conninfo_to_dict(standby_pair.dsn)
    service_file = standby_pair.root / "pg_service.conf"
    service_file.write_text(f"[{SERVICE}]\n" + "".join(
        f"{key}={value}\n" for key, value in params.items()))
    monkeypatch.setenv("PGSERVICEFILE", str(service_file))
    monkeypatch.setenv(BROKER_CONN_ENV, json.dumps(
        {"conn_type": "broker", "extra": {"service": SERVICE}}))
    return standby_pair.dsn
