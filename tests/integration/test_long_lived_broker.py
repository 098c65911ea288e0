"""A Broker that lives as long as the worker, the triggerer or a Spark driver: nothing it
looked up goes stale when another process drops a queue and creates it again under the same
name (with a new id)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from airflow_broker import Broker
from airflow_broker._statements import runner_of
from airflow_broker.messages import Message
from airflow_broker.poison.detection import expect_receive
from tests.support.brokers import App
from tests.support.helpers import count, wait_until


def recreate_q_t(dsn: str) -> int:
    """Drops q_t (and its service T) and creates both again, as another process would; the
    new queue's id."""
    with Broker(dsn) as other, other.transaction() as tx:
        tx.drop_service("T")
        tx.drop_queue("q_t")
        new_id = tx.create_queue("q_t")
        tx.create_service("T", "q_t", ["C"])
    return new_id


def test_waitfor_after_the_queue_is_created_again_waits_on_the_new_queue(app: App) -> None:
    """The WAITFOR registers its waiter under the new queue's id (with the old one the
    registration failed, and the wait went on by polling alone) and wakes on the SEND."""
    broker = app.broker
    with broker.transaction() as tx:
        assert tx.receive("q_t", waitfor=True, timeout=0.2) == []
    new_id = recreate_q_t(broker.dsn)

    def wait() -> list[Message]:
        with broker.transaction() as tx:
            return tx.receive("q_t", waitfor=True, timeout=120)

    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(wait)
        wait_until(lambda: count(broker, "SELECT count(*) FROM broker.queue_waiters"
                                         " WHERE queue_id = %s", (new_id,)) == 1
                   or waiting.done(), "the WAITFOR's waiter on the new queue")
        assert not waiting.done(), waiting.result()
        handle = app.dialog()
        with broker.transaction() as tx:
            tx.send(handle, "Req", "wake up")
        (message,) = waiting.result(timeout=120)
    assert message.text() == "wake up"


def test_an_activated_procedures_rollbacks_count_for_the_new_queue(app: App) -> None:
    """A transaction registered before code the reader does not see receives (an activated
    PostgreSQL procedure, expect_receive) counts for the queue of that name now: five
    rollbacks disable the new queue."""
    broker = app.broker
    with broker.transaction() as tx:
        expect_receive(tx, "q_t")
    recreate_q_t(broker.dsn)
    handle = app.dialog()
    with broker.transaction() as tx:
        tx.send(handle, "Req", "poison")
    for _ in range(5):
        with pytest.raises(RuntimeError), broker.transaction() as tx:
            expect_receive(tx, "q_t")
            assert tx.conn.execute("SELECT * FROM broker.receive('q_t', 1)").fetchall()
            raise RuntimeError("the procedure fails")
    assert count(broker, "SELECT count(*) FROM broker.service_queues"
                         " WHERE name = 'q_t' AND NOT is_receive_enabled") == 1


def test_the_poll_interval_is_one_setting(app: App) -> None:
    """Broker.poll_interval set after construction is the interval its WAITFORs poll at."""
    broker = app.broker
    broker.poll_interval = 0.05
    with broker.transaction() as tx:
        assert runner_of(tx).shared.poll_interval == 0.05
