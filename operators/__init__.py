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

__all__ = [
    "AckMessagesOperator",
    "BeginConversationTimerOperator",
    "BeginDialogOperator",
    "BrokerSetupOperator",
    "EnableQueueOperator",
    "EndConversationOperator",
    "ReceiveMessagesOperator",
    "SendMessageOperator",
]
