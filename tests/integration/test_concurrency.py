"""Many readers at once, and readers that die mid-transaction (DESIGN.md invariants)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import psycopg

from airflow_broker import Broker
from tests.support.brokers import App
from tests.support.helpers import count

CONVERSATIONS = 500
GROUPS = 100
PER_CONVERSATION = 20
READERS = 4


def fill_initiator_queue(app: App) -> dict[uuid.UUID, uuid.UUID]:
    """500 dialogs begun by I in 100 conversation groups; T answers 20 messages on each, so
    10,000 messages wait in q_i. Returns each conversation's group."""
    group_ids = [uuid.uuid4() for _ in range(GROUPS)]
    group_of: dict[uuid.UUID, uuid.UUID] = {}
    with app.broker.transaction() as tx:
        for i in range(CONVERSATIONS):
            group = group_ids[i % GROUPS]
            handle = tx.begin_dialog("I", "T", "C", related_conversation_group=group)
            tx.send(handle, "Req", b"open")
            group_of[handle] = group
    while True:
        with app.broker.transaction() as tx:
            requests = tx.receive("q_t", 50)
            for request in requests:
                for n in range(PER_CONVERSATION):
                    tx.send(request.conversation_handle, "Resp", f"{n}")
        if not requests:
            break
    return group_of


def test_four_readers_drain_10000_messages_exactly_once_in_order(app: App) -> None:
    group_of = fill_initiator_queue(app)
    assert count(app.broker, "SELECT count(*) FROM broker.queue_messages") == 10_000

    log_lock = threading.Lock()
    received: list[tuple[uuid.UUID, int, str]] = []  # in the order locks were held
    holding: dict[uuid.UUID, list[tuple[float, float, int]]] = defaultdict(list)

    def reader(reader_id: int) -> None:
        empty_in_a_row = 0
        while empty_in_a_row < 3:
            with app.broker.transaction() as tx:
                batch = tx.receive("q_i", 7, waitfor=True, timeout=0.5)
                got_lock = time.monotonic()
                if batch:
                    with log_lock:
                        received.extend(
                            (m.conversation_handle, m.message_sequence_number, m.text() or "")
                            for m in batch
                        )
                # The group lock is released by the commit that follows this block.
                releasing = time.monotonic()
            if batch:
                empty_in_a_row = 0
                with log_lock:
                    holding[batch[0].conversation_group_id].append(
                        (got_lock, releasing, reader_id))
            else:
                empty_in_a_row += 1

    with ThreadPoolExecutor(READERS) as pool:
        for f in [pool.submit(reader, r) for r in range(READERS)]:
            f.result(timeout=600)

    assert len(received) == 10_000
    assert len(set(received)) == 10_000  # exactly once
    by_conversation: dict[uuid.UUID, list[int]] = defaultdict(list)
    for handle, sequence, text in received:
        by_conversation[handle].append(sequence)
        assert text == str(sequence)
    assert set(by_conversation) == set(group_of)
    for sequences in by_conversation.values():
        assert sequences == list(range(PER_CONVERSATION))  # in order, no gaps
    # No two readers ever held the same group at the same time.
    readers_seen: set[int] = set()
    for intervals in holding.values():
        intervals.sort()
        for (_, end, first), (start, _, second) in itertools.pairwise(intervals):
            readers_seen.update((first, second))
            if first != second:
                assert end <= start, "two readers held one conversation group at once"
    assert len(readers_seen) > 1  # the work really was shared
    assert count(app.broker, "SELECT count(*) FROM broker.queue_messages") == 0


READER_SCRIPT = r"""
import json, sys, time
from airflow_broker import Broker
broker = Broker(sys.argv[1])
with broker.transaction() as tx:
    batch = tx.receive("q_t", 5)
    print(json.dumps([str(m.message_id) for m in batch]), flush=True)
    time.sleep(120)  # killed here, in the middle of its transaction
"""


