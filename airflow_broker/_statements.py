"""What every broker statement shares: the runner of statements on the caller's connection, the
state shared by the Transactions of one Broker (rendered statements, catalogue caches, WAITFOR
wake-ups, poison detection), and the mapping of database errors to BrokerError.

The runner is the engine's: its COMMIT, its raw statements and its pipeline are never public
names of a Transaction, which holds it privately (``runner_of``)."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

import psycopg
from psycopg import sql
from psycopg.pq import ExecStatus, TransactionStatus
from psycopg.rows import TupleRow

from airflow_broker.errors import InvalidObjectName, SchemaValidationNeedsPython, translate
from airflow_broker.queries import Queries
from airflow_broker.validation import MessageTypeInfo
from airflow_broker.waitfor import WakeUps

TUPLES_OK = ExecStatus.TUPLES_OK


@dataclass
class BrokerStats:
    """What this process did through one Broker (activated readers report it)."""

    received: int = 0
    rollbacks: int = 0


class ReceiveRecorder(Protocol):
    """Poison-message detection as the statements call it: RECEIVE hands it every receive, to
    be recorded where the transaction's rollback cannot undo it. The Broker gives Shared the
    implementation (``airflow_broker.poison.detection.PoisonDetection``), which builds on this
    module: the statements call the layer above without importing it."""

    def received(self, runner: StatementRunner, queue_id: int, xid: str,
                 message_ids: Sequence[uuid.UUID], poison_handling: bool) -> None: ...


class Shared:
    """What the Transactions of one Broker share: its schema's queries, the catalogue caches,
    WAITFOR wake-ups, poison detection and the counts of what was done."""

    def __init__(self, queries: Queries, wakeups: WakeUps, poison: ReceiveRecorder,
                 poll_interval: float) -> None:
        self.queries = queries
        self.wakeups = wakeups
        self.poison = poison
        self.poll_interval = poll_interval
        self.stats = BrokerStats()
        # Message types are forgotten by this Broker's DDL; queue ids are never kept (a
        # queue dropped and created again by another process gets a new id, which a long-lived
        # process would not see), so WAITFOR and expect_receive look them up each time.
        self._message_types: dict[str, MessageTypeInfo | None] = {}
        self._lock = threading.Lock()

    def message_type_info(self, runner: StatementRunner, name: str) -> MessageTypeInfo | None:
        with self._lock:
            if name in self._message_types:
                return self._message_types[name]
        rows = runner.run(self.queries["message_type_validation"], [name])
        info = None
        if rows:
            kind, collection_id, schemas = rows[0]
            info = MessageTypeInfo(name, kind, collection_id, tuple(schemas or ()))
        with self._lock:
            self._message_types[name] = info
        return info

    def forget_message_types(self) -> None:
        with self._lock:
            self._message_types.clear()

    def queue_id(self, runner: StatementRunner, queue_name: str) -> int:
        """The queue's id as of now: one statement, made only before a WAITFOR waits."""
        found = runner.scalar(self.queries["queue_id"], [queue_name])
        if found is None:
            raise InvalidObjectName(f"Invalid object name '{queue_name}'.")
        return int(found)


