"""Installs and upgrades the broker schema from the SQL files shipped in ``sql/``.

``sql/migrations/V*.sql`` are versioned: each runs once, in order, and never changes after it
is released, so upgrading an existing schema keeps its data. ``sql/functions/*.sql`` hold the
functions and views; they are re-applied (in name order) whenever their content changes.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from importlib import resources

import psycopg
from psycopg import sql

log = logging.getLogger(__name__)

_SQL = resources.files("airflow_broker") / "sql"


@dataclass(frozen=True)
class SqlFile:
    name: str
    text: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


@dataclass
class InstallReport:
    schema: str
    applied: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.applied)


def _files(folder: str) -> list[SqlFile]:
    entries = [e for e in (_SQL / folder).iterdir() if e.name.endswith(".sql")]
    entries.sort(key=lambda e: e.name)
    return [SqlFile(e.name, e.read_text(encoding="utf-8")) for e in entries]


def migrations() -> list[SqlFile]:
    return _files("migrations")


def functions() -> list[SqlFile]:
    return _files("functions")


def install(dsn: str, schema: str = "broker", *, up_to: str | None = None) -> InstallReport:
    """Creates or upgrades the broker schema; safe to run again and from several processes.

    ``up_to`` stops after the named migration (without re-applying functions): upgrade tests
    use it to start from an older schema.
    """
    report = InstallReport(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Concurrent installs of the same schema wait for each other instead of colliding.
        conn.execute("SELECT pg_advisory_lock(hashtext(%s))", [f"airflow_broker:{schema}"])
        try:
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {}.schema_migrations ("
                    " name text PRIMARY KEY, checksum text NOT NULL,"
                    " applied_at timestamptz NOT NULL DEFAULT now())"
                ).format(sql.Identifier(schema))
            )
            done: dict[str, str] = dict(
                conn.execute(
                    sql.SQL("SELECT name, checksum FROM {}.schema_migrations").format(
                        sql.Identifier(schema)
                    )
                ).fetchall()
            )
            for file in migrations():
                if file.name not in done:
                    _apply(conn, schema, file)
                    report.applied.append(file.name)
                if up_to is not None and file.name.startswith(up_to):
                    return report
            for file in functions():
                if done.get(file.name) != file.checksum:
                    _apply(conn, schema, file)
                    report.applied.append(file.name)
        finally:
            conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", [f"airflow_broker:{schema}"])
    if report.applied:
        log.info("broker schema %s: applied %s", schema, ", ".join(report.applied))
    return report


def _apply(conn: psycopg.Connection[tuple[object, ...]], schema: str, file: SqlFile) -> None:
    log.info("applying %s to schema %s", file.name, schema)
    with conn.transaction():
        # Unqualified names in the files resolve to the broker schema, and functions capture
        # this search_path (SET search_path FROM CURRENT), so the schema name stays configurable.
        conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema)))
        conn.execute(file.text.encode())
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.schema_migrations (name, checksum) VALUES (%s, %s)"
                " ON CONFLICT (name) DO UPDATE SET checksum = EXCLUDED.checksum, applied_at = now()"
            ).format(sql.Identifier(schema)),
            [file.name, file.checksum],
        )


def pending(dsn: str, schema: str = "broker") -> list[str]:
    """Files that install() would apply: empty when the schema is current."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL",
            [sql.Identifier(schema, "schema_migrations").as_string(conn)],
        ).fetchone()
        done: dict[str, str] = {}
        if exists and exists[0]:
            done = dict(
                conn.execute(
                    sql.SQL("SELECT name, checksum FROM {}.schema_migrations").format(
                        sql.Identifier(schema)
                    )
                ).fetchall()
            )
    return [f.name for f in migrations() if f.name not in done] + [
        f.name for f in functions() if done.get(f.name) != f.checksum
    ]
