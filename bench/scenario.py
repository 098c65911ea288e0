"""What a scenario of ``python -m bench`` is given and how it makes itself known.

A scenario module registers its measurements with ``@register(letter, ...)``; the harness runs
whatever is registered and imports no scenario, and no scenario imports the harness: both
import this module only. bench.suite names the scenario modules to load.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import sql

from airflow_broker import Broker
from bench.ops import Conn, OpParams
from bench.ours_setup import Catalog
from bench.report import Scenario
from bench.workers import LoadTask, Measurement, WorkerPool

# The letters of the report, in its order.
SCENARIOS = ("a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l")
# The order the scenarios run in: the big fills (i, g) come last, so their rows never slow the
# small scenarios down.
RUN_ORDER = ("a", "f", "b", "c", "d", "e", "h", "j", "k", "l", "i", "g")
# How long a measurement waits for an autovacuum worker in the database to finish.
AUTOVACUUM_WAIT = 60.0


@dataclass(frozen=True)
class Options:
    rounds: int = 5
    # Length of each throughput measurement.
    seconds: float = 5.0
    quick: bool = False
    only: frozenset[str] | None = None
    dsn: str | None = None
    json_path: Path | None = None
    latency_samples: int = 200
    growth_sizes: tuple[int, ...] = (1_000, 100_000, 1_000_000)
    drain_messages: int = 1_000_000
    # Messages drained by the Spark readers, and by their peer, in scenario j.
    spark_messages: int = 20_000
    # A CHECKPOINT before every measurement, so none lands inside one and each starts with
    # the same full-page-write debt.
    checkpoint: bool = True
    progress: Callable[[str], None] | None = None

    @classmethod
    def quick_preset(cls, **overrides: Any) -> Options:
        """A smoke run of a few seconds: every scenario, tiny sizes, numbers not meaningful."""
        preset: dict[str, Any] = {
            "quick": True, "rounds": 1, "seconds": 0.2, "latency_samples": 3,
            "growth_sizes": (1_000, 10_000), "drain_messages": 20_000, "checkpoint": False,
            "spark_messages": 400,
        }
        preset.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**preset)

    def selected(self, scenario: str) -> bool:
        return self.only is None or scenario in self.only


def stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class Env:
    """What every scenario uses: the database, our catalog, the workers, progress output."""

    options: Options
    dsn: str
    admin: Conn
    broker: Broker
    catalog: Catalog
    pool: WorkerPool
    started: float = field(default_factory=time.monotonic)

    def progress(self, text: str) -> None:
        (self.options.progress or stderr)(f"[{time.monotonic() - self.started:7.1f}s] {text}")

    @contextmanager
    def transaction(self) -> Iterator[Conn]:
        with psycopg.connect(self.dsn) as conn, conn.transaction():
            yield conn

    def settle(self, tables: Sequence[str]) -> None:
        """Leaves no dead rows or stale statistics from the previous measurement to either side,
        and no autovacuum running in the database when the next one starts."""
        for name in tables:
            schema, table = name.split(".")
            self.admin.execute(
                sql.SQL("VACUUM (ANALYZE) {}").format(sql.Identifier(schema, table))
            )
        self.await_autovacuum()
        if self.options.checkpoint:
            self.admin.execute("CHECKPOINT")

    def await_autovacuum(self) -> None:
        # Autovacuum of an earlier scenario's table once ran for 10 s into g's measurements at
        # 100,000 messages; whichever side it lands on pays for it.
        deadline = time.monotonic() + AUTOVACUUM_WAIT
        waited = False
        while True:
            row = self.admin.execute(
                "SELECT string_agg(pid::text, ', ') FROM pg_stat_activity"
                " WHERE backend_type = 'autovacuum worker' AND datname = current_database()"
            ).fetchone()
            running = row[0] if row else None
            if running is None:
                return
            if time.monotonic() > deadline:
                self.progress(f"autovacuum (pid {running}) still running after "
                              f"{AUTOVACUUM_WAIT:.0f} s; measuring anyway")
                return
            if not waited:
                self.progress(f"waiting for autovacuum (pid {running}) to finish")
                waited = True
            time.sleep(0.2)

    def measure(
        self,
        op: str | Sequence[str],
        workers: int,
        params: OpParams,
        *,
        seconds: float,
        max_ops: int,
        warmup_ops: int = 10,
        record_latencies: bool = False,
        track_rss: bool = False,
        dsns: Sequence[str] = (),
        warmups: Sequence[int] = (),
        before_go: Callable[[], None] | None = None,
    ) -> Measurement:
        """One measurement of ``workers`` processes started together; with a sequence of ops,
        worker ``w`` runs ``op[w]`` (different roles in one measurement). ``dsns`` and
        ``warmups``, when given, are per worker: the database each one uses (default: this
        run's) and its warm-up transactions (default ``warmup_ops``). ``before_go`` runs after
        the warm-ups, before the measurement starts."""
        tasks = [
            LoadTask(op=op if isinstance(op, str) else op[w],
                     dsn=dsns[w] if dsns else self.dsn, worker=w,
                     params=params, seconds=seconds,
                     max_ops=max_ops, warmup_ops=warmups[w] if warmups else warmup_ops,
                     record_latencies=record_latencies, track_rss=track_rss)
            for w in range(workers)
        ]
        return self.pool.run_load(tasks, before_go)


# Measures the letters it was registered for: one Scenario, or one per letter.
Measure = Callable[[Env], Scenario | list[Scenario]]


M = TypeVar("M", bound=Measure)


@dataclass(frozen=True)
class Registered:
    # The report's letters this measurement produces (a and f come from one measurement).
    letters: tuple[str, ...]
    measure: Measure
    # Load processes it needs at once, when more than the harness starts anyway.
    processes: Callable[[Options], int] | None = None

    def selected(self, options: Options) -> bool:
        return any(options.selected(letter) for letter in self.letters)


_registered: dict[str, Registered] = {}


def register(*letters: str, processes: Callable[[Options], int] | None = None
             ) -> Callable[[M], M]:
    """Registers the decorated function as the measurement of ``letters``."""
    unknown = set(letters) - set(SCENARIOS)
    if unknown or not letters:
        raise ValueError(f"no scenario letters {sorted(unknown)}")

    def add(measure: M) -> M:
        entry = Registered(letters, measure, processes)
        for letter in letters:
            if letter in _registered:
                raise ValueError(f"scenario {letter} is registered twice")
            _registered[letter] = entry
        return measure

    return add


def registered() -> list[Registered]:
    """Every registered measurement once, in RUN_ORDER."""
    seen: list[Registered] = []
    for letter in RUN_ORDER:
        entry = _registered.get(letter)
        if entry is not None and entry not in seen:
            seen.append(entry)
    return seen