def test_reader_killed_mid_transaction_loses_nothing(app: App) -> None:
    handle = app.dialog()
    with app.broker.transaction() as tx:
        for i in range(8):
            tx.send(handle, "Req", f"{i}")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    reader = subprocess.Popen(
        [sys.executable, "-c", READER_SCRIPT, app.broker.dsn],
        stdout=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert reader.stdout is not None
        taken = json.loads(reader.stdout.readline())
        assert len(taken) == 5
        with app.broker.transaction() as tx:
            # The dead-to-be reader holds the group: others see nothing receivable.
            assert tx.receive("q_t") == []
    finally:
        reader.send_signal(signal.SIGKILL)
        reader.wait(timeout=30)
    assert reader.returncode == -signal.SIGKILL

    deadline = time.monotonic() + 30
    while True:
        with app.broker.transaction() as tx:
            again = tx.receive("q_t")
        if again or time.monotonic() > deadline:
            break
        time.sleep(0.1)  # PostgreSQL notices the dead backend and ends its transaction
    assert [m.text() for m in again] == [f"{i}" for i in range(8)]
    assert [str(m.message_id) for m in again[:5]] == taken
    assert [m.message_sequence_number for m in again] == list(range(8))


def test_concurrent_first_sends_create_one_target_endpoint(broker: Broker, app: App) -> None:
    """Two transactions racing to send message 0 of one dialog: the conversation lock orders
    them, and exactly one target endpoint is created."""
    handle = app.dialog()

    def send(i: int) -> None:
        with psycopg.connect(broker.dsn) as conn:
            broker.session(conn).send(handle, "Req", f"{i}")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(send, range(8)))
    assert count(broker, "SELECT count(*) FROM broker.endpoints WHERE NOT is_initiator") == 1
    with broker.transaction() as tx:
        messages = tx.receive("q_t")
    assert [m.message_sequence_number for m in messages] == list(range(8))


def test_a_send_that_waited_for_its_conversation_goes_behind_the_message_it_waited_for(
        app: App) -> None:
    """Messages of a conversation arrive in the order their SENDs committed (spec 5). A SEND
    that waits for the conversation's lock while the holder's SEND, to a disabled queue, goes to
    the transmission queue must go behind it, though the target's queue was enabled before the
    holder committed: the one-statement SEND reads the transmission queue with a snapshot taken
    before the lock, so it leaves such a SEND to the general path, which reads after it."""
    broker = app.broker
    handle = app.dialog()
    with broker.transaction() as tx:
        tx.send(handle, "Req", b"0")
        tx.alter_queue("q_t", status=False)
    with psycopg.connect(broker.dsn) as holder:
        broker.session(holder).send(handle, "Req", b"1")
        with broker.transaction() as tx:
            tx.alter_queue("q_t", status=True)
        failures: list[BaseException] = []

        def send_second() -> None:
            try:
                with psycopg.connect(broker.dsn, application_name="second-send") as conn:
                    broker.session(conn).send(handle, "Req", b"2")
            except BaseException as exc:  # reported by the test's thread below
                failures.append(exc)

        second = threading.Thread(target=send_second)
        second.start()
        with psycopg.connect(broker.dsn, autocommit=True) as watcher:
            deadline = time.monotonic() + 30
            while not watcher.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE application_name = 'second-send'"
                    " AND wait_event_type = 'Lock'").fetchone():
                assert time.monotonic() < deadline, "the second SEND never waited for the lock"
                time.sleep(0.01)
        holder.commit()
        second.join(30)
    assert not second.is_alive() and failures == []
    # The second waits behind the first, for the transport's next attempt, rather than
    # overtaking it on the queue.
    with psycopg.connect(broker.dsn) as conn:
        held = conn.execute("SELECT message_sequence_number FROM broker.transmission_queue"
                            " ORDER BY message_sequence_number").fetchall()
    assert held == [(1,), (2,)]
    with broker.transaction() as tx:
        received = tx.receive("q_t")
    assert [m.message_body for m in received] == [b"0"]
