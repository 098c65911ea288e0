"""Every example DAG (dags/) end to end in the deployment, as users run them: triggered or
unpaused through the REST API, with the broker worker running, and no warning in any task's
log."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from airflow_broker import END_DIALOG, Broker
from airflow_broker.demos.trading import (
    BROKERAGE_SERVICE,
    CONTRACT,
    TRADE_ACK,
    TRADE_ENTRY,
    TRADER_SERVICE,
)
from tests.fixtures.system import SystemDatabases
from tests.support import roles
from tests.support.airflow_api import AirflowApi
from tests.support.deployment import Deployment
from tests.support.smtp import Mailbox


@pytest.fixture(scope="module")
def broker(system_databases: SystemDatabases) -> Iterator[Broker]:
    with Broker(system_databases.broker_dsn, poll_interval=0.2) as b:
        yield b


def succeeded(api: AirflowApi, dag_id: str, run: dict[str, object],
              expected: tuple[str, ...] = ()) -> None:
    """The run succeeded and its tasks logged nothing a user would have to look into: no
    warning but those that are the example's point (``expected``, parts of their text)."""
    run_id = str(run["dag_run_id"])
    assert run["state"] == "success", api.run_report(dag_id, run_id)
    unexpected = [w for w in api.warnings(dag_id, run_id)
                  if not any(part in w for part in expected)]
    assert not unexpected, "\n".join(unexpected)


