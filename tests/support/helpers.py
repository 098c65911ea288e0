"""Small helpers shared by the tests: snapshots of what the broker holds, to prove that a
failed statement changed nothing, and waiting for what another session does."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from airflow_broker import Broker

SNAPSHOT_TABLES = (
    "message_types", "xml_schema_collections", "contracts", "contract_message_usages",
    "queues", "service_defs", "service_def_contracts", "dialog_groups", "endpoints",
    "queue_messages", "transmissions",
)


def snapshot(broker: Broker) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every broker table, in a stable order."""
    with psycopg.connect(broker.dsn) as conn:
        return {
            table: sorted(
                conn.execute(f"SELECT t::text FROM broker.{table} t").fetchall()
            )
            for table in SNAPSHOT_TABLES
        }


def count(broker: Broker, query: str, params: tuple[Any, ...] = ()) -> int:
    with psycopg.connect(broker.dsn) as conn:
        row = conn.execute(query, params).fetchone()
        assert row is not None
        return int(row[0])


def endpoint(broker: Broker, handle: Any) -> dict[str, Any] | None:
    with psycopg.connect(broker.dsn) as conn:
        cur = conn.execute(
            "SELECT * FROM broker.conversation_endpoints WHERE conversation_handle = %s",
            [handle],
        )
        row = cur.fetchone()
        if row is None:
            return None
        assert cur.description is not None
        return {d.name: v for d, v in zip(cur.description, row, strict=True)}


def wait_until(condition: Callable[[], bool], what: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting: {what}")
        time.sleep(0.02)


def backend_waits_for_lock(broker: Broker, pid: int) -> bool:
    with psycopg.connect(broker.dsn) as conn:
        row = conn.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]
        ).fetchone()
    return row is not None and row[0] == "Lock"


def target_handle(broker: Broker, initiator: uuid.UUID) -> uuid.UUID:
    with psycopg.connect(broker.dsn) as conn:
        row = conn.execute(
            """SELECT t.conversation_handle FROM broker.conversation_endpoints t
                 JOIN broker.conversation_endpoints i USING (conversation_id)
                WHERE i.conversation_handle = %s AND NOT t.is_initiator""",
            [initiator],
        ).fetchone()
    assert row is not None
    handle: uuid.UUID = row[0]
    return handle


def terminate_sessions(dsn: str) -> int:
    """Ends every other session of the test's database with pg_terminate_backend (what an
    administrator, a pooler or a crashed backend's restart does to a client); returns how many
    went."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        # With a timeout it returns once each backend has exited (and closed its socket),
        # not when the signal is sent: a client checking its connection right after sees it.
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 60000))"
            " FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchone()
    return int(row[0]) if row else 0
