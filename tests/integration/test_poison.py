"""Poison-message detection and BROKER_QUEUE_DISABLED (spec 18, 19; T-PM-01)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from airflow_broker import Broker, BrokerError, QueueDisabledError
from airflow_broker.errors import PoisonDetectionUnavailable
from airflow_broker.events import BROKER_QUEUE_DISABLED, EventInstance
from airflow_broker.messages import EVENT_NOTIFICATION
from airflow_broker.worker import BrokerWorker
from tests.support import roles
from tests.support.brokers import App
from tests.support.helpers import count, target_handle

POST_EVENT = "http://schemas.microsoft.com/SQL/Notifications/PostEventNotification"


@pytest.fixture
def watched(app: App) -> App:
    """The app, with a BROKER_QUEUE_DISABLED notification on q_t to service N."""
    with app.broker.transaction() as tx:
        tx.create_queue("q_n")
        tx.create_service("N", "q_n", [POST_EVENT])
        tx.create_event_notification("q_t disabled", "q_t", ["BROKER_QUEUE_DISABLED"], "N")
    return app


def fill(app: App, n: int = 3) -> uuid.UUID:
    handle = app.dialog()
    with app.broker.transaction() as tx:
        for i in range(n):
            tx.send(handle, "Req", f"m{i}")
    return handle


def fail_once(broker: Broker) -> None:
    with pytest.raises(RuntimeError), broker.transaction() as tx:
        assert tx.receive("q_t", 1)
        raise RuntimeError("processing fails")


def succeed_once(broker: Broker) -> None:
    with broker.transaction() as tx:
        assert tx.receive("q_t", 1)


def is_enabled(broker: Broker, queue: str = "q_t") -> bool:
    return count(broker, "SELECT count(*) FROM broker.service_queues"
                         " WHERE name = %s AND is_receive_enabled", (queue,)) == 1


def test_T_PM_01_five_rollbacks_disable_the_queue(watched: App) -> None:
    broker = watched.broker
    fill(watched)
    for attempt in range(4):
        fail_once(broker)
        assert is_enabled(broker), f"disabled after {attempt + 1} rollbacks"
    fail_once(broker)
    assert not is_enabled(broker)
    with psycopg.connect(broker.dsn) as conn:
        status = conn.execute("SELECT is_enqueue_enabled, disabled_reason FROM broker.queue_status"
                              " WHERE name = 'q_t'").fetchone()
        reason = conn.execute("SELECT reason, cardinality(message_ids)"
                              " FROM broker.queue_disable_events").fetchone()
        queue_id, database_id = conn.execute(
            "SELECT object_id, (SELECT oid FROM pg_database WHERE datname = current_database())"
            " FROM broker.service_queues WHERE name = 'q_t'").fetchone() or (None, None)
    assert status == (False, "POISON")
    assert reason == ("5 consecutive transactions that received from the queue rolled back", 1)
    with pytest.raises(QueueDisabledError), broker.transaction() as tx:
        tx.receive("q_t")
    with broker.transaction() as tx:
        (event_message,) = tx.receive("q_n")
    assert event_message.message_type_name == EVENT_NOTIFICATION
    assert event_message.service_contract_name == POST_EVENT
    event = EventInstance.from_message(event_message)
    assert event.event_type == BROKER_QUEUE_DISABLED
    assert (event.object_id, event.database_id) == (queue_id, database_id)
    assert [child.tag for child in event.document] == [
        "EventType", "PostTime", "SPID", "DatabaseID", "TransactionID", "NTUserName",
        "NTDomainName", "HostName", "ClientProcessID", "ApplicationName", "StartTime",
        "ObjectID", "ServerName", "LoginSid", "EventSequence", "IsSystem"]
    # The documented recovery: enable, find the message, end its conversation WITH ERROR.
    with broker.transaction() as tx:
        tx.alter_queue("q_t", status=True)
        (poison,) = tx.receive("q_t", 1)
        assert poison.attempts == 5
        tx.end_conversation(poison.conversation_handle, error=500, description="poison")
    assert is_enabled(broker)


def test_T_PM_01_rollbacks_count_after_the_record_connection_was_lost(watched: App) -> None:
    """The records go on a connection of the Broker's own, as a statement prepared there: when
    that connection is lost, the next record opens another and prepares it again."""
    broker = watched.broker
    fill(watched)
    fail_once(broker)
    fail_once(broker)
    with psycopg.connect(broker.dsn, autocommit=True) as conn:
        ended = conn.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = current_database()",
            [f"{broker.application_name}-side"]).fetchone()
    assert ended == (1,)
    for attempt in range(2):
        fail_once(broker)
        assert is_enabled(broker), f"disabled after {attempt + 3} rollbacks"
    fail_once(broker)
    assert not is_enabled(broker)


def test_T_PM_01_a_record_lost_with_its_connection_is_sent_again(watched: App) -> None:
    """The side connection is lost while a record waits on the server: the record goes again
    on a new connection, and the rollback counts."""
    broker = watched.broker
    fill(watched)
    side = f"{broker.application_name}-side"
    with psycopg.connect(broker.dsn) as blocker:
        # The records of a queue are written one at a time, under this lock: holding it keeps
        # the record waiting on the server.
        blocker.execute("SELECT pg_advisory_xact_lock(hashtext('broker.register'), object_id)"
                        " FROM broker.service_queues WHERE name = 'q_t'")
        with pytest.raises(RuntimeError), broker.transaction() as tx:
            assert tx.receive("q_t", 1)
            deadline = time.monotonic() + 10
            while count(broker, "SELECT count(*) FROM pg_stat_activity WHERE application_name"
                                " = %s AND wait_event = 'advisory'", (side,)) == 0:
                assert time.monotonic() < deadline, "the record never waited for the lock"
                time.sleep(0.01)
            assert count(broker, "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))"
                                 " FROM pg_stat_activity WHERE application_name = %s",
                         (side,)) == 1
            blocker.rollback()
            raise RuntimeError("processing fails")
    for attempt in range(4):
        assert is_enabled(broker), f"disabled after {attempt + 1} rollbacks"
        fail_once(broker)
    assert not is_enabled(broker)


def test_T_PM_01_a_record_sent_twice_counts_its_transaction_once(watched: App) -> None:
    """A record sent again after its connection was lost may have been written the first time
    too: the rolled-back transaction still counts once, and each of its messages once."""
    broker = watched.broker
    fill(watched)
    message_ids = [uuid.uuid4(), uuid.uuid4()]
    with psycopg.connect(broker.dsn, autocommit=True) as conn:
        queue_id = conn.execute("SELECT object_id FROM broker.service_queues"
                                " WHERE name = 'q_t'").fetchone()
        assert queue_id is not None
        with conn.transaction(force_rollback=True):
            xid = conn.execute("SELECT pg_current_xact_id()").fetchone()
        assert xid is not None
        for ids in (message_ids, message_ids, message_ids[1:]):
            conn.execute("SELECT broker.register_receive(%s, %s, %s, 1)",
                         [queue_id[0], xid[0], ids])
        conn.execute("SELECT broker.resolve_receives(%s)", [queue_id[0]])
        attempts = conn.execute("SELECT message_id, attempts FROM broker.message_attempts"
                                " WHERE message_id = ANY (%s)", [message_ids]).fetchall()
    assert sorted(attempts) == sorted((m, 1) for m in message_ids)
    assert count(broker, "SELECT consecutive_rollbacks FROM broker.queues"
                         " WHERE name = 'q_t'") == 1
    assert count(broker, "SELECT count(*) FROM broker.receive_log") == 0


def test_T_PM_01_a_transaction_that_received_twice_counts_once(watched: App) -> None:
    """Two RECEIVEs in one rolled-back transaction are one rollback: four such transactions
    leave the queue enabled, and each message comes back with one attempt per transaction."""
    broker = watched.broker
    fill(watched, 2)
    for attempt in range(4):
        with pytest.raises(RuntimeError), broker.transaction() as tx:
            first = tx.receive("q_t", 1)
            second = tx.receive("q_t", 1)
            assert [m.attempts for m in first + second] == [attempt, attempt]
            raise RuntimeError("processing fails")
    assert is_enabled(broker)
    assert count(broker, "SELECT consecutive_rollbacks FROM broker.queues"
                         " WHERE name = 'q_t'") == 4
    fail_once(broker)
    assert not is_enabled(broker)


def test_T_PM_01_pipelined_rollbacks_count_as_any_others(watched: App) -> None:
    """A pipelined transaction (pipeline=True) records its RECEIVE for poison detection as any
    transaction does: five rollbacks of it disable the queue, and a commit resets the count."""
    broker = watched.broker
    fill(watched)

    def fail_pipelined() -> None:
        with pytest.raises(RuntimeError), broker.transaction(pipeline=True) as tx:
            assert tx.receive("q_t", 1)
            raise RuntimeError("processing fails")

    for _ in range(4):
        fail_pipelined()
    with broker.transaction(pipeline=True) as tx:
        assert tx.receive("q_t", 1)
    for attempt in range(4):
        fail_pipelined()
        assert is_enabled(broker), f"disabled after {attempt + 1} rollbacks since the commit"
    assert count(broker, "SELECT consecutive_rollbacks FROM broker.queues"
                         " WHERE name = 'q_t'") == 4
    fail_pipelined()
    assert not is_enabled(broker)


def test_T_PM_01_a_commit_resets_the_count(watched: App) -> None:
    fill(watched, 4)
    for _ in range(4):
        fail_once(watched.broker)
    succeed_once(watched.broker)
    for _ in range(4):
        fail_once(watched.broker)
    assert is_enabled(watched.broker)
    assert count(watched.broker, "SELECT consecutive_rollbacks FROM broker.queues"
                                 " WHERE name = 'q_t'") == 4


@pytest.mark.parametrize("pipeline", [False, True], ids=["plain", "pipelined"])
@pytest.mark.parametrize("ending", ["commit", "rollback"])
def test_T_PM_01_a_block_cannot_end_its_transaction_early_and_escape_the_count(
    watched: App, ending: str, pipeline: bool
) -> None:
    """A Transaction has no commit() or rollback(): only the block's end commits. A handler
    that tries gets AttributeError, its RECEIVE still runs in the block's transaction, and
    five rollbacks of it disable the queue. (With an early COMMIT the RECEIVE would run in
    autocommit: the message gone at once, and its rollback never counted.)"""
    broker = watched.broker
    fill(watched, 1)
    for attempt in range(5):
        assert is_enabled(broker), f"disabled after {attempt} rollbacks"
        with pytest.raises(RuntimeError), broker.transaction(pipeline=pipeline) as tx:
            with pytest.raises(AttributeError):
                getattr(tx, ending)()
            assert tx.receive("q_t", 1)
            raise RuntimeError("processing fails")
    assert not is_enabled(broker)
    assert count(broker, "SELECT count(*) FROM broker.queue_messages"
                         " WHERE queue_id = (SELECT object_id FROM broker.queues"
                         " WHERE name = 'q_t')") == 1
    assert broker.stats.rollbacks == 5


def test_T_PM_01_poison_handling_off_never_disables(watched: App) -> None:
    with watched.broker.transaction() as tx:
        tx.alter_queue("q_t", poison_message_handling=False)
    fill(watched)
    for _ in range(8):
        fail_once(watched.broker)
    assert is_enabled(watched.broker)


def test_T_PM_01_savepoint_rollbacks_do_not_count(watched: App) -> None:
    fill(watched)
    for _ in range(6):
        with watched.broker.transaction() as tx, pytest.raises(RuntimeError), tx.savepoint():
            assert tx.receive("q_t", 1)
            raise RuntimeError("only this part is undone")
    assert is_enabled(watched.broker)
    assert count(watched.broker, "SELECT count(*) FROM broker.queue_messages"
                                 " WHERE queue_id = (SELECT object_id FROM broker.queues"
                                 " WHERE name = 'q_t')") == 3


def test_T_PM_01_empty_receive_rollbacks_do_not_count(watched: App) -> None:
    for _ in range(6):
        with pytest.raises(RuntimeError), watched.broker.transaction() as tx:
            assert tx.receive("q_t") == []
            raise RuntimeError("nothing was received")
    assert is_enabled(watched.broker)


def test_poison_threshold_is_tunable(watched: App) -> None:
    with watched.broker.transaction() as tx:
        tx.tune_queue("q_t", poison_threshold=2)
    fill(watched)
    fail_once(watched.broker)
    assert is_enabled(watched.broker)
    fail_once(watched.broker)
    assert not is_enabled(watched.broker)
    with pytest.raises(BrokerError) as bad, watched.broker.transaction() as tx:
        tx.tune_queue("q_t", poison_threshold=0)
    assert bad.value.number == 50106


KILLED_READER = r"""
import json, sys, time
from airflow_broker import Broker
broker = Broker(sys.argv[1])
with broker.transaction(pipeline=sys.argv[2] == "pipelined") as tx:
    batch = tx.receive("q_t", 1)
    print(json.dumps([str(m.message_id) for m in batch]), flush=True)
    time.sleep(120)
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["plain", "pipelined"])
def test_readers_killed_five_times_disable_the_queue(watched: App, mode: str) -> None:
    broker = watched.broker
    fill(watched, 1)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    seen: list[str] = []
    for _ in range(5):
        deadline = time.monotonic() + 60
        while True:
            reader = subprocess.Popen([sys.executable, "-c", KILLED_READER, broker.dsn, mode],
                                      stdout=subprocess.PIPE, text=True, env=env)
            assert reader.stdout is not None
            taken = json.loads(reader.stdout.readline())
            if taken:
                break
            reader.wait(timeout=30)  # the previous reader's backend has not ended yet
            assert time.monotonic() < deadline
        seen.extend(taken)
        reader.send_signal(signal.SIGKILL)
        reader.wait(timeout=30)
    assert len(set(seen)) == 1  # the same message came back every time
    # The worker resolves what the killed readers could not report.
    deadline = time.monotonic() + 60
    worker = BrokerWorker(broker, activation=False)
    while is_enabled(broker):
        assert time.monotonic() < deadline, "the queue was never disabled"
        worker.run_once()
        time.sleep(0.2)
    with broker.transaction() as tx:
        (event_message,) = tx.receive("q_n")
    event = EventInstance.from_message(event_message)
    assert event.event_type == BROKER_QUEUE_DISABLED
    assert event.object_id == count(broker, "SELECT object_id FROM broker.queues"
                                            " WHERE name = 'q_t'")


