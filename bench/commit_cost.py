"""What a COMMIT takes from issued to returned, after an idle pause and in a tight loop: a
transaction of one SEND (statements apart, as scenario e's sender) against one of a bare INSERT
of the same 100 bytes, side by side in one run.

Scenario e stamps its sender as COMMIT is issued, after a pause of 20-120 ms, so its latency
holds that COMMIT's time. This tells how much of it any transaction pays on this machine after
a pause (the bare INSERT's) and how much our SEND's adds. Variants alternate within each
round; the table gives the medians of the rounds' p50s and ours/bare.

    .venv/bin/python -m bench.commit_cost                 # 3 rounds of 200 commits, ~1 minute
    .venv/bin/python -m bench.commit_cost --rounds 1 --commits 20
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from airflow_broker import Broker
from airflow_broker.migrations import install
from bench import ours_setup
from bench.harness import database, durable
from bench.ours_ops import MESSAGE_TYPE
from bench.report import median, percentile
from bench.rounds import rotated
from bench.scenario import Options

BODY = b"x" * 100
# As e's sender waits before each SEND (20-120 ms): long enough for this machine to go idle.
PAUSE_SECONDS = (0.02, 0.04)
TABLE = "bench_commit_cost"


@dataclass(frozen=True)
class Variant:
    name: str
    pause: bool
    # One transaction; returns its COMMIT's time, issued to returned, in seconds.
    commit: Callable[[], float]


def _variants(dsn: str) -> tuple[list[Variant], Callable[[], None]]:
    broker = Broker(dsn)
    handle = ours_setup.send_dialog(broker)
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (payload bytea NOT NULL)")

    def ours() -> float:
        with broker.transaction() as tx:
            tx.send(handle, MESSAGE_TYPE, BODY)
            issued = time.perf_counter()
        return time.perf_counter() - issued

    def bare() -> float:
        with conn.transaction():
            conn.execute(f"INSERT INTO {TABLE} (payload) VALUES (%s)", [BODY])
            issued = time.perf_counter()
        return time.perf_counter() - issued

    def close() -> None:
        conn.close()
        broker.close()

    variants = [Variant(f"{name}, {'after a pause' if pause else 'tight loop'}", pause, commit)
                for pause in (True, False)
                for name, commit in (("bare INSERT", bare), ("ours SEND", ours))]
    return variants, close


def measure(variant: Variant, commits: int, rng: random.Random) -> tuple[float, float]:
    """p50 and p90 of ``commits`` COMMITs, in ms."""
    taken = []
    for _ in range(commits):
        if variant.pause:
            time.sleep(rng.uniform(*PAUSE_SECONDS))
        taken.append(variant.commit() * 1000)
    return median(taken) or 0.0, percentile(taken, 0.9) or 0.0


def run(options: Options, commits: int) -> str:
    rng = random.Random(0)
    results: dict[str, list[tuple[float, float]]] = {}
    with database(options) as (dsn, _embedded):
        install(dsn)
        variants, close = _variants(durable(dsn))
        try:
            for r in range(options.rounds):
                # Each round starts with another variant, so none always runs first.
                for variant in rotated(variants, r):
                    results.setdefault(variant.name, []).append(measure(variant, commits, rng))
                    p50, p90 = results[variant.name][-1]
                    print(f"round {r + 1}: {variant.name}: COMMIT p50 {p50:.3f} ms,"
                          f" p90 {p90:.3f} ms", file=sys.stderr)
        finally:
            close()
    lines = [f"{options.rounds} rounds of {commits} commits per variant; COMMIT issued to"
             " returned, medians of the rounds' p50 and p90", "",
             "| Transaction | COMMIT p50 (ms) | p90 (ms) | p50, ours/bare |",
             "|---|---:|---:|---:|"]
    for name, values in results.items():
        p50 = median([p for p, _ in values]) or 0.0
        p90 = median([p for _, p in values]) or 0.0
        bare = median([p for p, _ in results[name.replace("ours SEND", "bare INSERT")]]) or 1.0
        lines.append(f"| {name} | {p50:.3f} | {p90:.3f} | {p50 / bare:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.commit_cost",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--commits", type=int, default=200, help="per variant and round")
    parser.add_argument("--dsn", help="PostgreSQL to use (default: an embedded one)")
    args = parser.parse_args(argv)
    print(run(Options(rounds=args.rounds, dsn=args.dsn), args.commits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
