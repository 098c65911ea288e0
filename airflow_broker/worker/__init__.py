"""The broker worker: the background work SQL Server does inside its engine (timers,
lifetimes, reclaiming endpoints, counting poison rollbacks, activation, delivery to remote
brokers)."""

from airflow_broker.worker.service import BrokerWorker, PassResult, wait_until_idle

__all__ = ["BrokerWorker", "PassResult", "wait_until_idle"]
