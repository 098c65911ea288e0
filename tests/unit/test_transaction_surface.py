"""What a user can call on a Transaction: Service Broker's statements and the documented
helpers, nothing of the runner behind them. A public ``commit()`` would let the rest of a
``Broker.transaction()`` block run statement by statement in autocommit, where a RECEIVE is
never registered for poison detection."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from airflow_broker import Transaction
from airflow_broker._statements import StatementRunner, runner_of
from airflow_broker.queries import Queries
from airflow_broker.readers.queue_reader import ReaderContext
from airflow_broker.readers.runs import ReaderStats

ROOT = Path(__file__).resolve().parents[2]

# Service Broker's statements (spec 2-10, 21) and the permission statements of docs/security.md.
STATEMENTS = {
    # the catalogue
    "create_message_type", "alter_message_type", "drop_message_type",
    "create_xml_schema_collection", "drop_xml_schema_collection",
    "create_contract", "drop_contract",
    "create_queue", "alter_queue", "tune_queue", "drop_queue",
    "create_service", "alter_service", "drop_service",
    "create_event_notification", "drop_event_notification",
    "create_route", "alter_route", "drop_route",
    "alter_broker",
    # permissions
    "grant", "deny", "revoke", "alter_authorization", "database_permissions",
    # conversations
    "begin_dialog", "send", "send_many", "send_if_open", "end_conversation",
    "get_transmission_status", "begin_conversation_timer", "move_conversation",
    # receiving
    "receive", "get_conversation_group",
}
# savepoint(): SAVE TRANSACTION; conn: the connection for the application's own statements in
# the same transaction (Broker.transaction()'s docstring, docs/architecture.md).
HELPERS = {"savepoint", "conn"}
# What the runner has and a Transaction must not: ending the transaction, raw statements,
# the pipeline, poison detection's bookkeeping, the Broker's shared state.
RUNNER_ONLY = {
    "commit", "rollback", "run", "scalar", "post", "function", "sync", "pipelined",
    "pipelining", "begun", "queries", "shared", "schema", "received_queues",
    "in_transaction", "locked_groups",
}


def public(names: list[str]) -> set[str]:
    return {name for name in names if not name.startswith("_")}


def transaction() -> Transaction:
    """A Transaction on no connection: nothing here sends a statement."""
    shared = cast("Any", SimpleNamespace(queries=Queries("broker")))
    return Transaction(cast("Any", object()), shared, begin=True)


def test_a_transactions_public_names_are_the_statements_and_the_documented_helpers() -> None:
    assert public(dir(Transaction)) == STATEMENTS | HELPERS
    assert public(dir(transaction())) == STATEMENTS | HELPERS


@pytest.mark.parametrize("name", sorted(RUNNER_ONLY))
def test_the_runners_names_are_not_a_transactions(name: str) -> None:
    tx = transaction()
    assert not hasattr(tx, name)
    with pytest.raises(AttributeError):
        getattr(tx, name)


def test_the_engine_reaches_the_runner_through_a_private_function() -> None:
    tx = transaction()
    runner = runner_of(tx)
    assert isinstance(runner, StatementRunner)
    assert RUNNER_ONLY - {"rollback"} <= set(dir(runner))
    assert runner_of(tx) is runner


def test_a_handlers_context_gives_the_schema_without_the_runner() -> None:
    ctx = ReaderContext(transaction(), "q", ReaderStats())
    assert ctx.schema == "broker"


def called_on_a_transaction(text: str) -> set[str]:
    return set(re.findall(r"\b(?:tx|Transaction)\.([A-Za-z_]\w*)", text))


@pytest.mark.parametrize("path", [
    "README.md", "CONTRIBUTING.md", *sorted(str(p.relative_to(ROOT)) for p in (
        *(ROOT / "docs").glob("*.md"), *(ROOT / "dags").glob("*.py"),
        *(ROOT / "airflow_broker" / "demos").glob("*.py"))),
])
def test_what_the_documentation_and_examples_call_on_a_transaction_is_public(path: str) -> None:
    called = called_on_a_transaction((ROOT / path).read_text())
    assert called <= STATEMENTS | HELPERS, f"{path} calls {sorted(called - STATEMENTS - HELPERS)}"
