"""The broker's pages in Airflow's UI, logged in as docs/security.md's UI login: it sees the
queues it may see (SQL Server's metadata visibility), reads a queue's messages and quarantine
and replays with RECEIVE on it, enables with ALTER on it, sees what waits in the
transmission queue for the services whose queue it may see and retries it with RECEIVE
there, and gets the broker's refusal,
changing nothing, for everything else. airflow_broker.ui.console is what the pages' API
calls; these run it as real logins holding only the documented grants."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from airflow_broker import Broker
from airflow_broker._statements import runner_of
from airflow_broker.errors import BrokerError
from airflow_broker.ui import console, quarantine, transmission
from airflow_broker.worker.transport import Transport
from tests.support import roles
from tests.support.privileges import Application, login, snapshot
from tests.support.quarantine import PoisonedQueue, poisoned_queue

A = Application("a_")
B = Application("b_")
QUEUE = "a_q_t"

# docs/security.md, "The UI in Airflow".
READ_ONLY_UI = (*roles.APPLICATION_GRANTS, roles.broker_grant("VIEW DEFINITION", "DATABASE"))


@pytest.fixture
def apps(owned_dsn: str) -> None:
    with Broker(owned_dsn) as admin, admin.transaction() as tx:
        A.create(tx)
        B.create(tx)


@pytest.fixture
def poisoned(owned_dsn: str, apps: None) -> PoisonedQueue:
    """A's target queue disabled by poison detection, with two messages in its quarantine and
    one waiting; B's objects beside it."""
    with Broker(owned_dsn) as admin:
        return poisoned_queue(admin, "a_I", "a_T", "a_C", "a_Req", QUEUE,
                              ["first", "second", "poison"], error="ValueError: bad trade")


@contextmanager
def ui_login(dsn: str, *grants: str) -> Iterator[Broker]:
    with roles.role(dsn, *roles.APPLICATION_GRANTS, *grants, prefix="ui",
                    login=True) as name, login(dsn, name) as broker:
        yield broker


def refused(call: Callable[[], Any]) -> int:
    with pytest.raises(BrokerError) as error:
        call()
    return error.value.number


def row(broker: Broker, name: str = QUEUE) -> dict[str, Any]:
    [found] = [q for q in console.overview(broker) if q["name"] == name]
    return found


def test_a_login_with_no_permission_sees_no_queue(owned_dsn: str,
                                                  poisoned: PoisonedQueue) -> None:
    with ui_login(owned_dsn) as ui:
        assert console.overview(ui) == []
        assert console.queue_rights(ui, QUEUE) == {"may_receive": False, "may_alter": False}
        # As for a queue that does not exist.
        assert refused(lambda: console.queue_messages(ui, QUEUE, bodies=True)) == 208
        assert refused(lambda: quarantine.quarantine(ui, QUEUE, bodies=True)) == 208
        assert refused(lambda: console.set_queue_status(ui, QUEUE, True)) == 15151


def test_view_definition_on_one_queue_shows_that_queue_and_nothing_of_its_messages(
        owned_dsn: str, poisoned: PoisonedQueue) -> None:
    with ui_login(owned_dsn, roles.broker_grant("VIEW DEFINITION", f"QUEUE::{QUEUE}")) as ui:
        before = snapshot(owned_dsn)
        [queue] = console.overview(ui)
        assert queue["name"] == QUEUE
        assert (queue["enabled"], queue["disabled_reason"]) == (False, "POISON")
        assert (queue["depth"], queue["quarantined"]) == (1, 2)
        assert queue["oldest_message_at"] is not None
        assert (queue["may_receive"], queue["may_alter"]) == (False, False)
        assert console.queue_rights(ui, QUEUE) == {"may_receive": False, "may_alter": False}
        # Which message poisoned the queue is a reader's to know.
        assert queue["poison"]["message_ids"] == []
        assert refused(lambda: console.queue_messages(ui, QUEUE, bodies=True)) == 229
        assert refused(lambda: quarantine.quarantine(ui, QUEUE, bodies=True)) == 229
        assert refused(lambda: quarantine.replay(ui, QUEUE, poisoned.quarantine_ids,
                                              enable=False)) == 229
        assert refused(lambda: console.set_queue_status(ui, QUEUE, True)) == 15151
        assert refused(lambda: quarantine.discard(ui, QUEUE, poisoned.quarantine_ids)) == 229
        # B's queue, which it may not see, is answered as one that does not exist.
        assert refused(lambda: console.queue_messages(ui, "b_q_t", bodies=True)) == 208
        assert snapshot(owned_dsn) == before