class StatementRunner:
    """Runs broker functions on one connection, inside the caller's transaction."""

    def __init__(self, conn: psycopg.Connection[TupleRow], shared: Shared, *,
                 begin: bool = False) -> None:
        self._conn = conn
        # Broker.transaction() hands over an autocommit connection: BEGIN goes out with the
        # first statement, saving the round trip psycopg spends on BEGIN alone.
        self._begin_pending = begin
        self.shared = shared
        self.queries = shared.queries
        self.schema = shared.queries.schema
        # Groups locked inside each open savepoint(), innermost last.
        self._savepoint_groups: list[set[uuid.UUID]] = []
        # Queues this transaction received from, filled in by poison detection, which resolves
        # them when the transaction rolls back.
        self.received_queues: set[int] = set()
        # In a pipelined transaction: psycopg's pipeline, and the posted statements whose
        # answers are still to be handed to their callbacks.
        self._pipeline: psycopg.Pipeline | None = None
        self._deferred: list[tuple[psycopg.Cursor[TupleRow], Callable[[list[TupleRow]], None]]] = []

    @property
    def conn(self) -> psycopg.Connection[TupleRow]:
        """The connection, in this transaction: your own statements on it commit or roll back
        with the broker's."""
        if self._begin_pending:
            self._begin_pending = False
            self._conn.execute(b"BEGIN")
        return self._conn

    @property
    def pipelining(self) -> bool:
        """Whether this transaction's statements run in pipeline mode
        (``Broker.transaction(pipeline=True)``)."""
        return self._pipeline is not None

    @property
    def begun(self) -> bool:
        """Whether a statement has been sent in this transaction."""
        return not self._begin_pending

    def locked_groups(self, groups: set[uuid.UUID]) -> None:
        """Remembers groups a statement locked, so a savepoint rollback can keep them."""
        if self._savepoint_groups:
            self._savepoint_groups[-1].update(groups)

    @property
    def in_transaction(self) -> bool:
        """Whether the statements so far are in a transaction that can still roll back (an
        autocommit statement has committed when it returns)."""
        # In pipeline mode libpq reports the status of the last Sync, from before this
        # transaction's BEGIN: a pipelined transaction is always one.
        return (self._pipeline is not None
                or self._conn.info.transaction_status != TransactionStatus.IDLE)

    def function(self, name: str, arity: int, casts: Sequence[str] | None = None) -> bytes:
        """``SELECT schema.name(%s, ...)`` rendered once per schema, function and arity, so the
        text stays identical and psycopg prepares it after a few calls."""
        return self.queries.call(name, arity, casts)

    def run(self, query: bytes | sql.SQL | sql.Composed,
            params: Sequence[Any] = ()) -> list[TupleRow]:
        try:
            if self._pipeline is not None:
                # A pending BEGIN is queued ahead by self.conn; fetching sends what is queued
                # with this statement and reads every answer up to its.
                rows = self.conn.execute(query, params).fetchall()
                self._settle_deferred()
                return rows
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
            self._raise_translated(exc)

    def post(self, query: bytes | sql.SQL | sql.Composed, params: Sequence[Any] = (),
             then: Callable[[list[TupleRow]], None] | None = None) -> None:
        """A statement whose answer the caller does not wait for. In a pipelined transaction
        it is queued and travels with the next statement that has an answer, or with the
        COMMIT; ``then`` sees its rows once they are back."""
        if self._pipeline is None:
            rows = self.run(query, params)
            if then is not None:
                then(rows)
            return
        try:
            cursor = self.conn.execute(query, params)
        except psycopg.Error as exc:
            self._raise_translated(exc)
        if then is not None:
            self._deferred.append((cursor, then))

    def _settle_deferred(self) -> None:
        """Hands the answers of posted statements that are back to their ``then``."""
        waiting = []
        for cursor, then in self._deferred:
            result = cursor.pgresult
            if result is None:
                waiting.append((cursor, then))
            elif result.status == TUPLES_OK:
                then(cursor.fetchall())
        self._deferred = waiting

    @contextmanager
    def pipelined(self) -> Iterator[None]:
        """The block's statements in psycopg's pipeline mode, ending with ``commit()``."""
        try:
            with self._conn.pipeline() as pipeline:
                self._pipeline = pipeline
                try:
                    yield
                except BaseException:
                    # Reads what is still queued, and the error that aborted the pipeline,
                    # here, rather than have the pipeline's exit log it as a warning.
                    with contextlib.suppress(psycopg.Error):
                        pipeline.sync()
                    raise
                finally:
                    self._pipeline = None
            self._settle_deferred()
        except psycopg.Error as exc:
            self._raise_translated(exc)

    def commit(self) -> None:
        """COMMIT; in a pipelined transaction, queued with the statements still waiting, and
        sent with them when the pipeline ends: one round trip."""
        try:
            if self._pipeline is not None:
                self._conn.execute(b"COMMIT")
            else:
                # A bare COMMIT, without execute()'s cursor and preparing.
                self._conn.commit()
        except psycopg.Error as exc:
            self._raise_translated(exc)

    def sync(self) -> None:
        """In a pipelined transaction, sends what is queued and reads every answer (and
        error); otherwise nothing is waiting."""
        if self._pipeline is None:
            return
        try:
            self._pipeline.sync()
        except psycopg.Error as exc:
            self._raise_translated(exc)
        self._settle_deferred()

    def _raise_translated(self, exc: psycopg.Error) -> NoReturn:
        broker_error = translate(exc)
        if isinstance(broker_error, SchemaValidationNeedsPython):
            # The message type changed since it was cached: the next SEND reloads it.
            self.shared.forget_message_types()
        if broker_error is not None:
            raise broker_error from None
        raise exc

    def scalar(self, query: bytes | sql.SQL | sql.Composed, params: Sequence[Any] = ()) -> Any:
        rows = self.run(query, params)
        return rows[0][0] if rows else None


class Statements:
    """Base of the statement classes (catalog.py, permissions.py, dialogs.py, receive.py):
    their SQL goes through a runner they hold privately, so that a Transaction's public names
    are Service Broker's statements and nothing that could end or bypass its transaction."""

    # No __dict__: a Transaction is made for every transaction, and has nothing else to hold.
    __slots__ = ("_runner",)

    def __init__(self, runner: StatementRunner) -> None:
        self._runner = runner


def runner_of(statements: Statements) -> StatementRunner:
    """The runner behind a Transaction, for the engine's own modules (readers, poison
    detection, the worker, the provider): its own SQL in the transaction (``run``,
    ``scalar``, ``post``), the named queries and the schema. Never handed to a user."""
    return statements._runner
