"""END CONVERSATION, the endpoint state machine, timers, lifetimes, MOVE, RETENTION, disabled
queues and endpoint reclaim (spec 11-17, 28.4-28.5)."""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from airflow_broker import DIALOG_TIMER, END_DIALOG, ERROR, Broker, BrokerError
from airflow_broker.worker import BrokerWorker
from tests.support.brokers import App
from tests.support.helpers import backend_waits_for_lock, count, endpoint, snapshot, wait_until

MINUTE = dt.timedelta(minutes=1)


def target_of(broker: Broker, initiator: uuid.UUID) -> uuid.UUID:
    with psycopg.connect(broker.dsn) as conn:
        row = conn.execute(
            """SELECT t.conversation_handle FROM broker.endpoints t
                 JOIN broker.endpoints i USING (conversation_id)
                WHERE i.conversation_handle = %s AND NOT t.is_initiator""", [initiator]
        ).fetchone()
    assert row is not None
    handle: uuid.UUID = row[0]
    return handle


def open_dialog(app: App, *bodies: str, lifetime: int | None = None) -> tuple[uuid.UUID, uuid.UUID]:
    """A dialog whose message 0 has reached the target (in a committed transaction)."""
    handle = app.dialog() if lifetime is None else app.dialog(lifetime=lifetime)
    with app.broker.transaction() as tx:
        for body in bodies or ("request",):
            tx.send(handle, "Req", body)
    return handle, target_of(app.broker, handle)


def worker(broker: Broker) -> BrokerWorker:
    return BrokerWorker(broker, batch_size=100)


def types(messages: list) -> list[str]:  # type: ignore[type-arg]
    return [m.message_type_name for m in messages]


def test_T_END_01_target_ends_first(app: App) -> None:
    initiator, target = open_dialog(app, "q1", "q2")
    with app.broker.transaction() as tx:
        requests = tx.receive("q_t")
        tx.send(target, "Resp", "answer")
        tx.end_conversation(target)
    assert [m.text() for m in requests] == ["q1", "q2"]
    t = endpoint(app.broker, target)
    assert t is not None and t["state"] == "CD"
    assert endpoint(app.broker, initiator)["state"] == "DI"  # type: ignore[index]
    with pytest.raises(BrokerError) as late, app.broker.transaction() as tx:
        tx.send(initiator, "Req", "too late")
    assert late.value.number == 8429
    with app.broker.transaction() as tx:
        replies = tx.receive("q_i")
        assert types(replies) == ["Resp", END_DIALOG]  # EndDialog after the earlier message
        tx.end_conversation(initiator)
    assert endpoint(app.broker, initiator) is None  # initiators go at once
    t = endpoint(app.broker, target)
    assert t is not None and t["state"] == "CD"
    expected = app.broker.now() + 30 * MINUTE
    assert abs(t["security_timestamp"] - expected) < MINUTE
    w = worker(app.broker)
    assert w.run_once().endpoints_reclaimed == 0
    app.broker.advance_clock(31 * MINUTE)
    assert w.run_once().endpoints_reclaimed == 1
    assert count(app.broker, "SELECT count(*) FROM broker.endpoints") == 0
    assert count(app.broker, "SELECT count(*) FROM broker.dialog_groups") == 0


def test_T_END_02_end_with_error(app: App) -> None:
    initiator, target = open_dialog(app, "m0")
    with app.broker.transaction() as tx:
        tx.send(initiator, "Req", "unreceived by the initiator's own side")
        tx.end_conversation(initiator, error=1234, description="x <&> y")
    with app.broker.transaction() as tx:
        received = tx.receive("q_t")
    assert types(received) == [ERROR, "Req", "Req"]  # the Error comes first
    error = received[0]
    doc = error.xml()
    assert doc is not None
    assert doc.tag == "{http://schemas.microsoft.com/SQL/ServiceBroker/Error}Error"
    assert error.message_body is not None and error.message_body.startswith(b"\xff\xfe")
    assert (error.error().code, error.error().description) == (1234, "x <&> y")
    assert endpoint(app.broker, target)["state"] == "ER"  # type: ignore[index]
    with pytest.raises(BrokerError) as after_error, app.broker.transaction() as tx:
        tx.send(target, "Resp", "no")
    assert after_error.value.number == 8429
    with app.broker.transaction() as tx:
        tx.end_conversation(target)
    assert endpoint(app.broker, target)["state"] == "CD"  # type: ignore[index]


