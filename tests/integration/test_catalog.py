"""Catalog objects: message types, contracts, queues, services (spec 2-5, 28.1)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from airflow_broker import ERROR, Broker, BrokerError
from airflow_broker.messages import MAX_MESSAGE_SIZE
from tests.support.brokers import App
from tests.support.helpers import count, endpoint, snapshot

SYSTEM_TYPES = {
    "http://schemas.microsoft.com/SQL/ServiceBroker/Error": "X",
    "http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog": "E",
    "http://schemas.microsoft.com/SQL/Notifications/QueryNotification": "X",
    "http://schemas.microsoft.com/SQL/Notifications/EventNotification": "X",
    "http://schemas.microsoft.com/SQL/ServiceBroker/DialogTimer": "E",
    "http://schemas.microsoft.com/SQL/ServiceBroker/BrokerConfigurationNotice/MissingRoute": "X",
    "http://schemas.microsoft.com/SQL/ServiceBroker/BrokerConfigurationNotice/FailedRoute": "X",
    "http://schemas.microsoft.com/SQL/ServiceBroker/BrokerConfigurationNotice/"
    "MissingRemoteServiceBinding": "X",
    "http://schemas.microsoft.com/SQL/ServiceBroker/BrokerConfigurationNotice/"
    "FailedRemoteServiceBinding": "X",
    "http://schemas.microsoft.com/SQL/ServiceBroker/ServiceEcho/Echo": "N",
    "http://schemas.microsoft.com/SQL/ServiceBroker/ServiceDiagnostic/Query": "X",
    "http://schemas.microsoft.com/SQL/ServiceBroker/ServiceDiagnostic/Status": "X",
    "http://schemas.microsoft.com/SQL/ServiceBroker/ServiceDiagnostic/Description": "N",
    "DEFAULT": "N",
}

ORDER_XSD = """<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">
  <xs:element name="order">
    <xs:complexType>
      <xs:attribute name="qty" type="xs:positiveInteger" use="required"/>
    </xs:complexType>
  </xs:element>
