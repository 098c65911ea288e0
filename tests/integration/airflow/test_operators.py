"""Every operator through dag.test() against the test's PostgreSQL database."""

from __future__ import annotations

import datetime as dt
import uuid

import psycopg
import pytest

from airflow_broker import END_DIALOG, Broker
from airflow_broker.operators.broker import BrokerDeprecationWarning, EndConversationOperator
from tests.fixtures.airflow import RunDag, task_states, xcom
from tests.support.airflow_helpers import dag_file
from tests.support.airflow_provider import FireAndForgetWarning
from tests.support.brokers import App


def rows(dsn: str, query: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query).fetchall()


def test_operators(run_dag: RunDag, broker_conn: str) -> None:
    with pytest.warns(FireAndForgetWarning, match="fire-and-forget"):
        dag_run = run_dag("t_operators")
    states = task_states(dag_run)
    assert set(states.values()) == {"success"}, states

    created = xcom(dag_run, "setup")
    assert "queue q_t" in created["created"] and "contract CX" in created["created"]
    again = xcom(dag_run, "setup_again")
    assert again["created"] == [] and again["altered"] == []
    assert len(again["unchanged"]) == len(created["created"])
    assert rows(broker_conn, "SELECT poison_threshold FROM broker.queues WHERE name = 'q_t'") \
        == [(3,)]

    handle = xcom(dag_run, "begin")
    assert xcom(dag_run, "send_text") == handle
    due = dt.datetime.fromisoformat(xcom(dag_run, "timer"))
    assert dt.timedelta(minutes=4) < due - dt.datetime.now() < dt.timedelta(minutes=6)

    # The target's callback got every body as sent: templated text, raw bytes, JSON, XML.
    received = xcom(dag_run, "target")
    bodies = {m["message_type_name"] + ":" + str(m["body"]) for m in received
              if m["message_type_name"] != END_DIALOG}
    assert "Req:templated text" in bodies
    assert 'Req:{"order": 7, "ok": true}' in bodies
    assert any(b.startswith("XmlReq:<order id=") for b in bodies)
    assert "Req:forget me" in bodies
    raw = [m for m in received if m["body_base64"] == "AAFyYXc="]
    assert len(raw) == 1 and raw[0]["body"] is not None  # b"\x00\x01raw" decodes as text too

    # Replies and the target's EndDialog wait on the initiator's queue, in order.
    with Broker(broker_conn) as broker, broker.transaction() as tx:
        replies = tx.receive("q_i", conversation_handle=uuid.UUID(handle))
    assert [m.text() for m in replies[:3]] == ["re: templated text", "re: \x00\x01raw",
                                               're: {"order": 7, "ok": true}']
    assert replies[-1].is_end_dialog

    # What the warning was about: the fire-and-forget dialog leaked its target endpoint.
    assert rows(broker_conn, "SELECT count(*) FROM broker.leaked_endpoints") == [(1,)]
    assert rows(broker_conn, "SELECT count(*) FROM broker.conversation_endpoints e"
                             f" WHERE e.conversation_handle = '{xcom(dag_run, 'orphan')}'") \
        == [(0,)]


def test_receive_callback_failure_rolls_back(run_dag: RunDag, broker_conn: str,
                                             app: App) -> None:
    handle = app.dialog()
    with app.broker.transaction() as tx:
        tx.send(handle, "Req", "poison")
    dag_run = run_dag("t_receive_fails")
    assert task_states(dag_run) == {"receive": "failed"}
    # The message is back on the queue, the reply was never sent, and the rollback counted
    # towards poison-message detection.
    assert rows(broker_conn, "SELECT convert_from(message_body, 'UTF8') FROM q_t") == \
        [("poison",)]
    assert rows(broker_conn, "SELECT count(*) FROM q_i") == [(0,)]
    assert rows(broker_conn, "SELECT consecutive_rollbacks FROM broker.queues"
                             " WHERE name = 'q_t'") == [(1,)]


def test_end_conversation_takes_the_engines_parameter_names(run_dag: RunDag, app: App) -> None:
    """``error`` and ``description``, as ``Transaction.end_conversation`` names them."""
    handle = app.dialog()
    with app.broker.transaction() as tx:
        tx.send(handle, "Req", "first")
    with dag_file("t_end_with_error", f"""
            EndConversationOperator(task_id="end", conversation_handle="{handle}", error=42,
                                    description="gave up")
            """):
        dag_run = run_dag("t_end_with_error")
    assert task_states(dag_run) == {"end": "success"}
    with app.broker.transaction() as tx:
        received = tx.receive("q_t")
    assert [m.text() for m in received if not m.is_error] == ["first"]
    (error,) = [m.error() for m in received if m.is_error]
    assert (error.code, error.description) == (42, "gave up")


def test_end_conversation_keeps_the_old_parameter_names_with_a_warning() -> None:
    from airflow.exceptions import AirflowProviderDeprecationWarning

    with pytest.warns(BrokerDeprecationWarning) as caught:
        old = EndConversationOperator(task_id="old", conversation_handle="h", error_code=42,
                                      error_description="gave up")
    assert [str(w.message) for w in caught] == [
        "error_code is deprecated: use error, as the engine does",
        "error_description is deprecated: use description, as the engine does"]
    assert (old.error, old.description) == (42, "gave up")
    assert issubclass(BrokerDeprecationWarning, AirflowProviderDeprecationWarning)
    with pytest.raises(ValueError, match="give only error"):
        EndConversationOperator(task_id="both", conversation_handle="h", error=1,
                                error_code=2)
    with pytest.raises(ValueError, match="exclude each other"):
        EndConversationOperator(task_id="cleanup", conversation_handle="h", cleanup=True,
                                description="x")
