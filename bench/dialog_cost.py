"""``python -m bench.dialog_cost``: where a full dialog's CPU goes, step by step.

Each step of scenario h runs ``--calls`` times in one process against one backend, plain and
in pipelined transactions: BEGIN DIALOG + SEND + COMMIT; RECEIVE + SEND the reply + END +
COMMIT; RECEIVE + END + COMMIT. Then the same steps as scenario h's complete checked floor
with each Service Broker statement apart runs them (bench/floors.sql: everything the broker
keeps for the local common case, in as few statements as the API allows). For each, the
wall time, the client's CPU (this process), the backend's and that of poison detection's
side backend (from /proc: the server must run on this machine, as the embedded one does),
per transaction. Then pgmq's request/reply over two queues the same way. Median of
``--repeat`` repetitions.

Alone, one step after another, nothing waits for anything but the server: the numbers are the
cost of each step, which h's three processes on two cores pay in CPU.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
from psycopg.conninfo import make_conninfo

from airflow_broker import END_DIALOG, Broker
from bench import ours_setup, pgmq_peer
from bench.cpu import process_cpu
from bench.harness import database, durable, prepare_database
from bench.ops import (
    DialogFloorAnswerApart,
    DialogFloorBeginApart,
    DialogFloorCloseChecked,
    Op,
    OpFactory,
    OpParams,
    binary_body,
    json_body,
)
from bench.ours_ops import MESSAGE_TYPE
from bench.scenario import Options

APPLICATION = "bench-dialog-cost"
REQUESTS, REPLIES = "bench_cost_request", "bench_cost_reply"
STEPS = ("BEGIN DIALOG + SEND + COMMIT", "RECEIVE + SEND reply + END + COMMIT",
         "RECEIVE + END + COMMIT")
PGMQ_STEP = "pgmq: send; read + delete + send; read + delete"
# Each measured client gets an application name of its own: a closed one's backend may still
# be listed while it exits.
_clients = itertools.count(1)


def say(text: str = "") -> None:
    print(text, flush=True)


@dataclass
class Cost:
    """Per transaction, µs."""

    wall: float
    client: float
    backend: float | None
    side: float | None


def _pid(admin: psycopg.Connection[tuple[object, ...]], application: str) -> int | None:
    row = admin.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                        [application]).fetchone()
    return None if row is None else int(str(row[0]))


def measure(admin: psycopg.Connection[tuple[object, ...]], application: str, calls: int,
            step: Callable[[], object]) -> Cost:
    """``step`` run ``calls`` times by the client named ``application`` (its backend, and
    its side backend, ``application-side``, if it has one)."""
    step()  # warm: the backends exist, the statements are prepared
    pids = [_pid(admin, application), _pid(admin, f"{application}-side")]

    def used() -> list[float | None]:
        return [None if pid is None else process_cpu(pid) for pid in pids]

    before, client, wall = used(), time.process_time(), time.perf_counter()
    for _ in range(calls):
        step()
    wall, client = time.perf_counter() - wall, time.process_time() - client
    after = used()
    backend, side = ((None if start is None or end is None else (end - start) / calls * 1e6)
                     for start, end in zip(before, after, strict=True))
    return Cost(wall / calls * 1e6, client / calls * 1e6, backend, side)


@contextmanager
def _reset(admin: psycopg.Connection[tuple[object, ...]],
           *sides: ours_setup.Target) -> Iterator[None]:
    with admin.transaction():
        ours_setup.forget_dialogs(admin, *sides)
    try:
        yield
    finally:
        with admin.transaction():
            ours_setup.forget_dialogs(admin, *sides)


def ours(dsn: str, admin: psycopg.Connection[tuple[object, ...]], catalog: ours_setup.Catalog,
         calls: int, pipeline: bool) -> dict[str, Cost]:
    target, initiator = catalog.targets["dialog"], catalog.dialog_initiator
    body = binary_body(100)
    costs: dict[str, Cost] = {}
    application = f"{APPLICATION}-{next(_clients)}"
    with _reset(admin, initiator, target), \
            Broker(dsn, max_connections=1, application_name=application) as broker:
        def begin() -> None:
            with broker.transaction(pipeline=pipeline) as tx:
                handle = tx.begin_dialog(initiator.service, target.service, ours_setup.CONTRACT)
                tx.send(handle, MESSAGE_TYPE, body)

        # A step that found no work would measure nothing: each checks what it received.
        def answer() -> None:
            with broker.transaction(pipeline=pipeline) as tx:
                requests = tx.receive(target.queue, top=1)
                if len(requests) != 1:
                    raise RuntimeError(f"the answering step found {len(requests)} requests")
                tx.send(requests[0].conversation_handle, MESSAGE_TYPE, body)
                tx.end_conversation(requests[0].conversation_handle)

        def close() -> None:
            with broker.transaction(pipeline=pipeline) as tx:
                messages = tx.receive(initiator.queue)
                kinds = [m.message_type_name for m in messages]
                if kinds != [MESSAGE_TYPE, END_DIALOG]:
                    raise RuntimeError(f"the closing step found {kinds}")
                tx.end_conversation(messages[-1].conversation_handle)

        # Each step finds the work of the one before waiting: a step per dialog, in order.
        for name, step in zip(STEPS, (begin, answer, close), strict=True):
            costs[name] = measure(admin, application, calls, step)
    return costs


def floor(dsn: str, admin: psycopg.Connection[tuple[object, ...]],
          catalog: ours_setup.Catalog, calls: int) -> dict[str, Cost]:
    """The same three steps as scenario h's complete checked floor with Service Broker's
    statements apart runs them (bench/floors.sql's blocks ending in _checked, poison
    detection's record on a side connection as ours), each step on a connection of its
    own."""
    target, initiator = catalog.targets["dialog"], catalog.dialog_initiator
    params = OpParams(target.queue, reply_queue=initiator.queue,
                      dialog=(initiator.service, target.service, ours_setup.CONTRACT),
                      message_type=MESSAGE_TYPE)
    makers: tuple[OpFactory, ...] = (DialogFloorBeginApart, DialogFloorAnswerApart,
                                     DialogFloorCloseChecked)
    costs: dict[str, Cost] = {}
    with _reset(admin, initiator, target):
        for name, make in zip(STEPS, makers, strict=True):
            application = f"{APPLICATION}-{next(_clients)}"
            op = make(make_conninfo(dsn, application_name=application), 0, params)

            # Each step moves one dialog, or the run fails.
            def step(op: Op = op, name: str = name) -> None:
                if op() != 1:
                    raise RuntimeError(f"the floor's step {name!r} found no dialog")

            try:
                costs[name] = measure(admin, application, calls, step)
            finally:
                op.close()
    return costs


def pgmq(dsn: str, admin: psycopg.Connection[tuple[object, ...]], calls: int) -> Cost:
    message = json_body(100)
    for queue in (REQUESTS, REPLIES):
        pgmq_peer.create_queue(admin, queue)
        pgmq_peer.purge(admin, queue)
    application = f"{APPLICATION}-{next(_clients)}"
    with psycopg.connect(dsn, application_name=application) as conn:
        def request_reply() -> None:
            with conn.transaction():
                conn.execute("SELECT pgmq.send(%s, %s::jsonb)", [REQUESTS, message])
            for queue, reply in ((REQUESTS, True), (REPLIES, False)):
                with conn.transaction():
                    found = conn.execute("SELECT msg_id FROM pgmq.read(%s, 30, 1)",
                                         [queue]).fetchall()
                    if len(found) != 1:
                        raise RuntimeError(f"pgmq's read of {queue} found {len(found)}")
                    conn.execute("SELECT pgmq.delete(%s, %s::bigint)", [queue, found[0][0]])
                    if reply:
                        conn.execute("SELECT pgmq.send(%s, %s::jsonb)", [REPLIES, message])

        return measure(admin, application, calls, request_reply)


def _median(costs: list[Cost]) -> Cost:
    def middle(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if len(known) == len(values) else None

    return Cost(statistics.median(c.wall for c in costs),
                statistics.median(c.client for c in costs),
                middle([c.backend for c in costs]), middle([c.side for c in costs]))


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} µs"


def run(calls: int, repeat: int, dsn: str | None = None) -> dict[str, Cost]:
    """Per step (and pgmq's request/reply), the median cost per transaction."""
    pgmq_peer.ensure_package()
    rows: dict[str, list[Cost]] = {}
    with database(Options(dsn=dsn)) as (base_dsn, _embedded):
        durable_dsn = durable(base_dsn)
        prepare_database(durable_dsn)
        with psycopg.connect(durable_dsn, autocommit=True) as admin, \
                Broker(durable_dsn) as setup:
            catalog = ours_setup.setup_catalog(setup)
            admin.execute("VACUUM (ANALYZE)")
            for number in range(repeat):
                say(f"repetition {number + 1}/{repeat}")
                for pipeline in (False, True):
                    how = ", pipelined" if pipeline else ""
                    steps = ours(durable_dsn, admin, catalog, calls, pipeline)
                    for name, cost in steps.items():
                        rows.setdefault(name + how, []).append(cost)
                for name, cost in floor(durable_dsn, admin, catalog, calls).items():
                    rows.setdefault(f"{name}, the complete checked floor", []).append(cost)
                rows.setdefault(PGMQ_STEP, []).append(pgmq(durable_dsn, admin, calls))
    return {name: _median(costs) for name, costs in rows.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dialog_cost", description=__doc__)
    parser.add_argument("--calls", type=int, default=1000, help="transactions per step (1000)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions; medians (3)")
    parser.add_argument("--dsn", help="PostgreSQL on this machine (default: embedded)")
    args = parser.parse_args(argv)
    costs = run(args.calls, args.repeat, args.dsn)
    say(f"\nPer transaction (pgmq: per request/reply), median of {args.repeat} x {args.calls:,}")
    say("| Step | Wall | Client CPU | Backend CPU | Side backend CPU |")
    say("|---|--:|--:|--:|--:|")
    for name, cost in costs.items():
        say(f"| {name} | {_us(cost.wall)} | {_us(cost.client)} | {_us(cost.backend)} "
            f"| {_us(cost.side)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