def test_receive_reads_and_replays_but_does_not_enable(owned_dsn: str,
                                                       poisoned: PoisonedQueue) -> None:
    with ui_login(owned_dsn, roles.broker_grant("RECEIVE", f"QUEUE::{QUEUE}")) as ui:
        assert [q["name"] for q in console.overview(ui)] == [QUEUE]
        queue = row(ui)
        assert (queue["may_receive"], queue["may_alter"]) == (True, False)
        assert console.queue_rights(ui, QUEUE) == {"may_receive": True, "may_alter": False}
        assert queue["poison"]["message_ids"] == [str(poisoned.poison_message_id)]
        [group] = console.queue_messages(ui, QUEUE, bodies=True)["groups"]
        assert [m["body"] for m in group["messages"]] == ["poison"]
        found = quarantine.quarantine(ui, QUEUE, bodies=True)
        quarantined = found["messages"]
        assert [m["quarantine_id"] for m in quarantined] == poisoned.quarantine_ids
        assert [m["body"] for m in quarantined] == ["first", "second"]
        assert [(g["count"], g["quarantine_ids"]) for g in found["groups"]] == [
            (2, poisoned.quarantine_ids)]
        # Replay and enable is both or neither: without ALTER, neither.
        assert refused(lambda: quarantine.replay_and_enable(
            ui, QUEUE, poisoned.quarantine_ids)) == 15151
        assert (row(ui)["quarantined"], row(ui)["depth"]) == (2, 1)
        assert refused(lambda: console.set_queue_status(ui, QUEUE, True)) == 15151
        assert quarantine.replay(ui, QUEUE, poisoned.quarantine_ids, enable=False) == 2
        queue = row(ui)
        assert (queue["enabled"], queue["quarantined"], queue["depth"]) == (False, 0, 3)


def test_replay_takes_only_messages_of_the_queues_own_quarantine(
        owned_dsn: str, poisoned: PoisonedQueue) -> None:
    with Broker(owned_dsn) as admin:
        others = poisoned_queue(admin, "b_I", "b_T", "b_C", "b_Req", "b_q_t",
                                ["other", "poison"], error="KeyError")
    with ui_login(owned_dsn, roles.broker_grant("RECEIVE", f"QUEUE::{QUEUE}")) as ui:
        with pytest.raises(BrokerError) as error:
            quarantine.replay(ui, QUEUE, others.quarantine_ids, enable=False)
        assert error.value.number == 15151
        assert str(others.quarantine_ids[0]) in str(error.value)
        # Nor may it discard them: one id of another queue refuses them all.
        with pytest.raises(BrokerError) as error:
            quarantine.discard(ui, QUEUE, [*poisoned.quarantine_ids, others.quarantine_ids[0]])
        assert error.value.number == 15151
        assert len(quarantine.quarantine(ui, QUEUE, bodies=False)["messages"]) == 2
        assert quarantine.discard(ui, QUEUE, poisoned.quarantine_ids[:1]) == 1
        assert [m["quarantine_id"] for m in
                quarantine.quarantine(ui, QUEUE, bodies=False)["messages"]] == (
            poisoned.quarantine_ids[1:])
    with Broker(owned_dsn) as admin:
        assert len(quarantine.quarantine(admin, "b_q_t", bodies=False)["messages"]) == 1


def test_alter_enables_and_disables_but_reads_nothing(owned_dsn: str,
                                                      poisoned: PoisonedQueue) -> None:
    with ui_login(owned_dsn, roles.broker_grant("ALTER", f"QUEUE::{QUEUE}")) as ui:
        queue = row(ui)
        assert (queue["may_receive"], queue["may_alter"]) == (False, True)
        assert console.queue_rights(ui, QUEUE) == {"may_receive": False, "may_alter": True}
        assert console.queue_rights(ui, "b_q_t") == {"may_receive": False, "may_alter": False}
        console.set_queue_status(ui, QUEUE, True)
        assert row(ui)["enabled"] is True
        console.set_queue_status(ui, QUEUE, False)
        assert (row(ui)["enabled"], row(ui)["disabled_reason"]) == (False, "ADMIN")
        assert refused(lambda: quarantine.quarantine(ui, QUEUE, bodies=True)) == 229
        assert refused(lambda: console.set_queue_status(ui, "b_q_t", True)) == 15151


