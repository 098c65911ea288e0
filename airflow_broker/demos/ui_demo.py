"""``airflow-broker demo --ui``: the stock-trade demo in a real Airflow deployment, and
Airflow's UI kept up with the broker's pages until Ctrl-C.

The deployment is the one docs/airflow.md describes, on one machine: ``airflow api-server``,
``scheduler``, ``dag-processor`` and ``triggerer`` as separate processes (LocalExecutor), their
metadata in a database of the same PostgreSQL as the broker (the embedded one unless a DSN is
given). The demo DAG is triggered through the REST API as a user would, and the URL and login
of the UI are printed. Its home (AIRFLOW_HOME, logs, the login's password) is kept between
runs under the user's data directory, or AIRFLOW_BROKER_DEMO_HOME.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import platformdirs
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from airflow_broker.demos.airflow_demo import DAG_FILE, broker_connection, demo_database
from airflow_broker.demos.output import say

DAG_ID = "broker_trading_demo"
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
USERNAME = "admin"
# A guard against a hang while every process stays alive, not a performance bound.
GUARD_SECONDS = 900.0


def demo_home() -> Path:
    return Path(os.environ.get("AIRFLOW_BROKER_DEMO_HOME")
                or Path(platformdirs.user_data_dir("airflow-broker")) / "airflow-ui-demo")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def sqlalchemy_url(dsn: str) -> str:
    """Airflow's metadata URL (psycopg 3) for a libpq DSN; a socket directory goes into the
    query, where it needs no escaping."""
    params = {k: str(v) for k, v in conninfo_to_dict(dsn).items()}
    user = quote(params.get("user", ""), safe="")
    password = quote(params.get("password", ""), safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host, port = params.get("host", ""), params.get("port")
    database = quote(params["dbname"], safe="")
    if host.startswith("/"):
        return f"postgresql+psycopg://{auth}/{database}?host={host}" + (
            f"&port={port}" if port else "")
    return f"postgresql+psycopg://{auth}{host}{':' + port if port else ''}/{database}"


def meta_database(broker_dsn: str) -> str:
    """The name of Airflow's metadata database: the broker's, with ``_airflow`` appended."""
    return f"{conninfo_to_dict(broker_dsn)['dbname']}_airflow"


def ensure_meta_database(broker_dsn: str) -> str:
    """Airflow's metadata database beside the broker's, created when missing."""
    name = meta_database(broker_dsn)
    with psycopg.connect(broker_dsn, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                        [name]).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return make_conninfo(broker_dsn, dbname=name)


def kept_secrets(home: Path) -> dict[str, str]:
    """The deployment's shared secrets and the login's password, made on the first run and
    kept: the metadata database holds values encrypted with the Fernet key."""
    path = home / "demo-secrets.json"
    if path.exists():
        kept: dict[str, str] = json.loads(path.read_text())
        return kept
    from cryptography.fernet import Fernet

    made = {"fernet_key": Fernet.generate_key().decode(),
            "jwt_secret": secrets.token_urlsafe(64), "secret_key": secrets.token_urlsafe(32),
            "password": secrets.token_urlsafe(12)}
    path.write_text(json.dumps(made))
    path.chmod(0o600)
    return made


def deployment_env(home: Path, broker_dsn: str, meta_dsn: str, port: int,
                   kept: dict[str, str]) -> dict[str, str]:
    dropped = ("AIRFLOW_", "AIRFLOW__", "PYSPARK", "SPARK_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    meta = sqlalchemy_url(meta_dsn)
    api_url = f"http://127.0.0.1:{port}"
    (home / "passwords.json").write_text(json.dumps({USERNAME: kept["password"]}))
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": meta,
        # Airflow would derive asyncpg, which is not installed; psycopg 3 does async too.
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": meta,
        "AIRFLOW__CORE__FERNET_KEY": kept["fernet_key"],
        "AIRFLOW__API_AUTH__JWT_SECRET": kept["jwt_secret"],
        "AIRFLOW__API__SECRET_KEY": kept["secret_key"],
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__BASE_URL": api_url,
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{api_url}/execution/",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USERNAME}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__CORE__ALLOWED_DESERIALIZATION_CLASSES_REGEXP": r"airflow_broker\..*",
        "AIRFLOW_CONN_BROKER_DEMO": broker_connection(broker_dsn),
        "AIRFLOW_CONN_SPARK_LOCAL": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        # The broker's pages read the demo's schema through the demo's connection.
        "AIRFLOW__BROKER__UI_CONN_ID": "broker_demo",
        "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{env.get('PATH', '')}",
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    })
    return env


@contextmanager
def running(home: Path, env: dict[str, str]) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """The four components, each in a process group of its own with its log in home/logs;
    stopped (SIGTERM, then SIGKILL) however the block ends."""
    logs = home / "logs"
    logs.mkdir(exist_ok=True)
    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name in COMPONENTS:
            with (logs / f"{name}.log").open("ab") as log:
                processes[name] = subprocess.Popen(
                    [sys.executable, "-m", "airflow", name], env=env, cwd=home,
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True)
        yield processes
    finally:
        for process in processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def wait_for(condition: Callable[[], bool], what: str,
             processes: dict[str, subprocess.Popen[bytes]], home: Path) -> None:
    deadline = time.monotonic() + GUARD_SECONDS
    while not condition():
        dead = [n for n, p in processes.items() if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            raise RuntimeError(f"waiting for {what}: "
                               + (f"{', '.join(dead)} exited" if dead else "gave up")
                               + f"; the logs are in {home / 'logs'}")
        time.sleep(1.0)


class Api:
    """The REST API as the demo's admin user."""

    def __init__(self, url: str, password: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=30.0)
        self.password = password
        self.token: str | None = None

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        if self.token is None:
            login = self.http.post("/auth/token",
                                   json={"username": USERNAME, "password": self.password})
            login.raise_for_status()
            self.token = str(login.json()["access_token"])
        return self.http.request(method, path,
                                 headers={"Authorization": f"Bearer {self.token}"}, **kwargs)

    def healthy(self) -> bool:
        try:
            health = self.http.get("/api/v2/monitor/health").json()
        except (httpx.HTTPError, ValueError):
            return False
        return all((health.get(p) or {}).get("status") == "healthy"
                   for p in ("metadatabase", "scheduler", "triggerer", "dag_processor"))

    def dag_parsed(self) -> bool:
        return self.call("GET", f"/api/v2/dags/{DAG_ID}").status_code == 200


