"""Airflow hooks of airflow-broker, installed as ``airflow_broker.hooks``."""

from airflow_broker.hooks.broker import (
    BrokerHook,
    message_from_dict,
    message_to_dict,
    messages_from_events,
)

__all__ = ["BrokerHook", "message_from_dict", "message_to_dict", "messages_from_events"]
