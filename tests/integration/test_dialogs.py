"""BEGIN DIALOG and SEND (spec 6-7, 28.2)."""

from __future__ import annotations

import datetime as dt
import uuid

import psycopg
import pytest

from airflow_broker import Broker, BrokerError
from airflow_broker.errors import HandleInUse, translate
from tests.support.brokers import App
from tests.support.helpers import count, endpoint, snapshot

MAX_LIFETIME = dt.timedelta(seconds=2_147_483_647)


def db_now(broker: Broker) -> dt.datetime:
    with psycopg.connect(broker.dsn) as conn:
        row = conn.execute("SELECT broker.utc_now()").fetchone()
        assert row is not None
        value: dt.datetime = row[0]
        return value


def test_T_BD_01_dialog_creation(app: App) -> None:
    handle = app.dialog()
    initiator = endpoint(app.broker, handle)
    assert initiator is not None
    assert initiator["is_initiator"] is True
    assert (initiator["state"], initiator["state_desc"]) == ("SO", "STARTED_OUTBOUND")
    assert initiator["far_broker_instance"] is None
    assert initiator["far_service"] == "T"
    assert initiator["security_timestamp"] == dt.datetime(1900, 1, 1)
    expected_lifetime = db_now(app.broker) + MAX_LIFETIME
    assert abs(initiator["lifetime"] - expected_lifetime) < dt.timedelta(minutes=1)
    assert count(app.broker, "SELECT count(*) FROM broker.conversation_endpoints") == 1
    assert count(app.broker, """SELECT count(*) FROM broker.conversation_groups g
                                 JOIN broker.services s USING (service_id)
                                WHERE g.conversation_group_id = %s AND s.name = 'I'""",
                 (initiator["conversation_group_id"],)) == 1

    with app.broker.transaction() as tx:
        tx.send(handle, "Req", b"first")
    initiator = endpoint(app.broker, handle)
    assert initiator is not None
    assert initiator["state"] == "CO"
    with psycopg.connect(app.broker.dsn) as conn:
        (target_handle,) = conn.execute(
            "SELECT conversation_handle FROM broker.conversation_endpoints WHERE NOT is_initiator"
        ).fetchone() or (None,)
    target = endpoint(app.broker, target_handle)
    assert target is not None
    assert target["state"] == "CO"
    assert target["is_initiator"] is False
    assert target["conversation_id"] == initiator["conversation_id"]
    assert target["conversation_handle"] != handle
    assert target["conversation_group_id"] != initiator["conversation_group_id"]
    assert target["far_service"] == "I"
    assert target["lifetime"] == initiator["lifetime"]
    assert initiator["send_sequence"] == 1
    assert target["receive_sequence"] == 1


@pytest.mark.parametrize(
    ("kwargs", "number"),
    [
        ({"from_service": "Nope"}, 8423),
        ({"contract": "Nope"}, 8425),
        ({"contract": None}, 8417),
        ({"lifetime": None}, 8406),
        ({"lifetime": 0}, 8411),
        ({"lifetime": -5}, 8411),
        ({"lifetime": 2_147_483_648}, 8411),
        ({"to_service": "t" * 257}, 8412),
        ({"to_service": None}, 8421),
        ({"related_conversation": uuid.uuid4()}, 8426),
        ({"related_conversation": uuid.uuid4(), "related_conversation_group": uuid.uuid4()}, 8414),
    ],
)
def test_T_BD_02_begin_dialog_errors(app: App, kwargs: dict[str, object], number: int) -> None:
    arguments: dict[str, object] = {"from_service": "I", "to_service": "T", "contract": "C"}
    arguments.update(kwargs)
    before = snapshot(app.broker)
    with pytest.raises(BrokerError) as exc, app.broker.transaction() as tx:
        tx.begin_dialog(**arguments)  # type: ignore[arg-type]
    assert exc.value.number == number
    assert snapshot(app.broker) == before


def test_T_BD_02_unknown_target_is_not_an_error(app: App) -> None:
    with app.broker.transaction() as tx:
        handle = tx.begin_dialog("I", "NoSuchService", "C")
        tx.send(handle, "Req", b"waits")
        tx.send(handle, "Req", b"waits too")
    with psycopg.connect(app.broker.dsn) as conn:
        waiting = conn.execute(
            "SELECT to_service_name, message_sequence_number, transmission_status"
            " FROM broker.transmission_queue ORDER BY message_sequence_number").fetchall()
    assert [(w[0], w[1]) for w in waiting] == [("NoSuchService", 0), ("NoSuchService", 1)]
    assert all("could not be found" in w[2] for w in waiting)
    with app.broker.transaction() as tx:
        assert tx.receive("q_i") == []  # no Error: the message simply waits


