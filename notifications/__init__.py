"""Airflow notifiers of airflow-broker, installed as ``airflow_broker.notifications``."""

from airflow_broker.notifications.broker import QueueDisabledNotifier

__all__ = ["QueueDisabledNotifier"]
