"""Faults of the broker's PostgreSQL under a working deployment, while a sensor is deferred on
a queue, watchers work through a burst and a conversation timer is due: the server
crash-restarted (``pg_ctl restart -m immediate``, recovery from the WAL), every session of the
broker's database terminated, a failover to a synchronous standby promoted at the primary's
address, and a crash of a server shared with Airflow's metadata under a supervisor. With the
broker's database on a server of its own (``broker_server``), as docs/airflow.md recommends, no
component of the deployment exits; on a shared server Airflow's daemons may, and are started
again. Either way nothing is lost or done twice."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from airflow_broker import Broker
from airflow_broker.embedded import EmbeddedPostgres
from airflow_broker.messages import DIALOG_TIMER, END_DIALOG
from tests.fixtures.system import SystemDatabases
from tests.support.airflow_api import AirflowApi
from tests.support.deployment import BROKER_WORKER, Deployment
from tests.support.embedded_standby import EmbeddedStandby
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
# How long the shared server stays down after its crash: long enough that Airflow's daemons
# find their metadata database gone (a host rebooting, a server that recovers slowly).
OUTAGE_SECONDS = 10
# Airflow's shared-stream manager logs this when a producer's advance() raises, and ends the
# watchers of the stream with it: a lost connection must be recovered in place instead.
PRODUCER_FAILED = "Producer advance raised; terminating shared-stream group"


def started_at(dsn: str) -> object:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
    return row[0] if row else None


@dataclass(frozen=True)
class Fault:
    name: str
    run: Callable[[], None]
    # Airflow's metadata went too: its daemons may exit, and a supervisor starts them again.
    shared: bool = False


@contextmanager
def metadata_refused(meta_dsn: str) -> Iterator[None]:
    """Airflow's metadata database refusing every connection, its sessions ended: on a
    server the tests do not own (AIRFLOW_BROKER_TEST_DSN), what its crash looks like to
    Airflow's daemons."""
    database = sql.Identifier(str(conninfo_to_dict(meta_dsn)["dbname"]))
    with psycopg.connect(make_conninfo(meta_dsn, dbname="postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(database))
        try:
            terminate_sessions(meta_dsn)
            yield
        finally:
            admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(database))


@pytest.fixture(params=["crash-restart", "terminated sessions", "failover",
                        "shared server down"])
def broker_fault(request: pytest.FixtureRequest, broker_server: EmbeddedPostgres,
                 embedded_server: EmbeddedPostgres | None, system_databases: SystemDatabases,
                 airflow_deployment: Deployment) -> Iterator[Fault]:
    """The broker's server restarted as after a crash; every other session of the broker's
    database ended with pg_terminate_backend (an administrator, a pooler); the broker's server
    lost (SIGKILL) and its synchronous standby promoted in its place, at its address (a
    failover behind a floating address); or one server
    holding both Airflow's metadata and the broker's database crashed and down for
    OUTAGE_SECONDS (the two servers of the system tier crashed and started again together, as
    one would be), under a supervisor that starts Airflow's daemons again when they exit."""
    dsn = system_databases.broker_dsn
    if request.param == "crash-restart":
        def crash() -> None:
            before = started_at(dsn)
            broker_server.restart("immediate")
            assert started_at(dsn) != before, "PostgreSQL did not restart"

        yield Fault(request.param, crash)
        return
    if request.param == "terminated sessions":
        def terminate() -> None:
            assert terminate_sessions(dsn) > 0, "no session to terminate"

        yield Fault(request.param, terminate)
        return

    if request.param == "failover":
        standby = EmbeddedStandby(broker_server)
        try:
            standby.start()
            yield Fault(request.param, standby.fail_over)
        finally:
            standby.close()
        return

    servers = [broker_server] if embedded_server is None else [broker_server, embedded_server]

    def shared_server_down() -> None:
        before = started_at(dsn)
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(lambda server: server.shut_down("immediate"), servers))
        with (metadata_refused(system_databases.meta_dsn) if embedded_server is None
              else contextlib.nullcontext()):
            time.sleep(OUTAGE_SECONDS)
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(lambda server: server.start(), servers))
        assert started_at(dsn) != before, "PostgreSQL did not restart"

    with airflow_deployment.supervise():
        yield Fault(request.param, shared_server_down, shared=True)


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


def test_a_database_fault_under_the_deployment_loses_and_duplicates_nothing(
        airflow_api: AirflowApi, airflow_deployment: Deployment, events_app: Broker,
        system_databases: SystemDatabases, broker_fault: Fault) -> None:
    """On a server of its own, a fault of the broker's server stops no process of the
    deployment; on a server shared with Airflow's metadata, Airflow's daemons may exit and the
    supervisor starts them again, while the broker's worker carries on. Either way every message
    is processed once, in its conversation's order, and nothing is left behind."""
    dsn = system_databases.broker_dsn
    fault_name = broker_fault.name
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
    broker_fault.run()
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

    components = airflow_deployment.components
    restarted = {name: c.exits for name, c in components.items() if c.exits}
    print(f"  started again by the supervisor after exiting: {restarted or 'none'}")
    assert airflow_deployment.dead() == []
    if broker_fault.shared:
        # Airflow's daemons exit when their metadata is gone (the supervisor's business);
        # the broker's worker, on the broker's connections only, recovers in place.
        assert components[BROKER_WORKER].starts == 1
    else:
        # No component of the deployment exited, and none had to be restarted.
        assert all(c.starts == 1 for c in components.values())
    if components["triggerer"].starts == 1:
        # The watcher's stream lost its connection and got it back in place, not through a
        # new shared-stream group.
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
