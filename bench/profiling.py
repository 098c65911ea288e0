"""``python -m bench.profiling``: where the time of our SEND and RECEIVE goes.

The embedded PostgreSQL has neither pg_stat_statements nor auto_explain, so this uses what core
PostgreSQL offers: per-function time (track_functions = all), plan_cache_mode to expose
re-planning, EXPLAIN (ANALYZE, BUFFERS) of the statements inside the functions (taken from
sql/functions/30_send.sql and 40_receive.sql by bench.statements, so they are the functions'
own), client-side timing of each round trip, and
WAL written per transaction. It needs a superuser (track_functions); the embedded server is one.
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from airflow_broker import Broker
from airflow_broker.queries import Queries
from bench import ours_setup, pgmq_peer
from bench.harness import database, durable, prepare_database
from bench.ops import BARE_TABLE, Conn, binary_body, json_body, with_settings
from bench.ours_ops import MESSAGE_TYPE
from bench.ours_setup import Catalog, Target
from bench.scenario import Options
from bench.statements import Statement, engine_statements

CALLS = 2_000
EXPLAIN_RUNS = 20

def say(text: str = "") -> None:
    print(text, flush=True)


def _function_times(admin: Conn) -> list[tuple[str, int, float, float]]:
    """(function, calls, total µs per call, self µs per call) of our and pgmq's functions."""
    admin.execute("SELECT pg_stat_clear_snapshot()")
    rows = admin.execute(
        "SELECT p.oid::regprocedure::text, s.calls, s.total_time, s.self_time"
        " FROM pg_stat_user_functions s JOIN pg_proc p ON p.oid = s.funcid"
        " WHERE s.schemaname IN ('broker', 'pgmq') AND s.calls > 0 ORDER BY s.self_time DESC"
    ).fetchall()
    return [(r[0], r[1], r[2] * 1000 / r[1], r[3] * 1000 / r[1]) for r in rows]


