"""common-messaging's message-queue providers (installed as ``airflow_broker.queues``)."""
