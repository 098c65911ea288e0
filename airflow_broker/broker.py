"""The entry point: a Broker is a connection pool on one broker schema."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from airflow_broker import migrations
from airflow_broker.embedded import EmbeddedPostgres
from airflow_broker.errors import InvalidObjectName
from airflow_broker.messages import Message
from airflow_broker.poison.detection import SideChannel
from airflow_broker.transaction import Transaction
from airflow_broker.validation import MessageTypeInfo
from airflow_broker.waitfor import WakeUps

if TYPE_CHECKING:
    from airflow_broker._statements import StatementRunner

log = logging.getLogger(__name__)

DSN_ENV = "AIRFLOW_BROKER_DSN"
SCHEMA_ENV = "AIRFLOW_BROKER_SCHEMA"


def resolve_dsn(dsn: str | None = None) -> str | None:
    return dsn or os.environ.get(DSN_ENV) or None


@dataclass
class BrokerStats:
    """What this process did through this Broker (activated readers report it)."""

    received: int = 0
    rollbacks: int = 0


class Broker:
    """A Service Broker on PostgreSQL.

    ``Broker(dsn)`` connects to any PostgreSQL; with no DSN (argument or AIRFLOW_BROKER_DSN)
    it starts, or reuses, the embedded PostgreSQL under the user's data directory.

    >>> with Broker() as broker:
    ...     broker.install()
    ...     with broker.transaction() as tx:
    ...         handle = tx.begin_dialog("TraderService", "BrokerageService", "TradeContract")
    ...         tx.send(handle, "TradeEntry", "<trade/>")
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        schema: str | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        min_connections: int = 1,
        max_connections: int = 10,
        poll_interval: float = 0.5,
        application_name: str = "airflow-broker",
        role: str | None = None,
    ) -> None:
        self.schema = schema or os.environ.get(SCHEMA_ENV) or "broker"
        self.embedded: EmbeddedPostgres | None = None
        resolved = resolve_dsn(dsn)
        if resolved is None:
            self.embedded = EmbeddedPostgres(None if data_dir is None else os.fspath(data_dir))
            resolved = self.embedded.ensure_database()
        self.dsn = resolved
        self.role = role
        self.application_name = application_name
        self.poll_interval = poll_interval
        self.stats = BrokerStats()
        self.pool: ConnectionPool[psycopg.Connection[TupleRow]] = ConnectionPool(
            self.dsn,
            min_size=min_connections,
            max_size=max_connections,
            open=True,
            name=f"airflow-broker-{self.schema}",
            kwargs={"application_name": application_name},
            configure=self._configure if role else None,
        )
        self.wakeups = WakeUps(self.dsn, self.schema)
        self._calls: dict[tuple[str, int, tuple[str, ...]], bytes] = {}
        self._message_types: dict[str, MessageTypeInfo | None] = {}
        self._queue_ids: dict[str, int] = {}
        self._lock = threading.Lock()
        # Poison detection's records, which must survive the caller's rollback.
        self.side = SideChannel(self.dsn, application_name, role)
        self._register_call = sql.SQL("SELECT {}.register_receive").format(
            sql.Identifier(self.schema)).as_bytes(None)
        schema_id = sql.Identifier(self.schema)
        self.receive_query = sql.SQL(
            "SELECT r.*, pg_current_xact_id_if_assigned()::text, q.object_id,"
            " q.is_poison_message_handling_enabled"
            " FROM {schema}.receive(%s::text, %s::bigint, %s::uuid, %s::uuid) r,"
            " {schema}.find_queue(%s::text) q"
        ).format(schema=schema_id).as_bytes(None)

    def _configure(self, conn: psycopg.Connection[TupleRow]) -> None:
        # EXECUTE AS: every statement of this Broker runs as the role.
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(self.role or "")))
        conn.commit()

    def install(self, *, up_to: str | None = None) -> migrations.InstallReport:
        """Creates or upgrades the broker schema (idempotent)."""
        report = migrations.install(self.dsn, self.schema, up_to=up_to)
        self.forget_message_types()
        return report

    @contextmanager
    def _autocommit_connection(self) -> Iterator[psycopg.Connection[TupleRow]]:
        """A pooled connection in autocommit mode, back to psycopg's default when returned.
        Not through the pool's reset callback: with one, the pool hands every returned
        connection to a worker thread, and the next checkout waits for that thread."""
        with self.pool.connection() as conn:
            conn.autocommit = True
            try:
                yield conn
            finally:
                if conn.info.transaction_status == TransactionStatus.IDLE:
                    conn.autocommit = False
                # Otherwise the connection broke (its ROLLBACK failed too), and the pool
                # discards it.

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """A pooled connection in a transaction that commits when the block ends normally and
        rolls back when it raises."""
        with self._autocommit_connection() as conn:
            # BEGIN, COMMIT and ROLLBACK are ours: BEGIN travels with the first statement.
            tx = Transaction(conn, self, begin=True)
            try:
                yield tx
                if tx.begun:
                    # commit() sends a bare COMMIT, without execute()'s cursor and preparing.
                    conn.commit()
            except BaseException:
                if conn.info.transaction_status in (TransactionStatus.INTRANS,
                                                    TransactionStatus.INERROR):
                    # (A broken connection raises here; the pool discards it.)
                    with contextlib.suppress(psycopg.OperationalError):
                        conn.execute(b"ROLLBACK")
                if tx.received_queues:
                    # A rolled-back receive counts towards poison detection at once.
                    self.stats.rollbacks += 1
                    self.resolve_receives(tx.received_queues)
                raise

    def register_receive(self, queue_id: int, xid: str, message_ids: list[uuid.UUID],
                         backend_pid: int) -> None:
        # Rendered by hand: every value is an integer or a UUID (nothing to quote), and
        # psycopg's adaptation of a UUID array cost more than the rest of the call.
        ids = ",".join(str(m) for m in message_ids)
        self.side.post(
            b"%s(%d, '%d'::xid8, '{%s}'::uuid[], %d)"
            % (self._register_call, int(queue_id), int(xid), ids.encode(), int(backend_pid)))

    def resolve_receives(self, queue_ids: set[int]) -> None:
        for queue_id in sorted(queue_ids):
            self.side.run(sql.SQL("SELECT {}.resolve_receives({})").format(
                sql.Identifier(self.schema), int(queue_id)).as_bytes(None))

    def receive(
        self,
        queue_name: str,
        top: int | None = None,
        *,
        conversation_handle: uuid.UUID | None = None,
        conversation_group_id: uuid.UUID | None = None,
        waitfor: bool = False,
        timeout: float | None = None,
    ) -> list[Message]:
        """RECEIVE outside a transaction (autocommit, as a RECEIVE statement outside BEGIN
        TRANSACTION in SQL Server): one statement, one round trip, and the messages are gone
        from the queue when it returns. If processing them fails, they are not received again,
        and poison detection has nothing to count. For exactly-once processing, RECEIVE inside
        ``transaction()`` and commit with your work."""
        with self._autocommit_connection() as conn:
            return Transaction(conn, self).receive(
                queue_name, top, conversation_handle=conversation_handle,
                conversation_group_id=conversation_group_id, waitfor=waitfor, timeout=timeout)

    def session(self, conn: psycopg.Connection[TupleRow]) -> Transaction:
        """Broker statements on a connection you manage (your transaction, your commit)."""
        return Transaction(conn, self)

    def close(self) -> None:
        self.wakeups.close()
        self.pool.close()
        self.side.close()
        if self.embedded is not None:
            self.embedded.release()
            self.embedded = None

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def now(self) -> dt.datetime:
        """The broker clock (UTC): what every time-based rule reads."""
        with self.pool.connection() as conn:
            row = conn.execute(
                sql.SQL("SELECT {}.utc_now()").format(sql.Identifier(self.schema))).fetchone()
        assert row is not None
        value: dt.datetime = row[0]
        return value

    @property
    def broker_instance(self) -> uuid.UUID:
        """This broker's instance id (SQL Server's service_broker_guid); NEW_BROKER changes
        it."""
        with self.pool.connection() as conn:
            row = conn.execute(sql.SQL("SELECT service_broker_guid FROM {}.broker_identity")
                               .format(sql.Identifier(self.schema))).fetchone()
        assert row is not None
        value: uuid.UUID = row[0]
        return value

    def advance_clock(self, by: dt.timedelta) -> dt.datetime:
        """Moves the broker clock forward (tests, and rehearsing timeouts)."""
        with self.pool.connection() as conn:
            row = conn.execute(
                sql.SQL("SELECT {}.advance_clock(%s)").format(sql.Identifier(self.schema)),
                [by]).fetchone()
        assert row is not None
        value: dt.datetime = row[0]
        return value

    # Shared by the statements of every Transaction of this Broker.

    def rendered_call(self, name: str, arity: int, casts: Sequence[str] | None) -> bytes:
        key = (name, arity, tuple(casts or ()))
        text = self._calls.get(key)
        if text is None:
            # Lists of bytes go in binary: psycopg's text format escapes each element in
            # Python (389 µs for 100 bodies of 100 bytes, against 25 µs in binary).
            args = [
                sql.SQL("{}::{}").format(
                    sql.SQL("%b" if cast == "bytea[]" else "%s"), sql.SQL(cast)
                ) if cast else sql.SQL("%s")
                for cast in (casts or [""] * arity)
            ]
            query = sql.SQL("SELECT * FROM {}.{}({})").format(
                sql.Identifier(self.schema), sql.Identifier(name), sql.SQL(", ").join(args)
            )
            text = query.as_bytes(None)
            self._calls[key] = text
        return text

    def message_type_info(self, runner: StatementRunner, name: str) -> MessageTypeInfo | None:
        with self._lock:
            if name in self._message_types:
                return self._message_types[name]
        rows = runner.run(
            sql.SQL(
                "SELECT t.validation_kind, t.xml_collection_id, c.schemas"
                " FROM {schema}.message_types t"
                " LEFT JOIN {schema}.xml_schema_collections c USING (xml_collection_id)"
                " WHERE t.name = %s"
            ).format(schema=sql.Identifier(self.schema)),
            [name],
        )
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
        with self._lock:
            known = self._queue_ids.get(queue_name)
        if known is not None:
            return known
        found = runner.scalar(
            sql.SQL("SELECT object_id FROM {}.find_queue(%s)").format(
                sql.Identifier(self.schema)
            ),
            [queue_name],
        )
        if found is None:
            raise InvalidObjectName(f"Invalid object name '{queue_name}'.")
        with self._lock:
            self._queue_ids[queue_name] = int(found)
        return int(found)
