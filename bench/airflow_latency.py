"""``python -m bench.airflow_latency``: how long a message takes to reach DAG code in a real
Airflow deployment (the system tier's: api-server, scheduler, dag-processor and triggerer as
separate processes, LocalExecutor, the project installed from its wheel).

Two paths, side by side in one run, one message at a time:

* **sensor**: from a SEND's commit to the deferred ``WaitForReceiveSensor``'s task running
  again (its RECEIVE into the Airflow inbox, ``airflow_inbox.claimed_at``);
* **watcher**: from a SEND's commit to the start of the DAG run an AssetWatcher
  (``one_run_per_message``) made of it (``start_date`` of the run).

Both ends are read from the one PostgreSQL clock, so the numbers hold no clock skew. Prints
p50 and p95 of each and their ratio, and writes them to ``bench/results/airflow_latency.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from airflow_broker import Broker
from airflow_broker.embedded import EmbeddedPostgres
from airflow_broker.migrations import install
from tests.fixtures.postgres import fresh_database
from tests.fixtures.system import SystemDatabases, running_deployment
from tests.support.airflow_api import AirflowApi
from tests.support.deployment import Deployment
from tests.support.install import install_project

EVENT = "//System/Event"
DEFAULT_JSON = Path(__file__).parent / "results" / "airflow_latency.json"


def say(text: str) -> None:
    print(text, flush=True)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def prepare(broker: Broker) -> None:
    with broker.transaction() as tx:
        tx.create_message_type(EVENT)
        tx.create_contract("//System/EventContract", {EVENT: "INITIATOR"})
        tx.create_queue("SystemSourceQueue")
        tx.create_service("//System/Source", "SystemSourceQueue")
        for queue in ("SystemEachQueue", "SystemWaitQueue"):
            tx.create_queue(queue)
            tx.create_service(f"//System/{queue}", queue, ["//System/EventContract"])
    with psycopg.connect(broker.dsn) as conn:
        conn.execute("CREATE TABLE system_processed (message_id uuid NOT NULL,"
                     " conversation_handle uuid NOT NULL, body text, run_id text NOT NULL)")


def send_one(broker: Broker, queue: str, body: str) -> dt.datetime:
    """Sends one message on a new dialog; returns the database's time right after the
    commit."""
    with broker.transaction() as tx:
        handle = tx.begin_dialog("//System/Source", f"//System/{queue}",
                                 "//System/EventContract")
        tx.send(handle, EVENT, body)
    with psycopg.connect(broker.dsn) as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    committed: dt.datetime = row[0]
    return committed


def sensor_sample(api: AirflowApi, deployment: Deployment, broker: Broker, n: int) -> float:
    run_id = api.trigger("s_wait")
    deployment.wait_for(lambda: api.task_states("s_wait", run_id).get("receive") == "deferred",
                        "the sensor deferred")
    committed = send_one(broker, "SystemWaitQueue", f"sensor {n}")
    run = api.wait_for_run("s_wait", run_id)
    if run["state"] != "success":
        raise RuntimeError(api.run_report("s_wait", run_id))
    with psycopg.connect(broker.dsn) as conn:
        row = conn.execute("SELECT min(claimed_at) AT TIME ZONE 'UTC' FROM broker.airflow_inbox"
                           " WHERE consumer LIKE %s", [f"task:s_wait/{run_id}/%"]).fetchone()
    assert row is not None and row[0] is not None
    resumed: dt.datetime = row[0]
    return (resumed - committed).total_seconds()


def watcher_sample(api: AirflowApi, deployment: Deployment, broker: Broker, n: int) -> float:
    before = {r["dag_run_id"] for r in api.dag_runs("s_each")}
    committed = send_one(broker, "SystemEachQueue", f"watcher {n}")

    def new_runs() -> list[dict[str, Any]]:
        return [r for r in api.dag_runs("s_each") if r["dag_run_id"] not in before]

    deployment.wait_for(lambda: any(r.get("start_date") for r in new_runs()),
                        "the watcher's DAG run started")
    (run,) = new_runs()
    api.wait_for_run("s_each", run["dag_run_id"])
    started = dt.datetime.fromisoformat(run["start_date"].replace("Z", "+00:00"))
    return (started - committed).total_seconds()


def summary(samples: list[float]) -> dict[str, float]:
    return {"p50_s": round(statistics.median(samples), 3),
            "p95_s": round(percentile(samples, 0.95), 3),
            "min_s": round(min(samples), 3), "max_s": round(max(samples), 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.airflow_latency", description=(
        "latency from a SEND's commit to DAG code in a real Airflow deployment"))
    parser.add_argument("--samples", type=int, default=20, help="messages per path (20)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args(argv)
    started = time.monotonic()
    results: dict[str, list[float]] = {"sensor": [], "watcher": []}
    with tempfile.TemporaryDirectory(prefix="airflow-broker-latency-") as folder:
        work = Path(folder)
        say("- installing the wheel and starting PostgreSQL")
        project = install_project(work / "install")
        server = EmbeddedPostgres(work / "pgdata")
        try:
            server_dsn = server.uri("postgres")
            with (fresh_database(server_dsn, "airflow_meta", None) as meta,
                  fresh_database(server_dsn, "latency_broker", None) as broker_dsn):
                install(broker_dsn)
                timings: dict[str, float] = {}
                say("- starting Airflow (api-server, scheduler, dag-processor, triggerer) and "
                    "the broker worker")
                with (running_deployment(work / "airflow", project,
                                         SystemDatabases(meta, broker_dsn), 0,
                                         timings) as deployment,
                      Broker(broker_dsn) as broker):
                    api = AirflowApi(deployment)
                    prepare(broker)
                    for dag_id in ("s_wait", "s_each"):
                        api.wait_for_dag(dag_id)
                        api.unpause(dag_id)
                    # The first of each warms up imports and caches; it is not counted.
                    sensor_sample(api, deployment, broker, -1)
                    watcher_sample(api, deployment, broker, -1)
                    for n in range(args.samples):
                        results["sensor"].append(sensor_sample(api, deployment, broker, n))
                        results["watcher"].append(watcher_sample(api, deployment, broker, n))
                        say(f"  {n + 1}/{args.samples}: sensor {results['sensor'][-1]:.2f} s,"
                            f" watcher {results['watcher'][-1]:.2f} s")
                    api.close()
        finally:
            server.stop()
    data: dict[str, Any] = {path: {**summary(values), "samples": [round(v, 3) for v in values]}
                            for path, values in results.items()}
    data["watcher_over_sensor_p50"] = round(
        data["watcher"]["p50_s"] / data["sensor"]["p50_s"], 2)
    data["duration_s"] = round(time.monotonic() - started, 1)
    say("")
    say("| path | p50 | p95 | min | max |")
    say("|---|---|---|---|---|")
    for path in ("sensor", "watcher"):
        s = data[path]
        say(f"| {path} | {s['p50_s']:.2f} s | {s['p95_s']:.2f} s | {s['min_s']:.2f} s |"
            f" {s['max_s']:.2f} s |")
    say(f"watcher / sensor (p50): {data['watcher_over_sensor_p50']}x; "
        f"{args.samples} samples each, {data['duration_s']} s in all")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
