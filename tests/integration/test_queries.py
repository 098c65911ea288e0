"""The named queries (sql/queries/*.sql): each one the code names exists, each one that exists
is used, and each parses and plans against a freshly installed schema, so a query cannot drift
from the tables and functions it reads."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
from psycopg import pq

from airflow_broker.hooks.broker import INBOX_COLUMNS
from airflow_broker.queries import Queries, query_texts
from bench.statements import engine_statements

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [p for folder in ("airflow_broker", "hooks", "operators", "sensors", "triggers",
                            "notifications", "queues")
           for p in (ROOT / folder).rglob("*.py")]
# queries["name"], rows(conn, "name", ...), self._rows("name", ...), self.rows("name", ...),
# self._query("name")
NAMED = re.compile(r'(?:queries\[|\b_?rows\(\s*(?:conn,\s*)?|\.rows\(\s*|_query\(\s*)"(\w+)"')
# Filled in with Python's bytes formatting, not sent with parameters.
FORMATTED = {"resolve_receives": 1}


def named_in_code() -> set[str]:
    return {name for path in SOURCES for name in NAMED.findall(path.read_text())}


def test_every_query_the_code_names_exists_and_every_query_is_used() -> None:
    named, defined = named_in_code(), set(query_texts())
    assert named - defined == set()
    assert defined - named == set()


def test_inbox_queries_return_the_inbox_columns_in_order() -> None:
    for name, text in query_texts().items():
        if name.startswith("inbox_") and text.startswith("SELECT inbox_id"):
            columns = text[len("SELECT "):text.index("\nFROM")]
            listed = tuple(c.strip() for c in columns.split(","))
            assert listed[:len(INBOX_COLUMNS)] == INBOX_COLUMNS, name


def _positional(text: str) -> str:
    """psycopg's %s and %b as PostgreSQL's $1, $2, ..."""
    count = 0

    def number(match: re.Match[str]) -> str:
        nonlocal count
        if match.group(0) == "%%":
            return "%"
        count += 1
        return f"${count}"

    return re.sub(r"%%|%s|%b", number, text)


def test_every_query_parses_and_plans_against_the_installed_schema(dsn: str) -> None:
    queries = Queries("broker")
    failures = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i, name in enumerate(sorted(query_texts())):
            text = queries[name]
            if name in FORMATTED:
                text = text % FORMATTED[name]
            result = conn.pgconn.prepare(f"q{i}".encode(), _positional(text.decode()).encode())
            if result.status != pq.ExecStatus.COMMAND_OK:
                failures[name] = (result.error_message or b"").decode()
    assert failures == {}


def test_the_benchmark_explains_the_functions_own_statements(dsn: str) -> None:
    """bench/profiling.py explains the statements marked in sql/functions: each one is found,
    and plans against an installed schema as it stands in its function."""
    statements = engine_statements()
    assert set(statements) == {"begin_ready", "send_ready", "send_first", "send_endpoint",
                               "send_local", "send_pending",
                               "deliver_far_endpoint", "deliver_insert", "send_update_endpoint",
                               "end_lock", "end_local", "end_closed", "receive_lock_group",
                               "receive_take",
                               "receive_ready", "register_receive"}
    failures = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = broker")
        for name, statement in statements.items():
            try:
                conn.execute(statement.prepare(name))
            except psycopg.Error as exc:
                failures[name] = str(exc)
    assert failures == {}
