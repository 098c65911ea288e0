"""Metadata visibility as SQL Server's, for everything PUBLIC may use: the catalog views and
the functions every login may call show a login the objects it owns or holds a permission on
(a conversation: RECEIVE on the queue of its own service), and answer for any other as for
one that does not exist. docs/security.md lists each, with its check."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg.rows
import pytest
from psycopg import sql

from airflow_broker import Broker
from airflow_broker._statements import runner_of
from airflow_broker.errors import BrokerError
from tests.support import roles
from tests.support.privileges import Application, login, snapshot
from tests.support.visibility import (
    documented_public_objects,
    granted_to_public,
    public_views,
)

A = Application("a_")
B = Application("b_")

SECRET_BODY = b"b's secret body"
SCHEMA_MARKER = "bSecretSchemaElement"
ROUTE_MARKER = "b-route-password"
PROCEDURE_MARKER = "b_readers.secret_handler"
PLAN_MARKER = "b_secret_plan"
XSD = (f'<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">'
       f'<xs:element name="{SCHEMA_MARKER}" type="xs:string"/></xs:schema>')


@dataclass
class Other:
    """Application B's objects, seen from a login that holds nothing on them."""

    dsn: str
    names: tuple[str, ...]
    initiator: uuid.UUID
    target: uuid.UUID
    group: uuid.UUID
    remote: uuid.UUID
    queue_id: int
    service_id: int
    quarantine_id: int
    task_id: uuid.UUID
    run_id: uuid.UUID
    database_id: int

    def secrets(self) -> list[str]:
        """What none of B's answers to another login may hold, unless that login named it."""
        return [*self.names, SECRET_BODY.decode(), SECRET_BODY.hex(), SCHEMA_MARKER,
                ROUTE_MARKER, PROCEDURE_MARKER, PLAN_MARKER, str(self.initiator),
                str(self.target), str(self.group), str(self.remote), str(self.task_id),
                str(self.run_id)]


def _one(conn: psycopg.Connection[Any], query: str, *params: object) -> Any:
    row = conn.execute(query.encode(), list(params)).fetchone()
    assert row is not None
    return row[0]


@pytest.fixture
def other(owned_dsn: str) -> Other:
    """A's and B's objects, and everything of B's that a function can be asked about: a
    VALID_XML message type with its schema collection, a route with a password in its address,
    a queue with an activation procedure, a dialog with a message waiting, a message held in
    the transmission queue, a parked message, an activated reader, a reader run and an Airflow
    consumer's inbox."""
    with Broker(owned_dsn) as admin, admin.transaction() as tx:
        A.create(tx)
        B.create(tx)
        tx.create_xml_schema_collection("b_schemas", [XSD])
        tx.create_message_type("b_Doc", "VALID_XML", schema_collection="b_schemas")
        tx.create_contract("b_DocC", {"b_Doc": "ANY"})
        tx.alter_service("b_T", add_contracts=["b_DocC"])
        tx.create_route("b_route", f"postgresql://b_user:{ROUTE_MARKER}@b-host/db",
                        service_name="b_Remote")
        tx.alter_queue("b_q_t", activation_status=False, activation_procedure=PROCEDURE_MARKER,
                       max_queue_readers=1)
        initiator = tx.begin_dialog("b_I", "b_T", "b_C")
        tx.send(initiator, "b_Req", SECRET_BODY)
        tx.send(initiator, "b_Req", SECRET_BODY)
        remote = tx.begin_dialog("b_I", "b_Remote", "b_C")
        tx.send(remote, "b_Req", SECRET_BODY)
    task_id, run_id = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(owned_dsn, autocommit=True) as conn:
        target = _one(conn, "SELECT far_handle FROM broker.endpoints"
                            " WHERE conversation_handle = %s", initiator)
        group = _one(conn, "SELECT conversation_group_id FROM broker.endpoints"
                           " WHERE conversation_handle = %s", target)
        queue_id = _one(conn, "SELECT object_id FROM broker.queues WHERE name = 'b_q_t'")
        service_id = _one(conn, "SELECT service_id FROM broker.service_defs"
                                " WHERE name = 'b_T'")
        conn.execute("SELECT * FROM broker.airflow_claim('b_consumer', 'b_q_t', 1)")
        quarantine_id = _one(
            conn, "SELECT broker.quarantine_message('b_q_t', %s, %s, 'b_T', 'b_C', 'b_Req', 9,"
                  " gen_random_uuid(), %s, 'failed', 'traceback', 1, 'retrying')",
            target, group, SECRET_BODY)
        conn.execute("SELECT broker.activation_started(%s, %s, 1)", [task_id, queue_id])
        conn.execute("SELECT broker.reader_run_begin(%s, 'b_q_t', %s)",
                     [run_id, f'{{"plan": "{PLAN_MARKER}"}}'])
        database_id = _one(conn, "SELECT oid FROM pg_database"
                                 " WHERE datname = current_database()")
    names = ("b_q_t", "b_q_i", "b_I", "b_T", "b_C", "b_Req", "b_Resp", "b_Doc", "b_DocC",
             "b_schemas", "b_route", "b_Remote", "b_consumer")
    return Other(owned_dsn, names, initiator, target, group, remote, queue_id, service_id,
                 quarantine_id, task_id, run_id, database_id)


