"""``airflow-broker demo``: the stock-trade demo through Airflow (``dag.test()``) and Spark.

It prepares an Airflow home of its own (a SQLite metadata database under the user's data directory,
the demo DAG, a ``broker_demo`` connection on the embedded PostgreSQL or on AIRFLOW_BROKER_DSN, and
``spark_local`` on local[2]), then runs the DAG of airflow_broker.demos.demo_dag in a child
process, which is how Airflow wants its configuration: fixed before it is first imported.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import platformdirs
from psycopg.conninfo import conninfo_to_dict

from airflow_broker.demos.output import say
from airflow_broker.embedded import EmbeddedPostgres

DAG_FILE = '''"""The airflow-broker demo DAG (see airflow_broker.demos.demo_dag)."""
from airflow_broker.demos.demo_dag import build_demo_dag

dag = build_demo_dag()
'''
RESULT_MARKER = "DEMO_RESULT "



@contextmanager
def demo_database(dsn: str | None) -> Iterator[str]:
    """The DSN given, or the embedded PostgreSQL's, started here and released at the end."""
    if dsn is not None:
        yield dsn
        return
    say("- starting the embedded PostgreSQL")
    server = EmbeddedPostgres()
    try:
        yield server.ensure_database()
    finally:
        server.release()


def broker_connection(dsn: str) -> str:
    params = conninfo_to_dict(dsn)
    conn = {"conn_type": "broker", "host": params.get("host"), "login": params.get("user"),
            "password": params.get("password") or None, "schema": params.get("dbname"),
            "port": int(str(params["port"])) if params.get("port") else None,
            "extra": {"broker_schema": "broker_demo"}}
    return json.dumps({k: v for k, v in conn.items() if v is not None})


def prepare(dsn: str) -> dict[str, str]:
    home = Path(os.environ.get("AIRFLOW_BROKER_DEMO_HOME")
                or Path(platformdirs.user_data_dir("airflow-broker")) / "airflow-demo")
    dags = home / "dags"
    dags.mkdir(parents=True, exist_ok=True)
    (dags / "broker_trading_demo.py").write_text(DAG_FILE)
    bin_dir = os.path.dirname(sys.executable)
    return {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__ALLOWED_DESERIALIZATION_CLASSES_REGEXP": r"airflow_broker\..*",
        "AIRFLOW_CONN_BROKER_DEMO": broker_connection(dsn),
        "AIRFLOW_CONN_SPARK_LOCAL": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYSPARK_PYTHON": sys.executable,
    }


def run_demo(dsn: str | None = None, *, accounts: int = 100, trades_per_account: int = 30) -> int:
    started = time.monotonic()
    say("airflow-broker demo: the stock-trade application through Airflow and Spark")
    if shutil.which("java") is None:
        say("Spark needs Java 17 on PATH (on Debian: apt-get install openjdk-17-jre-headless); "
            "`airflow-broker demo --engine-only` runs without it")
        return 1
    with demo_database(dsn) as dsn:
        env = prepare(dsn)
        say("- preparing Airflow's metadata database (the first run takes a minute)")
        subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env,
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        say("- running the DAG broker_trading_demo with dag.test(); Spark starts twice as "
            "long the first time")
        child = subprocess.run(
            [sys.executable, "-m", "airflow_broker.demos.airflow_demo", str(accounts),
             str(trades_per_account)], env=env, check=False, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        result = None
        for line in child.stdout.splitlines():
            if "[demo] " in line:
                text = line.split("[demo] ", 1)[1]
                if text.startswith(RESULT_MARKER):
                    result = json.loads(text[len(RESULT_MARKER):])
                else:
                    say(f"  {text}")
        if child.returncode != 0 or result is None:
            say(child.stdout[-4000:])
            say("the demo DAG failed; its log is above")
            return 1
        say(f"  demo finished in {time.monotonic() - started:.0f} s "
            f"(Airflow home: {env['AIRFLOW_HOME']})")
        say("Look around: `airflow-broker server start` keeps the embedded PostgreSQL running "
            "and prints its URI; then `airflow-broker doctor --schema broker_demo`, "
            "`airflow-broker quarantine list --schema broker_demo`, or psql on the URI.")
        ok = (result["booked"] == result["processed"] == result["acknowledged"]
              and result["in_order"] and result["alerts"] == 1 and result["quarantined"] > 0
              and result["endpoints_left"] == 0)
        return 0 if ok else 1


def _child(argv: list[str]) -> int:
    """Runs in the prepared environment: loads the DAG and runs it with dag.test()."""
    from airflow.dag_processing.dagbag import DagBag

    dags = os.environ["AIRFLOW__CORE__DAGS_FOLDER"]
    bag = DagBag(dags)
    if bag.import_errors:
        print(bag.import_errors, flush=True)
        return 1
    dag = bag.get_dag("broker_trading_demo")
    assert dag is not None
    run = dag.test(run_conf={"accounts": int(argv[0]), "trades_per_account": int(argv[1])})
    return 0 if str(run.state) == "success" else 1


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