</xs:schema>"""


def rows(broker: Broker, query: str) -> list[tuple[object, ...]]:
    with psycopg.connect(broker.dsn) as conn:
        return conn.execute(query).fetchall()


def test_T_SYS_01_system_types_and_contracts(broker: Broker) -> None:
    types = {name: validation for name, validation in
             rows(broker, "SELECT name, validation FROM broker.service_message_types")}
    assert types == SYSTEM_TYPES
    assert all(not str(name).startswith("https://") for name in types)
    contracts = {name for (name,) in rows(broker, "SELECT name FROM broker.service_contracts")}
    assert contracts == {
        "http://schemas.microsoft.com/SQL/Notifications/PostEventNotification",
        "http://schemas.microsoft.com/SQL/Notifications/PostQueryNotification",
        "http://schemas.microsoft.com/SQL/ServiceBroker/BrokerConfigurationNotice",
        "http://schemas.microsoft.com/SQL/ServiceBroker/ServiceDiagnostic",
        "http://schemas.microsoft.com/SQL/ServiceBroker/ServiceEcho",
        "DEFAULT",
    }
    usage = rows(broker, """
        SELECT t.name, u.is_sent_by_initiator, u.is_sent_by_target
          FROM broker.service_contract_message_usages u
          JOIN broker.service_contracts c USING (service_contract_id)
          JOIN broker.service_message_types t USING (message_type_id)
         WHERE c.name = 'DEFAULT'""")
    assert usage == [("DEFAULT", True, True)]
    # A look-alike with https:// is an ordinary user type, not the system one.
    with broker.transaction() as tx:
        tx.create_message_type("https://schemas.microsoft.com/SQL/ServiceBroker/Error")
    lookalike = rows(broker, """SELECT validation, is_system FROM broker.service_message_types
                                WHERE name LIKE 'https://%'""")
    assert lookalike == [("N", False)]


def test_T_MT_01_validation_column(broker: Broker) -> None:
    with broker.transaction() as tx:
        tx.create_message_type("plain")
        tx.create_message_type("empty", "EMPTY")
        tx.create_message_type("wf", "WELL_FORMED_XML")
        tx.create_xml_schema_collection("orders", [ORDER_XSD])
        tx.create_message_type("valid", "VALID_XML", schema_collection="orders")
    got = {
        name: (validation, desc, coll is not None)
        for name, validation, desc, coll in rows(
            broker,
            "SELECT name, validation, validation_desc, xml_collection_id"
            " FROM broker.service_message_types WHERE NOT is_system",
        )
    }
    assert got == {
        "plain": ("N", "NONE", False),
        "empty": ("E", "EMPTY", False),
        "wf": ("X", "XML", False),
        "valid": ("X", "XML", True),
    }


def _first_message_rejected(app: App, message_type: str, body: bytes | None) -> None:
    """Sends message 0 of a new dialog and checks the target refused it: an Error at the
    initiator, nothing in the target queue, no target endpoint."""
    handle = app.dialog("V")
    with app.broker.transaction() as tx:
        tx.send(handle, message_type, body)
    with app.broker.transaction() as tx:
        assert tx.receive("q_t") == []
        replies = tx.receive("q_i")
    assert [m.message_type_name for m in replies] == [ERROR]
    assert replies[0].error().code in (-8430, -9615, -9616)
    assert endpoint(app.broker, handle)["state"] == "ER"  # type: ignore[index]
    assert count(app.broker, """SELECT count(*) FROM broker.endpoints t
                                 JOIN broker.endpoints i USING (conversation_id)
                                WHERE i.conversation_handle = %s AND NOT t.is_initiator""",
                 (handle,)) == 0


@pytest.fixture
def validating_app(app: App) -> App:
    with app.broker.transaction() as tx:
        tx.create_message_type("Empty", "EMPTY")
        tx.create_message_type("Xml", "WELL_FORMED_XML")
        tx.create_xml_schema_collection("orders", [ORDER_XSD])
        tx.create_message_type("Order", "VALID_XML", schema_collection="orders")
        tx.create_contract("V", {"Empty": "ANY", "Xml": "ANY", "Order": "ANY", "Req": "ANY"})
        tx.alter_service("T", add_contracts=["V"])
    return app


def test_T_MT_02_empty_type_rejects_a_body(validating_app: App) -> None:
    _first_message_rejected(validating_app, "Empty", b"not empty")


@pytest.mark.parametrize("body", [b"", None])
@pytest.mark.parametrize("message_type", ["Req", "Xml", "Empty"])
def test_T_MT_02_zero_length_body_arrives_as_null(
    validating_app: App, message_type: str, body: bytes | None
) -> None:
    handle = validating_app.dialog("V")
    with validating_app.broker.transaction() as tx:
        tx.send(handle, message_type, body)
    with validating_app.broker.transaction() as tx:
        (message,) = tx.receive("q_t")
    assert message.message_body is None
    assert message.message_type_name == message_type


def test_zero_length_text_body_arrives_as_null(app: App) -> None:
    handle = app.dialog()
    with app.broker.transaction() as tx:
        tx.send(handle, "Req", "")
        (message,) = tx.receive("q_t")
    assert message.message_body is None


def test_T_MT_03_malformed_xml_is_refused_by_the_target(validating_app: App) -> None:
    _first_message_rejected(validating_app, "Xml", b"<trade><qty>1</trade>")


def _server_parses_xml(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        try:
            conn.execute("SELECT xml_is_well_formed('<a/>')")
            return True
        except psycopg.errors.FeatureNotSupported:
            return False


def test_T_MT_03_malformed_xml_through_sql_only(validating_app: App) -> None:
    """A sender that calls the SQL function directly gets the target-side check from
    PostgreSQL's XML parser; a server built without one refuses the SEND instead of letting an
    unchecked body through."""
    handle = validating_app.dialog("V")
    before = snapshot(validating_app.broker)
    unreadable = [b"<a><b></a>"] if not _server_parses_xml(validating_app.broker.dsn) else []
    unreadable.append("<a/>".encode("utf-16"))  # PostgreSQL cannot decode UTF-16
    for body in unreadable:
        with psycopg.connect(validating_app.broker.dsn) as conn, pytest.raises(
            psycopg.Error, match="Msg 50108"
        ):
            conn.execute("SELECT broker.send(ARRAY[%s]::uuid[], 'Xml', %s::bytea)",
                         [handle, body])
    assert snapshot(validating_app.broker) == before
    rejected = [b"\xc3\x28 is not UTF-8"]
    if _server_parses_xml(validating_app.broker.dsn):
        rejected.append(b"<a><b></a>")
    # Each rejection fails its conversation (Error -9615 to the initiator, whose endpoint is
    # then in ER and refuses another SEND): one dialog per body.
    with psycopg.connect(validating_app.broker.dsn) as conn:
        for body in rejected:
            conn.execute("SELECT broker.send(ARRAY[%s]::uuid[], 'Xml', %s::bytea)",
                         [handle, body])
            conn.commit()
            handle = validating_app.dialog("V")
    errors = []
    with validating_app.broker.transaction() as tx:
        assert tx.receive("q_t") == []
        while batch := tx.receive("q_i"):
            errors += batch
    assert [m.error().code for m in errors] == [-9615] * len(rejected)


@pytest.mark.parametrize(
    "body",
    [
        b"<trade id='1'><qty>10</qty></trade>",
        "<?xml version='1.0' encoding='UTF-16'?><trade>\u20ac</trade>".encode("utf-16"),
        b"<a/><b/>",  # a fragment is well-formed XML content
    ],
)
def test_T_MT_03_well_formed_body_is_delivered_byte_identical(
    validating_app: App, body: bytes
) -> None:
    handle = validating_app.dialog("V")
    with validating_app.broker.transaction() as tx:
        tx.send(handle, "Xml", body)
    with validating_app.broker.transaction() as tx:
        (message,) = tx.receive("q_t")
    assert message.message_body == body
    assert message.validation == "X"


def test_valid_xml_checks_the_schema_collection(validating_app: App) -> None:
    handle = validating_app.dialog("V")
    with validating_app.broker.transaction() as tx:
        tx.send(handle, "Order", b'<order qty="3"/>')
    with validating_app.broker.transaction() as tx:
        (message,) = tx.receive("q_t")
    assert message.message_body == b'<order qty="3"/>'
    _first_message_rejected(validating_app, "Order", b'<order qty="-1"/>')


def test_T_MT_03_a_body_that_is_not_utf8_is_refused_with_9615(validating_app: App) -> None:
    """From Python too: the target refuses it (Error -9615 to the sender), SEND does not raise
    a decoding error."""
    _first_message_rejected(validating_app, "Xml", b"<trade>\xc3\x28</trade> \xff")


def test_a_schema_collection_stored_through_sql_that_is_not_a_schema_refuses_bodies(
        validating_app: App) -> None:
    with psycopg.connect(validating_app.broker.dsn) as conn:
        conn.execute("SELECT broker.create_xml_schema_collection('broken', ARRAY['<not-xsd'])")
    with validating_app.broker.transaction() as tx:
        tx.create_message_type("Broken", "VALID_XML", schema_collection="broken")
        tx.create_contract("VB", {"Broken": "ANY"})
        tx.alter_service("T", add_contracts=["VB"])
        handle = tx.begin_dialog("I", "T", "VB")
    with validating_app.broker.transaction() as tx:
        tx.send(handle, "Broken", b"<order/>")
    with validating_app.broker.transaction() as tx:
        assert tx.receive("q_t") == []
        (error,) = tx.receive("q_i")
    assert error.error().code == -9615
    assert "not valid" in error.error().description


def test_a_schema_collection_never_reads_local_files(validating_app: App,
                                                     tmp_path: Path) -> None:
    included = tmp_path / "secret.xsd"
    included.write_text('<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">'
                        '<xs:element name="secret" type="xs:string"/></xs:schema>')
    xsd = ('<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema">'
           f'<xs:include schemaLocation="{included.as_uri()}"/>'
           '<xs:element name="open" type="xs:string"/></xs:schema>')
    before = snapshot(validating_app.broker)
    with pytest.raises(BrokerError) as refused, validating_app.broker.transaction() as tx:
        tx.create_xml_schema_collection("includes", [xsd])
    assert refused.value.number == 50107
    assert snapshot(validating_app.broker) == before


def test_T_MT_03_a_text_node_over_10_mb_is_well_formed(validating_app: App) -> None:
    body = b"<report>" + b"x" * (11 * 1024 * 1024) + b"</report>"
    handle = validating_app.dialog("V")
    with validating_app.broker.transaction() as tx:
        tx.send(handle, "Xml", body)
    with validating_app.broker.transaction() as tx:
        (message,) = tx.receive("q_t")
    assert message.message_type_name == "Xml"
    root = message.xml()
    assert root is not None and len(root.text or "") == 11 * 1024 * 1024


def test_valid_xml_cannot_be_checked_by_sql_alone(validating_app: App) -> None:
    handle = validating_app.dialog("V")
    before = snapshot(validating_app.broker)
    with psycopg.connect(validating_app.broker.dsn) as conn, pytest.raises(
        psycopg.Error, match="Msg 50103"
    ):
        conn.execute("SELECT broker.send(ARRAY[%s]::uuid[], 'Order', %s::bytea)",
                     [handle, b'<order qty="3"/>'])
    assert snapshot(validating_app.broker) == before


def test_T_MT_04_alter_does_not_revalidate_queued_messages(validating_app: App) -> None:
    handle = validating_app.dialog("V")
    with validating_app.broker.transaction() as tx:
        tx.send(handle, "Req", b"plain text, not XML")
        tx.alter_message_type("Req", "WELL_FORMED_XML")
    with validating_app.broker.transaction() as tx:
        (message,) = tx.receive("q_t")
    assert message.message_body == b"plain text, not XML"
    assert message.validation == "X"
    # New messages are checked against the new validation.
    with validating_app.broker.transaction() as tx:
        tx.send(handle, "Req", b"<still-not-xml>")
    with validating_app.broker.transaction() as tx:
        assert tx.receive("q_t") == []
        assert [m.error().code for m in tx.receive("q_i")] == [-9615]


def test_T_CT_01_contract_rules(broker: Broker) -> None:
    with broker.transaction() as tx:
        tx.create_message_type("A")
        tx.create_message_type("B")
    before = snapshot(broker)
    with pytest.raises(BrokerError) as only_target, broker.transaction() as tx:
        tx.create_contract("OnlyTarget", {"A": "TARGET"})
    assert only_target.value.number == 8492
    with pytest.raises(BrokerError) as twice, broker.transaction() as tx:
        tx.create_contract("Twice", [("A", "INITIATOR"), ("A", "TARGET")])
    assert twice.value.number == 8403
    assert snapshot(broker) == before
    with broker.transaction() as tx:
        tx.create_contract("AnyOk", {"A": "ANY"})
        tx.create_contract("Mixed", {"A": "TARGET", "B": "INITIATOR"})
    # Referenced message type and queue cannot be dropped.
    with pytest.raises(BrokerError) as referenced, broker.transaction() as tx:
        tx.drop_message_type("A")
    assert referenced.value.number == 3729
    with broker.transaction() as tx:
        tx.create_queue("q")
        tx.create_service("S", "q", ["AnyOk"])
    with pytest.raises(BrokerError) as queue_in_use, broker.transaction() as tx:
        tx.drop_queue("q")
    assert queue_in_use.value.number == 3729
    with pytest.raises(BrokerError) as contract_in_use, broker.transaction() as tx:
        tx.drop_contract("AnyOk")
    assert contract_in_use.value.number == 3729


def test_T_CT_01_service_without_contracts_initiates_but_cannot_be_targeted(broker: Broker) -> None:
    with broker.transaction() as tx:
        tx.create_message_type("Req")
        tx.create_contract("C", {"Req": "INITIATOR"})
        tx.create_queue("q_a")
        tx.create_queue("q_b")
        tx.create_service("A", "q_a")  # no contracts: may only initiate
        tx.create_service("B", "q_b")
        tx.create_queue("q_target")
        tx.create_service("Target", "q_target", ["C"])
    with broker.transaction() as tx:
        ok = tx.begin_dialog("A", "Target", "C")
        tx.send(ok, "Req", b"x")
        refused = tx.begin_dialog("A", "B", "C")
        tx.send(refused, "Req", b"x")
    with broker.transaction() as tx:
        assert len(tx.receive("q_target")) == 1
        (error,) = tx.receive("q_a", conversation_handle=refused)
    assert error.error().code == -8408
    assert count(broker, """SELECT count(*) FROM broker.endpoints e
                             JOIN broker.service_defs s USING (service_id)
                            WHERE s.name = 'B'""") == 0
    assert endpoint(broker, refused)["state"] == "ER"  # type: ignore[index]


def test_T_Q_01_queue_defaults(broker: Broker) -> None:
    with broker.transaction() as tx:
        tx.create_queue("plain")
        tx.create_queue("owned", activation_procedure="pkg.reader:run", max_queue_readers=3,
                        execute_as="OWNER")
    got = {
        r[0]: r[1:]
        for r in rows(broker, """
            SELECT name, is_receive_enabled, is_enqueue_enabled, is_retention_enabled,
                   is_poison_message_handling_enabled, is_activation_enabled, max_readers,
                   execute_as_principal_id, activation_procedure, type
              FROM broker.service_queues""")
    }
    assert got["plain"] == (True, True, False, True, False, 0, None, None, "SQ")
    assert got["owned"] == (True, True, False, True, True, 3, -2, "pkg.reader:run", "SQ")


def test_T_Q_01_alter_queue(broker: Broker) -> None:
    with broker.transaction() as tx:
        tx.create_queue("q")
        tx.alter_queue("q", status=False, retention=True, poison_message_handling=False)
    (state,) = rows(broker, """SELECT q.is_receive_enabled, q.is_enqueue_enabled,
                                      q.is_retention_enabled,
                                      q.is_poison_message_handling_enabled, s.disabled_reason
                                 FROM broker.service_queues q JOIN broker.queue_status s
                                USING (object_id)""")
    assert state == (False, False, True, False, "ADMIN")
    with broker.transaction() as tx:
        tx.alter_queue("q", status=True)
    (state,) = rows(broker, "SELECT is_receive_enabled, disabled_reason FROM broker.queue_status")
    assert state == (True, None)


def test_T_Q_02_queue_view_is_read_only(app: App) -> None:
    handle = app.dialog()
    with app.broker.transaction() as tx:
        tx.send(handle, "Req", b"hello")
    with psycopg.connect(app.broker.dsn) as conn:
        (row,) = conn.execute(
            "SELECT status, message_type_name, message_body, service_name, validation"
            " FROM public.q_t").fetchall()
        assert row == (1, "Req", b"hello", "T", "N")
    for statement in (
        "INSERT INTO public.q_t (status) VALUES (1)",
        "UPDATE public.q_t SET status = 0",
        "DELETE FROM public.q_t",
        "TRUNCATE public.q_t",
    ):
        with psycopg.connect(app.broker.dsn) as conn, pytest.raises(psycopg.Error) as exc:
            conn.execute(statement)
        assert "Msg 50101" in str(exc.value) or "is not a table" in str(exc.value)
    assert count(app.broker, "SELECT count(*) FROM public.q_t") == 1


def test_alter_service_on_queue_moves_messages(app: App) -> None:
    handle = app.dialog()
    with app.broker.transaction() as tx:
        tx.send(handle, "Req", b"1")
        tx.create_queue("q_t2")
        tx.alter_service("T", queue_name="q_t2")
    with app.broker.transaction() as tx:
        assert tx.receive("q_t") == []
        assert [m.message_body for m in tx.receive("q_t2")] == [b"1"]
    with pytest.raises(BrokerError) as nothing, app.broker.transaction() as tx:
        tx.alter_service("T")
    assert nothing.value.number == 8493


HOSTILE = [
    "x'; DROP TABLE broker.queues; --",
    'q"; DROP SCHEMA broker CASCADE; --',
    "Robert'); DELETE FROM broker.endpoints;--",
    "名前 with spaces and ünïcode",
]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_are_names(broker: Broker, name: str) -> None:
    """Quotes and SQL fragments are stored literally and never executed. (A queue name may not
    hold a period, which separates a schema from a queue: the queue's name has none.)"""
    queue = name.replace(".", "_")
    with broker.transaction() as tx:
        tx.create_message_type(name)
        tx.create_contract(name, {name: "ANY"})
        tx.create_queue(queue)
        tx.create_service(name, queue, [name])
        handle = tx.begin_dialog(name, name, name)
        tx.send(handle, name, b"payload")
    with broker.transaction() as tx:
        (message,) = tx.receive(queue)
    assert (message.message_type_name, message.service_name) == (name, name)
    assert count(broker, "SELECT count(*) FROM broker.queues") == 1
    with psycopg.connect(broker.dsn) as conn:
        from psycopg import sql

        view = conn.execute(sql.SQL("SELECT count(*) FROM public.{}").format(
            sql.Identifier(queue)))
        assert view.fetchone() == (0,)


@pytest.mark.parametrize(
    ("statement", "number"),
    [
        (lambda tx: tx.create_message_type("x" * 129), 103),
        (lambda tx: tx.create_message_type(""), 1038),
        (lambda tx: tx.create_message_type("Req"), 2714),
        (lambda tx: tx.create_message_type("bad", "SOMETIMES"), 102),
        (lambda tx: tx.create_message_type("bad", "VALID_XML", schema_collection="nope"), 15151),
        (lambda tx: tx.create_contract("y" * 129, {"Req": "ANY"}), 103),
        (lambda tx: tx.create_contract("c2", {"Nope": "ANY"}), 8428),
        (lambda tx: tx.create_contract("c2", {"Req": "SOMEONE"}), 102),
        (lambda tx: tx.create_queue("#temp"), 102),
        (lambda tx: tx.create_queue("q_t"), 2714),
        (lambda tx: tx.create_queue("z" * 129), 103),
        (lambda tx: tx.create_queue("q", max_queue_readers=40000), 50106),
        (lambda tx: tx.create_queue("q", schema="no_such_schema"), 15151),
        (lambda tx: tx.create_service("S2", "no_such_queue"), 15151),
        (lambda tx: tx.create_service("S2", "q_t", ["C", "C"]), 8404),
        (lambda tx: tx.create_service("S2", "q_t", ["NoContract"]), 8425),
        (lambda tx: tx.create_service("s" * 257, "q_t"), 103),
        (lambda tx: tx.drop_message_type("nope"), 15151),
        (lambda tx: tx.drop_message_type("DEFAULT"), 15247),
        (lambda tx: tx.drop_contract("DEFAULT"), 15247),
        (lambda tx: tx.drop_queue("nope"), 15151),
        (lambda tx: tx.drop_service("nope"), 15151),
        (lambda tx: tx.create_xml_schema_collection("bad", ["<not a schema"]), 50107),
    ],
)
def test_bad_catalog_input_changes_nothing(app: App, statement, number: int) -> None:  # type: ignore[no-untyped-def]
    before = snapshot(app.broker)
    with pytest.raises(BrokerError) as exc, app.broker.transaction() as tx:
        statement(tx)
    assert exc.value.number == number
    assert str(exc.value).startswith(f"Msg {number}: ")
    assert snapshot(app.broker) == before


def test_queue_names_longer_than_an_identifier_get_views_of_their_own(app: App) -> None:
    """PostgreSQL cuts identifiers at 63 bytes; two 100-character names that differ only at
    the end are two queues with two views (they collided with a misleading Msg 2714)."""
    names = ["Q" * 99 + "1", "Q" * 99 + "2", "Ü" * 40]  # the last: 80 bytes in UTF-8
    with app.broker.transaction() as tx:
        for name in names:
            tx.create_queue(name)
            tx.create_service(f"//S/{name}", name, ["C"])
    for name in names:
        with app.broker.transaction() as tx:
            tx.send(tx.begin_dialog("I", f"//S/{name}", "C"), "Req", name)
    views = []
    with psycopg.connect(app.broker.dsn) as conn:
        for name in names:
            row = conn.execute("SELECT broker.queue_view_name(%s)", [name]).fetchone()
            assert row is not None
            view = str(row[0])
            assert len(view.encode()) <= 63
            body = conn.execute(
                f"SELECT convert_from(message_body, 'UTF8') FROM public.\"{view}\"").fetchone()
            assert body == (name,)
            views.append(view)
    assert len(set(views)) == 3
    for name in names:
        with app.broker.transaction() as tx:
            (message,) = tx.receive(name)
            assert message.text() == name


def test_a_queue_name_with_a_period_is_refused(app: App) -> None:
    """"public.HTarget" names queue HTarget in schema public: a queue of that name could not
    be told from it."""
    before = snapshot(app.broker)
    with pytest.raises(BrokerError) as refused, app.broker.transaction() as tx:
        tx.create_queue("public.HTarget")
    assert refused.value.number == 50121
    assert snapshot(app.broker) == before


@pytest.mark.parametrize("message_type", ["Req", "Xml"])
def test_a_body_over_the_maximum_message_size_is_refused(validating_app: App,
                                                         message_type: str) -> None:
    """One body too large for RECEIVE to return made every RECEIVE on its queue fail; SEND
    refuses it (50122) and changes nothing, alone or in a batch."""
    handle = validating_app.dialog("V")
    too_large = b"<a>" + b"x" * MAX_MESSAGE_SIZE + b"</a>"
    before = snapshot(validating_app.broker)
    for batch in (False, True):
        with pytest.raises(BrokerError) as refused, validating_app.broker.transaction() as tx:
            if batch:
                tx.send_many(handle, message_type, [b"<a/>", too_large])
            else:
                tx.send(handle, message_type, too_large)
        assert refused.value.number == 50122
        assert snapshot(validating_app.broker) == before
    with psycopg.connect(validating_app.broker.dsn) as conn, pytest.raises(
            psycopg.Error, match="Msg 50122"):
        conn.execute("SELECT broker.send(ARRAY[%s]::uuid[], 'Req', %s::bytea)",
                     [handle, too_large])
