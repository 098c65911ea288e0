"""Scenario j's message handler, run by the readers of both sides, and the plain-Python reader
process of its peer.

``consume`` does nothing with a message but, once per batch (on the batch's last message, in
the reader's transaction, so it commits with the RECEIVE), notes in bench.drain_marks when this
reader handled its first message and its latest one: the drain's own time, without the start-up
of Spark or of Python before it.

``python -m bench.queue_drain --queue Q`` is one airflow_broker.readers.queue_reader.QueueReader,
configured as the Spark reader application configures each of its tasks, with the DSN from
AIRFLOW_BROKER_DSN; it prints the reader's counts as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict

from psycopg import sql

from airflow_broker._statements import runner_of
from airflow_broker.messages import Message
from airflow_broker.readers.queue_reader import ReaderContext

HANDLER = "bench.queue_drain:consume"
# Created by the harness with the benchmark's other tables; scenario j reads it.
DRAIN_MARKS = "bench.drain_marks"
_MARK = sql.SQL(
    f"INSERT INTO {DRAIN_MARKS} (reader, first_at, last_at, messages)"
    " VALUES (%s, %s, %s, %s)"
    " ON CONFLICT (reader) DO UPDATE SET last_at = EXCLUDED.last_at,"
    " messages = EXCLUDED.messages"
)
# When each reader (its stats object, one per QueueReader) handled its first message.
_first: dict[int, float] = {}


def consume(message: Message, ctx: ReaderContext) -> None:
    now = time.time()
    first = _first.setdefault(id(ctx.stats), now)
    # Every message is handled without failing, so the batch's last one is the one after
    # which processed catches up with received.
    if ctx.stats.processed + 1 == ctx.stats.received:
        runner_of(ctx.tx).run(
            _MARK, [f"{os.getpid()}-{id(ctx.stats)}", first, now, ctx.stats.received])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.queue_drain",
                                     description="One plain-Python queue reader (scenario j).")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--waitfor-timeout", type=float, default=1.0)
    parser.add_argument("--idle-exit", type=float, default=5.0)
    args = parser.parse_args(argv)
    from airflow_broker.broker import DSN_ENV, Broker

    dsn = os.environ.get(DSN_ENV)
    if not dsn:
        print(f"{DSN_ENV} is not set", file=sys.stderr)
        return 2
    from airflow_broker.readers.queue_reader import QueueReader, ReaderConfig

    config = ReaderConfig(queue_name=args.queue, handler=HANDLER, batch_size=args.batch_size,
                          waitfor_timeout=args.waitfor_timeout, idle_exit=args.idle_exit)
    with Broker(dsn, max_connections=2, application_name="bench-queue-reader") as broker:
        stats = QueueReader(broker, config).run()
    print(json.dumps(asdict(stats)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
