"""Airflow operators of airflow-broker, installed as ``airflow_broker.operators``."""

from .broker import (
    AckMessagesOperator,
    BeginConversationTimerOperator,
    BeginDialogOperator,
    BrokerSetupOperator,
    EnableQueueOperator,
    EndConversationOperator,
    ReceiveMessagesOperator,
    SendMessageOperator,
)
from .spark import ActivatedReaderOperator, QuarantineOperator

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
