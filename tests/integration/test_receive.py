"""RECEIVE, WAITFOR, GET CONVERSATION GROUP and conversation-group locks (spec 8-10, 28.3)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from airflow_broker import Broker, BrokerError, Message, QueueDisabledError
from airflow_broker.messages import RECEIVED_COLUMNS
from tests.support.brokers import App
from tests.support.helpers import backend_waits_for_lock, count, snapshot, target_handle, wait_until


@contextmanager
def open_transaction(broker: Broker) -> Iterator[Any]:
    """A transaction on its own connection that the test commits or rolls back itself."""
    with psycopg.connect(broker.dsn) as conn:
        yield conn, broker.session(conn)


def send(broker: Broker, handle: uuid.UUID, *bodies: str, message_type: str = "Req") -> None:
    with broker.transaction() as tx:
        for body in bodies:
            tx.send(handle, message_type, body)


def test_T_RC_01_exactly_once_in_order(app: App) -> None:
    d1, d2 = app.dialog(), app.dialog()
    for batch in range(10):
        with app.broker.transaction() as tx:
            for i in range(10):
                tx.send(d1, "Req", f"d1-{batch * 10 + i}")
                tx.send(d2, "Req", f"d2-{batch * 10 + i}")
    t1 = target_handle(app.broker, d1)
    received: list[Message] = []
    while True:
        with app.broker.transaction() as tx:
            batch_of_seven = tx.receive("q_t", 7, conversation_handle=t1)
        if not batch_of_seven:
            break
        assert len(batch_of_seven) <= 7
        received.extend(batch_of_seven)
    assert [m.message_sequence_number for m in received] == list(range(100))
    assert [m.text() for m in received] == [f"d1-{i}" for i in range(100)]
    assert count(app.broker, "SELECT count(*) FROM broker.queue_messages") == 100  # d2's


def test_T_RC_02_one_group_per_receive(app: App) -> None:
    d1 = app.dialog()
    d2 = app.dialog(related_conversation=d1)
    d3 = app.dialog()
    for d in (d1, d2, d3):
        send(app.broker, d, "open")
    with app.broker.transaction() as tx:
        for d in (d1, d2, d3):
            reply_to = target_handle(app.broker, d)
            for i in range(3):
                tx.send(reply_to, "Resp", f"{i}")
    with psycopg.connect(app.broker.dsn) as conn:
        groups: dict[uuid.UUID, uuid.UUID] = dict(conn.execute(
            "SELECT conversation_handle, conversation_group_id FROM broker.conversation_endpoints"
            " WHERE is_initiator").fetchall())
    g1, g2 = groups[d1], groups[d3]
    assert groups[d2] == g1 and g1 != g2

    with app.broker.transaction() as tx:
        first = tx.receive("q_i")
    with app.broker.transaction() as tx:
        second = tx.receive("q_i")
    with app.broker.transaction() as tx:
        assert tx.receive("q_i") == []
    for batch in (first, second):
        assert len({m.conversation_group_id for m in batch}) == 1
        handles = [m.conversation_handle for m in batch]
        # Each conversation's messages are contiguous and in sequence order.
        assert handles == sorted(handles, key=handles.index)
        for h in set(handles):
            seqs = [m.message_sequence_number for m in batch if m.conversation_handle == h]
            assert seqs == sorted(seqs) == [0, 1, 2]
    assert {first[0].conversation_group_id, second[0].conversation_group_id} == {g1, g2}
    assert len([m for m in first + second if m.conversation_group_id == g1]) == 6

    with app.broker.transaction() as tx:
        tx.send(target_handle(app.broker, d2), "Resp", "late")
    with app.broker.transaction() as tx:
        (one,) = tx.receive("q_i", 1, conversation_group_id=g1)
    assert one.conversation_group_id == g1


@pytest.fixture
def three_groups(app: App) -> tuple[App, list[uuid.UUID], list[uuid.UUID]]:
    """Three dialogs with two messages each waiting in q_t, each in its own target group."""
    dialogs = [app.dialog() for _ in range(3)]
    for d in dialogs:
        send(app.broker, d, "a", "b")
    targets = [target_handle(app.broker, d) for d in dialogs]
    return app, dialogs, targets


def test_T_RC_03_group_locks_skip_and_block(
    three_groups: tuple[App, list[uuid.UUID], list[uuid.UUID]],
) -> None:
    app, dialogs, _ = three_groups
    broker = app.broker
    with open_transaction(broker) as (conn1, s1), open_transaction(broker) as (conn2, s2):
        held = s1.receive("q_t", 1)
        g1 = held[0].conversation_group_id

        # Another reader skips the locked group...
        skipped = s2.receive("q_t")
        assert skipped and skipped[0].conversation_group_id != g1
        other_group = s2.get_conversation_group("q_t")
        assert other_group not in (None, g1)
        conn2.rollback()

        # ...a third session can still SEND into the locked group without blocking...
        holder_dialog = next(d for d in dialogs
                             if target_handle(broker, d) == held[0].conversation_handle)
        send(broker, holder_dialog, "c")

        # ...the holder itself may receive more of its group, including the new message...
        more = s1.receive("q_t", conversation_group_id=g1)
        assert [m.text() for m in more] == ["b", "c"]

        # ...and a RECEIVE WHERE conversation_group_id = locked group waits for the holder.
        with ThreadPoolExecutor(1) as pool:
            def blocked_receive() -> list[Message]:
                with psycopg.connect(broker.dsn) as conn3:
                    s3 = broker.session(conn3)
                    pid_box.append(conn3.info.backend_pid)
                    return s3.receive("q_t", conversation_group_id=g1)

            pid_box: list[int] = []
            future: Future[list[Message]] = pool.submit(blocked_receive)
            wait_until(lambda: bool(pid_box) and backend_waits_for_lock(broker, pid_box[0]),
                       "the WHERE receive to wait for the group lock")
            assert not future.done()
            send(broker, holder_dialog, "d")  # still not blocked by either reader
            conn1.commit()
            assert [m.text() for m in future.result(timeout=30)] == ["d"]


def test_T_RC_03_initiator_locks_do_not_block_target(app: App) -> None:
    handle = app.dialog()
    send(app.broker, handle, "request")
    with open_transaction(app.broker) as (conn1, s1):
        # SEND locks the initiator's group until this transaction ends.
        s1.send(handle, "Req", "pending")
        with app.broker.transaction() as tx:
            (request,) = tx.receive("q_t")
            tx.send(request.conversation_handle, "Resp", "reply")
        conn1.commit()
    with app.broker.transaction() as tx:
        assert [m.text() for m in tx.receive("q_i")] == ["reply"]
        assert [m.text() for m in tx.receive("q_t")] == ["pending"]


def test_T_RC_05_rollback_restores(
    three_groups: tuple[App, list[uuid.UUID], list[uuid.UUID]],
) -> None:
    app, _, targets = three_groups
    messages_before = {k: v for k, v in snapshot(app.broker).items()
                       if k in ("queue_messages", "endpoints", "dialog_groups")}
    with pytest.raises(RuntimeError), app.broker.transaction() as tx:
        taken = tx.receive("q_t", conversation_handle=targets[0])
        assert len(taken) == 2
        raise RuntimeError("processing failed")
    after = snapshot(app.broker)
    assert {k: after[k] for k in messages_before} == messages_before
    with app.broker.transaction() as tx:
        again = tx.receive("q_t", conversation_handle=targets[0])
    assert [(m.message_sequence_number, m.text(), m.message_id) for m in again] == [
        (m.message_sequence_number, m.text(), m.message_id) for m in taken
    ]
    # The rollback is counted for poison detection, and each message knows it came back.
    assert [m.attempts for m in taken] == [0, 0]
    assert [m.attempts for m in again] == [1, 1]


def test_T_RC_05_savepoint_rollback_keeps_the_lock(
    three_groups: tuple[App, list[uuid.UUID], list[uuid.UUID]],
) -> None:
    app, _, targets = three_groups
    with open_transaction(app.broker) as (conn1, s1):
        with pytest.raises(RuntimeError), s1.savepoint():
            taken = s1.receive("q_t", conversation_handle=targets[0])
            raise RuntimeError("roll back to the savepoint")
        group = taken[0].conversation_group_id
        # The messages are back...
        assert count(app.broker, "SELECT count(*) FROM broker.queue_messages"
                                 " WHERE conversation_handle = %s", (targets[0],)) == 2
        # ...but the group stays locked by this transaction, which is still open.
        with open_transaction(app.broker) as (_, s2):
            for _ in range(2):
                batch = s2.receive("q_t")
                assert batch and batch[0].conversation_group_id != group
            assert s2.receive("q_t") == []
        again = s1.receive("q_t", conversation_handle=targets[0])
        assert [m.message_id for m in again] == [m.message_id for m in taken]
        conn1.commit()


def test_autocommit_receive_removes_at_once(app: App) -> None:
    """RECEIVE outside a transaction commits its removal at once (spec 8, autocommit): a
    failure afterwards loses the message, and poison detection has nothing to count."""
    handle = app.dialog()
    send(app.broker, handle, "first", "second")
    with pytest.raises(RuntimeError):
        (first,) = app.broker.receive("q_t", top=1)
        raise RuntimeError("processing failed after the RECEIVE")
    assert count(app.broker, "SELECT count(*) FROM broker.queue_messages") == 1
    assert count(app.broker, "SELECT count(*) FROM broker.receive_log") == 0
    (second,) = app.broker.receive("q_t", top=1, waitfor=True, timeout=5)
    assert (first.text(), second.text()) == ("first", "second")
    assert app.broker.receive("q_t", waitfor=True, timeout=0.2) == []
    # The pool's connections are back to what its other users expect.
    with app.broker.pool.connection() as conn:
        assert not conn.autocommit


def test_autocommit_receive_bad_input(app: App) -> None:
    handle = app.dialog()
    send(app.broker, handle, "kept")
    before = snapshot(app.broker)
    with pytest.raises(BrokerError) as unknown:
        app.broker.receive("no_such_queue")
    assert unknown.value.number == 208
    with pytest.raises(BrokerError) as negative:
        app.broker.receive("q_t", top=-1)
    assert negative.value.number == 50106
    assert snapshot(app.broker) == before


def test_T_RC_06_waitfor_times_out_empty(app: App) -> None:
    started = time.monotonic()
    with app.broker.transaction() as tx:
        assert tx.receive("q_t", waitfor=True, timeout=1.0) == []
        assert tx.get_conversation_group("q_t", waitfor=True, timeout=0.5) is None
    assert time.monotonic() - started >= 1.5


def test_T_RC_06_waitfor_wakes_on_commit_only(app: App) -> None:
    handle = app.dialog()
    with ThreadPoolExecutor(1) as pool:
        def wait_for_messages() -> list[Message]:
            with app.broker.transaction() as tx:
                return tx.receive("q_t", waitfor=True, timeout=60)

        future = pool.submit(wait_for_messages)
        wait_until(lambda: count(app.broker, "SELECT coalesce(sum(tasks_waiting), 0)"
                                              " FROM broker.queue_waiting_tasks"
                                              " WHERE queue_name = 'q_t'") == 1,
                   "the waiter to be counted in tasks_waiting")
        with open_transaction(app.broker) as (conn, session):
            session.send(handle, "Req", "uncommitted")
            time.sleep(0.5)
            assert not future.done()  # an uncommitted SEND wakes nobody
            conn.commit()
        (message,) = future.result(timeout=30)
    assert message.text() == "uncommitted"
    wait_until(lambda: count(app.broker, "SELECT coalesce(sum(tasks_waiting), 0)"
                                          " FROM broker.queue_waiting_tasks") == 0,
               "the waiter to be unregistered")


def test_T_RC_06_disabling_the_queue_ends_the_wait(app: App) -> None:
    with ThreadPoolExecutor(1) as pool:
        def wait_for_messages() -> list[Message]:
            with app.broker.transaction() as tx:
                return tx.receive("q_t", waitfor=True, timeout=60)

        future = pool.submit(wait_for_messages)
        wait_until(lambda: count(app.broker, "SELECT count(*) FROM broker.queue_waiters") == 1,
                   "the waiter to register")
        with app.broker.transaction() as tx:
            tx.alter_queue("q_t", status=False)
        with pytest.raises(QueueDisabledError) as exc:
            future.result(timeout=30)
    assert exc.value.number == 9617


def test_T_RC_07_where_on_another_queue(app: App) -> None:
    handle = app.dialog()
    send(app.broker, handle, "x")
    with app.broker.transaction() as tx:
        group_i = tx.get_conversation_group("q_i")
    assert group_i is None
    with psycopg.connect(app.broker.dsn) as conn:
        (initiator_group,) = conn.execute(
            "SELECT conversation_group_id FROM broker.conversation_endpoints"
            " WHERE conversation_handle = %s", [handle]).fetchone() or (None,)
    before = snapshot(app.broker)
    with pytest.raises(BrokerError) as by_handle, app.broker.transaction() as tx:
        tx.receive("q_t", conversation_handle=handle)  # the initiator's handle lives on q_i
    assert by_handle.value.number == 8426
    with pytest.raises(BrokerError) as by_group, app.broker.transaction() as tx:
        tx.receive("q_t", conversation_group_id=initiator_group)
    assert by_group.value.number == 8436
    with pytest.raises(BrokerError) as unknown, app.broker.transaction() as tx:
        tx.receive("no_such_queue")
    assert unknown.value.number == 208
    with pytest.raises(BrokerError) as bad_top, app.broker.transaction() as tx:
        tx.receive("q_t", -1)
    assert bad_top.value.number == 50106
    with pytest.raises(BrokerError) as timeout_alone, app.broker.transaction() as tx:
        tx.receive("q_t", timeout=1)
    assert timeout_alone.value.number == 102
    assert snapshot(app.broker) == before


def test_receive_needs_read_committed(app: App) -> None:
    with psycopg.connect(app.broker.dsn) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with pytest.raises(BrokerError) as exc:
            app.broker.session(conn).receive("q_t")
    assert exc.value.number == 50104


def test_T_GCG_01_get_conversation_group(
    three_groups: tuple[App, list[uuid.UUID], list[uuid.UUID]],
) -> None:
    app, _, _ = three_groups
    with open_transaction(app.broker) as (conn1, s1):
        group = s1.get_conversation_group("q_t")
        assert group is not None
        # Locked, nothing dequeued.
        assert count(app.broker, "SELECT count(*) FROM broker.queue_messages"
                                 " WHERE conversation_group_id = %s", (group,)) == 2
        with open_transaction(app.broker) as (_, s2), open_transaction(app.broker) as (_, s3):
            second = s2.get_conversation_group("q_t")
            # Groups a transaction already holds stay eligible for it, as for RECEIVE.
            assert s2.get_conversation_group("q_t") == second
            third = s3.get_conversation_group("q_t")
            assert len({group, second, third}) == 3 and None not in {second, third}
            with open_transaction(app.broker) as (_, s4):
                assert s4.get_conversation_group("q_t") is None
        # The holder receives its locked group without waiting.
        assert len(s1.receive("q_t", conversation_group_id=group)) == 2
        conn1.commit()
    with app.broker.transaction() as tx:
        tx.alter_queue("q_t", status=False)
    with pytest.raises(QueueDisabledError), app.broker.transaction() as tx:
        tx.get_conversation_group("q_t")
    with pytest.raises(QueueDisabledError), app.broker.transaction() as tx:
        tx.receive("q_t")


def test_empty_queue_get_conversation_group_is_none(app: App) -> None:
    with app.broker.transaction() as tx:
        assert tx.get_conversation_group("q_t") is None


def test_waiter_thread_safety_many_waiters(app: App) -> None:
    """Several threads of one Broker wait on the same queue; each message wakes a reader and
    every message is received exactly once."""
    dialogs = [app.dialog() for _ in range(6)]
    results: list[str] = []
    lock = threading.Lock()

    def reader() -> None:
        with app.broker.transaction() as tx:
            for m in tx.receive("q_t", waitfor=True, timeout=30):
                with lock:
                    results.append(m.text() or "")

    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(reader) for _ in range(6)]
        for i, d in enumerate(dialogs):
            send(app.broker, d, f"m{i}")
        for f in futures:
            f.result(timeout=60)
    assert sorted(results) == sorted(f"m{i}" for i in range(6))


def test_listener_keeps_serving_waiters_under_a_stream_of_wake_ups(app: App) -> None:
    """Waiters keep registering and unregistering (through the Broker's listener connection)
    while notifications stream in. A listener that ran a statement while psycopg's notifies()
    generator held its connection stopped serving for good; every waiter after that fell back
    to polling and tasks_waiting stayed wrong."""
    handle = app.dialog()
    received: list[str] = []
    lock = threading.Lock()
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            with app.broker.transaction() as tx:
                batch = tx.receive("q_t", 1, waitfor=True, timeout=2)
            with lock:
                received.extend(m.text() or "" for m in batch)

    with ThreadPoolExecutor(3) as pool:
        readers = [pool.submit(reader) for _ in range(3)]
        for i in range(150):
            send(app.broker, handle, f"m{i}")
            time.sleep(0.005)
        wait_until(lambda: len(received) == 150, "every message to be received")
        # The listener still serves: a new waiter is registered, and is woken.
        done.set()
        for r in readers:
            r.result(timeout=60)
    with ThreadPoolExecutor(1) as pool:
        def one_more() -> list[Message]:
            with app.broker.transaction() as tx:
                return tx.receive("q_t", waitfor=True, timeout=60)

        future = pool.submit(one_more)
        wait_until(lambda: count(app.broker, "SELECT count(*) FROM broker.queue_waiters") == 1,
                   "the listener to register a new waiter", limit=4)
        send(app.broker, handle, "last")
        assert [m.text() for m in future.result(timeout=60)] == ["last"]
    assert sorted(received) == sorted(f"m{i}" for i in range(150))


def test_listener_reconnects_when_its_connection_is_lost(app: App) -> None:
    """The WAITFOR listener sleeps on its connection's socket; when the server ends that
    connection, the listener connects again and registers the waiters still waiting, and later
    waiters are registered and woken as before."""
    handle = app.dialog()

    def listener_pids() -> set[int]:
        with psycopg.connect(app.broker.dsn) as conn:
            return {pid for (pid,) in conn.execute(
                "SELECT backend_pid FROM broker.queue_waiters").fetchall()}

    def waiting_receive() -> list[Message]:
        with app.broker.transaction() as tx:
            return tx.receive("q_t", waitfor=True, timeout=60)

    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(waiting_receive)
        wait_until(lambda: len(listener_pids()) == 1, "the waiter to register")
        (lost,) = listener_pids()
        with psycopg.connect(app.broker.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", [lost])
        wait_until(lambda: listener_pids() not in (set(), {lost}),
                   "the waiter to be registered again by a new listener connection")
        send(app.broker, handle, "after the loss")
        assert [m.text() for m in future.result(timeout=60)] == ["after the loss"]
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(waiting_receive)
        wait_until(lambda: len(listener_pids()) == 1, "a new waiter to register")
        assert lost not in listener_pids()
        send(app.broker, handle, "later")
        assert [m.text() for m in future.result(timeout=60)] == ["later"]


def _receive_counts(broker: Broker) -> tuple[int, int]:
    with psycopg.connect(broker.dsn) as conn:
        row = conn.execute(
            "SELECT coalesce(pg_sequence_last_value(receive_counter), 0),"
            " coalesce(pg_sequence_last_value(empty_receive_counter), 0)"
            " FROM broker.queues WHERE name = 'q_t'").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_each_receive_counts_once_for_the_queue_monitor_whichever_way_it_runs(app: App) -> None:
    """The queue monitor tells RECEIVES_OCCURRING from an idle queue by the RECEIVEs counted
    and the empty ones among them. A RECEIVE without WHERE that finds messages runs as one
    statement; the others (WHERE, TOP(0), an empty queue) take the general path: each counts
    once, and only the empty ones as empty."""
    d1, d2 = app.dialog(), app.dialog()
    send(app.broker, d1, "a", "b", "c")
    send(app.broker, d2, "d")
    before, empty_before = _receive_counts(app.broker)
    with app.broker.transaction() as tx:
        assert [m.text() for m in tx.receive("q_t", 1)] == ["a"]
        assert [m.text() for m in tx.receive("q_t")] == ["b", "c"]
    with app.broker.transaction() as tx:
        assert tx.receive("q_t", 0) == []
        assert [m.text() for m in tx.receive(
            "q_t", conversation_handle=target_handle(app.broker, d2))] == ["d"]
    with app.broker.transaction() as tx:
        assert tx.receive("q_t") == []
        assert tx.receive("q_t", 5) == []
    after, empty_after = _receive_counts(app.broker)
    assert (after - before, empty_after - empty_before) == (6, 2)


def test_a_received_row_fills_every_field_of_message_by_name(broker: Broker) -> None:
    """RECEIVE's rows are the schema's received_message type; Message's fields are its
    columns, in the same order, so a column added to one and not the other fails here rather
    than shifting every value after it."""
    with psycopg.connect(broker.dsn) as conn:
        columns = [r[0] for r in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = (SELECT typrelid FROM pg_type"
            " WHERE typname = 'received_message' AND typnamespace = 'broker'::regnamespace)"
            " AND attnum > 0 AND NOT attisdropped ORDER BY attnum").fetchall()]
    assert tuple(columns) == RECEIVED_COLUMNS
