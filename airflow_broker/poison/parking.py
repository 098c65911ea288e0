"""Parking: how a strategy that parks (``timer_retry``) keeps a failed message for a retry.

The reader parks the message in the quarantine table as "retrying" and starts a conversation
timer; the conversation's later messages are parked behind it, so its order holds. When the
DialogTimer arrives, the reader takes the conversation's parked messages, in order, and tries
each again; each is settled: done, failed again (a new timer), or quarantined for good. Every
function acts in the reader's transaction, so a park or a settlement commits with the RECEIVE
that led to it, or not at all.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from airflow_broker._statements import runner_of
from airflow_broker.messages import Message
from airflow_broker.poison.quarantine import quarantine_message
from airflow_broker.poison.strategies import Action, Failure, PoisonStrategy
from airflow_broker.transaction import Transaction


@dataclass(frozen=True)
class Parked:
    """A parked message, as the DialogTimer's retry gives it to the handler again."""

    quarantine_id: int
    message: Message


def park(tx: Transaction, queue_name: str, message: Message, error: str,
         traceback: str | None, attempts: int) -> None:
    """Parks a received message; the caller starts the conversation timer that retries it."""
    quarantine_message(tx, queue_name, message, error, traceback, attempts, status="retrying")


def parked_conversations(tx: Transaction, handles: set[uuid.UUID]) -> set[uuid.UUID]:
    """Those of the conversations that have parked messages: their later messages wait."""
    runner = runner_of(tx)
    rows = runner.run(runner.queries["parked_conversations"], [list(handles)])
    return {r[0] for r in rows}


def parked_messages(tx: Transaction, conversation: uuid.UUID) -> list[Parked]:
    """The conversation's parked messages, in order, locked until ``tx`` ends."""
    runner = runner_of(tx)
    rows = runner.run(runner.queries["parked_messages"], [conversation])
    return [
        Parked(qid, Message(
            status=1, priority=5, queuing_order=0, conversation_group_id=group,
            conversation_handle=conversation, message_sequence_number=seq,
            service_name=service, service_id=0, service_contract_name=contract,
            service_contract_id=0, message_type_name=type_name, message_type_id=0,
            validation="N", message_body=body, message_id=message_id, attempts=attempts))
        for (qid, message_id, type_name, seq, body, attempts, group, service,
             contract) in rows]


def retry_action(strategy: PoisonStrategy, failure: Failure) -> Action:
    """What happens to a parked message that failed again: parked again or quarantined. It
    was rolled back from its batch already, and its conversation waits behind it, so the
    strategy's other answers do not apply."""
    action = strategy.decide(failure)
    return action if action is Action.PARK else Action.QUARANTINE


def settle(tx: Transaction, parked: Parked, outcome: str, attempts: int | None = None,
           error: str | None = None, traceback: str | None = None) -> None:
    """Settles a retried message: ``done`` (processed, gone from the table), ``failed``
    (parked again, with its attempts and error) or ``quarantined`` (for good)."""
    runner = runner_of(tx)
    runner.run(runner.queries["parked_message_settle"],
               [parked.quarantine_id, outcome, attempts, error, traceback])
