"""Our side's catalog, dialogs and set-based fills.

Filling a queue through SEND costs as much as the SEND being measured, so large fills write the
rows SEND would write (dialog groups, both endpoints, queue messages) in a few set-based
statements. They follow sql/migrations/V001 and send() in sql/functions/30_send.sql: after the
first message of a dialog the target endpoint exists with its own group, both endpoints are
CONVERSING, the initiator's send_sequence counts the messages sent and its message0_xid names the
transaction that delivered message 0 (sql/migrations/V002). If those change, these
statements must follow.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from psycopg import sql

from airflow_broker import Broker
from bench.ops import Conn, binary_body
from bench.ours_ops import MESSAGE_TYPE

CONTRACT = "BenchContract"
INITIATOR_SERVICE = "BenchInitiator"
INITIATOR_QUEUE = "bench_initiator"
# The full dialog (h) gets replies and EndDialogs back, on an initiator queue of its own.
DIALOG_INITIATOR_SERVICE = "BenchDialogInitiator"
DIALOG_INITIATOR_QUEUE = "bench_dialog_initiator"
# One target queue per scenario, so a scenario's messages never sit in another's queue.
# "standing" is read by nobody: it holds the dialogs and messages of a broker in use (h).
TARGETS = ("send", "recv1", "recv100", "wait", "growth", "drain", "dialog", "spark", "standing")
# SQL Server's default dialog lifetime, as BEGIN DIALOG without LIFETIME gives.
LIFETIME = "2147483647 seconds"


@dataclass(frozen=True)
class Target:
    service: str
    queue: str
    service_id: int
    queue_id: int


@dataclass(frozen=True)
class Catalog:
    initiator_id: int
    contract_id: int
    message_type_id: int
    targets: dict[str, Target]
    # The initiating side of h's dialogs, as a Target: its service and its queue.
    dialog_initiator: Target


def _scalar(conn: Conn, query: str, params: Sequence[object]) -> int:
    row = conn.execute(query, params).fetchone()
    if row is None or row[0] is None:
        raise LookupError(f"no row for {query!r} {list(params)!r}")
    return int(row[0])


def _exists(conn: Conn, table: str, name: str) -> bool:
    query = sql.SQL("SELECT 1 FROM {} WHERE name = %s").format(sql.Identifier("broker", table))
    return conn.execute(query, [name]).fetchone() is not None


def setup_catalog(broker: Broker) -> Catalog:
    """The message type, contract, services and queues of the benchmark (kept when present)."""
    with broker.transaction() as tx:
        conn = tx.conn
        if not _exists(conn, "message_types", MESSAGE_TYPE):
            tx.create_message_type(MESSAGE_TYPE)
        if not _exists(conn, "contracts", CONTRACT):
            tx.create_contract(CONTRACT, {MESSAGE_TYPE: "ANY"})
        for service, queue in ((INITIATOR_SERVICE, INITIATOR_QUEUE),
                               (DIALOG_INITIATOR_SERVICE, DIALOG_INITIATOR_QUEUE)):
            if not _exists(conn, "service_defs", service):
                tx.create_queue(queue)
                tx.create_service(service, queue)
        for name in TARGETS:
            if not _exists(conn, "service_defs", f"Bench_{name}"):
                tx.create_queue(f"bench_{name}")
                tx.create_service(f"Bench_{name}", f"bench_{name}", [CONTRACT])
    with broker.transaction() as tx:
        conn = tx.conn

        def target(service: str, queue: str) -> Target:
            return Target(
                service=service,
                queue=queue,
                service_id=_scalar(
                    conn, "SELECT service_id FROM broker.service_defs WHERE name = %s", [service]
                ),
                queue_id=_scalar(
                    conn,
                    "SELECT service_queue_id FROM broker.service_defs WHERE name = %s",
                    [service],
                ),
            )

        targets = {name: target(f"Bench_{name}", f"bench_{name}") for name in TARGETS}
        return Catalog(
            initiator_id=_scalar(
                conn, "SELECT service_id FROM broker.service_defs WHERE name = %s",
                [INITIATOR_SERVICE],
            ),
            contract_id=_scalar(
                conn, "SELECT service_contract_id FROM broker.contracts WHERE name = %s",
                [CONTRACT],
            ),
            message_type_id=_scalar(
                conn, "SELECT message_type_id FROM broker.message_types WHERE name = %s",
                [MESSAGE_TYPE],
            ),
            targets=targets,
            dialog_initiator=target(DIALOG_INITIATOR_SERVICE, DIALOG_INITIATOR_QUEUE),
        )


def send_dialog(broker: Broker) -> uuid.UUID:
    """The benchmark's catalogue, and one dialog to its SEND target with nothing sent yet."""
    target = setup_catalog(broker).targets["send"]
    with broker.transaction() as tx:
        handle: uuid.UUID = tx.begin_dialog(INITIATOR_SERVICE, target.service, CONTRACT)
    return handle


