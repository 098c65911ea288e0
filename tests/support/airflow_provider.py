"""The provider's modules for the tests.

mypy checks hooks/, operators/, sensors/, triggers/ and notifications/ as the top-level packages
they are in the source tree; installed (and at run time) they are airflow_broker.hooks and so
on. The tests import them from here, where that mapping is made once.
"""

from __future__ import annotations

from airflow_broker.hooks.broker import BrokerConnectionInfo, BrokerHook
from airflow_broker.notifications.broker import QueueDisabledNotifier
from airflow_broker.operators.broker import FireAndForgetWarning
from airflow_broker.operators.setup import apply_spec
from airflow_broker.sensors.broker import QueueDisabledSensor
from airflow_broker.triggers.broker import (
    BrokerMessageTrigger,
    BrokerStreamProducer,
    QueueDisabledTrigger,
    WaitForReceiveTrigger,
)

__all__ = [
    "BrokerConnectionInfo",
    "BrokerHook",
    "BrokerMessageTrigger",
    "BrokerStreamProducer",
    "FireAndForgetWarning",
    "QueueDisabledNotifier",
    "QueueDisabledSensor",
    "QueueDisabledTrigger",
    "WaitForReceiveTrigger",
    "apply_spec",
]
