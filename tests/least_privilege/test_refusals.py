"""Refusals that tell nothing and store nothing: every refusal is a broker error with SQL
Server's number, never PostgreSQL's own permission error, and it answers the same for an
object the login may not see as for one that does not exist.

Microsoft's rules quoted here: "Metadata visibility" limits what a user sees to the
securables it owns or holds some permission on, and errors name such an object as missing
(Msg 15151, "Cannot find the %s '%s', because it does not exist or you do not have
permission."); GRANT "Cannot grant, deny, or revoke permissions to sa, dbo, entity owner,
information_schema, sys, or yourself" (Msg 4624); CREATE ROUTE needs CREATE ROUTE on the
database (Msg 262 without it), which airflow-broker keeps to the schema's owner.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest

from airflow_broker import Broker
from airflow_broker._statements import runner_of
from airflow_broker.errors import BrokerError
from airflow_broker.transaction import Transaction
from tests.support import roles
from tests.support.privileges import Application, login, snapshot

APP = Application("")


@pytest.fixture
def objects(owned_dsn: str) -> str:
    """An application's objects, a route and an XML schema collection, all created by the
    administrator (the superuser)."""
    with Broker(owned_dsn) as admin, admin.transaction() as tx:
        APP.create(tx)
        tx.create_route("far", "postgresql://far.example/brokerage", service_name="Far")
        tx.create_xml_schema_collection(
            "xsd", ['<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">'
                    '<xs:element name="a"/></xs:schema>'])
    return owned_dsn


@pytest.fixture
def reader(objects: str) -> Iterator[str]:
    """A reader of q_t (it sees q_t and nothing else)."""
    with roles.role(objects, *roles.APPLICATION_GRANTS, *APP.reader_grants(), prefix="reader",
                    login=True) as name:
        yield name


@pytest.fixture
def administrator(objects: str) -> Iterator[str]:
    with roles.role(objects, *roles.APPLICATION_GRANTS,
                    roles.broker_grant("CONTROL", "DATABASE"), prefix="admin",
                    login=True) as name:
        yield name


def refusal(dsn: str, name: str, statement: Callable[[Transaction], object]) -> BrokerError:
    """The error ``statement`` fails with as login ``name``; the database is unchanged."""
    before = snapshot(dsn)
    with login(dsn, name) as app, pytest.raises(BrokerError) as denied, \
            app.transaction() as tx:
        statement(tx)
    assert snapshot(dsn) == before
    return denied.value


@pytest.mark.parametrize("action", ["grant", "deny", "revoke"])
@pytest.mark.parametrize(("kind", "permission"), [
    ("QUEUE", "RECEIVE"), ("SERVICE", "SEND"), ("CONTRACT", "REFERENCES"),
    ("MESSAGE TYPE", "REFERENCES")])
def test_a_refused_grant_answers_alike_for_a_hidden_and_a_missing_object(
        objects: str, reader: str, action: str, kind: str, permission: str) -> None:
    """GRANT, DENY and REVOKE on an object the login may not see answer exactly as on one
    that does not exist (15151): names cannot be probed."""
    existing = {"QUEUE": "q_i", "SERVICE": "I", "CONTRACT": "C", "MESSAGE TYPE": "Req"}[kind]

    def change(name: str) -> Callable[[Transaction], object]:
        return lambda tx: getattr(tx, action)(permission, f"{kind}::{name}", "public")

    hidden = refusal(objects, reader, change(existing))
    missing = refusal(objects, reader, change("no_such_object"))
    assert hidden.number == missing.number == 15151
    assert (str(hidden).replace(f"'{existing}'", "'?'")
            == str(missing).replace("'no_such_object'", "'?'"))


def test_a_grant_on_a_visible_object_without_control_is_4613(objects: str,
                                                             reader: str) -> None:
    error = refusal(objects, reader, lambda tx: tx.grant("RECEIVE", "QUEUE::q_t", "public"))
    assert error.number == 4613


@pytest.mark.parametrize("grantee", ["itself", "the object's owner", "the schema's owner",
                                     "a superuser"])
@pytest.mark.parametrize("action", ["grant", "deny", "revoke"])
def test_no_permission_to_an_owner_or_oneself_4624(objects: str, administrator: str,
                                                   owner_role: str, grantee: str,
                                                   action: str) -> None:
    """Permission rows that could never take effect are refused (4624) and not stored: an
    owner holds every permission whatever is denied to it, and nobody grants itself."""
    with psycopg.connect(objects) as conn:
        row = conn.execute("SELECT rolname FROM pg_roles WHERE rolsuper LIMIT 1").fetchone()
    assert row is not None
    with Broker(objects) as admin, admin.transaction() as tx:
        tx.create_queue("q_owned")
        tx.alter_authorization("QUEUE::q_owned", administrator)
    principal = {"itself": administrator, "the object's owner": administrator,
                 "the schema's owner": owner_role, "a superuser": row[0]}[grantee]
    securable = "QUEUE::q_t" if grantee == "itself" else "QUEUE::q_owned"
    error = refusal(objects, administrator,
                    lambda tx: getattr(tx, action)("RECEIVE", securable, principal))
    assert error.number == 4624
    assert "or yourself" in str(error)


@pytest.mark.parametrize(("statement", "number"), [
    (lambda tx: tx.create_route("mine", "postgresql://elsewhere/db"), 262),
    (lambda tx: tx.alter_route("far", address="postgresql://attacker/db"), 15151),
    (lambda tx: tx.drop_route("far"), 15151),
    (lambda tx: tx.create_xml_schema_collection(
        "mine", ['<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema"/>']), 262),
    (lambda tx: tx.drop_xml_schema_collection("xsd"), 15151),
    (lambda tx: tx.alter_broker("NEW_BROKER"), 5011),
    (lambda tx: tx.grant("CREATE ROUTE", "DATABASE", "public"), 50127),
], ids=["CREATE ROUTE", "ALTER ROUTE", "DROP ROUTE", "CREATE XML SCHEMA COLLECTION",
        "DROP XML SCHEMA COLLECTION", "ALTER DATABASE SET NEW_BROKER", "GRANT CREATE ROUTE"])
def test_the_owners_statements_are_refused_with_broker_errors(
        objects: str, administrator: str, statement: Callable[[Transaction], object],
        number: int) -> None:
    """Routes, XML schema collections and the broker's own settings are the schema owner's:
    even CONTROL on DATABASE gets SQL Server's number, not PostgreSQL's 'permission denied
    for function', and a route that exists is as missing to it as one that does not."""
    error = refusal(objects, administrator, statement)
    assert error.number == number, error
    assert "permission denied for function" not in str(error)


