"""Failover: the primary's postmaster killed (SIGKILL) under running clients, its synchronous
standby promoted, every client on a DSN that names both servers with
``target_session_attrs=read-write``. The clients go on in place on the new primary, and with
synchronous replication nothing that committed is lost.

A transaction whose COMMIT went out when the primary died has an unknown outcome: the client
never got the answer, and the standby may or may not hold it. The producer and reader below do
what docs/airflow.md ("Database faults") tells an application to do about it: record, in the
same transaction, what the transaction did, and after a lost connection look that record up on
the new primary before doing the work again.
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from airflow_broker import Broker, Message
from airflow_broker.reconnect import connection_lost, retry_while_disconnected
from airflow_broker.worker import BrokerWorker
from tests.support.brokers import App, standard_application
from tests.support.helpers import count, wait_until
from tests.support.standby_pair import StandbyPair

ROOT = str(Path(__file__).resolve().parents[2])
CONVERSATIONS = 4


@pytest.fixture
def app(standby_pair: StandbyPair) -> Iterator[App]:
    broker = Broker(standby_pair.dsn, poll_interval=0.2)
    try:
        yield standard_application(broker)
    finally:
        broker.close()


class Producer:
    """SENDs ``conversation:sequence`` bodies round-robin on its conversations, each SEND in a
    transaction of its own that also records it in ``public.sent``."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.handles = [App(broker).dialog() for _ in range(CONVERSATIONS)]
        self.acknowledged: list[tuple[int, int]] = []  # commits the server confirmed
        self.stop = threading.Event()
        self.failure: list[BaseException] = []

    def _send(self, conversation: int, sequence: int) -> None:
        with self.broker.transaction() as tx:
            tx.send(self.handles[conversation], "Req", f"{conversation}:{sequence}")
            tx.conn.execute("INSERT INTO public.sent VALUES (%s, %s)", [conversation, sequence])

    def _recorded(self, conversation: int, sequence: int) -> bool:
        with self.broker.transaction() as tx:
            row = tx.conn.execute("SELECT count(*) FROM public.sent WHERE conversation = %s"
                                  " AND sequence = %s", [conversation, sequence]).fetchone()
        return row is not None and row[0] == 1

    def send_once(self, conversation: int, sequence: int) -> None:
        while True:
            try:
                self._send(conversation, sequence)
                self.acknowledged.append((conversation, sequence))
                return
            except psycopg.OperationalError as exc:
                if not connection_lost(exc):
                    raise
            # The COMMIT may have gone through before the connection went: sending again
            # without looking would send the message twice.
            if retry_while_disconnected(lambda: self._recorded(conversation, sequence), "producer"):
                return

    def run(self) -> None:
        try:
            sequence = 0
            while not self.stop.is_set():
                for conversation in range(CONVERSATIONS):
                    self.send_once(conversation, sequence)
                sequence += 1
        except BaseException as exc:
            self.failure.append(exc)