@pytest.mark.slow
def test_concurrent_readers_with_some_rollbacks_never_disable(watched: App) -> None:
    """4 readers commit 2,000 messages; every tenth transaction of each rolls back."""
    broker = watched.broker
    with broker.transaction() as tx:
        handles = [tx.begin_dialog("I", "T", "C") for _ in range(200)]
        for h in handles:
            for i in range(10):
                tx.send(h, "Req", f"{i}")
    processed: list[uuid.UUID] = []
    lock = threading.Lock()

    def reader() -> int:
        transactions = rollbacks = 0
        idle = 0
        while idle < 3:
            transactions += 1
            try:
                with broker.transaction() as tx:
                    batch = tx.receive("q_t", 5, waitfor=True, timeout=0.5)
                    if batch and transactions % 10 == 0:
                        raise RuntimeError("one in ten fails")
            except RuntimeError:
                rollbacks += 1
                continue
            if batch:
                idle = 0
                with lock:
                    processed.extend(m.message_id for m in batch)
            else:
                idle += 1
        return rollbacks

    with ThreadPoolExecutor(4) as pool:
        rollbacks = sum(pool.map(lambda _: reader(), range(4)))
    assert rollbacks >= 20
    assert is_enabled(broker)
    assert len(processed) == len(set(processed)) == 2_000
    with broker.transaction() as tx:
        assert tx.receive("q_n") == []  # no BROKER_QUEUE_DISABLED was raised


