"""Airflow operators of airflow-broker, installed as ``airflow_broker.operators``."""

from airflow_broker.operators.broker import (
    AckMessagesOperator,
    BeginConversationTimerOperator,
    BeginDialogOperator,
    EnableQueueOperator,
    EndConversationOperator,
    ReceiveMessagesOperator,
    SendMessageOperator,
)
from airflow_broker.operators.quarantine import QuarantineOperator
from airflow_broker.operators.setup import BrokerSetupOperator
from airflow_broker.operators.spark import ActivatedReaderOperator

__all__ = [
    "AckMessagesOperator",
    "ActivatedReaderOperator",
    "BeginConversationTimerOperator",
    "BeginDialogOperator",
    "BrokerSetupOperator",
    "EnableQueueOperator",
    "EndConversationOperator",
    "QuarantineOperator",
    "ReceiveMessagesOperator",
    "SendMessageOperator",
]
