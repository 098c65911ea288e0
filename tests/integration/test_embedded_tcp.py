"""The embedded PostgreSQL on TCP, for readers on other hosts: scram-sha-256 with a generated
password that only a 0600 password file holds, never printed; kept across restarts."""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from airflow_broker.embedded import PASSWORD_FILE, EmbeddedPostgres


@pytest.fixture
def data_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="airflow-broker-tcp-"))
    try:
        yield path
    finally:
        if (path / "PG_VERSION").exists():
            EmbeddedPostgres(path).stop()
        shutil.rmtree(path, ignore_errors=True)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "airflow_broker.cli", *args],
                          capture_output=True, text=True, check=True)


def test_tcp_listener_with_a_password_only_its_file_holds(data_dir: Path) -> None:
    started = cli("server", "start", "--listen", "--data-dir", str(data_dir))
    password = EmbeddedPostgres(data_dir).tcp_password()
    printed = cli("server", "uri", "--tcp", "--data-dir", str(data_dir))
    for output in (started, printed):
        assert password not in output.stdout + output.stderr
    dsn = printed.stdout.strip()
    params = conninfo_to_dict(dsn)
    assert (params["host"], "password" in params) == ("127.0.0.1", False)
    assert stat.S_IMODE((data_dir / PASSWORD_FILE).stat().st_mode) == 0o600
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT inet_client_addr()::text").fetchone() == ("127.0.0.1/32",)
    # Over TCP the password is checked: trust is only for the Unix socket.
    wrong = make_conninfo(dsn, passfile="", password="not-the-password")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(wrong)
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(make_conninfo(dsn, passfile=str(data_dir / "no-such-file")))


def test_the_listener_survives_restarts(data_dir: Path) -> None:
    server = EmbeddedPostgres(data_dir, keep_running=True, listen="127.0.0.1")
    dsn = server.tcp_dsn("postgres")
    server.restart("immediate")
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    server.shut_down()
    server.start()
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    # A later process that does not ask for TCP finds the server as it was left.
    assert EmbeddedPostgres(data_dir).tcp_dsn("postgres") == dsn
    with psycopg.connect(server.uri("postgres")) as conn:  # the Unix socket still works
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_host_name_is_refused(data_dir: Path) -> None:
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 address"):
        EmbeddedPostgres(data_dir, listen="localhost")
