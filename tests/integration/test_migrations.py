"""Upgrades: a schema built by every earlier release of the broker's SQL, upgraded by
``install()``, equals one installed fresh: the same tables, columns, indexes, constraints,
views, triggers and functions (no overload left behind by a changed argument list) and the same
error texts.

An earlier release is the SQL of the commit before each migration was added, read from the
repository's history; without the history (a source archive), the schema as each migration
left it stands in for it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from airflow_broker.migrations import SqlFile, apply_file, install, migrations
from airflow_broker.queries import Queries
from tests.fixtures.postgres import fresh_database

ROOT = Path(__file__).resolve().parents[2]
SQL = "airflow_broker/sql"

CATALOG = """
SELECT 'column', c.relname || '.' || a.attname,
       format_type(a.atttypid, a.atttypmod) || ' not null: ' || a.attnotnull
       || ' default: ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
  FROM pg_attribute a
  JOIN pg_class c ON c.oid = a.attrelid
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
 WHERE c.relnamespace = 'broker'::regnamespace AND c.relkind IN ('r', 'v', 'p')
   AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'index', indexname, indexdef FROM pg_indexes WHERE schemaname = 'broker'
UNION ALL
SELECT 'constraint', conrelid::regclass::text || '.' || conname, pg_get_constraintdef(oid)
  FROM pg_constraint WHERE connamespace = 'broker'::regnamespace
UNION ALL
SELECT 'function', p.oid::regprocedure::text, md5(pg_get_functiondef(p.oid))
  FROM pg_proc p WHERE p.pronamespace = 'broker'::regnamespace AND p.prokind <> 'a'
UNION ALL
SELECT 'view', viewname, md5(definition) FROM pg_views WHERE schemaname = 'broker'
UNION ALL
SELECT 'trigger', tgrelid::regclass::text || '.' || tgname, pg_get_triggerdef(oid)
  FROM pg_trigger
 WHERE NOT tgisinternal
   AND tgrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'broker'::regnamespace)
UNION ALL
SELECT 'error text', error_number::text, text FROM broker.error_messages
ORDER BY 1, 2
"""


def catalog(dsn: str) -> list[tuple[str, str, str]]:
    with psycopg.connect(dsn) as conn:
        return [(kind, name, detail) for kind, name, detail in conn.execute(CATALOG)]


@contextmanager
def database(server_dsn: str) -> Iterator[str]:
    with fresh_database(server_dsn, "upgrade", None) as dsn:
        yield dsn


@pytest.fixture(scope="module")
def fresh_catalog(server_dsn: str) -> list[tuple[str, str, str]]:
    with database(server_dsn) as dsn:
        install(dsn)
        return catalog(dsn)


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          check=True).stdout


def releases() -> list[str]:
    """Earlier releases of the schema, oldest first: the commit just before each migration
    after the first was added. A migration may still change until the next one is written;
    from then on it is released, and is never edited again."""
    try:
        log = _git("log", "--reverse", "--diff-filter=A", "--format=%H", "--",
                   f"{SQL}/migrations/")
    except (OSError, subprocess.CalledProcessError):
        return []
    return [_git("rev-parse", f"{commit}^").strip() for commit in log.split()[1:]]


def files_at(commit: str, folder: str) -> list[SqlFile]:
    names = sorted(_git("ls-tree", "--name-only", commit, f"{SQL}/{folder}/").split())
    return [SqlFile(Path(name).name, _git("show", f"{commit}:{name}"))
            for name in names if name.endswith(".sql")]


def install_release(dsn: str, commit: str) -> None:
    """The broker schema as the SQL of ``commit`` installed it: its migrations, then its
    functions, each recorded with its checksum as install() records it."""
    queries = Queries("broker")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(queries["create_schema"])
        conn.execute(queries["create_schema_migrations"])
        for file in [*files_at(commit, "migrations"), *files_at(commit, "functions")]:
            apply_file(conn, queries, file)


RELEASES = releases()


@pytest.mark.parametrize("commit", RELEASES or ["no history"], ids=lambda c: c[:10])
def test_every_earlier_release_upgrades_to_the_fresh_catalog(
        server_dsn: str, fresh_catalog: list[tuple[str, str, str]], commit: str) -> None:
    if not RELEASES:
        # A source archive has no history: upgrade from each migration's schema instead.
        for migration in migrations():
            with database(server_dsn) as dsn:
                install(dsn, up_to=migration.name.split("__")[0])
                install(dsn)
                assert catalog(dsn) == fresh_catalog, migration.name
        return
    with database(server_dsn) as dsn:
        install_release(dsn, commit)
        install(dsn)
        upgraded = catalog(dsn)
    missing = sorted(set(fresh_catalog) - set(upgraded))
    extra = sorted(set(upgraded) - set(fresh_catalog))
    assert (missing, extra) == ([], [])


def test_upgrading_from_each_migration_yields_the_fresh_catalog(
        server_dsn: str, fresh_catalog: list[tuple[str, str, str]]) -> None:
    for migration in migrations()[:-1]:
        with database(server_dsn) as dsn:
            install(dsn, up_to=migration.name.split("__")[0])
            install(dsn)
            assert catalog(dsn) == fresh_catalog, migration.name


def test_an_upgrade_removes_grants_of_create_route_which_gave_nothing(server_dsn: str) -> None:
    """CREATE ROUTE on the database could be granted before V017, yet only the schema's owner
    may create a route: the upgrade removes such rows and keeps every real grant."""
    grant = ("INSERT INTO broker.permissions (class, major_id, grantee, permission, state,"
             " grantor) VALUES (0, 0, 0, %s, 'G', 10)")
    with database(server_dsn) as dsn:
        install(dsn, up_to="V016")
        with psycopg.connect(dsn) as conn:
            conn.execute(grant, ["CREATE ROUTE"])
            conn.execute(grant, ["CREATE QUEUE"])
        install(dsn)
        with psycopg.connect(dsn) as conn:
            left = conn.execute("SELECT permission FROM broker.permissions"
                                " WHERE class = 0 AND grantee = 0 ORDER BY 1").fetchall()
    assert left == [("CREATE QUEUE",)]