@pytest.mark.parametrize("pass_in_between", [False, True])
def test_T_PM_01_the_count_does_not_depend_on_when_it_is_resolved(
        watched: App, pass_in_between: bool) -> None:
    """Four rollbacks, a commit by a transaction that took its xid before them (a group lock)
    but received after them, a fifth rollback: the commit broke the streak, whether or not a
    worker pass resolved the first four before it. Before, without the pass, the commit was
    counted first (by xid) and the five rollbacks disabled the queue."""
    broker = watched.broker
    poisoned = target_handle(broker, fill(watched, 1))
    other = target_handle(broker, fill(watched, 1))
    worker = BrokerWorker(broker, activation=False)
    with psycopg.connect(broker.dsn) as late_conn:
        late = broker.session(late_conn)
        late_conn.execute("SELECT pg_current_xact_id()")  # its xid, before the rollbacks
        for _ in range(4):
            rollback_unreported(broker, poisoned)
        if pass_in_between:
            worker.run_once()
        assert late.receive("q_t", 1, conversation_handle=other)
        late_conn.commit()
    rollback_unreported(broker, poisoned)
    worker.run_once()
    assert is_enabled(broker)
    assert count(broker, "SELECT consecutive_rollbacks FROM broker.queues"
                         " WHERE name = 'q_t'") == 1


