"""Poison strategies: what a queue reader does with a message its handler failed on (spec
18.2). A strategy decides; the reader acts, in the RECEIVE's transaction.

- ``retry``: roll the whole transaction back so the messages come back (transient errors);
  after ``max_attempts`` a message is quarantined instead.
- ``quarantine``: move it to the quarantine table with its error and traceback, commit the rest.
- ``end_conversation``: END CONVERSATION WITH ERROR on its conversation.
- ``disable``: roll back and leave it to poison-message detection, which disables the queue and
  raises BROKER_QUEUE_DISABLED after five rollbacks (SQL Server's behaviour).
- ``timer_retry``: park it in the quarantine table as "retrying", start a conversation timer, and
  try again when the DialogTimer arrives; later messages of the conversation wait behind it, so
  its order holds; after ``max_attempts`` it stays quarantined.

A strategy of your own is a subclass of :class:`PoisonStrategy` named by a ``name=`` class
argument (registered when its module is imported), or one named by its import path
(``package.module:ClassName``) wherever a strategy name is taken: the reader, the Spark reader
application and ActivatedReaderOperator.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar

from airflow_broker.callables import load_callable
from airflow_broker.errors import IncorrectSyntax
from airflow_broker.messages import Message

_REGISTRY: dict[str, type[PoisonStrategy]] = {}


class Action(enum.Enum):
    """What the reader does with the failed message; the value is what its report says."""

    ROLL_BACK = "rolled back"
    QUARANTINE = "quarantined"
    END_CONVERSATION = "conversation ended with error"
    PARK = "parked for a timer retry"


@dataclass(frozen=True)
class Failure:
    """A message the handler failed on: ``attempts`` counts this one."""

    message: Message
    error: BaseException
    attempts: int
    max_attempts: int

    @property
    def attempts_left(self) -> bool:
        return self.attempts < self.max_attempts


class PoisonStrategy:
    """Decides what happens to a failed message.

    ``parks`` says the strategy may answer :attr:`Action.PARK`: the reader then keeps a
    conversation's later messages behind a parked one and retries parked messages when the
    conversation's DialogTimer arrives. ``per_message`` says it needs a per-message handler
    (a batch handler has worked on a conversation's later messages before an earlier one
    fails, so their order could not be kept)."""

    name: ClassVar[str] = ""
    parks: ClassVar[bool] = False
    per_message: ClassVar[bool] = False

    def __init_subclass__(cls, *, name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if name is not None:
            if name in _REGISTRY:
                raise TypeError(f"poison strategy {name!r} is {_REGISTRY[name].__name__}")
            _REGISTRY[name] = cls
            cls.name = name

    def decide(self, failure: Failure) -> Action:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Retry(PoisonStrategy, name="retry"):
    def decide(self, failure: Failure) -> Action:
        return Action.ROLL_BACK if failure.attempts_left else Action.QUARANTINE


class Quarantine(PoisonStrategy, name="quarantine"):
    def decide(self, failure: Failure) -> Action:
        return Action.QUARANTINE


class EndConversation(PoisonStrategy, name="end_conversation"):
    def decide(self, failure: Failure) -> Action:
        return Action.END_CONVERSATION


class Disable(PoisonStrategy, name="disable"):
    def decide(self, failure: Failure) -> Action:
        return Action.ROLL_BACK


class TimerRetry(PoisonStrategy, name="timer_retry"):
    parks = True
    per_message = True

    def decide(self, failure: Failure) -> Action:
        return Action.PARK if failure.attempts_left else Action.QUARANTINE


def strategy_names() -> tuple[str, ...]:
    """The registered strategies' names (the built-in ones first)."""
    return tuple(_REGISTRY)


def get_strategy(spec: str | PoisonStrategy) -> PoisonStrategy:
    """The strategy named ``spec``: a registered name or ``package.module:ClassName``."""
    if isinstance(spec, PoisonStrategy):
        return spec
    if spec in _REGISTRY:
        return _REGISTRY[spec]()
    if ":" in spec:
        found = load_callable(spec, "poison strategy")
        if isinstance(found, type) and issubclass(found, PoisonStrategy):
            return found()
        raise IncorrectSyntax(f"poison strategy {spec!r} is not a PoisonStrategy subclass")
    raise IncorrectSyntax(f"unknown poison strategy {spec!r}; one of {strategy_names()}, "
                     "or package.module:ClassName")