def test_T_END_02_end_removes_the_ending_sides_unreceived_messages(app: App) -> None:
    """The common END (an open dialog, the peer in this broker) purges in its one statement
    the messages of the conversation still on the ending side's queue; the peer gets its
    EndDialog and the other conversation's message stays."""
    handle, other = app.dialog(), app.dialog()
    with app.broker.transaction() as tx:
        tx.send(handle, "Req", b"received")
        tx.send(handle, "Req", b"never received")
        tx.send(other, "Req", b"another conversation")
    with app.broker.transaction() as tx:
        first = tx.receive("q_t", top=1)
        assert [m.message_body for m in first] == [b"received"]
        tx.end_conversation(first[0].conversation_handle)
    with app.broker.transaction() as tx:
        left = tx.receive("q_t")
        at_initiator = tx.receive("q_i")
    assert [m.message_body for m in left] == [b"another conversation"]
    assert [m.message_type_name for m in at_initiator] == [END_DIALOG]
    assert at_initiator[0].conversation_handle == handle


@pytest.mark.parametrize(
    ("kwargs", "number"),
    [({"error": 0, "description": "x"}, 50109), ({"error": -5, "description": "x"}, 50109),
     ({"error": 1, "description": None}, 8424), ({"error": None, "description": "x"}, 8422),
     ({"error": 1, "description": "d" * 3001}, 50106)],
)
def test_T_END_04_bad_end_with_error(app: App, kwargs: dict[str, object], number: int) -> None:
    initiator, _ = open_dialog(app)
    before = snapshot(app.broker)
    with pytest.raises(BrokerError) as exc, app.broker.transaction() as tx:
        tx.end_conversation(initiator, **kwargs)  # type: ignore[arg-type]
    assert exc.value.number == number
    assert snapshot(app.broker) == before


def test_T_END_04_end_in_wrong_state(app: App) -> None:
    initiator, target = open_dialog(app)
    with app.broker.transaction() as tx:
        tx.end_conversation(target)
    before = snapshot(app.broker)
    with pytest.raises(BrokerError) as closed, app.broker.transaction() as tx:
        tx.end_conversation(target)
    assert closed.value.number == 8427 and "'CD'" in str(closed.value)
    with pytest.raises(BrokerError) as unknown, app.broker.transaction() as tx:
        tx.end_conversation(uuid.uuid4())
    assert unknown.value.number == 8426
    assert snapshot(app.broker) == before
    with app.broker.transaction() as tx:
        tx.end_conversation(initiator)  # DI -> gone


