"""The ``broker`` scheme for common-messaging: ``MessageQueueTrigger(scheme="broker",
queue_name=...)`` resolves to BrokerMessageTrigger, and so does the (deprecated) URI form
``MessageQueueTrigger(queue="broker://<conn_id>/<queue_name>")``.

common-messaging builds its list of providers when its trigger module is imported, so this
module stays cheap to import: the trigger class is imported only when asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from airflow.exceptions import AirflowOptionalProviderFeatureException

try:
    from airflow.providers.common.messaging.providers.base_provider import (
        BaseMessageQueueProvider,
    )
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise AirflowOptionalProviderFeatureException(
        "the broker message-queue provider needs apache-airflow-providers-common-messaging"
    ) from exc

if TYPE_CHECKING:
    from airflow.triggers.base import BaseEventTrigger

SCHEME = "broker"
TRIGGER_CLASS = "airflow_broker.triggers.broker.BrokerMessageTrigger"


class BrokerMessageQueueProvider(BaseMessageQueueProvider):
    """Messages on an airflow-broker queue as events for AssetWatchers.

    * ``MessageQueueTrigger(scheme="broker", queue_name="TraderQueue",
      broker_conn_id="broker_default")``
    * ``MessageQueueTrigger(queue="broker://broker_default/TraderQueue")`` (deprecated form)

    Extra keyword arguments go to BrokerMessageTrigger (``consumer_name``, ``batch_size``,
    ``poll_interval``, ``one_run_per_message``, ``ack_timeout``).
    """

    scheme = SCHEME

    def queue_matches(self, queue: str) -> bool:
        return queue.startswith(f"{SCHEME}://")

    def trigger_class(self) -> type[BaseEventTrigger]:
        module_name, _, class_name = TRIGGER_CLASS.rpartition(".")
        trigger: type[BaseEventTrigger] = getattr(importlib.import_module(module_name),
                                                  class_name)
        return trigger

    def trigger_kwargs(self, queue: str, **kwargs: Any) -> dict[str, Any]:
        """``broker://<conn_id>/<queue_name>``; the queue name may be schema-qualified."""
        parsed = urlparse(queue)
        queue_name = unquote(parsed.path.lstrip("/"))
        if not queue_name:
            raise ValueError(f"{queue!r} names no queue: use broker://<conn_id>/<queue_name>")
        result: dict[str, Any] = {"queue_name": queue_name}
        if parsed.netloc and "broker_conn_id" not in kwargs:
            result["broker_conn_id"] = unquote(parsed.netloc)
        return result