def test_T_BD_04_to_service_is_case_sensitive(app: App) -> None:
    with app.broker.transaction() as tx:
        handle = tx.begin_dialog("I", "t", "C")
        tx.send(handle, "Req", b"lost in case")
    with app.broker.transaction() as tx:
        assert tx.receive("q_t") == []
    assert count(app.broker, "SELECT count(*) FROM broker.transmission_queue") == 1


def test_T_BD_03_related_conversation_and_group(app: App) -> None:
    first = app.dialog()
    group_of_first = endpoint(app.broker, first)["conversation_group_id"]  # type: ignore[index]
    related = app.dialog(related_conversation=first)
    assert endpoint(app.broker, related)["conversation_group_id"] == group_of_first  # type: ignore[index]

    chosen = uuid.uuid4()
    in_new_group = app.dialog(related_conversation_group=chosen)
    assert endpoint(app.broker, in_new_group)["conversation_group_id"] == chosen  # type: ignore[index]
    joined = app.dialog(related_conversation_group=chosen)
    assert endpoint(app.broker, joined)["conversation_group_id"] == chosen  # type: ignore[index]

    # A group of another service cannot be joined from I.
    with app.broker.transaction() as tx:
        tx.send(first, "Req", b"creates the target endpoint and its group")
    with psycopg.connect(app.broker.dsn) as conn:
        target_group, target_handle = conn.execute(
            "SELECT conversation_group_id, conversation_handle FROM broker.conversation_endpoints"
            " WHERE NOT is_initiator").fetchone() or (None, None)
    before = snapshot(app.broker)
    with pytest.raises(BrokerError) as by_group, app.broker.transaction() as tx:
        tx.begin_dialog("I", "T", "C", related_conversation_group=target_group)
    assert by_group.value.number == 9610
    with pytest.raises(BrokerError) as by_handle, app.broker.transaction() as tx:
        tx.begin_dialog("I", "T", "C", related_conversation=target_handle)
    assert by_handle.value.number == 9610
    assert snapshot(app.broker) == before


def test_T_SD_01_send_checks(app: App) -> None:
    with app.broker.transaction() as tx:
        tx.create_message_type("Other")
    handle = app.dialog()
    with app.broker.transaction() as tx:
        tx.send(handle, "Req", b"opens the dialog")
        (request,) = tx.receive("q_t")
    target = request.conversation_handle
    before = snapshot(app.broker)
    cases = [
        (handle, "Other", b"x", 8431),
        (handle, "Resp", b"x", 8432),
        (target, "Req", b"x", 8434),
        (handle, "DEFAULT", b"x", 8431),  # MESSAGE TYPE omitted on contract C
        (uuid.uuid4(), "Req", b"x", 8426),
        (handle, "NoSuchType", b"x", 8428),
    ]
    for conversation, message_type, body, number in cases:
        with pytest.raises(BrokerError) as exc, app.broker.transaction() as tx:
            tx.send(conversation, message_type, body)
        assert exc.value.number == number, (message_type, exc.value)
    assert snapshot(app.broker) == before

    # A NULL body expression (only expressible in SQL) is 8433; an omitted body is empty.
    with psycopg.connect(app.broker.dsn) as conn, pytest.raises(psycopg.Error, match="Msg 8433"):
        conn.execute("SELECT broker.send(ARRAY[%s]::uuid[], 'Req', NULL::bytea)", [handle])
    assert snapshot(app.broker) == before
    with psycopg.connect(app.broker.dsn) as conn:
        conn.execute("SELECT broker.send(ARRAY[%s]::uuid[], 'Req')", [handle])
    with app.broker.transaction() as tx:
        (empty,) = tx.receive("q_t")
    assert empty.message_body is None

    # On the DEFAULT contract, the omitted message type is DEFAULT and is allowed.
    with app.broker.transaction() as tx:
        on_default = tx.begin_dialog("I", "T")
        tx.send(on_default)
    with app.broker.transaction() as tx:
        (message,) = tx.receive("q_t")
    assert (message.message_type_name, message.service_contract_name) == ("DEFAULT", "DEFAULT")


