"""The demo (``airflow-broker demo``) and its stock-trade application. Nothing in the engine
imports this package."""