def run_ui_demo(dsn: str | None = None, *, accounts: int = 100, trades_per_account: int = 30,
                port: int | None = None, until_done: bool = False) -> int:
    """Runs the deployment and the demo DAG; keeps it up until Ctrl-C, or with ``until_done``
    until the DAG run has finished and the broker's overview has answered. 0 when the run
    succeeded (or Ctrl-C came first)."""
    say("airflow-broker demo --ui: the stock-trade demo in an Airflow deployment, with the "
        "broker's pages in Airflow's UI")
    if shutil.which("java") is None:
        say("Spark needs Java 17 on PATH (on Debian: apt-get install openjdk-17-jre-headless)")
        return 1
    home = demo_home()
    (home / "dags").mkdir(parents=True, exist_ok=True)
    (home / "dags" / "broker_trading_demo.py").write_text(DAG_FILE)
    with demo_database(dsn) as dsn:
        port = port or free_port()
        env = deployment_env(home, dsn, ensure_meta_database(dsn), port, kept_secrets(home))
        say("- preparing Airflow's metadata database (the first run takes a minute)")
        subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, cwd=home,
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        say(f"- starting {', '.join(COMPONENTS)}")
        with running(home, env) as processes:
            api = Api(f"http://127.0.0.1:{port}", json.loads(
                (home / "demo-secrets.json").read_text())["password"])
            wait_for(api.healthy, "Airflow healthy", processes, home)
            wait_for(api.dag_parsed, f"the DAG {DAG_ID} parsed", processes, home)
            api.call("PATCH", f"/api/v2/dags/{DAG_ID}", json={"is_paused": False})
            run = api.call("POST", f"/api/v2/dags/{DAG_ID}/dagRuns", json={
                "logical_date": None,
                "conf": {"accounts": accounts, "trades_per_account": trades_per_account}})
            run.raise_for_status()
            run_id = run.json()["dag_run_id"]
            say(f"- triggered {DAG_ID} (run {run_id})")
            say(f"Airflow's UI: http://127.0.0.1:{port}/  (the broker: "
                f"http://127.0.0.1:{port}/plugin/broker)")
            say(f"  login: {USERNAME}, password in {home / 'demo-secrets.json'}")
            return _watch(api, run_id, processes, home, until_done)


def _watch(api: Api, run_id: str, processes: dict[str, subprocess.Popen[bytes]], home: Path,
           until_done: bool) -> int:
    def state() -> str:
        return str(api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}").json()["state"])

    if until_done:
        wait_for(lambda: state() in ("success", "failed"), f"the run {run_id}", processes,
                 home)
        overview = api.call("GET", "/broker/api/overview")
        say(f"- the run ended: {state()}; the broker's overview answered "
            f"{overview.status_code} with {len(overview.json().get('queues', []))} queues")
        return 0 if state() == "success" and overview.status_code == 200 else 1
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    say("Ctrl-C stops the deployment.")
    reported = ""
    while not stop.wait(2.0):
        now = state()
        if now != reported and now in ("success", "failed"):
            say(f"- the run ended: {now}")
        reported = now
        dead = [n for n, p in processes.items() if p.poll() is not None]
        if dead:
            say(f"{', '.join(dead)} exited; the logs are in {home / 'logs'}")
            return 1
    say("- stopping")
    return 0