def rollback_unreported(broker: Broker, handle: uuid.UUID) -> None:
    """A reader that receives and rolls back without resolving it, as a killed one: only a
    worker pass counts it."""
    with psycopg.connect(broker.dsn) as conn:
        assert broker.session(conn).receive("q_t", 1, conversation_handle=handle)
        conn.rollback()


REGISTER_RECEIVE = "broker.register_receive(integer, xid8, uuid[], integer)"


@pytest.fixture
def reader_role(app: App) -> Iterator[str]:
    """A login-less role that may not record its receives: EXECUTE on register_receive is
    taken from PUBLIC in this test's database. Dropped afterwards (roles outlive
    databases)."""
    with roles.role(app.broker.dsn, *roles.APPLICATION_GRANTS,
                    f"REVOKE EXECUTE ON FUNCTION {REGISTER_RECEIVE} FROM PUBLIC",
                    prefix="reader") as name:
        yield name


def test_a_reader_that_cannot_record_its_receives_is_refused(app: App, reader_role: str) -> None:
    """Without the grants that record a receiving transaction, RECEIVE fails with 50124 and
    its transaction rolls back: poison detection is never off for a reader without anyone
    knowing. With them, the same reader's rollbacks count."""
    fill(app, 2)
    with Broker(app.broker.dsn, role=reader_role) as reader:
        with pytest.raises(PoisonDetectionUnavailable, match=reader_role) as refused, \
                reader.transaction() as tx:
            tx.receive("q_t", 1)
        assert refused.value.number == 50124
        assert count(app.broker, "SELECT count(*) FROM broker.queue_messages m"
                                 " JOIN broker.queues q ON q.object_id = m.queue_id"
                                 " WHERE q.name = 'q_t' AND m.status = 1") == 2
        with psycopg.connect(app.broker.dsn, autocommit=True) as conn:
            conn.execute(f"GRANT EXECUTE ON FUNCTION {REGISTER_RECEIVE} TO {reader_role}")
    # A Broker checks once: a new one sees the grant.
    with Broker(app.broker.dsn, role=reader_role) as reader:
        fail_once(reader)
        BrokerWorker(app.broker).run_once()
    assert count(app.broker, "SELECT consecutive_rollbacks FROM broker.queues"
                             " WHERE name = 'q_t'") == 1


