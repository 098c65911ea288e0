"""Spark readers on a real standalone cluster (a master and two workers of one core each on
127.0.0.1, whose Python has neither the project nor psycopg), submitted by the deployed
Airflow's scheduler as users run them: ActivatedReaderOperator with its default settings ships
the engine, the handler and the DSN itself. Exactly once, in order per conversation, the
poisoned messages quarantined, and the summary in XCom equal to the database, also when an
executor is SIGKILLed in the middle of the queue, and when the broker's server crashes there."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from airflow_broker import Broker
from airflow_broker.embedded import EmbeddedPostgres
from airflow_broker.spark.shipping import base_interpreter
from tests.fixtures.system import SystemDatabases
from tests.support import roles
from tests.support.airflow_api import AirflowApi
from tests.support.deployment import Deployment
from tests.support.spark_cluster import SparkCluster

CONVERSATIONS = 50
PER_CONVERSATION = 60
# Every tenth conversation carries one poisoned trade.
POISONED = {(c, 17) for c in range(0, CONVERSATIONS, 10)}
DAG_ID = "s_cluster_readers"


@pytest.fixture(scope="module")
def cluster_broker(system_databases: SystemDatabases) -> Iterator[Broker]:
    with Broker(system_databases.broker_dsn) as broker:
        with broker.transaction() as tx:
            tx.create_message_type("//Cluster/Trade")
            tx.create_contract("//Cluster/Trading", {"//Cluster/Trade": "INITIATOR"})
            tx.create_queue("ClusterSenderQueue")
            # More readers than the cluster's two cores: the operator runs two.
            tx.create_queue("ClusterQueue", max_queue_readers=4)
            tx.create_service("//Cluster/Sender", "ClusterSenderQueue")
            tx.create_service("//Cluster/Book", "ClusterQueue", ["//Cluster/Trading"])
        with psycopg.connect(system_databases.broker_dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE public.cluster_results (message_id uuid PRIMARY KEY,"
                         " conversation_handle uuid NOT NULL, sequence bigint NOT NULL,"
                         " body text, host text, pid integer, booked bigserial)")
        # The readers log in as the deployment's login: RECEIVE on their queue (quarantine and
        # poison records included) and the rights on the table their handler books into.
        system_databases.grant_airflow(
            roles.broker_grant("RECEIVE", "QUEUE::ClusterQueue"),
            "GRANT INSERT ON public.cluster_results TO {}",
            "GRANT USAGE ON SEQUENCE public.cluster_results_booked_seq TO {}")
        yield broker


@pytest.fixture
def trades(cluster_broker: Broker, system_databases: SystemDatabases) -> dict[str, Any]:
    """3,000 trades on 50 conversations, 5 of them poisoned; the results table empty."""
    with psycopg.connect(system_databases.broker_dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE public.cluster_results")
    started = rows(system_databases.broker_dsn, "SELECT broker.utc_now()")[0][0]
    handles: list[uuid.UUID] = []
    with cluster_broker.transaction() as tx:
        for c in range(CONVERSATIONS):
            handle = tx.begin_dialog("//Cluster/Sender", "//Cluster/Book", "//Cluster/Trading")
            handles.append(handle)
            tx.send_many(handle, "//Cluster/Trade", [
                f"<trade conversation='{c}' n='{i}'>{'poison' if (c, i) in POISONED else ''}"
                "</trade>" for i in range(PER_CONVERSATION)])
    return {"handles": handles, "started": started,
            "good": CONVERSATIONS * PER_CONVERSATION - len(POISONED)}


def rows(dsn: str, query: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query, params).fetchall()


def check_drained(dsn: str, summary: dict[str, Any], trades: dict[str, Any]) -> None:
    """Exactly once, in order per conversation, the poisoned ones quarantined, and the XCom
    summary the database's."""
    booked = rows(dsn, "SELECT conversation_handle, sequence FROM public.cluster_results"
                       " ORDER BY booked")
    assert len(booked) == len({b for b in booked}) == trades["good"]
    by_conversation: dict[uuid.UUID, list[int]] = {}
    for handle, sequence in booked:
        by_conversation.setdefault(handle, []).append(sequence)
    assert len(by_conversation) == CONVERSATIONS
    for sequences in by_conversation.values():
        assert sequences == sorted(sequences)
    quarantined = rows(dsn, "SELECT message_body FROM broker.quarantine q"
                            " JOIN broker.queues ON queues.object_id = q.queue_id"
                            " WHERE queues.name = 'ClusterQueue' AND status = 'quarantined'"
                            " AND quarantined_at >= %s", [trades["started"]])
    assert sorted(bytes(q[0]).decode() for q in quarantined) == sorted(
        f"<trade conversation='{c}' n='{i}'>poison</trade>" for c, i in POISONED)
    assert rows(dsn, "SELECT count(*) FROM broker.queue_messages m"
                     " JOIN broker.queues q ON q.object_id = m.queue_id"
                     " WHERE q.name = 'ClusterQueue'") == [(0,)]
    (stored,) = rows(dsn, "SELECT broker.reader_run_summary(%s)", [summary["run_id"]])[0]
    assert summary == stored
    assert (summary["received"], summary["processed"], summary["quarantined"]) == (
        CONVERSATIONS * PER_CONVERSATION, trades["good"], len(POISONED))
    # Two cores: two readers at once, not the queue's four in two waves.
    assert (summary["readers_wanted"], summary["slots"], summary["readers"],
            summary["max_concurrent"]) == (4, 2, 2, 2)
    assert summary["failed_readers"] == []


