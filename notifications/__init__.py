"""Airflow notifiers of airflow-broker, installed as ``airflow_broker.notifications``."""

from .broker import QueueDisabledNotifier

__all__ = ["QueueDisabledNotifier"]