@pytest.fixture
def app_a(other: Other) -> Iterator[str]:
    """Application A's login: a sender from a_I and a reader of a_q_t."""
    with roles.role(other.dsn, *roles.APPLICATION_GRANTS, *A.sender_grants(),
                    *A.reader_grants(), prefix="app_a", login=True) as name:
        yield name


@pytest.fixture
def outsider(other: Other) -> Iterator[str]:
    """A login with USAGE on the schema and no broker permission at all."""
    with roles.role(other.dsn, *roles.APPLICATION_GRANTS, prefix="nobody",
                    login=True) as name:
        yield name


def test_every_public_function_and_view_is_listed_in_security_md(owned_dsn: str) -> None:
    """What PUBLIC may execute or select is exactly the list of docs/security.md, each with
    its check: a function or view granted to PUBLIC without a word there, or a listed one that
    is no longer PUBLIC's, fails here."""
    granted = granted_to_public(owned_dsn)
    documented = documented_public_objects()
    assert granted - documented == set(), "granted to PUBLIC, not in docs/security.md"
    assert documented - granted == set(), "in docs/security.md, not granted to PUBLIC"


def test_the_list_of_public_objects_is_read_from_its_section() -> None:
    text = ("# Security\n\n## What PUBLIC may use\n\n| View or function | Check |\n|---|---|\n"
            "| `services` (view) | x |\n| `send()`, `send_many()` | y |\n\n## Next\n"
            "| `not_this()` | z |\n")
    assert documented_public_objects(text) == {"services", "send()", "send_many()"}


def test_an_application_reads_every_public_view_and_sees_its_own_objects_only(
        other: Other, app_a: str) -> None:
    """conversation_endpoints, services, service_queues and transmission_queue, every column,
    as an application login: its own queues, services, conversations and held messages, and
    nothing of B's. (conversation_endpoints failed for every application: a function it calls
    was not executable by PUBLIC.)"""
    with psycopg.connect(other.dsn, autocommit=True) as conn:
        # A message of A's held in the transmission queue (its target queue is disabled).
        conn.execute("SELECT broker.alter_queue('a_q_t', false)")
    with login(other.dsn, app_a) as a, a.transaction() as tx:
        handle = tx.begin_dialog("a_I", "a_T", "a_C")
        tx.send(handle, "a_Req", b"held")
    named: dict[str, list[dict[str, Any]]] = {}
    with psycopg.connect(roles.login_dsn(other.dsn, app_a),
                         row_factory=psycopg.rows.dict_row) as conn:
        for view in ("service_queues", "services", "conversation_endpoints",
                     "transmission_queue"):
            named[view] = conn.execute(sql.SQL("SELECT * FROM broker.{}").format(
                sql.Identifier(view))).fetchall()
    assert {r["name"] for r in named["service_queues"]} == {"a_q_i", "a_q_t"}
    assert {r["name"] for r in named["services"]} == {"a_I", "a_T"}
    assert [(r["conversation_handle"], r["far_service"])
            for r in named["conversation_endpoints"]] == [(handle, "a_T")]
    assert [(r["conversation_handle"], r["to_service_name"], r["message_body"])
            for r in named["transmission_queue"]] == [(handle, "a_T", b"held")]
    shown = str(named)
    assert [s for s in other.secrets() if s in shown] == []


