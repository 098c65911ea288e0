"""Two applications in one broker schema, each logged in as its own role with the grants of
its own objects: each runs its dialogs end to end, and neither can read, delete, inject into,
end or disable the other's conversations and queues."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psycopg
import pytest

from airflow_broker import Broker
from airflow_broker._statements import runner_of
from airflow_broker.errors import (
    BrokerError,
    InvalidObjectName,
    ObjectNotFound,
)
from airflow_broker.readers import runs
from tests.support import roles
from tests.support.privileges import Application, login, snapshot

A = Application("a_")
B = Application("b_")


@dataclass
class Apps:
    dsn: str
    a: str
    b: str
    # B's dialog: its initiator handle, and its target handle with one message waiting.
    b_initiator: uuid.UUID
    b_target: uuid.UUID


@pytest.fixture
def apps(owned_dsn: str) -> Iterator[Apps]:
    with Broker(owned_dsn) as admin, admin.transaction() as tx:
        A.create(tx)
        B.create(tx)
        b_initiator = tx.begin_dialog("b_I", "b_T", "b_C")
        tx.send(b_initiator, "b_Req", b"b's secret")
    with psycopg.connect(owned_dsn) as conn:
        row = conn.execute("SELECT far_handle FROM broker.endpoints"
                           " WHERE conversation_handle = %s", [b_initiator]).fetchone()
    assert row is not None
    with roles.role(owned_dsn, *roles.APPLICATION_GRANTS, *A.sender_grants(),
                    *A.reader_grants(), prefix="app_a", login=True) as a, \
            roles.role(owned_dsn, *roles.APPLICATION_GRANTS, *B.sender_grants(),
                       *B.reader_grants(), prefix="app_b", login=True) as b:
        yield Apps(owned_dsn, a, b, b_initiator, row[0])


def test_each_application_runs_its_own_dialogs(apps: Apps) -> None:
    with login(apps.dsn, apps.a) as a:
        with a.transaction() as tx:
            handle = tx.begin_dialog("a_I", "a_T", "a_C")
            tx.send(handle, "a_Req", b"order")
        with a.transaction() as tx:
            (request,) = tx.receive("a_q_t", waitfor=True, timeout=5)
            tx.send(request.conversation_handle, "a_Resp", b"done")
            tx.end_conversation(request.conversation_handle)
        with a.transaction() as tx:
            assert [m.message_body for m in tx.receive("a_q_i")] == [b"done", None]
    with login(apps.dsn, apps.b) as b, b.transaction() as tx:
        assert [m.message_body for m in tx.receive("b_q_t")] == [b"b's secret"]


NOT_FOUND = {"send on its conversation": 8426, "reply on its conversation": 8426,
             "end its conversation": 8426, "begin a dialog from its service": 8423,
             "record fake receives of its queue": 15151}


@pytest.mark.parametrize("attempt", [
    "receive", "peek through get_conversation_group", "send on its conversation",
    "reply on its conversation", "end its conversation", "begin a dialog from its service",
    "record fake receives of its queue",
])
def test_an_application_cannot_touch_anothers_conversations(apps: Apps, attempt: str) -> None:
    before = snapshot(apps.dsn)
    with login(apps.dsn, apps.a) as a, pytest.raises(BrokerError) as denied, \
            a.transaction() as tx:
        if attempt == "receive":
            tx.receive("b_q_t")
        elif attempt == "peek through get_conversation_group":
            tx.get_conversation_group("b_q_t")
        elif attempt == "send on its conversation":
            tx.send(apps.b_initiator, "b_Req", b"injected")
        elif attempt == "reply on its conversation":
            tx.send(apps.b_target, "b_Resp", b"forged reply")
        elif attempt == "end its conversation":
            tx.end_conversation(apps.b_target)
        elif attempt == "begin a dialog from its service":
            tx.begin_dialog("b_I", "b_T", "b_C")
        else:
            # Rolled-back receives it never made would disable B's queue.
            runner_of(tx).run(
                b"SELECT broker.register_receive(%s, '1'::xid8, ARRAY[gen_random_uuid()], 1)",
                [queue_id(apps.dsn, "b_q_t")])
    if attempt in NOT_FOUND:
        # A's login may not see B's conversations, services and queues: what it named is not
        # found, and nothing of B's it did not name is named to it (no queue behind a handle,
        # a service or a queue id).
        assert denied.value.number == NOT_FOUND[attempt]
        assert "b_q_" not in str(denied.value)
    else:
        # A statement that names B's queue or service itself is refused for it, as in SQL
        # Server.
        assert denied.value.number == 229
        assert "b_q_" in str(denied.value) or "b_C" in str(denied.value)
    assert snapshot(apps.dsn) == before
    # B's message is still there for B.
    with login(apps.dsn, apps.b) as b, b.transaction() as tx:
        assert [m.message_body for m in tx.receive("b_q_t")] == [b"b's secret"]


def queue_id(dsn: str, name: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT object_id FROM broker.queues WHERE name = %s",
                           [name]).fetchone()
    assert row is not None
    return int(row[0])


def test_an_application_cannot_look_up_anothers_queue(apps: Apps) -> None:
    """A queue's name tells a login no more than the catalog views do: B's queue is not there
    for A, and the full queue row (activation procedure, EXECUTE AS) is the owner's."""
    with psycopg.connect(apps.dsn) as conn:
        conn.execute("SELECT broker.alter_queue('b_q_t', p_activation_procedure =>"
                     " 'b_readers.secret:handle', p_max_queue_readers => 1)")
    with login(apps.dsn, apps.a) as a:
        with a.transaction() as tx:
            assert runner_of(tx).run(b"SELECT * FROM broker.queue_reference('b_q_t')") == []
            assert runner_of(tx).run(b"SELECT * FROM broker.queue_reference('a_q_t')") == [
                (queue_id(apps.dsn, "a_q_t"), True)]
            assert runner_of(tx).run(b"SELECT * FROM broker.queue_definition('b_q_t')") == []
        with pytest.raises(InvalidObjectName), a.transaction() as tx:
            runner_of(tx).shared.queue_id(runner_of(tx), "b_q_t")
        with pytest.raises(psycopg.errors.InsufficientPrivilege), a.transaction() as tx:
            runner_of(tx).run(b"SELECT activation_procedure FROM broker.find_queue('b_q_t')")
    with login(apps.dsn, apps.b) as b, b.transaction() as tx:
        assert runner_of(tx).run(b"SELECT * FROM broker.queue_reference('b_q_t')") == [
            (queue_id(apps.dsn, "b_q_t"), True)]


