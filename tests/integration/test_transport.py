"""Delivery between brokers in two databases (spec 21, catalogue 28.6): the transmission queue,
acknowledgements, duplicates, out-of-order arrivals, back-off, return routes, broker identity."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import psycopg
import pytest

from airflow_broker import Broker, BrokerError
from airflow_broker.worker import transport
from airflow_broker.worker.transport import Transport
from tests.support import roles
from tests.support.brokers import (
    FaultyTransport,
    Pair,
    advance,
    one,
    receive_all,
    rows,
    worker,
)
from tests.support.helpers import snapshot

TQ_COLUMNS = ("to_service_name, from_service_name, service_contract_name, enqueue_time,"
              " message_sequence_number, message_type_name, is_end_of_dialog,"
              " is_conversation_error, transmission_status, to_broker_instance")


def send(pair: Pair, handle: object, *bodies: str) -> None:
    with pair.a.transaction() as tx:
        for body in bodies:
            tx.send(handle, "Req", body)  # type: ignore[arg-type]


def delivered_dialog(pair: Pair, first: str) -> uuid.UUID:
    """A dialog from A to B, routed both ways, whose first message has arrived and been
    acknowledged."""
    pair.routes()
    h = pair.dialog()
    send(pair, h, first)
    pair.pump()
    return h


def tq(broker: Broker) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in rows(
        broker, f"SELECT {TQ_COLUMNS} FROM broker.transmission_queue"
                " ORDER BY message_sequence_number")]


def endpoint_of(broker: Broker, handle: object) -> dict[str, Any]:
    found = rows(broker, "SELECT far_broker_instance, state, security_timestamp, lifetime,"
                         " receive_sequence, first_out_of_order_sequence,"
                         " last_out_of_order_sequence FROM broker.conversation_endpoints"
                         " WHERE conversation_handle = %s", [handle])
    if not found:
        return {}
    keys = ("far_broker_instance", "state", "security_timestamp", "lifetime",
            "receive_sequence", "first_out_of_order", "last_out_of_order")
    return dict(zip(keys, found[0], strict=True))


def target_handle(pair: Pair) -> object:
    return one(pair.b, "SELECT conversation_handle FROM broker.endpoints WHERE NOT is_initiator")


def test_T_TX_01_message_waits_in_the_transmission_queue_until_acknowledged(pair: Pair) -> None:
    pair.routes()
    h = pair.dialog()
    send(pair, h, "<order id='1'/>")
    before = pair.a.now()

    [waiting] = tq(pair.a)
    assert waiting[:3] == ("T", "I", "C")
    assert abs((waiting[3] - before).total_seconds()) < 5  # enqueue_time is UTC
    assert waiting[4:] == (0, "Req", False, False, "", None)
    assert endpoint_of(pair.a, h)["far_broker_instance"] is None
    assert receive_all(pair.b, "q_t") == []

    result = pair.ta.step()
    assert (result.sent, result.acknowledged) == (1, 1)
    assert tq(pair.a) == []
    assert endpoint_of(pair.a, h)["far_broker_instance"] == str(pair.b.broker_instance)
    [m] = receive_all(pair.b, "q_t")
    assert (m.message_type_name, m.text(), m.message_sequence_number) == (
        "Req", "<order id='1'/>", 0)
    assert one(pair.a, "SELECT conversation_id FROM broker.endpoints") == one(
        pair.b, "SELECT conversation_id FROM broker.endpoints")


def test_T_TX_01_a_reply_travels_back_on_the_return_route(pair: Pair) -> None:
    h = delivered_dialog(pair, "question")
    with pair.b.transaction() as tx:
        [m] = tx.receive("q_t")
        tx.send(m.conversation_handle, "Resp", "answer")
    assert [r[:2] for r in tq(pair.b)] == [("I", "T")]
    pair.pump()
    [reply] = receive_all(pair.a, "q_i")
    assert (reply.conversation_handle, reply.message_type_name, reply.text()) == (
        h, "Resp", "answer")
    assert tq(pair.b) == []
    assert endpoint_of(pair.b, m.conversation_handle)["far_broker_instance"] == str(
        pair.a.broker_instance)


def test_T_TX_01_duplicate_delivery_is_enqueued_once_and_still_acknowledged(pair: Pair) -> None:
    pair.routes()
    h = pair.dialog()
    send(pair, h, "one", "two", "three")
    lossy = FaultyTransport(pair.a, lose=2)
    pair.transports.append(lossy)

    lossy.step()
    # Delivered and committed at B, but A never heard: everything is still pending at A.
    assert [r[4] for r in tq(pair.a)] == [0, 1, 2]
    assert "acknowledgement was lost" in tq(pair.a)[0][8]
    assert one(pair.b, "SELECT count(*) FROM broker.queue_messages") == 3
    advance(pair.a, 5)
    lossy.step()
    advance(pair.a, 9)
    result = lossy.step()

    assert (result.sent, result.acknowledged) == (3, 3)
    assert tq(pair.a) == []
    assert [m.text() for m in receive_all(pair.b, "q_t")] == ["one", "two", "three"]


def test_T_TX_01_early_messages_are_held_until_the_gap_is_filled(pair: Pair) -> None:
    pair.routes()
    h = pair.dialog()
    send(pair, h, "m0", "m1", "m2")
    pending = rows(pair.a, "SELECT * FROM broker.outbound_transmissions(10)")
    assert [r[11] for r in pending] == [0, 1, 2]

    # Messages 1 and 2 arrive first: held with status 2, not receivable.
    outcomes, _ = pair.ta._push(pending[1][2], str(pair.a.broker_instance), pending[1:])
    assert [o.outcome for o in outcomes] == ["ack", "ack"]
    assert rows(pair.b, "SELECT message_sequence_number, status FROM broker.queue_messages"
                        " ORDER BY 1") == [(1, 2), (2, 2)]
    t = target_handle(pair)
    ep = endpoint_of(pair.b, t)
    assert (ep["receive_sequence"], ep["first_out_of_order"], ep["last_out_of_order"]) == (0, 1, 2)
    assert receive_all(pair.b, "q_t") == []
    # A repeated early message is still held once.
    pair.ta._push(pending[1][2], str(pair.a.broker_instance), pending[2:])
    assert one(pair.b, "SELECT count(*) FROM broker.queue_messages") == 2

    # Message 0 fills the gap: all three are released, in order.
    pair.ta.step()
    assert rows(pair.b, "SELECT message_sequence_number, status FROM broker.queue_messages"
                        " ORDER BY 1") == [(0, 1), (1, 1), (2, 1)]
    assert endpoint_of(pair.b, t)["receive_sequence"] == 3
    assert [m.text() for m in receive_all(pair.b, "q_t")] == ["m0", "m1", "m2"]
    assert tq(pair.a) == []


def test_T_TX_01_unreachable_target_backs_off_4_8_16_32_then_64_seconds(pair: Pair) -> None:
    with pair.a.transaction() as tx:
        tx.create_route("to_T", "postgresql://nobody@127.0.0.1:1/nowhere", service_name="T")
    pair.routes(forward=False)
    h = pair.dialog()
    send(pair, h, "hello")
    delays = []
    for _ in range(6):
        result = pair.ta.step()
        assert (result.sent, result.held) == (1, 1)
        last, nxt, status = rows(pair.a, "SELECT last_attempt_at, next_attempt_at,"
                                         " transmission_status FROM broker.transmission_queue")[0]
        assert status.startswith("The target service broker is unreachable: ")
        delays.append(round((nxt - last).total_seconds()))
        assert pair.ta.step().sent == 0  # not due before its time
        advance(pair.a, delays[-1])
    assert delays == [4, 8, 16, 32, 64, 64]
    with pair.a.transaction() as tx:
        assert "unreachable" in tx.get_transmission_status(h)

    # The route is corrected: the next attempt is at once, and delivers.
    with pair.a.transaction() as tx:
        tx.alter_route("to_T", address=pair.b_uri)
    assert pair.ta.step().acknowledged == 1
    assert [m.text() for m in receive_all(pair.b, "q_t")] == ["hello"]


def test_T_TX_02_unresolvable_target_is_not_an_error(pair: Pair) -> None:
    pair.routes(forward=False)
    with pair.a.transaction() as tx:
        h = tx.begin_dialog("I", "Elsewhere", "C")
        tx.send(h, "Req", "x")
    [waiting] = tq(pair.a)
    assert waiting[0] == "Elsewhere" and "could not be found" in waiting[8]
    assert receive_all(pair.a, "q_i") == []
    assert endpoint_of(pair.a, h)["state"] == "CO"

    # The service appears in B and a route to it in A: delivered on the next retry.
    with pair.b.transaction() as tx:
        tx.create_service("Elsewhere", "q_t", ["C"])
    with pair.a.transaction() as tx:
        tx.create_route("to_elsewhere", pair.b_uri, service_name="Elsewhere")
    worker(pair.a).run_once(transmit=False)  # the local retry finds the new route
    pair.pump()
    assert [m.text() for m in receive_all(pair.b, "q_t")] == ["x"]
    assert tq(pair.a) == []


def test_T_TX_02_far_broker_instance_without_the_service_answers_8490(pair: Pair) -> None:
    b_guid = str(pair.b.broker_instance)
    with pair.a.transaction() as tx:
        tx.create_route("to_B", pair.b_uri, service_name="Missing", broker_instance=b_guid)
        h = tx.begin_dialog("I", "Missing", "C", to_broker_instance=b_guid)
        tx.send(h, "Req", "x")
    pair.routes(forward=False)
    pair.pump()
    [error] = receive_all(pair.a, "q_i")
    assert error.is_error and error.error().code == -8490
    assert endpoint_of(pair.a, h)["state"] == "ER"
    assert tq(pair.a) == []


def test_T_TX_02_never_resolved_the_dialog_errors_at_its_lifetime(pair: Pair) -> None:
    with pair.a.transaction() as tx:
        h = tx.begin_dialog("I", "Nowhere", "C", lifetime=60)
        tx.send(h, "Req", "x")
    worker(pair.a).run_once(transmit=False)
    assert receive_all(pair.a, "q_i") == []
    advance(pair.a, 61)
    worker(pair.a).run_once(transmit=False)
    [error] = receive_all(pair.a, "q_i")
    assert error.error().code == -8489
    assert tq(pair.a) == []


def test_T_TX_03_disabled_broker_keeps_messages_with_a_status(pair: Pair) -> None:
    pair.routes()
    with pair.a.transaction() as tx:
        tx.alter_broker("DISABLE_BROKER")
    h = pair.dialog()
    send(pair, h, "held")
    assert tq(pair.a)[0][8] == "The broker is disabled in the sender's database."
    assert one(pair.a, "SELECT is_broker_enabled FROM broker.databases") is False
    pair.pump()
    assert receive_all(pair.b, "q_t") == []

    with pair.a.transaction() as tx:
        tx.alter_broker("ENABLE_BROKER")
    worker(pair.a).run_once(transmit=False)
    pair.pump()
    assert [m.text() for m in receive_all(pair.b, "q_t")] == ["held"]


def test_T_TX_03_a_disabled_target_broker_holds_the_sender(pair: Pair) -> None:
    pair.routes()
    with pair.b.transaction() as tx:
        tx.alter_broker("DISABLE_BROKER")
    send(pair, pair.dialog(), "x")
    pair.pump()
    assert "disabled in the target database" in tq(pair.a)[0][8]


@pytest.mark.parametrize("option", ["NEW_BROKER", "ERROR_BROKER_CONVERSATIONS"])
def test_T_TX_03_restored_broker_errors_every_conversation(pair: Pair, option: str) -> None:
    pair.routes()
    h = pair.dialog()
    send(pair, h, "x")
    pair.pump()
    receive_all(pair.b, "q_t")
    old = pair.b.broker_instance
    with pair.b.transaction() as tx:
        new = tx.alter_broker(option)
    assert (new != old) == (option == "NEW_BROKER")
    assert pair.b.broker_instance == new
    [local] = receive_all(pair.b, "q_t")
    assert local.error().code == -9719
    pair.pump()
    [remote] = receive_all(pair.a, "q_i")
    assert (remote.conversation_handle, remote.error().code) == (h, -9720)
    assert endpoint_of(pair.a, h)["state"] == "ER"


def test_alter_broker_rejects_an_unknown_option(pair: Pair) -> None:
    before = snapshot(pair.a)
    with pytest.raises(BrokerError) as err, pair.a.transaction() as tx:
        tx.alter_broker("NEW_BROKER; DROP TABLE broker.endpoints")
    assert err.value.number == 50106
    assert snapshot(pair.a) == before


def test_T_TX_04_acknowledgements_without_a_return_route(pair: Pair) -> None:
    pair.routes(back=False)
    h = pair.dialog()
    send(pair, h, "x")
    result = pair.ta.step()
    assert result.held == 1
    # The message reached B and can be received there...
    [m] = receive_all(pair.b, "q_t")
    # ...but B cannot acknowledge it, and both sides say why.
    with pair.a.transaction() as tx:
        status_a = tx.get_transmission_status(h)
    assert "no route back to service 'I'" in status_a
    with pair.b.transaction() as tx:
        status_b = tx.get_transmission_status(m.conversation_handle)
    assert status_b.startswith("No route matches the destination service name 'I'")
    advance(pair.a, 5)
    pair.ta.step()
    assert one(pair.b, "SELECT count(*) FROM broker.queue_messages") == 0  # no second copy
    assert len(tq(pair.a)) == 1

    with pair.b.transaction() as tx:
        tx.create_route("to_I", pair.a_uri, service_name="I")
    advance(pair.a, 9)
    assert pair.ta.step().acknowledged == 1
    assert tq(pair.a) == []
    with pair.a.transaction() as tx:
        assert tx.get_transmission_status(h) == ""


def test_T_TX_04_unknown_handle_is_8426(pair: Pair) -> None:

    with pytest.raises(BrokerError) as err, pair.a.transaction() as tx:
        tx.get_transmission_status(uuid.uuid4())
    assert err.value.number == 8426


def _hold_at_b(pair: Pair) -> None:
    with pair.b.transaction() as tx:
        tx.alter_broker("DISABLE_BROKER")


def _release_b(pair: Pair) -> None:
    with pair.b.transaction() as tx:
        tx.alter_broker("ENABLE_BROKER")
    advance(pair.a, 100)


def test_T_TX_05_end_with_error_drops_pending_messages_and_sends_only_the_error(
        pair: Pair) -> None:
    pair.routes()
    h = pair.dialog()
    send(pair, h, "first")
    pair.pump()
    _hold_at_b(pair)
    send(pair, h, "second", "third")
    pair.pump()
    assert len(tq(pair.a)) == 2
    with pair.a.transaction() as tx:
        tx.end_conversation(h, error=42, description="cancelled")
    [only] = tq(pair.a)
    assert (only[4], only[5], only[7]) == (
        3, "http://schemas.microsoft.com/SQL/ServiceBroker/Error", True)
    _release_b(pair)
    pair.pump()
    got = receive_all(pair.b, "q_t")
    assert [m.message_type_name for m in got] == [
        "http://schemas.microsoft.com/SQL/ServiceBroker/Error", "Req"]
    assert got[0].error().code == 42 and got[1].text() == "first"
    assert endpoint_of(pair.b, got[0].conversation_handle)["state"] == "ER"
    assert endpoint_of(pair.a, h) == {}  # the initiator closed once the Error was delivered


def test_T_TX_05_normal_end_sends_end_dialog_after_pending_messages(pair: Pair) -> None:
    pair.routes()
    h = pair.dialog()
    _hold_at_b(pair)
    send(pair, h, "a", "b")
    with pair.a.transaction() as tx:
        tx.end_conversation(h)
    assert [(r[4], r[6]) for r in tq(pair.a)] == [(0, False), (1, False), (2, True)]
    _release_b(pair)
    pair.pump()
    got = receive_all(pair.b, "q_t")
    assert [m.text() for m in got[:2]] == ["a", "b"] and got[2].is_end_dialog
    assert endpoint_of(pair.b, got[0].conversation_handle)["state"] == "DI"


def test_T_BD_04_service_names_match_byte_for_byte_across_brokers(pair: Pair) -> None:
    with pair.a.transaction() as tx:
        tx.create_route("to_t", pair.b_uri, service_name="t")
        h = tx.begin_dialog("I", "t", "C")
        tx.send(h, "Req", "x")
    pair.routes(forward=False)
    pair.pump()
    [waiting] = tq(pair.a)
    assert "'t' could not be found in broker" in waiting[8]
    assert receive_all(pair.b, "q_t") == []


def test_T_BD_05_current_database_and_broker_instance_pin_delivery(pair: Pair) -> None:
    # Service T exists in both brokers; A also routes T to B.
    with pair.a.transaction() as tx:
        tx.create_queue("q_local_t")
        tx.create_service("T", "q_local_t", ["C"])
    pair.routes()
    a_guid, b_guid = str(pair.a.broker_instance), str(pair.b.broker_instance)

    local = pair.dialog(to_broker_instance="CURRENT DATABASE")
    send(pair, local, "stays here")
    assert endpoint_of(pair.a, local)["far_broker_instance"] == a_guid
    assert [m.text() for m in receive_all(pair.a, "q_local_t")] == ["stays here"]

    with pair.a.transaction() as tx:
        tx.create_route("to_T_at_B", pair.b_uri, service_name="T", broker_instance=b_guid)
    far = pair.dialog(to_broker_instance=b_guid.upper())
    send(pair, far, "goes to B")
    pair.pump()
    assert endpoint_of(pair.a, far)["far_broker_instance"] == b_guid
    assert [m.text() for m in receive_all(pair.b, "q_t")] == ["goes to B"]
    assert receive_all(pair.a, "q_local_t") == []


def test_fire_and_forget_leaks_the_target_endpoint_between_two_databases(pair: Pair) -> None:
    pair.routes()
    with pair.a.transaction() as tx:
        h = tx.begin_dialog("I", "T", "C")
        tx.send(h, "Req", "x")
        tx.end_conversation(h)
    pair.pump()
    assert endpoint_of(pair.a, h) == {}  # the initiator is gone at its first acknowledgement
    got = receive_all(pair.b, "q_t")
    assert [m.message_type_name for m in got][1:] == [
        "http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog"]
    with pair.b.transaction() as tx:
        tx.end_conversation(got[0].conversation_handle)
    pair.pump()
    t = endpoint_of(pair.b, got[0].conversation_handle)
    assert t["state"] == "CD"
    assert t["security_timestamp"] == dt.datetime(1900, 1, 1)
    assert t["lifetime"] > pair.b.now() + dt.timedelta(days=365 * 60)
    assert one(pair.b, "SELECT count(*) FROM broker.leaked_endpoints") == 1
    advance(pair.b, 31 * 60)
    worker(pair.b).run_once(transmit=False)
    assert one(pair.b, "SELECT count(*) FROM broker.leaked_endpoints") == 1


def test_target_ends_first_initialises_the_security_timestamp_and_is_reclaimed(
        pair: Pair) -> None:
    pair.routes()
    h = pair.dialog()
    send(pair, h, "question")
    pair.pump()  # message 0 acknowledged
    with pair.b.transaction() as tx:
        [m] = tx.receive("q_t")
        tx.send(m.conversation_handle, "Resp", "answer")
        tx.end_conversation(m.conversation_handle)
    pair.pump()
    t = endpoint_of(pair.b, m.conversation_handle)
    assert t["state"] == "CD"
    stamp = t["security_timestamp"]
    assert isinstance(stamp, dt.datetime)
    assert abs((stamp - pair.b.now()) - dt.timedelta(minutes=30)) < dt.timedelta(seconds=30)
    got = receive_all(pair.a, "q_i")
    assert got[0].text() == "answer" and got[1].is_end_dialog
    with pair.a.transaction() as tx:
        tx.end_conversation(h)
    pair.pump()
    assert endpoint_of(pair.a, h) == {}
    assert tq(pair.a) == [] and tq(pair.b) == []
    assert one(pair.b, "SELECT count(*) FROM broker.leaked_endpoints") == 0
    advance(pair.b, 31 * 60)
    assert worker(pair.b).run_once(transmit=False).endpoints_reclaimed == 1
    assert endpoint_of(pair.b, m.conversation_handle) == {}


def test_fire_and_forget_with_a_lifetime_is_reclaimed_after_it(pair: Pair) -> None:
    pair.routes()
    with pair.a.transaction() as tx:
        h = tx.begin_dialog("I", "T", "C", lifetime=3600)
        tx.send(h, "Req", "x")
        tx.end_conversation(h)
    pair.pump()
    got = receive_all(pair.b, "q_t")
    with pair.b.transaction() as tx:
        tx.end_conversation(got[0].conversation_handle)
    advance(pair.b, 3600 + 29 * 60)
    worker(pair.b).run_once(transmit=False)
    assert endpoint_of(pair.b, got[0].conversation_handle)["state"] == "CD"
    advance(pair.b, 2 * 60)
    assert worker(pair.b).run_once(transmit=False).endpoints_reclaimed == 1


def test_target_refusal_reaches_the_initiator_as_an_error(pair: Pair) -> None:
    # B's T does not accept contract DEFAULT.
    with pair.a.transaction() as tx:
        h = tx.begin_dialog("I", "T")
        tx.send(h, "DEFAULT", "x")
    pair.routes()
    # Sent before the route existed: the worker's retry finds the route, the transport
    # delivers.
    worker(pair.a).run_once(transmit=False)
    pair.pump()
    [error] = receive_all(pair.a, "q_i")
    assert error.error().code == -8408
    assert one(pair.b, "SELECT count(*) FROM broker.endpoints") == 0


def test_refusal_after_fire_and_forget_is_audited_not_lost(pair: Pair) -> None:
    pair.routes()
    with pair.a.transaction() as tx:
        h = tx.begin_dialog("I", "T")
        tx.send(h, "DEFAULT", "x")
        tx.end_conversation(h)
    pair.pump()
    assert endpoint_of(pair.a, h) == {}
    [(code, reason)] = rows(pair.a, "SELECT code, reason FROM broker.error_audit")
    assert code == -8408 and "ended" in reason


def test_target_side_validation_uses_the_far_brokers_message_types(pair: Pair) -> None:
    # At B, Req must be well-formed XML; at A it may be anything.
    with pair.b.transaction() as tx:
        tx.alter_message_type("Req", "WELL_FORMED_XML")
    pair.routes()
    h = pair.dialog()
    send(pair, h, "<ok/>", "not <xml")
    pair.pump()
    [error] = receive_all(pair.a, "q_i")
    assert error.error().code == -9615
    assert [m.text() for m in receive_all(pair.b, "q_t")] == ["<ok/>"]


def test_a_message_type_the_target_does_not_know_is_refused_with_8428(pair: Pair) -> None:
    with pair.a.transaction() as tx:
        tx.create_message_type("Extra")
        tx.create_contract("C2", {"Extra": "INITIATOR"})
    with pair.b.transaction() as tx:
        tx.create_message_type("Other")
        tx.create_contract("C2", {"Other": "INITIATOR"})
        tx.alter_service("T", add_contracts=["C2"])
    pair.routes()
    with pair.a.transaction() as tx:
        h = tx.begin_dialog("I", "T", "C2")
        tx.send(h, "Extra", "x")
    pair.pump()
    [error] = receive_all(pair.a, "q_i")
    assert error.error().code == -8428


def route_findings(broker: Broker) -> list[str]:
    from airflow_broker.admin.doctor import diagnose

    return [f"{f.severity} {f.subject}: {f.problem}" for f in diagnose(broker).findings
            if f.check == "routes"]


def test_doctor_checks_routes_in_both_directions(pair: Pair) -> None:
    pair.routes(back=False)
    h = pair.dialog()
    send(pair, h, "x")
    pair.pump()
    [forward] = route_findings(pair.a)
    assert forward.startswith("error route to_T") and "no route back to service 'I'" in forward
    backward = route_findings(pair.b)
    assert any(f.startswith("error I: conversations with this service in another broker have"
                            " no route to it") for f in backward)
    assert any(f.startswith("error I: 1 conversations cannot acknowledge") for f in backward)

    with pair.b.transaction() as tx:
        tx.create_route("to_I", pair.a_uri, service_name="I")
    advance(pair.a, 5)
    pair.pump()
    assert route_findings(pair.a) == []
    assert route_findings(pair.b) == []


def with_query(uri: str, query: str) -> str:
    """``uri`` with ``query`` added to its query string (a server on a Unix socket has one
    already, a server on TCP none)."""
    return uri + ("&" if "?" in uri else "?") + query


def test_doctor_reports_unreachable_brokers_and_misspelt_services(pair: Pair) -> None:
    with pair.a.transaction() as tx:
        tx.create_route("down", "postgresql://nobody@127.0.0.1:1/nowhere", service_name="X")
        tx.create_route("case", pair.b_uri, service_name="t")
        tx.create_route("schema", with_query(pair.b_uri, "broker_schema=elsewhere"),
                        service_name="T")
    found = route_findings(pair.a)
    assert any(f.startswith("error route down") and "unreachable" in f for f in found)
    assert any(f.startswith("error route case") and "has 'T'" in f for f in found)
    assert any(f.startswith("error route schema") and "no broker schema 'elsewhere'" in f
               for f in found)


def test_doctor_reports_a_copied_broker_instance(dsn: str, pair: Pair) -> None:
    from airflow_broker.worker.transport import address_of

    with pair.a.transaction() as tx:
        tx.create_route("to_self_copy", address_of(dsn), service_name="I")
    [found] = route_findings(pair.a)
    assert "this broker's own instance id" in found


@pytest.mark.parametrize(("kwargs", "number"), [
    ({"address": ""}, 9659),
    ({"address": "x" * 300}, 9660),
    ({"address": "TCP://server:4022"}, 9744),
    ({"address": "postgresql://h/db'; DROP TABLE broker.endpoints; --"}, 9744),
    ({"address": "TRANSPORT", "service_name": "T"}, 9745),
    ({"address": "LOCAL", "lifetime": 0}, 9746),
    ({"address": "LOCAL", "broker_instance": "abc"}, 9662),
    ({"address": "postgresql://h/a", "mirror_address": "postgresql://h/b",
      "service_name": "T"}, 9661),
    ({"address": "postgresql://h/a", "mirror_address": "postgresql://h/a",
      "service_name": "T", "broker_instance": "abc"}, 9747),
    ({"address": "LOCAL", "mirror_address": "postgresql://h/b", "service_name": "T",
      "broker_instance": "abc"}, 9743),
    ({"address": "LOCAL", "service_name": ""}, 1038),
])
def test_create_route_rejects_bad_settings(pair: Pair, kwargs: dict[str, Any],
                                           number: int) -> None:
    before = snapshot(pair.a)
    routes_before = rows(pair.a, "SELECT * FROM broker.routes ORDER BY route_id")
    with pytest.raises(BrokerError) as err, pair.a.transaction() as tx:
        tx.create_route("r", **kwargs)
    assert err.value.number == number
    assert snapshot(pair.a) == before
    assert rows(pair.a, "SELECT * FROM broker.routes ORDER BY route_id") == routes_before


def test_routes_catalog_create_alter_drop(pair: Pair) -> None:
    with pair.a.transaction() as tx:
        route_id = tx.create_route("r", pair.b_uri, service_name="T", lifetime=60)
    with pytest.raises(BrokerError) as exists, pair.a.transaction() as tx:
        tx.create_route("r", "LOCAL")
    assert exists.value.number == 2714
    assert route_id > 65536  # AutoCreatedLocal is 65536
    [(name, service, instance, address)] = rows(
        pair.a, "SELECT name, remote_service_name, broker_instance, address FROM broker.routes"
                " WHERE name = 'r'")
    assert (name, service, instance, address) == ("r", "T", None, pair.b_uri)
    assert one(pair.a, "SELECT address FROM broker.routes"
                       " WHERE name = 'AutoCreatedLocal'") == "LOCAL"

    # An expired route is ignored, not deleted; ALTER ROUTE revives it.
    advance(pair.a, 61)
    assert one(pair.a, "SELECT broker.route_address('T', NULL)") == "LOCAL"
    with pair.a.transaction() as tx:
        tx.alter_route("r", lifetime=3600, service_name="")
    assert rows(pair.a, "SELECT remote_service_name FROM broker.routes WHERE name = 'r'") == [
        (None,)]
    with pair.a.transaction() as tx:
        tx.drop_route("AutoCreatedLocal")
        tx.drop_route("r")
    with pytest.raises(BrokerError) as missing, pair.a.transaction() as tx:
        tx.drop_route("r")
    assert missing.value.number == 15151


def test_transport_address_service_names_need_a_transport_route(pair: Pair) -> None:
    with pair.b.transaction() as tx:
        tx.create_service(pair.b_uri, "q_t", ["C"])
    pair.routes(forward=False)
    with pair.a.transaction() as tx:
        h = tx.begin_dialog("I", pair.b_uri, "C")
        tx.send(h, "Req", "by address")
    assert "could not be found" in tq(pair.a)[0][8]
    with pair.a.transaction() as tx:
        tx.create_route("transport", "TRANSPORT")
    worker(pair.a).run_once(transmit=False)
    pair.pump()
    assert [m.text() for m in receive_all(pair.b, "q_t")] == ["by address"]


def test_send_many_to_a_remote_peer_waits_behind_the_conversations_back_off(pair: Pair) -> None:
    with pair.a.transaction() as tx:
        tx.create_route("to_T", "postgresql://nobody@127.0.0.1:1/nowhere", service_name="T")
    h = pair.dialog()
    send(pair, h, "first")
    pair.ta.step()  # unreachable: the conversation backs off
    with pair.a.transaction() as tx:
        tx.send_many(h, "Req", ["a", "b", "c"])
    waiting = rows(pair.a, "SELECT message_sequence_number, next_attempt_at, transmission_status"
                           " FROM broker.transmission_queue ORDER BY 1")
    assert [w[0] for w in waiting] == [0, 1, 2, 3]
    assert len({(w[1], w[2]) for w in waiting}) == 1  # one schedule, one status
    assert pair.ta.step().sent == 0
    with pair.a.transaction() as tx:
        tx.alter_route("to_T", address=pair.b_uri)
    pair.routes(forward=False)
    pair.pump()
    arrived = receive_all(pair.b, "q_t")
    assert [m.text() for m in arrived] == ["first", "a", "b", "c"]
    assert len({m.message_id for m in arrived}) == 4


def test_a_far_broker_that_hangs_times_out_and_is_retried(pair: Pair) -> None:
    import psycopg

    from airflow_broker.worker.transport import Transport

    pair.routes()
    send(pair, pair.dialog(), "x")
    impatient = Transport(pair.a, statement_timeout=1.0)
    pair.transports.append(impatient)
    with psycopg.connect(pair.b.dsn) as blocker:
        blocker.execute("LOCK TABLE broker.endpoints IN ACCESS EXCLUSIVE MODE")
        result = impatient.step()
        assert result.held == 1
    assert "statement timeout" in tq(pair.a)[0][8]
    advance(pair.a, 5)
    assert impatient.step().acknowledged == 1


def test_route_addresses_carry_connection_options(pair: Pair) -> None:
    from psycopg.conninfo import conninfo_to_dict

    from airflow_broker.worker.transport import resolve_address

    address = with_query(pair.b_uri, "options=-c%20synchronous_commit%3Doff&broker_schema=broker")
    far = resolve_address(address)
    assert far.schema == "broker"
    assert conninfo_to_dict(far.dsn)["options"] == "-c synchronous_commit=off"
    with pair.a.transaction() as tx:
        tx.create_route("to_T", address, service_name="T")
    pair.routes(forward=False)
    send(pair, pair.dialog(), "x")
    assert pair.ta.step().acknowledged == 1


def test_the_worker_delivers_each_send_when_it_commits_not_at_its_interval(pair: Pair) -> None:
    import threading
    import time

    from airflow_broker.worker import BrokerWorker

    pair.routes()
    h = pair.dialog()
    # An interval far longer than the test may wait: only the NOTIFY of each SEND's commit
    # can have the transport deliver in time.
    running = BrokerWorker(pair.a, activation=False, interval=3600)
    thread = threading.Thread(target=running.run, kwargs={"handle_signals": False})
    thread.start()
    try:
        for burst in range(3):
            for i in range(20):
                with pair.a.transaction() as tx:
                    tx.send(h, "Req", f"{burst}:{i}")
            deadline = time.monotonic() + 30
            while one(pair.b, "SELECT count(*) FROM broker.queue_messages") < 20 * (burst + 1):
                assert time.monotonic() < deadline, "the transport did not wake up"
                time.sleep(0.05)
    finally:
        running.stop()
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert [m.text() for m in receive_all(pair.b, "q_t")] == [
        f"{b}:{i}" for b in range(3) for i in range(20)]


def test_a_sender_routes_messages_without_reading_route_addresses(pair: Pair) -> None:
    """A route's address may carry a password: SEND learns only whether a service is local or
    remote (route_address, run with its owner's rights), so a sender needs no right to read
    route_defs or the routes view, and has none here."""
    pair.routes()
    with roles.role(pair.a.dsn, *roles.APPLICATION_GRANTS,
                    "REVOKE ALL ON broker.route_defs, broker.routes FROM {}",
                    prefix="sender") as role, Broker(pair.a.dsn, role=role) as sender:
        with sender.transaction() as tx:
            handle = tx.begin_dialog("I", "T", "C")
            tx.send(handle, "Req", "<order id='1'/>")
        with pytest.raises(psycopg.errors.InsufficientPrivilege), \
                psycopg.connect(pair.a.dsn) as conn:
            conn.execute(f"SET ROLE {role}")
            conn.execute("SELECT address FROM broker.route_defs")
        # Held for the transport, which delivers it.
        assert [w[:3] for w in tq(pair.a)] == [("T", "I", "C")]
        assert pair.ta.step().acknowledged == 1
        assert [m.text() for m in receive_all(pair.b, "q_t")] == ["<order id='1'/>"]


def test_a_backlog_is_delivered_in_growing_steps_unless_its_bodies_are_large(
        pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    pair.routes()
    h = pair.dialog()
    with pair.a.transaction() as tx:
        tx.send_many(h, "Req", [f"<m n='{n}'/>" for n in range(150)])
    stepper = Transport(pair.a, batch_size=10)
    pair.transports.append(stepper)
    # Steps of 10, 20, 40 and 80 messages: the whole backlog in four (steps of 10 only: 40).
    assert stepper.run_until_idle(limit=4).sent == 150
    assert tq(pair.a) == []
    assert [m.text() for m in receive_all(pair.b, "q_t")] == [
        f"<m n='{n}'/>" for n in range(150)]

    # A full step whose bodies reach GROWTH_BYTES does not make the next one larger.
    monkeypatch.setattr(transport, "GROWTH_BYTES", 100)
    with pair.a.transaction() as tx:
        tx.send_many(h, "Req", [f"<m n='{n}'/>" for n in range(150, 180)])
    assert stepper.run_until_idle(limit=2).sent == 20
    assert stepper.run_until_idle().sent == 10
    assert [m.text() for m in receive_all(pair.b, "q_t")] == [
        f"<m n='{n}'/>" for n in range(150, 180)]


def test_acknowledging_an_in_order_run_looks_each_message_up_once(pair: Pair) -> None:
    # The far broker's answers to 500 in-order messages of an acknowledged conversation take
    # them out of the transmission queue in one statement, which finds each by its id (through
    # the index, or with a hash join); a second lookup per message, each finding it gone, cost
    # the sender more than the removal.
    h = delivered_dialog(pair, "first")
    with pair.a.transaction() as tx:
        tx.send_many(h, "Req", [f"<m n='{n}'/>" for n in range(500)])
    scans = ("SELECT idx_scan FROM pg_stat_xact_user_tables"
             " WHERE schemaname = 'broker' AND relname = 'transmissions'")
    with psycopg.connect(pair.a.dsn) as conn:
        ids = [r[0] for r in conn.execute(
            "SELECT transmission_id FROM broker.transmissions ORDER BY transmission_id")]
        before = conn.execute(scans).fetchone()
        acked = conn.execute(
            "SELECT broker.apply_transmission_outcomes(%s, %s, %s, %s, %s, %s, %s)",
            [ids, ["ack"] * 500, [None] * 500, [None] * 500, [None] * 500, [False] * 500,
             str(pair.b.broker_instance)]).fetchone()
        after = conn.execute(scans).fetchone()
        conn.commit()
    assert len(ids) == 500 and acked == (500,)
    assert tq(pair.a) == []
    assert before is not None and after is not None and after[0] - before[0] <= 500
