"""Poison-message detection: the record of every transaction that received, kept where that
transaction's rollback cannot undo it, and the resolution of the records into the count that
disables a queue after five rollbacks in a row.

The statements call one thing here, :meth:`PoisonDetection.received`, through the Broker's
shared state (``_statements.ReceiveRecorder``): that is how RECEIVE, far below this package,
records without importing it. The Broker resolves a transaction's records when it rolls back,
and the broker worker resolves every queue's in each pass, which also counts the transactions
of readers that died.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence

import psycopg
from psycopg.rows import TupleRow

from airflow_broker._statements import StatementRunner, runner_of
from airflow_broker.errors import InvalidObjectName, PoisonDetectionUnavailable
from airflow_broker.poison.side_channel import SideChannel
from airflow_broker.queries import Queries
from airflow_broker.transaction import Transaction

# The side connection's prepared statement of a record.
REGISTER_RECEIVE = b"airflow_broker_register_receive"


class PoisonDetection:
    """One Broker's poison detection: its side connection and what it has checked."""

    def __init__(self, side: SideChannel, queries: Queries) -> None:
        self.side = side
        self.queries = queries
        # Whether this Broker's role may record receives (checked once).
        self._can_record = False

    def received(self, runner: StatementRunner, queue_id: int, xid: str,
                 message_ids: Sequence[uuid.UUID], poison_handling: bool) -> None:
        """Records that ``runner``'s transaction received ``message_ids`` from the queue, on
        the side connection, so that the record survives the transaction's rollback."""
        if not runner.in_transaction:
            # An autocommit RECEIVE has committed already: nothing can roll it back.
            return
        runner.received_queues.add(queue_id)
        if poison_handling:
            self._check_may_record(runner)
            # The receive has begun the transaction: conn sends nothing here.
            self._register(queue_id, xid, message_ids, runner.conn.info.backend_pid)

    def resolve(self, queue_ids: Iterable[int]) -> None:
        """Counts the rolled-back receives of the queues at once, so that the fifth rollback
        disables its queue before the next RECEIVE."""
        for queue_id in sorted(queue_ids):
            self.side.run(self.queries["resolve_receives"] % int(queue_id))

    def close(self) -> None:
        self.side.close()

    def _check_may_record(self, runner: StatementRunner) -> None:
        """Refuses a RECEIVE whose rollback could not be counted: the record is written on the
        side connection, where a missing grant would only be logged and poison detection
        would be off for this reader without anyone knowing."""
        if self._can_record:
            return
        role, allowed = runner.run(self.queries["poison_record_allowed"])[0]
        if not allowed:
            raise PoisonDetectionUnavailable(
                f"The role '{role}' cannot record its receiving transactions for "
                "poison-message detection (it needs EXECUTE on register_receive, which the "
                "broker grants to PUBLIC): a RECEIVE it rolled back would not count. Grant "
                "it again, or turn POISON_MESSAGE_HANDLING off for the queue.")
        self._can_record = True

    def _register(self, queue_id: int, xid: str, message_ids: Sequence[uuid.UUID],
                  backend_pid: int) -> None:
        # The values in text, rendered by hand: each is an integer or a UUID (nothing to
        # quote), and psycopg's adaptation of a UUID array cost more than the rest of the call.
        ids = ",".join(str(m) for m in message_ids)
        self.side.post_prepared(
            REGISTER_RECEIVE, self.queries["register_receive"],
            [b"%d" % int(queue_id), b"%d" % int(xid), b"{%s}" % ids.encode(),
             b"%d" % int(backend_pid)])


def expect_receive(tx: Transaction, queue_name: str) -> None:
    """Records ``tx`` as a receiving transaction of the queue before code this process does
    not see receives in it (an activated PostgreSQL procedure): if it rolls back, it counts as
    a rolled-back receive of the queue."""
    runner = runner_of(tx)
    rows = runner.run(runner.queries["queue_id_and_xid"], [queue_name])
    if not rows or rows[0][0] is None:
        raise InvalidObjectName(f"Invalid object name '{queue_name}'.")
    queue_id, xid = rows[0]
    runner.shared.poison.received(runner, int(queue_id), xid, [], True)


def resolve_all_receives(conn: psycopg.Connection[TupleRow], queries: Queries) -> int:
    """The broker worker's resolution of every queue's records, in the transaction open on
    ``conn``; returns how many queues it disabled."""
    row = conn.execute(queries["resolve_all_receives"]).fetchone()
    return int(row[0]) if row else 0
