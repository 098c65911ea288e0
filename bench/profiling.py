"""``python -m bench.profiling``: where the time of our SEND and RECEIVE goes.

The embedded PostgreSQL has neither pg_stat_statements nor auto_explain, so this uses what core
PostgreSQL offers: per-function time (track_functions = all), plan_cache_mode to expose
re-planning, EXPLAIN (ANALYZE, BUFFERS) of the statements inside the functions (their text
mirrors sql/functions/30_send.sql and 40_receive.sql at the commit measured in
docs/performance.md), client-side timing of each round trip, and
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
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from airflow_broker import Broker
from bench import ours_setup, pgmq_peer
from bench.harness import Options, database, durable, prepare_database
from bench.ops import BARE_TABLE, Conn, binary_body, json_body
from bench.ours_ops import MESSAGE_TYPE
from bench.ours_setup import Catalog, Target

CALLS = 2_000
EXPLAIN_RUNS = 20

# The statements of send() and receive() that touch tables, as the functions run them.
SEND_LOOP = """
SELECT ce.conversation_handle, ce.conversation_id, ce.is_initiator, ce.state,
       ce.service_contract_id, ce.conversation_group_id, ce.service_id, ce.far_handle,
       ce.far_service, ce.lifetime, ce.send_sequence, ce.priority,
       s.name AS service_name, s.service_queue_id,
       q.name AS queue_name, q.is_enqueue_enabled, q.is_retention_enabled,
       u.message_type_id IS NOT NULL AS in_contract,
       u.is_sent_by_initiator, u.is_sent_by_target
  FROM endpoints ce
  JOIN dialog_groups g ON g.conversation_group_id = ce.conversation_group_id
  JOIN service_defs s ON s.service_id = ce.service_id
  JOIN queues q ON q.object_id = s.service_queue_id
  LEFT JOIN contract_message_usages u
         ON u.service_contract_id = ce.service_contract_id AND u.message_type_id = $2
 WHERE ce.conversation_handle = $1
   FOR NO KEY UPDATE OF ce, g"""
SEND_PENDING = """
SELECT transmission_status FROM transmissions
 WHERE conversation_handle = $1
 ORDER BY message_sequence_number DESC LIMIT 1"""
SEND_FAR = """
SELECT e.conversation_handle, e.conversation_group_id, e.service_id, e.state,
       s.service_queue_id, q.is_enqueue_enabled
  FROM endpoints e
  JOIN service_defs s ON s.service_id = e.service_id
  JOIN queues q ON q.object_id = s.service_queue_id
 WHERE e.conversation_handle = $1"""
SEND_INSERT = """
INSERT INTO queue_messages (queue_id, priority, conversation_group_id, conversation_handle,
                            message_sequence_number, precedence, service_id,
                            service_contract_id, message_type_id, message_body, message_id,
                            enqueued_at)
VALUES ($1, 5, $2, $3, $4, 2, $5, $6, $7, $8, gen_random_uuid(), utc_now())"""
SEND_UPDATE = """
UPDATE endpoints
   SET send_sequence = send_sequence + 1,
       state = CASE WHEN state = 'SO' THEN 'CO' ELSE state END
 WHERE conversation_handle = $1"""
RECEIVE_LOCK = """
SELECT g.conversation_group_id
  FROM queue_messages m
  JOIN dialog_groups g ON g.conversation_group_id = m.conversation_group_id
 WHERE m.queue_id = $1 AND m.status = 1
 ORDER BY m.priority DESC, m.queuing_order
 LIMIT 1
   FOR NO KEY UPDATE OF g SKIP LOCKED"""
RECEIVE_TAKE = """
WITH picked AS (
    SELECT m.queuing_order FROM queue_messages m
     WHERE m.conversation_group_id = $2 AND m.queue_id = $1
       AND ($3::uuid IS NULL OR m.conversation_handle = $3) AND m.status = 1
     ORDER BY m.conversation_handle, m.precedence, m.message_sequence_number
     LIMIT $4),
taken AS (
    DELETE FROM queue_messages m USING picked p
     WHERE m.queuing_order = p.queuing_order
    RETURNING m.*)
SELECT 1::smallint, t.priority, t.queuing_order, t.conversation_group_id,
       t.conversation_handle, t.message_sequence_number, s.name, t.service_id,
       c.name, t.service_contract_id, mt.name, t.message_type_id,
       t.message_body, t.message_id
  FROM taken t
  JOIN service_defs s ON s.service_id = t.service_id
  JOIN contracts c ON c.service_contract_id = t.service_contract_id
  JOIN message_types mt ON mt.message_type_id = t.message_type_id
 ORDER BY t.conversation_handle, t.precedence, t.message_sequence_number"""


def say(text: str = "") -> None:
    print(text, flush=True)


def with_settings(dsn: str, **settings: str) -> str:
    options = str(conninfo_to_dict(dsn).get("options") or "")
    extra = " ".join(f"-c {name}={value}" for name, value in settings.items())
    return make_conninfo(dsn, options=f"{options} {extra}".strip())


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
    query = (
        "SELECT * FROM broker.send(%s::uuid[], %s::text, %s::bytea, %s::boolean, %s::text,"
        " %s::text)"
    )
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


def _explain(conn: Conn, statement: str, params: Sequence[Any], types: str) -> None:
    """Median planning and execution time of ``statement`` over EXPLAIN_RUNS executions, for a
    custom and a generic plan, and the cost estimates PostgreSQL's plan cache compares."""
    name = f"bench_{uuid.uuid4().hex[:8]}"
    conn.execute(f"PREPARE {name} ({types}) AS {statement}")
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
        for label, statement, params, types in (
            ("send: endpoint + group lock, per handle", SEND_LOOP,
             [handle, catalog.message_type_id], "uuid, integer"),
            ("send: pending transmissions", SEND_PENDING, [handle], "uuid"),
            ("deliver: far endpoint", SEND_FAR, [far[0]], "uuid"),
            ("deliver: INSERT queue_messages", SEND_INSERT,
             [send_target.queue_id, target_row[0], far[0], 1, send_target.service_id,
              catalog.contract_id, catalog.message_type_id, binary_body(100)],
             "integer, uuid, uuid, bigint, integer, integer, integer, bytea"),
            ("send: UPDATE endpoints", SEND_UPDATE, [handle], "uuid"),
            ("receive: lock_next_group", RECEIVE_LOCK, [receive_target.queue_id], "integer"),
            ("receive: take_messages (TOP 1)", RECEIVE_TAKE,
             [receive_target.queue_id, group[0], None, 1], "integer, uuid, uuid, bigint"),
        ):
            say(f"#### {label}")
            say("| plan | est. cost | planning µs | execution µs | shape |")
            say("|---|---:|---:|---:|---|")
            _explain(conn, statement, params, types)
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