def test_an_application_cannot_read_or_write_anothers_reader_runs(apps: Apps) -> None:
    """A reader run's records (its plan, its readers' counts and errors) are for logins with
    RECEIVE on its queue: A can neither read B's run nor add to it, nor begin one on B's
    queue, and what B's run says stays B's."""
    run_id = uuid.uuid4()
    with login(apps.dsn, apps.b) as b:
        runs.begin_run(b, run_id, "b_q_t", {"readers_wanted": 1})
        runs.AttemptLog(b, run_id, 0, 0).end("finished")
    before = snapshot(apps.dsn)
    with login(apps.dsn, apps.a) as a:
        # Not found, as a run nobody began would be: B's run and queue are not named to A.
        attempts: list[tuple[Callable[[], object], str]] = [
            (lambda: runs.run_summary(a, run_id), f"reader run '{run_id}'"),
            (lambda: runs.finish_run(a, run_id), f"reader run '{run_id}'"),
            (lambda: runs.AttemptLog(a, run_id, 0, 1), f"reader run '{run_id}'"),
            (lambda: runs.begin_run(a, run_id, "a_q_t", {"readers_wanted": 9}),
             f"reader run '{run_id}'"),
            (lambda: runs.begin_run(a, uuid.uuid4(), "b_q_t", {}), "queue 'b_q_t'"),
        ]
        for attempt, named in attempts:
            with pytest.raises(ObjectNotFound) as refused:
                attempt()
            assert named in str(refused.value)
        with pytest.raises(ObjectNotFound) as refused, a.transaction() as tx:
            runner_of(tx).run(
                b"SELECT broker.reader_attempt_progress(%s, 0, 0, '{\"received\": 1000}', '[]')",
                [run_id])
        assert "reader run" in str(refused.value)
    assert snapshot(apps.dsn) == before
    with login(apps.dsn, apps.b) as b:
        summary = runs.run_summary(b, run_id)
    assert (summary["readers"], summary["attempts"], summary["readers_wanted"]) == (1, 1, 1)
    assert summary["failed_readers"] == []


def test_each_application_sees_its_own_part_of_the_catalog_views(apps: Apps) -> None:
    """service_queues, services, conversation_endpoints and transmission_queue show a login
    what it owns or holds a permission on, as SQL Server's catalog views do: A sees none of
    B's queues, services or conversations; the schema's owner sees all."""
    with psycopg.connect(apps.dsn, autocommit=True) as conn:
        # A message of A's held in the transmission queue (its target queue is disabled).
        conn.execute("SELECT broker.alter_queue('a_q_t', false)")
    with login(apps.dsn, apps.a) as a, a.transaction() as tx:
        handle = tx.begin_dialog("a_I", "a_T", "a_C")
        tx.send(handle, "a_Req", b"held")
        queues = {r[0] for r in runner_of(tx).run(b"SELECT name FROM broker.service_queues")}
        services = {r[0] for r in runner_of(tx).run(b"SELECT name FROM broker.services")}
        endpoints = {r[0] for r in runner_of(tx).run(
            b"SELECT far_service FROM broker.conversation_endpoints")}
        held = runner_of(tx).run(b"SELECT to_service_name FROM broker.transmission_queue")
    assert queues == {"a_q_i", "a_q_t"}
    assert services == {"a_I", "a_T"}
    assert endpoints == {"a_T"}
    assert held == [("a_T",)]
    with Broker(apps.dsn) as owner, owner.transaction() as tx:
        everything = {r[0] for r in runner_of(tx).run(b"SELECT name FROM broker.service_queues")}
    assert {"a_q_i", "a_q_t", "b_q_i", "b_q_t"} <= everything
