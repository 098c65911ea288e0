"""A queue as a failing reader leaves it: messages it gave up on in the quarantine, and one
that made its receiving transactions roll back until poison-message detection disabled the
queue (the broker's pages show and repair exactly this)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from airflow_broker import Broker
from airflow_broker._statements import runner_of
from airflow_broker.poison import quarantine
from airflow_broker.poison.quarantine import QuarantinedMessage


@dataclass(frozen=True)
class PoisonedQueue:
    queue_name: str
    quarantine_ids: list[int]
    poison_message_id: uuid.UUID


def quarantined(broker: Broker, queue_name: str | None = None) -> list[QuarantinedMessage]:
    """The open quarantine, of one queue or of all, read in a transaction of its own."""
    with broker.transaction() as tx:
        return quarantine.list_quarantined(tx, queue_name)


def quarantine_received(broker: Broker, queue_name: str, count: int, error: str) -> list[int]:
    """Receives ``count`` messages and quarantines them, as a reader's quarantine strategy
    does, in the receiving transaction."""
    ids = []
    with broker.transaction() as tx:
        runner = runner_of(tx)
        for message in tx.receive(queue_name, count):
            ids.append(int(runner.scalar(runner.function("quarantine_message", 13), [
                queue_name, message.conversation_handle, message.conversation_group_id,
                message.service_name, message.service_contract_name,
                message.message_type_name, message.message_sequence_number,
                message.message_id, message.message_body, error, None, 1, "quarantined"])))
    assert len(ids) == count, f"only {len(ids)} of {count} messages to quarantine"
    return ids


class ReaderFailure(RuntimeError):
    pass


def roll_back_until_disabled(broker: Broker, queue_name: str) -> uuid.UUID:
    """Five receiving transactions of the next message that roll back: poison detection
    disables the queue. Returns the message's id."""
    received: set[uuid.UUID] = set()
    for _ in range(5):
        try:
            with broker.transaction() as tx:
                messages = tx.receive(queue_name, 1)
                assert messages, f"nothing to receive on {queue_name}"
                received.add(messages[0].message_id)
                raise ReaderFailure("the reader cannot process this message")
        except ReaderFailure:
            pass
    assert len(received) == 1, received
    return received.pop()


def poisoned_queue(broker: Broker, initiator: str, target: str, contract: str,
                   message_type: str, queue_name: str, bodies: list[str],
                   error: str) -> PoisonedQueue:
    """Sends ``bodies`` on one dialog, quarantines all but the last, and poisons the queue with
    the last."""
    with broker.transaction() as tx:
        handle = tx.begin_dialog(initiator, target, contract)
        for body in bodies:
            tx.send(handle, message_type, body)
    ids = quarantine_received(broker, queue_name, len(bodies) - 1, error)
    poison_id = roll_back_until_disabled(broker, queue_name)
    return PoisonedQueue(queue_name, ids, poison_id)
