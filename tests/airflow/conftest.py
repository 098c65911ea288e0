"""Fixtures of the Airflow provider tests: a real Airflow metadata database (SQLite, created by
``airflow db migrate``) in a throwaway AIRFLOW_HOME, the ``broker_default`` connection on the
test's own PostgreSQL database (tests/conftest.py), and ``dag.test()`` runs.

Airflow reads its configuration when it is first imported, so the environment is set here,
before anything imports Airflow. The DAG folder holds copies of the example DAGs (dags/) and of
the test DAGs (tests/airflow/dags/).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

ROOT = Path(__file__).resolve().parents[2]
TEST_DAGS = Path(__file__).resolve().parent / "dags"
AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="airflow-broker-airflow-home-"))
DAGS_FOLDER = AIRFLOW_HOME / "dags"

AIRFLOW_ENV = {
    "AIRFLOW_HOME": str(AIRFLOW_HOME),
    "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{AIRFLOW_HOME}/airflow.db",
    "AIRFLOW__CORE__ALLOWED_DESERIALIZATION_CLASSES_REGEXP": r"airflow_broker\..*",
    "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
    "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
}
os.environ.update(AIRFLOW_ENV)
# Whatever the developer's shell holds must not reach the tests' Airflow.
for name in list(os.environ):
    if name.startswith("AIRFLOW_CONN_") or name.startswith("AIRFLOW_VAR_"):
        del os.environ[name]

BROKER_CONN_ENV = "AIRFLOW_CONN_BROKER_DEFAULT"


def copy_dags() -> None:
    DAGS_FOLDER.mkdir(parents=True, exist_ok=True)
    for source in [*sorted((ROOT / "dags").glob("*.py")), *sorted(TEST_DAGS.glob("t_*.py"))]:
        shutil.copy(source, DAGS_FOLDER / source.name)


@contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A temporary directory outside pytest's basetemp, which a concurrent pytest session on
    the same machine may prune while this one still uses it."""
    path = Path(tempfile.mkdtemp(prefix=f"airflow-broker-{prefix}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def scratch() -> Iterator[Path]:
    with scratch_dir("test") as path:
        yield path


@pytest.fixture(scope="session")
def airflow_db() -> Iterator[Path]:
    """The metadata database, migrated once per session; yields AIRFLOW_HOME."""
    copy_dags()
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True,
                   env=os.environ.copy(), stdout=subprocess.DEVNULL)
    try:
        yield AIRFLOW_HOME
    finally:
        shutil.rmtree(AIRFLOW_HOME, ignore_errors=True)


def connection_json(dsn: str, conn_type: str = "broker", **extra: Any) -> str:
    """An Airflow connection (JSON form) on a libpq DSN."""
    params = conninfo_to_dict(dsn)
    conn: dict[str, Any] = {
        "conn_type": conn_type,
        "host": params.get("host"),
        "port": int(str(params["port"])) if params.get("port") else None,
        "login": params.get("user"),
        "password": params.get("password") or None,
        "schema": params.get("dbname"),
        "extra": {"broker_schema": "broker", **extra},
    }
    return json.dumps({k: v for k, v in conn.items() if v is not None})


@pytest.fixture
def broker_conn(dsn: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """``broker_default`` on this test's database; returns the DSN."""
    monkeypatch.setenv(BROKER_CONN_ENV, connection_json(dsn))
    return dsn


def load_dag(dag_id: str) -> Any:
    from airflow.dag_processing.dagbag import DagBag

    for path in sorted(DAGS_FOLDER.glob("*.py")):
        if dag_id in path.read_text():
            bag = DagBag(str(path))
            assert not bag.import_errors, bag.import_errors
            dag = bag.get_dag(dag_id)
            if dag is not None:
                return dag
    raise LookupError(f"no DAG {dag_id} in {DAGS_FOLDER}")


RunDag = Callable[..., Any]


@pytest.fixture
def run_dag(airflow_db: Path, broker_conn: str) -> RunDag:
    """Runs a DAG of the DAG folder with ``dag.test()``; returns the DagRun."""

    def run(dag_id: str, **kwargs: Any) -> Any:
        return load_dag(dag_id).test(**kwargs)

    return run


def task_states(dag_run: Any) -> dict[str, str | None]:
    from airflow.utils.session import create_session

    with create_session() as session:
        return {ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]":
                None if ti.state is None else str(ti.state)
                for ti in dag_run.get_task_instances(session=session)}


def xcom(dag_run: Any, task_id: str, key: str = "return_value") -> Any:
    """A task's XCom in this run, as the task pushed it."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.scalars(XComModel.get_many(
            run_id=dag_run.run_id, dag_ids=dag_run.dag_id, task_ids=task_id, key=key)).all()
        assert rows, f"no XCom {key!r} from {task_id}"
        return XComModel.deserialize_value(rows[0])


def wait_for(condition: Callable[[], bool], what: str,
             alive: Callable[[], bool] | None = None) -> None:
    """Polls until ``condition()``. No time limit: ``alive`` (the process or thread that
    should bring the condition about is still running) turns a dead end into a failure."""
    while not condition():
        if alive is not None and not alive():
            if condition():
                return
            raise AssertionError(f"{what}: what should have caused it has ended")
        time.sleep(0.05)


def waiters(dsn: str, queue_name: str) -> int:
    """Sessions registered as WAITFOR waiters on the queue (what a deferred trigger does)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM broker.queue_waiters w JOIN broker.queues q"
            " ON q.object_id = w.queue_id WHERE q.name = %s"
            " AND w.backend_pid IN (SELECT pid FROM pg_stat_activity)", [queue_name]).fetchone()
    return int(row[0]) if row else 0


class Background(threading.Thread):
    """Runs ``work`` in a thread and re-raises its exception in ``join()``."""

    def __init__(self, work: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self.work = work
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.work()
        except BaseException as exc:
            self.error = exc

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        if self.error is not None:
            raise self.error
