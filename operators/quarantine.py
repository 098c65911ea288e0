"""QuarantineOperator: replays or discards quarantined messages from a DAG."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_broker.errors import IncorrectSyntax
from airflow_broker.hooks.broker import BrokerHook
from airflow_broker.poison import quarantine

if TYPE_CHECKING:
    from airflow.sdk import Context


class QuarantineOperator(BaseOperator):
    """Replays quarantined messages onto their conversations (after the handler was fixed) or
    discards them: the ids given, or every open one of ``queue_name``. Returns the ids done."""

    template_fields: Sequence[str] = ("quarantine_ids", "queue_name")

    def __init__(self, *, action: str, quarantine_ids: Sequence[int] | None = None,
                 queue_name: str | None = None,
                 broker_conn_id: str = BrokerHook.default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if action not in ("replay", "discard"):
            raise IncorrectSyntax("action must be replay or discard")
        if quarantine_ids is None and queue_name is None:
            raise IncorrectSyntax("give quarantine_ids, or queue_name for all of a queue")
        self.action = action
        self.quarantine_ids = quarantine_ids
        self.queue_name = queue_name
        self.broker_conn_id = broker_conn_id

    def execute(self, context: Context) -> list[int]:
        with BrokerHook(self.broker_conn_id) as hook:
            broker = hook.get_broker()
            if self.quarantine_ids is not None:
                ids = [int(i) for i in self.quarantine_ids]
            else:
                with broker.transaction() as tx:
                    ids = [q.quarantine_id
                           for q in quarantine.list_quarantined(tx, self.queue_name)]
            if ids:
                with broker.transaction() as tx:
                    (quarantine.replay if self.action == "replay" else quarantine.discard)(tx,
                                                                                           ids)
        self.log.info("%s %d quarantined messages: %s", "replayed" if self.action == "replay"
                      else "discarded", len(ids), ids)
        return ids
