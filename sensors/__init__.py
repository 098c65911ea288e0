"""Airflow sensors of airflow-broker, installed as ``airflow_broker.sensors``."""

from airflow_broker.sensors.broker import WaitForReceiveSensor
from airflow_broker.sensors.queue_disabled import QueueDisabledSensor

__all__ = ["QueueDisabledSensor", "WaitForReceiveSensor"]
