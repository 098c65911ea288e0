"""Roles for tests that run as an application would: created with the grants a test names,
and dropped afterwards (roles belong to the server and outlive a test's database)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

# What every application of the broker holds in PostgreSQL (docs/security.md): the broker's
# functions check the rest, which broker_grant() gives.
APPLICATION_GRANTS = ("GRANT USAGE ON SCHEMA broker TO {}",)

# What BrokerSetupOperator needs on the database to create an application's objects (the
# login then owns what it creates).
CREATE_PERMISSIONS = ("CREATE QUEUE", "CREATE SERVICE", "CREATE CONTRACT",
                      "CREATE MESSAGE TYPE")


def broker_grant(permission: str, securable: str, action: str = "grant") -> str:
    """A statement for role(): GRANT (or DENY, REVOKE) a broker permission, as
    ``GRANT SEND ON SERVICE::Ordering TO role`` does in SQL Server."""
    return (f"SELECT broker.{action}_permission('{permission}', '{securable}', {{name}})")


def give(dsn: str, name: str, *statements: str) -> None:
    """Runs ``statements`` for role ``name``: SQL with ``{}`` where the role's name goes as an
    identifier, ``{name}`` where it goes as a string."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(sql.SQL(statement).format(sql.Identifier(name), name=sql.Literal(name)))


@contextmanager
def role(dsn: str, *statements: str, prefix: str = "app", login: bool = False) -> Iterator[str]:
    """A new role, given ``statements`` (as give() takes them)."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    give(dsn, name, "CREATE ROLE {} LOGIN" if login else "CREATE ROLE {}", *statements)
    try:
        yield name
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def login_dsn(dsn: str, role_name: str) -> str:
    """``dsn`` logging in as ``role_name`` (the test server trusts local logins)."""
    return make_conninfo(dsn, user=role_name)
