"""Airflow operators of airflow-broker, installed as ``airflow_broker.operators``."""
