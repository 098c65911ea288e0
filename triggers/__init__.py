"""Airflow triggers of airflow-broker, installed as ``airflow_broker.triggers``."""

from .broker import BrokerMessageTrigger, QueueDisabledTrigger, WaitForReceiveTrigger

__all__ = ["BrokerMessageTrigger", "QueueDisabledTrigger", "WaitForReceiveTrigger"]