def test_T_END_03_with_cleanup(app: App) -> None:
    initiator, target = open_dialog(app, "a", "b")
    with app.broker.transaction() as tx:
        tx.send(target, "Resp", "waits in q_i")
        tx.alter_queue("q_t", status=False)
    with app.broker.transaction() as tx:
        tx.send(initiator, "Req", "waits in the transmission queue")
    assert count(app.broker, "SELECT count(*) FROM broker.transmission_queue") == 1
    with app.broker.transaction() as tx:
        tx.end_conversation(initiator, cleanup=True)
    assert endpoint(app.broker, initiator) is None
    assert count(app.broker, "SELECT count(*) FROM broker.transmission_queue") == 0
    assert count(app.broker, "SELECT count(*) FROM public.q_i") == 0
    # The peer was never told.
    assert endpoint(app.broker, target)["state"] == "CO"  # type: ignore[index]
    assert count(app.broker, """SELECT count(*) FROM broker.queue_messages
                                WHERE message_type_id IN (1, 2)""") == 0
    with psycopg.connect(app.broker.dsn) as conn:
        (log,) = conn.execute("SELECT state, queued_messages, pending_messages, service_name"
                              " FROM broker.cleanup_log").fetchall()
    assert log == ("CO", 1, 1, "I")
    # The peer learns only when it tries to send: the endpoint is gone (-8462).
    with app.broker.transaction() as tx:
        tx.alter_queue("q_t", status=True)
        tx.send(target, "Resp", "to nobody")
    with app.broker.transaction() as tx:
        at_target = tx.receive("q_t")
    assert types(at_target) == [ERROR, "Req", "Req"]
    assert at_target[0].error().code == -8462
    # WITH CLEANUP also removes a CLOSED target endpoint (the leak remedy).
    with app.broker.transaction() as tx:
        tx.end_conversation(target)
        tx.end_conversation(target, cleanup=True)
    assert endpoint(app.broker, target) is None


def test_T_RC_08_system_message_precedence(app: App) -> None:
    initiator, target = open_dialog(app, "M0", "M1", "M2")
    with app.broker.transaction() as tx:
        tx.begin_conversation_timer(target, 30)
    with app.broker.transaction() as tx:
        tx.end_conversation(initiator, error=77, description="peer failed")
    app.broker.advance_clock(31 * dt.timedelta(seconds=1))
    assert worker(app.broker).run_once().timers_fired == 1
    with app.broker.transaction() as tx:
        received = tx.receive("q_t")
    assert types(received) == [DIALOG_TIMER, ERROR, "Req", "Req", "Req"]
    assert [m.text() for m in received[2:]] == ["M0", "M1", "M2"]


def test_T_RC_08_end_dialog_comes_in_sequence(app: App) -> None:
    initiator, _ = open_dialog(app, "M0", "M1", "M2")
    with app.broker.transaction() as tx:
        tx.end_conversation(initiator)
    with app.broker.transaction() as tx:
        received = tx.receive("q_t")
    assert types(received) == ["Req", "Req", "Req", END_DIALOG]
    assert [m.message_sequence_number for m in received] == [0, 1, 2, 3]


def test_later_initiator_messages_carry_the_message_0_acknowledged_flag(app: App) -> None:
    """Spec 15.1 and 21.4: after message 0 was acknowledged, every initiator transmission
    carries the flag, so the target's replay protection starts with the first of them, not
    only when the initiator ends or hears from the target."""
    with app.broker.transaction() as tx:
        initiator = tx.begin_dialog("I", "T", "C")
        tx.send(initiator, "Req", "message 0")
        tx.send(initiator, "Req", "message 1, before the acknowledgement")
    with app.broker.transaction() as tx:
        target = tx.receive("q_t", 1)[0].conversation_handle  # (RECEIVE sets no flag)
    t = endpoint(app.broker, target)
    assert t is not None and t["security_timestamp"] == dt.datetime(1900, 1, 1)
    with app.broker.transaction() as tx:
        tx.send(initiator, "Req", "message 2")
    flagged = app.broker.now() + 30 * MINUTE
    t = endpoint(app.broker, target)
    assert t is not None and t["state"] == "CO"
    assert abs(t["security_timestamp"] - flagged) < MINUTE
    # Counted from the first flagged message, also once the target ends ten minutes later.
    app.broker.advance_clock(10 * MINUTE)
    with app.broker.transaction() as tx:
        tx.receive("q_t")
        tx.end_conversation(target)
    t = endpoint(app.broker, target)
    assert t is not None and t["state"] == "CD"
    assert abs(t["security_timestamp"] - flagged) < MINUTE
    w = worker(app.broker)
    app.broker.advance_clock(21 * MINUTE)  # 31 minutes after the flag, 21 after the END
    assert w.run_once().endpoints_reclaimed == 1
    assert endpoint(app.broker, target) is None


