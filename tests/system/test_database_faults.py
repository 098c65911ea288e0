"""Faults of the broker's PostgreSQL under a working deployment: the server crash-restarted
(``pg_ctl restart -m immediate``, recovery from the WAL) or every session of the broker's
database terminated, while a sensor is deferred on a queue, watchers work through a burst and
a conversation timer is due. The broker's database is on a server of its own
(``broker_server``), as docs/airflow.md recommends: no component of the deployment exits, and
nothing is lost or done twice."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import psycopg
import pytest

from airflow_broker import Broker
from airflow_broker.embedded import EmbeddedPostgres
from airflow_broker.messages import DIALOG_TIMER, END_DIALOG
from tests.fixtures.system import SystemDatabases
from tests.support.airflow_api import AirflowApi
from tests.support.deployment import Deployment
from tests.support.helpers import terminate_sessions
from tests.support.system_events import (
    CONFIRMATION,
    assert_exactly_once,
    place_orders,
    processed,
    send_burst,
    wait_for_all,
)

BURST = 100
ORDERS = 8
# Due right after the fault begins: it falls into the outage or the recovery after it.
TIMER_SECONDS = 2
# Airflow's shared-stream manager logs this when a producer's advance() raises, and ends the
# watchers of the stream with it: a lost connection must be recovered in place instead.
PRODUCER_FAILED = "Producer advance raised; terminating shared-stream group"


def started_at(dsn: str) -> object:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
    return row[0] if row else None


@pytest.fixture(params=["crash-restart", "terminated sessions"])
def broker_fault(request: pytest.FixtureRequest, broker_server: EmbeddedPostgres,
                 system_databases: SystemDatabases) -> Callable[[], None]:
    """The broker's server restarted as after a crash, or every other session of the broker's
    database ended with pg_terminate_backend (an administrator, a pooler)."""
    dsn = system_databases.broker_dsn
    if request.param == "crash-restart":
        def crash() -> None:
            before = started_at(dsn)
            broker_server.restart("immediate")
            assert started_at(dsn) != before, "PostgreSQL did not restart"

        return crash

    def terminate() -> None:
        assert terminate_sessions(dsn) > 0, "no session to terminate"

    return terminate


def triggerer_log(deployment: Deployment) -> str:
    return deployment.components["triggerer"].log_path.read_text(errors="replace")


def reconnections(deployment: Deployment, name: str, since: int) -> list[str]:
    """The lines of a component's log, from byte ``since`` on, that tell of a connection back
    after an outage (airflow_broker/reconnect.py)."""
    with deployment.components[name].log_path.open("rb") as log:
        log.seek(since)
        text = log.read().decode(errors="replace")
    return [line.strip() for line in text.splitlines()
            if "reconnected to PostgreSQL after" in line]


def queued(dsn: str, queue: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{queue}"').fetchone()
    return int(row[0]) if row else -1


def timer_messages(dsn: str, handle: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            'SELECT count(*) FROM "SystemSourceQueue" WHERE conversation_handle = %s'
            " AND message_type_name = %s", [handle, DIALOG_TIMER]).fetchone()
    return int(row[0]) if row else -1


def timer_pending(dsn: str, handle: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT dialog_timer > '1900-01-01' FROM broker.endpoints"
                           " WHERE conversation_handle = %s", [handle]).fetchone()
    return bool(row and row[0])


def order_messages(dsn: str, handles: list[str]) -> dict[str, list[str]]:
    """The message types waiting on ShopClientQueue for each conversation, in queuing order."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            'SELECT conversation_handle::text, message_type_name FROM "ShopClientQueue"'
            " WHERE conversation_handle = ANY(%s::uuid[]) ORDER BY queuing_order",
            [handles]).fetchall()
    found: dict[str, list[str]] = {h: [] for h in handles}
    for handle, message_type in rows:
        found[handle].append(message_type)
    return found


