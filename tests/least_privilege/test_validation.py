"""XML validation a sender cannot forge: a body reaches its target as validated only when
trusted code validated it. A sender that is not the schema's owner gets its XML bodies held
until the broker worker has validated them (or PostgreSQL has, where it can), whatever
verdict it claims."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest

from airflow_broker import ERROR, Broker
from airflow_broker._statements import runner_of
from airflow_broker.worker import BrokerWorker
from tests.support import roles
from tests.support.privileges import login

XSD = """<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
  <xs:element name="order"><xs:complexType>
    <xs:attribute name="id" type="xs:integer" use="required"/>
  </xs:complexType></xs:element>
</xs:schema>"""


@dataclass
class Xml:
    dsn: str
    sender: str


@pytest.fixture
def xml(owned_dsn: str) -> Iterator[Xml]:
    with Broker(owned_dsn) as admin, admin.transaction() as tx:
        tx.create_xml_schema_collection("Orders", [XSD])
        tx.create_message_type("Wf", "WELL_FORMED_XML")
        tx.create_message_type("Valid", "VALID_XML", schema_collection="Orders")
        tx.create_contract("X", {"Wf": "ANY", "Valid": "ANY"})
        tx.create_queue("q_i")
        tx.create_queue("q_t")
        tx.create_service("I", "q_i")
        tx.create_service("T", "q_t", ["X"])
    with roles.role(owned_dsn, *roles.APPLICATION_GRANTS,
                    roles.broker_grant("RECEIVE", "QUEUE::q_i"),
                    roles.broker_grant("REFERENCES", "CONTRACT::X"),
                    prefix="sender", login=True) as sender:
        yield Xml(owned_dsn, sender)


def worker_pass(dsn: str) -> None:
    with Broker(dsn) as admin:
        BrokerWorker(admin, activation=False, transport=False).run_once()


def received(dsn: str, queue: str) -> list[tuple[str, bytes | None]]:
    with Broker(dsn) as admin, admin.transaction() as tx:
        return [(m.message_type_name, m.message_body) for m in tx.receive(queue)]


@pytest.mark.parametrize(("message_type", "verdict", "body"), [
    # The example: not even UTF-8, claimed well-formed.
    ("Wf", "WELL_FORMED_XML", b"\xff\x3c\x61"),
    # Well-formed, claimed valid against a collection it does not match.
    ("Valid", "VALID_XML:{collection}", b"<order id='not a number'/>"),
])
def test_a_forged_verdict_delivers_nothing(xml: Xml, message_type: str, verdict: str,
                                           body: bytes) -> None:
    with psycopg.connect(xml.dsn) as conn:
        collection = conn.execute("SELECT xml_collection_id FROM broker.xml_schema_collections"
                                  " WHERE name = 'Orders'").fetchone()
    assert collection is not None
    with login(xml.dsn, xml.sender) as sender, sender.transaction() as tx:
        handle = tx.begin_dialog("I", "T", "X")
        runner_of(tx).run(b"SELECT broker.send(ARRAY[%s]::uuid[], %s, %s::bytea, false, %s, NULL)",
                          [handle, message_type, body, verdict.format(collection=collection[0])])
    assert received(xml.dsn, "q_t") == []
    worker_pass(xml.dsn)
    assert received(xml.dsn, "q_t") == []
    with Broker(xml.dsn) as admin, admin.transaction() as tx:
        (error,) = tx.receive("q_i")
        assert error.message_type_name == ERROR
        assert error.error().code == -9615
        assert runner_of(tx).scalar(b"SELECT count(*) FROM broker.transmissions") == 0


def test_valid_bodies_of_an_untrusted_sender_arrive_in_order_once_validated(xml: Xml) -> None:
    """The Python API's own verdicts count for nothing either when the sender is not the
    schema's owner: the worker validates, and the conversation keeps its order."""
    with login(xml.dsn, xml.sender) as sender, sender.transaction() as tx:
        handle = tx.begin_dialog("I", "T", "X")
        tx.send(handle, "Valid", "<order id='1'/>")
        tx.send(handle, "Wf", "<note>second</note>")
        tx.send(handle, "Valid", "<order id='3'/>")
    worker_pass(xml.dsn)
    assert received(xml.dsn, "q_t") == [
        ("Valid", b"<order id='1'/>"), ("Wf", b"<note>second</note>"),
        ("Valid", b"<order id='3'/>")]


def test_the_schema_owners_verdicts_are_trusted(xml: Xml) -> None:
    """The broker's own code (the owner's logins: the worker, an administrator's Python API)
    is trusted: its validated bodies go straight to the target."""
    with Broker(xml.dsn) as admin, admin.transaction() as tx:
        handle = tx.begin_dialog("I", "T", "X")
        tx.send(handle, "Valid", "<order id='7'/>")
    assert received(xml.dsn, "q_t") == [("Valid", b"<order id='7'/>")]
