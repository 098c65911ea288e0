"""Exactly-once processing through the real scheduler and triggerer: bursts in each
event-driven mode, and SIGKILLs of the triggerer and the scheduler while messages are on
their way (tests/system/dags/s_events.py)."""

from __future__ import annotations

import uuid

import pytest

from airflow_broker import Broker
from tests.fixtures.system import SystemDatabases
from tests.support.airflow_api import AirflowApi
from tests.support.deployment import Deployment
from tests.support.system_events import (
    BURST,
    assert_exactly_once,
    processed,
    send_burst,
    wait_for_all,
)


@pytest.mark.parametrize(("dag_id", "queue", "burst"), [
    # Runs take whatever events arrived meanwhile.
    ("s_burst", "SystemBurstQueue", BURST),
    # one_run_per_message: a DAG run after another, about 2.4 s each here; 20 runs show one run
    # per message, each message in its own run and none twice, as well as 200 did.
    ("s_each", "SystemEachQueue", 20),
])
def test_a_burst_is_processed_exactly_once(airflow_api: AirflowApi,
                                           airflow_deployment: Deployment, events_app: Broker,
                                           system_databases: SystemDatabases, dag_id: str,
                                           queue: str, burst: int) -> None:
    dsn = system_databases.broker_dsn
    airflow_api.wait_for_dag(dag_id)
    airflow_api.unpause(dag_id)
    label = f"burst-{uuid.uuid4().hex[:8]}"
    handles = send_burst(events_app, queue, burst, label)
    wait_for_all(airflow_deployment, dsn, handles, f"{burst} messages through {dag_id}")
    run_ids = assert_exactly_once(airflow_api, airflow_deployment, dsn, dag_id, handles, label)
    if dag_id == "s_each":
        assert len(run_ids) == burst  # a run of its own for every message
    assert all(r.startswith("asset_triggered__") for r in run_ids)


def test_sigkill_of_triggerer_and_scheduler_mid_burst_loses_and_duplicates_nothing(
        airflow_api: AirflowApi, airflow_deployment: Deployment, events_app: Broker,
        system_databases: SystemDatabases) -> None:
    dsn = system_databases.broker_dsn
    airflow_api.wait_for_dag("s_burst")
    airflow_api.unpause("s_burst")
    label = f"killed-{uuid.uuid4().hex[:8]}"
    handles = send_burst(events_app, "SystemBurstQueue", 100, label)
    # The watcher holds messages and a run is under way.
    airflow_deployment.wait_for(lambda: len(processed(dsn, handles)) > 0,
                                "the first messages processed")
    airflow_deployment.kill("triggerer")
    # With its LocalExecutor workers and their tasks, as when its host or container dies. The
    # scheduler's process alone is not a crash Airflow recovers from: the workers it forked
    # keep its database connections open, and with them the row locks of a transaction it
    # was in (the pool's rows among them), so no task is queued again (docs/airflow.md).
    airflow_deployment.kill("scheduler")
    more = send_burst(events_app, "SystemBurstQueue", 100, f"{label}-after")
    airflow_api.restart("scheduler")
    airflow_api.restart("triggerer")
    wait_for_all(airflow_deployment, dsn, handles + more, "200 messages across the kills")
    assert_exactly_once(airflow_api, airflow_deployment, dsn, "s_burst", handles, label)
    assert_exactly_once(airflow_api, airflow_deployment, dsn, "s_burst", more, f"{label}-after")


def test_sigkill_of_the_triggerer_while_a_sensor_is_deferred(
        airflow_api: AirflowApi, airflow_deployment: Deployment, events_app: Broker,
        system_databases: SystemDatabases) -> None:
    dsn = system_databases.broker_dsn
    airflow_api.wait_for_dag("s_wait")
    airflow_api.unpause("s_wait")
    run_id = airflow_api.trigger("s_wait")
    airflow_deployment.wait_for(
        lambda: airflow_api.task_states("s_wait", run_id).get("receive") == "deferred",
        "the sensor deferred")
    airflow_deployment.kill("triggerer")
    label = f"deferred-{uuid.uuid4().hex[:8]}"
    handles = send_burst(events_app, "SystemWaitQueue", 1, label)
    airflow_api.restart("triggerer")
    run = airflow_api.wait_for_run("s_wait", run_id)
    assert run["state"] == "success", airflow_api.run_report("s_wait", run_id)
    assert processed(dsn, handles) == [(f"{label} 0", run_id)]
    assert_exactly_once(airflow_api, airflow_deployment, dsn, "s_wait", handles, label)