def test_a_rollback_whose_count_cannot_be_resolved_at_once_keeps_its_own_error(
        app: App, caplog: pytest.LogCaptureFixture) -> None:
    """A rolled-back receive is resolved at once on the side connection. When that statement
    fails (here: EXECUTE on resolve_receives taken from PUBLIC), the failure is logged, the
    transaction's own error reaches the caller, and the record stays for the worker to
    count."""
    fill(app, 2)
    with roles.role(app.broker.dsn, *roles.APPLICATION_GRANTS,
                    "REVOKE EXECUTE ON FUNCTION broker.resolve_receives(integer) FROM PUBLIC",
                    prefix="reader") as reader_role, \
            Broker(app.broker.dsn, role=reader_role) as reader:
        fail_once(reader)
    assert any("resolve_receives" in r.getMessage() and r.levelname == "ERROR"
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    BrokerWorker(app.broker).run_once()
    assert count(app.broker, "SELECT consecutive_rollbacks FROM broker.queues"
                             " WHERE name = 'q_t'") == 1


def test_T_PM_01_rollbacks_count_after_a_postgres_restart(
        watched: App, restart_postgres: Callable[..., None]) -> None:
    """The side connection dies with the server (a clean restart keeps the counts on disk):
    the next records go on a new connection, and the fifth rollback disables the queue."""
    broker = watched.broker
    fill(watched)
    fail_once(broker)
    fail_once(broker)
    restart_postgres()
    for attempt in range(2):
        fail_once(broker)
        assert is_enabled(broker), f"disabled after {attempt + 3} rollbacks"
    fail_once(broker)
    assert not is_enabled(broker)
