"""Poison strategies as objects: the built-in ones decide as spec 18.2 and the reader's
documentation say, and a strategy of one's own registers by name."""

from __future__ import annotations

import uuid

import pytest

from airflow_broker.messages import Message
from airflow_broker.poison.strategies import (
    Action,
    Failure,
    PoisonStrategy,
    TimerRetry,
    get_strategy,
    strategy_names,
)
from airflow_broker.readers.queue_reader import ReaderConfig


def failure(attempts: int, max_attempts: int = 3) -> Failure:
    message = Message(1, 5, 0, uuid.uuid4(), uuid.uuid4(), 0, "T", 0, "C", 0, "Req", 0, "N",
                      b"<trade/>", uuid.uuid4(), attempts - 1)
    return Failure(message, RuntimeError("boom"), attempts, max_attempts)


@pytest.mark.parametrize(("name", "first", "last"), [
    ("retry", Action.ROLL_BACK, Action.QUARANTINE),
    ("quarantine", Action.QUARANTINE, Action.QUARANTINE),
    ("end_conversation", Action.END_CONVERSATION, Action.END_CONVERSATION),
    # Poison detection disables the queue after five rollbacks: disable never gives up.
    ("disable", Action.ROLL_BACK, Action.ROLL_BACK),
    ("timer_retry", Action.PARK, Action.QUARANTINE),
])
def test_built_in_strategies_decide_by_attempts(name: str, first: Action, last: Action) -> None:
    strategy = get_strategy(name)
    assert strategy.name == name
    assert strategy.decide(failure(1)) is first
    assert strategy.decide(failure(3)) is last


def test_the_registry_lists_the_built_in_strategies_first() -> None:
    assert strategy_names()[:5] == ("retry", "quarantine", "end_conversation", "disable",
                                    "timer_retry")


def test_a_named_subclass_registers_and_a_name_is_taken_once() -> None:
    class AlwaysQuarantine(PoisonStrategy, name="test_always_quarantine"):
        def decide(self, failure: Failure) -> Action:
            return Action.QUARANTINE

    assert isinstance(get_strategy("test_always_quarantine"), AlwaysQuarantine)
    with pytest.raises(TypeError, match="AlwaysQuarantine"):
        type("Again", (PoisonStrategy,), {}, name="test_always_quarantine")


def test_unknown_strategies_and_non_strategies_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown poison strategy 'hope'"):
        get_strategy("hope")
    with pytest.raises(ValueError, match="not a PoisonStrategy"):
        get_strategy("tests.support.reader_handlers:book_trade")


def test_a_parking_strategy_needs_a_per_message_handler() -> None:
    assert TimerRetry.parks and TimerRetry.per_message
    with pytest.raises(ValueError, match="timer_retry needs a per-message handler"):
        ReaderConfig(queue_name="q", handler="m:f", batch=True, strategy="timer_retry")
