"""``python -m bench.jit_cost --dsn DSN``: SEND and RECEIVE with the server's JIT on and off.

The broker's functions run with ``jit = off`` (sql/functions/99_privileges.sql): their
planner settings put the estimated costs of their statements past ``jit_above_cost``, and a
server that can JIT-compile (``pg_jit_available()``; most packaged PostgreSQL builds can, the
embedded one cannot) compiled every statement of every SEND anew. This measures one
client's SEND of one message per transaction and RECEIVE TOP(1)+commit in sessions with
``jit = on`` and with ``jit = off``, alternating, so both columns match when the functions'
own setting holds. It installs the broker schema in the DSN's database: use one of its own.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid

import psycopg

from airflow_broker import Broker
from airflow_broker.migrations import install
from bench import ours_setup
from bench.ops import binary_body, with_settings
from bench.ours_ops import MESSAGE_TYPE

SETTINGS = ("off", "on")


def _per_call(broker: Broker, handle: uuid.UUID, queue: str, calls: int) -> tuple[float, float]:
    """Milliseconds per SEND transaction and per RECEIVE TOP(1) transaction."""
    body = binary_body(100)
    started = time.perf_counter()
    for _ in range(calls):
        with broker.transaction() as tx:
            tx.send(handle, MESSAGE_TYPE, body)
    send = (time.perf_counter() - started) / calls * 1000
    started = time.perf_counter()
    for _ in range(calls):
        with broker.transaction() as tx:
            if len(tx.receive(queue, top=1)) != 1:
                raise RuntimeError("a RECEIVE found no message the SENDs before it left")
    receive = (time.perf_counter() - started) / calls * 1000
    return send, receive


def run(dsn: str, calls: int, rounds: int) -> tuple[bool, dict[str, tuple[float, float]]]:
    """Whether the server can JIT-compile, and per setting the median ms of a SEND and of a
    RECEIVE transaction."""
    install(dsn)
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pg_jit_available()").fetchone()
    available = bool(row and row[0])
    with Broker(dsn) as setup:
        target = ours_setup.setup_catalog(setup).targets["send"]
        handle = ours_setup.begin_dialogs(setup, target, 1)[0]
    with psycopg.connect(dsn, autocommit=True) as conn:
        ours_setup.purge(conn, target)
    samples: dict[str, list[tuple[float, float]]] = {setting: [] for setting in SETTINGS}
    for number in range(rounds):
        order = SETTINGS if number % 2 == 0 else SETTINGS[::-1]
        for setting in order:
            with Broker(with_settings(dsn, jit=setting), max_connections=1) as broker:
                _per_call(broker, handle, target.queue, 2)  # warm: statements prepared
                samples[setting].append(_per_call(broker, handle, target.queue, calls))
            print(f"round {number + 1}/{rounds}, jit={setting}: SEND "
                  f"{samples[setting][-1][0]:.2f} ms, RECEIVE {samples[setting][-1][1]:.2f} ms",
                  flush=True)
    return available, {setting: (statistics.median(s for s, _ in values),
                                 statistics.median(r for _, r in values))
                       for setting, values in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.jit_cost",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--dsn", required=True,
                        help="PostgreSQL to measure, in a database of its own")
    parser.add_argument("--calls", type=int, default=200, help="transactions per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    available, medians = run(args.dsn, args.calls, args.rounds)
    if not available:
        print("\nThis server cannot JIT-compile (pg_jit_available() is false): both settings "
              "measure the same.")
    print("\n| Session | SEND 1 msg/tx | RECEIVE TOP(1)+commit |\n|---|--:|--:|")
    for setting, (send, receive) in medians.items():
        print(f"| jit = {setting} | {send:.2f} ms | {receive:.2f} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
