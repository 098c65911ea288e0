"""The provider with its ``broker_default`` connection logged in as an application's role, as
docs/security.md's recipe for an Airflow deployment grants it: a deferred WAITFOR sensor
(its trigger's waiter registration, the inbox claim and hand-over) and a downstream task that
consumes and replies, all through the broker's checks and without a right on any table."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from airflow_broker import Broker
from tests.fixtures.airflow import (
    BROKER_CONN_ENV,
    Background,
    connection_json,
    load_dag,
    task_states,
    wait_for,
    waiters,
    xcom,
)
from tests.support import roles
from tests.support.privileges import Application

APP = Application("")


def test_a_deferred_sensor_and_its_consumer_run_as_a_reader_login(
        airflow_db: Path, owned_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with Broker(owned_dsn) as admin, admin.transaction() as tx:
        APP.create(tx)
    with roles.role(owned_dsn, *roles.APPLICATION_GRANTS, *APP.reader_grants(),
                    prefix="airflow", login=True) as login_role:
        monkeypatch.setenv(BROKER_CONN_ENV,
                           connection_json(roles.login_dsn(owned_dsn, login_role)))

        def send_once_waiting() -> None:
            wait_for(lambda: waiters(owned_dsn, "q_t") > 0, "the deferred sensor's WAITFOR")
            with Broker(owned_dsn) as sender, sender.transaction() as tx:
                handle = tx.begin_dialog("I", "T", "C")
                tx.send(handle, "Req", "one")
                tx.send(handle, "Req", "two")

        sender = Background(send_once_waiting)
        sender.start()
        dag_run = load_dag("t_wait").test()
        sender.join()
    assert task_states(dag_run) == {"ready": "success", "received": "success", "use": "success"}
    assert xcom(dag_run, "use") == ["one", "two"]
    with psycopg.connect(owned_dsn) as conn:
        inbox = conn.execute("SELECT state, count(*) FROM broker.airflow_inbox"
                             " GROUP BY state").fetchall()
        replies = conn.execute("SELECT count(*) FROM q_i").fetchone()
    assert inbox == [("consumed", 2)]
    assert replies == (2,)
