"""Listing, replaying and discarding quarantined messages (CLI and operators use these)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from airflow_broker._statements import runner_of
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
    with broker.transaction() as tx:
        runner = runner_of(tx)
        rows = runner.run(runner.queries["quarantined_messages"],
                      [queue_name, queue_name, include_resolved])
    return [QuarantinedMessage(*row) for row in rows]


def replay(broker: Broker, quarantine_ids: Sequence[int]) -> int:
    """Puts the messages back on their conversations, in sequence order; all or none."""
    with broker.transaction() as tx:
        runner = runner_of(tx)
        call = runner.function("replay_quarantined", 1)
        for quarantine_id in sorted(quarantine_ids):
            runner.run(call, [quarantine_id])
    return len(quarantine_ids)


def discard(broker: Broker, quarantine_ids: Sequence[int]) -> int:
    with broker.transaction() as tx:
        runner = runner_of(tx)
        call = runner.function("discard_quarantined", 1)
        for quarantine_id in quarantine_ids:
            runner.run(call, [quarantine_id])
    return len(quarantine_ids)
