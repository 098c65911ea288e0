"""Test fixtures: one PostgreSQL per test run, a fresh database per test.

With AIRFLOW_BROKER_TEST_DSN set (a role that may CREATE DATABASE), tests use that server;
otherwise an embedded PostgreSQL is started in a temporary directory. Each test gets its own
database, cloned from a template that already holds the broker schema.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from airflow_broker import Broker
from airflow_broker.embedded import EmbeddedPostgres
from airflow_broker.migrations import install
from airflow_broker.worker.transport import address_of
from tests.brokers import Pair, deploy_application

TEMPLATE = "airflow_broker_test_template"


@contextmanager
def embedded_in_temp_dir(prefix: str) -> Iterator[EmbeddedPostgres]:
    """An embedded PostgreSQL in a directory of its own, removed afterwards. Not under
    pytest's basetemp: pytest prunes old basetemp folders, also those of another test session
    still running on the same machine."""
    data_dir = tempfile.mkdtemp(prefix=prefix)
    server = EmbeddedPostgres(data_dir)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def embedded_server() -> Iterator[EmbeddedPostgres | None]:
    if os.environ.get("AIRFLOW_BROKER_TEST_DSN"):
        yield None
        return
    with embedded_in_temp_dir("airflow-broker-test-pg-") as server:
        yield server


@pytest.fixture(scope="session")
def server_dsn(embedded_server: EmbeddedPostgres | None) -> str:
    if embedded_server is None:
        return os.environ["AIRFLOW_BROKER_TEST_DSN"]
    return embedded_server.uri("postgres")


@pytest.fixture
def restart_postgres(embedded_server: EmbeddedPostgres | None, dsn: str) -> Callable[[], None]:
    """Restarts the embedded PostgreSQL; on a server given by AIRFLOW_BROKER_TEST_DSN, which
    tests may not restart, every other session of the test database is terminated instead,
    which is what a restart looks like to a client."""

    def started() -> object:
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
        return row[0] if row else None

    def restart() -> None:
        if embedded_server is not None:
            before = started()
            embedded_server.restart()
            assert started() != before, "PostgreSQL did not restart"
            return
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                         " WHERE datname = current_database() AND pid <> pg_backend_pid()")

    return restart


def _admin(server_dsn: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(server_dsn, autocommit=True)


@pytest.fixture(scope="session")
def template_dsn(server_dsn: str) -> str:
    with _admin(server_dsn) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(TEMPLATE)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE)))
    dsn = make_conninfo(server_dsn, dbname=TEMPLATE)
    install(dsn)
    return dsn


@contextmanager
def fresh_database(server_dsn: str, prefix: str, template: str | None) -> Iterator[str]:
    """A database of its own, dropped afterwards; cloned from ``template`` when given."""
    name = f"{prefix}_{uuid.uuid4().hex[:16]}"
    create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        create = sql.SQL("{} TEMPLATE {}").format(create, sql.Identifier(template))
    with _admin(server_dsn) as conn:
        conn.execute(create)
    try:
        yield make_conninfo(server_dsn, dbname=name)
    finally:
        with _admin(server_dsn) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))


@pytest.fixture
def dsn(server_dsn: str, template_dsn: str) -> Iterator[str]:
    """A new database holding a freshly installed broker schema."""
    with fresh_database(server_dsn, "t", TEMPLATE) as new:
        yield new


@pytest.fixture
def empty_dsn(server_dsn: str) -> Iterator[str]:
    """A new database without the broker schema."""
    with fresh_database(server_dsn, "e", None) as new:
        yield new


@pytest.fixture
def broker(dsn: str) -> Iterator[Broker]:
    b = Broker(dsn, poll_interval=0.2)
    try:
        yield b
    finally:
        b.close()


@dataclass(frozen=True)
class App:
    """The catalogue's standard application (spec 28): contract C = (Req SENT BY INITIATOR,
    Resp SENT BY TARGET), initiator service I on queue q_i, target service T on queue q_t."""

    broker: Broker

    def dialog(self, contract: str = "C", **kwargs: object) -> uuid.UUID:
        with self.broker.transaction() as tx:
            return tx.begin_dialog("I", "T", contract, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def app(broker: Broker) -> App:
    with broker.transaction() as tx:
        tx.create_message_type("Req")
        tx.create_message_type("Resp")
        tx.create_contract("C", {"Req": "INITIATOR", "Resp": "TARGET"})
        tx.create_queue("q_i")
        tx.create_queue("q_t")
        tx.create_service("I", "q_i")
        tx.create_service("T", "q_t", ["C", "DEFAULT"])
    return App(broker)


@pytest.fixture
def far_dsn(server_dsn: str, template_dsn: str) -> Iterator[str]:
    """A second database with the broker schema: broker B. A clone of the template keeps the
    template's broker instance, as a restored database would: NEW_BROKER gives it its own."""
    with fresh_database(server_dsn, "far", TEMPLATE) as new:
        with Broker(new) as b, b.transaction() as tx:
            tx.alter_broker("NEW_BROKER")
        yield new


@pytest.fixture
def pair(dsn: str, far_dsn: str) -> Iterator[Pair]:
    a = Broker(dsn, poll_interval=0.2)
    b = Broker(far_dsn, poll_interval=0.2)
    deploy_application(a, target=False)
    deploy_application(b, initiator=False)
    p = Pair(a, b, address_of(dsn), address_of(far_dsn))
    try:
        yield p
    finally:
        p.close()
        a.close()
        b.close()
