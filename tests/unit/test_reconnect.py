"""The reconnect policy on its own: delays, and what it logs for one outage."""

from __future__ import annotations

import logging
import threading

import psycopg
import pytest

from airflow_broker.reconnect import Outage, connection_lost, retry_while_disconnected


def lost() -> psycopg.OperationalError:
    return psycopg.OperationalError("server closed the connection unexpectedly")


def test_one_warning_and_one_line_per_outage(caplog: pytest.LogCaptureFixture) -> None:
    outage = Outage("the listener", initial=0.5, maximum=4.0)
    with caplog.at_level(logging.DEBUG, logger="airflow_broker.reconnect"):
        delays = [outage.failed(lost()) for _ in range(6)]
        outage.recovered()
        outage.recovered()  # nothing more: the outage is over
        outage.failed(lost())  # a second outage
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    by_level = [(r.levelname, r.getMessage()) for r in caplog.records
                if r.levelno >= logging.INFO]
    assert by_level == [
        ("WARNING", "the listener lost its connection to PostgreSQL (server closed the "
                    "connection unexpectedly); reconnecting"),
        ("INFO", by_level[1][1]),
        ("WARNING", by_level[0][1]),
    ]
    assert by_level[1][1].startswith("the listener reconnected to PostgreSQL after ")
    assert by_level[1][1].endswith("(6 failed attempts)")
    assert outage.failed(lost()) == 1.0  # the second outage starts from the initial delay


def test_a_failed_statement_is_not_a_lost_connection() -> None:
    assert connection_lost(lost())
    assert connection_lost(psycopg.errors.AdminShutdown("terminating connection"))
    assert not connection_lost(psycopg.errors.QueryCanceled("statement timeout"))
    assert not connection_lost(psycopg.errors.DeadlockDetected("deadlock"))
    assert not connection_lost(ValueError("not a database error"))


def test_a_multi_line_error_is_logged_on_one_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="airflow_broker.reconnect"):
        Outage("the stream").failed(psycopg.OperationalError(
            "server closed the connection unexpectedly\n\tThis probably means the server"
            " terminated abnormally\n\tbefore or while processing the request."))
    assert [r.getMessage() for r in caplog.records] == [
        "the stream lost its connection to PostgreSQL (server closed the connection "
        "unexpectedly); reconnecting"]


def test_a_transaction_is_retried_after_a_lost_connection_and_nothing_else() -> None:
    tries: list[int] = []

    def attempt() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise lost()
        return "committed"

    quick = Outage("the producer", initial=0.001, maximum=0.001)
    assert retry_while_disconnected(attempt, quick) == "committed"
    assert len(tries) == 3 and not quick.ongoing

    def deadlocked() -> None:
        raise psycopg.errors.DeadlockDetected("deadlock detected")

    with pytest.raises(psycopg.errors.DeadlockDetected):
        retry_while_disconnected(deadlocked, quick)


def test_a_retry_ends_with_none_once_stopped() -> None:
    stop = threading.Event()

    def attempt() -> None:
        stop.set()  # e.g. the service shuts down while the server is away
        raise lost()

    assert retry_while_disconnected(attempt, Outage("x", initial=0.001), stop) is None
