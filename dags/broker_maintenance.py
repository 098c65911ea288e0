"""Broker maintenance from Airflow, every five minutes.

* ``worker_pass``: one pass of the broker worker (conversation timers, lifetimes, delivery
  from the transmission queue, reclaim of closed endpoints, poison-detection bookkeeping,
  event-notification replies), for deployments that run no ``airflow-broker worker``.
  Activation is left to a running worker: a task is too short-lived to own queue readers.
* ``doctor``: ``airflow-broker doctor``'s checks (disabled queues, activation, stuck queue
  monitors, leaks, the transmission queue, services); the task fails when a check finds an
  error, so a poisoned queue or a broken activation shows up as a failed maintenance run.
* ``leak_report``: leaked conversation endpoints per service (``broker.leaked_endpoint_counts``);
  remove them with ``airflow-broker cleanup`` once their cause is fixed.
* ``inbox_report``: what the Airflow inbox holds, and removal of the messages held for DAG runs
  that have succeeded (their tasks have used them).

Every task reads or does what only the broker schema's owner may, so the DAG uses the
connection ``broker_worker``: the login of ``airflow-broker worker``, a member of the owner
(docs/security.md), not the applications' ``broker_default``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import dag, get_current_context, task
from airflow.sdk.exceptions import AirflowException
from psycopg import sql

from airflow_broker.admin.doctor import ERROR, diagnose
from airflow_broker.hooks import BrokerHook
from airflow_broker.worker import BrokerWorker

log = logging.getLogger(__name__)

CONN_ID = "broker_worker"


@dag(
    dag_id="broker_maintenance",
    schedule=timedelta(minutes=5),
    max_active_runs=1,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["airflow-broker", "example"],
    doc_md=__doc__,
)
def broker_maintenance() -> None:
    @task
    def worker_pass() -> dict[str, int]:
        with BrokerHook(CONN_ID) as hook:
            result = BrokerWorker(hook.get_broker(), activation=False).run_once()
        log.info("broker worker pass: %s", result)
        return dataclasses.asdict(result)

    @task
    def doctor() -> dict[str, Any]:
        with BrokerHook(CONN_ID) as hook:
            report = diagnose(hook.get_broker())
        for line in report.to_text().splitlines():
            log.info("%s", line)
        errors = [f for f in report.findings if f.severity == ERROR]
        if errors:
            raise AirflowException("airflow-broker doctor: " + "; ".join(
                f"{f.check} {f.subject}: {f.problem} (fix: {f.fix})" for f in errors))
        result: dict[str, Any] = json.loads(report.to_json())
        return result

    @task
    def leak_report() -> list[dict[str, Any]]:
        with BrokerHook(CONN_ID) as hook, hook.transaction() as tx:
            rows = tx.conn.execute(sql.SQL(
                "SELECT service_name, far_service, leaked, oldest"
                " FROM {}.leaked_endpoint_counts ORDER BY leaked DESC").format(
                    sql.Identifier(hook.schema))).fetchall()
        report = [{"service_name": s, "far_service": f, "leaked": int(n),
                   "oldest": None if o is None else o.isoformat()} for s, f, n, o in rows]
        for line in report:
            log.warning("%(leaked)s leaked endpoint(s) of %(service_name)s with "
                        "%(far_service)s, the oldest from %(oldest)s", line)
        if not report:
            log.info("no leaked conversation endpoints")
        return report

    @task
    def inbox_report() -> dict[str, Any]:
        ti: Any = get_current_context()["ti"]
        with BrokerHook(CONN_ID) as hook:
            with hook.transaction() as tx:
                rows = tx.conn.execute(sql.SQL(
                    "SELECT consumer, state, dag_id, run_id, sum(messages)::bigint,"
                    " min(oldest_claimed_at) FROM {}.airflow_inbox_summary"
                    " GROUP BY consumer, state, dag_id, run_id ORDER BY consumer").format(
                        sql.Identifier(hook.schema))).fetchall()
            purged = 0
            held = []
            for consumer, state, dag_id, run_id, messages, oldest in rows:
                finished = None
                if dag_id and run_id and consumer.startswith("task:"):
                    try:
                        finished = ti.get_dagrun_state(dag_id=dag_id, run_id=run_id)
                    except Exception as exc:  # the run may have been deleted
                        log.info("state of %s/%s unknown: %s", dag_id, run_id, exc)
                if finished == "success":
                    purged += hook.ack_consumer(consumer)
                    continue
                held.append({"consumer": consumer, "state": state, "messages": int(messages),
                             "oldest": None if oldest is None else oldest.isoformat()})
                log.info("inbox: %s holds %s %s message(s) since %s", consumer, messages,
                         state, oldest)
        log.info("removed %d message(s) held for DAG runs that succeeded", purged)
        return {"purged": purged, "held": held}

    worker_pass() >> [doctor(), leak_report(), inbox_report()]


broker_maintenance()