def test_T_TX_04_get_transmission_status_answers_only_the_readers_of_the_conversation(
        other: Other, app_a: str) -> None:
    """GET_TRANSMISSION_STATUS of B's conversation is, to A, that of a handle that does not
    exist (8426); B's own login and the owner get its status."""
    with login(other.dsn, app_a) as a:
        for handle in (other.remote, other.initiator, other.target, uuid.uuid4()):
            with pytest.raises(BrokerError) as refused, a.transaction() as tx:
                tx.get_transmission_status(handle)
            assert refused.value.number == 8426
            assert str(handle) in str(refused.value)
    with roles.role(other.dsn, *roles.APPLICATION_GRANTS, *B.sender_grants(),
                    prefix="app_b", login=True) as b_name, \
            login(other.dsn, b_name) as b, b.transaction() as tx:
        assert isinstance(tx.get_transmission_status(other.remote), str)


def test_message_type_validation_shows_a_type_only_to_who_could_send_it(
        other: Other, app_a: str) -> None:
    """The validation of B's VALID_XML type, with its schema collection's documents, is not
    shown to A (no row, as for a type that does not exist); a sender holding REFERENCES on a
    contract of the type, and a reader of a queue whose service takes that contract, get
    it."""
    query = b"SELECT * FROM broker.message_type_validation(%s)"
    with login(other.dsn, app_a) as a, a.transaction() as tx:
        assert runner_of(tx).run(query, ["b_Doc"]) == []
        assert runner_of(tx).run(query, ["no such type"]) == []
        assert runner_of(tx).run(query, ["a_Req"]) == [("NONE", None, None)]
        assert runner_of(tx).run(query, ["DEFAULT"]) == [("NONE", None, None)]
    sender = roles.broker_grant("REFERENCES", "CONTRACT::b_DocC")
    reader = roles.broker_grant("RECEIVE", "QUEUE::b_q_t")
    for grant in (sender, reader):
        with roles.role(other.dsn, *roles.APPLICATION_GRANTS, grant, prefix="app_b",
                        login=True) as b_name, \
                login(other.dsn, b_name) as b, b.transaction() as tx:
            ((kind, _, schemas),) = runner_of(tx).run(query, ["b_Doc"])
            assert (kind, schemas) == ("VALID_XML", [XSD])