def test_the_documented_read_only_ui_sees_every_queue_and_reads_none(
        owned_dsn: str, poisoned: PoisonedQueue) -> None:
    with ui_login(owned_dsn, *READ_ONLY_UI) as ui:
        names = {q["name"] for q in console.overview(ui)}
        assert {"a_q_i", "a_q_t", "b_q_i", "b_q_t"} <= names
        assert refused(lambda: console.queue_messages(ui, QUEUE, bodies=True)) == 229
        assert refused(lambda: console.set_queue_status(ui, QUEUE, True)) == 15151


def test_the_documented_operator_ui_replays_and_enables_and_the_queue_drains(
        owned_dsn: str, poisoned: PoisonedQueue) -> None:
    operator = (*READ_ONLY_UI, roles.broker_grant("RECEIVE", f"QUEUE::{QUEUE}"),
                roles.broker_grant("ALTER", f"QUEUE::{QUEUE}"))
    with ui_login(owned_dsn, *operator) as ui:
        assert quarantine.replay_and_enable(ui, QUEUE, poisoned.quarantine_ids) == 2
        queue = row(ui)
        assert (queue["enabled"], queue["quarantined"], queue["depth"]) == (True, 0, 3)
    with Broker(owned_dsn) as admin, admin.transaction() as tx:
        assert [m.text() for m in tx.receive(QUEUE, 10)] == ["first", "second", "poison"]


def leak(broker: Broker, prefix: str) -> uuid.UUID:
    """The fire-and-forget leak: the initiator ends at once, the target ends on EndDialog and
    its CLOSED endpoint waits out a lifetime of decades. Returns the target's handle."""
    with broker.transaction() as tx:
        handle = tx.begin_dialog(f"{prefix}I", f"{prefix}T", f"{prefix}C")
        tx.send(handle, f"{prefix}Req", "fire")
        tx.end_conversation(handle)
    with broker.transaction() as tx:
        received = tx.receive(f"{prefix}q_t")
        tx.end_conversation(received[0].conversation_handle)
    return received[0].conversation_handle


def test_conversations_show_a_reader_its_own_services_leaks_and_cleanup_is_the_owners(
        owned_dsn: str, apps: None) -> None:
    with Broker(owned_dsn) as admin:
        a_leak, b_leak = leak(admin, "a_"), leak(admin, "b_")
    with ui_login(owned_dsn, roles.broker_grant("RECEIVE", f"QUEUE::{QUEUE}")) as ui:
        shown = console.conversations(ui)
        handles = {c["conversation_handle"]: c for c in shown["conversations"]}
        assert str(b_leak) not in handles
        assert handles[str(a_leak)]["is_leaked"] is True
        assert handles[str(a_leak)]["state_desc"] == "CLOSED"
        assert {c["service_name"] for c in shown["conversations"]} == {"a_T"}
        leaks = console.conversations(ui, leaked_only=True)["conversations"]
        assert [c["conversation_handle"] for c in leaks] == [str(a_leak)]
        assert {"state": "CD", "endpoints": 1, "leaked": 1} in shown["counts"]
        # WITH CLEANUP is the schema owner's: RECEIVE is not enough (229).
        assert refused(lambda: console.cleanup_leak(ui, a_leak, str(a_leak))) == 229
        # Another's leak is, to this login, a conversation that does not exist.
        assert refused(lambda: console.cleanup_leak(ui, b_leak, str(b_leak))) == 8426
        assert len(console.conversations(ui, leaked_only=True)["conversations"]) == 1
    with ui_login(owned_dsn) as nobody:
        assert console.conversations(nobody) == {"conversations": [], "truncated": False,
                                                 "counts": []}
    with Broker(owned_dsn) as admin:
        with pytest.raises(console.NotConfirmed):
            console.cleanup_leak(admin, a_leak, None)
        console.cleanup_leak(admin, a_leak, str(a_leak))
        assert [c["conversation_handle"] for c in console.conversations(
            admin, leaked_only=True)["conversations"]] == [str(b_leak)]