def test_T_SD_02_multi_handle_send_is_atomic(app: App) -> None:
    good = [app.dialog() for _ in range(3)]
    with app.broker.transaction() as tx:
        tx.send(good, "Req", b"to all three")
    with app.broker.transaction() as tx:
        received = [tx.receive("q_t") for _ in range(3)]
    assert [m.message_body for batch in received for m in batch] == [b"to all three"] * 3

    # A conversation in ERROR (its target refused it) makes the whole SEND fail.
    with app.broker.transaction() as tx:
        tx.create_queue("q_x")
        tx.create_service("NoContracts", "q_x")
        broken = tx.begin_dialog("I", "NoContracts", "C")
        tx.send(broken, "Req", b"refused: -8408")
    assert endpoint(app.broker, broken)["state"] == "ER"  # type: ignore[index]
    before = snapshot(app.broker)
    with pytest.raises(BrokerError) as exc, app.broker.transaction() as tx:
        tx.send([*good, broken], "Req", b"never stored")
    assert exc.value.number == 8429
    assert snapshot(app.broker) == before
    with pytest.raises(BrokerError) as duplicate, app.broker.transaction() as tx:
        tx.send([good[0], good[1], good[0]], "Req", b"x")
    assert duplicate.value.number == 50102
    assert snapshot(app.broker) == before


def test_handles_as_text_and_hostile_handles(app: App) -> None:
    """Handles travel through XCom as text: SEND takes them so, alone or mixed with UUIDs. Text
    that is not one handle is error 8169 (SQL Server's failed uniqueidentifier conversion) and
    changes nothing, even when it would read as two handles in an array literal."""
    first, second = app.dialog(), app.dialog()
    with app.broker.transaction() as tx:
        tx.send(str(first), "Req", b"by text")
        tx.send([str(first), second], "Req", b"mixed")
    with app.broker.transaction() as tx:
        received = tx.receive("q_t") + tx.receive("q_t")
    assert sorted(m.message_body or b"" for m in received) == [b"by text", b"mixed", b"mixed"]

    before = snapshot(app.broker)
    hostile: list[object] = [f"{first},{second}", [f"{first},{second}"],
                             [f"{first}}},{{{second}"], "not a handle", [first, "x"], [42]]
    for handles in hostile:
        with pytest.raises(BrokerError) as exc, app.broker.transaction() as tx:
            tx.send(handles, "Req", b"never stored")  # type: ignore[arg-type]
        assert exc.value.number == 8169, handles
    with pytest.raises(BrokerError) as ended, app.broker.transaction() as tx:
        tx.end_conversation("not a handle")  # type: ignore[arg-type]
    assert ended.value.number == 8169
    with pytest.raises(BrokerError) as filtered, app.broker.transaction() as tx:
        tx.receive("q_t", conversation_handle="not a handle")  # type: ignore[arg-type]
    assert filtered.value.number == 8169
    assert snapshot(app.broker) == before


def test_T_SD_03_send_in_error_state(app: App) -> None:
    with app.broker.transaction() as tx:
        tx.create_queue("q_x")
        tx.create_service("NoContracts", "q_x")
        handle = tx.begin_dialog("I", "NoContracts", "C")
        tx.send(handle, "Req", b"x")
    with pytest.raises(BrokerError) as exc, app.broker.transaction() as tx:
        tx.send(handle, "Req", b"again")
    assert exc.value.number == 8429
    assert "'ER'" in str(exc.value)
    with pytest.raises(BrokerError) as gone, app.broker.transaction() as tx:
        tx.send(uuid.uuid4(), "Req", b"x")
    assert gone.value.number == 8426


def test_T_SD_04_rolled_back_send_leaves_no_trace(app: App) -> None:
    handle = app.dialog()
    with pytest.raises(RuntimeError), app.broker.transaction() as tx:
        tx.send(handle, "Req", b"rolled back")
        raise RuntimeError("the application fails after its SEND")
    assert count(app.broker, "SELECT count(*) FROM broker.queue_messages") == 0
    assert endpoint(app.broker, handle)["state"] == "SO"  # type: ignore[index]
    with app.broker.transaction() as tx:
        tx.send(handle, "Req", b"committed")
    with app.broker.transaction() as tx:
        (message,) = tx.receive("q_t")
    assert (message.message_sequence_number, message.message_body) == (0, b"committed")


def test_sequence_numbers_per_direction(app: App) -> None:
    handle = app.dialog()
    with app.broker.transaction() as tx:
        for i in range(3):
            tx.send(handle, "Req", f"request {i}")
    with app.broker.transaction() as tx:
        requests = tx.receive("q_t")
        target = requests[0].conversation_handle
        tx.send(target, "Resp", "response 0")
        tx.send(target, "Resp", "response 1")
    with app.broker.transaction() as tx:
        responses = tx.receive("q_i")
    assert [m.message_sequence_number for m in requests] == [0, 1, 2]
    assert [m.message_sequence_number for m in responses] == [0, 1]
    assert [m.text() for m in responses] == ["response 0", "response 1"]
    assert {m.conversation_handle for m in responses} == {handle}
    assert {(m.service_name, m.service_contract_name) for m in responses} == {("I", "C")}


