"""Listing, replaying and discarding quarantined messages (CLI and operators use these)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from psycopg import sql

from airflow_broker.broker import Broker
from airflow_broker.messages import decode_body


@dataclass(frozen=True)
class QuarantinedMessage:
    quarantine_id: int
    queue_name: str
    status: str
    quarantined_at: dt.datetime
    attempts: int
    conversation_handle: uuid.UUID
    message_type_name: str
    message_sequence_number: int
    message_id: uuid.UUID
    message_body: bytes | None
    error: str

    def body_text(self, limit: int = 80) -> str:
        try:
            text = decode_body(self.message_body) or ""
        except UnicodeDecodeError:
            text = repr(self.message_body)
        return text if len(text) <= limit else text[: limit - 3] + "..."


def list_quarantined(broker: Broker, queue_name: str | None = None,
                     include_resolved: bool = False) -> list[QuarantinedMessage]:
    query = sql.SQL(
        "SELECT quarantine_id, queue_name, status, quarantined_at, attempts, conversation_handle,"
        " message_type_name, message_sequence_number, message_id, message_body, error"
        " FROM {}.quarantined_messages"
        " WHERE (%s::text IS NULL OR queue_name = %s) AND (%s OR status IN"
        " ('quarantined', 'retrying'))"
        " ORDER BY quarantined_at, quarantine_id").format(sql.Identifier(broker.schema))
    with broker.transaction() as tx:
        rows = tx.run(query, [queue_name, queue_name, include_resolved])
    return [QuarantinedMessage(*row) for row in rows]


def replay(broker: Broker, quarantine_ids: Sequence[int]) -> int:
    """Puts the messages back on their conversations, in sequence order; all or none."""
    call = sql.SQL("SELECT {}.replay_quarantined(%s)").format(sql.Identifier(broker.schema))
    with broker.transaction() as tx:
        for quarantine_id in sorted(quarantine_ids):
            tx.run(call, [quarantine_id])
    return len(quarantine_ids)


def discard(broker: Broker, quarantine_ids: Sequence[int]) -> int:
    call = sql.SQL("SELECT {}.discard_quarantined(%s)").format(sql.Identifier(broker.schema))
    with broker.transaction() as tx:
        for quarantine_id in quarantine_ids:
            tx.run(call, [quarantine_id])
    return len(quarantine_ids)
