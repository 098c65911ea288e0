"""Delivery between brokers under faults: the far server stopped mid-stream, the transport
killed between the far commit and its own, acknowledgements lost. Every message must arrive
exactly once and in order."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from airflow_broker import Broker
from airflow_broker.embedded import EmbeddedPostgres
from airflow_broker.migrations import install
from airflow_broker.worker import BrokerWorker
from airflow_broker.worker.transport import address_of
from tests.fixtures.postgres import embedded_in_temp_dir
from tests.support.brokers import (
    FaultyTransport,
    Pair,
    advance,
    deploy_application,
    one,
    rows,
)

ROOT = Path(__file__).resolve().parents[2]
CONVERSATIONS = 10
PER_CONVERSATION = 500  # 5,000 messages in all


def stream(pair: Pair, conversations: int = CONVERSATIONS,
           per_conversation: int = PER_CONVERSATION,
           between: Callable[[int], None] | None = None) -> list[uuid.UUID]:
    """Sends ``per_conversation`` numbered messages on each of ``conversations`` dialogs, 100
    per transaction; ``between(sent)`` runs after each transaction."""
    handles = [pair.dialog() for _ in range(conversations)]
    sent = 0
    for start in range(0, per_conversation, 100):
        for h in handles:
            with pair.a.transaction() as tx:
                tx.send_many(h, "Req", [f"{h}:{i}" for i in range(start, start + 100)])
            sent += 100
            if between is not None:
                between(sent)
    return handles


def arrived(pair: Pair) -> int:
    return int(one(pair.b, "SELECT count(*) FROM broker.queue_messages"))


def assert_exactly_once_in_order(pair: Pair, handles: list[uuid.UUID],
                                 per_conversation: int = PER_CONVERSATION) -> None:
    conversation_ids = {one(pair.a, "SELECT conversation_id FROM broker.endpoints"
                                    " WHERE conversation_handle = %s", [h]): h for h in handles}
    got = rows(pair.b, """
        SELECT e.conversation_id, m.message_sequence_number, m.status,
               convert_from(m.message_body, 'UTF8')
          FROM broker.queue_messages m JOIN broker.endpoints e USING (conversation_handle)
         ORDER BY e.conversation_id, m.message_sequence_number""")
    assert len(got) == len(handles) * per_conversation
    by_conversation: dict[uuid.UUID, list[tuple[int, int, str]]] = {}
    for conversation_id, seq, status, body in got:
        by_conversation.setdefault(conversation_id, []).append((seq, status, body))
    assert set(by_conversation) == set(conversation_ids)
    for conversation_id, messages in by_conversation.items():
        h = conversation_ids[conversation_id]
        assert messages == [(i, 1, f"{h}:{i}") for i in range(per_conversation)]
    # And RECEIVE hands them out in that order.
    with pair.b.transaction() as tx:
        first = tx.receive("q_t", top=per_conversation)
    assert [m.message_sequence_number for m in first] == list(range(per_conversation))
    assert one(pair.a, "SELECT count(*) FROM broker.transmission_queue") == 0


@pytest.fixture
def second_server() -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL server of its own (the far broker's), even when the tests use an external
    one."""
    with embedded_in_temp_dir("airflow-broker-test-far-pg-") as server:
        yield server


def wait_for(condition: Callable[[], bool], limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_far_server_stopped_during_a_stream_of_5000_messages(
        dsn: str, second_server: EmbeddedPostgres) -> None:
    far = second_server.ensure_database("far")
    install(far)
    a = Broker(dsn, poll_interval=0.2)
    b = Broker(far, poll_interval=0.2)
    deploy_application(a, target=False)
    deploy_application(b, initiator=False)
    pair = Pair(a, b, address_of(dsn), address_of(far))
    pair.routes()
    worker = BrokerWorker(a, activation=False, interval=0.2)
    running = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
    running.start()
    stopped_at: list[int] = []
    try:
        def stop_far_server_once(sent: int) -> None:
            if not stopped_at and sent >= 1500:
                wait_for(lambda: arrived(pair) >= 500)
                second_server.shut_down()
                stopped_at.append(sent)

        handles = stream(pair, between=stop_far_server_once)
        # The far server is down: everything left waits with the reason.
        statuses = {r[0] for r in rows(a, "SELECT DISTINCT transmission_status"
                                          " FROM broker.transmission_queue")}
        assert any(s.startswith("The target service broker is unreachable") for s in statuses)
        time.sleep(1)
        second_server.start()
        b.pool.check()  # drops the connections the stop broke
        advance(a, 65)  # past the longest back-off
        wait_for(lambda: one(a, "SELECT count(*) FROM broker.transmission_queue") == 0)
        assert_exactly_once_in_order(pair, handles)
    finally:
        worker.stop()
        running.join()
        pair.close()
        a.close()
        b.close()


def test_transport_killed_between_the_far_commit_and_its_own(pair: Pair) -> None:
    pair.routes()
    handles = stream(pair, conversations=5, per_conversation=400)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.transport_process", pair.a.dsn, "3"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        for _ in range(3):
            assert process.stdout.readline().startswith("far-committed")
        # Now stopped after its third far commit: killed before it records the
        # acknowledgements.
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    pending = one(pair.a, "SELECT count(*) FROM broker.transmission_queue")
    assert arrived(pair) == 300
    assert pending == 2000 - 200  # the third batch arrived but was never acknowledged
    advance(pair.a, 65)  # the killed transport's advisory locks went with its session
    pair.pump(rounds=50)
    assert_exactly_once_in_order(pair, handles, per_conversation=400)


def test_lost_acknowledgements_in_a_stream(pair: Pair) -> None:
    pair.routes()
    handles = stream(pair, conversations=4, per_conversation=300)
    lossy = FaultyTransport(pair.a, lose=3, batch_size=250)
    pair.transports.append(lossy)
    for _ in range(40):
        lossy.step()
        advance(pair.a, 65)
    assert_exactly_once_in_order(pair, handles, per_conversation=300)


def test_transport_reconnects_after_the_far_database_restarts(
        pair: Pair, restart_postgres: Callable[[], None]) -> None:
    pair.routes()
    h = pair.dialog()
    with pair.a.transaction() as tx:
        tx.send(h, "Req", "before")
    pair.pump()
    restart_postgres()
    pair.a.pool.check()
    pair.b.pool.check()
    with pair.a.transaction() as tx:
        tx.send(h, "Req", "after")
    pair.pump()
    with psycopg.connect(pair.b.dsn) as conn:
        bodies = [r[0] for r in conn.execute(
            "SELECT convert_from(message_body, 'UTF8') FROM broker.queue_messages"
            " ORDER BY message_sequence_number")]
    assert bodies == ["before", "after"]