FAR_A = "//Far/A"
FAR_B = "//Far/B"


@pytest.fixture
def waiting(owned_dsn: str, apps: None) -> None:
    """A's initiator has two messages, B's one, waiting for far services behind a route that
    leads nowhere; each tried once, and backing off."""
    with Broker(owned_dsn) as admin:
        with admin.transaction() as tx:
            for far in (FAR_A, FAR_B):
                tx.create_route(f"route_{far[-1]}", "postgresql://far@127.0.0.1:1/far",
                                service_name=far)
            a = tx.begin_dialog("a_I", FAR_A, "a_C")
            tx.send(a, "a_Req", "one")
            tx.send(a, "a_Req", "two")
            tx.send(tx.begin_dialog("b_I", FAR_B, "b_C"), "b_Req", "three")
        transport = Transport(admin)
        try:
            assert transport.step().held == 3
        finally:
            transport.close()


def routes(broker: Broker) -> dict[str, dict[str, Any]]:
    return {r["to_service_name"]: r for r in transmission.transmissions(broker)["routes"]}


def due(dsn: str) -> dict[str, bool]:
    """Per far service: whether all its waiting messages are due now."""
    with Broker(dsn) as admin, admin.transaction() as tx:
        rows = runner_of(tx).run(
            b"SELECT to_service_name, bool_and(next_attempt_at <= broker.utc_now())"
            b" FROM broker.transmission_queue GROUP BY 1")
    return {service: bool(is_due) for service, is_due in rows}


def test_a_login_with_no_permission_sees_no_route_and_retries_nothing(
        owned_dsn: str, waiting: None) -> None:
    with ui_login(owned_dsn) as ui:
        before = snapshot(owned_dsn)
        assert transmission.transmissions(ui) == {"routes": [], "truncated": False}
        # As for a route where nothing waits.
        assert transmission.retry_transmissions(ui, FAR_A, None) == 0
        assert snapshot(owned_dsn) == before


def test_the_read_only_ui_sees_every_route_and_may_retry_none(
        owned_dsn: str, waiting: None) -> None:
    with ui_login(owned_dsn, *READ_ONLY_UI) as ui:
        shown = routes(ui)
        assert set(shown) == {FAR_A, FAR_B}
        assert (shown[FAR_A]["messages"], shown[FAR_A]["delivery"]) == (2, "remote")
        assert shown[FAR_A]["transmission_status"].startswith(
            "The target service broker is unreachable")
        assert not shown[FAR_A]["may_retry"] and not shown[FAR_B]["may_retry"]
        before = snapshot(owned_dsn)
        with pytest.raises(BrokerError) as error:
            transmission.retry_transmissions(ui, FAR_A, None)
        assert error.value.number == 229
        assert "a_q_i" in str(error.value)
        assert snapshot(owned_dsn) == before


def test_receive_on_the_senders_queue_retries_its_route_alone(
        owned_dsn: str, waiting: None) -> None:
    with ui_login(owned_dsn, *READ_ONLY_UI, *A.sender_grants()) as ui:
        shown = routes(ui)
        assert (shown[FAR_A]["may_retry"], shown[FAR_B]["may_retry"]) == (True, False)
        assert due(owned_dsn) == {FAR_A: False, FAR_B: False}
        assert transmission.retry_transmissions(ui, FAR_A, None) == 2
        assert due(owned_dsn) == {FAR_A: True, FAR_B: False}
        assert refused(lambda: transmission.retry_transmissions(ui, FAR_B, None)) == 229
        assert due(owned_dsn) == {FAR_A: True, FAR_B: False}
    with ui_login(owned_dsn, *A.sender_grants()) as sender:
        # Without VIEW DEFINITION on the database: A's route only; B's is, to it, a route
        # where nothing waits.
        assert set(routes(sender)) == {FAR_A}
        assert transmission.retry_transmissions(sender, FAR_B, None) == 0
        assert due(owned_dsn)[FAR_B] is False


CONSUMER = "task:trades/manual__1/receive/-1"


