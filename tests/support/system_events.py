"""The delivery tests' application (tests/system/dags/s_events.py): its queues and the table
its DAGs record into, bursts of one-message conversations, and the checks that every message
was processed exactly once. Shared by tests/system/test_delivery.py and
tests/system/test_database_faults.py."""

from __future__ import annotations

import functools
import json
from typing import Any

import psycopg

from airflow_broker import Broker
from tests.fixtures.system import SystemDatabases
from tests.support import roles
from tests.support.airflow_api import AirflowApi
from tests.support.deployment import Deployment

EVENT = "//System/Event"
# dags/broker_event_driven.py's order application.
ORDER = "//Shop/Order"
CONFIRMATION = "//Shop/OrderConfirmation"
BURST = 200


def set_up_events_app(broker: Broker, system_databases: SystemDatabases) -> None:
    """The queues and services of s_events.py, and the table its DAGs record into."""
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


def place_orders(broker: Broker, orders: list[str]) -> dict[str, str]:
    """An order on a conversation of its own for each order id, committed at once, as
    broker_orders_client places them; returns each order's handle."""
    handles: dict[str, str] = {}
    with broker.transaction() as tx:
        for order_id in orders:
            handle = tx.begin_dialog("//Shop/ClientService", "//Shop/OrderService",
                                     "//Shop/OrderContract")
            tx.send(handle, ORDER, json.dumps({"order_id": order_id, "item": "widget"}))
            handles[order_id] = str(handle)
    return handles


def confirmations(dsn: str, handles: list[str]) -> list[dict[str, Any]]:
    """The confirmations waiting on ShopClientQueue for these conversations, each with the
    handle it arrived on."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT conversation_handle::text, convert_from(message_body, 'UTF8')"
            " FROM \"ShopClientQueue\" WHERE message_type_name = %s"
            " AND conversation_handle = ANY(%s::uuid[]) ORDER BY queuing_order",
            [CONFIRMATION, handles]).fetchall()
    return [{**json.loads(body), "handle": handle} for handle, body in rows]