def test_T_LC_01_fire_and_forget_leaks(app: App, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING), app.broker.transaction() as tx:
        handle = tx.begin_dialog("I", "T", "C")
        tx.send(handle, "Req", "fire")
        tx.end_conversation(handle)
    assert "fire-and-forget" in caplog.text
    assert endpoint(app.broker, handle) is None
    with app.broker.transaction() as tx:
        received = tx.receive("q_t")
        assert types(received) == ["Req", END_DIALOG]
        tx.end_conversation(received[0].conversation_handle)
    target = received[0].conversation_handle
    t = endpoint(app.broker, target)
    assert t is not None and t["state"] == "CD"
    assert t["security_timestamp"] == dt.datetime(1900, 1, 1)
    assert t["lifetime"] > app.broker.now() + dt.timedelta(days=365 * 60)
    w = worker(app.broker)
    for step in (31 * MINUTE, dt.timedelta(days=1)):
        app.broker.advance_clock(step)
        w.run_once()
        assert endpoint(app.broker, target) is not None
    with psycopg.connect(app.broker.dsn) as conn:
        leaks = conn.execute("SELECT conversation_handle FROM broker.leaked_endpoints").fetchall()
        per_service = conn.execute("SELECT service_name, far_service, leaked"
                                   " FROM broker.leaked_endpoint_counts").fetchall()
    assert leaks == [(target,)]
    assert per_service == [("T", "I", 1)]


def test_T_LC_01_lifetime_reclaims_the_leak(app: App) -> None:
    with app.broker.transaction() as tx:
        handle = tx.begin_dialog("I", "T", "C", lifetime=60)
        tx.send(handle, "Req", "fire")
        tx.end_conversation(handle)
    with app.broker.transaction() as tx:
        target = tx.receive("q_t")[0].conversation_handle
        tx.end_conversation(target)
    w = worker(app.broker)
    app.broker.advance_clock(60 * dt.timedelta(seconds=1) + 29 * MINUTE)
    w.run_once()
    assert endpoint(app.broker, target) is not None  # not before lifetime + 30 minutes
    assert count(app.broker, "SELECT count(*) FROM broker.leaked_endpoints") == 0
    app.broker.advance_clock(2 * MINUTE)
    assert w.run_once().endpoints_reclaimed == 1
    assert endpoint(app.broker, target) is None


def test_T_LC_04_fire_and_forget_error_is_swallowed_but_audited(app: App) -> None:
    with app.broker.transaction() as tx:
        tx.create_queue("q_x")
        tx.create_service("NoContracts", "q_x")
        handle = tx.begin_dialog("I", "NoContracts", "C")
        tx.send(handle, "Req", "refused with -8408")
        tx.end_conversation(handle)
    assert endpoint(app.broker, handle) is None
    with app.broker.transaction() as tx:
        assert tx.receive("q_i") == []
    with psycopg.connect(app.broker.dsn) as conn:
        audit = conn.execute("SELECT conversation_handle, service_name, far_service, code,"
                             " description FROM broker.error_audit").fetchall()
    assert len(audit) == 1
    assert audit[0][:4] == (handle, "I", "NoContracts", -8408)
    assert "does not support contract 'C'" in audit[0][4]


