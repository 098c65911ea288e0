"""A connection of a Broker's own for statements that must outlive the caller's transaction:
poison detection's record of a receiving transaction, and the resolution of a rolled-back one.

The record is posted, not awaited: RECEIVE returns as soon as the statement has been written to
the server, and its answer is read before the channel's next statement. Waiting for it cost a
round trip and the server's work on every RECEIVE. Once written, the statement runs even when
this process is killed the next instant (the server reads what was sent before it sees the
connection close), which is the case poison detection exists for.
"""

from __future__ import annotations

import logging
import select
import threading

import psycopg
from psycopg import pq, sql
from psycopg.rows import TupleRow

log = logging.getLogger(__name__)

_FAILED = "a statement of poison detection's side connection failed: %s"


class SideChannel:
    def __init__(self, dsn: str, application_name: str, role: str | None) -> None:
        self.dsn = dsn
        self.application_name = application_name
        self.role = role
        self._conn: psycopg.Connection[TupleRow] | None = None
        # Whether a posted statement's answer is still to be read.
        self._pending = False
        self._lock = threading.Lock()

    def post(self, query: bytes) -> None:
        """Sends ``query`` (one statement, its values inlined) without waiting for its
        answer; an error in it is logged."""
        self._on_connection(query, wait=False)

    def run(self, query: bytes) -> None:
        """Runs ``query`` and waits for it (and for anything posted before it)."""
        self._on_connection(query, wait=True)

    def close(self) -> None:
        with self._lock:
            try:
                if self._conn is not None and not self._conn.closed:
                    self._collect(self._conn)
            except psycopg.OperationalError as exc:
                log.error(_FAILED, exc)
            finally:
                self._forget()

    def _on_connection(self, query: bytes, *, wait: bool) -> None:
        with self._lock:
            for attempt in (1, 2):
                try:
                    conn = self._connection()
                    self._collect(conn)
                    if wait:
                        conn.execute(query)
                    else:
                        # Blocking mode: returns once every byte is written.
                        conn.pgconn.send_query(query)
                        self._pending = True
                    return
                except psycopg.OperationalError as exc:
                    self._forget()
                    if attempt == 2:
                        log.error(_FAILED, exc)

    def _connection(self) -> psycopg.Connection[TupleRow]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._forget()
            conn = psycopg.connect(self.dsn, autocommit=True,
                                   application_name=f"{self.application_name}-side")
            # Losing a record in a server crash only loses a count; no fsync wait.
            conn.execute("SET synchronous_commit = off")
            if self.role:
                conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(self.role)))
            self._conn = conn
        return self._conn

    def _collect(self, conn: psycopg.Connection[TupleRow]) -> None:
        """Reads the answer of the statement posted last, if it has not been read yet."""
        if not self._pending:
            return
        pgconn = conn.pgconn
        pgconn.consume_input()
        while pgconn.is_busy():
            # Wait for the socket outside libpq, so that other threads run meanwhile.
            select.select([pgconn.socket], [], [])
            pgconn.consume_input()
        while (result := pgconn.get_result()) is not None:
            if result.status == pq.ExecStatus.FATAL_ERROR:
                message = (result.error_message or b"").decode(errors="replace").strip()
                log.error(_FAILED, message)
        self._pending = False
        if pgconn.status != pq.ConnStatus.OK:
            raise psycopg.OperationalError("the side connection was lost")

    def _forget(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self._pending = False
