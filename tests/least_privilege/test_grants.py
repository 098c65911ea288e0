"""GRANT, DENY, REVOKE, owners and SEND permission at the target, as SQL Server has them,
checked against logins that hold only what each test grants."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from airflow_broker import Broker
from airflow_broker._statements import runner_of
from airflow_broker.admin.doctor import diagnose
from airflow_broker.errors import (
    BrokerError,
    CannotImpersonate,
    GrantorLacksPermission,
    ObjectNotFound,
    ObjectPermissionDenied,
)
from airflow_broker.messages import ERROR
from airflow_broker.permissions import Permission
from tests.support import roles
from tests.support.privileges import Application, login, snapshot

A = Application("a_")
B = Application("b_")


@pytest.fixture
def objects(owned_dsn: str) -> str:
    with Broker(owned_dsn) as admin, admin.transaction() as tx:
        A.create(tx)
        B.create(tx)
    return owned_dsn


@pytest.fixture
def app_a(objects: str) -> Iterator[str]:
    """A sender of a_I that may also begin dialogs on B's contract."""
    with roles.role(objects, *roles.APPLICATION_GRANTS, *A.sender_grants(),
                    roles.broker_grant("REFERENCES", "CONTRACT::b_C"),
                    prefix="app_a", login=True) as name:
        yield name


def admin(dsn: str) -> Broker:
    return Broker(dsn)


def test_send_permission_of_the_initiating_services_owner(objects: str,
                                                          app_a: str) -> None:
    """The owner of the initiating service needs SEND on the target service. Without it the
    message is not delivered and the initiator gets SQL Server's Error -8494."""
    with admin(objects) as b, b.transaction() as tx:
        tx.alter_authorization("SERVICE::a_I", app_a)
        rows = runner_of(tx).run(b"SELECT name, principal_id FROM broker.services"
                                 b" WHERE name IN ('a_I', 'b_T')")
        owners: dict[object, object] = dict(rows)
        role_oid = runner_of(tx).scalar(b"SELECT %s::regrole::oid::bigint", [app_a])
    # The catalog shows the owner; 1 (dbo) for the schema owner's.
    assert owners == {"a_I": role_oid, "b_T": 1}
    with login(objects, app_a) as a:
        with a.transaction() as tx:
            refused = tx.begin_dialog("a_I", "b_T", "b_C")
            tx.send(refused, "b_Req", b"not allowed yet")
        with a.transaction() as tx:
            (error,) = tx.receive("a_q_i")
        assert error.message_type_name == ERROR
        assert error.conversation_handle == refused
        assert error.error().code == -8494
        assert "permission to access the service 'b_T'" in error.error().description
        with admin(objects) as b, b.transaction() as tx:
            assert tx.receive("b_q_t") == []
            tx.grant("SEND", "SERVICE::b_T", app_a)
        with a.transaction() as tx:
            allowed = tx.begin_dialog("a_I", "b_T", "b_C")
            tx.send(allowed, "b_Req", b"allowed")
    with admin(objects) as b, b.transaction() as tx:
        assert [m.message_body for m in tx.receive("b_q_t")] == [b"allowed"]


def test_a_service_of_the_schemas_owner_may_send_anywhere(objects: str, app_a: str) -> None:
    """Services created without AUTHORIZATION belong to the schema's owner, which holds every
    permission: the SEND check then costs applications nothing to set up."""
    with login(objects, app_a) as a, a.transaction() as tx:
        handle = tx.begin_dialog("a_I", "b_T", "b_C")
        tx.send(handle, "b_Req", b"to b")
    with admin(objects) as b, b.transaction() as tx:
        assert [m.message_body for m in tx.receive("b_q_t")] == [b"to b"]


