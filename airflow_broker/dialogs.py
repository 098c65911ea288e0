"""Dialog statements: BEGIN DIALOG CONVERSATION and SEND (spec 6-7)."""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Sequence
from typing import Any

from airflow_broker._statements import Statements
from airflow_broker.errors import (
    NOT_A_HANDLE,
    IncorrectSyntax,
    LifetimeOutOfRange,
    NotAHandle,
)
from airflow_broker.validation import verdict

log = logging.getLogger(__name__)

MAX_LIFETIME = 2_147_483_647

Body = bytes | bytearray | memoryview | str | None


def conversation_handle(value: object) -> uuid.UUID:
    """A handle given as a UUID or as its text (handles travel through XCom as text)."""
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise NotAHandle(NOT_A_HANDLE) from None


def handle_array(handles: list[uuid.UUID]) -> str:
    """The handles as a uuid[] literal (UUIDs have no characters to quote): psycopg's
    adaptation of a list of UUIDs costs a SEND more client time than the rest of its
    parameters together."""
    return "{" + ",".join(map(str, handles)) + "}"


def body_bytes(body: Body) -> bytes | None:
    """Bodies are bytes; text is sent as UTF-8."""
    if body is None:
        return None
    if isinstance(body, str):
        return body.encode("utf-8")
    return bytes(body)