def test_T_LT_01_lifetime_expiry(app: App) -> None:
    initiator, target = open_dialog(app, "before expiry", lifetime=60)
    app.broker.advance_clock(61 * dt.timedelta(seconds=1))
    assert worker(app.broker).run_once().lifetimes_expired == 2
    for handle in (initiator, target):
        assert endpoint(app.broker, handle)["state"] == "ER"  # type: ignore[index]
    with app.broker.transaction() as tx:
        at_target = tx.receive("q_t")
        at_initiator = tx.receive("q_i")
    assert types(at_target) == [ERROR, "Req"]  # the earlier message stays receivable
    assert at_target[0].error().code == -8489
    assert [m.error().code for m in at_initiator] == [-8489]
    with pytest.raises(BrokerError) as exc, app.broker.transaction() as tx:
        tx.send(initiator, "Req", "after expiry")
    assert exc.value.number == 8429
    # The broker never ends a dialog itself.
    assert count(app.broker, "SELECT count(*) FROM broker.endpoints") == 2
    with app.broker.transaction() as tx:
        tx.end_conversation(initiator)
        tx.end_conversation(target)
    assert endpoint(app.broker, initiator) is None


def test_T_TM_01_conversation_timer(app: App) -> None:
    initiator, _target = open_dialog(app)
    with app.broker.transaction() as tx:
        due = tx.begin_conversation_timer(initiator, 30)
    assert abs(due - (app.broker.now() + dt.timedelta(seconds=30))) < dt.timedelta(seconds=5)
    assert endpoint(app.broker, initiator)["dialog_timer"] == due  # type: ignore[index]
    w = worker(app.broker)
    app.broker.advance_clock(dt.timedelta(seconds=20))
    with app.broker.transaction() as tx:
        later = tx.begin_conversation_timer(initiator, 60)  # replaces the deadline
    app.broker.advance_clock(dt.timedelta(seconds=20))
    assert w.run_once().timers_fired == 0
    app.broker.advance_clock(dt.timedelta(seconds=41))
    assert w.run_once().timers_fired == 1
    assert w.run_once().timers_fired == 0  # once
    with app.broker.transaction() as tx:
        (timer,) = tx.receive("q_i")
        assert types(tx.receive("q_t")) == ["Req"]  # the peer's queue got no timer
    assert timer.message_type_name == DIALOG_TIMER and timer.message_body is None
    assert timer.conversation_handle == initiator
    assert endpoint(app.broker, initiator)["dialog_timer"] == dt.datetime(1900, 1, 1)  # type: ignore[index]
    assert later > due
    # Not past the lifetime; not on an ended endpoint; END cancels a pending timer.
    short, short_target = open_dialog(app, lifetime=100)
    with pytest.raises(BrokerError) as beyond, app.broker.transaction() as tx:
        tx.begin_conversation_timer(short, 101)
    assert beyond.value.number == 8410
    with app.broker.transaction() as tx:
        tx.begin_conversation_timer(short_target, 10)
        tx.end_conversation(short_target)
    with pytest.raises(BrokerError) as ended, app.broker.transaction() as tx:
        tx.begin_conversation_timer(short_target, 10)
    assert ended.value.number == 8458
    app.broker.advance_clock(dt.timedelta(seconds=11))
    assert w.run_once().timers_fired == 0
    for bad in (0, -1):
        with pytest.raises(BrokerError) as invalid, app.broker.transaction() as tx:
            tx.begin_conversation_timer(initiator, bad)
        assert invalid.value.number == 50106


def test_T_TM_01_timer_fires_on_the_local_queue_only(app: App) -> None:
    _initiator, target = open_dialog(app)
    with app.broker.transaction() as tx:
        tx.receive("q_t")
        tx.begin_conversation_timer(target, 5)
    app.broker.advance_clock(dt.timedelta(seconds=6))
    worker(app.broker).run_once()
    with app.broker.transaction() as tx:
        assert types(tx.receive("q_t")) == [DIALOG_TIMER]
        assert tx.receive("q_i") == []


