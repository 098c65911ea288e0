"""The embedded PostgreSQL as the README has users drive it from the shell: `airflow-broker
server start`, then any other command, then `server stop`."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.fixtures.airflow import scratch_dir

CLI = str(Path(sys.executable).parent / "airflow-broker")


@pytest.fixture
def data_dir() -> Iterator[Path]:
    with scratch_dir("server") as folder:
        yield folder / "pgdata"


def cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AIRFLOW_BROKER_DSN"}
    env["AIRFLOW_BROKER_DATA_DIR"] = str(data_dir)
    return subprocess.run([CLI, *args], env=env, capture_output=True, text=True, check=False)


def reachable(uri: str) -> bool:
    try:
        with psycopg.connect(uri, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return False
    return True


def test_server_start_keeps_the_server_until_server_stop(data_dir: Path) -> None:
    started = cli(data_dir, "server", "start")
    assert started.returncode == 0, started.stderr
    uri = started.stdout.strip().splitlines()[-1]
    try:
        # A client connected throughout, as an Airflow worker or the broker worker would be.
        with psycopg.connect(uri, autocommit=True) as client:
            for command in (["server", "uri"], ["install"], ["doctor"],
                            ["quarantine", "list"]):
                result = cli(data_dir, *command)
                assert result.returncode in (0, 1), (command, result.stderr)
                assert client.execute("SELECT 1").fetchone() == (1,), command
            assert cli(data_dir, "server", "uri").stdout.strip() == uri
    finally:
        stopped = cli(data_dir, "server", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert not reachable(uri)


def test_a_data_dir_holding_other_files_is_refused_with_the_reason(data_dir: Path) -> None:
    data_dir.mkdir()
    (data_dir / "notes.txt").write_text("not a database")
    result = cli(data_dir, "server", "uri")
    assert result.returncode != 0
    assert "neither empty nor a PostgreSQL data directory" in result.stderr
    assert (data_dir / "notes.txt").read_text() == "not a database"


def test_a_data_dir_of_another_major_is_refused_with_what_to_do(data_dir: Path) -> None:
    data_dir.mkdir()
    (data_dir / "PG_VERSION").write_text("16\n")  # what the pgserver wheel's PostgreSQL left
    result = cli(data_dir, "server", "uri")
    assert result.returncode != 0
    assert "holds a PostgreSQL 16 data directory" in result.stderr
    assert "pg_dumpall" in result.stderr
