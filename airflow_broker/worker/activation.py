"""Internal activation: starting queue readers as separate processes.

A queue's activation target (its PROCEDURE_NAME) is a Python callable given by import path,
``package.module:function``, called with an ``ActivationContext``; a PostgreSQL procedure,
``schema.procedure`` (airflow_broker.worker.procedures); or a command line,
started with the queue, its DSN and the schema in its environment (AIRFLOW_BROKER_QUEUE,
AIRFLOW_BROKER_DSN, AIRFLOW_BROKER_SCHEMA, AIRFLOW_BROKER_TASK_ID). Like
an activated stored procedure, a reader RECEIVEs until the queue stays empty for a while, then
returns; the queue monitor starts readers again while messages remain.

EXECUTE AS a role name runs the reader as that role by authenticating as it: its DSN is the
worker's with the role as the user and without the worker's password or client certificate, so
libpq finds the role's own credentials (a password file, PGPASSFILE, or the server's
authentication rules). A reader that could undo a SET ROLE could become the worker's login;
one that logged in as its role cannot. SELF and OWNER log in as the queue's owner, and run as
the broker's own login for a queue of the schema's owner, whose rights it has. A reader's
environment is the worker's minus every credential: only the variables of READER_ENVIRONMENT
and of AIRFLOW_BROKER_READER_ENV pass. Every reader's start, end, outcome, messages and error
go to ``activation_log``.

The worker starts only targets of its own list (``airflow-broker worker --activation-target
PATTERN``, or AIRFLOW_BROKER_ACTIVATION_TARGETS), kept outside the database: the right to
create or alter a queue is not the right to run a program on the worker's machine. A queue
whose procedure is not on the list is refused, logged and recorded in ``activation_log``.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
import shlex
import subprocess
import sys
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from airflow_broker.broker import DSN_ENV, Broker
from airflow_broker.callables import load_callable
from airflow_broker.errors import NameMissing
from airflow_broker.reconnect import Outage, usable
from airflow_broker.worker.procedures import drain_with_procedure, is_procedure_target

log = logging.getLogger(__name__)

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
TARGETS_VARIABLE = "AIRFLOW_BROKER_ACTIVATION_TARGETS"


def configured_targets() -> list[str]:
    """The activation targets of AIRFLOW_BROKER_ACTIVATION_TARGETS (comma-separated)."""
    return [t.strip() for t in os.environ.get(TARGETS_VARIABLE, "").split(",") if t.strip()]


def target_allowed(procedure: str, targets: Sequence[str]) -> bool:
    """Whether ``procedure`` is on the list: a pattern matches it whole (``*`` and ``?`` as in
    file names, so ``trading.readers:*`` allows every function of one module)."""
    return any(fnmatch.fnmatchcase(procedure, pattern) for pattern in targets)


@dataclass
class ActivationContext:
    """What an activated Python reader is called with."""

    broker: Broker
    queue_name: str
    task_id: uuid.UUID


def is_python_target(target: str) -> bool:
    return bool(_IMPORT_PATH.match(target))


def load_target(target: str) -> Callable[[ActivationContext], object]:
    return load_callable(target, "activation target")


def activation_command(procedure: str) -> list[str]:
    """The command line that starts a reader; ValueError for one that cannot be parsed."""
    if is_python_target(procedure) or is_procedure_target(procedure):
        return [sys.executable, "-m", "airflow_broker.worker.activated_reader", procedure]
    command = shlex.split(procedure)
    if not command:
        raise NameMissing("the activation procedure is empty")
    return command


def role_for(execute_as: str | None) -> str | None:
    """The role a reader logs in as for EXECUTE AS, as monitored_queues resolves it (SELF and
    OWNER name the queue's owner there; left as such, the broker's own login)."""
    if execute_as is None or execute_as.upper() in ("SELF", "OWNER", "CALLER"):
        return None
    return execute_as


# What identifies the worker's own login in a DSN, left out of a reader's.
_WORKER_CREDENTIALS = ("password", "sslkey", "sslcert", "sslpassword", "sslcertmode")
# The variables a reader process gets from the worker's environment: what a program needs to
# run, and libpq's settings that say where credentials are, never credentials themselves.
READER_ENVIRONMENT = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR", "PYTHONPATH",
                     "VIRTUAL_ENV", "PGPASSFILE", "PGSSLROOTCERT", "PGSSLMODE",
                     "PGCONNECT_TIMEOUT", "PGAPPNAME")
READER_ENV_VARIABLE = "AIRFLOW_BROKER_READER_ENV"


def reader_dsn(dsn: str, role: str | None) -> str:
    """The DSN a reader of ``role`` connects with: the worker's server and database, the role
    as the user, none of the worker's credentials. Without a role, the worker's own."""
    if role is None:
        return dsn
    params = {k: v for k, v in conninfo_to_dict(dsn).items() if k not in _WORKER_CREDENTIALS}
    params["user"] = role
    return make_conninfo("", **params)


def reader_environment(extra: dict[str, str]) -> dict[str, str]:
    """The worker's environment as a reader gets it: the names of READER_ENVIRONMENT, the
    LC_* locale settings, the names listed in AIRFLOW_BROKER_READER_ENV, then ``extra``."""
    passed = set(READER_ENVIRONMENT) | {
        name.strip() for name in os.environ.get(READER_ENV_VARIABLE, "").split(",")
        if name.strip()}
    env = {name: value for name, value in os.environ.items()
           if name in passed or name.startswith("LC_")}
    return {**env, **extra}


@dataclass
class _Reader:
    task_id: uuid.UUID
    queue_id: int
    process: subprocess.Popen[bytes]


@dataclass
class ActivationManager:
    """Runs queue monitors and the readers they start; one per worker process. Only the worker
    holding the schema's activation lock activates, so several workers never start readers for
    the same queue."""

    broker: Broker
    # The activation targets this worker may start (patterns; see target_allowed).
    targets: Sequence[str] = field(default_factory=configured_targets)
    readers: dict[uuid.UUID, _Reader] = field(default_factory=dict)
    _leader: psycopg.Connection[tuple[object, ...]] | None = None
    _outage: Outage = field(
        default_factory=lambda: Outage("queue activation's leader connection", logger=log))

    def _is_leader(self) -> bool:
        """Whether this worker holds the schema's activation lock, taken on a connection of
        its own (a session-level advisory lock). When the server ended that session (a
        restart, a terminated backend, a failover) the lock went with it: a new connection
        takes it again in the same step, if no other worker took it meanwhile."""
        for _ in range(2):
            try:
                if self._leader is None or not usable(self._leader):
                    self._drop_leader()
                    self._leader = psycopg.connect(self.broker.dsn, autocommit=True)
                row = self._leader.execute(self.broker.queries["activation_leader"],
                                           [self.broker.schema]).fetchone()
                self._outage.recovered()
                return bool(row and row[0])
            except psycopg.OperationalError as exc:
                self._drop_leader()
                self._outage.failed(exc)
        return False

    def _drop_leader(self) -> None:
        if self._leader is not None:
            self._leader.close()
        self._leader = None

    def close(self) -> None:
        self._drop_leader()

    def running(self, queue_id: int) -> int:
        return sum(1 for r in self.readers.values() if r.queue_id == queue_id)

    def reap(self, conn: psycopg.Connection[tuple[object, ...]]) -> int:
        """Records readers that have exited; returns how many."""
        ended = [r for r in self.readers.values() if r.process.poll() is not None]
        for reader in ended:
            code = reader.process.returncode
            outcome = "ended" if code == 0 else ("killed" if code < 0 else "aborted")
            conn.execute(self.broker.queries.call("activation_ended", 5),
                         [reader.task_id, outcome, None, None,
                          None if code == 0 else f"exit code {code}"])
            del self.readers[reader.task_id]
        return len(ended)

    def step(self) -> int:
        """Evaluates every queue monitor once; returns the number of readers started."""
        if not self._is_leader():
            return 0
        started = 0
        queries = self.broker.queries
        with self.broker.pool.connection() as conn:
            conn.autocommit = True
            try:
                self.reap(conn)
                queues = conn.execute(queries["monitored_queues"]).fetchall()
                for queue_id, name, procedure, execute_as, internal in queues:
                    try:
                        row = conn.execute(queries.call("monitor_step", 2),
                                           [queue_id, self.running(queue_id)]).fetchone()
                        launch = int(row[0]) if row and internal else 0
                        for _ in range(launch):
                            started += self._start(conn, queue_id, name, procedure, execute_as)
                    except psycopg.OperationalError:
                        raise  # the database is gone: the worker reconnects
                    except Exception:
                        log.exception("activation of queue %s failed; the other queues go on",
                                      name)
            finally:
                conn.autocommit = False
        return started

    def _start(self, conn: psycopg.Connection[tuple[object, ...]], queue_id: int,
               queue_name: str, procedure: str, execute_as: str | None) -> bool:
        """Starts one reader; False when it could not be started (recorded as aborted)."""
        task_id = uuid.uuid4()
        env = reader_environment({
            DSN_ENV: reader_dsn(self.broker.dsn, role_for(execute_as)),
            "AIRFLOW_BROKER_SCHEMA": self.broker.schema,
            "AIRFLOW_BROKER_QUEUE": queue_name,
            "AIRFLOW_BROKER_TASK_ID": str(task_id),
        })
        try:
            # A PostgreSQL procedure runs in the database as its EXECUTE AS role, not on this
            # machine: it needs no place on the list, but a role it is (never the worker's
            # login, or creating a procedure and a queue would run code with the worker's
            # rights).
            in_database = is_procedure_target(procedure) and role_for(execute_as) is not None
            if not in_database and not target_allowed(procedure, self.targets):
                raise PermissionError(
                    f"{procedure!r} is not among the worker's activation targets (start the "
                    f"worker with --activation-target, or set {TARGETS_VARIABLE}; a "
                    "PostgreSQL procedure runs without it under EXECUTE AS a role)")
            process = subprocess.Popen(activation_command(procedure), env=env)
        except (OSError, ValueError) as exc:
            # A procedure that cannot or may not start (no such program, an unbalanced quote,
            # not on the list) is this queue's problem: it is logged and recorded, and every
            # other queue goes on.
            queries = self.broker.queries
            conn.execute(queries.call("activation_started", 3), [task_id, queue_id, None])
            conn.execute(queries.call("activation_ended", 5),
                         [task_id, "aborted", 0, 0, f"could not start: {exc}"])
            log.error("activation of queue %s: could not start %r: %s", queue_name, procedure,
                      exc)
            return False
        conn.execute(self.broker.queries.call("activation_started", 3),
                     [task_id, queue_id, process.pid])
        self.readers[task_id] = _Reader(task_id, queue_id, process)
        log.info("activation of queue %s: started reader %s (pid %s)", queue_name, task_id,
                 process.pid)
        return True

    def stop(self, timeout: float = 30.0) -> None:
        """Waits for running readers (they exit when their queue is empty)."""
        for reader in list(self.readers.values()):
            try:
                reader.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                reader.process.terminate()


def run_reader(target: str) -> int:
    """Body of an activated reader process: a Python callable, or a PostgreSQL procedure
    called until the queue stays empty."""
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s activated reader: %(message)s")
    queue_name = os.environ["AIRFLOW_BROKER_QUEUE"]
    task_id = uuid.UUID(os.environ["AIRFLOW_BROKER_TASK_ID"])
    broker = Broker(os.environ[DSN_ENV],
                    schema=os.environ.get("AIRFLOW_BROKER_SCHEMA") or None,
                    application_name=f"airflow-broker-reader {queue_name}"[:63])
    outcome, error, code = "ended", None, 0
    # A PostgreSQL procedure RECEIVEs inside the database, out of this client's count: its
    # activation log says "not known" rather than 0 received.
    in_database = is_procedure_target(target)
    try:
        if in_database:
            drain_with_procedure(broker, queue_name, target)
        else:
            load_target(target)(ActivationContext(broker, queue_name, task_id))
    except Exception:
        outcome, error, code = "aborted", traceback.format_exc(), 1
        log.error("reader of queue %s failed:\n%s", queue_name, error)
    finally:
        try:
            with psycopg.connect(broker.dsn, autocommit=True) as conn:
                conn.execute(
                    broker.queries.call("activation_ended", 5),
                    [task_id, outcome, None if in_database else broker.stats.received,
                     None if in_database else broker.stats.rollbacks, error])
        finally:
            broker.close()
    return code