class ConversationStatements(Statements):
    __slots__ = ()

    def begin_dialog(
        self,
        from_service: str,
        to_service: str,
        contract: str = "DEFAULT",
        *,
        related_conversation: uuid.UUID | None = None,
        related_conversation_group: uuid.UUID | None = None,
        lifetime: int | None = MAX_LIFETIME,
        encryption: bool = True,
        to_broker_instance: str | None = None,
    ) -> uuid.UUID:
        """BEGIN DIALOG CONVERSATION; returns the initiator's conversation handle.

        ``lifetime`` is in seconds (SQL Server's default: 2,147,483,647); None is error 8406 as
        LIFETIME = NULL is in SQL Server. In a pipelined transaction the handle is a random
        UUID made here, and the statement travels with the next one that has an answer, or
        with the COMMIT, which raise its errors.
        """
        q = self._runner.function(
            "begin_dialog", 9,
            ["text", "text", "text", "uuid", "uuid", "integer", "boolean", "text", "uuid"],
        )
        if lifetime is not None and not 1 <= lifetime <= MAX_LIFETIME:
            raise LifetimeOutOfRange(
                f"The dialog lifetime value of {lifetime} is outside the allowable range of 1 to "
                "2147483647. Specify a valid dialog lifetime value.",
            )
        params = [from_service, to_service, contract, related_conversation,
                  related_conversation_group, lifetime, encryption, to_broker_instance]
        if self._runner.pipelining:
            handle = uuid.uuid4()
            self._runner.post(q, [*params, handle])
            return handle
        made: uuid.UUID = self._runner.scalar(q, [*params, None])
        return made

    def send(
        self,
        conversation_handles: uuid.UUID | str | Sequence[uuid.UUID | str],
        message_type: str = "DEFAULT",
        body: Body = None,
    ) -> None:
        """SEND ON CONVERSATION: one message on one or several conversations, atomically.

        ``body=None`` sends an empty body. XML message types are checked here as the target
        would check them; a body the target rejects is not an error of the SEND: the sender
        receives an Error message instead, as in SQL Server.
        """
        if isinstance(conversation_handles, (uuid.UUID, str)):
            handles = [conversation_handle(conversation_handles)]
        else:
            handles = [conversation_handle(h) for h in conversation_handles]
        q, params = self._send_call("send", handles, message_type, body)
        self._runner.post(q, params)

    def send_many(self, conversation_handle: uuid.UUID, message_type: str,
                  bodies: Sequence[Body]) -> None:
        """Several SENDs of one message type on one conversation, in order, in one round trip
        (and, when nothing needs a decision per message, one INSERT)."""
        data = [body_bytes(b) for b in bodies]
        if not data:
            return
        info = self._runner.shared.message_type_info(self._runner, message_type)
        checked_as = info.checked_as if info is not None else None
        problems = [verdict(info, d) if info is not None and checked_as and d else None
                    for d in data]
        q = self._runner.function("send_many", 5, ["uuid", "text", "bytea[]", "text", "text[]"])
        self._runner.post(q, [conversation_handle, message_type, data, checked_as,
                              problems if any(p is not None for p in problems) else None])

    def send_if_open(self, conversation_handle: uuid.UUID, message_type: str = "DEFAULT",
                     body: Body = None) -> bool:
        """SEND, unless the peer has already ended the conversation (the endpoint is no longer
        CONVERSING): then nothing is sent and the result is False, instead of error 8429. For
        replies, which may cross the peer's END CONVERSATION."""
        q, params = self._send_call("send_if_open", conversation_handle, message_type, body)
        sent: bool = self._runner.scalar(q, params)
        return sent

    def _send_call(self, function: str, handles: list[uuid.UUID] | uuid.UUID, message_type: str,
                   body: Body) -> tuple[bytes, list[Any]]:
        """The call of send() or send_if_open(), with the XML verdict of the body."""
        runner = self._runner
        data = body_bytes(body)
        info = runner.shared.message_type_info(runner, message_type)
        checked_as = None
        problem = None
        if info is not None and info.checked_as is not None and data:
            checked_as = info.checked_as
            problem = verdict(info, data)
        first = "uuid[]" if isinstance(handles, list) else "uuid"
        q = runner.function(function, 6, [first, "text", "bytea", "boolean", "text", "text"])
        target = handle_array(handles) if isinstance(handles, list) else handles
        return q, [target, message_type, data, body is None, checked_as, problem]

    def end_conversation(
        self,
        conversation_handle: uuid.UUID,
        *,
        error: int | None = None,
        description: str | None = None,
        cleanup: bool = False,
    ) -> None:
        """END CONVERSATION [WITH ERROR = error DESCRIPTION = description | WITH CLEANUP].

        A normal END sends EndDialog after every earlier message; WITH ERROR sends an Error
        (code > 0) and drops what was still waiting to be delivered; WITH CLEANUP removes the
        endpoint and everything it holds without telling the peer (meant for leaked or
        orphaned endpoints, never for normal processing).
        """
        if cleanup:
            if error is not None or description is not None:
                raise IncorrectSyntax("Incorrect syntax near 'CLEANUP': WITH ERROR and WITH "
                                       "CLEANUP exclude each other.")
            runner = self._runner
            runner.post(runner.function("end_conversation_with_cleanup", 1, ["uuid"]),
                        [conversation_handle])
            return
        # The four-argument form that end_conversation(handle) and
        # end_conversation_with_error() wrap: one PL/pgSQL call fewer per END.
        q = self._runner.function("end_conversation", 4, ["uuid", "boolean", "integer", "text"])
        with_error = error is not None or description is not None
        params = [conversation_handle, with_error, error, description]

        def warn(rows: list[Any]) -> None:
            if rows and rows[0][0] == "fire_and_forget":
                log.warning(
                    "conversation %s: the initiator ended in the transaction that sent its "
                    "first message, before the target answered (fire-and-forget). The target "
                    "endpoint will stay CLOSED until its lifetime ends and errors from the "
                    "target are lost; let the target end first, or give the dialog a LIFETIME.",
                    conversation_handle,
                )

        self._runner.post(q, params, then=warn)

    def get_transmission_status(self, conversation_handle: uuid.UUID) -> str:
        """GET_TRANSMISSION_STATUS: why the conversation's messages, or its acknowledgements,
        have not gone through (a route missing, the far broker unreachable, ...); empty when
        the last transmission succeeded or none was needed."""
        runner = self._runner
        status: str = runner.scalar(runner.function("get_transmission_status", 1, ["uuid"]),
                                    [conversation_handle])
        return status

    def begin_conversation_timer(self, conversation_handle: uuid.UUID, timeout: int) -> dt.datetime:
        """BEGIN CONVERSATION TIMER: a DialogTimer message arrives on this endpoint's own queue
        after ``timeout`` seconds (a second call replaces the deadline). Returns the deadline
        (UTC)."""
        q = self._runner.function("begin_conversation_timer", 2, ["uuid", "integer"])
        due: dt.datetime = self._runner.scalar(q, [conversation_handle, timeout])
        return due

    def move_conversation(
        self, conversation_handle: uuid.UUID, conversation_group_id: uuid.UUID
    ) -> None:
        """MOVE CONVERSATION into another group of the same service; both groups are locked."""
        q = self._runner.function("move_conversation", 2, ["uuid", "uuid"])
        self._runner.post(q, [conversation_handle, conversation_group_id])