def test_deny_wins_over_a_grant_to_a_group_and_revoke_removes_it(objects: str) -> None:
    with admin(objects) as b, b.transaction() as tx:
        handle = tx.begin_dialog("a_I", "a_T", "a_C")
        tx.send(handle, "a_Req", b"one")
        tx.send(handle, "a_Req", b"two")
    with roles.role(objects, roles.broker_grant("RECEIVE", "QUEUE::a_q_t"),
                    prefix="readers") as group, \
            roles.role(objects, *roles.APPLICATION_GRANTS, f'GRANT "{group}" TO {{}}',
                       prefix="member", login=True) as member, login(objects, member) as m:
        with m.transaction() as tx:
            assert [x.message_body for x in tx.receive("a_q_t", 1)] == [b"one"]
        with admin(objects) as b, b.transaction() as tx:
            tx.deny("RECEIVE", "QUEUE::a_q_t", member)
            assert set(tx.database_permissions()) >= {
                Permission("OBJECT_OR_COLUMN", "a_q_t", group, "RECEIVE", "GRANT"),
                Permission("OBJECT_OR_COLUMN", "a_q_t", member, "RECEIVE", "DENY"),
            }
        with pytest.raises(ObjectPermissionDenied), m.transaction() as tx:
            tx.receive("a_q_t", 1)
        with admin(objects) as b, b.transaction() as tx:
            tx.revoke("RECEIVE", "QUEUE::a_q_t", member)
        with m.transaction() as tx:
            assert [x.message_body for x in tx.receive("a_q_t", 1)] == [b"two"]


def test_with_grant_option_lets_a_grantee_grant_on(objects: str) -> None:
    with roles.role(objects, *roles.APPLICATION_GRANTS, prefix="lead", login=True) as lead, \
            roles.role(objects, *roles.APPLICATION_GRANTS, prefix="dev", login=True) as dev:
        with admin(objects) as b, b.transaction() as tx:
            tx.grant("RECEIVE", "QUEUE::a_q_t", lead, with_grant_option=True)
        with login(objects, lead) as l_, l_.transaction() as tx:
            tx.grant("RECEIVE", "QUEUE::a_q_t", dev)
        before = snapshot(objects)
        with login(objects, dev) as d, pytest.raises(GrantorLacksPermission), \
                d.transaction() as tx:
            tx.grant("RECEIVE", "QUEUE::a_q_t", "public")
        # A DENY needs CONTROL, which a grant option is not.
        with login(objects, lead) as l_, pytest.raises(GrantorLacksPermission), \
                l_.transaction() as tx:
            tx.deny("RECEIVE", "QUEUE::a_q_t", dev)
        assert snapshot(objects) == before
        with login(objects, dev) as d, d.transaction() as tx:
            assert tx.receive("a_q_t") == []


def test_objects_belong_to_the_login_that_creates_them(objects: str) -> None:
    """With CREATE QUEUE a login owns the queues it creates: it may receive from them and
    grant on them, and another creator may not change them."""
    create = roles.broker_grant("CREATE QUEUE", "DATABASE")
    with roles.role(objects, *roles.APPLICATION_GRANTS, create, prefix="maker",
                    login=True) as maker, \
            roles.role(objects, *roles.APPLICATION_GRANTS, create, prefix="rival",
                       login=True) as rival:
        with login(objects, maker) as m, m.transaction() as tx:
            tx.create_queue("own_q")
            assert tx.receive("own_q") == []
            tx.grant("RECEIVE", "QUEUE::own_q", rival)
        with login(objects, rival) as r:
            with r.transaction() as tx:
                assert tx.receive("own_q") == []
            with pytest.raises(ObjectNotFound), r.transaction() as tx:
                tx.alter_queue("own_q", retention=True)
            with pytest.raises(ObjectNotFound), r.transaction() as tx:
                tx.drop_queue("own_q")
        with admin(objects) as b, b.transaction() as tx:
            owner = runner_of(tx).scalar(b"SELECT pg_get_userbyid(principal_id)::text"
                                         b" FROM broker.queues WHERE name = 'own_q'")
            tx.create_queue("given_q", authorization=rival)
            given = runner_of(tx).scalar(b"SELECT pg_get_userbyid(principal_id)::text"
                                         b" FROM broker.queues WHERE name = 'given_q'")
        assert (owner, given) == (maker, rival)


