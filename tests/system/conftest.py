"""Fixtures of the system tier: one Airflow deployment per test session.

* ``installed_project``: the project's wheel in a virtual environment of its own.
* ``system_databases``: Airflow's metadata database and the broker's database, separate
  databases on the session's PostgreSQL (tests/conftest.py).
* ``system_mailbox``: an SMTP server on 127.0.0.1, the deployment's ``smtp_default``.
* ``spark_cluster``: a Spark standalone master and two workers of one core each on 127.0.0.1
  (tests/spark_cluster.py), whose Python has neither the project nor psycopg; the
  deployment's ``spark_default``.
* ``airflow_deployment``: api-server, scheduler, dag-processor, triggerer and the broker worker,
  running and healthy; ``airflow_api``: a logged-in REST API client.

Every test in this folder is marked ``system`` (``pytest -m "not system"`` leaves them out).
When a test fails, its report carries the tails of the component logs, and the session's
folder (logs, AIRFLOW_HOME, the virtual environment) is kept and named at the end.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from aiosmtpd.controller import Controller
from cryptography.fernet import Fernet
from psycopg.conninfo import conninfo_to_dict

from airflow_broker.migrations import install
from tests.conftest import fresh_database
from tests.spark_cluster import SparkCluster
from tests.system.api import AirflowApi
from tests.system.deployment import Deployment
from tests.system.install import ROOT, InstalledProject, imported_from, install_project
from tests.system.smtp import Mailbox

HERE = Path(__file__).resolve().parent
USERNAME = "system"
ALERT_EMAIL = "ops@example.test"

_failed = pytest.StashKey[bool]()
_home = pytest.StashKey[Path]()
_timings = pytest.StashKey[dict[str, float]]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.system)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    if report.failed and item.path.is_relative_to(HERE):
        item.session.stash[_failed] = True
        deployment = getattr(item, "funcargs", {}).get("airflow_deployment")
        if isinstance(deployment, Deployment):
            report.sections.append(("system deployment logs", deployment.log_tails()))
    return report


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int,
                            config: pytest.Config) -> None:
    timings = config.stash.get(_timings, None)
    if timings:
        terminalreporter.write_line(
            "system deployment startup: " + ", ".join(f"{k} {v:.1f} s"
                                                      for k, v in timings.items()))
    home = config.stash.get(_home, None)
    if home is not None and home.exists():
        terminalreporter.write_line(f"system deployment files kept in {home}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def system_home(request: pytest.FixtureRequest) -> Iterator[Path]:
    """The session's folder: the virtual environment, AIRFLOW_HOME and the logs. Outside
    pytest's basetemp, which a concurrent pytest session may prune while this one runs; kept
    when a system test failed."""
    home = Path(tempfile.mkdtemp(prefix="airflow-broker-system-"))
    try:
        yield home
    finally:
        if request.session.stash.get(_failed, False):
            request.config.stash[_home] = home
        else:
            shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def installed_project(system_home: Path, request: pytest.FixtureRequest) -> InstalledProject:
    started = time.monotonic()
    project = install_project(system_home / "install")
    request.config.stash.setdefault(_timings, {})["wheel and venv"] = (
        time.monotonic() - started)
    for module in ("airflow_broker", "airflow_broker.hooks", "airflow_broker.operators"):
        where = imported_from(project, module)
        assert where.is_relative_to(project.prefix), f"{module} imported from {where}"
    return project


@dataclass(frozen=True)
class SystemDatabases:
    meta_dsn: str    # Airflow's metadata
    broker_dsn: str  # the broker schema the example DAGs use (broker_default)


@pytest.fixture(scope="session")
def system_databases(server_dsn: str) -> Iterator[SystemDatabases]:
    with (fresh_database(server_dsn, "airflow_meta", None) as meta,
          fresh_database(server_dsn, "system_broker", None) as broker):
        install(broker)
        yield SystemDatabases(meta, broker)


@pytest.fixture(scope="session")
def system_mailbox() -> Iterator[Mailbox]:
    mailbox = Mailbox()
    controller = Controller(mailbox, hostname="127.0.0.1", port=_free_port())
    controller.start()
    mailbox.port = controller.port
    try:
        yield mailbox
    finally:
        controller.stop()


@pytest.fixture(scope="session")
def spark_cluster(system_home: Path) -> Iterator[SparkCluster]:
    cluster = SparkCluster(system_home / "spark")
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def sqlalchemy_url(dsn: str) -> str:
    """Airflow's SQLAlchemy URL (psycopg 3, the driver installed) for a libpq DSN. A Unix
    socket directory (the embedded PostgreSQL) goes into the query, where it needs no
    escaping."""
    params = conninfo_to_dict(dsn)
    user = quote(str(params.get("user") or ""), safe="")
    password = quote(str(params.get("password") or ""), safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = str(params.get("host") or "")
    database = quote(str(params["dbname"]), safe="")
    if host.startswith("/"):
        port = f"&port={params['port']}" if params.get("port") else ""
        return f"postgresql+psycopg://{auth}/{database}?host={host}{port}"
    port = f":{params['port']}" if params.get("port") else ""
    return f"postgresql+psycopg://{auth}{host}{port}/{database}"


def connection_json(dsn: str, broker_schema: str = "broker") -> str:
    """A broker connection (JSON form) on a libpq DSN."""
    params = conninfo_to_dict(dsn)
    conn: dict[str, Any] = {
        "conn_type": "broker",
        "host": params.get("host"),
        "port": int(str(params["port"])) if params.get("port") else None,
        "login": params.get("user"),
        "password": params.get("password") or None,
        "schema": params.get("dbname"),
        "extra": {"broker_schema": broker_schema},
    }
    return json.dumps({k: v for k, v in conn.items() if v is not None})


def deployment_env(home: Path, project: InstalledProject, databases: SystemDatabases,
                   smtp_port: int, api_port: int, spark_master: str) -> dict[str, str]:
    """The environment of every component: the host's, without anything Airflow-, Python- or
    Spark-specific that a developer's shell or this pytest process holds, plus the
    deployment's configuration."""
    dropped = ("AIRFLOW", "PYTHON", "PYSPARK", "SPARK_", "PYTEST", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    meta = sqlalchemy_url(databases.meta_dsn)
    api_url = f"http://127.0.0.1:{api_port}"
    env.update({
        "PATH": project.path_env(env.get("PATH")),
        "VIRTUAL_ENV": str(project.prefix),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": meta,
        # Airflow would derive asyncpg, which is not installed; psycopg 3 does async too.
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": meta,
        # Shared secrets: each process would otherwise generate its own, and the tasks' JWTs
        # or the triggers' encrypted kwargs would not be readable by the others.
        "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(64),
        "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(api_port),
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__BASE_URL": api_url,
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{api_url}/execution/",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USERNAME}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        # Recovery after a component is killed, as docs/airflow.md recommends: a task whose
        # process died is failed (and retried) after a minute without heartbeat, and tasks
        # queued by a dead scheduler are reset within half a minute, not five.
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
        "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "30",
        "AIRFLOW_CONN_BROKER_DEFAULT": connection_json(databases.broker_dsn),
        # The demo DAG's connection: the same database, its own broker schema.
        "AIRFLOW_CONN_BROKER_DEMO": connection_json(databases.broker_dsn, "broker_demo"),
        "AIRFLOW_CONN_SPARK_LOCAL": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": spark_master}),
        # The Spark drivers (client mode) listen where the cluster can reach them.
        "SPARK_LOCAL_IP": "127.0.0.1",
        "AIRFLOW_CONN_SMTP_DEFAULT": json.dumps({
            "conn_type": "smtp", "host": "127.0.0.1", "port": smtp_port,
            "extra": {"disable_tls": True, "disable_ssl": True, "retry_limit": 0,
                      "from_email": "airflow@localhost"}}),
        "AIRFLOW_VAR_BROKER_ALERT_EMAIL": ALERT_EMAIL,
    })
    return env


@contextmanager
def running_deployment(home: Path, project: InstalledProject, databases: SystemDatabases,
                       smtp_port: int, timings: dict[str, float],
                       spark_master: str = "local[2]") -> Iterator[Deployment]:
    """Every component started and the api-server reporting the metadatabase, scheduler,
    triggerer and dag-processor healthy; everything stopped at the end (also used by
    bench/airflow_latency.py)."""
    started = time.monotonic()
    (home / "dags").mkdir(parents=True)
    # The example DAGs, as users copy them, and the system tier's own.
    for dag_file in [*sorted((ROOT / "dags").glob("*.py")),
                     *sorted((HERE / "dags").glob("s_*.py"))]:
        shutil.copy(dag_file, home / "dags" / dag_file.name)
    password = secrets.token_urlsafe(16)
    # The simple auth manager generates passwords only for users missing from this file.
    (home / "passwords.json").write_text(json.dumps({USERNAME: password}))
    api_port = _free_port()
    env = deployment_env(home, project, databases, smtp_port, api_port, spark_master)
    deployment = Deployment(home, project, env, api_url=f"http://127.0.0.1:{api_port}",
                            api_user=(USERNAME, password), broker_dsn=databases.broker_dsn)
    api = AirflowApi(deployment)
    try:
        deployment.run("airflow", "db", "migrate")
        migrated = time.monotonic()
        timings["airflow db migrate"] = migrated - started
        deployment.start_all()
        deployment.wait_for(api.healthy, "the deployment healthy", interval=0.5)
        timings["components until healthy"] = time.monotonic() - migrated
        yield deployment
    finally:
        api.close()
        deployment.stop_all()


@pytest.fixture(scope="session")
def airflow_deployment(system_home: Path, installed_project: InstalledProject,
                       system_databases: SystemDatabases, system_mailbox: Mailbox,
                       spark_cluster: SparkCluster,
                       request: pytest.FixtureRequest) -> Iterator[Deployment]:
    """The running deployment (:func:`running_deployment`), submitting to ``spark_cluster``."""
    timings = request.config.stash.setdefault(_timings, {})
    with running_deployment(system_home / "airflow", installed_project, system_databases,
                            system_mailbox.port, timings,
                            spark_cluster.master_url) as deployment:
        yield deployment


@pytest.fixture(scope="session")
def airflow_api(airflow_deployment: Deployment) -> Iterator[AirflowApi]:
    api = AirflowApi(airflow_deployment)
    try:
        yield api
    finally:
        api.close()
