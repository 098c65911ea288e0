"""One benchmark run: one PostgreSQL, our schema and pgmq side by side, every selected scenario
measured for both in the same run, alternating, several rounds."""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from airflow_broker import Broker
from airflow_broker.migrations import install as install_broker
from bench import pgmq_peer
from bench.ops import BARE_TABLE, Conn, OpParams, with_settings
from bench.ours_setup import Catalog, setup_catalog
from bench.report import Scenario
from bench.workers import LoadTask, Measurement, WorkerPool

DSN_ENV = "AIRFLOW_BROKER_BENCH_DSN"
SCENARIOS = ("a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l")
PGMQ_QUEUES = ("bench_send", "bench_recv1", "bench_recv100", "bench_wait", "bench_growth",
               "bench_drain", "bench_request", "bench_reply")
# Where the readers of scenario j note when they handled their first and last message.
DRAIN_MARKS = "bench.drain_marks"
# Load processes: h runs a producer and two readers at once.
POOL_SIZE = 3
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


def _stderr(text: str) -> None:
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
        (self.options.progress or _stderr)(f"[{time.monotonic() - self.started:7.1f}s] {text}")

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


def pool_size(options: Options) -> int:
    """Worker processes to start: the scaling study (l) needs its largest point's."""
    from bench.scaling import WORKERS

    return max(POOL_SIZE, *WORKERS) if options.selected("l") and not options.quick else POOL_SIZE


def durable(dsn: str) -> str:
    """The DSN with synchronous_commit forced on for every session the benchmark opens."""
    return with_settings(dsn, synchronous_commit="on")


def prepare_database(dsn: str) -> str:
    """Installs our schema, pgmq, the bare-INSERT table and pgmq's queues; returns pgmq's SQL
    version."""
    install_broker(dsn)
    version = pgmq_peer.install(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS bench")
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {BARE_TABLE} (payload bytea NOT NULL)"
        )
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {DRAIN_MARKS} (reader text PRIMARY KEY,"
            " first_at double precision NOT NULL, last_at double precision NOT NULL,"
            " messages bigint NOT NULL)"
        )
        for queue in PGMQ_QUEUES:
            pgmq_peer.create_queue(conn, queue)
    return version


def _environment(admin: Conn, embedded: bool) -> dict[str, Any]:
    def show(name: str) -> str:
        row = admin.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()
        return str(row[0]) if row else ""

    memory_kib = 0
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            memory_kib = int(meminfo.readline().split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(memory_kib / 1024 / 1024, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "postgres": show("server_version"),
        "embedded_postgres": embedded,
        "settings": {
            name: show(name)
            for name in ("synchronous_commit", "fsync", "wal_sync_method", "shared_buffers",
                         "full_page_writes", "max_wal_size", "work_mem")
        },
    }


def _run_scenarios(env: Env) -> list[Scenario]:
    from bench import (
        cross_db,
        dialogs,
        growth,
        latency,
        memory,
        scaling,
        spark_readers,
        throughput,
    )

    options = env.options
    done: dict[str, Scenario] = {}
    if options.selected("a") or options.selected("f"):
        for measured in throughput.send_one(env, bare=options.selected("f")):
            done[measured.id] = measured
    if options.selected("b"):
        done["b"] = throughput.send_batch(env)
    if options.selected("c"):
        done["c"] = throughput.receive_one(env)
    if options.selected("d"):
        done["d"] = throughput.receive_batch(env)
    if options.selected("e"):
        done["e"] = latency.wakeup(env)
    if options.selected("h"):
        done["h"] = dialogs.full_dialog(env)
    if options.selected("j"):
        done["j"] = spark_readers.drain(env)
    if options.selected("k"):
        done["k"] = cross_db.cross_database(env)
    if options.selected("l"):
        done["l"] = scaling.scaling(env)
    # The big fills come last, so their rows never slow the small scenarios down.
    if options.selected("i"):
        done["i"] = memory.drain(env)
    if options.selected("g"):
        done["g"] = growth.cost_growth(env)
    result = []
    for scenario in SCENARIOS:
        if scenario in done and options.selected(scenario):
            result.append(done[scenario])
        else:
            result.append(Scenario(scenario, "", status="skipped"))
    return result


@contextmanager
def database(options: Options) -> Iterator[tuple[str, bool]]:
    """The DSN given (option or environment), or an embedded PostgreSQL in a temporary
    directory that is removed afterwards."""
    configured = options.dsn or os.environ.get(DSN_ENV)
    if configured:
        yield configured, False
        return
    with embedded_database("bench") as dsn:
        yield dsn, True


@contextmanager
def embedded_database(name: str) -> Iterator[str]:
    """A database of an embedded PostgreSQL in a temporary directory, removed afterwards."""
    from airflow_broker.embedded import EmbeddedPostgres

    folder = tempfile.mkdtemp(prefix="airflow-broker-bench-")
    server = None
    try:
        server = EmbeddedPostgres(Path(folder) / "pgdata")
        yield server.ensure_database(name)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class RunResult:
    scenarios: list[Scenario]
    data: dict[str, Any]


def execute(options: Options) -> RunResult:
    """Runs the selected scenarios; the JSON-ready result is also written to
    ``options.json_path`` when set."""
    say = options.progress or _stderr
    started_at = datetime.now(UTC)
    clock = time.monotonic()
    pgmq_package = pgmq_peer.ensure_package()
    with database(options) as (base_dsn, embedded):
        dsn = durable(base_dsn)
        say("installing the broker schema and pgmq")
        pgmq_sql = prepare_database(dsn)
        pool = WorkerPool(pool_size(options))
        try:
            with psycopg.connect(dsn, autocommit=True) as admin, Broker(dsn) as broker:
                env = Env(options, dsn, admin, broker, setup_catalog(broker), pool)
                scenarios = _run_scenarios(env)
                environment = _environment(admin, embedded)
        finally:
            pool.close()
    environment["pgmq"] = {"package": pgmq_package, "sql": pgmq_sql}
    data: dict[str, Any] = {
        "format": 1,
        "started_at": started_at.isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - clock, 1),
        "settings": {
            "quick": options.quick, "rounds": options.rounds, "seconds": options.seconds,
            "latency_samples": options.latency_samples,
            "growth_sizes": list(options.growth_sizes),
            "drain_messages": options.drain_messages, "checkpoint": options.checkpoint,
            "spark_messages": options.spark_messages,
            "only": sorted(options.only) if options.only else None,
        },
        "environment": environment,
        "scenarios": [s.as_json() for s in scenarios],
    }
    if options.json_path is not None:
        options.json_path.parent.mkdir(parents=True, exist_ok=True)
        options.json_path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return RunResult(scenarios, data)


def run(options: Options) -> dict[str, Any]:
    """``execute`` for callers that only want the JSON-ready result."""
    return execute(options).data
