"""The broker's statements read about what they return, whatever else waits and whatever
statistics their session planned with.

PostgreSQL caches a session's generic plans (its foreign-key checks' plans too) until the next
ANALYZE: sequential scans chosen for a table of one page, or a bitmap and a sort chosen for a
queue analyzed while empty, then read the whole table or backlog on every call as it grows.
And a statement that groups, or tries a lock on, every row ahead of what it takes costs as much
as the backlog, on every call."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
import pytest

from airflow_broker import END_DIALOG, ERROR, Broker, Message, Transaction
from airflow_broker.worker.transport import Transport
from tests.support.brokers import App, Pair, advance
from tests.support.helpers import count

GROWING = ("endpoints", "dialog_groups", "queue_messages")
T = TypeVar("T")


def _sequential_scans(conn: psycopg.Connection) -> dict[str, int]:
    """Sequential scans of the growing tables in the current transaction so far."""
    rows = conn.execute(
        "SELECT relname, seq_scan FROM pg_stat_xact_user_tables"
        " WHERE schemaname = 'broker' AND relname = ANY(%s) AND seq_scan > 0",
        [list(GROWING)]).fetchall()
    return {name: scans for name, scans in rows}


def test_dialogs_read_growing_tables_by_index_after_an_analyze_of_empty_tables(
        app: App) -> None:
    with psycopg.connect(app.broker.dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE broker.endpoints, broker.dialog_groups,"
                     " broker.queue_messages")
    # New sessions, which plan every statement from here on.
    with Broker(app.broker.dsn, max_connections=1) as broker:
        def dialog() -> list[dict[str, int]]:
            scans = []
            with broker.transaction() as tx:
                handle = tx.begin_dialog("I", "T", "C")
                tx.send(handle, "Req", b"request")
                scans.append(_sequential_scans(tx.conn))
            with broker.transaction() as tx:
                (request,) = tx.receive("q_t")
                tx.send(request.conversation_handle, "Resp", b"reply")
                tx.end_conversation(request.conversation_handle)
                scans.append(_sequential_scans(tx.conn))
            with broker.transaction() as tx:
                messages = tx.receive("q_i")
                assert [m.message_type_name for m in messages] == ["Resp", END_DIALOG]
                tx.end_conversation(messages[0].conversation_handle)
                scans.append(_sequential_scans(tx.conn))
            return scans

        # Enough dialogs for the cached plans to be generic ones and the tables to outgrow a
        # page (a target endpoint stays CLOSED after its END).
        for _ in range(150):
            dialog()
        assert dialog() == [{}, {}, {}]


def _rows_read(conn: psycopg.Connection, table: str = "queue_messages") -> int:
    """Rows of a broker table read in the current transaction so far, by sequential scans and
    through its indexes (a parallel scan's workers count apart: a lower bound then)."""
    row = conn.execute(
        "SELECT seq_tup_read + idx_tup_fetch FROM pg_stat_xact_user_tables"
        " WHERE schemaname = 'broker' AND relname = %s", [table]).fetchone()
    assert row is not None
    return int(row[0])


def test_receive_reads_what_it_takes_whatever_else_waits(app: App) -> None:
    # 20,000 messages wait in one conversation; RECEIVE takes five of another one. Its cached
    # generic plan must not read the table's other rows: a plan that joined the taken rows
    # instead of looking them up read every row through the primary key on each RECEIVE.
    crowd, few = app.dialog(), app.dialog()
    with app.broker.transaction() as tx:
        for _ in range(20):
            tx.send_many(crowd, "Req", [b"waiting"] * 1_000)
        tx.send_many(few, "Req", [b"taken"] * 5)
    with psycopg.connect(app.broker.dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE broker.queue_messages")
        target = conn.execute("SELECT conversation_handle FROM broker.endpoints"
                              " WHERE far_handle = %s", [few]).fetchone()
    assert target is not None
    with app.broker.transaction() as tx:
        before = _rows_read(tx.conn)
        taken = tx.receive("q_t", conversation_handle=target[0])
        read = _rows_read(tx.conn) - before
    assert [m.text() for m in taken] == ["taken"] * 5
    assert read < 100


def test_receive_passes_over_a_locked_group_without_trying_each_message(app: App) -> None:
    # 2,000 messages of one conversation come first, and another reader holds their group: a
    # RECEIVE tries that group's lock a few times, not once per message, before it takes the
    # next group.
    crowd, other = app.dialog(), app.dialog()
    with app.broker.transaction() as tx:
        tx.send_many(crowd, "Req", [b"crowd"] * 2_000)
        tx.send(other, "Req", b"other")
    with psycopg.connect(app.broker.dsn) as holder:
        held = app.broker.session(holder).receive("q_t", top=1)
        assert [m.text() for m in held] == ["crowd"]
        with app.broker.transaction() as tx:
            before = _rows_read(tx.conn, "dialog_groups")
            taken = tx.receive("q_t")
            tried = _rows_read(tx.conn, "dialog_groups") - before
        holder.rollback()
    assert [m.text() for m in taken] == ["other"]
    assert tried < 50  # (2,001 when each message tried its group)


def _index_entries_read(conn: psycopg.Connection) -> int:
    """Entries of queue_messages' indexes read in the current transaction so far (bitmap scans
    included, which fetch no row one by one)."""
    row = conn.execute(
        "SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(indexrelid)), 0)"
        " FROM pg_index WHERE indrelid = 'broker.queue_messages'::regclass").fetchone()
    assert row is not None
    return int(row[0])


def test_receive_reads_a_long_conversation_from_its_head_after_an_analyze_while_empty(
        app: App) -> None:
    # A queue that was emptied and analyzed (no rows, no pages left) made the cached plan read
    # the whole group through a bitmap and sort it, on every RECEIVE of a conversation that
    # then grew long: 30-50 ms for TOP(100) behind 100,000 messages. One message empties it: a
    # VACUUM whose horizon a concurrent snapshot (an autovacuum's ANALYZE) holds back leaves its
    # dead index entries in RECEIVE's way, which must stay far below the bound.
    handle = app.dialog()
    with app.broker.transaction() as tx:
        tx.send(handle, "Req", b"first")
    with app.broker.transaction() as tx:
        assert len(tx.receive("q_t")) == 1
    with psycopg.connect(app.broker.dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE broker.queue_messages, broker.dialog_groups")
    with Broker(app.broker.dsn, max_connections=1) as broker:
        with broker.transaction() as tx:
            for _ in range(10):
                tx.send_many(handle, "Req", [b"long"] * 5_000)
        with broker.transaction() as tx:
            before = _index_entries_read(tx.conn)
            taken = tx.receive("q_t", top=10)
            read = _index_entries_read(tx.conn) - before
    assert [m.text() for m in taken] == ["long"] * 10
    assert read < 200  # (50,011 when the group was read through a bitmap)


def test_peek_passes_over_a_locked_group_without_trying_each_message(app: App) -> None:
    # The Airflow trigger's peek, on every poll, behind a group another reader holds: it tries
    # the held group's lock a few times (2,001 when it tried it once per message) and still
    # returns the free groups' messages in RECEIVE order.
    crowd, first, second = app.dialog(), app.dialog(), app.dialog()
    with app.broker.transaction() as tx:
        tx.send_many(crowd, "Req", [b"crowd"] * 2_000)
        tx.send(first, "Req", b"first")
        tx.send(second, "Req", b"second")
    peek = "SELECT message_body FROM broker.airflow_peek('q_t', %s)"
    with psycopg.connect(app.broker.dsn) as holder:
        held = app.broker.session(holder).receive("q_t", top=1)
        assert [m.text() for m in held] == ["crowd"]
        with app.broker.transaction() as tx:
            before = _rows_read(tx.conn, "dialog_groups")
            peeked = tx.conn.execute(peek, [2]).fetchall()
            tried = _rows_read(tx.conn, "dialog_groups") - before
            assert tx.conn.execute(peek, [0]).fetchall() == []
        holder.rollback()
    assert [bytes(body) for (body,) in peeked] == [b"first", b"second"]
    assert tried < 50
    with app.broker.transaction() as tx:
        assert [bytes(body) for (body,) in tx.conn.execute(peek, [1])] == [b"crowd"]


def _backlog_for_another_broker(pair: Pair) -> uuid.UUID:
    """A dialog to the other broker with 20,000 messages waiting for the transport."""
    pair.routes()
    handle = pair.dialog()
    with pair.a.transaction() as tx:
        for _ in range(20):
            tx.send_many(handle, "Req", [b"waiting"] * 1_000)
    return handle


def test_send_to_another_broker_reads_one_row_of_its_conversations_backlog(pair: Pair) -> None:
    # 20,000 messages of the conversation wait for the transport: a SEND behind them reads the
    # last one for the conversation's schedule (the maximum over the backlog took 60 ms behind
    # 200,000).
    handle = _backlog_for_another_broker(pair)
    with pair.a.transaction() as tx:
        before = _rows_read(tx.conn, "transmissions")
        tx.send(handle, "Req", b"one more")
        read = _rows_read(tx.conn, "transmissions") - before
    assert read < 50


def test_retry_now_of_a_route_reads_its_own_messages_not_the_backlog(pair: Pair) -> None:
    # 20,000 messages wait for T; the transmission page's Retry now for another far service
    # finds that service's five through transmissions_destination (each click read the whole
    # transmission queue, which grows fastest when a far broker is down).
    _backlog_for_another_broker(pair)
    with pair.a.transaction() as tx:
        tx.create_route("to_other", "postgresql://far@127.0.0.1:1/far", service_name="Other")
        other = tx.begin_dialog("I", "Other", "C")
        tx.send_many(other, "Req", [b"other"] * 5)
    with psycopg.connect(pair.a.dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE broker.transmissions")
    with pair.a.transaction() as tx:
        before = _rows_read(tx.conn, "transmissions")
        row = tx.conn.execute("SELECT broker.console_retry_transmissions('Other', NULL)"
                              ).fetchone()
        read = _rows_read(tx.conn, "transmissions") - before
    assert row == (5,)
    assert read < 50


def test_transport_step_reads_about_what_it_sends(pair: Pair) -> None:
    # One conversation's 20,000 messages come first, then 50 conversations of one message: a
    # step of 100 takes them from the first conversation, in order, without grouping the whole
    # transmission queue (80 ms a step behind 200,000). A step with room left goes on to the
    # next conversations in the order their messages became due.
    crowd = _backlog_for_another_broker(pair)
    others = [pair.dialog() for _ in range(50)]
    with pair.a.transaction() as tx:
        for other in others:
            tx.send(other, "Req", b"other")
    with psycopg.connect(pair.a.dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE broker.transmissions")
    step = ("SELECT conversation_handle, message_sequence_number"
            " FROM broker.outbound_transmissions(%s)")
    with psycopg.connect(pair.a.dsn) as conn:
        before = _rows_read(conn, "transmissions")
        batch = conn.execute(step, [100]).fetchall()
        read = _rows_read(conn, "transmissions") - before
        assert batch == [(crowd, n) for n in range(100)]
        assert read < 500
        conn.rollback()
        conn.execute("DELETE FROM broker.transmissions WHERE conversation_handle = %s",
                     [crowd])
        batch = conn.execute(step, [10]).fetchall()
        assert batch == [(other, 0) for other in others[:10]]
        conn.rollback()


def test_the_lifetime_sweep_reads_the_expired_endpoints_not_every_open_one(app: App) -> None:
    # 2,000 open dialogs with the default lifetime and one of a minute, which the clock then
    # passes: the worker's lifetime step ends that one and reads next to nothing else.
    with app.broker.transaction() as tx:
        for _ in range(2_000):
            tx.begin_dialog("I", "T", "C")
    short = app.dialog(lifetime=60)
    with psycopg.connect(app.broker.dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE broker.endpoints")
    advance(app.broker, 120)
    with psycopg.connect(app.broker.dsn) as conn:
        before = _rows_read(conn, "endpoints")
        row = conn.execute("SELECT broker.expire_lifetimes(1000)").fetchone()
        read = _rows_read(conn, "endpoints") - before
        conn.commit()
    assert row == (1,)
    assert read < 100
    with app.broker.transaction() as tx:
        [error] = tx.receive("q_i")
    assert (error.conversation_handle, error.message_type_name) == (short, ERROR)


def _disable_autovacuum(dsn: str) -> None:
    """No autovacuum's ANALYZE in between: it would have every statement planned again once."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for (table,) in conn.execute(
                "SELECT relname FROM pg_class WHERE relkind = 'r' AND relnamespace ="
                " 'broker'::regnamespace").fetchall():
            conn.execute(f'ALTER TABLE broker."{table}" SET (autovacuum_enabled = false)')
        conn.execute("ANALYZE broker.queue_messages")


def _count_plans(conn: psycopg.Connection[Any], plans: list[str]) -> None:
    """Has the session report each statement it plans (its functions' statements too) into
    ``plans``."""
    def planned(notice: psycopg.errors.Diagnostic) -> None:
        if (notice.message_primary or "").startswith("PLANNER STATISTICS"):
            plans.append(notice.message_primary or "")

    conn.add_notice_handler(planned)
    autocommit = conn.autocommit
    conn.autocommit = True
    conn.execute("SET log_planner_stats = on")
    conn.execute("SET client_min_messages = log")
    conn.autocommit = autocommit


def _plans_in_a_new_session(app: App, act: Callable[[Transaction], T],
                            prepare: Callable[[Transaction], object] | None = None
                            ) -> tuple[int, T]:
    """How many statements a new session plans for ``act`` (after ``prepare``, committed
    first in the same session, is not counted), and what ``act`` returned; committed."""
    plans: list[str] = []
    with psycopg.connect(app.broker.dsn) as conn:
        session = app.broker.session(conn)
        if prepare is not None:
            prepare(session)
            conn.commit()
        _count_plans(conn, plans)
        plans.clear()
        result = act(session)
        conn.commit()
    return len(plans), result


def _count_plans_of_new_connections(monkeypatch: pytest.MonkeyPatch, plans: list[str]) -> None:
    """The same for connections a Broker opens with psycopg.connect (WAITFOR's listener, the
    transport's far broker), not from its pool."""
    connect: Callable[..., psycopg.Connection[Any]] = psycopg.connect

    def counted(*args: Any, **kwargs: Any) -> psycopg.Connection[Any]:
        conn = connect(*args, **kwargs)
        _count_plans(conn, plans)
        return conn

    monkeypatch.setattr(psycopg, "connect", counted)


def test_a_dialogs_statements_are_planned_once_a_session_when_one_conversation_holds_many(
        app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL plans a function's statement anew on every call when the plan for the value
    at hand looks cheaper than the one for any value, as a lookup by conversation does once one
    conversation holds many messages and most hold one or two. The plan is the same either way:
    planning it again is only cost (60 µs for END CONVERSATION's purge of what is left of the
    conversation, PostgreSQL 15), on every dialog. A SQL function's statements are planned on
    every call whatever the data (100 µs for removing a WAITFOR's waiter)."""
    with app.broker.transaction() as tx:
        tx.create_queue("q_b")
        tx.create_service("B", "q_b", ["C"])
    with app.broker.transaction() as tx:
        tx.send_many(tx.begin_dialog("I", "B", "C"), "Req", [b"waiting"] * 300)
        for _ in range(20):
            tx.send(tx.begin_dialog("I", "B", "C"), "Req", b"waiting")
    _disable_autovacuum(app.broker.dsn)

    plans: list[str] = []
    _count_plans_of_new_connections(monkeypatch, plans)
    with Broker(app.broker.dsn, max_connections=1) as broker:
        with broker.pool.connection() as conn:
            _count_plans(conn, plans)

        def dialog() -> int:
            plans.clear()
            # A WAITFOR that waits: its listener registers and removes the waiter.
            assert broker.receive("q_i", waitfor=True, timeout=0.01) == []
            with broker.transaction() as tx:
                handle = tx.begin_dialog("I", "T", "C")
                tx.send(handle, "Req", b"request")
            with broker.transaction() as tx:
                (request,) = tx.receive("q_t")
                tx.send(request.conversation_handle, "Resp", b"reply")
                tx.end_conversation(request.conversation_handle)
            with broker.transaction() as tx:
                messages = tx.receive("q_i")
                assert [m.message_type_name for m in messages] == ["Resp", END_DIALOG]
                tx.end_conversation(messages[0].conversation_handle)
            return len(plans)

        # The first calls plan every statement: psycopg prepares the client's statements on
        # their sixth run, and PostgreSQL plans five custom plans before it weighs a generic.
        for _ in range(15):
            dialog()
        assert [dialog() for _ in range(3)] == [0, 0, 0]


def test_dialogs_between_brokers_plan_their_statements_once_a_session(
        pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same between two brokers: both sides of the transport, each message a dialog's
    first or last, which the far broker accepts one at a time and the sender settles one at
    a time."""
    with pair.b.transaction() as tx:
        tx.create_queue("q_b")
        tx.create_service("B", "q_b", ["C"])
    pair.routes()
    with pair.a.transaction() as tx:
        tx.create_route("to_B", pair.b_uri, service_name="B")
    with pair.a.transaction() as tx:
        tx.send_many(tx.begin_dialog("I", "B", "C"), "Req", [b"waiting"] * 300)
        for _ in range(20):
            tx.send(tx.begin_dialog("I", "B", "C"), "Req", b"waiting")
    pair.pump()
    for side in (pair.a, pair.b):
        _disable_autovacuum(side.dsn)

    plans: list[str] = []
    _count_plans_of_new_connections(monkeypatch, plans)
    with Broker(pair.a.dsn, max_connections=1) as a, Broker(pair.b.dsn, max_connections=1) as b:
        for side in (a, b):
            with side.pool.connection() as conn:
                _count_plans(conn, plans)
        to_b, to_a = Transport(a, batch_size=500), Transport(b, batch_size=500)

        def dialog() -> int:
            plans.clear()
            with a.transaction() as tx:
                tx.send(tx.begin_dialog("I", "T", "C"), "Req", b"request")
            assert to_b.run_until_idle().sent == 1
            with b.transaction() as tx:
                (request,) = tx.receive("q_t")
                tx.send(request.conversation_handle, "Resp", b"reply")
                tx.end_conversation(request.conversation_handle)
            assert to_a.run_until_idle().sent == 2
            with a.transaction() as tx:
                messages = tx.receive("q_i")
                assert [m.message_type_name for m in messages] == ["Resp", END_DIALOG]
                tx.end_conversation(messages[0].conversation_handle)
            to_b.run_until_idle()
            to_a.run_until_idle()
            return len(plans)

        try:
            for _ in range(15):
                dialog()
            assert [dialog() for _ in range(3)] == [0, 0, 0]
        finally:
            to_b.close()
            to_a.close()


def test_the_quarantine_page_reads_the_oldest_it_lists_not_the_whole_quarantine(
        app: App) -> None:
    # 2,000 messages of q_t quarantined, 20,000 of q_i, 20,000 of q_t replayed long ago: the
    # page's list of q_t's oldest 50 goes through the queue's open quarantine in order and
    # stops there (it read and returned the queue's whole quarantine).
    with app.broker.transaction() as tx:
        tx.conn.execute(
            "INSERT INTO broker.quarantine (queue_id, conversation_handle,"
            " conversation_group_id, service_name, service_contract_name, message_type_name,"
            " message_sequence_number, message_id, message_body, error, attempts, status,"
            " quarantined_at)"
            " SELECT q.object_id, gen_random_uuid(), gen_random_uuid(), 'T', 'C', 'Req', n,"
            " gen_random_uuid(), 'body', 'ValueError', 1, s.status,"
            " timestamp '2026-01-01' + n * interval '1 second'"
            " FROM broker.queues q, (VALUES ('q_t', 'quarantined', 2000),"
            " ('q_i', 'quarantined', 20000), ('q_t', 'replayed', 20000)) s (queue, status, many),"
            " generate_series(1, s.many) n WHERE q.name = s.queue")
    with psycopg.connect(app.broker.dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE broker.quarantine")
    with app.broker.transaction() as tx:
        before = _rows_read(tx.conn, "quarantine")
        listed = tx.conn.execute(
            "SELECT message_sequence_number FROM broker.console_quarantine('q_t', NULL, NULL,"
            " 50)").fetchall()
        read = _rows_read(tx.conn, "quarantine") - before
        (groups,) = tx.conn.execute(
            "SELECT count(*), sum(messages) FROM broker.console_quarantine_groups('q_t',"
            " 'valueerror', NULL, 10)").fetchall()
    assert [n for (n,) in listed] == list(range(1, 51))
    assert read < 100
    assert groups == (1, 2000)


def test_the_common_send_runs_one_statement(app: App) -> None:
    """A SEND of a type without validation on an open local conversation is one statement in
    the broker's send(): the lookups, the checks, the lock, the message and the endpoint's
    numbering together. A new session plans each statement it runs once, so its first SEND's
    plans count them: the client's call, that statement and the PL/pgSQL conditions around it
    (13), where the lookup, the checks and the delivery apart planned 30. A SEND the common
    case does not cover (here: the sender's queue keeps what it sends) still goes the general
    way, after the one statement found nothing to do."""
    handle = app.dialog()
    with app.broker.transaction() as tx:
        tx.send(handle, "Req", b"message 0")

    def plans_of_a_first_send() -> int:
        return _plans_in_a_new_session(app, lambda s: s.send(handle, "Req", b"later"))[0]

    common = plans_of_a_first_send()
    assert common <= 13
    with app.broker.transaction() as tx:
        tx.alter_queue("q_i", retention=True)
    assert plans_of_a_first_send() > 3 * common
    with app.broker.transaction() as tx:
        received = tx.receive("q_t")
    assert [m.message_body for m in received] == [b"message 0", b"later", b"later"]
    assert count(app.broker, "SELECT count(*) FROM broker.queue_messages WHERE status = 3") == 1


def test_message_0_runs_one_statement(app: App) -> None:
    """The initiator's first SEND to a service in this broker is one statement too: the lookup
    of the target service, its contract, the right to SEND to it, the target's endpoint and
    group, the message and the initiator's endpoint opened: a new session plans 22 statements
    for it (the foreign keys' checks among them), where deliver() and the general path planned
    91. A route that names the target service sends message 0 the general way, which reads
    the routes; either way the target gets it on an open dialog."""
    def plans_of_a_first_message_0() -> int:
        with app.broker.transaction() as tx:
            handle = tx.begin_dialog("I", "T", "C")
        return _plans_in_a_new_session(app, lambda s: s.send(handle, "Req", b"message 0"))[0]

    common = plans_of_a_first_message_0()
    assert common <= 24
    with app.broker.transaction() as tx:
        tx.create_route("to_t", "LOCAL", service_name="T")
    assert plans_of_a_first_message_0() > 3 * common
    with app.broker.transaction() as tx:
        received = tx.receive("q_t") + tx.receive("q_t") + tx.receive("q_t")
    assert [m.message_body for m in received] == [b"message 0", b"message 0"]
    states = count(app.broker, "SELECT count(*) FROM broker.endpoints WHERE state = 'CO'")
    assert states == 4


def test_the_common_begin_dialog_runs_one_statement(app: App) -> None:
    """BEGIN DIALOG without a related conversation or group is one statement: both names
    looked up, RECEIVE on the FROM service's queue and REFERENCES on the contract checked, the
    group and the endpoint created: a new session plans 21 statements for it (its session's
    own and the foreign keys' checks among them), where the lookups, the checks and the
    inserts apart planned 31. With a related conversation group it goes the general way, and
    either way the dialog begins."""
    def plans_of_a_first_begin(group: uuid.UUID | None = None) -> tuple[int, uuid.UUID]:
        return _plans_in_a_new_session(app, lambda s: s.begin_dialog(
            "I", "T", "C", related_conversation_group=group))

    common, first = plans_of_a_first_begin()
    general, second = plans_of_a_first_begin(uuid.uuid4())
    assert common <= 22
    assert general >= common + 8
    with app.broker.transaction() as tx:
        for handle in (first, second):
            tx.send(handle, "Req", b"request")
    with app.broker.transaction() as tx:
        received = tx.receive("q_t") + tx.receive("q_t")
    assert [m.message_body for m in received] == [b"request", b"request"]


def test_end_conversation_locks_its_endpoint_in_one_statement(app: App) -> None:
    """END CONVERSATION finds, checks and locks its endpoint in one statement (the endpoint
    and its group locked where the caller may RECEIVE on its service's queue), and purges the
    conversation's unreceived messages in the statement that ends it: a new session plans 16
    statements for the target's END of a dialog, where lock_endpoint()'s call and its two
    statements, and the purge's two, made it 21; the initiator then receives the EndDialog. A
    login without that right still gets its error from lock_endpoint() (the permission
    matrix in tests/least_privilege)."""
    def plans_of_a_first_end() -> int:
        handle = app.dialog()
        with app.broker.transaction() as tx:
            tx.send(handle, "Req", b"request")
        received: list[Message] = []
        return _plans_in_a_new_session(
            app, lambda s: s.end_conversation(received[0].conversation_handle),
            prepare=lambda s: received.extend(s.receive("q_t")))[0]

    assert plans_of_a_first_end() <= 16
    with app.broker.transaction() as tx:
        messages = tx.receive("q_i")
    assert [m.message_type_name for m in messages] == [END_DIALOG]


def test_the_common_receive_runs_one_statement(app: App) -> None:
    """RECEIVE without a WHERE clause is one statement of receive_with_queue() itself, not a
    call of a function of its own whose rows RETURN QUERY copied again: a new session plans 6
    statements for a first RECEIVE (7 with that call). A RECEIVE of one conversation goes the
    general way, through receivable_queue() and take_messages(): 28."""
    def first_receive(where: bool) -> tuple[int, list[Message]]:
        handle = app.dialog()
        with app.broker.transaction() as tx:
            tx.send(handle, "Req", b"request")
        target = None
        if where:
            with psycopg.connect(app.broker.dsn) as conn:
                row = conn.execute("SELECT conversation_handle FROM broker.endpoints"
                                   " WHERE far_handle = %s", [handle]).fetchone()
            assert row is not None
            target = row[0]
        return _plans_in_a_new_session(
            app, lambda s: s.receive("q_t", conversation_handle=target))

    common, received = first_receive(False)
    assert [m.message_body for m in received] == [b"request"]
    general, received = first_receive(True)
    assert [m.message_body for m in received] == [b"request"]
    assert common <= 6
    assert general >= common + 10
