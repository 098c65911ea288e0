"""Small helpers shared by the tests: snapshots of what the broker holds, to prove that a
failed statement changed nothing."""

from __future__ import annotations

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
