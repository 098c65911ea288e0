"""airflow-broker: SQL Server Service Broker semantics on PostgreSQL."""

from airflow_broker.broker import Broker
from airflow_broker.errors import BrokerError, QueueDisabledError
from airflow_broker.messages import (
    DIALOG_TIMER,
    END_DIALOG,
    ERROR,
    ErrorDocument,
    Message,
    decode_body,
)
from airflow_broker.transaction import Transaction

__all__ = [
    "DIALOG_TIMER",
    "END_DIALOG",
    "ERROR",
    "Broker",
    "BrokerError",
    "ErrorDocument",
    "Message",
    "QueueDisabledError",
    "Transaction",
    "decode_body",
]
