"""The engine's long-lived connections when the database goes away under them: PostgreSQL
restarted as after a crash, or the sessions of the database terminated. A Broker's pool, its
WAITFOR listener and the worker go on in place; the first transaction after the fault
succeeds."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from airflow_broker import Broker, Message
from airflow_broker.readers import runs
from airflow_broker.readers.runs import AttemptLog
from airflow_broker.worker import BrokerWorker
from tests.support.brokers import App
from tests.support.helpers import count, wait_until
from tests.support.reader_handlers import HOLD
from tests.support.trading import booked, create_results, reader, send_trades


def send(broker: Broker, body: str) -> uuid.UUID:
    with broker.transaction() as tx:
        handle = tx.begin_dialog("I", "T", "C")
        tx.send(handle, "Req", body)
    return handle


def test_a_pool_serves_the_next_transactions_after_a_database_fault(
        app: App, database_fault: Callable[[], None]) -> None:
    """Every connection the pool held idle is dead after the fault and not yet marked so;
    without a check the first statement on each failed ("server closed the connection
    unexpectedly"). Now each checkout gets a live connection."""
    broker = app.broker
    barrier = threading.Barrier(4)

    def hold_one(_: int) -> None:
        with broker.transaction() as tx:
            tx.conn.execute("SELECT 1")
            barrier.wait(timeout=60)

    with ThreadPoolExecutor(4) as pool:  # four connections open, then idle in the pool
        list(pool.map(hold_one, range(4)))
    database_fault()
    for number in range(8):
        send(broker, f"after the fault {number}")
    assert count(broker, "SELECT count(*) FROM q_t") == 8


@pytest.fixture
def notified_only(dsn: str, app: App) -> Iterator[Broker]:
    """A Broker whose WAITFOR polls once an hour: within a test only a NOTIFY wakes it."""
    broker = Broker(dsn, poll_interval=3600)
    try:
        yield broker
    finally:
        broker.close()


def waiting_sessions(broker: Broker) -> int:
    return count(broker, "SELECT count(*) FROM broker.queue_waiters w"
                         " WHERE w.backend_pid IN (SELECT pid FROM pg_stat_activity)")


def test_waitfor_wakes_on_notify_after_a_database_fault(
        notified_only: Broker, app: App, database_fault: Callable[[], None]) -> None:
    """The WAITFOR listener's connection dies with the fault; it reconnects on its own, so a
    WAITFOR that starts afterwards is woken by the SEND's NOTIFY, not by its (hourly) poll."""
    broker = notified_only
    with broker.transaction() as tx:  # starts the listener
        assert tx.receive("q_t", waitfor=True, timeout=0.1) == []
    database_fault()
    received: list[Message] = []
    failure: list[BaseException] = []

    def wait() -> None:
        try:
            with broker.transaction() as tx:
                received.extend(tx.receive("q_t", waitfor=True, timeout=600))
        except BaseException as exc:
            failure.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    try:
        wait_until(lambda: waiting_sessions(broker) == 1 or bool(failure),
                   "the WAITFOR to register", 120)
        assert not failure, failure
        send(app.broker, "wakes the waiter")
        waiter.join(timeout=120)
        assert not waiter.is_alive(), "the NOTIFY did not wake the WAITFOR"
    finally:
        if waiter.is_alive():
            send(app.broker, "releases the waiter")
            waiter.join(timeout=120)
    assert not failure, failure
    assert [m.text() for m in received] == ["wakes the waiter"]


def test_the_worker_fires_a_due_timer_after_a_database_fault(
        app: App, database_fault: Callable[[], None]) -> None:
    """`airflow-broker worker` running through the fault: its next passes fire the timer that
    fell due, without a restart of the worker."""
    worker = BrokerWorker(app.broker, interval=0.1, transport=False)
    thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
    thread.start()
    try:
        handle = app.dialog()
        with app.broker.transaction() as tx:
            tx.begin_conversation_timer(handle, 1)
        database_fault()
        app.broker.advance_clock(dt.timedelta(seconds=2))
        wait_until(lambda: count(app.broker, "SELECT count(*) FROM broker.queue_messages"
                                             " WHERE message_type_id = 5") == 1,
                   "the worker to fire the timer", 120)
        assert thread.is_alive()
    finally:
        worker.stop()
        thread.join(timeout=60)


def test_a_reader_goes_on_in_place_after_a_database_fault(
        app: App, database_fault: Callable[[], None],
        caplog: pytest.LogCaptureFixture) -> None:
    """A queue reader (a Spark task's loop) in the middle of a drain when the database goes
    away: the batch in flight rolls back with its transaction and is received again on a new
    connection. The reader neither fails (before, the lost connection ended the Spark task)
    nor blames a message, and every trade is booked once, in its conversation's order."""
    create_results(app)
    send_trades(app, 10, 60)
    # As a Spark reader runs: its counts in the database, in the transactions they count.
    run_id = uuid.uuid4()
    runs.begin_run(app.broker, run_id, "q_t", {})
    drain = reader(app, "tests.support.reader_handlers:book_trade_held", batch_size=10,
                   idle_exit=3.0)
    drain.attempt_log = AttemptLog(app.broker, run_id, 0, 0)
    # The reader stops at its 45th trade, inside its fifth transaction, while the database
    # goes away.
    HOLD.arm(after=45)
    with ThreadPoolExecutor(1) as pool, caplog.at_level(logging.INFO):
        running = pool.submit(drain.run)
        try:
            assert HOLD.holding.wait(timeout=120), "the reader did not get to its 45th trade"
            assert booked(app) < 45  # its batch in flight is not committed
            database_fault()
        finally:
            HOLD.released.set()
        stats = running.result(timeout=300)
    assert booked(app) == 600
    assert (stats.processed, stats.failed, stats.quarantined) == (600, 0, 0)
    summary = runs.run_summary(app.broker, run_id)
    assert (summary["received"], summary["processed"], summary["failed_readers"]) == (
        600, 600, [])
    with app.broker.transaction() as tx:
        sequences = tx.conn.execute(
            "SELECT array_agg(sequence ORDER BY booked) FROM public.results"
            " GROUP BY conversation_handle").fetchall()
    assert all(row[0] == sorted(row[0]) for row in sequences)
    assert any("reader of q_t reconnected to PostgreSQL" in r.getMessage()
               for r in caplog.records)
