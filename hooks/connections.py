"""Airflow connections for the parts of the engine that run outside a task: route addresses
of the form ``airflow://conn_id``, resolved by the broker worker's transport and the doctor."""

from __future__ import annotations

import sys
from typing import cast

from airflow.sdk import BaseHook, Connection

from airflow_broker.hooks.broker import BrokerConnectionInfo


def airflow_connection(conn_id: str) -> Connection:
    """The Airflow connection ``conn_id``, wherever this process runs.

    In a task (or the triggerer) the task SDK asks the API server through its supervisor. Any
    other process, such as a broker worker, is no task: there the task SDK's
    ``BaseHook.get_connection`` consults only environment variables and a configured secrets
    backend, never the metadata database (``ensure_secrets_backend_loaded``'s fallback chain in
    Airflow 3.3), so a connection created in the UI or with ``airflow connections add`` would
    not be found. Airflow core's lookup reads the same secrets backend, the environment and
    the metadata database, as ``airflow connections get`` does.
    """
    runner = sys.modules.get("airflow.sdk.execution_time.task_runner")
    if getattr(runner, "SUPERVISOR_COMMS", None) is not None:
        return BaseHook.get_connection(conn_id)
    try:
        from airflow.models.connection import Connection as CoreConnection
    except ImportError:  # a worker with only the task SDK has no metadata database to read
        return BaseHook.get_connection(conn_id)
    # Core's Connection has the attributes the SDK's has, which is all a caller reads.
    return cast("Connection", CoreConnection.get_connection_from_secrets(conn_id))


def far_broker_of(conn_id: str) -> tuple[str, str]:
    """The DSN and broker schema of the Airflow connection ``conn_id`` (a route's
    ``airflow://conn_id`` address)."""
    info = BrokerConnectionInfo.from_connection(airflow_connection(conn_id))
    return info.dsn, info.schema
