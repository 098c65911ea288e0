"""The embedded PostgreSQL (the ``pgserver`` wheel) used when no DSN is configured."""

from __future__ import annotations

import atexit
import logging
import os
import subprocess
import warnings
from pathlib import Path
from typing import Any

import platformdirs
import psycopg
from psycopg import sql

log = logging.getLogger(__name__)

DATABASE = "airflow_broker"


def default_data_dir() -> Path:
    configured = os.environ.get("AIRFLOW_BROKER_DATA_DIR")
    if configured:
        return Path(configured)
    return Path(platformdirs.user_data_dir("airflow-broker")) / "postgres"


# Written into the data directory by `airflow-broker server start`, removed by `server stop`.
# pgserver stops a server when the last process holding a handle to it exits; without this
# mark, the first command after `server start` (`server uri`, `install`, `doctor`) would stop the
# server under every client when it exited.
KEEP_RUNNING_MARK = "airflow-broker-keep-running"


class EmbeddedPostgres:
    """Starts, or reuses when already running, a PostgreSQL server in ``data_dir``.

    With ``keep_running=True`` the server keeps running until ``stop()``, whichever processes
    come and go in between. Otherwise it stops when the last process using it exits (pgserver
    counts its users), unless a server started with ``keep_running`` is running there.
    ``stop()`` stops it at once.
    """

    def __init__(self, data_dir: Path | str | None = None, *, keep_running: bool = False) -> None:
        with warnings.catch_warnings():
            # pgserver keeps its lock file in the runtime directory; where XDG_RUNTIME_DIR is
            # unset platformdirs warns and falls back to a /tmp folder, which works as well.
            warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
            import pgserver

        self.data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if any(self.data_dir.iterdir()) and not (self.data_dir / "PG_VERSION").exists():
            raise RuntimeError(
                f"{self.data_dir} is neither empty nor a PostgreSQL data directory: point "
                "AIRFLOW_BROKER_DATA_DIR (or --data-dir) at an empty or a data directory")
        mark = self.data_dir / KEEP_RUNNING_MARK
        persistent = keep_running or mark.exists()
        log.info("starting embedded PostgreSQL in %s", self.data_dir)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
            self._server: Any = pgserver.get_server(  # type: ignore[attr-defined]
                self.data_dir, cleanup_mode=None if persistent else "stop"
            )
        if keep_running:
            # Only now: initdb refuses a data directory that holds any file.
            mark.touch()

    def uri(self, database: str = DATABASE) -> str:
        return str(self._server.get_uri(database))

    def ensure_database(self, database: str = DATABASE) -> str:
        """Creates ``database`` when missing and returns its URI."""
        with psycopg.connect(self.uri("postgres"), autocommit=True) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database])
            if found.fetchone() is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        return self.uri(database)

    def restart(self, mode: str = "fast") -> None:
        """Restarts the server (``fast``: open transactions roll back; ``immediate``: as after
        a crash, with recovery from the WAL); clients must reconnect, as after any PostgreSQL
        restart."""
        from pgserver import _commands

        # pgserver generates one function per PostgreSQL program at import time.
        _commands.pg_ctl(  # type: ignore[attr-defined]
            ["-w", "-m", mode, "restart"],
            pgdata=self.data_dir,
            user=self._server.system_user,
            timeout=60,
        )

    def is_running(self) -> bool:
        from pgserver import _commands

        # pgserver's own pg_ctl wrapper logs an error for the "not running" answer.
        status = subprocess.run(
            [str(_commands.POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(self.data_dir), "status"],
            user=self._server.system_user, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            check=False)
        return status.returncode == 0

    def shut_down(self) -> None:
        """Stops the server but keeps this handle: ``start()`` brings it back on the same socket
        (used to rehearse a far broker going away)."""
        from pgserver import _commands

        _commands.pg_ctl(  # type: ignore[attr-defined]
            ["-w", "-m", "fast", "stop"],
            pgdata=self.data_dir,
            user=self._server.system_user,
            timeout=60,
        )

    def start(self) -> None:
        """Starts the server again after ``shut_down()``."""
        self._server.ensure_postgres_running()

    def release(self) -> None:
        """Gives up this process's use of the server: it stops if this was the last user and
        no ``keep_running`` server is running there."""
        self._server.cleanup()
        self._forget_exit_handler()

    def stop(self) -> None:
        """Stops the server, whoever else uses it (`airflow-broker server stop`)."""
        (self.data_dir / KEEP_RUNNING_MARK).unlink(missing_ok=True)
        self._server.cleanup_mode = "stop"
        self._server.cleanup()
        self._forget_exit_handler()
        if self.is_running():
            # Other processes still hold handles (a worker, a second client): pgserver left
            # the server to them, but stop means stop.
            self.shut_down()

    def _forget_exit_handler(self) -> None:
        # pgserver would clean up again at interpreter exit, logging to streams that may be
        # closed by then.
        atexit.unregister(self._server._cleanup)
