"""What reader runs did, kept in the database: a run (one Spark job of queue readers, or any
other group of QueueReaders) and the attempts of each of its readers.

A reader writes its counts in the transaction of the work they count, so they are exactly the
committed work, also when an attempt is killed and Spark runs the reader again. Operators report
``run_summary()``, summed over every attempt, never what one process remembers.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from airflow_broker._statements import runner_of

if TYPE_CHECKING:
    from airflow_broker.broker import Broker
    from airflow_broker.transaction import Transaction


@dataclass
class ReaderStats:
    received: int = 0
    processed: int = 0
    replied: int = 0
    quarantined: int = 0
    retried: int = 0
    ended: int = 0
    failed: int = 0
    batches: int = 0


def _call(tx: Transaction, function: str, args: list[Any]) -> Any:
    runner = runner_of(tx)
    return runner.scalar(runner.function(function, len(args)), args)


def begin_run(broker: Broker, run_id: uuid.UUID, queue_name: str, plan: dict[str, Any]) -> None:
    with broker.transaction() as tx:
        _call(tx, "reader_run_begin", [run_id, queue_name, json.dumps(plan)])


def run_summary(broker: Broker, run_id: uuid.UUID) -> dict[str, Any]:
    with broker.transaction() as tx:
        summary: dict[str, Any] = _call(tx, "reader_run_summary", [run_id])
    return summary


def finish_run(broker: Broker, run_id: uuid.UUID) -> dict[str, Any]:
    """Stores the run's summary with the run and returns it."""
    with broker.transaction() as tx:
        summary: dict[str, Any] = _call(tx, "reader_run_finish", [run_id])
    return summary


class AttemptLog:
    """One attempt of one reader of a run, as the reader reports it."""

    def __init__(self, broker: Broker, run_id: uuid.UUID, reader: int, attempt: int) -> None:
        self.broker = broker
        self.key = [run_id, reader, attempt]
        with broker.transaction() as tx:
            _call(tx, "reader_attempt_begin",
                  [*self.key, socket.gethostname(), os.getpid()])
            # Every count from the start: a reader that finds the queue empty reports zeros.
            self.progress(tx, ReaderStats(), [])

    def progress(self, tx: Transaction, stats: ReaderStats, events: list[dict[str, Any]]) -> None:
        """Inside the reader's transaction: commits, or rolls back, with its work."""
        _call(tx, "reader_attempt_progress",
              [*self.key, json.dumps(asdict(stats)), json.dumps(events)])

    def save(self, stats: ReaderStats, events: list[dict[str, Any]]) -> None:
        """After a rollback: what stays true of it (the failures and retries) in a
        transaction of its own."""
        with self.broker.transaction() as tx:
            self.progress(tx, stats, events)

    def committed(self) -> tuple[ReaderStats, list[dict[str, Any]]]:
        """The counts and failures this attempt has committed, as the database has them."""
        with self.broker.transaction() as tx:
            found = _call(tx, "reader_attempt_stats", self.key) or {}
        return ReaderStats(**(found.get("stats") or {})), list(found.get("events") or [])

    def end(self, status: str, error: str | None = None) -> None:
        with self.broker.transaction() as tx:
            _call(tx, "reader_attempt_end", [*self.key, status, error])

    def fail(self, exc: BaseException) -> None:
        self.end("failed", f"{type(exc).__name__}: {exc}"[:2000])
