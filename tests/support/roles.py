"""Roles for tests that run as an application would: created with the grants a test names,
and dropped afterwards (roles belong to the server and outlive a test's database)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql

# What an application of the broker's tests holds today: every table and sequence of the
# schema (docs/security.md: the schema is the trust boundary).
APPLICATION_GRANTS = (
    "GRANT USAGE ON SCHEMA broker TO {}",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA broker TO {}",
    "GRANT USAGE, UPDATE ON ALL SEQUENCES IN SCHEMA broker TO {}",
)


@contextmanager
def role(dsn: str, *statements: str, prefix: str = "app", login: bool = False) -> Iterator[str]:
    """A new role, given ``statements`` (SQL with ``{}`` where the role's name goes)."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        create = "CREATE ROLE {} LOGIN" if login else "CREATE ROLE {}"
        for statement in (create, *statements):
            conn.execute(sql.SQL(statement).format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))
