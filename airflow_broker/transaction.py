"""The one object every broker statement is called on."""

from __future__ import annotations

import contextlib
import itertools
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from airflow_broker._statements import Shared, StatementRunner
from airflow_broker.catalog import CatalogStatements
from airflow_broker.dialogs import ConversationStatements
from airflow_broker.receive import ReceiveStatements

_names = itertools.count(1)


class Transaction(CatalogStatements, ConversationStatements, ReceiveStatements):
    """Broker statements on one connection, in its current transaction.

    Everything a statement does commits or rolls back with the caller's own work on the same
    connection. As with any PostgreSQL error, a failed statement aborts the transaction; use
    ``savepoint()`` around work whose failure you want to survive.

    Its public names are Service Broker's statements, ``savepoint()`` and ``conn``. It has no
    ``commit()`` or ``rollback()``: in ``Broker.transaction()`` the block's end commits, and
    an exception rolls back (and counts a rolled-back RECEIVE for poison detection).
    """

    __slots__ = ()

    def __init__(self, conn: psycopg.Connection[TupleRow], shared: Shared, *,
                 begin: bool = False) -> None:
        self._runner = StatementRunner(conn, shared, begin=begin)

    @property
    def conn(self) -> psycopg.Connection[TupleRow]:
        """The connection, in this transaction: your own statements on it commit or roll back
        with the broker's. Leave COMMIT and ROLLBACK to ``Broker.transaction()``: a
        transaction ended on the connection would leave the rest of the block in autocommit."""
        return self._runner.conn

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """SAVE TRANSACTION / ROLLBACK TRANSACTION to it: an exception in the block undoes only
        the block, and the transaction goes on.

        As in SQL Server, conversation groups locked inside the block stay locked after the
        rollback. PostgreSQL releases row locks taken after a savepoint when rolling back to it,
        so they are taken again in the same round trip as the rollback.
        """
        runner = self._runner
        name = sql.Identifier(f"broker_savepoint_{next(_names)}")
        groups: set[uuid.UUID] = set()
        # In a pipelined transaction, what was queued before the block must not fail inside it,
        # and what the block queued must fail inside it: the pipeline is read at both ends.
        runner.sync()
        runner.conn.execute(sql.SQL("SAVEPOINT {}").format(name))
        runner._savepoint_groups.append(groups)
        try:
            yield
            runner.sync()
        except BaseException:
            statements = [sql.SQL("ROLLBACK TO SAVEPOINT {}").format(name)]
            if groups:
                statements.append(sql.SQL(
                    "SELECT 1 FROM {}.dialog_groups WHERE conversation_group_id IN ({})"
                    " ORDER BY conversation_group_id FOR NO KEY UPDATE"
                ).format(
                    sql.Identifier(runner.schema),
                    sql.SQL(", ").join(sql.Literal(str(g)) + sql.SQL("::uuid") for g in groups),
                ))
            if runner.pipelining:
                # The pipeline may hold the block's statements, or be aborted by one of
                # them: read it to its end before rolling the block back.
                with contextlib.suppress(psycopg.Error):
                    runner.sync()
                for statement in statements:
                    runner.conn.execute(statement)
                runner.sync()
            else:
                runner.conn.execute(sql.SQL("; ").join(statements))
            raise
        else:
            runner.conn.execute(sql.SQL("RELEASE SAVEPOINT {}").format(name))
        finally:
            runner._savepoint_groups.pop()
            if runner._savepoint_groups:
                runner._savepoint_groups[-1].update(groups)