@pytest.fixture
def received(owned_dsn: str, apps: None) -> dict[str, uuid.UUID]:
    """A task instance that received one message from A's target queue and one from B's into
    the Airflow inbox, as WaitForReceiveSensor does; the target handles by prefix."""
    handles: dict[str, uuid.UUID] = {}
    with Broker(owned_dsn) as admin:
        for prefix in ("a_", "b_"):
            with admin.transaction() as tx:
                handle = tx.begin_dialog(f"{prefix}I", f"{prefix}T", f"{prefix}C")
                tx.send(handle, f"{prefix}Req", f"to {prefix}")
            with admin.transaction() as tx:
                runner = runner_of(tx)
                [claimed] = runner.run(runner.queries["inbox_claim"], [
                    CONSUMER, f"{prefix}q_t", None, None, None, None, "trades", "manual__1"])
            handles[prefix] = claimed[8]
    return handles


def test_a_task_instances_inbox_shows_what_the_login_may_receive(
        owned_dsn: str, received: dict[str, uuid.UUID]) -> None:
    with ui_login(owned_dsn) as nobody:
        before = snapshot(owned_dsn)
        shown = console.task_instance(nobody, CONSUMER, list(received.values()), bodies=True)
        assert (shown["inbox"], shown["conversations"]) == ([], [])
        assert snapshot(owned_dsn) == before
    with ui_login(owned_dsn, *READ_ONLY_UI) as viewer:
        # Seeing a queue is not reading what a RECEIVE took from it.
        shown = console.task_instance(viewer, CONSUMER, list(received.values()), bodies=True)
        assert (shown["inbox"], shown["conversations"]) == ([], [])
    with ui_login(owned_dsn, *A.reader_grants()) as reader:
        before = snapshot(owned_dsn)
        shown = console.task_instance(reader, CONSUMER, [received["b_"]], bodies=True)
        [message] = shown["inbox"]
        assert (message["queue_name"], message["state"], message["body"]) == (
            "a_q_t", "claimed", "to a_")
        assert message["message_type_name"] == "a_Req"
        # B's conversation, named by the task, is not this login's to see.
        [endpoint] = shown["conversations"]
        assert endpoint["conversation_handle"] == str(received["a_"])
        assert (endpoint["service_name"], endpoint["far_service"], endpoint["state"]) == (
            "a_T", "a_I", "CO")
        masked = console.task_instance(reader, CONSUMER, [], bodies=False)["inbox"]
        assert [(m["body"], m["body_masked"]) for m in masked] == [(None, True)]
        # Another task instance's key holds nothing.
        assert console.task_instance(reader, CONSUMER + "x", [], bodies=True)["inbox"] == []
        assert snapshot(owned_dsn) == before
    with Broker(owned_dsn) as admin:
        assert [m["queue_name"] for m in console.task_instance(
            admin, CONSUMER, [], bodies=False)["inbox"]] == ["a_q_t", "b_q_t"]


def test_one_conversation_shows_the_endpoints_whose_queue_the_login_may_receive_from(
        owned_dsn: str, apps: None) -> None:
    """The end-to-end view is conversation_endpoints' visibility: a reader of the target's
    queue sees the target's endpoint and its messages, not the initiator's endpoint, whose
    handle is to it one that does not exist (8426); a login without RECEIVE sees neither."""
    with Broker(owned_dsn) as admin, admin.transaction() as tx:
        initiator = tx.begin_dialog("a_I", "a_T", "a_C")
        tx.send(initiator, "a_Req", "hello")
    with ui_login(owned_dsn, *A.reader_grants()) as ui:
        assert refused(lambda: console.conversation(ui, initiator, bodies=True)) == 8426
        [listed] = console.conversations(ui)["conversations"]
        page = console.conversation(ui, uuid.UUID(listed["conversation_handle"]), bodies=True)
        assert [(e["service_name"], e["is_initiator"]) for e in page["endpoints"]] == [
            ("a_T", False)]
        assert [(m["place"], m["body"]) for m in page["messages"]] == [("queue", "hello")]
    with ui_login(owned_dsn, *A.sender_grants()) as ui:
        page = console.conversation(ui, initiator, bodies=True)
        assert [e["service_name"] for e in page["endpoints"]] == ["a_I"]
        assert page["messages"] == []  # they wait in the target's queue
    with ui_login(owned_dsn, *READ_ONLY_UI) as ui:
        assert refused(lambda: console.conversation(ui, initiator, bodies=True)) == 8426
