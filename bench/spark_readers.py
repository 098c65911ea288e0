"""Scenario j: the Spark reader application (airflow_broker/spark/reader.py) draining a
pre-filled queue with 2 readers on local[2], against 2 plain Python QueueReader processes on the
same server: the ratio is Spark's overhead. Then the same application on a Spark standalone
cluster on 127.0.0.1 (a master and two workers of one core, tests/support/spark_cluster.py),
submitted as ActivatedReaderOperator submits it (the packed readers' environment, the handler's
package as py_files, the DSN in a properties file), against local[2]: the ratio is what a real
cluster's executors and shipping cost.

Both sides run the same reader loop (airflow_broker.readers.queue_reader.QueueReader, RECEIVE
TOP(100), each message in a savepoint, one commit per batch) with the same handler
(bench.queue_drain:consume, which does nothing but note the time of each reader's first and latest
message in bench.drain_marks). Each side is launched cold, as a job would be: spark-submit for
ours, two new Python processes for the peer. The clock starts just before the launch; the drain's
end is the latest message any reader handled. "Including start-up" divides the messages by
launch-to-end, "excluding start-up" by first-message-to-end. Both sides wait --idle-exit after the
queue is empty before they stop; that tail is in neither rate (only in the wall time of the note).
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import airflow_broker.spark.reader as spark_reader
from airflow_broker.broker import DSN_ENV
from airflow_broker.spark import cluster as spark_cluster
from airflow_broker.spark import shipping as spark_shipping
from bench import ours_setup
from bench.queue_drain import DRAIN_MARKS, HANDLER
from bench.report import Row, Scenario, median
from bench.scenario import Env, register
from bench.throughput import OUR_TABLES
from tests.support.spark_cluster import SparkCluster

ROOT = Path(__file__).resolve().parent.parent
READERS = 2
MASTER = "local[2]"
BATCH = 100
WAITFOR_TIMEOUT = 0.5
IDLE_EXIT = 1.0
# A run that takes longer than this is stuck (Spark's start-up takes seconds, a drain of
# 20,000 messages a few more).
RUN_TIMEOUT = 900.0
PEER_LABEL = "2 Python QueueReader processes"
LOCAL_LABEL = f"spark_reader.py on {MASTER}"
TITLE = (f"Spark readers: spark_reader.py, {READERS} readers on {MASTER}, and on a standalone "
         "cluster")


class DrainFailed(RuntimeError):
    pass


@dataclass
class Drain:
    """One drain: times are time.time() seconds, read in the parent and in the readers."""

    launched: float
    exited: float
    first_at: float
    last_at: float
    messages: int
    # Per reader: messages, and its first and latest message in seconds after the launch.
    per_reader: list[tuple[int, float, float]] = field(default_factory=list)

    @property
    def startup(self) -> float:
        return self.first_at - self.launched

    def rate_with_startup(self) -> float:
        return self.messages / (self.last_at - self.launched)

    def rate_without_startup(self) -> float:
        span = self.last_at - self.first_at
        return self.messages / span if span > 0 else math.nan


def missing_requirements() -> str | None:
    """Why Spark cannot run here, or None."""
    java_home = os.environ.get("JAVA_HOME")
    java = shutil.which("java") or (
        str(Path(java_home) / "bin" / "java") if java_home
        and (Path(java_home) / "bin" / "java").exists() else None
    )
    if java is None:
        return ("Java was not found (no java on PATH, no JAVA_HOME): Spark needs a JVM (Java "
                "17). Install one to measure the Spark readers.")
    if _spark_submit() is None:
        return "spark-submit was not found: install pyspark in the environment that runs the bench."
    return None


def _spark_submit() -> str | None:
    beside = Path(sys.executable).parent / "spark-submit"
    return str(beside) if beside.exists() else shutil.which("spark-submit")


def _child_env(dsn: str) -> dict[str, str]:
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {
        **os.environ,
        DSN_ENV: dsn,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(paths),
    }


def _reader_args() -> list[str]:
    return ["--batch-size", str(BATCH), "--waitfor-timeout", str(WAITFOR_TIMEOUT),
            "--idle-exit", str(IDLE_EXIT)]


def _tail(output: str, lines: int = 30) -> str:
    return "\n".join(output.strip().splitlines()[-lines:])


def _marks(env: Env, launched: float, exited: float) -> Drain:
    rows = env.admin.execute(
        f"SELECT first_at, last_at, messages FROM {DRAIN_MARKS} ORDER BY reader"
    ).fetchall()
    if not rows:
        raise DrainFailed("no reader handled a message")
    return Drain(launched=launched, exited=exited, first_at=min(r[0] for r in rows),
                 last_at=max(r[1] for r in rows), messages=sum(int(r[2]) for r in rows),
                 per_reader=[(int(r[2]), round(r[0] - launched, 2), round(r[1] - launched, 2))
                             for r in rows])


def _cluster_options(env: Env, master: str, work: Path) -> list[str]:
    """What ActivatedReaderOperator adds for a cluster: the packed environment, the handler's
    package and the DSN in a properties file."""
    archive = spark_shipping.packed_environment()
    properties = spark_cluster.write_properties(
        work / f"{uuid.uuid4()}.properties",
        spark_cluster.job_settings(env.dsn, master, "client"))
    return ["--archives", f"{archive}#{spark_shipping.ARCHIVE_ALIAS}",
            "--py-files", ",".join(spark_shipping.handler_py_files(HANDLER)),
            "--conf", f"spark.pyspark.python={spark_shipping.ARCHIVE_PYTHON}",
            "--conf", f"spark.pyspark.driver.python={sys.executable}",
            "--conf", "spark.driver.host=127.0.0.1",
            "--properties-file", str(properties)]


def _spark(env: Env, queue: str, cluster: SparkCluster | None = None,
           ) -> tuple[Drain, dict[str, object]]:
    submit = _spark_submit()
    assert submit is not None
    run_id = uuid.uuid4()
    master = cluster.master_url if cluster is not None else MASTER
    options = (_cluster_options(env, master, cluster.work) if cluster is not None else [])
    command = [submit, "--master", master, "--conf", "spark.ui.enabled=false",
               "--conf", "spark.sql.shuffle.partitions=2", *options, spark_reader.__file__,
               "--queue", queue, "--handler", HANDLER, "--readers", str(READERS),
               "--run-id", str(run_id), *_reader_args()]
    launched = time.time()
    done = subprocess.run(command, env=_child_env(env.dsn), cwd=ROOT, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT, check=False)
    exited = time.time()
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise DrainFailed(f"spark-submit exited with {done.returncode}:\n{_tail(output)}")
    row = env.admin.execute("SELECT summary FROM broker.reader_runs WHERE run_id = %s",
                            [run_id]).fetchone()
    if row is None:
        raise DrainFailed(f"the Spark run left no summary in reader_runs:\n{_tail(output)}")
    summary: dict[str, object] = row[0]
    return _marks(env, launched, exited), summary


def _python(env: Env, queue: str) -> Drain:
    command = [sys.executable, "-m", "bench.queue_drain", "--queue", queue, *_reader_args()]
    child_env = _child_env(env.dsn)
    launched = time.time()
    readers = [subprocess.Popen(command, env=child_env, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
               for _ in range(READERS)]
    outputs = []
    for reader in readers:
        try:
            outputs.append(reader.communicate(timeout=RUN_TIMEOUT)[0])
        except subprocess.TimeoutExpired:
            for other in readers:
                other.kill()
            raise
    exited = time.time()
    for reader, output in zip(readers, outputs, strict=True):
        if reader.returncode != 0:
            raise DrainFailed(f"a Python reader exited with {reader.returncode}:\n"
                              f"{_tail(output)}")
    return _marks(env, launched, exited)


def _fill(env: Env, count: int) -> int:
    """``count`` messages (rounded up to whole dialogs of up to 100) on the spark queue; returns
    how many."""
    target = env.catalog.targets["spark"]
    each = min(BATCH, count)
    dialogs = math.ceil(count / each)
    with env.transaction() as conn:
        ours_setup.purge(conn, target)
        ours_setup.add_dialogs(conn, env.catalog, target, dialogs, each)
        conn.execute(f"DELETE FROM {DRAIN_MARKS}")
    env.settle(OUR_TABLES)
    return dialogs * each


@register("j")
def drain(env: Env) -> Scenario:
    missing = missing_requirements()
    if missing is not None:
        env.progress(f"j unavailable: {missing}")
        return Scenario("j", TITLE, status="unavailable", note=missing)
    target = env.catalog.targets["spark"]
    rounds = env.options.rounds
    drains: dict[str, list[Drain]] = {"spark": [], "python": [], "cluster": []}
    received: list[object] = []
    count = 0
    cluster = SparkCluster(Path(tempfile.mkdtemp(prefix="bench-spark-cluster-")),
                           workers=READERS)
    try:
        env.progress("j: starting a Spark standalone master and 2 workers on 127.0.0.1")
        cluster.start()
        for number in range(rounds):
            order = ["spark", "python", "cluster"]
            order = order[number % 3:] + order[:number % 3]
            for side in order:
                count = _fill(env, env.options.spark_messages)
                env.progress(f"j round {number + 1}/{rounds} {side}: draining {count:,} messages")
                if side in ("spark", "cluster"):
                    drained, summary = _spark(env, target.queue,
                                              cluster if side == "cluster" else None)
                    received.append(summary.get("received"))
                else:
                    drained = _python(env, target.queue)
                with env.transaction() as conn:
                    left = ours_setup.ready(conn, target)
                if drained.messages != count or left:
                    raise DrainFailed(f"{side}: {drained.messages:,} of {count:,} messages "
                                      f"handled, {left:,} left in the queue")
                drains[side].append(drained)
                env.progress(
                    f"j round {number + 1}/{rounds} {side}: first message after "
                    f"{drained.startup:.1f} s, {drained.rate_with_startup():,.0f} msg/s with "
                    f"start-up, {drained.rate_without_startup():,.0f} msg/s without; per reader "
                    f"(messages, first s, last s): {drained.per_reader}, exited after "
                    f"{drained.exited - drained.launched:.1f} s"
                )
    except (DrainFailed, subprocess.TimeoutExpired, RuntimeError, TimeoutError) as exc:
        env.progress(f"j failed: {exc}")
        return Scenario("j", TITLE, status="failed", note=f"The drain failed: {exc}")
    finally:
        cluster.stop()
        shutil.rmtree(cluster.work, ignore_errors=True)

    def values(side: str, what: str) -> list[float]:
        return [getattr(d, what)() if what.startswith("rate") else getattr(d, what)
                for d in drains[side]]

    def wall(side: str) -> float:
        return statistics.median(d.exited - d.launched for d in drains[side])

    note = (
        f"{count:,} messages in dialogs of {min(BATCH, count)}, RECEIVE TOP({BATCH}). Per round "
        "and reader (messages, first and latest message in seconds after the launch): Spark "
        f"{[d.per_reader for d in drains['spark']]}, Python "
        f"{[d.per_reader for d in drains['python']]}, cluster "
        f"{[d.per_reader for d in drains['cluster']]}; the Spark summaries in reader_runs "
        f"counted {received} received. Launch to exit (median, with the {IDLE_EXIT:g} s "
        f"idle wait): Spark {wall('spark'):.1f} s, Python {wall('python'):.1f} s, cluster "
        f"{wall('cluster'):.1f} s."
    )
    rows = []
    for name, what, unit, higher in (
        ("drain including start-up (launch to last message)", "rate_with_startup", "msg/s",
         True),
        ("drain excluding start-up (first to last message)", "rate_without_startup", "msg/s",
         True),
        ("start-up: launch to first message", "startup", "s", False),
    ):
        peer, ours = values("python", what), values("spark", what)
        rows.append(Row(f"{name}, {READERS} readers", unit, PEER_LABEL, median(peer),
                        median(ours), higher_is_better=higher, peer_rounds=peer,
                        ours_rounds=ours))
        on_cluster = values("cluster", what)
        rows.append(Row(f"{name}, {READERS} readers on a standalone cluster", unit,
                        LOCAL_LABEL, median(ours), median(on_cluster),
                        higher_is_better=higher, peer_rounds=ours, ours_rounds=on_cluster))
    return Scenario("j", f"{TITLE}, {count:,} messages", note=note, rows=rows)
