"""Alternating rounds: every contender of a scenario is measured once per round, in the opposite
order every other round, so drift of the machine (page cache, autovacuum, WAL recycling) falls on
both sides alike; the median over rounds is reported."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from bench.ops import OpParams
from bench.scenario import Env
from bench.workers import Measurement

T = TypeVar("T")


def rotated(items: Sequence[T], round_number: int) -> list[T]:
    """``items`` starting at another one each round, for the side-by-side tools that run each
    variant once per round in one process: none always runs first, on a colder or warmer
    machine."""
    start = round_number % len(items)
    return [*items[start:], *items[:start]]


# A throughput loop stops after its time or this many transactions, whichever comes first.
MAX_TRANSACTIONS_PER_SECOND = 100_000


@dataclass
class Contender:
    key: str
    label: str
    # One op for every worker, or one per worker (roles: worker w runs op[w]).
    op: str | tuple[str, ...]
    workers: int
    params: OpParams
    # Readies the database for one measurement; returns the transaction budget.
    prepare: Callable[[], int]
    # Sees the measurement, e.g. to fill more next time when the queue ran dry.
    after: Callable[[Measurement], None] | None = None
    # What the measurement is worth, per second (default: messages of all workers).
    rate: Callable[[Measurement], float] | None = None
    unit: str = "msg/s"
    # Per worker, when the roles differ: the database each one uses (default: the run's), and
    # its warm-up transactions (default 10).
    dsns: tuple[str, ...] = ()
    warmups: tuple[int, ...] = ()
    # Runs after the warm-ups, just before the measurement starts.
    before_go: Callable[[], None] | None = None


def time_budget(seconds: float) -> int:
    return int(seconds * MAX_TRANSACTIONS_PER_SECOND) + 100


def alternate(env: Env, scenario: str, contenders: Sequence[Contender]) -> dict[str, list[float]]:
    """Messages per second of each contender, one value per round."""
    rounds = env.options.rounds
    rates: dict[str, list[float]] = {c.key: [] for c in contenders}
    for number in range(rounds):
        order = list(contenders) if number % 2 == 0 else list(reversed(contenders))
        for contender in order:
            budget = contender.prepare()
            measured = env.measure(
                contender.op, contender.workers, contender.params,
                seconds=env.options.seconds, max_ops=budget,
                dsns=contender.dsns, warmups=contender.warmups, before_go=contender.before_go,
            )
            if contender.after is not None:
                contender.after(measured)
            rate = measured.rate if contender.rate is None else contender.rate(measured)
            rates[contender.key].append(rate)
            env.progress(
                f"{scenario} round {number + 1}/{rounds} {contender.label}: "
                f"{rate:,.0f} {contender.unit} ({measured.messages:,} in {measured.elapsed:.1f} s)"
            )
    return rates


class Fill:
    """How many messages to put in a queue before a receive measurement: enough to last the
    measurement, found by doubling whenever a measurement ran the queue dry."""

    def __init__(self, start: int, cap: int) -> None:
        self.size = min(start, cap)
        self.cap = cap

    def after(self, measured: Measurement, seconds: float) -> None:
        if measured.exhausted and self.size < self.cap:
            wanted = measured.rate * seconds * 1.5 if measured.elapsed > 0 else self.size * 2
            self.size = min(self.cap, max(self.size * 2, int(wanted)))