def begin_dialogs(broker: Broker, target: Target, count: int) -> list[uuid.UUID]:
    """Open dialogs through the API, each with a first SEND so its target endpoint exists and
    later SENDs take the steady-state path."""
    handles = []
    with broker.transaction() as tx:
        for _ in range(count):
            handle = tx.begin_dialog(INITIATOR_SERVICE, target.service, CONTRACT)
            tx.send(handle, MESSAGE_TYPE, b"")
            handles.append(handle)
    return handles


_NEW_DIALOGS = """
CREATE TEMP TABLE IF NOT EXISTS bench_new_dialogs (
    rn bigint, init_handle uuid, target_handle uuid, init_group uuid, target_group uuid,
    conversation_id uuid) ON COMMIT DELETE ROWS
"""

_FILL_NEW_DIALOGS = """
INSERT INTO bench_new_dialogs
SELECT g, gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), gen_random_uuid(),
       gen_random_uuid()
  FROM generate_series(0, %(conversations)s - 1) g
"""

_GROUPS = """
INSERT INTO broker.dialog_groups (conversation_group_id, service_id)
SELECT init_group, %(initiator)s FROM bench_new_dialogs
UNION ALL
SELECT target_group, %(target)s FROM bench_new_dialogs
"""

_ENDPOINTS = """
INSERT INTO broker.endpoints (
    conversation_handle, conversation_id, is_initiator, service_contract_id,
    conversation_group_id, service_id, far_handle, far_service, lifetime, state, send_sequence,
    message0_xid, created_at)
SELECT d.init_handle, d.conversation_id, true, %(contract)s, d.init_group, %(initiator)s,
       d.target_handle, %(target_name)s, n.now + %(lifetime)s::interval, 'CO', %(each)s,
       pg_current_xact_id(), n.now
  FROM bench_new_dialogs d CROSS JOIN (SELECT broker.utc_now() AS now) n
UNION ALL
SELECT d.target_handle, d.conversation_id, false, %(contract)s, d.target_group, %(target)s,
       d.init_handle, %(initiator_name)s, n.now + %(lifetime)s::interval, 'CO', 0, NULL, n.now
  FROM bench_new_dialogs d CROSS JOIN (SELECT broker.utc_now() AS now) n
"""

# Round-robin over the conversations, so consecutive messages (and readers) hit different groups.
_MESSAGES = """
INSERT INTO broker.queue_messages (
    queue_id, priority, conversation_group_id, conversation_handle, message_sequence_number,
    service_id, service_contract_id, message_type_id, message_body, message_id, enqueued_at)
SELECT %(queue)s, 5, d.target_group, d.target_handle, k, %(target)s, %(contract)s,
       %(message_type)s, %(body)s, gen_random_uuid(), n.now
  FROM generate_series(0, %(each)s - 1) k
 CROSS JOIN bench_new_dialogs d
 CROSS JOIN (SELECT broker.utc_now() AS now) n
 ORDER BY k, d.rn
"""


def add_dialogs(
    conn: Conn,
    catalog: Catalog,
    target: Target,
    conversations: int,
    messages_each: int,
    body_size: int = 100,
) -> None:
    """``conversations`` new dialogs to ``target``, each with ``messages_each`` messages
    waiting, in the caller's transaction."""
    if conversations <= 0:
        return
    params = {
        "conversations": conversations,
        "initiator": catalog.initiator_id,
        "target": target.service_id,
        "contract": catalog.contract_id,
        "target_name": target.service,
        "initiator_name": INITIATOR_SERVICE,
        "lifetime": LIFETIME,
        "each": messages_each,
        "queue": target.queue_id,
        "message_type": catalog.message_type_id,
        "body": binary_body(body_size),
    }
    # The sort of a million rows should not spill to disk.
    conn.execute("SET LOCAL work_mem = '256MB'")
    conn.execute(_NEW_DIALOGS)
    conn.execute(_FILL_NEW_DIALOGS, params)
    conn.execute(_GROUPS, params)
    conn.execute(_ENDPOINTS, params)
    if messages_each > 0:
        conn.execute(_MESSAGES, params)
    conn.execute("TRUNCATE bench_new_dialogs")


