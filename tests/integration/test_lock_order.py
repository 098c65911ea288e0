"""Both endpoints of a conversation changed at once: END CONVERSATION, SEND and RECEIVE on the
two sides in concurrent transactions never deadlock (spec 11; issue of the two-sided END)."""

from __future__ import annotations

import random
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from airflow_broker import Broker, BrokerError
from airflow_broker.worker import BrokerWorker
from tests.support.brokers import App
from tests.support.helpers import backend_waits_for_lock, count, endpoint


def endpoint_state(broker: Broker, handle: uuid.UUID) -> str | None:
    row = endpoint(broker, handle)
    return None if row is None else str(row["state"])


def blocked_until(done: threading.Event, pid: list[int], broker: Broker) -> bool:
    """Whether the backend in ``pid`` waits for a lock before ``done`` is set."""
    while not done.wait(0.05):
        if pid and backend_waits_for_lock(broker, pid[0]):
            return True
    return False


def begin_and_deliver(app: App) -> uuid.UUID:
    handle = app.dialog()
    with app.broker.transaction() as tx:
        tx.send(handle, "Req", b"request")
    return handle


@pytest.mark.parametrize("initiator_commits_first", [True, False])
def test_both_sides_end_at_once_without_deadlock(app: App, dsn: str,
                                                 initiator_commits_first: bool) -> None:
    """T1 RECEIVEs on the target and SENDs a reply; T2 ENDs the initiator; T1 ENDs the target.
    Before, T2 waited for T1's lock on the target's row and T1 then waited for T2's on the
    initiator's: 40P01, and the victim's batch counted as a poison rollback. Now neither END
    waits: an EndDialog whose peer is busy waits in the transmission queue."""
    initiator = begin_and_deliver(app)
    t2_ended = threading.Event()
    t2_may_commit = threading.Event()
    t2_pid: list[int] = []
    with Broker(dsn) as other, ThreadPoolExecutor(1) as pool:
        with app.broker.transaction() as t1:
            # A regression fails here instead of hanging: T2 would wait for T1 and T1 for T2.
            t1.conn.execute("SET LOCAL lock_timeout = '60s'")
            [request] = t1.receive("q_t")
            target = request.conversation_handle
            t1.send(target, "Resp", b"reply")

            def end_initiator() -> None:
                with other.transaction() as t2:
                    t2_pid.append(t2.conn.info.backend_pid)
                    t2.end_conversation(initiator)
                    t2_ended.set()
                    t2_may_commit.wait()

            if initiator_commits_first:
                t2_may_commit.set()
            ending = pool.submit(end_initiator)
            assert not blocked_until(t2_ended, t2_pid, app.broker), \
                "END of the initiator waits for the target's transaction"
            if initiator_commits_first:
                ending.result()
            # With T2 still open, T1's EndDialog finds the initiator busy in turn.
            t1.end_conversation(target)
            t2_may_commit.set()
        ending.result()
        held = count(app.broker, "SELECT count(*) FROM broker.transmissions")
        assert held == (1 if initiator_commits_first else 2)
    # The worker's next pass hands over what waited: both sides closed, nothing left.
    assert BrokerWorker(app.broker).run_once().messages_delivered == held
    assert endpoint_state(app.broker, initiator) is None
    assert endpoint_state(app.broker, target) == "CD"
    assert count(app.broker, "SELECT count(*) FROM broker.queue_messages") == 0
    assert count(app.broker, "SELECT count(*) FROM broker.transmissions") == 0


@pytest.mark.slow
def test_load_with_both_sides_ending_has_no_deadlock(app: App, dsn: str) -> None:
    """8 producers begin dialogs and end their side soon after, whatever came back; 4 readers
    answer each request and end the target side in the same transaction. Before, both sides
    ending at once deadlocked (40P01) several times a minute."""
    producers, readers, per_producer = 8, 4, 300
    failures: list[BaseException] = []
    produced = threading.Event()

    def produce(n: int) -> None:
        rng = random.Random(n)
        with Broker(dsn) as b:
            for _ in range(per_producer):
                with b.transaction() as tx:
                    handle = tx.begin_dialog("I", "T", "C")
                    tx.send(handle, "Req", b"request")
                time.sleep(rng.uniform(0, 0.01))
                try:
                    with b.transaction() as tx:
                        tx.end_conversation(handle)
                except BrokerError as e:  # (a deadlock, 40P01, raises out of the thread)
                    failures.append(e)

    def read() -> None:
        with Broker(dsn, poll_interval=0.05) as b:
            while True:
                try:
                    with b.transaction() as tx:
                        batch = tx.receive("q_t", 5, waitfor=True, timeout=0.2)
                        for m in batch:
                            if m.message_type_name == "Req":
                                tx.send_if_open(m.conversation_handle, "Resp", b"reply")
                        for handle in {m.conversation_handle for m in batch}:
                            tx.end_conversation(handle)
                except BrokerError as e:
                    failures.append(e)
                    return
                if not batch and produced.is_set():
                    return

    with ThreadPoolExecutor(producers + readers) as pool:
        reading = [pool.submit(read) for _ in range(readers)]
        try:
            for done in [pool.submit(produce, n) for n in range(producers)]:
                done.result()
        finally:
            produced.set()
        for done in reading:
            done.result()
    assert failures == []
    worker = BrokerWorker(app.broker)
    while worker.run_once().messages_delivered:
        pass
    # Every conversation ended on both sides: initiators gone, targets closed, nothing waiting.
    assert count(app.broker, "SELECT count(*) FROM broker.endpoints WHERE is_initiator") == 0
    assert count(app.broker, "SELECT count(*) FROM broker.endpoints WHERE state <> 'CD'") == 0
    assert count(app.broker, "SELECT count(*) FROM broker.endpoints") == producers * per_producer
    assert count(app.broker, "SELECT count(*) FROM broker.queue_messages") == 0
    assert count(app.broker, "SELECT count(*) FROM broker.transmissions") == 0