def test_T_MV_01_move_conversation(app: App) -> None:
    d1, _ = open_dialog(app)
    d2, _ = open_dialog(app)
    with app.broker.transaction() as tx:
        for target in (target_of(app.broker, d1), target_of(app.broker, d2)):
            tx.send(target, "Resp", f"reply on {target}")
    g1 = endpoint(app.broker, d1)["conversation_group_id"]  # type: ignore[index]
    g2 = endpoint(app.broker, d2)["conversation_group_id"]  # type: ignore[index]
    with app.broker.transaction() as tx:
        tx.move_conversation(d2, g1)
    assert endpoint(app.broker, d2)["conversation_group_id"] == g1  # type: ignore[index]
    assert count(app.broker, "SELECT count(*) FROM broker.dialog_groups"
                             " WHERE conversation_group_id = %s", (g2,)) == 0
    with app.broker.transaction() as tx:
        moved = tx.receive("q_i", conversation_group_id=g1)
    assert {m.conversation_handle for m in moved} == {d1, d2}
    assert {m.conversation_group_id for m in moved} == {g1}
    # Into a group of another service: 8439; an ended endpoint: 8438.
    target_group = endpoint(app.broker, target_of(app.broker, d1))["conversation_group_id"]  # type: ignore[index]
    before = snapshot(app.broker)
    with pytest.raises(BrokerError) as other, app.broker.transaction() as tx:
        tx.move_conversation(d1, target_group)
    assert other.value.number == 8439
    assert snapshot(app.broker) == before
    t1 = target_of(app.broker, d1)
    with app.broker.transaction() as tx:
        tx.end_conversation(t1)
    with pytest.raises(BrokerError) as ended, app.broker.transaction() as tx:
        tx.move_conversation(t1, uuid.uuid4())
    assert ended.value.number == 8438
    # A new group id becomes a group of this service.
    fresh = uuid.uuid4()
    with app.broker.transaction() as tx:
        tx.move_conversation(d2, fresh)
    assert endpoint(app.broker, d2)["conversation_group_id"] == fresh  # type: ignore[index]


def test_T_MV_01_move_locks_both_groups(app: App) -> None:
    d1, _ = open_dialog(app)
    d2, _ = open_dialog(app)
    with app.broker.transaction() as tx:
        for d in (d1, d2):
            tx.send(target_of(app.broker, d), "Resp", "r")
    g1 = endpoint(app.broker, d1)["conversation_group_id"]  # type: ignore[index]
    with psycopg.connect(app.broker.dsn) as conn:
        app.broker.session(conn).move_conversation(d2, g1)
        with app.broker.transaction() as tx:
            assert tx.get_conversation_group("q_i") is None  # both groups are held
        conn.commit()


def test_T_MV_01_move_waits_for_a_message_on_its_way(app: App) -> None:
    # The target replies on d2 and has not committed when d2 moves into d1's group: the reply
    # must arrive in the new group. It used to keep the old group, which the move deleted, and
    # no RECEIVE found it again.
    d1, _ = open_dialog(app)
    d2, _ = open_dialog(app)
    g1 = endpoint(app.broker, d1)["conversation_group_id"]  # type: ignore[index]
    with psycopg.connect(app.broker.dsn) as sender, ThreadPoolExecutor(1) as pool:
        app.broker.session(sender).send(target_of(app.broker, d2), "Resp", "on its way")
        with psycopg.connect(app.broker.dsn) as mover:
            pid = mover.info.backend_pid
            moving = pool.submit(app.broker.session(mover).move_conversation, d2, g1)
            wait_until(lambda: backend_waits_for_lock(app.broker, pid), "MOVE waiting")
            sender.commit()
            moving.result(timeout=30)
            mover.commit()
    with app.broker.transaction() as tx:
        arrived = tx.receive("q_i")
    assert [(m.text(), m.conversation_group_id) for m in arrived] == [("on its way", g1)]


