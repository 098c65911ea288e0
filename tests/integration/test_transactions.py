"""Broker.transaction(): the application's own statements on ``tx.conn`` and the broker's
commit or roll back together, whichever comes first, and the pooled connection is left as the
pool hands it out."""

from __future__ import annotations

import uuid

import pytest

from airflow_broker import Broker, BrokerError
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
