"""The Spark reader application: queue readers, one per Spark task.

Submitted with spark-submit (ActivatedReaderOperator does that); each task opens its own connection
and runs airflow_broker.readers.queue_reader.QueueReader until the queue stays empty, so every
message is processed exactly once, each conversation group by one reader at a time, with replies
committed with the RECEIVE. The driver decides how many readers run: the queue's MAX_QUEUE_READERS
(or ``--readers``), but never more than the cluster runs at once, so no reader waits for another to
finish. Each reader attempt writes its counts in the database with the work they count
(airflow_broker.readers.runs); the run's summary is summed from there.

The DSN comes from the AIRFLOW_BROKER_DSN environment variable, its password (if any) from
PGPASSWORD, which libpq reads: in the driver's environment, and in the executors' through
``spark.executorEnv`` (or the cluster manager's secrets), never the command line or the tasks'
closures.

    AIRFLOW_BROKER_DSN=... spark-submit --master local[2] .../airflow_broker/spark/reader.py \\
        --queue BrokerageQueue --handler trading.book:handle
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from airflow_broker.broker import DSN_ENV
from airflow_broker.poison.strategies import strategy_names
from airflow_broker.readers.queue_reader import default

if TYPE_CHECKING:
    from pyspark import SparkContext

SUMMARY_MARKER = "BROKER_READER_SUMMARY"
log = logging.getLogger("airflow_broker.spark.reader")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="spark_reader", description=__doc__)
    parser.add_argument("--queue", required=True, help="queue to read")
    parser.add_argument("--handler", required=True, help="package.module:function")
    parser.add_argument("--batch", action="store_true",
                        help="the handler takes a pandas DataFrame per batch")
    parser.add_argument("--readers", type=int, default=0,
                        help="readers at most (default: the queue's MAX_QUEUE_READERS, or 1);"
                             " never more than the cluster runs at once")
    parser.add_argument("--executor-wait", type=float, default=30.0,
                        help="seconds to wait for executors to register before sizing")
    parser.add_argument("--batch-size", type=int, default=default("batch_size"))
    parser.add_argument("--waitfor-timeout", type=float, default=default("waitfor_timeout"),
                        help="seconds")
    parser.add_argument("--idle-exit", type=float, default=default("idle_exit"),
                        help="stop after the queue stayed empty this many seconds")
    parser.add_argument("--strategy", default=default("strategy"),
                        help=f"poison strategy: one of {', '.join(strategy_names())}, or "
                             "package.module:ClassName")
    parser.add_argument("--max-attempts", type=int, default=default("max_attempts"))
    parser.add_argument("--retry-delay", type=int, default=default("retry_delay"),
                        help="seconds (timer_retry)")
    parser.add_argument("--reply-message-type")
    parser.add_argument("--schema", default=os.environ.get("AIRFLOW_BROKER_SCHEMA") or None)
    parser.add_argument("--run-id", default=None, help="id of the run in reader_runs")
    return parser.parse_args(argv)


def _dsn() -> str:
    dsn = os.environ.get(DSN_ENV)
    if not dsn:
        raise RuntimeError(f"{DSN_ENV} is not set here: the reader job must be given it "
                           "in the environment (the driver's, and spark.executorEnv for the "
                           "executors)")
    return dsn


def read_partition(args: argparse.Namespace, index: int) -> Iterator[dict[str, Any]]:
    """The body of one Spark task: one reader. Each attempt of it reports itself in
    reader_attempts, so what a killed attempt committed is still counted."""
    from pyspark import TaskContext

    from airflow_broker.broker import Broker
    from airflow_broker.readers.queue_reader import QueueReader, ReaderConfig
    from airflow_broker.readers.runs import AttemptLog

    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s %(levelname)s reader-{index}: %(message)s")
    task = TaskContext.get()
    attempt = task.taskAttemptId() if task is not None else 0
    config = ReaderConfig(
        queue_name=args.queue, handler=args.handler, batch=args.batch,
        batch_size=args.batch_size, waitfor_timeout=args.waitfor_timeout,
        idle_exit=args.idle_exit, strategy=args.strategy, max_attempts=args.max_attempts,
        retry_delay=args.retry_delay, reply_message_type=args.reply_message_type)
    with Broker(_dsn(), schema=args.schema, max_connections=2,
                application_name=f"airflow-broker-spark-reader-{index}") as broker:
        attempt_log = AttemptLog(broker, uuid.UUID(args.run_id), index, attempt)
        try:
            reader = QueueReader(broker, config, attempt_log=attempt_log)
        except Exception as exc:  # the handler cannot be imported here
            attempt_log.fail(exc)
            raise
        stats = reader.run()
    yield {"reader": index, "attempt": attempt, "pid": os.getpid(), **asdict(stats)}


def queue_readers(dsn: str, schema: str | None, queue: str) -> int:
    """The queue's MAX_QUEUE_READERS (at least 1); also checks the queue exists before Spark
    starts."""
    from airflow_broker._statements import runner_of
    from airflow_broker.broker import Broker
    from airflow_broker.errors import InvalidObjectName

    with Broker(dsn, schema=schema, max_connections=1) as broker, broker.transaction() as tx:
        runner = runner_of(tx)
        found = runner.run(runner.queries["queue_readers"], [queue])
    if not found:
        raise InvalidObjectName(f"Invalid object name '{queue}'.")
    return max(int(found[0][0] or 0), 1)


def concurrent_slots(sc: SparkContext, wait: float) -> int | None:
    """How many tasks the cluster runs at once: the executors' cores over spark.task.cpus,
    once the executors stopped registering (or ``wait`` seconds passed). None when dynamic
    allocation has no upper bound."""
    conf = sc.getConf()
    if conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true":
        most = conf.get("spark.dynamicAllocation.maxExecutors")
        if most is None or not most.isdigit() or int(most) > 100_000:
            return None
        cores = int(conf.get("spark.executor.cores", "1"))
        return max(int(most) * cores // int(conf.get("spark.task.cpus", "1")), 1)
    jsc = sc._jsc.sc()
    profile = jsc.resourceProfileManager().defaultResourceProfile()
    local = (sc.master or "").startswith("local")
    deadline = time.monotonic() + wait
    slots, stable_since = 0, time.monotonic()
    while True:
        now = int(jsc.maxNumConcurrentTasks(profile))
        if now != slots:
            slots, stable_since = now, time.monotonic()
        # Executors of a standalone or YARN cluster register one by one after the driver
        # started; sizing on the first would leave the others idle.
        if slots and (local or time.monotonic() - stable_since >= 3):
            return slots
        if time.monotonic() > deadline:
            return max(slots, 1)
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        dsn = _dsn()
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 2
    from pyspark.sql import SparkSession

    from airflow_broker.broker import Broker
    from airflow_broker.readers.runs import begin_run, finish_run

    wanted = args.readers or queue_readers(dsn, args.schema, args.queue)
    run_id = uuid.UUID(args.run_id) if args.run_id else uuid.uuid4()
    args.run_id = str(run_id)
    spark = SparkSession.builder.appName(f"broker-reader {args.queue}").getOrCreate()
    try:
        sc = spark.sparkContext
        slots = concurrent_slots(sc, args.executor_wait)
        readers = min(wanted, slots) if slots else wanted
        log.info("queue %s: %d reader(s) (wanted %d, the cluster runs %s task(s) at once)",
                 args.queue, readers, wanted, slots if slots else "any number of")
        with Broker(dsn, schema=args.schema, max_connections=1) as broker:
            begin_run(broker, run_id, args.queue,
                      {"queue": args.queue, "readers_wanted": wanted, "slots": slots,
                       "readers_started": readers, "application_id": sc.applicationId})
        try:
            (sc.parallelize(range(readers), readers)
             .mapPartitionsWithIndex(lambda index, _: read_partition(args, index))
             .collect())
        finally:
            with Broker(dsn, schema=args.schema, max_connections=1) as broker:
                summary = finish_run(broker, run_id)
    finally:
        spark.stop()
    # One short line (a pipe keeps a write of up to 4 KiB whole, between the JVM's log lines);
    # the attempts and failures are in reader_runs.
    totals = {k: v for k, v in summary.items() if k not in ("per_attempt", "events")}
    print(f"{SUMMARY_MARKER} {json.dumps(totals)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