def test_retention_keeps_sent_copies(app: App) -> None:
    with app.broker.transaction() as tx:
        tx.alter_queue("q_i", retention=True)
    handle = app.dialog()
    with app.broker.transaction() as tx:
        tx.send(handle, "Req", b"kept")
    with psycopg.connect(app.broker.dsn) as conn:
        kept = conn.execute("SELECT status, message_body FROM public.q_i").fetchall()
    assert kept == [(3, b"kept")]
    with app.broker.transaction() as tx:
        assert tx.receive("q_i") == []  # a sent copy is never received


def test_send_many_numbers_and_delivers_in_order(app: App) -> None:
    handle = app.dialog()
    with app.broker.transaction() as tx:
        tx.send(handle, "Req", "before")
        tx.send_many(handle, "Req", [f"batch {i}" for i in range(250)] + [None, b""])
        tx.send(handle, "Req", "after")
    with app.broker.transaction() as tx:
        received = tx.receive("q_t")
    assert [m.message_sequence_number for m in received] == list(range(254))
    assert [m.text() for m in received] == (
        ["before"] + [f"batch {i}" for i in range(250)] + [None, None, "after"])
    assert endpoint(app.broker, handle)["send_sequence"] == 254  # type: ignore[index]


def test_send_many_gives_every_message_its_own_id(app: App) -> None:
    # A batch's ids are counted on from one random UUID: they must still differ from each other
    # and from other batches', and read as random (version 4) UUIDs.
    handle = app.dialog()
    with app.broker.transaction() as tx:
        for _ in range(3):
            tx.send_many(handle, "Req", ["x"] * 300)
        tx.send(handle, "Req", "single")
    with app.broker.transaction() as tx:
        ids = [m.message_id for m in tx.receive("q_t")]
    assert len(ids) == 901
    assert len(set(ids)) == 901
    assert {(i.version, i.variant) for i in ids} == {(4, uuid.RFC_4122)}


def test_send_many_takes_the_careful_path_when_it_must(app: App) -> None:
    # Message 0 creates the target; then the target queue is disabled, so the rest wait in
    # the transmission queue, in order.
    handle = app.dialog()
    with app.broker.transaction() as tx:
        tx.send_many(handle, "Req", ["first", "second"])
        tx.alter_queue("q_t", status=False)
        tx.send_many(handle, "Req", ["third", "fourth", "fifth"])
    assert count(app.broker, "SELECT count(*) FROM broker.transmission_queue") == 3
    with app.broker.transaction() as tx:
        tx.alter_queue("q_t", status=True)
    with app.broker.transaction() as tx:
        assert [m.text() for m in tx.receive("q_t")] == [
            "first", "second", "third", "fourth", "fifth"]
    # Checks apply to the batch as a whole: a wrong type changes nothing.
    before = snapshot(app.broker)
    with pytest.raises(BrokerError) as exc, app.broker.transaction() as tx:
        tx.send_many(handle, "Resp", ["x", "y"])
    assert exc.value.number == 8432
    assert snapshot(app.broker) == before


def test_begin_dialog_with_a_handle_of_the_callers(app: App) -> None:
    """BEGIN DIALOG may be given the new endpoint's handle (a pipelined client makes its own);
    a handle an endpoint already has is refused with 50125 and creates nothing."""
    chosen = uuid.uuid4()
    with psycopg.connect(app.broker.dsn, autocommit=True) as conn:
        made = conn.execute("SELECT broker.begin_dialog('I', 'T', 'C',"
                            " p_conversation_handle => %s)", [chosen]).fetchone()
        assert made == (chosen,)
        endpoints = conn.execute("SELECT count(*) FROM broker.endpoints").fetchone()
        with pytest.raises(psycopg.Error) as exc:
            conn.execute("SELECT broker.begin_dialog('I', 'T', 'C', p_conversation_handle => %s)",
                         [chosen])
        assert conn.execute("SELECT count(*) FROM broker.endpoints").fetchone() == endpoints
    error = translate(exc.value)
    assert isinstance(error, HandleInUse) and error.number == 50125, exc.value
    assert str(chosen) in str(error)
