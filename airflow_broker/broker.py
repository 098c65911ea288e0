"""The entry point: a Broker is a connection pool on one broker schema."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from airflow_broker import migrations, reconnect
from airflow_broker._statements import BrokerStats, Shared, runner_of
from airflow_broker.embedded import EmbeddedPostgres
from airflow_broker.messages import Message
from airflow_broker.poison.detection import PoisonDetection
from airflow_broker.poison.side_channel import SideChannel
from airflow_broker.queries import DEFAULT_SCHEMA, Queries
from airflow_broker.transaction import Transaction
from airflow_broker.waitfor import WakeUps

log = logging.getLogger(__name__)

DSN_ENV = "AIRFLOW_BROKER_DSN"
SCHEMA_ENV = "AIRFLOW_BROKER_SCHEMA"


def resolve_dsn(dsn: str | None = None) -> str | None:
    return dsn or os.environ.get(DSN_ENV) or None


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
        self.schema = schema or os.environ.get(SCHEMA_ENV) or DEFAULT_SCHEMA
        self.embedded: EmbeddedPostgres | None = None
        resolved = resolve_dsn(dsn)
        if resolved is None:
            self.embedded = EmbeddedPostgres(None if data_dir is None else os.fspath(data_dir))
            resolved = self.embedded.ensure_database()
        self.dsn = resolved
        self.role = role
        self.application_name = application_name
        self.pool: ConnectionPool[psycopg.Connection[TupleRow]] = ConnectionPool(
            self.dsn,
            min_size=min_connections,
            max_size=max_connections,
            open=True,
            name=f"airflow-broker-{self.schema}",
            kwargs={"application_name": application_name},
            configure=self._configure if role else None,
            check=self._check,
            reconnect_failed=self._reconnect_failed,
        )
        self._outage = reconnect.Outage(f"broker pool {self.pool.name}", logger=log)
        self.queries = Queries(self.schema)
        # Poison detection's records, which must survive the caller's rollback, go out on a
        # connection of their own.
        self._poison = PoisonDetection(SideChannel(self.dsn, application_name, role),
                                       self.queries)
        self.shared = Shared(self.queries, WakeUps(self.dsn, self.schema), self._poison,
                             poll_interval)

    @property
    def poll_interval(self) -> float:
        """Seconds between a WAITFOR's polls, in case a wake-up is missed; one value, which
        every Transaction of this Broker reads."""
        return self.shared.poll_interval

    @poll_interval.setter
    def poll_interval(self, seconds: float) -> None:
        self.shared.poll_interval = seconds

    def _configure(self, conn: psycopg.Connection[TupleRow]) -> None:
        # Every statement of this Broker runs as the role, for what PostgreSQL checks itself
        # (the application's own tables in a handler's transaction). The broker's permissions
        # are the login's whatever the role (docs/security.md): log in as a role to be it.
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(self.role or "")))
        conn.commit()

    def _check(self, conn: psycopg.Connection[TupleRow]) -> None:
        """The pool's check of every connection it hands out, without a round trip: one the
        server ended while it sat in the pool (a restart, pg_terminate_backend, a failover) is
        replaced instead of failing the caller's first statement."""
        if reconnect.usable(conn):
            self._outage.recovered()
            return
        exc = psycopg.OperationalError("the server closed the pooled connection")
        self._outage.failed(exc)
        # The server that ended this one ended its idle neighbours too: replace them all now
        # (psycopg's own check, a round trip each), not one per checkout, each after a delay.
        self.pool.check()
        raise exc

    def _reconnect_failed(self, pool: ConnectionPool[psycopg.Connection[TupleRow]]) -> None:
        log.error("broker pool %s: PostgreSQL unreachable for %.0f s; the pool stops retrying "
                  "in the background and connects again on the next checkout", pool.name,
                  pool.reconnect_timeout)

    def install(self, *, up_to: str | None = None,
                owner: str | None = None) -> migrations.InstallReport:
        """Creates or upgrades the broker schema (idempotent); ``owner``: the role that owns
        it, whose rights the broker's functions run with (default: this login)."""
        report = migrations.install(self.dsn, self.schema, up_to=up_to, owner=owner)
        self.shared.forget_message_types()
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
    def transaction(self, *, pipeline: bool = False) -> Iterator[Transaction]:
        """A pooled connection in a transaction that commits when the block ends normally and
        rolls back when it raises.

        With ``pipeline``, statements whose answer you do not wait for (SEND, END
        CONVERSATION, MOVE CONVERSATION, the batch SEND) are queued and travel with the next
        statement that returns something, or with the COMMIT: a target's reply, its END and
        the COMMIT go to the server in one round trip. An error of a queued statement is
        raised by the statement that sends it, at the latest when the block ends, and the
        transaction rolls back as with any error. Your own statements on ``tx.conn`` run in
        psycopg's pipeline mode too.
        """
        with self._autocommit_connection() as conn:
            # BEGIN, COMMIT and ROLLBACK are ours: BEGIN travels with the first statement.
            tx = Transaction(conn, self.shared, begin=True)
            # Its runner, and with it COMMIT, is this block's alone: the Transaction the user
            # gets cannot end the transaction before the block does.
            runner = runner_of(tx)
            try:
                with runner.pipelined() if pipeline else contextlib.nullcontext():
                    yield tx
                    if runner.begun:
                        runner.commit()
            except BaseException:
                if conn.info.transaction_status in (TransactionStatus.INTRANS,
                                                    TransactionStatus.INERROR):
                    # (A broken connection raises here; the pool discards it.)
                    with contextlib.suppress(psycopg.OperationalError):
                        conn.execute(b"ROLLBACK")
                if runner.received_queues:
                    # A rolled-back receive counts towards poison detection at once.
                    self.stats.rollbacks += 1
                    self._poison.resolve(runner.received_queues)
                raise

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
            return Transaction(conn, self.shared).receive(
                queue_name, top, conversation_handle=conversation_handle,
                conversation_group_id=conversation_group_id, waitfor=waitfor, timeout=timeout)

    def session(self, conn: psycopg.Connection[TupleRow]) -> Transaction:
        """Broker statements on a connection you manage (your transaction, your commit)."""
        return Transaction(conn, self.shared)

    @property
    def stats(self) -> BrokerStats:
        """What this process did through this Broker (activated readers report it)."""
        return self.shared.stats

    def close(self) -> None:
        self.shared.wakeups.close()
        self.pool.close()
        self._poison.close()
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
            row = conn.execute(self.queries["utc_now"]).fetchone()
        assert row is not None
        value: dt.datetime = row[0]
        return value

    @property
    def broker_instance(self) -> uuid.UUID:
        """This broker's instance id (SQL Server's service_broker_guid); NEW_BROKER changes
        it."""
        with self.pool.connection() as conn:
            row = conn.execute(self.queries["broker_instance"]).fetchone()
        assert row is not None
        value: uuid.UUID = row[0]
        return value

    def advance_clock(self, by: dt.timedelta) -> dt.datetime:
        """Moves the broker clock forward (tests, and rehearsing timeouts)."""
        with self.pool.connection() as conn:
            row = conn.execute(self.queries["advance_clock"], [by]).fetchone()
        assert row is not None
        value: dt.datetime = row[0]
        return value
