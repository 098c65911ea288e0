"""Broker.transaction(): the application's own statements on ``tx.conn`` and the broker's
commit or roll back together, whichever comes first, and the pooled connection is left as the
pool hands it out."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from psycopg import pq

from airflow_broker import END_DIALOG, Broker, BrokerError
from tests.support.brokers import App
from tests.support.helpers import count


@pytest.fixture
def orders(app: App) -> App:
    with app.broker.transaction() as tx:
        tx.conn.execute("CREATE TABLE public.orders (id integer PRIMARY KEY)")
    return app


@pytest.mark.parametrize("own_first", [True, False], ids=["own-statement-first",
                                                          "broker-statement-first"])
def test_own_work_rolls_back_with_the_broker(orders: App, own_first: bool) -> None:
    handle = orders.dialog()
    with pytest.raises(RuntimeError), orders.broker.transaction() as tx:
        if own_first:
            tx.conn.execute("INSERT INTO public.orders VALUES (1)")
            tx.send(handle, "Req", b"order 1")
        else:
            tx.send(handle, "Req", b"order 1")
            tx.conn.execute("INSERT INTO public.orders VALUES (1)")
        raise RuntimeError("the application fails before its commit")
    assert count(orders.broker, "SELECT count(*) FROM public.orders") == 0
    assert count(orders.broker, "SELECT count(*) FROM broker.queue_messages") == 0


def test_own_work_commits_with_the_broker(orders: App) -> None:
    handle = orders.dialog()
    with orders.broker.transaction() as tx:
        tx.conn.execute("INSERT INTO public.orders VALUES (1)")
        tx.send(handle, "Req", b"order 1")
    with orders.broker.transaction() as tx:
        (message,) = tx.receive("q_t")
        tx.conn.execute("INSERT INTO public.orders VALUES (2)")
    assert message.message_body == b"order 1"
    assert count(orders.broker, "SELECT count(*) FROM public.orders") == 2


def test_a_failed_first_statement_leaves_nothing_and_the_connection_usable(orders: App) -> None:
    handle = orders.dialog()
    with Broker(orders.broker.dsn, max_connections=1) as broker:
        with pytest.raises(BrokerError) as exc, broker.transaction() as tx:
            tx.send(uuid.uuid4(), "Req", b"x")
        assert exc.value.number == 8426
        # The pool's one connection comes back outside any transaction, autocommit off, as
        # any other user of the pool expects.
        with broker.pool.connection() as conn:
            assert not conn.autocommit
            assert conn.info.transaction_status.name == "IDLE"
        with broker.transaction() as tx:
            tx.send(handle, "Req", b"after the failure")
    assert count(orders.broker, "SELECT count(*) FROM broker.queue_messages") == 1


def test_committed_work_and_autocommit_receive_hand_the_connection_back_as_found(
        orders: App) -> None:
    handle = orders.dialog()
    with Broker(orders.broker.dsn, max_connections=1) as broker:
        with broker.transaction() as tx:
            tx.send(handle, "Req", b"order 1")
            tx.conn.execute("INSERT INTO public.orders VALUES (1)")
        assert len(broker.receive("q_t")) == 1
        with broker.pool.connection() as conn:
            assert not conn.autocommit
            assert conn.info.transaction_status.name == "IDLE"
            # psycopg's default: a statement opens a transaction that only COMMIT ends.
            conn.execute("INSERT INTO public.orders VALUES (2)")
            assert conn.info.transaction_status.name == "INTRANS"
            conn.rollback()
    assert count(orders.broker, "SELECT count(*) FROM public.orders") == 1


def _syncs(trace: str) -> int:
    """Round trips in a libpq trace of a pipelined connection: one Sync ends each."""
    return sum(1 for line in trace.splitlines() if line.split("\t")[:1] == ["F"]
               and line.rstrip().endswith("Sync"))


def test_pipelined_reply_end_and_commit_travel_in_one_round_trip(
        orders: App, tmp_path: Path) -> None:
    """The target's pattern, RECEIVE, SEND the reply, END, COMMIT: with pipeline=True the
    reply, the END, the application's own statement and the COMMIT reach the server together,
    and the dialog ends as it would without it. (The second dialog is traced: the first
    SEND of a message type in a Broker also looks the type up.)"""
    for number in (1, 2):
        handle = orders.dialog()
        with orders.broker.transaction() as tx:
            tx.send(handle, "Req", b"request")
        trace_file = tmp_path / f"libpq-{number}.trace"
        with open(trace_file, "w") as trace:
            with orders.broker.transaction(pipeline=True) as tx:
                (request,) = tx.receive("q_t")
                pgconn = tx.conn.pgconn
                if number == 2:
                    pgconn.trace(trace.fileno())
                    pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
                tx.send(request.conversation_handle, "Resp", b"reply")
                tx.conn.execute("INSERT INTO public.orders VALUES (%s)", [number])
                tx.end_conversation(request.conversation_handle)
            # (Before the file closes: the pool keeps the connection.)
            pgconn.untrace()
        with orders.broker.transaction() as tx:
            got = [(m.message_type_name, m.message_body) for m in tx.receive("q_i")]
            tx.end_conversation(handle)
        assert got == [("Resp", b"reply"), (END_DIALOG, None)]
    traced = trace_file.read_text()
    assert _syncs(traced) == 1, traced
    assert count(orders.broker, "SELECT count(*) FROM public.orders") == 2


def test_pipelined_error_of_a_queued_send_is_raised_and_nothing_commits(orders: App) -> None:
    """A queued SEND's error (8426, not a conversation handle of this database) reaches the
    caller with its number when the pipeline is read, here at the COMMIT; the transaction
    rolls back, including the valid SEND and the own statement before it."""
    handle = orders.dialog()
    with Broker(orders.broker.dsn, max_connections=1) as broker:
        with pytest.raises(BrokerError) as exc, broker.transaction(pipeline=True) as tx:
            tx.send(handle, "Req", b"valid")
            tx.conn.execute("INSERT INTO public.orders VALUES (1)")
            tx.send(uuid.uuid4(), "Req", b"to nowhere")
        assert exc.value.number == 8426
        with broker.pool.connection() as conn:
            assert not conn.autocommit
            assert conn.info.transaction_status.name == "IDLE"
            assert conn.info.pipeline_status.name == "OFF"
        with broker.transaction(pipeline=True) as tx:
            tx.send(handle, "Req", b"after the failure")
    assert count(orders.broker, "SELECT count(*) FROM public.orders") == 0
    with orders.broker.transaction() as tx:
        assert [m.message_body for m in tx.receive("q_t")] == [b"after the failure"]


def test_pipelined_statement_with_an_answer_raises_the_queued_error(orders: App) -> None:
    """A statement that returns something sends what is queued before it: the queued SEND's
    error is raised there, not later."""
    with pytest.raises(BrokerError) as exc, orders.broker.transaction(pipeline=True) as tx:
        tx.send(uuid.uuid4(), "Req", b"to nowhere")
        tx.receive("q_t")
        pytest.fail("the RECEIVE after a failed SEND returned")
    assert exc.value.number == 8426


def test_pipelined_savepoint_keeps_a_failed_send_inside_the_block(orders: App) -> None:
    """In a pipelined transaction a savepoint still confines a failure: the failed SEND raises
    inside the block, the block rolls back, and the transaction commits the rest."""
    handle = orders.dialog()
    with orders.broker.transaction(pipeline=True) as tx:
        tx.send(handle, "Req", b"before")
        with pytest.raises(BrokerError) as exc, tx.savepoint():
            tx.send(handle, "Req", b"inside, rolled back")
            tx.send(uuid.uuid4(), "Req", b"to nowhere")
        tx.send(handle, "Req", b"after")
    assert exc.value.number == 8426
    with orders.broker.transaction() as tx:
        assert [m.message_body for m in tx.receive("q_t")] == [b"before", b"after"]


def test_pipelined_begin_dialog_send_and_commit_travel_in_one_round_trip(
        orders: App, tmp_path: Path) -> None:
    """A producer's pattern, BEGIN DIALOG and SEND: pipelined, the handle is made by the client
    and the BEGIN DIALOG, the SEND and the COMMIT reach the server together; the target
    receives the message on the dialog of that handle."""
    trace_file = tmp_path / "libpq.trace"
    handles = []
    for number in (1, 2):
        with open(trace_file, "w") as trace:
            with orders.broker.transaction(pipeline=True) as tx:
                pgconn = tx.conn.pgconn
                if number == 2:
                    pgconn.trace(trace.fileno())
                    pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
                handle = tx.begin_dialog("I", "T", "C")
                tx.send(handle, "Req", f"request {number}".encode())
            pgconn.untrace()
        handles.append(handle)
    traced = trace_file.read_text()
    assert _syncs(traced) == 1, traced
    with orders.broker.transaction() as tx:
        got = tx.receive("q_t") + tx.receive("q_t")
        initiators = [count(orders.broker, "SELECT count(*) FROM broker.endpoints"
                                           " WHERE conversation_handle = %s AND is_initiator",
                            (h,)) for h in handles]
    assert sorted(m.message_body or b"" for m in got) == [b"request 1", b"request 2"]
    assert initiators == [1, 1]


def test_pipelined_begin_dialog_error_is_raised_and_nothing_commits(orders: App) -> None:
    """A pipelined BEGIN DIALOG from a service that does not exist fails with 8423 when the
    block ends: no endpoint, no message."""
    with pytest.raises(BrokerError) as exc, orders.broker.transaction(pipeline=True) as tx:
        handle = tx.begin_dialog("NoSuchService", "T", "C")
        tx.send(handle, "Req", b"lost")
    assert exc.value.number == 8423
    assert count(orders.broker, "SELECT count(*) FROM broker.endpoints") == 0
    assert count(orders.broker, "SELECT count(*) FROM broker.queue_messages") == 0
