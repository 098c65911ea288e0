"""The Airflow plugin that adds the broker's pages to Airflow's UI (entry point
``airflow.plugins``: Airflow loads it from the installed package's metadata)."""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/broker"
BUNDLE_URL = f"{URL_PREFIX}/static/broker-ui.umd.cjs"


def _fastapi_app() -> dict[str, Any]:
    from airflow_broker.ui.api import app

    return {"app": app, "url_prefix": URL_PREFIX, "name": "Service Broker"}


class BrokerUIPlugin(AirflowPlugin):
    name = "airflow_broker_ui"
    fastapi_apps: list[Any] = [_fastapi_app()]  # noqa: RUF012 (AirflowPlugin's own type)
    # One bundle and one component for all three (it publishes itself as globalThis.Broker
    # and tells the pages apart by the route's props); the name is also the tabs' label.
    # url_routes must differ: the host drops an app whose route another one has.
    react_apps: list[Any] = [  # noqa: RUF012
        {
            "name": "Broker",
            "bundle_url": BUNDLE_URL,
            "destination": "nav",
            "url_route": "broker",
            "category": "Broker",
        },
        # A "Broker" tab on each DAG's page: the queues its broker tasks use.
        {"name": "Broker", "bundle_url": BUNDLE_URL, "destination": "dag",
         "url_route": "broker-dag"},
        # And on each task instance's page: its conversations and what it received.
        {"name": "Broker", "bundle_url": BUNDLE_URL, "destination": "task_instance",
         "url_route": "broker-task-instance"},
    ]