def test_workers_python_lacks_the_project_and_psycopg(spark_cluster: SparkCluster) -> None:
    """What the tests below prove rests on this: nothing the readers import is installed
    where the executors run."""
    env = spark_cluster.environment()
    for python in (str(spark_cluster.bare_python), base_interpreter()):
        for module in ("psycopg", "airflow_broker"):
            probe = subprocess.run([python, "-c", f"import {module}"], env=env,
                                   capture_output=True, text=True, check=False)
            assert probe.returncode == 1 and "ModuleNotFoundError" in probe.stderr, (
                python, module)


def test_readers_drain_3000_messages_on_the_cluster(
        airflow_api: AirflowApi, system_databases: SystemDatabases,
        trades: dict[str, Any]) -> None:
    run = airflow_api.run_dag(DAG_ID)
    run_id = str(run["dag_run_id"])
    assert run["state"] == "success", airflow_api.run_report(DAG_ID, run_id)
    summary = airflow_api.xcom(DAG_ID, run_id, "read")
    check_drained(system_databases.broker_dsn, summary, trades)
    assert summary["task_retries"] == 0
    # The failures are in the Airflow task log, not only on the workers.
    log = airflow_api.task_log(DAG_ID, run_id, "read")
    assert log.count("-> quarantined") == len(POISONED)
    assert f"reader run {summary['run_id']}: 2 reader(s)" in log


def a_third_received(api: AirflowApi, deployment: Deployment,
                     dsn: str) -> tuple[str, Callable[[], int]]:
    """Triggers a run of the readers and returns once a third of the queue is received: its
    run id, and how many messages its readers have received (committed) so far."""
    started = rows(dsn, "SELECT broker.utc_now()")[0][0]
    run_id = api.trigger(DAG_ID)

    def received() -> int:
        return int(rows(dsn, "SELECT coalesce(sum((stats->>'received')::int), 0)"
                             " FROM broker.reader_attempts WHERE started_at >= %s",
                        [started])[0][0])

    deployment.wait_for(lambda: received() >= 1000, "a third of the queue received",
                        interval=0.2)
    return run_id, received


def test_executor_sigkill_mid_drain_loses_and_duplicates_nothing(
        airflow_api: AirflowApi, airflow_deployment: Deployment, spark_cluster: SparkCluster,
        system_databases: SystemDatabases, trades: dict[str, Any]) -> None:
    dsn = system_databases.broker_dsn
    run_id, received = a_third_received(airflow_api, airflow_deployment, dsn)
    (victim, *_) = spark_cluster.executors()
    victim.kill()
    killed_at = received()
    run = airflow_api.wait_for_run(DAG_ID, run_id)
    assert run["state"] == "success", airflow_api.run_report(DAG_ID, run_id)
    summary = airflow_api.xcom(DAG_ID, run_id, "read")
    assert killed_at < CONVERSATIONS * PER_CONVERSATION
    check_drained(dsn, summary, trades)
    # The killed executor's reader ran again; what it had committed is still counted.
    assert summary["task_retries"] >= 1
    assert any(a["status"] == "lost" for a in summary["per_attempt"])


def test_a_crash_of_the_brokers_server_mid_drain_fails_no_reader(
        airflow_api: AirflowApi, airflow_deployment: Deployment, broker_server: EmbeddedPostgres,
        system_databases: SystemDatabases, trades: dict[str, Any]) -> None:
    """The broker's server crash-restarted (``-m immediate``) while the cluster's readers are
    in the middle of the queue: each reader's batch in flight rolls back and the reader goes on
    on a new connection, so no Spark task fails or runs again, and the counts are the
    committed work."""
    dsn = system_databases.broker_dsn
    run_id, received = a_third_received(airflow_api, airflow_deployment, dsn)
    crashed_at = received()
    broker_server.restart("immediate")
    run = airflow_api.wait_for_run(DAG_ID, run_id)
    assert run["state"] == "success", airflow_api.run_report(DAG_ID, run_id)
    summary = airflow_api.xcom(DAG_ID, run_id, "read")
    assert crashed_at < CONVERSATIONS * PER_CONVERSATION
    check_drained(dsn, summary, trades)
    assert summary["task_retries"] == 0
    assert [a["status"] for a in summary["per_attempt"]] == ["finished", "finished"]