class Reader:
    """RECEIVEs (WAITFOR) and records each message in ``public.consumed`` in the same
    transaction: the exactly-once processing of a broker application. A transaction lost with
    the primary either committed (its rows are in ``consumed``) or rolled back (its messages
    are on the queue again), so the reader just goes on."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.stop = threading.Event()  # set: stop once the queue is empty
        self.failure: list[BaseException] = []

    def _receive(self) -> int:
        with self.broker.transaction() as tx:
            messages = tx.receive("q_t", waitfor=True, timeout=0.5)
            for message in messages:
                body = message.text()
                assert body is not None
                conversation, sequence = body.split(":")
                tx.conn.execute("INSERT INTO public.consumed (conversation, sequence)"
                                " VALUES (%s, %s)", [int(conversation), int(sequence)])
        return len(messages)

    def run(self) -> None:
        try:
            while retry_while_disconnected(self._receive, "reader") or not self.stop.is_set():
                pass
        except BaseException as exc:
            self.failure.append(exc)


def application_tables(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE public.sent (conversation int, sequence int)")
        conn.execute("CREATE TABLE public.consumed (id bigserial PRIMARY KEY,"
                     " conversation int, sequence int)")


def rows(broker: Broker, query: str) -> list[tuple[int, int]]:
    with psycopg.connect(broker.dsn) as conn:
        return [(int(a), int(b)) for a, b in conn.execute(query).fetchall()]


def test_T_RC_01_nothing_committed_is_lost_or_duplicated_across_a_failover(
        app: App, standby_pair: StandbyPair) -> None:
    """Exactly-once, in-order delivery (spec: a conversation's messages are received once, in
    the order sent) holds across the primary's loss: every SEND the server acknowledged is on
    the new primary, every SEND that committed is received exactly once and in order, and the
    queue ends empty. The producer's and reader's pools go on in place."""
    broker = app.broker
    application_tables(broker.dsn)
    producer = Producer(broker)
    reader_broker = Broker(standby_pair.dsn, poll_interval=0.2)
    reader = Reader(reader_broker)
    threads = [threading.Thread(target=producer.run), threading.Thread(target=reader.run)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: len(producer.acknowledged) >= 40 or bool(producer.failure),
                   "the producer to get going", 120)
        wait_until(lambda: count(broker, "SELECT count(*) FROM public.consumed") >= 20
                   or bool(reader.failure), "the reader to get going", 120)
        before = len(producer.acknowledged)
        standby_pair.fail_over()
        wait_until(lambda: len(producer.acknowledged) >= before + 40
                   or bool(producer.failure) or not threads[0].is_alive(),
                   "the producer to send on the new primary", 120)
    finally:
        producer.stop.set()
        threads[0].join(timeout=120)
        reader.stop.set()
        threads[1].join(timeout=120)
        reader_broker.close()
    assert not producer.failure, producer.failure
    assert not reader.failure, reader.failure
    assert not any(thread.is_alive() for thread in threads)

    sent = rows(broker, "SELECT conversation, sequence FROM public.sent")
    consumed = rows(broker, "SELECT conversation, sequence FROM public.consumed ORDER BY id")
    assert set(producer.acknowledged) <= set(sent), "an acknowledged commit was lost"
    assert len(sent) == len(set(sent)), "a message was sent twice"
    assert sorted(consumed) == sorted(sent), "not every committed message received exactly once"
    per_conversation: dict[int, list[int]] = defaultdict(list)
    for conversation, sequence in consumed:
        per_conversation[conversation].append(sequence)
    for conversation, sequences in per_conversation.items():
        assert sequences == sorted(sequences), f"conversation {conversation} out of order"
    assert count(broker, "SELECT count(*) FROM q_t") == 0


def test_T_TM_01_the_worker_fires_timers_and_activates_after_a_failover_in_place(
        app: App, standby_pair: StandbyPair, monkeypatch: pytest.MonkeyPatch) -> None:
    """`airflow-broker worker` runs through the failover in place: a timer that falls due
    afterwards fires once, and so does the next one; queue activation, whose leader lock is a
    session on the old primary, takes it on the new one and starts a reader (spec 20)."""
    monkeypatch.setenv("PYTHONPATH", ROOT)  # the activated reader imports tests.support
    worker = BrokerWorker(app.broker, interval=0.1, transport=False,
                          activation_targets=["tests.support.activation_readers:*"])
    thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
    thread.start()

    def fired() -> int:
        return count(app.broker, "SELECT count(*) FROM broker.queue_messages"
                                 " WHERE message_type_id = 5")

    try:
        first, second = app.dialog(), app.dialog()
        with app.broker.transaction() as tx:
            tx.begin_conversation_timer(first, 3600)
        standby_pair.fail_over()
        retry_while_disconnected(lambda: app.broker.advance_clock(dt.timedelta(hours=2)), "test")
        wait_until(lambda: fired() == 1, "the worker to fire the timer", 120)
        with app.broker.transaction() as tx:
            tx.begin_conversation_timer(second, 3600)
        app.broker.advance_clock(dt.timedelta(hours=2))
        # Once the second has fired, the worker has passed over the first again.
        wait_until(lambda: fired() >= 2, "the worker to fire the second timer", 120)
        assert fired() == 2
        with app.broker.transaction() as tx:
            tx.alter_queue("q_t", activation_status=True,
                           activation_procedure="tests.support.activation_readers:stub",
                           max_queue_readers=1)
        send(app.broker, "activates a reader")
        wait_until(lambda: count(app.broker, "SELECT count(*) FROM broker.activation_log"
                                             " WHERE outcome = 'ended'") == 1,
                   "the worker to start a reader", 120)
        assert thread.is_alive()
    finally:
        worker.stop()
        thread.join(timeout=60)


def waiting_sessions(broker: Broker) -> int:
    return count(broker, "SELECT count(*) FROM broker.queue_waiters w"
                         " WHERE w.backend_pid IN (SELECT pid FROM pg_stat_activity)")


def test_T_RC_06_a_waitfor_blocked_across_a_failover_wakes_for_a_later_send(
        app: App, standby_pair: StandbyPair) -> None:
    """A WAITFOR (RECEIVE) blocked when the primary dies loses its transaction with it; the
    application's retry (as with any lost transaction) waits again on the new primary, and the
    SEND's NOTIFY there wakes it, not its (hourly) poll: the listener reconnected to the new
    primary and registered the waiter again."""
    broker = Broker(standby_pair.dsn, poll_interval=3600)
    received: list[Message] = []
    failure: list[BaseException] = []
    attempts: list[int] = []

    def receive() -> list[Message]:
        attempts.append(1)
        with broker.transaction() as tx:
            return tx.receive("q_t", waitfor=True, timeout=600)

    def wait() -> None:
        try:
            received.extend(retry_while_disconnected(receive, "waiter"))
        except BaseException as exc:
            failure.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    try:
        wait_until(lambda: waiting_sessions(broker) == 1 or bool(failure),
                   "the WAITFOR to register", 120)
        standby_pair.fail_over()
        wait_until(lambda: (len(attempts) > 1 and waiting_sessions(broker) == 1)
                   or bool(failure) or not waiter.is_alive(),
                   "the WAITFOR to register on the new primary", 120)
        assert not failure, failure
        send(app.broker, "wakes the waiter")
        waiter.join(timeout=120)
        assert not waiter.is_alive(), "the NOTIFY did not wake the WAITFOR"
    finally:
        if waiter.is_alive():
            retry_while_disconnected(lambda: send(app.broker, "releases the waiter"), "test")
            waiter.join(timeout=120)
        broker.close()
    assert not failure, failure
    assert [m.text() for m in received] == ["wakes the waiter"]


def send(broker: Broker, body: str) -> uuid.UUID:
    with broker.transaction() as tx:
        handle = tx.begin_dialog("I", "T", "C")
        tx.send(handle, "Req", body)
    return handle

