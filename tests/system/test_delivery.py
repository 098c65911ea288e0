"""Exactly-once processing through the real scheduler and triggerer: bursts in each
event-driven mode, and SIGKILLs of the triggerer and the scheduler while messages are on
their way (tests/system/dags/s_events.py)."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from airflow_broker import Broker
from tests.fixtures.system import SystemDatabases
from tests.support import roles
from tests.support.airflow_api import AirflowApi
from tests.support.deployment import Deployment

EVENT = "//System/Event"
BURST = 200


@pytest.fixture(scope="module")
def events_app(system_databases: SystemDatabases) -> Iterator[Broker]:
    """The queues and services of s_events.py, and the table its DAGs record into."""
    with Broker(system_databases.broker_dsn, poll_interval=0.2) as broker:
        with broker.transaction() as tx:
            tx.create_message_type(EVENT)
            tx.create_contract("//System/EventContract", {EVENT: "INITIATOR"})
            tx.create_queue("SystemSourceQueue")
            tx.create_service("//System/Source", "SystemSourceQueue")
            for queue in ("SystemBurstQueue", "SystemEachQueue", "SystemWaitQueue"):
                tx.create_queue(queue)
                tx.create_service(f"//System/{queue}", queue, ["//System/EventContract"])
        with psycopg.connect(system_databases.broker_dsn) as conn:
            conn.execute("CREATE TABLE system_processed (message_id uuid NOT NULL,"
                         " conversation_handle uuid NOT NULL, body text, run_id text NOT NULL)")
        # The DAGs' login reads the three queues (RECEIVE covers the inbox and END
        # CONVERSATION) and records into the table.
        system_databases.grant_airflow(
            *(roles.broker_grant("RECEIVE", f"QUEUE::{queue}")
              for queue in ("SystemBurstQueue", "SystemEachQueue", "SystemWaitQueue")),
            "GRANT INSERT ON system_processed TO {}")
        yield broker


def send_burst(broker: Broker, queue: str, count: int, label: str) -> list[str]:
    """``count`` dialogs of one message each, committed at once."""
    handles = []
    with broker.transaction() as tx:
        for n in range(count):
            handle = tx.begin_dialog("//System/Source", f"//System/{queue}",
                                     "//System/EventContract")
            tx.send(handle, EVENT, f"{label} {n}")
            handles.append(str(handle))
    return handles


def processed(dsn: str, handles: list[str]) -> list[tuple[str, str]]:
    """(body, run_id) of every processing of the messages sent on these conversations (the
    DAGs record the target's handle)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT p.body, p.run_id FROM system_processed p JOIN broker.endpoints i"
            " ON i.far_handle = p.conversation_handle"
            " WHERE i.conversation_handle = ANY(%s::uuid[])", [handles]).fetchall()
    return [(body, run_id) for body, run_id in rows]


def wait_for_all(deployment: Deployment, dsn: str, handles: list[str], what: str) -> None:
    """Until every message was processed: each wait needs progress, so a slow but moving
    burst never hits the deployment's guard, and a stuck one fails."""
    seen = len(processed(dsn, handles))
    while seen < len(handles):
        deployment.wait_for(functools.partial(progressed, dsn, handles, seen),
                            f"{what}: progress beyond {seen} of {len(handles)}")
        seen = len(processed(dsn, handles))


def progressed(dsn: str, handles: list[str], before: int) -> bool:
    return len(processed(dsn, handles)) > before


def assert_exactly_once(api: AirflowApi, deployment: Deployment, dsn: str, dag_id: str,
                        handles: list[str], label: str) -> set[str]:
    """Every message processed once, every conversation closed, every run succeeded, nothing
    left in the queue or the inbox; returns the runs that processed them."""
    bodies = sorted(body for body, _ in processed(dsn, handles))
    assert bodies == sorted(f"{label} {n}" for n in range(len(handles)))  # 0 lost, 0 twice
    run_ids = {run_id for _, run_id in processed(dsn, handles)}

    def finished() -> bool:
        return all(api.dag_run(dag_id, r)["state"] in ("success", "failed") for r in run_ids)

    deployment.wait_for(finished, f"the runs of {dag_id} finished")
    failed = [r for r in sorted(run_ids) if api.dag_run(dag_id, r)["state"] != "success"]
    assert not failed, "\n".join(api.run_report(dag_id, r) for r in failed)
    with psycopg.connect(dsn) as conn:
        open_dialogs = conn.execute(
            "SELECT count(*) FROM broker.conversation_endpoints WHERE is_initiator"
            " AND conversation_handle = ANY(%s::uuid[]) AND state <> 'DI'",
            [handles]).fetchone()
        pending = conn.execute(
            "SELECT count(*) FROM broker.airflow_inbox i WHERE i.state <> 'consumed'"
            " AND i.conversation_handle IN (SELECT far_handle FROM broker.endpoints"
            " WHERE conversation_handle = ANY(%s::uuid[]))", [handles]).fetchone()
    assert open_dialogs == (0,)  # the target ended each conversation
    assert pending == (0,)
    return run_ids


@pytest.mark.parametrize(("dag_id", "queue", "burst"), [
    # Runs take whatever events arrived meanwhile.
    ("s_burst", "SystemBurstQueue", BURST),
    # one_run_per_message: a DAG run after another, about 2 s each here (7 minutes in all).
    ("s_each", "SystemEachQueue", BURST),
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