def count(dsn: str, query: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0


def test_trading_demo(airflow_api: AirflowApi, system_databases: SystemDatabases) -> None:
    """`make demo`'s DAG under the scheduler: its Spark readers import the handler in
    processes where Airflow cannot be imported."""
    run = airflow_api.run_dag("broker_trading_demo", {"accounts": 4, "trades_per_account": 5})
    # The demo poisons its settlement queue and some trades on purpose: their alert and
    # quarantine lines are the warnings.
    succeeded(airflow_api, "broker_trading_demo", run,
              expected=("queue SettlementQueue was disabled (POISON)",
                        # the invalid trades quarantined by the readers, in their log
                        "-> quarantined"))
    dsn = system_databases.broker_dsn
    assert count(dsn, "SELECT count(*) FROM broker_demo.booked_trades") > 0
    assert count(dsn, "SELECT count(*) FROM broker_demo.quarantined_messages") > 0
    # Every trading dialog ended on both sides and its endpoints were reclaimed (the
    # settlement and notification dialogs stay open).
    assert count(dsn, "SELECT count(*) FROM broker_demo.conversation_endpoints e"
                      " JOIN broker_demo.services v USING (service_id)"
                      " WHERE v.name IN ('//Trading/TraderService',"
                      " '//Trading/BrokerageService')") == 0


def test_spark_readers_activated_by_event_notification(
        airflow_api: AirflowApi, airflow_deployment: Deployment, broker: Broker,
        system_databases: SystemDatabases) -> None:
    setup = airflow_api.run_dag("broker_spark_readers_setup")
    succeeded(airflow_api, "broker_spark_readers_setup", setup)
    airflow_api.wait_for_dag("broker_spark_readers")
    airflow_api.unpause("broker_spark_readers")
    with broker.transaction() as tx:
        handle = tx.begin_dialog(TRADER_SERVICE, BROKERAGE_SERVICE, CONTRACT)
        for n, final in ((1, ""), (2, ""), (3, ' final="yes"')):
            tx.send(handle, TRADE_ENTRY, f'<trade id="{n}"{final}><symbol>S{n}</symbol>'
                                         "<quantity>1</quantity></trade>")
    replies: list[str] = []

    def acknowledged() -> bool:
        with broker.transaction() as tx:
            for message in tx.receive("TraderQueue", conversation_handle=handle):
                replies.append(message.message_type_name)
                if message.is_end_dialog:
                    tx.end_conversation(handle)
        return END_DIALOG in replies

    # The worker's queue monitor notifies, the watcher starts a run, Spark's readers reply.
    airflow_deployment.wait_for(acknowledged, "the Spark readers' acknowledgements",
                                interval=1.0)
    assert replies == [TRADE_ACK] * 3 + [END_DIALOG]
    runs = airflow_api.dag_runs("broker_spark_readers")
    assert runs and all(r["run_type"] == "asset_triggered" for r in runs)
    # The later tests send to BrokerageQueue, with readers of their own: no reader job of this
    # example may still be running or be started by then. The queue monitor may have asked for
    # more readers while the first ones started, so the notifications stop first, then every
    # run (those started after the listing above too) finishes, and only then is the DAG
    # paused (a paused DAG's running runs would not go on).
    with broker.transaction() as tx:
        tx.drop_event_notification("activate_brokerage_readers", "BrokerageQueue")

    def settled() -> bool:
        """No notification waiting to become a run, and every run finished."""
        pending = (count(system_databases.broker_dsn,
                         'SELECT count(*) FROM "BrokerageActivationQueue"')
                   + count(system_databases.broker_dsn,
                           "SELECT count(*) FROM broker.airflow_inbox WHERE state = 'claimed'"
                           " AND queue_name = 'BrokerageActivationQueue'")
                   + airflow_api.get("/api/v2/dags/broker_spark_readers/assets/queuedEvents")[
                       "total_entries"])
        runs = airflow_api.dag_runs("broker_spark_readers")
        return pending == 0 and all(r["state"] in ("success", "failed") for r in runs)

    airflow_deployment.wait_for(settled, "every reader run of broker_spark_readers finished")
    airflow_api.set_paused("broker_spark_readers", True)
    for run in airflow_api.dag_runs("broker_spark_readers"):
        succeeded(airflow_api, "broker_spark_readers", run)
    # The queue's page in the UI (for a login that may read the queue) lists each reader run
    # with the task instance that submitted it.
    system_databases.grant_ui(roles.broker_grant("RECEIVE", "QUEUE::BrokerageQueue"))
    page = airflow_api.get("/broker/api/queues/BrokerageQueue")
    submitted = {(r["task_instance"]["dag_id"], r["task_instance"]["run_id"],
                  r["task_instance"]["task_id"]) for r in page["reader_runs"]}
    assert submitted == {("broker_spark_readers", r["dag_run_id"], "brokerage_readers")
                         for r in airflow_api.dag_runs("broker_spark_readers", state="success")}
    assert sum(r["processed"] or 0 for r in page["reader_runs"]) >= 3


def finished_runs(api: AirflowApi, deployment: Deployment, dag_id: str) -> list[dict[str, Any]]:
    """The runs of a continuous DAG that have finished, once there is one."""
    def done() -> list[dict[str, Any]]:
        return [r for r in api.dag_runs(dag_id) if r["state"] in ("success", "failed")]

    deployment.wait_for(lambda: bool(done()), f"a run of {dag_id} finished")
    return done()


def test_stock_trade_with_its_brokerage(airflow_api: AirflowApi,
                                        airflow_deployment: Deployment, broker: Broker,
                                        system_databases: SystemDatabases) -> None:
    airflow_api.wait_for_dag("broker_stock_trade_brokerage")
    airflow_api.unpause("broker_stock_trade_brokerage")
    run = airflow_api.run_dag("broker_stock_trade")
    succeeded(airflow_api, "broker_stock_trade", run)
    # The run that acknowledged the trades (the next one of the continuous DAG waits again).
    brokerage = finished_runs(airflow_api, airflow_deployment, "broker_stock_trade_brokerage")
    for done in brokerage:
        succeeded(airflow_api, "broker_stock_trade_brokerage", done)
    airflow_api.set_paused("broker_stock_trade_brokerage", True)
    handle = airflow_api.xcom("broker_stock_trade", run["dag_run_id"], "begin_dialog")
    with psycopg.connect(system_databases.broker_dsn) as conn:
        left = conn.execute("SELECT count(*) FROM broker.endpoints WHERE conversation_handle"
                            " = %s", [handle]).fetchone()
    assert left == (0,)  # the trader ended last: its endpoint is gone


def test_order_client_round_trip(airflow_api: AirflowApi) -> None:
    airflow_api.run_dag("broker_orders_setup")
    airflow_api.wait_for_dag("broker_orders")
    airflow_api.unpause("broker_orders")
    run = airflow_api.run_dag("broker_orders_client", {"order_id": "C-1", "item": "widget"})
    succeeded(airflow_api, "broker_orders_client", run)


def test_queue_alert_email_then_enable_and_maintenance(
        airflow_api: AirflowApi, airflow_deployment: Deployment, broker: Broker,
        system_mailbox: Mailbox, system_databases: SystemDatabases) -> None:
    airflow_api.wait_for_dag("broker_queue_alerts")
    airflow_api.unpause("broker_queue_alerts")

    def waiting() -> bool:
        runs = airflow_api.dag_runs("broker_queue_alerts", state="running")
        return any(airflow_api.task_states("broker_queue_alerts", r["dag_run_id"]).get(
            "wait_for_queue_disabled") == "deferred" for r in runs)

    airflow_deployment.wait_for(waiting, "the alert sensor deferred")
    # A trade no reader can process: five rolled-back receives, and the worker disables the
    # queue.
    with broker.transaction() as tx:
        handle = tx.begin_dialog(TRADER_SERVICE, BROKERAGE_SERVICE, CONTRACT)
        tx.send(handle, TRADE_ENTRY, "<trade id='666'><symbol>BAD</symbol></trade>")
    for attempt in range(5):
        with pytest.raises(RuntimeError), broker.transaction() as tx:
            # No reader of an earlier test may still read BrokerageQueue.
            assert tx.receive("BrokerageQueue", 1), f"receive {attempt + 1} found no trade"
            raise RuntimeError("the reader cannot process this trade")
    airflow_deployment.wait_for(lambda: bool(system_mailbox.messages), "the alert e-mail")
    mail = system_mailbox.messages[0]
    assert "BrokerageQueue" in str(mail["subject"])
    alerted = finished_runs(airflow_api, airflow_deployment, "broker_queue_alerts")
    airflow_api.set_paused("broker_queue_alerts", True)
    for run in alerted:
        succeeded(airflow_api, "broker_queue_alerts", run,
                  expected=("queue BrokerageQueue was disabled (POISON)",))

    # The doctor in the maintenance DAG fails on the disabled queue, as it should...
    failing = airflow_api.run_dag("broker_maintenance")
    assert failing["state"] == "failed"
    assert airflow_api.task_states("broker_maintenance", failing["dag_run_id"])["doctor"] == (
        "failed")
    # ...and passes once the cause is removed and the queue enabled again.
    with broker.transaction() as tx:
        tx.end_conversation(handle, cleanup=True)
    enabled = airflow_api.run_dag("broker_enable_queue", {"queue_name": "BrokerageQueue"})
    succeeded(airflow_api, "broker_enable_queue", enabled)
    assert count(system_databases.broker_dsn, "SELECT count(*) FROM broker.service_queues"
                 " WHERE name = 'BrokerageQueue' AND NOT is_receive_enabled") == 0
    healthy = airflow_api.run_dag("broker_maintenance")
    succeeded(airflow_api, "broker_maintenance", healthy)
