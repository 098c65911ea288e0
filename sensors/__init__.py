"""Airflow sensors of airflow-broker, installed as ``airflow_broker.sensors``."""

from .broker import QueueDisabledSensor, WaitForReceiveSensor

__all__ = ["QueueDisabledSensor", "WaitForReceiveSensor"]
