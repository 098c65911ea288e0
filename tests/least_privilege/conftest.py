"""The least-privilege tier: a broker schema owned by a dedicated owner role, as
docs/security.md installs it, and applications that log in as roles holding only the
documented grants. The superuser sets each test up; it never stands in for an application."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from airflow_broker.migrations import install
from tests.fixtures.postgres import fresh_database, per_worker

TEMPLATE = per_worker("airflow_broker_owned_template")


@pytest.fixture(scope="session")
def owner_role(server_dsn: str) -> Iterator[str]:
    """The role that owns the broker schema: no login, no right beyond its schema (and CREATE
    on public, where queue views go)."""
    name = f"broker_owner_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(name)))
    yield name
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def owned_template(server_dsn: str, owner_role: str) -> Iterator[str]:
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(TEMPLATE)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE)))
    dsn = make_conninfo(server_dsn, dbname=TEMPLATE)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(
                sql.Identifier(owner_role)))
        install(dsn, owner=owner_role)
        yield dsn
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(TEMPLATE)))


@pytest.fixture
def owned_dsn(server_dsn: str, owned_template: str) -> Iterator[str]:
    """A new database whose broker schema the owner role owns."""
    with fresh_database(server_dsn, "lp", TEMPLATE) as new:
        yield new
