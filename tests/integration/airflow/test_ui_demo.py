"""`airflow-broker demo --ui`: the demo in a real Airflow deployment (api-server, scheduler,
dag-processor, triggerer), the DAG triggered through the REST API, the broker's pages
answering; and nothing left running when it ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import psycopg
import pytest
from psycopg import sql

from airflow_broker.demos.ui_demo import meta_database


def deployment_processes(home: Path) -> list[str]:
    """The command lines of processes still running with ``home`` as their AIRFLOW_HOME."""
    left = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if process.environ().get("AIRFLOW_HOME") == str(home):
                left.append(" ".join(process.info["cmdline"] or []))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return left


@pytest.mark.slow
def test_the_ui_demo_runs_the_dag_in_a_deployment_and_stops_everything(
        dsn: str, tmp_path: Path) -> None:
    env = {**os.environ, "AIRFLOW_BROKER_DEMO_HOME": str(tmp_path / "home")}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "airflow_broker.cli", "demo", "--ui", "--until-done",
             "--dsn", dsn, "--accounts", "8", "--trades", "5"],
            env=env, capture_output=True, text=True, timeout=1200, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "the run ended: success" in done.stdout
        assert "the broker's overview answered 200" in done.stdout
        assert "/plugin/broker" in done.stdout
        # The login's password is in a file of the demo's home, not on the terminal.
        home = tmp_path / "home"
        password = json.loads((home / "demo-secrets.json").read_text())["password"]
        assert password not in done.stdout + done.stderr
        assert deployment_processes(home) == []
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(meta_database(dsn))))