def test_a_fault_of_the_brokers_server_loses_duplicates_and_stops_nothing(
        airflow_api: AirflowApi, airflow_deployment: Deployment, events_app: Broker,
        system_databases: SystemDatabases, broker_fault: Callable[[], None],
        request: pytest.FixtureRequest) -> None:
    dsn = system_databases.broker_dsn
    fault_name = request.node.callspec.params["broker_fault"]
    setup = airflow_api.run_dag("broker_orders_setup")
    assert setup["state"] == "success", airflow_api.run_report("broker_orders_setup",
                                                               setup["dag_run_id"])
    for dag_id in ("s_burst", "s_wait", "broker_orders"):
        airflow_api.wait_for_dag(dag_id)
        airflow_api.unpause(dag_id)
    producer_failures = triggerer_log(airflow_deployment).count(PRODUCER_FAILED)
    log_sizes = {name: c.log_path.stat().st_size
                 for name, c in airflow_deployment.components.items()}

    # (a) A sensor deferred on its queue.
    wait_run = airflow_api.trigger("s_wait")
    airflow_deployment.wait_for(
        lambda: airflow_api.task_states("s_wait", wait_run).get("receive") == "deferred",
        "the sensor deferred")
    # (b) A burst through a watcher, and orders through a watcher of one run per message.
    label = f"fault-{uuid.uuid4().hex[:8]}"
    handles = send_burst(events_app, "SystemBurstQueue", BURST, label)
    orders = [f"F-{label}-{n}" for n in range(ORDERS)]
    order_handles = place_orders(events_app, orders)
    airflow_deployment.wait_for(lambda: len(processed(dsn, handles)) > 0,
                                "the burst under way")
    # (c) A conversation timer, due just after the fault begins.
    with events_app.transaction() as tx:
        timed = tx.begin_dialog("//System/Source", "//System/SystemWaitQueue",
                                "//System/EventContract")
        tx.begin_conversation_timer(timed, TIMER_SECONDS)
    timer_handle = str(timed)

    faulted = time.monotonic()
    broker_fault()
    back = time.monotonic()
    # Sent once the server takes connections again: the watcher and the deferred sensor must
    # get them on their new connections.
    more = send_burst(events_app, "SystemBurstQueue", BURST, f"{label}-after")
    waited = send_burst(events_app, "SystemWaitQueue", 1, f"{label}-wait")
    airflow_deployment.wait_for(lambda: len(processed(dsn, more)) > 0,
                                "the first message sent after the fault processed")
    progressed = time.monotonic()
    wait_for_all(airflow_deployment, dsn, handles + more,
                 f"{2 * BURST} messages across the fault")
    airflow_deployment.wait_for(lambda: timer_messages(dsn, timer_handle) > 0,
                                "the conversation timer fired")
    airflow_deployment.wait_for(
        lambda: len(processed(dsn, waited)) == 1, "the sensor's message processed")
    order_list = list(order_handles.values())
    airflow_deployment.wait_for(
        lambda: all(len(types) >= 2 for types in order_messages(dsn, order_list).values()),
        f"{ORDERS} orders confirmed and their conversations ended")
    done = time.monotonic()
    # Reported, not asserted: how long the deployment took to work again.
    print(f"\n{fault_name}: the fault took {back - faulted:.1f} s; the first message sent"
          f" after it was processed {progressed - back:.1f} s later; everything was done"
          f" {done - back:.1f} s after it")
    for name, size in log_sizes.items():
        for line in reconnections(airflow_deployment, name, size):
            print(f"  {name}: {line}")

    # No component of the deployment exited, and none had to be restarted.
    assert airflow_deployment.dead() == []
    assert all(c.starts == 1 for c in airflow_deployment.components.values())
    # The watcher's stream lost its connection and got it back in place, not through a new
    # shared-stream group.
    assert any("broker stream on SystemBurstQueue" in line
               for line in reconnections(airflow_deployment, "triggerer",
                                         log_sizes["triggerer"]))
    assert triggerer_log(airflow_deployment).count(PRODUCER_FAILED) == producer_failures

    assert_exactly_once(airflow_api, airflow_deployment, dsn, "s_burst", handles, label)
    assert_exactly_once(airflow_api, airflow_deployment, dsn, "s_burst", more, f"{label}-after")
    run = airflow_api.wait_for_run("s_wait", wait_run)
    assert run["state"] == "success", airflow_api.run_report("s_wait", wait_run)
    assert processed(dsn, waited) == [(f"{label}-wait 0", wait_run)]
    assert_exactly_once(airflow_api, airflow_deployment, dsn, "s_wait", waited, f"{label}-wait")

    # Every order confirmed once, on its own conversation, before the service ended it.
    assert order_messages(dsn, order_list) == {h: [CONFIRMATION, END_DIALOG]
                                               for h in order_list}
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            'SELECT conversation_handle::text, convert_from(message_body, \'UTF8\')::json'
            ' ->> \'order_id\' FROM "ShopClientQueue" WHERE message_type_name = %s'
            " AND conversation_handle = ANY(%s::uuid[])", [CONFIRMATION, order_list]).fetchall()
    assert sorted(rows) == sorted((h, o) for o, h in order_handles.items())

    # The timer fired once, and nothing is left to fire it again.
    assert timer_messages(dsn, timer_handle) == 1
    assert not timer_pending(dsn, timer_handle)
    with events_app.transaction() as tx:
        tx.end_conversation(timed)

    def drained() -> bool:
        return all(queued(dsn, q) == 0 for q in ("SystemBurstQueue", "SystemWaitQueue",
                                                 "OrderQueue"))

    airflow_deployment.wait_for(drained, "the watched queues empty")
    with psycopg.connect(dsn) as conn:
        inbox = conn.execute("SELECT count(*) FROM broker.airflow_inbox"
                             " WHERE state <> 'consumed'").fetchone()
    assert inbox == (0,)
    assert airflow_deployment.dead() == []
