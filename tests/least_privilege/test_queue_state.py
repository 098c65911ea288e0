"""A queue's state and enable-queue as an application's login runs them (EnableQueueOperator,
QueueDisabledSensor, ``airflow-broker enable-queue``): shown to a login that may see the queue,
changed only with ALTER on it."""

from __future__ import annotations

import pytest

from airflow_broker import Broker
from airflow_broker._statements import runner_of
from airflow_broker.admin.enable_queue import enable_queue, queue_status
from airflow_broker.errors import InvalidObjectName, ObjectNotFound
from tests.support import roles
from tests.support.privileges import login, snapshot


@pytest.fixture
def held(owned_dsn: str) -> str:
    """HeldQueue, disabled by poison detection with a message waiting."""
    with Broker(owned_dsn) as dba:
        with dba.transaction() as tx:
            tx.create_queue("HeldQueue")
            tx.create_queue("HeldSenderQueue")
            tx.create_service("Held", "HeldQueue", ["DEFAULT"])
            tx.create_service("HeldSender", "HeldSenderQueue")
            handle = tx.begin_dialog("HeldSender", "Held")
            tx.send(handle, "DEFAULT", b"waiting")
        for _ in range(5):
            with pytest.raises(RuntimeError), dba.transaction() as tx:
                assert tx.receive("HeldQueue")
                raise RuntimeError("the reader fails")
        with dba.transaction() as tx:
            runner_of(tx).scalar(b"SELECT broker.resolve_receives()")
    return owned_dsn


def test_a_login_with_alter_enables_the_queue(held: str) -> None:
    with roles.role(held, *roles.APPLICATION_GRANTS,
                    roles.broker_grant("ALTER", "QUEUE::HeldQueue"),
                    prefix="enabler", login=True) as enabler, login(held, enabler) as broker:
        result = enable_queue(broker, "HeldQueue")
    assert result.changed
    assert not result.before.is_receive_enabled
    assert result.before.disabled_reason == "POISON"
    assert result.before.poison_reason  # why poison detection disabled it
    assert result.after.is_receive_enabled and result.after.ready_messages == 1


def test_a_reader_sees_the_state_but_cannot_enable(held: str) -> None:
    with roles.role(held, *roles.APPLICATION_GRANTS,
                    roles.broker_grant("RECEIVE", "QUEUE::HeldQueue"),
                    prefix="reader", login=True) as reader, login(held, reader) as broker:
        status = queue_status(broker, "HeldQueue")
        assert not status.is_receive_enabled and status.disabled_reason == "POISON"
        before = snapshot(held)
        with pytest.raises(ObjectNotFound) as denied:
            enable_queue(broker, "HeldQueue")
        assert denied.value.number == 15151
        assert snapshot(held) == before


def test_an_outsider_is_told_there_is_no_such_queue(held: str) -> None:
    with roles.role(held, *roles.APPLICATION_GRANTS, prefix="outsider",
                    login=True) as outsider, login(held, outsider) as broker:
        with pytest.raises(InvalidObjectName) as hidden:
            queue_status(broker, "HeldQueue")
        assert hidden.value.number == 208
