"""Operators of airflow-broker: setup, dialogs, SEND, END CONVERSATION, timers, RECEIVE with a
callback in the same transaction, re-enabling queues, and acknowledging handed-over messages.

Conversation handles travel through XCom as strings. Every operator takes ``broker_conn_id``
(default ``broker_default``), a ``broker`` or ``postgres`` connection.
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from lxml import etree

from airflow_broker import Message, Transaction
from airflow_broker.admin.enable_queue import enable_queue
from airflow_broker.callables import load_callable
from airflow_broker.dialogs import MAX_LIFETIME
from airflow_broker.errors import IncorrectSyntax
from airflow_broker.hooks.broker import message_to_dict, task_consumer

if TYPE_CHECKING:
    from airflow.sdk import Context
from airflow_broker.operators._base import (
    BODY_FORMATS,
    BrokerBaseOperator,
    BrokerDeprecationWarning,
    FireAndForgetWarning,
    encode_body,
    renamed,
    to_handle,
    to_handles,
)
from airflow_broker.operators.setup import BrokerSetupOperator

__all__ = [
    "BODY_FORMATS", "AckMessagesOperator", "BeginConversationTimerOperator",
    "BeginDialogOperator", "BrokerBaseOperator", "BrokerDeprecationWarning",
    "BrokerSetupOperator", "EnableQueueOperator", "EndConversationOperator",
    "FireAndForgetWarning", "ReceiveMessagesOperator", "SendMessageOperator", "encode_body",
    "to_handle", "to_handles",
]

ReceiveCallback = Callable[[list[Message], Transaction, "Context"], Any]


class BeginDialogOperator(BrokerBaseOperator):
    """BEGIN DIALOG CONVERSATION; pushes the initiator's conversation handle (a string).

    :param lifetime: seconds (SQL Server's default: the maximum)
    """

    template_fields: Sequence[str] = (
        "from_service_name", "to_service_name", "contract_name", "related_conversation_handle",
        "related_conversation_group_id", "broker_conn_id",
    )

    def __init__(
        self,
        *,
        from_service_name: str,
        to_service_name: str,
        contract_name: str = "DEFAULT",
        lifetime: int = MAX_LIFETIME,
        related_conversation_handle: Any = None,
        related_conversation_group_id: Any = None,
        encryption: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.from_service_name = from_service_name
        self.to_service_name = to_service_name
        self.contract_name = contract_name
        self.lifetime = lifetime
        self.related_conversation_handle = related_conversation_handle
        self.related_conversation_group_id = related_conversation_group_id
        self.encryption = encryption

    def begin(self, tx: Transaction) -> uuid.UUID:
        return tx.begin_dialog(
            self.from_service_name, self.to_service_name, self.contract_name,
            related_conversation=None if not self.related_conversation_handle
            else to_handle(self.related_conversation_handle),
            related_conversation_group=None if not self.related_conversation_group_id
            else uuid.UUID(str(self.related_conversation_group_id)),
            lifetime=self.lifetime, encryption=self.encryption)

    def execute(self, context: Context) -> str:
        with self.hook() as hook, hook.transaction() as tx:
            handle = self.begin(tx)
        self.log.info("began dialog %s from %s to %s on %s", handle, self.from_service_name,
                      self.to_service_name, self.contract_name)
        return str(handle)


class SendMessageOperator(BrokerBaseOperator):
    """SEND ON CONVERSATION: one message on one or several conversations, or on a dialog the
    operator begins itself (give ``from_service_name``, ``to_service_name``,
    ``contract_name`` instead of ``conversation_handle``).

    ``body`` is text, bytes, an lxml element (XML) or any JSON value (see
    ``body_format``); it is templated, as is every name. Returns the conversation handle (a
    list of them when several were given).

    ``end_conversation=True`` ends the conversation after the SEND, in the same transaction.
    Combined with a dialog begun here, that is the fire-and-forget pattern, which leaks the
    target endpoint and loses the target's errors: a warning says so. Let the target end the
    conversation, and end yours when its EndDialog arrives.
    """

    template_fields: Sequence[str] = (
        "conversation_handle", "message_type_name", "body", "from_service_name",
        "to_service_name", "contract_name", "broker_conn_id",
    )

    def __init__(
        self,
        *,
        conversation_handle: Any = None,
        message_type_name: str = "DEFAULT",
        body: Any = None,
        body_format: str = "auto",
        from_service_name: str | None = None,
        to_service_name: str | None = None,
        contract_name: str = "DEFAULT",
        lifetime: int = MAX_LIFETIME,
        end_conversation: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if body_format not in BODY_FORMATS:
            raise IncorrectSyntax(f"body_format must be one of {BODY_FORMATS}")
        if conversation_handle is None and not (from_service_name and to_service_name):
            raise IncorrectSyntax("give conversation_handle, or from_service_name and "
                             "to_service_name to begin a dialog")
        if isinstance(body, etree._Element):
            # Serialised now: an element is no template and does not survive DAG serialisation.
            body = etree.tostring(body, encoding="utf-8")
        self.conversation_handle = conversation_handle
        self.message_type_name = message_type_name
        self.body = body
        self.body_format = body_format
        self.from_service_name = from_service_name
        self.to_service_name = to_service_name
        self.contract_name = contract_name
        self.lifetime = lifetime
        self.end_conversation = end_conversation

    def execute(self, context: Context) -> str | list[str]:
        data = encode_body(self.body, self.body_format)
        began = self.conversation_handle is None or self.conversation_handle == ""
        with self.hook() as hook, hook.transaction() as tx:
            if began:
                handles = [tx.begin_dialog(str(self.from_service_name),
                                           str(self.to_service_name), self.contract_name,
                                           lifetime=self.lifetime)]
            else:
                handles = to_handles(self.conversation_handle)
            tx.send(handles, self.message_type_name, data)
            if self.end_conversation:
                if began:
                    message = (
                        "SendMessageOperator began a dialog, sent on it and ended it in one "
                        "transaction (fire-and-forget): the target endpoint will stay CLOSED "
                        "until the dialog's lifetime ends and errors from the target are lost. "
                        "Let the target end the conversation and end yours on its EndDialog "
                        "(ReceiveMessagesOperator), or give the dialog a short lifetime.")
                    warnings.warn(message, FireAndForgetWarning, stacklevel=2)
                    self.log.warning(message)
                for handle in handles:
                    tx.end_conversation(handle)
        self.log.info("sent %s (%s bytes) on %s", self.message_type_name,
                      0 if data is None else len(data), ", ".join(map(str, handles)))
        if began or not isinstance(self.conversation_handle, list | tuple | set):
            return str(handles[0])
        return [str(h) for h in handles]


class EndConversationOperator(BrokerBaseOperator):
    """END CONVERSATION on one or several conversations, optionally WITH ERROR (``error``, a
    code > 0, and ``description``) or WITH CLEANUP (removes the endpoint without telling the
    peer: for leaked or orphaned endpoints only). The parameters are named as in
    ``Transaction.end_conversation``; ``error_code`` and ``error_description`` are their
    deprecated names (BrokerDeprecationWarning)."""

    template_fields: Sequence[str] = ("conversation_handle", "description", "broker_conn_id")

    def __init__(
        self,
        *,
        conversation_handle: Any,
        error: int | None = None,
        description: str | None = None,
        cleanup: bool = False,
        error_code: int | None = None,
        error_description: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        error = renamed("error_code", error_code, "error", error)
        description = renamed("error_description", error_description, "description",
                               description)
        if cleanup and (error is not None or description is not None):
            raise IncorrectSyntax("WITH CLEANUP and WITH ERROR exclude each other")
        self.conversation_handle = conversation_handle
        self.error = error
        self.description = description
        self.cleanup = cleanup

    def execute(self, context: Context) -> list[str]:
        handles = to_handles(self.conversation_handle)
        with self.hook() as hook, hook.transaction() as tx:
            for handle in handles:
                tx.end_conversation(handle, error=self.error, description=self.description,
                                    cleanup=self.cleanup)
        how = (" WITH CLEANUP" if self.cleanup else
               f" WITH ERROR {self.error}" if self.error is not None else "")
        self.log.info("ended%s: %s", how, ", ".join(map(str, handles)))
        return [str(h) for h in handles]


class BeginConversationTimerOperator(BrokerBaseOperator):
    """BEGIN CONVERSATION TIMER: a DialogTimer message arrives on the endpoint's own queue after
    ``timeout`` seconds. Returns the deadline (UTC, ISO 8601)."""

    template_fields: Sequence[str] = ("conversation_handle", "timeout", "broker_conn_id")

    def __init__(self, *, conversation_handle: Any, timeout: int | str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.conversation_handle = conversation_handle
        self.timeout = timeout

    def execute(self, context: Context) -> str:
        handle = to_handle(self.conversation_handle)
        with self.hook() as hook, hook.transaction() as tx:
            due = tx.begin_conversation_timer(handle, int(self.timeout))
        self.log.info("conversation timer on %s fires at %s UTC", handle, due)
        return due.isoformat()


class ReceiveMessagesOperator(BrokerBaseOperator):
    """RECEIVE and process in one transaction: the Airflow form of an activated procedure.

    Each batch is ``RECEIVE TOP(max_messages)`` (one conversation group, locked until the
    transaction ends) followed by ``callback(messages, tx, context)``. The callback may SEND
    replies, END conversations and write your own tables through ``tx`` (``tx.conn`` is the
    psycopg connection). The batch commits only when the callback returns; when it raises, the
    transaction rolls back, the messages return to the queue, the task fails, and the rollback
    counts towards poison-message detection.

    :param callback: a callable, or its import path (``package.module:function``)
    :param waitfor_timeout: WAITFOR up to this many seconds for the first batch (None: do not
        wait; for long waits use WaitForReceiveSensor, which frees the worker slot)
    :param until_empty: keep receiving batches, each in its own transaction, until RECEIVE
        returns nothing (or ``max_batches``)
    :return: the received messages as dicts (see ``airflow_broker.hooks.broker``)
    """

    template_fields: Sequence[str] = ("queue_name", "conversation_handle",
                                      "conversation_group_id", "broker_conn_id")

    def __init__(
        self,
        *,
        queue_name: str,
        callback: ReceiveCallback | str,
        max_messages: int | None = None,
        conversation_handle: Any = None,
        conversation_group_id: Any = None,
        waitfor_timeout: float | None = None,
        until_empty: bool = False,
        max_batches: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.queue_name = queue_name
        self.callback = callback
        self.max_messages = max_messages
        self.conversation_handle = conversation_handle
        self.conversation_group_id = conversation_group_id
        self.waitfor_timeout = waitfor_timeout
        self.until_empty = until_empty
        self.max_batches = max_batches

    def execute(self, context: Context) -> list[dict[str, Any]]:
        callback = load_callable(self.callback, "callback")
        handle = to_handle(self.conversation_handle) if self.conversation_handle else None
        group = uuid.UUID(str(self.conversation_group_id)) if self.conversation_group_id \
            else None
        received: list[dict[str, Any]] = []
        batches = 0
        with self.hook() as hook:
            while self.max_batches is None or batches < self.max_batches:
                wait = batches == 0 and self.waitfor_timeout is not None
                with hook.transaction() as tx:
                    messages = tx.receive(self.queue_name, self.max_messages,
                                          conversation_handle=handle,
                                          conversation_group_id=group, waitfor=wait,
                                          timeout=self.waitfor_timeout if wait else None)
                    if not messages:
                        break
                    callback(messages, tx, context)
                batches += 1
                received.extend(message_to_dict(m, queue_name=self.queue_name)
                                for m in messages)
                self.log.info("batch %d: %d message(s) processed and committed", batches,
                              len(messages))
                if not self.until_empty:
                    break
                if handle is not None and any(m.is_end_dialog or m.is_error
                                              for m in messages):
                    # Nothing follows an EndDialog or Error on a conversation, and the
                    # callback has probably ended it, so RECEIVE WHERE it would fail (8426).
                    break
        self.log.info("received %d message(s) from %s in %d transaction(s)", len(received),
                      self.queue_name, batches)
        return received


class EnableQueueOperator(BrokerBaseOperator):
    """ALTER QUEUE ... WITH STATUS = ON, after the cause of a poison-message disable is fixed.
    Returns the queue's state before and after."""

    template_fields: Sequence[str] = ("queue_name", "broker_conn_id")

    def __init__(self, *, queue_name: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.queue_name = queue_name

    def execute(self, context: Context) -> dict[str, Any]:
        with self.hook() as hook:
            result = enable_queue(hook.get_broker(), self.queue_name)
        if result.changed:
            self.log.info("queue %s enabled (it was disabled: %s since %s)", self.queue_name,
                          result.before.disabled_reason, result.before.disabled_at)
        else:
            self.log.info("queue %s was already enabled", self.queue_name)
        return result.as_dict()


class AckMessagesOperator(BrokerBaseOperator):
    """Removes messages from the Airflow inbox once the run has used them: those a
    WaitForReceiveSensor in receiving mode handed over (``sensor_task_ids``, this run), or
    the message dicts / asset events given as ``messages``. Returns how many were removed."""

    template_fields: Sequence[str] = ("sensor_task_ids", "broker_conn_id")

    def __init__(
        self,
        *,
        sensor_task_ids: Sequence[str] | str | None = None,
        messages: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.sensor_task_ids = sensor_task_ids
        self.messages = messages

    def execute(self, context: Context) -> int:
        ti = context["ti"]
        task_ids = ([self.sensor_task_ids] if isinstance(self.sensor_task_ids, str)
                    else list(self.sensor_task_ids or []))
        removed = 0
        with self.hook() as hook:
            for task_id in task_ids:
                removed += hook.ack_consumer(task_consumer(ti.dag_id, ti.run_id, task_id))
            if self.messages:
                items = self.messages if isinstance(self.messages, list) else [self.messages]
                removed += hook.ack(items)
        self.log.info("removed %d message(s) from the Airflow inbox", removed)
        return removed
