"""Errors raised by broker statements, each carrying its SQL Server error number."""

from __future__ import annotations

import re

import psycopg

# The SQL functions raise SQLSTATE SB000 with "Msg <number>: <text>".
BROKER_SQLSTATE = "SB000"
INVALID_TEXT_REPRESENTATION = "22P02"
_MSG = re.compile(r"^Msg (\d+): (.*)$", re.DOTALL)


class BrokerError(Exception):
    """A Service Broker statement failed; ``number`` is SQL Server's error number."""

    def __init__(self, number: int, message: str) -> None:
        super().__init__(f"Msg {number}: {message}")
        self.number = number
        self.message = message


class QueueDisabledError(BrokerError):
    """RECEIVE or GET CONVERSATION GROUP on a queue whose STATUS is OFF (error 9617)."""


_BY_NUMBER: dict[int, type[BrokerError]] = {9617: QueueDisabledError}

# SQL Server's 8169, for a conversation handle or group id that is not a UUID.
NOT_A_HANDLE = ("Conversion failed when converting from a character string to "
                "uniqueidentifier.")


def broker_error(number: int, message: str) -> BrokerError:
    return _BY_NUMBER.get(number, BrokerError)(number, message)


def translate(exc: psycopg.Error) -> BrokerError | None:
    """The BrokerError behind a database error raised by a broker function, if it is one."""
    if exc.sqlstate == INVALID_TEXT_REPRESENTATION and "type uuid" in (
            exc.diag.message_primary or ""):
        return BrokerError(8169, NOT_A_HANDLE)
    if exc.sqlstate != BROKER_SQLSTATE or exc.diag.message_primary is None:
        return None
    match = _MSG.match(exc.diag.message_primary)
    if match is None:
        return None
    return broker_error(int(match.group(1)), match.group(2))
