"""What reader runs report (airflow_broker.readers.runs): counts written in the transaction of
the work they count, summed over every attempt of every reader, so a reader that dies in the
middle leaves its committed work counted and nothing of its rolled-back batch."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from airflow_broker.errors import ObjectNotFound, RunIdInUse
from airflow_broker.messages import Message
from airflow_broker.readers.queue_reader import QueueReader, ReaderConfig, ReaderContext
from airflow_broker.readers.runs import AttemptLog, begin_run, finish_run, run_summary
from tests.support.brokers import App
from tests.support.helpers import count
from tests.support.reader_handlers import book_trade
from tests.support.trading import booked, create_results, send_trades


@pytest.fixture
def trading(app: App) -> App:
    return create_results(app)


class ReaderKilled(BaseException):
    """Stands for the process dying: no message's failure, so no strategy handles it."""


def dies_at(n: int) -> Any:
    seen = 0

    def handle(message: Message, ctx: ReaderContext) -> str:
        nonlocal seen
        seen += 1
        if seen == n:
            raise ReaderKilled
        return book_trade(message, ctx)
    return handle


def config(**options: Any) -> ReaderConfig:
    return ReaderConfig(queue_name="q_t", handler="tests.support.reader_handlers:book_trade",
                        idle_exit=0.5, waitfor_timeout=0.2, reply_message_type="Resp",
                        batch_size=4, **options)


def attempt(app: App, run_id: uuid.UUID, reader: int, attempt: int, handler: Any = None,
            **options: Any) -> QueueReader:
    return QueueReader(app.broker, config(**options), handler,
                       AttemptLog(app.broker, run_id, reader, attempt))


def test_a_killed_attempt_keeps_its_committed_work_counted(trading: App) -> None:
    send_trades(trading, 3, 10)
    run_id = uuid.uuid4()
    begin_run(trading.broker, run_id, "q_t", {"readers_wanted": 1})
    first = attempt(trading, run_id, 0, 7, dies_at(10))
    with pytest.raises(ReaderKilled):
        first.run()
    # Two batches of four committed (a RECEIVE takes one conversation group, here one
    # conversation); the third, of two, rolled back when the reader "died" in it.
    summary = run_summary(trading.broker, run_id)
    assert (summary["received"], summary["processed"], summary["replied"]) == (8, 8, 8)
    assert booked(trading) == 8
    assert summary["failed_readers"] == [0]
    attempt(trading, run_id, 0, 9).run()
    summary = finish_run(trading.broker, run_id)
    assert (summary["received"], summary["processed"], summary["replied"]) == (30, 30, 30)
    assert booked(trading) == 30
    assert (summary["readers"], summary["attempts"], summary["task_retries"],
            summary["failed_readers"], summary["readers_wanted"]) == (1, 2, 1, [], 1)
    assert [(a["try"], a["status"], a["received"]) for a in summary["per_attempt"]] == [
        (1, "lost", 8), (2, "finished", 22)]
    assert summary["per_reader"] == [{"reader": 0, "attempts": 2, "received": 30,
                                      "processed": 30, "replied": 30, "quarantined": 0,
                                      "retried": 0, "ended": 0, "failed": 0, "batches": 9}]
    # finish_run kept the summary with the run.
    assert count(trading.broker, f"SELECT (summary->>'received')::int FROM broker.reader_runs"
                                 f" WHERE run_id = '{run_id}'") == 30


def test_rolled_back_batches_count_their_failures_not_their_messages(trading: App) -> None:
    send_trades(trading, 1, 2, bad={(0, 0)})
    run_id = uuid.uuid4()
    begin_run(trading.broker, run_id, "q_t", {})
    stats = attempt(trading, run_id, 0, 0, strategy="retry", max_attempts=3).run()
    summary = run_summary(trading.broker, run_id)
    # Two rollbacks, then the quarantine: each message received once, as committed.
    assert (summary["received"], summary["processed"], summary["quarantined"],
            summary["retried"], summary["failed"]) == (2, 1, 1, 2, 3)
    assert (stats.received, stats.retried) == (2, 2)
    assert [e["action"] for e in summary["events"]] == ["rolled back", "rolled back",
                                                         "quarantined"]
    assert {e["sequence"] for e in summary["events"]} == {0}


def two_readers(app: App, conversations: int, per_conversation: int) -> uuid.UUID:
    """Two readers of one run, the second begun (its AttemptLog) while the first is at work,
    then run one after the other."""
    send_trades(app, conversations, per_conversation)
    run_id = uuid.uuid4()
    begin_run(app.broker, run_id, "q_t", {})
    first, second = attempt(app, run_id, 0, 0), attempt(app, run_id, 1, 1)
    first.run()
    second.run()
    return run_id


def test_readers_at_work_together_are_counted_as_concurrent(trading: App) -> None:
    run_id = two_readers(trading, 2, 3)
    summary = run_summary(trading.broker, run_id)
    assert (summary["readers"], summary["max_concurrent"], summary["received"]) == (2, 2, 6)
    later = attempt(trading, run_id, 2, 2)
    later.run()
    assert run_summary(trading.broker, run_id)["max_concurrent"] == 2


def test_a_reader_that_found_nothing_reports_zeros(trading: App) -> None:
    summary = run_summary(trading.broker, two_readers(trading, 1, 2))
    assert [(r["reader"], r["received"], r["processed"]) for r in summary["per_reader"]] == [
        (0, 2, 2), (1, 0, 0)]
    assert [a["processed"] for a in summary["per_attempt"]] == [2, 0]


def test_readers_report_into_a_run_that_was_begun_on_their_queue(trading: App) -> None:
    """An attempt of a run nobody began has no queue to be checked against: refused with
    15151, as is a run id given again for another queue (50126), and neither writes a row."""
    run_id = uuid.uuid4()
    with pytest.raises(ObjectNotFound, match="reader run"):
        AttemptLog(trading.broker, run_id, 0, 0)
    begin_run(trading.broker, run_id, "q_t", {"readers_wanted": 2})
    with pytest.raises(RunIdInUse, match="q_t"):
        begin_run(trading.broker, run_id, "q_i", {"readers_wanted": 5})
    with pytest.raises(ObjectNotFound, match="no_such_queue"):
        begin_run(trading.broker, uuid.uuid4(), "no_such_queue", {})
    assert run_summary(trading.broker, run_id)["readers_wanted"] == 2
    assert count(trading.broker, "SELECT count(*) FROM broker.reader_runs") == 1
    assert count(trading.broker, "SELECT count(*) FROM broker.reader_attempts") == 0
