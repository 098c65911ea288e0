"""RECEIVE and GET CONVERSATION GROUP, with WAITFOR (spec 8-10)."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

from airflow_broker._statements import Statements
from airflow_broker.errors import IncorrectSyntax, ValueOutOfRange
from airflow_broker.messages import RECEIVED_COLUMNS, Message

T = TypeVar("T")


class ReceiveStatements(Statements):
    __slots__ = ()

    def receive(
        self,
        queue_name: str,
        top: int | None = None,
        *,
        conversation_handle: uuid.UUID | None = None,
        conversation_group_id: uuid.UUID | None = None,
        waitfor: bool = False,
        timeout: float | None = None,
    ) -> list[Message]:
        """RECEIVE [TOP (top)] * FROM queue [WHERE ...], optionally inside WAITFOR.

        Every message returned belongs to one conversation group, which stays locked until this
        transaction ends. With ``waitfor`` the call waits until a message is there or
        ``timeout`` seconds (None: no limit) have passed, and then returns an empty list; it
        holds no lock while it waits.
        """
        runner = self._runner
        q = runner.queries["receive"]
        params = [queue_name, top, conversation_handle, conversation_group_id]

        def once() -> list[Message]:
            rows = runner.run(q, params)
            messages = [Message.from_row(row) for row in rows]
            if messages:
                runner.locked_groups({m.conversation_group_id for m in messages})
                xid, queue_id, poison_handling = rows[0][len(RECEIVED_COLUMNS):]
                runner.shared.stats.received += len(messages)
                runner.shared.poison.received(runner, queue_id, xid,
                                              [m.message_id for m in messages], poison_handling)
            return messages

        return self._waitfor(queue_name, once, bool, waitfor, timeout, [])

    def get_conversation_group(
        self, queue_name: str, *, waitfor: bool = False, timeout: float | None = None
    ) -> uuid.UUID | None:
        """GET CONVERSATION GROUP: locks and returns the next group with ready messages, or
        None when there is none (after ``timeout`` seconds with ``waitfor``)."""
        runner = self._runner
        q = runner.function("get_conversation_group", 1, ["text"])

        def once() -> uuid.UUID | None:
            group: uuid.UUID | None = runner.scalar(q, [queue_name])
            if group is not None:
                runner.locked_groups({group})
            return group

        return self._waitfor(queue_name, once, lambda g: g is not None, waitfor, timeout, None)

    def _waitfor(
        self,
        queue_name: str,
        attempt: Callable[[], T],
        found: Callable[[T], bool],
        waitfor: bool,
        timeout: float | None,
        empty: T,
    ) -> T:
        if timeout is not None and not waitfor:
            raise IncorrectSyntax("Incorrect syntax near 'TIMEOUT': TIMEOUT needs WAITFOR.")
        if timeout is not None and (math.isnan(timeout) or timeout < 0):
            raise ValueOutOfRange(f"Incorrect value {timeout} for TIMEOUT; expected seconds >= 0.")
        result = attempt()
        if found(result) or not waitfor:
            return result
        deadline = None if timeout is None else time.monotonic() + timeout
        shared = self._runner.shared
        queue_id = shared.queue_id(self._runner, queue_name)
        poll = shared.poll_interval
        with shared.wakeups.waiting(queue_id) as waiter:
            # A SEND that looked for waiters just before this one was registered, and commits
            # just after the check below, sends no NOTIFY: the first polls come quickly, so
            # that race costs milliseconds, and the rest at the poll interval.
            pause = 0.005
            while True:
                result = attempt()
                if found(result):
                    return result
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return empty
                pause = min(pause * 2, poll)
                waiter.wait(pause if remaining is None else min(pause, remaining))
