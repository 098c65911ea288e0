"""The system harness end to end: example DAGs triggered through the REST API of the real
deployment (api-server, scheduler, dag-processor, triggerer, LocalExecutor, PostgreSQL
metadata) with the project installed from its wheel."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from airflow_broker import Broker
from tests.fixtures.system import SystemDatabases
from tests.support import roles
from tests.support.airflow_api import AirflowApi
from tests.support.deployment import Deployment
from tests.support.system_events import confirmations, place_orders


@pytest.fixture
def broker(system_databases: SystemDatabases) -> Iterator[Broker]:
    """The deployment's broker database (``broker_default``), seen from the test."""
    with Broker(system_databases.broker_dsn, poll_interval=0.2) as b:
        yield b


def test_enable_queue_dag_through_the_api(airflow_api: AirflowApi, broker: Broker,
                                          system_databases: SystemDatabases) -> None:
    # A queue disabled while a message for it was on its way: enabling it makes the message
    # receivable.
    with broker.transaction() as tx:
        tx.create_queue("SystemHeldQueue", status=False)
        tx.create_queue("SystemSenderQueue")
        tx.create_service("//System/Held", "SystemHeldQueue", ["DEFAULT"])
        tx.create_service("//System/Sender", "SystemSenderQueue")
    # The DBA's queue: the deployment's login may enable it, nothing more.
    system_databases.grant_airflow(roles.broker_grant("ALTER", "QUEUE::SystemHeldQueue"))
    with broker.transaction() as tx:
        handle = tx.begin_dialog("//System/Sender", "//System/Held")
        tx.send(handle, "DEFAULT", b"held")

    run = airflow_api.run_dag("broker_enable_queue", {"queue_name": "SystemHeldQueue"})

    assert run["state"] == "success", airflow_api.run_report("broker_enable_queue",
                                                             run["dag_run_id"])
    assert run["run_type"] == "manual"
    assert airflow_api.task_states("broker_enable_queue", run["dag_run_id"]) == {
        "enable_queue": "success"}
    result = airflow_api.xcom("broker_enable_queue", run["dag_run_id"], "enable_queue")
    assert result["changed"] is True
    assert result["before"]["is_receive_enabled"] is False
    assert result["after"]["is_receive_enabled"] is True

    with psycopg.connect(system_databases.broker_dsn) as conn:
        enabled = conn.execute("SELECT is_receive_enabled FROM broker.service_queues"
                               " WHERE name = 'SystemHeldQueue'").fetchone()
    assert enabled == (True,)
    with broker.transaction() as tx:
        (message,) = tx.receive("SystemHeldQueue", waitfor=True, timeout=5)
        assert message.message_body == b"held"
        tx.end_conversation(message.conversation_handle)


def test_event_driven_orders_processed_once_each(airflow_api: AirflowApi,
                                                 airflow_deployment: Deployment,
                                                 broker: Broker,
                                                 system_databases: SystemDatabases) -> None:
    dsn = system_databases.broker_dsn
    setup = airflow_api.run_dag("broker_orders_setup")
    assert setup["state"] == "success", airflow_api.run_report("broker_orders_setup",
                                                               setup["dag_run_id"])

    airflow_api.wait_for_dag("broker_orders")
    airflow_api.unpause("broker_orders")

    orders = [f"S-{n}" for n in range(1, 6)]
    # All orders in one transaction: each must still get a DAG run of its own.
    handles = place_orders(broker, orders)
    ours = list(handles.values())

    airflow_deployment.wait_for(lambda: len(confirmations(dsn, ours)) >= len(orders),
                                f"{len(orders)} order confirmations")
    confirmed = confirmations(dsn, ours)
    # One confirmation per conversation, for that conversation's order.
    assert sorted((c["handle"], c["order_id"]) for c in confirmed) == sorted(
        (h, o) for o, h in handles.items())
    run_ids = {c["run_id"] for c in confirmed}
    assert len(run_ids) == len(orders), "orders shared a DAG run"

    def finished(run_id: str) -> bool:
        return airflow_api.dag_run("broker_orders", run_id)["state"] in ("success", "failed")

    airflow_deployment.wait_for(lambda: all(finished(r) for r in run_ids),
                                "the orders' DAG runs finished")
    runs = [airflow_api.dag_run("broker_orders", r) for r in sorted(run_ids)]
    failed = [r for r in runs if r["state"] != "success"]
    assert not failed, "\n".join(airflow_api.run_report("broker_orders", r["dag_run_id"])
                                 for r in failed)
    assert all(r["run_type"] == "asset_triggered" for r in runs)

    # No run of the DAG processed one of these orders a second time.
    processed: list[str] = []
    for run in airflow_api.dag_runs("broker_orders", state="success"):
        processed += airflow_api.xcom("broker_orders", run["dag_run_id"], "process_order")
    assert sorted(o for o in processed if o in handles) == orders

    with psycopg.connect(dsn) as conn:
        # The service ended every conversation (the target ends first): the client's side
        # has the EndDialog waiting.
        ended = conn.execute(
            "SELECT count(*) FROM broker.conversation_endpoints"
            " WHERE is_initiator AND conversation_handle = ANY(%s::uuid[])"
            " AND state = 'DI'", [ours]).fetchone()
        left_in_queue = conn.execute("SELECT count(*) FROM \"OrderQueue\"").fetchone()
        inbox = conn.execute("SELECT count(*) FROM broker.airflow_inbox"
                             " WHERE state <> 'consumed'").fetchone()
    assert ended == (len(orders),)
    assert left_in_queue == (0,)
    assert inbox == (0,)
