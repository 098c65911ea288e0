"""PostgreSQL procedures as activation targets: the analog of Service Broker's activated
stored procedures, and the way to port a T-SQL reader to PL/pgSQL.

A queue whose PROCEDURE_NAME is ``schema.procedure`` has it called, ``CALL
schema.procedure()``, by an activated reader process that logged in as the queue's EXECUTE AS
role. Each CALL runs in a transaction of its own, which the procedure must not commit (it
RECEIVEs with ``broker.receive(...)``, processes, and returns). The transaction is registered
for poison-message detection before the CALL, so a procedure that fails rolls back, counts as a
rollback of the queue, and five in a row disable it as they would any reader. The reader calls
the procedure again while it receives, and stops when a few seconds pass without a message or
the queue is disabled.
"""

from __future__ import annotations

import logging
import re
import time

import psycopg
from psycopg import sql

from airflow_broker._statements import runner_of
from airflow_broker.broker import Broker
from airflow_broker.errors import QueueDisabledError
from airflow_broker.poison.detection import expect_receive

log = logging.getLogger(__name__)

_PROCEDURE = re.compile(r"^[A-Za-z_][\w$]*\.[A-Za-z_][\w$]*$")


def is_procedure_target(target: str) -> bool:
    """Whether an activation procedure names a PostgreSQL procedure (``schema.procedure``)."""
    return bool(_PROCEDURE.match(target))


def drain_with_procedure(broker: Broker, queue_name: str, procedure: str, *,
                         idle_exit: float = 5.0, pause: float = 0.5) -> int:
    """Calls ``procedure`` until it has received nothing for ``idle_exit`` seconds or the
    queue is disabled; returns how many calls failed."""
    schema, name = procedure.split(".")
    call = sql.SQL("CALL {}.{}()").format(sql.Identifier(schema), sql.Identifier(name))
    failures = 0
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < idle_exit:
        try:
            with broker.transaction() as tx:
                expect_receive(tx, queue_name)
                runner = runner_of(tx)
                runner.run(call)
                received = bool(runner.scalar(runner.queries["messages_taken_in_transaction"]))
        except QueueDisabledError as exc:
            log.error("queue %s is disabled, the reader stops: %s", queue_name, exc)
            break
        except psycopg.Error as exc:
            # The CALL's transaction rolled back (and counts for poison detection): what it
            # received is back on the queue for the next call.
            failures += 1
            log.warning("procedure %s failed: %s", procedure, exc)
            received = True
        if received:
            idle_since = time.monotonic()
        else:
            time.sleep(pause)
    return failures
