"""What the Python client costs per statement: this process's CPU for BEGIN DIALOG, SEND (100
bytes), RECEIVE TOP(1) and END CONVERSATION, each in its own transaction through
``Broker.transaction()``, against the same statement, parameters and round trips through plain
psycopg (prepared; BEGIN sent with the statement, then COMMIT), side by side in one run.

The server's work is the same on both sides; the difference is the client's: the pool, the
transaction object, the message-type check and the handle's checks, the parameters'
conversion, RECEIVE's Message objects, END's look at its answer for a fire-and-forget warning.
Both RECEIVEs post poison detection's record of the transaction on a side connection, as the
broker does for a queue with poison-message handling on (the default). Variants alternate
within each round; the table gives the medians of the rounds and ours/plain per statement. The
dialogs END ends are opened before the clock starts, each with a first message, so that END
takes its usual path (an EndDialog to a target that exists); so are the messages RECEIVE
takes, on one conversation.

    .venv/bin/python -m bench.client_cost                 # 3 rounds of 2,000, ~2 minutes
    .venv/bin/python -m bench.client_cost --rounds 1 --transactions 50
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from airflow_broker import Broker
from airflow_broker.dialogs import MAX_LIFETIME
from airflow_broker.messages import RECEIVED_COLUMNS
from airflow_broker.migrations import install
from airflow_broker.poison.side_channel import SideChannel
from bench import ours_setup
from bench.harness import database, durable
from bench.ours_ops import MESSAGE_TYPE
from bench.report import median
from bench.rounds import rotated
from bench.scenario import Options

BODY = b"x" * 100
STEPS = ("BEGIN DIALOG", "SEND", "RECEIVE", "END CONVERSATION")
MESSAGE_ID = RECEIVED_COLUMNS.index("message_id")
OURS = "ours: Broker.transaction()"
PLAIN = "plain psycopg: the same statement and round trips"


def _nothing(count: int) -> None:
    return None


@dataclass(frozen=True)
class Variant:
    step: str
    name: str
    transaction: Callable[[], None]
    # Made before the clock starts: what ``count`` transactions of the step need.
    prepare: Callable[[int], None] = _nothing


def _variants(dsn: str) -> tuple[list[Variant], Callable[[], None]]:
    broker = Broker(dsn)
    handle = ours_setup.send_dialog(broker)
    target = ours_setup.setup_catalog(broker).targets["send"]
    queries = broker.queries
    # The statements the Transaction renders: the calls with their casts.
    send = queries.call("send", 6, ["uuid[]", "text", "bytea", "boolean", "text", "text"])
    begin = queries.call("begin_dialog", 9, ["text", "text", "text", "uuid", "uuid", "integer",
                                             "boolean", "text", "uuid"])
    end = queries.call("end_conversation", 4, ["uuid", "boolean", "integer", "text"])
    receive, record = queries["receive"], queries["register_receive"]
    source = ours_setup.setup_catalog(broker).targets["recv1"]
    conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=0)
    side = SideChannel(dsn, "bench-client-cost", None)
    send_params: list[object] = [[handle], MESSAGE_TYPE, BODY, False, None, None]
    begin_params: list[object] = [ours_setup.INITIATOR_SERVICE, target.service,
                                  ours_setup.CONTRACT, None, None, MAX_LIFETIME, True, None, None]
    to_end: dict[str, list[uuid.UUID]] = {OURS: [], PLAIN: []}

    def plain(statement: bytes, params: list[object]) -> None:
        with conn.pipeline():
            conn.execute(b"BEGIN")
            conn.execute(statement, params).fetchall()
        conn.execute(b"COMMIT")

    def ours_begin() -> None:
        with broker.transaction() as tx:
            tx.begin_dialog(ours_setup.INITIATOR_SERVICE, target.service, ours_setup.CONTRACT)

    def ours_send() -> None:
        with broker.transaction() as tx:
            tx.send(handle, MESSAGE_TYPE, BODY)

    def ours_end() -> None:
        with broker.transaction() as tx:
            tx.end_conversation(to_end[OURS].pop())

    def plain_end() -> None:
        plain(end, [to_end[PLAIN].pop(), False, None, None])

    # Each RECEIVE checks that it took a message: one that found none would measure nothing.
    def ours_receive() -> None:
        with broker.transaction() as tx:
            if len(tx.receive(source.queue, top=1)) != 1:
                raise RuntimeError("RECEIVE found no message")

    def plain_receive() -> None:
        with conn.pipeline():
            conn.execute(b"BEGIN")
            rows = conn.execute(receive, [source.queue, 1, None, None]).fetchall()
        if len(rows) != 1:
            raise RuntimeError("RECEIVE found no message")
        xid, queue_id, _handling = rows[0][len(RECEIVED_COLUMNS):]
        side.post_prepared(b"bench_register_receive", record, [
            b"%d" % int(queue_id), b"%d" % int(xid), b"{%s}" % str(rows[0][MESSAGE_ID]).encode(),
            b"%d" % conn.info.backend_pid])
        conn.execute(b"COMMIT")

    def sender(count: int) -> None:
        with broker.transaction() as tx:
            handle = tx.begin_dialog(ours_setup.INITIATOR_SERVICE, source.service,
                                     ours_setup.CONTRACT)
            for _ in range(count):
                tx.send(handle, MESSAGE_TYPE, BODY)

    def opener(side: str) -> Callable[[int], None]:
        def prepare(count: int) -> None:
            to_end[side].extend(ours_setup.begin_dialogs(broker, target, count))
        return prepare

    def close() -> None:
        side.close()
        conn.close()
        broker.close()

    return [Variant("BEGIN DIALOG", OURS, ours_begin),
            Variant("BEGIN DIALOG", PLAIN, lambda: plain(begin, begin_params)),
            Variant("SEND", OURS, ours_send),
            Variant("SEND", PLAIN, lambda: plain(send, send_params)),
            Variant("RECEIVE", OURS, ours_receive, sender),
            Variant("RECEIVE", PLAIN, plain_receive, sender),
            Variant("END CONVERSATION", OURS, ours_end, opener(OURS)),
            Variant("END CONVERSATION", PLAIN, plain_end, opener(PLAIN))], close


def measure(variant: Variant, transactions: int) -> float:
    """This process's CPU per transaction, in µs."""
    variant.prepare(transactions)
    started = time.process_time()
    for _ in range(transactions):
        variant.transaction()
    return (time.process_time() - started) / transactions * 1e6


def run(options: Options, transactions: int) -> str:
    results: dict[tuple[str, str], list[float]] = {}
    with database(options) as (dsn, _embedded):
        install(dsn)
        variants, close = _variants(durable(dsn))
        try:
            for variant in variants:
                measure(variant, max(1, transactions // 10))  # warm: prepared, pooled
            for r in range(options.rounds):
                for variant in rotated(variants, r):
                    key = (variant.step, variant.name)
                    results.setdefault(key, []).append(measure(variant, transactions))
                    print(f"round {r + 1}: {variant.step}, {variant.name}:"
                          f" {results[key][-1]:,.0f} µs of client CPU per transaction",
                          file=sys.stderr)
        finally:
            close()
    lines = [f"{options.rounds} rounds of {transactions:,} transactions per statement and"
             " variant, each statement in its own transaction; client CPU per transaction,"
             " median of the rounds", "",
             "| Statement | Client | CPU per transaction (µs) | per round | ours/plain |",
             "|---|---|---:|---:|---:|"]
    for step in STEPS:
        plain = median(results[(step, PLAIN)]) or 1.0
        for name in (OURS, PLAIN):
            values = results[(step, name)]
            lines.append(f"| {step} | {name} | {median(values) or 0.0:,.0f} |"
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

