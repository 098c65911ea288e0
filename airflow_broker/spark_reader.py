"""The Spark reader application: N queue readers, one per Spark task.

Submitted with spark-submit (ActivatedReaderOperator does that); each task opens its own
connection and runs airflow_broker.reader.QueueReader until the queue stays empty, so every
message is processed exactly once, each conversation group by one reader at a time, with
replies committed with the RECEIVE. The driver only decides how many readers run and sums what
they did. The DSN comes from the AIRFLOW_BROKER_DSN environment variable (never the command
line, which other users of the machine can read).

    spark-submit --master local[2] .../airflow_broker/spark_reader.py \\
        --queue BrokerageQueue --handler trading.book:handle --readers 2
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import sys
import uuid
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

SUMMARY_MARKER = "BROKER_READER_SUMMARY"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="spark_reader", description=__doc__)
    parser.add_argument("--queue", required=True, help="queue to read")
    parser.add_argument("--handler", required=True, help="package.module:function")
    parser.add_argument("--batch", action="store_true",
                        help="the handler takes a pandas DataFrame per batch")
    parser.add_argument("--readers", type=int, default=0,
                        help="parallel readers (default: the queue's MAX_QUEUE_READERS, or 1)")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--waitfor-timeout", type=float, default=1.0, help="seconds")
    parser.add_argument("--idle-exit", type=float, default=5.0,
                        help="stop after the queue stayed empty this many seconds")
    parser.add_argument("--strategy", default="quarantine",
                        choices=["retry", "quarantine", "end_conversation", "disable",
                                 "timer_retry"])
    parser.add_argument("--max-attempts", type=int, default=3)
    parser.add_argument("--retry-delay", type=int, default=30, help="seconds (timer_retry)")
    parser.add_argument("--reply-message-type")
    parser.add_argument("--schema", default=os.environ.get("AIRFLOW_BROKER_SCHEMA") or None)
    parser.add_argument("--run-id", default=None, help="id of the run in reader_runs")
    return parser.parse_args(argv)


def read_partition(args: argparse.Namespace, dsn: str, index: int) -> Iterator[dict[str, Any]]:
    """The body of one Spark task: one reader."""
    from airflow_broker.broker import Broker
    from airflow_broker.reader import QueueReader, ReaderConfig

    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s %(levelname)s reader-{index}: %(message)s")
    config = ReaderConfig(
        queue_name=args.queue, handler=args.handler, batch=args.batch,
        batch_size=args.batch_size, waitfor_timeout=args.waitfor_timeout,
        idle_exit=args.idle_exit, strategy=args.strategy, max_attempts=args.max_attempts,
        retry_delay=args.retry_delay, reply_message_type=args.reply_message_type)
    with Broker(dsn, schema=args.schema, max_connections=2,
                application_name=f"airflow-broker-spark-reader-{index}") as broker:
        stats = QueueReader(broker, config).run()
    yield {"reader": index, "pid": os.getpid(), **asdict(stats)}


def default_readers(dsn: str, schema: str | None, queue: str) -> int:
    """The queue's MAX_QUEUE_READERS (at least 1); also checks the queue exists before Spark
    starts."""
    from psycopg import sql

    from airflow_broker.broker import Broker
    from airflow_broker.errors import BrokerError

    with Broker(dsn, schema=schema, max_connections=1) as broker, broker.transaction() as tx:
        found = tx.run(sql.SQL("SELECT object_id, max_readers FROM {}.find_queue(%s)").format(
            sql.Identifier(broker.schema)), [queue])
    if not found or found[0][0] is None:
        raise BrokerError(208, f"Invalid object name '{queue}'.")
    return max(int(found[0][1] or 0), 1)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    dsn = os.environ.get("AIRFLOW_BROKER_DSN")
    if not dsn:
        print("AIRFLOW_BROKER_DSN is not set", file=sys.stderr)
        return 2
    from pyspark.sql import SparkSession

    from airflow_broker.broker import Broker
    from airflow_broker.reader import record_run

    readers = args.readers or default_readers(dsn, args.schema, args.queue)
    started = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    spark = SparkSession.builder.appName(f"broker-reader {args.queue}").getOrCreate()
    try:
        results = (spark.sparkContext
                   .parallelize(range(readers), readers)
                   .mapPartitionsWithIndex(lambda index, _: read_partition(args, dsn, index))
                   .collect())
    finally:
        spark.stop()
    summary: dict[str, Any] = {"queue": args.queue, "readers": readers,
                               "per_reader": sorted(results, key=lambda r: r["reader"])}
    for key in ("received", "processed", "replied", "quarantined", "retried", "ended",
                "failed", "batches"):
        summary[key] = sum(r[key] for r in results)
    run_id = uuid.UUID(args.run_id) if args.run_id else uuid.uuid4()
    summary["run_id"] = str(run_id)
    with Broker(dsn, schema=args.schema, max_connections=1) as broker:
        record_run(broker, run_id, args.queue, started, summary)
    print(f"{SUMMARY_MARKER} {json.dumps(summary)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