_TOP_UP = """
WITH d AS (
    SELECT i.conversation_handle AS init_handle, t.conversation_handle AS target_handle,
           t.conversation_group_id AS target_group, i.send_sequence AS seq0,
           row_number() OVER (ORDER BY i.conversation_handle) - 1 AS rn,
           count(*) OVER () AS nd
      FROM broker.endpoints i
      JOIN broker.endpoints t ON t.conversation_handle = i.far_handle
     WHERE i.conversation_handle = ANY (%(handles)s::uuid[])
), added AS (
    INSERT INTO broker.queue_messages (
        queue_id, priority, conversation_group_id, conversation_handle,
        message_sequence_number, service_id, service_contract_id, message_type_id, message_body,
        message_id, enqueued_at)
    SELECT %(queue)s, 5, d.target_group, d.target_handle, d.seq0 + k / d.nd, %(target)s,
           %(contract)s, %(message_type)s, %(body)s, gen_random_uuid(), n.now
      FROM generate_series(0, %(count)s - 1) k
      JOIN d ON d.rn = k %% d.nd
     CROSS JOIN (SELECT broker.utc_now() AS now) n
     ORDER BY k
)
UPDATE broker.endpoints e
   SET send_sequence = d.seq0 + %(count)s / d.nd + (d.rn < %(count)s %% d.nd)::int
  FROM d
 WHERE e.conversation_handle = d.init_handle
"""


def top_up(
    conn: Conn,
    catalog: Catalog,
    target: Target,
    handles: Sequence[uuid.UUID],
    count: int,
    body_size: int = 100,
) -> None:
    """``count`` more messages on existing dialogs (initiator ``handles``), round-robin."""
    if count <= 0 or not handles:
        return
    conn.execute(_TOP_UP, {
        "handles": list(handles),
        "queue": target.queue_id,
        "target": target.service_id,
        "contract": catalog.contract_id,
        "message_type": catalog.message_type_id,
        "body": binary_body(body_size),
        "count": count,
    })


def purge(conn: Conn, target: Target) -> None:
    conn.execute("DELETE FROM broker.queue_messages WHERE queue_id = %s", [target.queue_id])


def forget_dialogs(conn: Conn, *sides: Target) -> None:
    """Removes the dialogs of these services: their endpoints on both sides, their conversation
    groups, and the messages waiting on their queues. h leaves a closed target endpoint per
    dialog (kept 30 minutes against replays) and, at the end of a measurement, dialogs still in
    flight. Benchmark housekeeping, not END CONVERSATION WITH CLEANUP: nobody is told and
    nothing is logged."""
    params = {"ids": [side.service_id for side in sides],
              "names": [side.service for side in sides]}
    ours = "service_id = ANY(%(ids)s) OR (is_initiator AND far_service = ANY(%(names)s))"
    for side in sides:
        purge(conn, side)
    conn.execute("DELETE FROM broker.transmissions WHERE conversation_handle IN"
                 f" (SELECT conversation_handle FROM broker.endpoints WHERE {ours})", params)
    conn.execute(
        f"WITH gone AS (DELETE FROM broker.endpoints WHERE {ours}"
        " RETURNING conversation_group_id)"
        " DELETE FROM broker.dialog_groups WHERE service_id = ANY(%(ids)s)"
        " OR conversation_group_id IN (SELECT conversation_group_id FROM gone)", params)


def ready(conn: Conn, target: Target) -> int:
    return _scalar(
        conn,
        "SELECT count(*) FROM broker.queue_messages WHERE queue_id = %s AND status = 1",
        [target.queue_id],
    )


def sample_dialogs(conn: Conn, catalog: Catalog, target: Target, count: int) -> list[uuid.UUID]:
    """Initiator handles of up to ``count`` dialogs to ``target``, picked at random."""
    rows = conn.execute(
        "SELECT conversation_handle FROM broker.endpoints"
        " WHERE is_initiator AND service_id = %s AND far_service = %s"
        " ORDER BY random() LIMIT %s",
        [catalog.initiator_id, target.service, count],
    ).fetchall()
    return [row[0] for row in rows]