def _wal(admin: Conn) -> tuple[int, int, int]:
    """(WAL position in bytes, WAL records, full-page images) of the whole server."""
    admin.execute("SELECT pg_stat_clear_snapshot()")
    row = admin.execute(
        "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint, wal_records,"
        " wal_fpi FROM pg_stat_wal"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


@contextmanager
def _counting(admin: Conn, calls: int, label: str) -> Iterator[None]:
    """Resets function statistics, runs the block (which must close its connections, so their
    statistics are flushed), prints per-call function times and WAL per transaction."""
    admin.execute("SELECT pg_stat_reset()")
    admin.execute("SELECT pg_stat_reset_shared('wal')")
    before = _wal(admin)
    started = time.perf_counter()
    yield
    elapsed = time.perf_counter() - started
    wal_bytes = _wal(admin)[0] - before[0]
    time.sleep(1.2)
    after = _wal(admin)
    records, fpi = after[1], after[2]
    say(f"#### {label}: {calls:,} transactions, {elapsed / calls * 1e6:,.0f} µs each (client)")
    say(f"WAL per transaction: {wal_bytes / calls:,.0f} bytes, {records / calls:.1f} records, "
        f"{fpi / calls:.2f} full-page images")
    say("| function | calls | total µs/call | self µs/call |")
    say("|---|---:|---:|---:|")
    for name, count, total, own in _function_times(admin):
        say(f"| {name} | {count:,} | {total:,.1f} | {own:,.1f} |")
    say()


def _loop(calls: int, body: Callable[[], object]) -> None:
    for _ in range(calls):
        body()


def profile_send(dsn: str, admin: Conn, handle: uuid.UUID, population: str) -> None:
    say(f"### SEND, one message per transaction, through the Python API ({population})")
    body = binary_body(100)
    for mode in ("auto", "force_generic_plan"):
        traced = with_settings(dsn, track_functions="all", plan_cache_mode=mode)
        with _counting(admin, CALLS, f"plan_cache_mode = {mode}"), \
                Broker(traced, max_connections=1) as broker:
            def send(broker: Broker = broker) -> None:
                with broker.transaction() as tx:
                    tx.send(handle, MESSAGE_TYPE, body)

            _loop(CALLS, send)


def profile_round_trips(dsn: str, handle: uuid.UUID) -> None:
    body = binary_body(100)
    say("### Round trips of one SEND transaction (psycopg, prepared), µs, median")
    phases: dict[str, list[float]] = {"BEGIN": [], "SELECT broker.send(...)": [], "COMMIT": []}
    baseline: dict[str, list[float]] = {"BEGIN": [], "SELECT 1": [], "COMMIT": []}
    # The engine's own rendering of the call, as Transaction.send() sends it.
    query = Queries("broker").call("send", 6, ["uuid[]", "text", "bytea", "boolean", "text",
                                               "text"])
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(CALLS):
            for store, statement, params in (
                (phases, query, [[handle], MESSAGE_TYPE, body, False, None, None]),
                (baseline, "SELECT 1", []),
            ):
                timed = list(store)
                marks = [time.perf_counter()]
                conn.execute("BEGIN")
                marks.append(time.perf_counter())
                conn.execute(statement, params, prepare=True)
                marks.append(time.perf_counter())
                conn.execute("COMMIT")
                marks.append(time.perf_counter())
                for index, name in enumerate(timed):
                    store[name].append((marks[index + 1] - marks[index]) * 1e6)
    say("| phase | SEND | SELECT 1 |")
    say("|---|---:|---:|")
    for (name, values), base in zip(phases.items(), baseline.values(), strict=True):
        say(f"| {name} | {statistics.median(values):,.0f} | {statistics.median(base):,.0f} |")
    say()


def profile_peers(dsn: str, admin: Conn, queue: str) -> None:
    say("### The same transaction for pgmq.send and a bare INSERT")
    message = json_body(100)
    payload = binary_body(100)
    for label, statement, params in (
        ("pgmq.send", "SELECT pgmq.send(%s, %s::jsonb)", [queue, message]),
        ("bare INSERT", f"INSERT INTO {BARE_TABLE} (payload) VALUES (%s)", [payload]),
    ):
        traced = with_settings(dsn, track_functions="all")
        with _counting(admin, CALLS, label), psycopg.connect(traced) as conn:
            def run(
                conn: Conn = conn, statement: str = statement, params: Sequence[Any] = params
            ) -> None:
                with conn.transaction():
                    conn.execute(statement, params)

            _loop(CALLS, run)


def profile_receive(
    dsn: str, admin: Conn, catalog: Catalog, target: Target, population: str
) -> None:
    say(f"### RECEIVE TOP(1) + commit, through the Python API ({population})")
    for mode in ("auto", "force_generic_plan"):
        with admin.transaction():
            ours_setup.purge(admin, target)
            ours_setup.add_dialogs(admin, catalog, target, 200, CALLS // 200 + 2)
        admin.execute("VACUUM (ANALYZE) broker.queue_messages")
        traced = with_settings(dsn, track_functions="all", plan_cache_mode=mode)
        with _counting(admin, CALLS, f"plan_cache_mode = {mode}"), \
                Broker(traced, max_connections=1) as broker:
            def receive(broker: Broker = broker) -> None:
                with broker.transaction() as tx:
                    tx.receive(target.queue, top=1)

            _loop(CALLS, receive)


def _explain(conn: Conn, statement: Statement, params: Sequence[Any]) -> None:
    """Median planning and execution time of ``statement`` over EXPLAIN_RUNS executions, for a
    custom and a generic plan, and the cost estimates PostgreSQL's plan cache compares."""
    name = f"bench_{uuid.uuid4().hex[:8]}"
    conn.execute(statement.prepare(name))
    literal = psycopg.ClientCursor(conn)
    placeholders = ", ".join(["%s"] * len(params))
    for mode in ("force_custom_plan", "force_generic_plan", "auto"):
        planning, execution = [], []
        plan: dict[str, Any] = {}
        with conn.transaction(force_rollback=True):
            conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
            for _ in range(EXPLAIN_RUNS):
                row = literal.execute(
                    f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE {name}({placeholders})",
                    params,
                ).fetchone()
                assert row is not None
                plan = row[0][0]
                planning.append(plan["Planning Time"])
                execution.append(plan["Execution Time"])
        top = plan["Plan"]
        label = mode.removeprefix("force_").removesuffix("_plan")
        if mode == "auto":
            # What the plan cache chose when left alone, as plpgsql leaves it.
            chosen = conn.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE name = %s", [name]
            ).fetchone()
            assert chosen is not None
            # The forced runs above counted one custom and one generic plan each.
            label = (f"auto: {chosen[0] - EXPLAIN_RUNS} generic, "
                     f"{chosen[1] - EXPLAIN_RUNS} custom")
        say(f"| {label} | {top['Total Cost']:.1f} | {statistics.median(planning) * 1000:,.0f} "
            f"| {statistics.median(execution) * 1000:,.0f} | {_shape(top)} |")
    conn.execute(f"DEALLOCATE {name}")


def _shape(node: dict[str, Any]) -> str:
    """The plan's nodes, depth first, e.g. LockRows (Nested Loop (Index Scan endpoints_pkey))."""
    label = str(node["Node Type"])
    if "Index Name" in node:
        label += f" {node['Index Name']}"
    elif "Relation Name" in node:
        label += f" {node['Relation Name']}"
    children = [_shape(child) for child in node.get("Plans", [])]
    return label + (" (" + "; ".join(children) + ")" if children else "")


def profile_statements(
    dsn: str, catalog: Catalog, send_target: Target, handle: uuid.UUID,
    receive_target: Target, population: str,
) -> None:
    say(f"### Statements inside send() and receive() ({population}): custom, generic and the "
        f"plan cache's own choice (µs, median of {EXPLAIN_RUNS})")
    with psycopg.connect(dsn) as conn:
        conn.execute("SET search_path = broker")
        conn.commit()
        far = conn.execute(
            "SELECT far_handle FROM endpoints WHERE conversation_handle = %s", [handle]
        ).fetchone()
        assert far is not None
        target_row = conn.execute(
            "SELECT conversation_group_id FROM endpoints WHERE conversation_handle = %s", [far[0]]
        ).fetchone()
        assert target_row is not None
        group = conn.execute(
            "SELECT conversation_group_id FROM queue_messages WHERE queue_id = %s AND status = 1"
            " LIMIT 1", [receive_target.queue_id]
        ).fetchone()
        assert group is not None
        conn.commit()
        statements = engine_statements()
        for label, name, params in (
            ("send: endpoint + group lock, per handle", "send_endpoint",
             [handle, catalog.message_type_id]),
            ("send: pending transmissions", "send_pending", [handle]),
            ("deliver: far endpoint", "deliver_far_endpoint", [far[0]]),
            ("deliver: INSERT queue_messages", "deliver_insert",
             [send_target.queue_id, 5, target_row[0], far[0], 1, "data", send_target.service_id,
              catalog.contract_id, catalog.message_type_id, binary_body(100), None]),
            ("send: UPDATE endpoints", "send_update_endpoint", [1, False, far[0], handle]),
            ("receive: lock_next_group", "receive_lock_group", [receive_target.queue_id]),
            ("receive: take_messages (TOP 1)", "receive_take",
             [group[0], receive_target.queue_id, None, 1]),
        ):
            say(f"#### {label}")
            say("| plan | est. cost | planning µs | execution µs | shape |")
            say("|---|---:|---:|---:|---|")
            _explain(conn, statements[name], params)
            say()


def main() -> int:
    pgmq_peer.ensure_package()
    with database(Options()) as (base_dsn, _embedded):
        dsn = durable(base_dsn)
        prepare_database(dsn)
        with psycopg.connect(dsn, autocommit=True) as admin, Broker(dsn) as broker:
            catalog = ours_setup.setup_catalog(broker)
            send_target = catalog.targets["send"]
            receive_target = catalog.targets["recv1"]
            handle = ours_setup.begin_dialogs(broker, send_target, 1)[0]
            admin.execute("VACUUM (ANALYZE)")
            version = admin.execute("SHOW server_version").fetchone()
            say(f"PostgreSQL {version[0] if version else '?'}; {CALLS:,} calls per measurement")
            say()
            # Plans, and so the plan cache's choices, depend on the tables' sizes: a fresh
            # catalog first, then one with 100,000 endpoints and 100,000 waiting messages.
            for population in ("small catalog", "100,000 endpoints"):
                if population != "small catalog":
                    with admin.transaction():
                        ours_setup.add_dialogs(
                            admin, catalog, catalog.targets["growth"], 50_000, 2
                        )
                    admin.execute("VACUUM (ANALYZE)")
                profile_send(dsn, admin, handle, population)
                profile_receive(dsn, admin, catalog, receive_target, population)
                with admin.transaction():
                    ours_setup.add_dialogs(admin, catalog, receive_target, 200, 10)
                admin.execute("VACUUM (ANALYZE)")
                profile_statements(
                    dsn, catalog, send_target, handle, receive_target, population
                )
            profile_round_trips(dsn, handle)
            profile_peers(dsn, admin, send_target.queue)
    return 0


if __name__ == "__main__":
    sys.exit(main())