def test_T_Q_04_disabled_queue_holds_messages_in_order(app: App) -> None:
    initiator, _target = open_dialog(app)
    with app.broker.transaction() as tx:
        assert len(tx.receive("q_t")) == 1
        tx.alter_queue("q_t", status=False)
    with app.broker.transaction() as tx:
        for i in range(3):
            tx.send(initiator, "Req", f"held {i}")
    with pytest.raises(BrokerError) as by_receive, app.broker.transaction() as tx:
        tx.receive("q_t")
    with pytest.raises(BrokerError) as by_group, app.broker.transaction() as tx:
        tx.get_conversation_group("q_t")
    assert by_receive.value.number == by_group.value.number == 9617
    with psycopg.connect(app.broker.dsn) as conn:
        held = conn.execute("SELECT message_sequence_number, transmission_status"
                            " FROM broker.transmission_queue").fetchall()
        flags = conn.execute("SELECT is_receive_enabled, is_enqueue_enabled"
                             " FROM broker.service_queues WHERE name = 'q_t'").fetchone()
    assert [seq for seq, _ in held] == [1, 2, 3]
    assert all("disabled" in status for _, status in held)
    assert flags == (False, False)
    assert count(app.broker, "SELECT count(*) FROM broker.queue_messages WHERE queue_id ="
                             " (SELECT object_id FROM broker.queues WHERE name = 'q_t')") == 0
    with app.broker.transaction() as tx:
        tx.alter_queue("q_t", status=True)
    with app.broker.transaction() as tx:
        delivered = tx.receive("q_t")
    assert [m.text() for m in delivered] == ["held 0", "held 1", "held 2"]
    assert [m.message_sequence_number for m in delivered] == [1, 2, 3]
    assert count(app.broker, "SELECT count(*) FROM broker.transmission_queue") == 0


def test_T_Q_04_end_waits_behind_held_messages(app: App) -> None:
    initiator, _target = open_dialog(app)
    with app.broker.transaction() as tx:
        tx.alter_queue("q_t", status=False)
        tx.send(initiator, "Req", "held")
        tx.end_conversation(initiator)
    assert endpoint(app.broker, initiator)["state"] == "DO"  # type: ignore[index]
    with app.broker.transaction() as tx:
        tx.alter_queue("q_t", status=True)
    assert endpoint(app.broker, initiator) is None
    with app.broker.transaction() as tx:
        assert types(tx.receive("q_t")) == ["Req", "Req", END_DIALOG]


def test_T_Q_05_retention(app: App) -> None:
    with app.broker.transaction() as tx:
        tx.alter_queue("q_t", retention=True)
    _initiator, target = open_dialog(app, "kept")
    with app.broker.transaction() as tx:
        (_message,) = tx.receive("q_t")
        tx.send(target, "Resp", "reply")
    with app.broker.transaction() as tx:
        assert tx.receive("q_t") == []  # never twice, never the sent copy
    with psycopg.connect(app.broker.dsn) as conn:
        rows = conn.execute("SELECT status, message_body FROM public.q_t"
                            " ORDER BY queuing_order").fetchall()
    assert rows == [(0, b"kept"), (3, b"reply")]
    with app.broker.transaction() as tx:
        tx.alter_queue("q_t", status=False)
    with pytest.raises(BrokerError) as exc, app.broker.transaction() as tx:
        tx.send(target, "Resp", "refused")
    assert exc.value.number == 9618
    with app.broker.transaction() as tx:
        tx.alter_queue("q_t", status=True)
        tx.end_conversation(target)
    assert count(app.broker, "SELECT count(*) FROM public.q_t") == 0


def test_T_RC_09_queue_status_column(app: App) -> None:
    with app.broker.transaction() as tx:
        tx.alter_queue("q_i", retention=True)
    _initiator, _ = open_dialog(app, "one", "two")
    with app.broker.transaction() as tx:
        tx.receive("q_t", 1)
    with psycopg.connect(app.broker.dsn) as conn:
        at_target = conn.execute("SELECT status FROM public.q_t").fetchall()
        at_initiator = conn.execute("SELECT status FROM public.q_i").fetchall()
    assert at_target == [(1,)]
    assert sorted(at_initiator) == [(3,), (3,)]
