"""What Airflow learns about airflow-broker through the ``apache_airflow_provider`` entry point.

Kept free of imports: Airflow calls it during provider discovery, in every Airflow process.
"""

from __future__ import annotations

from typing import Any

from airflow_broker.queries import DEFAULT_SCHEMA

INTEGRATION = "Service Broker on PostgreSQL"


def get_provider_info() -> dict[str, Any]:
    return {
        # Airflow checks this against the installed distribution's name.
        "package-name": "airflow-broker",
        "name": "airflow-broker",
        "description": "SQL Server Service Broker semantics on PostgreSQL: message types, "
                       "contracts, queues and services, dialogs with exactly-once in-order "
                       "delivery, transactional RECEIVE, WAITFOR, poison-message detection "
                       "and event notifications.",
        "integrations": [{
            "integration-name": INTEGRATION,
            "external-doc-url": "https://www.postgresql.org/",
            "tags": ["software"],
        }],
        "hooks": [{"integration-name": INTEGRATION,
                   "python-modules": ["airflow_broker.hooks.broker"]}],
        "operators": [{"integration-name": INTEGRATION,
                       "python-modules": ["airflow_broker.operators.broker",
                                          "airflow_broker.operators.setup",
                                          "airflow_broker.operators.spark"]}],
        "sensors": [{"integration-name": INTEGRATION,
                     "python-modules": ["airflow_broker.sensors.broker",
                                        "airflow_broker.sensors.queue_disabled"]}],
        "triggers": [{"integration-name": INTEGRATION,
                      "python-modules": ["airflow_broker.triggers.broker",
                                         "airflow_broker.triggers.stream"]}],
        "connection-types": [{
            "connection-type": "broker",
            "hook-class-name": "airflow_broker.hooks.broker.BrokerHook",
            "hook-name": "Service Broker on PostgreSQL",
            "ui-field-behaviour": {
                "hidden-fields": [],
                "relabeling": {"schema": "Database"},
                "placeholders": {
                    "host": "localhost",
                    "port": "5432",
                    "login": "postgres",
                    "schema": "airflow_broker",
                    "extra": '{"sslmode": "prefer"}',
                },
            },
            "conn-fields": {
                "broker_schema": {
                    "label": "Broker schema",
                    "description": "PostgreSQL schema that holds the broker "
                                   "(created by `airflow-broker install`)",
                    "schema": {"type": ["string", "null"], "default": DEFAULT_SCHEMA,
                               "maxLength": 63},
                },
                "sslmode": {
                    "label": "SSL mode",
                    "description": "libpq sslmode; when none is chosen, libpq's default "
                                   "(prefer) applies",
                    # No default and no None among the choices: Airflow's dropdown preselects
                    # the choice equal to the field's value, and None showed as a chosen
                    # "null". Optional through the "null" type.
                    "schema": {"type": ["string", "null"],
                               "enum": ["disable", "allow", "prefer", "require", "verify-ca",
                                        "verify-full"]},
                },
            },
        }],
        "notifications": ["airflow_broker.notifications.broker.QueueDisabledNotifier"],
        "queues": ["airflow_broker.queues.broker.BrokerMessageQueueProvider"],
    }
