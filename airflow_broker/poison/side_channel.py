"""A connection of a Broker's own for statements that must outlive the caller's transaction:
poison detection's record of a receiving transaction, and the resolution of a rolled-back one.

The record is posted, not awaited: RECEIVE returns as soon as the statement has been written to
the server, and its answer is read before the channel's next statement. Waiting for it cost a
round trip and the server's work on every RECEIVE. Once written, the statement runs even when
this process is killed the next instant (the server reads what was sent before it sees the
connection close), which is the case poison detection exists for. A connection the server
ended is found out before the next record goes out on it; a record whose connection is lost
before its answer came is sent again on the next one.
"""

from __future__ import annotations

import logging
import select
import threading
from collections.abc import Sequence

import psycopg
from psycopg import pq, sql
from psycopg.rows import TupleRow

from airflow_broker.reconnect import Outage, usable

log = logging.getLogger(__name__)

_FAILED = "a statement of poison detection's side connection failed: %s"


# A statement for the side connection: its text and, when it is sent as a prepared statement,
# the statement's name and its values in text.
_Statement = tuple[bytes, tuple[bytes, Sequence[bytes]] | None]


class SideChannel:
    """One connection of a Broker's own, in autocommit, for statements posted or run outside
    the caller's transaction."""

    def __init__(self, dsn: str, application_name: str, role: str | None) -> None:
        self.dsn = dsn
        self.application_name = application_name
        self.role = role
        self._conn: psycopg.Connection[TupleRow] | None = None
        # The statement posted last, until its answer is read: sent again on a new connection
        # when the one it went out on is lost first, since the server may never have run it.
        self._pending: _Statement | None = None
        # The statements prepared on the current connection.
        self._prepared: set[bytes] = set()
        self._lock = threading.Lock()
        self._outage = Outage("poison detection's side connection", logger=log)

    def post_prepared(self, name: bytes, query: bytes, params: Sequence[bytes]) -> None:
        """Sends ``query`` as the prepared statement ``name`` (prepared on its first use on
        each connection; the server neither parses nor plans it again, which was a quarter of
        a record's cost to its backend) with the text values ``params``, without waiting for
        its answer. An error in it is logged. Statements posted this way must have the same
        effect when run twice: one whose connection is lost before its answer is read is
        sent again."""
        self._on_connection((query, (name, tuple(params))), wait=False)

    def run(self, query: bytes) -> None:
        """Runs ``query`` and waits for it (and for anything posted before it)."""
        self._on_connection((query, None), wait=True)

    def close(self) -> None:
        with self._lock:
            try:
                if self._conn is not None and not self._conn.closed:
                    self._collect(self._conn)
            except psycopg.OperationalError as exc:
                log.error(_FAILED, exc)
            finally:
                self._forget()
                self._pending = None

    def _on_connection(self, statement: _Statement, *, wait: bool) -> None:
        with self._lock:
            sent = False
            for attempt in (1, 2):
                try:
                    conn = self._connection()
                    self._collect(conn)
                    if not sent:
                        # Once sent, a retry finds it pending and _connection() sends it again.
                        sent = True
                        self._send(conn, statement)
                    if wait:
                        self._collect(conn)
                    self._outage.recovered()
                    return
                except psycopg.OperationalError as exc:
                    self._forget()
                    if attempt == 2:
                        # The server is away: this record is lost (the caller's own
                        # statements fail too), logged once an outage.
                        self._outage.failed(exc)
                        log.debug(_FAILED, exc)
                        self._pending = None

    def _send(self, conn: psycopg.Connection[TupleRow], statement: _Statement) -> None:
        query, prepared = statement
        # Pending before it is sent: a send that fails sends it again on the next connection.
        self._pending = statement
        pgconn = conn.pgconn
        if prepared is None:
            pgconn.send_query(query)
            return
        name, params = prepared
        if name not in self._prepared:
            result = pgconn.prepare(name, query)
            if result.status == pq.ExecStatus.FATAL_ERROR:
                self._pending = None
                if pgconn.status != pq.ConnStatus.OK:
                    raise psycopg.OperationalError("the side connection was lost")
                message = (result.error_message or b"").decode(errors="replace").strip()
                log.error(_FAILED, message)
                return
            self._prepared.add(name)
        # Blocking mode: returns once every byte is written.
        pgconn.send_query_prepared(name, list(params))

    def _connection(self) -> psycopg.Connection[TupleRow]:
        conn = self._conn
        # A connection the server ended while idle (a restart, pg_terminate_backend) is only
        # found out by reading from it: before a statement goes out on it, not after.
        if (conn is not None and not conn.closed and not conn.broken and self._pending is None
                and not usable(conn)):
            raise psycopg.OperationalError("the side connection was lost")
        if conn is None or conn.closed or conn.broken:
            self._forget()
            conn = psycopg.connect(self.dsn, autocommit=True,
                                   application_name=f"{self.application_name}-side")
            # Losing a record in a server crash only loses a count; no fsync wait.
            conn.execute("SET synchronous_commit = off")
            if self.role:
                conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(self.role)))
            self._conn = conn
            if self._pending is not None:
                # The statement whose answer never came, before anything newer.
                statement, self._pending = self._pending, None
                self._send(conn, statement)
                self._collect(conn)
        return conn

    def _collect(self, conn: psycopg.Connection[TupleRow]) -> None:
        """Reads the answer of the statement posted last, if it has not been read yet."""
        if self._pending is None:
            return
        pgconn = conn.pgconn
        pgconn.consume_input()
        while pgconn.is_busy():
            # Wait for the socket outside libpq, so that other threads run meanwhile.
            select.select([pgconn.socket], [], [])
            pgconn.consume_input()
        while (result := pgconn.get_result()) is not None:
            if result.status == pq.ExecStatus.FATAL_ERROR:
                if pgconn.status != pq.ConnStatus.OK:
                    raise psycopg.OperationalError("the side connection was lost")
                message = (result.error_message or b"").decode(errors="replace").strip()
                log.error(_FAILED, message)
        if pgconn.status != pq.ConnStatus.OK:
            raise psycopg.OperationalError("the side connection was lost")
        self._pending = None

    def _forget(self) -> None:
        """Drops the connection; what is pending stays, to be sent again."""
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self._prepared = set()