def test_execute_as_needs_membership_of_the_role(objects: str) -> None:
    """EXECUTE AS runs activated readers as the role: naming one is SQL Server's IMPERSONATE,
    or CREATE QUEUE would be a way into any role's rights."""
    create = roles.broker_grant("CREATE QUEUE", "DATABASE")
    with roles.role(objects, prefix="target") as target, \
            roles.role(objects, *roles.APPLICATION_GRANTS, create, prefix="maker",
                       login=True) as maker, login(objects, maker) as m:
        with pytest.raises(CannotImpersonate), m.transaction() as tx:
            tx.create_queue("q_as", execute_as=target, activation_procedure="app.usp")
        with m.transaction() as tx:
            tx.create_queue("q_mine", execute_as=maker, activation_procedure="app.usp")
        with pytest.raises(CannotImpersonate), m.transaction() as tx:
            tx.alter_queue("q_mine", execute_as="postgres")


@pytest.mark.parametrize(("permission", "securable", "grantee", "number"), [
    ("FLY", "QUEUE::a_q_t", "public", 102),
    ("RECEIVE", "SERVICE::a_T", "public", 102),
    ("RECEIVE", "QUEUE::no_such_queue", "public", 15151),
    ("SEND", "SERVICE::no_such_service", "public", 15151),
    ("RECEIVE", "QUEUE::a_q_t", "no_such_role", 15151),
    ("RECEIVE", "TABLE::a_q_t", "public", 102),
    # Routes and XML schema collections are the owner's: the permission does not exist to
    # give (it used to be accepted for routes, and gave nothing).
    ("CREATE ROUTE", "DATABASE", "public", 50127),
    ("create xml schema collection", "DATABASE", "public", 50127),
])
def test_a_bad_grant_is_refused_and_changes_nothing(objects: str, permission: str,
                                                    securable: str, grantee: str,
                                                    number: int) -> None:
    before = snapshot(objects)
    with admin(objects) as b, pytest.raises(BrokerError) as refused, b.transaction() as tx:
        tx.grant(permission, securable, grantee)
    assert refused.value.number == number
    assert snapshot(objects) == before


def test_doctor_reports_rights_on_the_tables_left_from_before(objects: str) -> None:
    """Rights on the tables pass by every check: a role still holding them from an earlier
    recipe is an error of the doctor's, with the REVOKE that fixes it."""
    with roles.role(objects, "GRANT SELECT, DELETE ON broker.queue_messages TO {}",
                    prefix="legacy") as legacy, Broker(objects) as b:
        findings = [f for f in diagnose(b).findings if f.check == "permissions"]
        assert [(f.subject, f.severity) for f in findings] == [(legacy, "error")]
        assert "queue_messages" in findings[0].problem
        assert "REVOKE ALL ON ALL TABLES IN SCHEMA broker" in findings[0].fix
        with psycopg.connect(objects, autocommit=True) as conn:
            conn.execute(f'REVOKE ALL ON ALL TABLES IN SCHEMA broker FROM "{legacy}"'.encode())
        assert [f for f in diagnose(b).findings if f.check == "permissions"] == []


def test_a_queues_owner_and_a_grant_to_public_receive_waiting_messages(objects: str) -> None:
    """RECEIVE of waiting messages checks the permission inside its one statement: the queue's
    owner reads without a grant, a grant to public lets any login read, and a login with
    neither is refused with 229 and takes nothing."""
    with admin(objects) as b, b.transaction() as tx:
        for body in (b"one", b"two"):
            tx.send(tx.begin_dialog("a_I", "a_T", "a_C"), "a_Req", body)
    with roles.role(objects, *roles.APPLICATION_GRANTS, prefix="qowner", login=True) as owner, \
            roles.role(objects, *roles.APPLICATION_GRANTS, prefix="anyone",
                       login=True) as anyone:
        with admin(objects) as b, b.transaction() as tx:
            tx.alter_authorization("QUEUE::a_q_t", owner)
        with login(objects, owner) as o, o.transaction() as tx:
            assert [m.message_body for m in tx.receive("a_q_t", 1)] == [b"one"]
        before = snapshot(objects)
        with login(objects, anyone) as a:
            with pytest.raises(ObjectPermissionDenied), a.transaction() as tx:
                tx.receive("a_q_t", 1)
            assert snapshot(objects) == before
            with admin(objects) as b, b.transaction() as tx:
                tx.grant("RECEIVE", "QUEUE::a_q_t", "public")
            with a.transaction() as tx:
                assert [m.message_body for m in tx.receive("a_q_t", 1)] == [b"two"]
