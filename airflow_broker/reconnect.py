"""How every long-lived connection of the project survives a lost server: a PostgreSQL restart,
a terminated backend, a failover.

A connection the server ended while it sat idle is not marked ``closed`` or ``broken`` until
something reads from it; :func:`usable` reads what the server sent meanwhile (without a round
trip) and so finds it out before a statement goes out on it. :class:`Outage` is the one
reconnect policy: delays that double from ``initial`` up to ``maximum`` while the server stays
away, one warning when an outage starts and one line when it is over, whatever the number of
attempts in between. :func:`connection_lost` tells a lost connection from other operational
errors (a cancelled statement, a deadlock), which are the caller's to handle.
"""

from __future__ import annotations

import asyncio
import logging
import select
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, overload

import psycopg
from psycopg import pq

log = logging.getLogger(__name__)

T = TypeVar("T")

# SQLSTATEs of a session the server ended: admin_shutdown (pg_terminate_backend, a fast
# shutdown), crash_shutdown, cannot_connect_now (starting up, in recovery); class 08 is
# connection_exception.
_LOST_STATES = frozenset({"57P01", "57P02", "57P03"})


class Logger(Protocol):
    """What the policy logs to: a logging.Logger, or the logger of an Airflow trigger."""

    def debug(self, msg: str, /, *args: Any) -> Any: ...
    def info(self, msg: str, /, *args: Any) -> Any: ...
    def warning(self, msg: str, /, *args: Any) -> Any: ...


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection is gone (or none could be made), as opposed to a
    statement that failed on a working connection."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in _LOST_STATES


def usable(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether an idle connection is still open at the server. Reads, without blocking or a
    round trip, whatever the server sent since the last statement: a terminated or restarted
    backend sends its FATAL message, then closes the socket, and reading up to that end marks
    the connection bad. On a healthy idle connection this costs one poll of its socket."""
    if conn.closed or conn.broken:
        return False
    pgconn = conn.pgconn
    try:
        # The farewell and the end of the stream may take a read each (libpq keeps an
        # unexpected message of an idle session as a notice, and stops at the first read
        # that returned bytes).
        for _ in range(4):
            if not _readable(pgconn.socket):
                break
            pgconn.consume_input()
            if pgconn.status != pq.ConnStatus.OK:
                return False
    except (psycopg.OperationalError, OSError):
        return False
    return pgconn.status == pq.ConnStatus.OK


def _readable(fd: int) -> bool:
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    ready, _, _ = select.select([fd], [], [], 0)
    return bool(ready)


def check(conn: psycopg.Connection[Any]) -> None:
    """A pool's ``check``: raises for a connection :func:`usable` rejects."""
    if not usable(conn):
        raise psycopg.OperationalError("the connection was closed by the server")


def _first_line(exc: BaseException) -> str:
    """libpq's messages run over several lines; a log line takes the first."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


class Outage:
    """The reconnect policy of one connection (or one pool): call :meth:`failed` with each
    error that lost it (it returns how long to wait before the next attempt) and
    :meth:`recovered` once a statement went through again.

    The first failure of an outage logs a warning naming ``what`` and the error, the end of
    the outage an info line with its length and the attempts it took; failures in between are
    logged at debug level only.
    """

    def __init__(self, what: str, *, initial: float = 0.5, maximum: float = 30.0,
                 logger: Logger | None = None) -> None:
        self.what = what
        self.initial = initial
        self.maximum = maximum
        self.log: Logger = logger or log
        self._lock = threading.Lock()
        self._started: float | None = None
        self._attempts = 0
        self._delay = initial

    @property
    def ongoing(self) -> bool:
        return self._started is not None

    def failed(self, exc: BaseException) -> float:
        """Records a failure; returns the seconds to wait before trying again."""
        with self._lock:
            self._attempts += 1
            if self._started is None:
                self._started = time.monotonic()
                self._delay = self.initial
                self.log.warning("%s lost its connection to PostgreSQL (%s); reconnecting",
                                 self.what, _first_line(exc))
            else:
                self.log.debug("%s: still no connection (%s)", self.what, _first_line(exc))
            delay = self._delay
            self._delay = min(self._delay * 2, self.maximum)
            return delay

    def recovered(self) -> None:
        """Records that the connection works (again); logs the end of an outage. Costs nothing
        outside an outage, so callers may call it after every statement."""
        if self._started is None:
            return
        with self._lock:
            if self._started is None:
                return
            self.log.info("%s reconnected to PostgreSQL after %.1f s (%d failed attempt%s)",
                          self.what, time.monotonic() - self._started, self._attempts,
                          "" if self._attempts == 1 else "s")
            self._started = None
            self._attempts = 0
            self._delay = self.initial

    def wait(self, exc: BaseException, stop: threading.Event | None = None) -> None:
        """:meth:`failed`, then sleeps for the delay (cut short by ``stop``)."""
        delay = self.failed(exc)
        if stop is None:
            time.sleep(delay)
        else:
            stop.wait(delay)

    async def await_retry(self, exc: BaseException) -> None:
        """:meth:`failed`, then sleeps for the delay without blocking the event loop."""
        await asyncio.sleep(self.failed(exc))


@overload
def retry_while_disconnected(attempt: Callable[[], T], outage: Outage | str,
                             stop: None = None) -> T: ...
@overload
def retry_while_disconnected(attempt: Callable[[], T], outage: Outage | str,
                             stop: threading.Event) -> T | None: ...
def retry_while_disconnected(attempt: Callable[[], T], outage: Outage | str,
                             stop: threading.Event | None = None) -> T | None:
    """Runs ``attempt`` (a whole transaction: ``with broker.transaction() as tx: ...``) again
    after each lost connection, waiting as ``outage`` (or an Outage named so) says, until it
    goes through: the application-level retry of a restart or a failover. Errors other than a
    lost connection are raised. None only when ``stop`` is set first.

    Retry only what may run twice: a transaction whose COMMIT was lost may have committed
    (docs/airflow.md, "Database faults", says how to tell).
    """
    policy = Outage(outage) if isinstance(outage, str) else outage
    while stop is None or not stop.is_set():
        try:
            result = attempt()
        except psycopg.OperationalError as exc:
            if not connection_lost(exc):
                raise
            policy.wait(exc, stop)
            continue
        policy.recovered()
        return result
    return None
