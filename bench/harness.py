"""One benchmark run: one PostgreSQL, our schema and pgmq side by side, every selected scenario
measured for both in the same run, alternating, several rounds."""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from airflow_broker import Broker
from airflow_broker.migrations import install as install_broker
from bench import pgmq_peer
from bench.ops import BARE_TABLE, Conn, with_settings
from bench.ours_setup import setup_catalog
from bench.queue_drain import DRAIN_MARKS
from bench.report import Scenario
from bench.scenario import SCENARIOS, Env, Options, Registered, stderr
from bench.workers import WorkerPool

DSN_ENV = "AIRFLOW_BROKER_BENCH_DSN"
PGMQ_QUEUES = ("bench_send", "bench_recv1", "bench_recv100", "bench_wait", "bench_growth",
               "bench_drain", "bench_request", "bench_reply")
# Load processes: h runs a producer and two readers at once.
POOL_SIZE = 3


def pool_size(options: Options, measurements: Sequence[Registered]) -> int:
    """Worker processes to start: the most any selected measurement needs at once."""
    return max([POOL_SIZE, *(m.processes(options) for m in measurements
                             if m.processes is not None and m.selected(options))])


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


def _run_scenarios(env: Env, measurements: Sequence[Registered]) -> list[Scenario]:
    options = env.options
    done: dict[str, Scenario] = {}
    # In RUN_ORDER (bench.scenario.registered).
    for measurement in measurements:
        if not measurement.selected(options):
            continue
        measured = measurement.measure(env)
        for scenario in measured if isinstance(measured, list) else [measured]:
            done[scenario.id] = scenario
    # A measurement of several letters (a and f) may have measured one not selected.
    return [done[letter] if letter in done and options.selected(letter)
            else Scenario(letter, "", status="skipped") for letter in SCENARIOS]


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


def execute(options: Options, measurements: Sequence[Registered]) -> RunResult:
    """Runs the selected scenarios of ``measurements`` (bench.suite's, as registered); the
    JSON-ready result is also written to ``options.json_path`` when set."""
    say = options.progress or stderr
    started_at = datetime.now(UTC)
    clock = time.monotonic()
    pgmq_package = pgmq_peer.ensure_package()
    with database(options) as (base_dsn, embedded):
        dsn = durable(base_dsn)
        say("installing the broker schema and pgmq")
        pgmq_sql = prepare_database(dsn)
        pool = WorkerPool(pool_size(options, measurements))
        try:
            with psycopg.connect(dsn, autocommit=True) as admin, Broker(dsn) as broker:
                env = Env(options, dsn, admin, broker, setup_catalog(broker), pool)
                scenarios = _run_scenarios(env, measurements)
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
