"""What every broker statement shares: the caller's connection, the schema, and the mapping of
database errors to BrokerError."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.pq import ExecStatus, TransactionStatus
from psycopg.rows import TupleRow

from airflow_broker.errors import translate

TUPLES_OK = ExecStatus.TUPLES_OK

if TYPE_CHECKING:
    from airflow_broker.broker import Broker
    from airflow_broker.messages import Message


class StatementRunner:
    """Runs broker functions on one connection, inside the caller's transaction."""

    def __init__(self, conn: psycopg.Connection[TupleRow], broker: Broker, *,
                 begin: bool = False) -> None:
        self._conn = conn
        # Broker.transaction() hands over an autocommit connection: BEGIN goes out with the
        # first statement, saving the round trip psycopg spends on BEGIN alone.
        self._begin_pending = begin
        self.broker = broker
        self.schema = broker.schema
        # Groups locked inside each open savepoint(), innermost last.
        self._savepoint_groups: list[set[uuid.UUID]] = []
        # Queues this transaction received from (resolved for poison detection on rollback).
        self.received_queues: set[int] = set()

    @property
    def conn(self) -> psycopg.Connection[TupleRow]:
        """The connection, in this transaction: your own statements on it commit or roll back
        with the broker's."""
        if self._begin_pending:
            self._begin_pending = False
            self._conn.execute(b"BEGIN")
        return self._conn

    @property
    def begun(self) -> bool:
        """Whether a statement has been sent in this transaction."""
        return not self._begin_pending

    def locked_groups(self, groups: set[uuid.UUID]) -> None:
        """Remembers groups a statement locked, so a savepoint rollback can keep them."""
        if self._savepoint_groups:
            self._savepoint_groups[-1].update(groups)

    def received_from(
        self, queue_id: int, xid: str, messages: list[Message], poison_handling: bool
    ) -> None:
        """Registers a receiving transaction for poison-message detection, on the Broker's own
        connection so that the record survives this transaction's rollback."""
        self.broker.stats.received += len(messages)
        if self._conn.info.transaction_status == TransactionStatus.IDLE:
            # An autocommit RECEIVE has committed already: nothing can roll it back.
            return
        self.received_queues.add(queue_id)
        if poison_handling:
            self.broker.register_receive(queue_id, xid, [m.message_id for m in messages],
                                         self._conn.info.backend_pid)

    def function(self, name: str, arity: int, casts: Sequence[str] | None = None) -> bytes:
        """``SELECT schema.name(%s, ...)`` rendered once per schema, function and arity, so the
        text stays identical and psycopg prepares it after a few calls."""
        return self.broker.rendered_call(name, arity, casts)

    def run(self, query: bytes | sql.SQL | sql.Composed,
            params: Sequence[Any] = ()) -> list[TupleRow]:
        try:
            if self._begin_pending:
                self._begin_pending = False
                # One round trip: the cursor's results are read when the pipeline ends.
                with self._conn.pipeline():
                    self._conn.execute(b"BEGIN")
                    cursor = self._conn.execute(query, params)
            else:
                cursor = self._conn.execute(query, params)
            # Not cursor.description, which builds a Column object per column on every call.
            result = cursor.pgresult
            return cursor.fetchall() if result is not None and result.status == TUPLES_OK else []
        except psycopg.Error as exc:
            broker_error = translate(exc)
            if broker_error is not None:
                raise broker_error from None
            raise

    def scalar(self, query: bytes | sql.SQL | sql.Composed, params: Sequence[Any] = ()) -> Any:
        rows = self.run(query, params)
        return rows[0][0] if rows else None
