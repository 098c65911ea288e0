"""What the Python client costs per SEND transaction: this process's CPU for one SEND of 100
bytes in its own transaction through ``Broker.transaction()``, against the same statement,
parameters and round trips through plain psycopg (prepared; BEGIN sent with the statement,
then COMMIT), side by side in one run.

The server's work is the same on both sides; the difference is the client's: the pool, the
transaction object, the message-type check, the parameters' conversion. Variants alternate
within each round; the table gives the medians of the rounds and ours/plain.

    .venv/bin/python -m bench.client_cost                 # 3 rounds of 2,000, ~1 minute
    .venv/bin/python -m bench.client_cost --rounds 1 --transactions 50
"""

from __future__ import annotations

import argparse
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
from bench.report import median
from bench.rounds import rotated
from bench.scenario import Options

BODY = b"x" * 100


@dataclass(frozen=True)
class Variant:
    name: str
    transaction: Callable[[], None]


def _variants(dsn: str) -> tuple[list[Variant], Callable[[], None]]:
    broker = Broker(dsn)
    handle = ours_setup.send_dialog(broker)
    # The statement tx.send() renders: the call of send() with its casts.
    send = broker.queries.call("send", 6, ["uuid[]", "text", "bytea", "boolean", "text", "text"])
    conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=0)
    params: list[object] = [[handle], MESSAGE_TYPE, BODY, False, None, None]

    def ours() -> None:
        with broker.transaction() as tx:
            tx.send(handle, MESSAGE_TYPE, BODY)

    def plain() -> None:
        with conn.pipeline():
            conn.execute(b"BEGIN")
            conn.execute(send, params)
        conn.execute(b"COMMIT")

    def close() -> None:
        conn.close()
        broker.close()

    return [Variant("ours: Broker.transaction() and tx.send()", ours),
            Variant("plain psycopg: the same statement and round trips", plain)], close


def measure(variant: Variant, transactions: int) -> float:
    """This process's CPU per transaction, in µs."""
    started = time.process_time()
    for _ in range(transactions):
        variant.transaction()
    return (time.process_time() - started) / transactions * 1e6


def run(options: Options, transactions: int) -> str:
    results: dict[str, list[float]] = {}
    with database(options) as (dsn, _embedded):
        install(dsn)
        variants, close = _variants(durable(dsn))
        try:
            for variant in variants:
                measure(variant, max(1, transactions // 10))  # warm: prepared, pooled
            for r in range(options.rounds):
                for variant in rotated(variants, r):
                    results.setdefault(variant.name, []).append(measure(variant, transactions))
                    print(f"round {r + 1}: {variant.name}: {results[variant.name][-1]:,.0f} µs"
                          " of client CPU per transaction", file=sys.stderr)
        finally:
            close()
    names = list(results)
    plain = median(results[names[1]]) or 1.0
    lines = [f"{options.rounds} rounds of {transactions:,} SEND transactions (100 bytes) per"
             " variant; client CPU per transaction, median of the rounds", "",
             "| Client | CPU per SEND transaction (µs) | per round | ours/plain |",
             "|---|---:|---:|---:|"]
    for name in names:
        values = results[name]
        lines.append(f"| {name} | {median(values) or 0.0:,.0f} |"
                     f" {min(values):,.0f}-{max(values):,.0f} |"
                     f" {(median(values) or 0.0) / plain:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.client_cost",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--transactions", type=int, default=2000, help="per variant and round")
    parser.add_argument("--dsn", help="PostgreSQL to use (default: an embedded one)")
    args = parser.parse_args(argv)
    print(run(Options(rounds=args.rounds, dsn=args.dsn), args.transactions))
    return 0


if __name__ == "__main__":
    sys.exit(main())