@pytest.mark.parametrize("statement", ["create", "alter"])
def test_a_message_type_validated_by_a_collection_is_the_owners(
        objects: str, administrator: str, statement: str) -> None:
    """VALID_XML WITH SCHEMA COLLECTION names a collection, which only the schema's owner
    may see: to anyone else it does not exist (15151, SQL Server's answer without REFERENCES
    on the collection), and the type is neither created nor changed."""
    def validate(tx: Transaction) -> object:
        if statement == "create":
            return tx.create_message_type("M_valid", "VALID_XML", schema_collection="xsd")
        tx.alter_message_type("Req", "VALID_XML", schema_collection="xsd")
        return None

    hidden = refusal(objects, administrator, validate)
    assert (hidden.number, "'xsd'" in str(hidden)) == (15151, True)


def test_a_route_the_login_may_not_see_is_missing(objects: str, administrator: str) -> None:
    hidden = refusal(objects, administrator, lambda tx: tx.drop_route("far"))
    missing = refusal(objects, administrator, lambda tx: tx.drop_route("nowhere"))
    assert str(hidden).replace("'far'", "'?'") == str(missing).replace("'nowhere'", "'?'")


def test_end_conversation_with_cleanup_is_the_owners(objects: str, reader: str) -> None:
    """A reader may end its conversations, not clean them up: the peer would never be told
    (229, CONTROL); nothing of the conversation goes."""
    with Broker(objects) as admin, admin.transaction() as tx:
        initiator = tx.begin_dialog("I", "T", "C")
        tx.send(initiator, "Req", b"x")
    with Broker(objects) as admin, admin.transaction() as tx:
        target = runner_of(tx).scalar(b"SELECT far_handle FROM broker.endpoints"
                                      b" WHERE conversation_handle = %s", [initiator])
    error = refusal(objects, reader, lambda tx: tx.end_conversation(target, cleanup=True))
    assert (error.number, "CONTROL" in str(error)) == (229, True)