def test_a_queue_name_is_ambiguous_only_among_the_queues_a_login_may_see(
        other: Other, app_a: str) -> None:
    """Two of B's queues named alike in two schemas: to A the name is of no queue (no row),
    not an ambiguous one (50105), which would tell it that both exist."""
    with psycopg.connect(other.dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA b_private")
        conn.execute("GRANT USAGE, CREATE ON SCHEMA b_private TO "
                     + _one(conn, "SELECT nspowner::regrole::text FROM pg_namespace"
                                  " WHERE nspname = 'broker'"))
        conn.execute("SELECT broker.create_queue('b_q_t', p_schema => 'b_private')")
    with login(other.dsn, app_a) as a, a.transaction() as tx:
        for function in ("queue_reference", "queue_definition", "queue_state"):
            assert runner_of(tx).run(f"SELECT * FROM broker.{function}('b_q_t')".encode()) == []
    with Broker(other.dsn) as owner, pytest.raises(BrokerError) as ambiguous, \
            owner.transaction() as tx:
        runner_of(tx).run(b"SELECT * FROM broker.queue_reference('b_q_t')")
    assert ambiguous.value.number == 50105


# A call with an id or a handle of B's, the id it takes, and the number of a missing one.
NOT_FOUND_CALLS: dict[str, tuple[str, str | None, int]] = {
    "register_receive": ("SELECT broker.register_receive(%s, '1'::xid8,"
                         " ARRAY[gen_random_uuid()], 1)", "queue_id", 15151),
    "wait_register": ("SELECT broker.wait_register(gen_random_uuid(), %s, false)", "queue_id",
                      15151),
    "activation_ended": ("SELECT broker.activation_ended(%s, 'done', 0, 0, NULL)", "task_id",
                         15151),
    "settle_parked": ("SELECT broker.settle_parked(%s, 'done', 1, NULL, NULL)",
                      "quarantine_id", 15151),
    "parked_messages": ("SELECT * FROM broker.parked_messages(%s)", "target", 8426),
    "airflow_claimed": ("SELECT * FROM broker.airflow_claimed('b_consumer')", None, 15151),
    "airflow_ack": ("SELECT broker.airflow_ack('b_consumer')", None, 15151),
    "airflow_queue_state": ("SELECT * FROM broker.airflow_queue_state('b_q_t')", None, 208),
    "send": ("SELECT broker.send(ARRAY[%s]::uuid[], 'b_Req', 'x'::bytea)", "initiator", 8426),
    "send of a VALID_XML type": ("SELECT broker.send(ARRAY[%s]::uuid[], 'b_Doc', 'x'::bytea)",
                                 "initiator", 8428),
    "end_conversation": ("SELECT broker.end_conversation(%s)", "target", 8426),
    "begin_conversation_timer": ("SELECT broker.begin_conversation_timer(%s, 60)", "target",
                                 8426),
    "move_conversation": ("SELECT broker.move_conversation(%s, gen_random_uuid())", "target",
                          8426),
    "begin_dialog from its service": ("SELECT broker.begin_dialog('b_I', 'b_T', 'b_C')", None,
                                      8423),
    "begin_dialog related to its conversation": (
        "SELECT broker.begin_dialog('a_I', 'a_T', 'a_C', p_related_conversation => %s)",
        "target", 8426),
    "begin_dialog related to its group": (
        "SELECT broker.begin_dialog('a_I', 'a_T', 'a_C', p_related_conversation_group => %s)",
        "group", 8436),
}


@pytest.mark.parametrize("case", list(NOT_FOUND_CALLS))
def test_an_id_or_handle_of_anothers_object_is_not_found(
        other: Other, app_a: str, case: str) -> None:
    """A function that takes an id, a handle or a name answers A for one of B's as for one
    that does not exist, and names nothing of B's that A did not name: not the queue behind a
    queue id, an activated reader's task, a parked message, a conversation or a service, nor a
    message type's schema collection."""
    call, attribute, number = NOT_FOUND_CALLS[case]
    params = [getattr(other, attribute)] if attribute else []
    before = snapshot(other.dsn)
    with login(other.dsn, app_a) as a, pytest.raises(BrokerError) as refused, \
            a.transaction() as tx:
        runner_of(tx).run(call.encode(), params)
    assert refused.value.number == number, refused.value
    leaked = [s for s in other.secrets()
              if s in str(refused.value) and s not in call and s not in map(str, params)]
    assert leaked == []
    assert snapshot(other.dsn) == before


def test_poison_resolution_parked_conversations_and_events_skip_anothers_queues(
        other: Other, app_a: str) -> None:
    """Functions that answer with rows or counts answer nothing for B's queue: resolving its
    receives (a record of B's reader waits for B's own resolution), its parked
    conversations, the queue of an event about it."""
    with psycopg.connect(other.dsn, autocommit=True) as conn:
        conn.execute("SELECT broker.register_receive(%s, '1'::xid8, ARRAY[gen_random_uuid()],"
                     " 1)", [other.queue_id])
    before = snapshot(other.dsn)
    with login(other.dsn, app_a) as a, a.transaction() as tx:
        runner = runner_of(tx)
        assert runner.run(b"SELECT * FROM broker.queue_of_event(%s, %s, NULL)",
                          [other.database_id, other.queue_id]) == []
        assert runner.run(b"SELECT * FROM broker.queue_of_event(NULL, NULL, 'b_q_t')") == []
        assert runner.run(b"SELECT * FROM broker.parked_conversations(%s)", [[other.target]]) == []
        assert runner.scalar(b"SELECT broker.resolve_receives(%s)", [other.queue_id]) == 0
    assert snapshot(other.dsn) == before


# Arguments for the scan: for each type, values naming B's objects (the scan tries each in
# turn), or a harmless value.
def _candidates(other: Other) -> dict[str, list[object]]:
    names: list[object] = [*other.names, "QUEUE::b_q_t", "SERVICE::b_T", "CONTRACT::b_C",
                           "MESSAGE TYPE::b_Doc", "broker.b_q_t", "public.b_q_t"]
    handles: list[object] = [other.initiator, other.target, other.group, other.remote,
                             other.task_id, other.run_id]
    ids: list[object] = [other.queue_id, other.service_id, other.quarantine_id]
    return {
        "text": names, "name": names, "text[]": [[n] for n in names],
        "uuid": handles, "uuid[]": [[h] for h in handles],
        "integer": ids, "bigint": ids, "bigint[]": [[i] for i in ids],
        "smallint": [1], "oid": [other.database_id],
        "boolean": [False], "bytea": [b"x"], "bytea[]": [[b"x"]], "jsonb": ["{}"],
        "xid8": ["1"], "double precision": [1.0], "interval": ["1 minute"],
        "timestamp without time zone": ["2026-01-01"],
    }


def _public_functions(dsn: str) -> list[tuple[str, list[str]]]:
    with psycopg.connect(dsn) as conn:
        return [(name, list(types)) for name, types in conn.execute(
            "SELECT p.proname, ARRAY(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) t)"
            "  FROM pg_proc p WHERE p.pronamespace = 'broker'::regnamespace"
            "   AND has_function_privilege('public', p.oid, 'EXECUTE')"
            "   AND p.prokind = 'f' ORDER BY 1, 2").fetchall()]


def test_a_login_without_permissions_learns_nothing_of_anothers_objects(
        other: Other, outsider: str) -> None:
    """Every function PUBLIC may execute, called with the names and ids of B's objects, and
    every view PUBLIC may select from, as a login holding no broker permission: no call hands
    over B's objects, bodies, XML schemas, route addresses or plans; each errors with a broker
    error number or returns nothing of B's. A name appears in an error only when the caller
    gave it."""
    candidates = _candidates(other)
    secrets = other.secrets()
    problems: list[str] = []
    calls = 0
    with psycopg.connect(roles.login_dsn(other.dsn, outsider)) as conn:
        conn.execute("SET statement_timeout = '10s'")
        conn.commit()
        for view in public_views(other.dsn):
            try:
                rows = conn.execute(sql.SQL("SELECT * FROM broker.{}").format(
                    sql.Identifier(view))).fetchall()
            except psycopg.Error as exc:
                problems.append(f"{view}: {exc}")
            else:
                if rows:
                    problems.append(f"{view}: {rows}")
            finally:
                conn.rollback()
        for function, types in _public_functions(other.dsn):
            unknown = [t for t in types if t not in candidates]
            assert unknown == [], f"{function}: no scan values for {unknown}"
            tries = max([len(candidates[t]) for t in types] or [1])
            for i in range(tries):
                args = [candidates[t][i % len(candidates[t])] for t in types]
                query = sql.SQL("SELECT * FROM broker.{}({})").format(
                    sql.Identifier(function),
                    sql.SQL(", ").join(sql.SQL("%s::{}").format(sql.SQL(t)) for t in types))
                given = {str(a) for a in args} | {str(x) for a in args
                                                  if isinstance(a, list) for x in a}
                calls += 1
                try:
                    answer = str(conn.execute(query, args).fetchall())
                except psycopg.errors.QueryCanceled:
                    problems.append(f"{function}{tuple(args)}: timed out")
                    conn.rollback()
                    continue
                except psycopg.Error as exc:
                    answer = str(exc)
                    if not answer.startswith("Msg "):
                        problems.append(f"{function}{tuple(args)}: not a broker error: {exc}")
                finally:
                    conn.rollback()
                leaked = [s for s in secrets
                          if s in answer and not any(s in g for g in given)]
                if leaked:
                    problems.append(f"{function}{tuple(args)}: {leaked} in {answer}")
    assert calls > 200
    assert problems == [], "\n".join(problems)


def test_a_login_that_may_see_the_queue_is_still_refused_with_229(other: Other) -> None:
    """Visibility changes only what a stranger is told: a login holding a permission on B's
    queue other than RECEIVE (here ALTER) sees it, and SEND, END CONVERSATION and a queue id
    are refused with 229 naming that queue, as before."""
    with roles.role(other.dsn, *roles.APPLICATION_GRANTS,
                    roles.broker_grant("ALTER", "QUEUE::b_q_i"),
                    roles.broker_grant("ALTER", "QUEUE::b_q_t"), prefix="alter",
                    login=True) as name, login(other.dsn, name) as a:
        calls: list[tuple[str, list[object]]] = [
            ("SELECT broker.send(ARRAY[%s]::uuid[], 'b_Req', 'x'::bytea)", [other.initiator]),
            ("SELECT broker.end_conversation(%s)", [other.target]),
            ("SELECT broker.wait_register(gen_random_uuid(), %s, false)", [other.queue_id]),
            ("SELECT broker.begin_dialog('b_I', 'b_T', 'b_C')", []),
        ]
        for call, params in calls:
            with pytest.raises(BrokerError) as refused, a.transaction() as tx:
                runner_of(tx).run(call.encode(), params)
            assert refused.value.number == 229, (call, refused.value)
            assert "'b_q_" in str(refused.value)
