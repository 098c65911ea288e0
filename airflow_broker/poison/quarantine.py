"""The quarantine table: messages a reader gave up on, put there in its receiving transaction
with their error and traceback, listed, replayed onto their conversations or discarded (the
CLI, QuarantineOperator and the reader use these). Each function acts in the transaction it is
given, so a replay commits, or rolls back, with whatever else that transaction does."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from airflow_broker._statements import runner_of
from airflow_broker.messages import Message, decode_body
from airflow_broker.transaction import Transaction


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


def quarantine_message(tx: Transaction, queue_name: str, message: Message, error: str,
                       traceback: str | None, attempts: int,
                       status: str = "quarantined") -> None:
    """Moves a received message into the quarantine table, in the receiving transaction;
    ``status`` "retrying" parks it for a timer retry (:mod:`airflow_broker.poison.parking`)."""
    runner = runner_of(tx)
    runner.scalar(
        runner.function("quarantine_message", 13),
        [queue_name, message.conversation_handle, message.conversation_group_id,
         message.service_name, message.service_contract_name, message.message_type_name,
         message.message_sequence_number, message.message_id, message.message_body, error,
         traceback, attempts, status])


def list_quarantined(tx: Transaction, queue_name: str | None = None,
                     include_resolved: bool = False) -> list[QuarantinedMessage]:
    runner = runner_of(tx)
    rows = runner.run(runner.queries["quarantined_messages"],
                      [queue_name, queue_name, include_resolved])
    return [QuarantinedMessage(*row) for row in rows]


def replay(tx: Transaction, quarantine_ids: Sequence[int]) -> int:
    """Puts the messages back on their conversations, in sequence order; all or none, with
    ``tx``."""
    runner = runner_of(tx)
    call = runner.function("replay_quarantined", 1)
    for quarantine_id in sorted(quarantine_ids):
        runner.run(call, [quarantine_id])
    return len(quarantine_ids)


def discard(tx: Transaction, quarantine_ids: Sequence[int]) -> int:
    runner = runner_of(tx)
    call = runner.function("discard_quarantined", 1)
    for quarantine_id in quarantine_ids:
        runner.run(call, [quarantine_id])
    return len(quarantine_ids)
