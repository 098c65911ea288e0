"""Errors as classes keyed by their SQL Server number, held to the SQL's error table and to
docs/errors.md, so a number can be neither raised without a class nor documented without
being raised."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest

from airflow_broker import BrokerError, QueueDisabledError
from airflow_broker.errors import (
    AddressError,
    ConversationNotFound,
    InvalidArgument,
    InvalidRouteAddress,
    NotFound,
    error_class,
    error_classes,
)

ROOT = Path(__file__).resolve().parents[2]
SQL = ROOT / "airflow_broker" / "sql" / "functions"


def sql_error_table() -> set[int]:
    text = (SQL / "00_support.sql").read_text()
    block = text[text.index("INSERT INTO error_messages"):]
    block = block[:block.index("ON CONFLICT")]
    return {int(n) for n in re.findall(r"^\s*\((\d+), '", block, re.M)}


def raised_in_sql() -> set[int]:
    return {int(n) for path in SQL.glob("*.sql")
            for n in re.findall(r"raise_error\(\s*(\d+)", path.read_text())}


def documented() -> dict[int, str]:
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \|", (ROOT / "docs/errors.md").read_text(), re.M)
    return {int(n): name for n, name in rows}


def test_every_number_of_the_error_table_has_its_class() -> None:
    assert sql_error_table() - set(error_classes()) == set()
    assert raised_in_sql() - set(error_classes()) == set()


def test_docs_list_every_class_under_its_number() -> None:
    assert documented() == {n: cls.__name__ for n, cls in error_classes().items()}


def test_the_number_builds_its_class() -> None:
    exc = BrokerError(8426, "Cannot find the conversation handle.")
    assert type(exc) is ConversationNotFound
    assert isinstance(exc, NotFound) and exc.number == 8426
    assert str(exc) == "Msg 8426: Cannot find the conversation handle."
    assert exc.message == "Cannot find the conversation handle."
    assert type(BrokerError(9617, "off")) is QueueDisabledError
    # A class raised by name carries its number.
    assert str(ConversationNotFound("gone")) == "Msg 8426: gone"


def test_a_number_without_a_class_stays_a_broker_error() -> None:
    exc = BrokerError(99999, "what")
    assert type(exc) is BrokerError and exc.number == 99999


def test_errors_survive_pickling_as_their_class() -> None:
    # Spark and Airflow move exceptions between processes by pickling them.
    again = pickle.loads(pickle.dumps(BrokerError(9617, "The queue is disabled.")))
    assert type(again) is QueueDisabledError and again.message == "The queue is disabled."


def test_invalid_arguments_are_value_errors_and_address_errors_are_9744() -> None:
    assert issubclass(InvalidArgument, ValueError)
    assert issubclass(AddressError, InvalidRouteAddress) and AddressError("x").number == 9744
    assert error_class(9744) is InvalidRouteAddress


def test_a_number_has_one_class() -> None:
    with pytest.raises(TypeError, match="ConversationNotFound"):
        type("Again", (BrokerError,), {}, number=8426)
