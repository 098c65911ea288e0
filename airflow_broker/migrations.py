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

from airflow_broker.queries import DEFAULT_SCHEMA, Queries, query_texts

log = logging.getLogger(__name__)

_SQL = resources.files("airflow_broker") / "sql"
PRIVILEGES = "99_privileges.sql"


@dataclass(frozen=True)
class SqlFile:
    name: str
    text: str

    @property
    def checksum(self) -> str:
        """Of the text and of the search_path it runs under, which its functions keep: a
        change of either applies the file again."""
        context = query_texts()["set_search_path"]
        return hashlib.sha256(f"{context}\n{self.text}".encode()).hexdigest()


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


def install(dsn: str, schema: str = DEFAULT_SCHEMA, *, up_to: str | None = None,
            owner: str | None = None) -> InstallReport:
    """Creates or upgrades the broker schema; safe to run again and from several processes.

    ``owner`` is the role that owns the schema and everything in it (default: the login that
    installs). The broker's functions run with its rights, so give it no more than the schema
    (docs/security.md); the installing login must be a member of it.

    ``up_to`` stops after the named migration (without re-applying functions): upgrade tests
    use it to start from an older schema.
    """
    report = InstallReport(schema)
    queries = Queries(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(queries["install_lock"], [schema])
        try:
            if owner is None:
                conn.execute(queries["create_schema"])
            else:
                # Utility statements around identifiers are composed here (CONTRIBUTING.md).
                conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {} AUTHORIZATION {}").format(
                    sql.Identifier(schema), sql.Identifier(owner)))
                conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(owner)))
            conn.execute(queries["create_schema_migrations"])
            done: dict[str, str] = dict(conn.execute(queries["applied_files"]).fetchall())
            for file in migrations():
                if file.name not in done:
                    apply_file(conn, queries, file)
                    report.applied.append(file.name)
                if up_to is not None and file.name.startswith(up_to):
                    return report
            changed = False
            for file in functions():
                # The last file sets every function's security and settings, which CREATE
                # OR REPLACE of any other resets.
                last = file.name == PRIVILEGES
                if done.get(file.name) != file.checksum or (last and changed):
                    apply_file(conn, queries, file)
                    report.applied.append(file.name)
                    changed = True
        finally:
            conn.execute(queries["install_unlock"], [schema])
    if report.applied:
        log.info("broker schema %s: applied %s", schema, ", ".join(report.applied))
    return report


def apply_file(conn: psycopg.Connection[tuple[object, ...]], queries: Queries,
               file: SqlFile) -> None:
    """Runs one migration or function file in the schema and records it, in one
    transaction."""
    log.info("applying %s to schema %s", file.name, queries.schema)
    with conn.transaction():
        conn.execute(queries["set_search_path"])
        conn.execute(file.text.encode())
        conn.execute(queries["record_applied_file"], [file.name, file.checksum])


def pending(dsn: str, schema: str = DEFAULT_SCHEMA) -> list[str]:
    """Files that install() would apply: empty when the schema is current."""
    queries = Queries(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = conn.execute(
            queries["schema_migrations_exists"],
            [sql.Identifier(schema, "schema_migrations").as_string(conn)],
        ).fetchone()
        done: dict[str, str] = {}
        if exists and exists[0]:
            done = dict(conn.execute(queries["applied_files"]).fetchall())
    changed = [f.name for f in functions() if done.get(f.name) != f.checksum]
    if changed and PRIVILEGES not in changed:
        changed.append(PRIVILEGES)
    return [f.name for f in migrations() if f.name not in done] + changed
