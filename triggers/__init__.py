"""Airflow triggers of airflow-broker, installed as ``airflow_broker.triggers``."""

from airflow_broker.triggers.broker import QueueDisabledTrigger, WaitForReceiveTrigger
from airflow_broker.triggers.stream import BrokerMessageTrigger

__all__ = ["BrokerMessageTrigger", "QueueDisabledTrigger", "WaitForReceiveTrigger"]
