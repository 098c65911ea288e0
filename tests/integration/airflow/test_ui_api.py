"""The API of the broker's pages in Airflow's UI (airflow_broker/ui/api.py) on a real broker
database, with tokens of Airflow's own auth manager (SimpleAuthManager) and its audit log."""

from __future__ import annotations

import datetime as dt
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import psycopg
import pytest
from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from fastapi.testclient import TestClient

from airflow_broker import Broker
from airflow_broker.messages import ERROR
from airflow_broker.ui import quarantine as quarantine_page
from airflow_broker.ui.console import MESSAGE_LIMIT
from airflow_broker.worker.transport import Transport
from tests.fixtures.airflow import RunDag, connection_json, task_states
from tests.support import roles
from tests.support.airflow_helpers import dag_file
from tests.support.brokers import App
from tests.support.quarantine import PoisonedQueue, poisoned_queue

# The auth manager signs and checks tokens with this secret; Airflow reads it on first use
# and keeps it for the process, so it is set once, like the rest of tests/fixtures/airflow.py.
os.environ.setdefault("AIRFLOW__API_AUTH__JWT_SECRET", "ui-api-tests-" + "x" * 64)

QUEUE = "q_t"
TAB_DAG = "t_ui_tabs"
READS = ("/api/overview", f"/api/queues/{QUEUE}", f"/api/queues/{QUEUE}/quarantine")
WRITES: tuple[tuple[str, dict[str, Any]], ...] = (
    (f"/api/queues/{QUEUE}/status", {"enabled": True}),
    (f"/api/queues/{QUEUE}/replay-and-enable", {"quarantine_ids": [1]}),
)


class Ui:
    """The plugin's app behind a test client, and tokens for SimpleAuthManager's roles."""

    def __init__(self, client: TestClient) -> None:
        from airflow.api_fastapi.app import init_auth_manager

        self.client = client
        manager = init_auth_manager()
        self.tokens = {role: manager.generate_jwt(SimpleAuthManagerUser(
            username=f"ui_{role}", role=role)) for role in ("viewer", "user", "op", "admin")}

    def get(self, path: str, role: str | None = None, **kwargs: Any) -> Any:
        return self.client.get(path, headers=self._auth(role), **kwargs)

    def post(self, path: str, body: Any, role: str | None = None,
             headers: dict[str, str] | None = None) -> Any:
        return self.client.post(path, json=body, headers={**self._auth(role), **(headers or {})})

    def _auth(self, role: str | None) -> dict[str, str]:
        return {} if role is None else {"Authorization": f"Bearer {self.tokens[role]}"}


@pytest.fixture
def ui(airflow_db: Path, broker_conn: str) -> Iterator[Ui]:
    from airflow_broker.ui import api

    try:
        with TestClient(api.app) as client:
            yield Ui(client)
    finally:
        # The next test's broker_default is another database.
        api.close_brokers()


class BodiesWithheld(SimpleAuthManager):
    """An auth manager that refuses message bodies to everyone, as a FAB role without
    can_read on Broker Message Bodies does."""

    def is_authorized_custom_view(self, *, method: Any, resource_name: str,
                                  user: SimpleAuthManagerUser) -> bool:
        return resource_name != "Broker Message Bodies" and bool(
            super().is_authorized_custom_view(method=method, resource_name=resource_name,
                                              user=user))


class DagWithheld(SimpleAuthManager):
    """An auth manager that refuses everyone the DAG t_ui_tabs, as a FAB role without
    can_read on that DAG does."""

    def is_authorized_dag(self, *, method: Any, user: SimpleAuthManagerUser,
                          access_entity: Any = None, details: Any = None) -> bool:
        return getattr(details, "id", None) != TAB_DAG and bool(super().is_authorized_dag(
            method=method, user=user, access_entity=access_entity, details=details))


class TaskInstancesWithheld(SimpleAuthManager):
    """An auth manager that lets everyone read DAGs but not their task instances."""

    def is_authorized_dag(self, *, method: Any, user: SimpleAuthManagerUser,
                          access_entity: Any = None, details: Any = None) -> bool:
        from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity

        return access_entity != DagAccessEntity.TASK_INSTANCE and bool(
            super().is_authorized_dag(method=method, user=user, access_entity=access_entity,
                                      details=details))


RECORDED: set[tuple[str, str]] = set()


class Recording(SimpleAuthManager):
    """SimpleAuthManager, noting every custom view it is asked about."""

    def is_authorized_custom_view(self, *, method: Any, resource_name: str,
                                  user: SimpleAuthManagerUser) -> bool:
        RECORDED.add((method, resource_name))
        return bool(super().is_authorized_custom_view(method=method,
                                                      resource_name=resource_name, user=user))


@contextmanager
def auth_manager(monkeypatch: pytest.MonkeyPatch, name: str) -> Iterator[None]:
    """Airflow's app with an auth manager of this module (before the ``ui`` fixture makes
    it), and the configured one again afterwards."""
    from airflow.api_fastapi.app import purge_cached_app

    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER", f"{__name__}.{name}")
    purge_cached_app()
    try:
        yield
    finally:
        # The next test's auth manager is the configured one again.
        purge_cached_app()


@pytest.fixture
def bodies_withheld(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with auth_manager(monkeypatch, "BodiesWithheld"):
        yield


@pytest.fixture
def dag_withheld(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with auth_manager(monkeypatch, "DagWithheld"):
        yield


@pytest.fixture
def task_instances_withheld(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with auth_manager(monkeypatch, "TaskInstancesWithheld"):
        yield


@pytest.fixture
def poisoned(app: App) -> PoisonedQueue:
    return poisoned_queue(app.broker, "I", "T", "C", "Req", QUEUE,
                          ["first", "second", "poison"], error="ValueError: bad trade")


def queue_row(ui: Ui, role: str = "viewer") -> dict[str, Any]:
    response = ui.get("/api/overview", role)
    assert response.status_code == 200, response.text
    rows = [q for q in response.json()["queues"] if q["name"] == QUEUE]
    assert len(rows) == 1
    row: dict[str, Any] = rows[0]
    return row


def audit_events(event: str) -> list[tuple[str | None, str]]:
    from airflow.models.log import Log
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return [(row.owner, row.event) for row in session.scalars(
            select(Log).where(Log.event == event))]


def test_the_pages_ask_the_auth_manager_about_what_fab_is_given(
        monkeypatch: pytest.MonkeyPatch, airflow_db: Path, broker_conn: str,
        poisoned: PoisonedQueue) -> None:
    """Every route, called by an admin, asks about exactly the methods and resources of
    access.ASKED: what `airflow-broker ui-permissions` creates in FAB's tables (fab.py), so
    that no page needs a permission FAB cannot grant."""
    from airflow.models.log import Log
    from airflow.utils.session import create_session
    from fastapi.routing import APIRoute
    from sqlalchemy import delete, func, select

    from airflow_broker.ui import access, api

    values = {"queue_name": QUEUE, "handle": str(uuid.uuid4()), "dag_id": TAB_DAG}
    with create_session() as session:
        last_audit_event = session.scalar(select(func.max(Log.id))) or 0
    RECORDED.clear()
    with auth_manager(monkeypatch, "Recording"), TestClient(api.app) as client:
        ui = Ui(client)
        called = 0
        for route in api.app.routes:
            if not isinstance(route, APIRoute) or not route.path.startswith("/api/"):
                continue
            path = route.path.format(**{name: values[name] for name in route.param_convertors})
            for method in route.methods:
                response = (ui.get(path, "admin") if method == "GET"
                            else ui.post(path, {}, "admin"))
                assert response.status_code not in (401, 403), (method, path, response.text)
                called += 1
    api.close_brokers()
    # Its writes are audited; the audit log is the session's, and later tests count theirs.
    with create_session() as session:
        session.execute(delete(Log).where(Log.id > last_audit_event))
    assert called >= 18
    assert sorted(RECORDED) == sorted(access.ASKED)


def test_anonymous_callers_are_refused_everywhere(ui: Ui, poisoned: PoisonedQueue) -> None:
    for path in READS:
        assert ui.get(path).status_code == 401, path
    for path, body in WRITES:
        assert ui.post(path, body).status_code == 401, path
    assert queue_row(ui)["enabled"] is False


def test_overview_shows_the_poisoned_queue_and_what_disabled_it(
        ui: Ui, poisoned: PoisonedQueue) -> None:
    row = queue_row(ui)
    assert row["enabled"] is False
    assert row["disabled_reason"] == "POISON"
    assert row["poison"]["message_ids"] == [str(poisoned.poison_message_id)]
    assert "rolled back" in row["poison"]["reason"]
    assert row["depth"] == 1
    assert row["quarantined"] == 2
    assert row["oldest_message_at"] is not None


def test_viewers_see_no_bodies_and_no_actions(ui: Ui, poisoned: PoisonedQueue) -> None:
    viewer = ui.get(f"/api/queues/{QUEUE}", "viewer").json()
    assert viewer["permissions"] == {"view_bodies": True, "enable_disable_queue": False,
                                     "replay_quarantine": False, "replay_only": False,
                                     "discard_quarantine": False,
                                     "cleanup_conversation": False,
                                     "end_conversation": False,
                                     "retry_transmission": False}
    # SimpleAuthManager lets every logged-in user read custom views, bodies included.
    [group] = viewer["groups"]
    assert [m["body"] for m in group["messages"]] == ["poison"]
    quarantine = ui.get(f"/api/queues/{QUEUE}/quarantine", "viewer").json()
    assert [m["quarantine_id"] for m in quarantine["messages"]] == poisoned.quarantine_ids
    assert {m["error"] for m in quarantine["messages"]} == {"ValueError: bad trade"}
    op = ui.get("/api/overview", "op").json()["permissions"]
    assert op == {"view_bodies": True, "enable_disable_queue": True, "replay_quarantine": True,
                  "replay_only": True, "discard_quarantine": True,
                  "cleanup_conversation": True, "end_conversation": True,
                  "retry_transmission": True}


def test_bodies_are_masked_for_users_the_auth_manager_refuses_them(
        bodies_withheld: None, ui: Ui, poisoned: PoisonedQueue) -> None:
    queue = ui.get(f"/api/queues/{QUEUE}", "admin").json()
    assert queue["permissions"]["view_bodies"] is False
    [group] = queue["groups"]
    assert [(m["body"], m["body_masked"]) for m in group["messages"]] == [(None, True)]
    quarantine = ui.get(f"/api/queues/{QUEUE}/quarantine", "admin").json()
    assert {(m["body"], m["body_masked"]) for m in quarantine["messages"]} == {(None, True)}


def test_quarantine_filter_by_error_text(ui: Ui, poisoned: PoisonedQueue) -> None:
    path = f"/api/queues/{QUEUE}/quarantine"
    assert len(ui.get(path, "viewer", params={"error": "BAD TRADE"}).json()["messages"]) == 2
    assert ui.get(path, "viewer", params={"error": "timeout"}).json()["messages"] == []


def test_quarantine_grouped_by_error_and_filtered_by_body_and_time(
        ui: Ui, poisoned: PoisonedQueue, broker_conn: str) -> None:
    """Each error is a group with its count, first and last time and ids (what replaying the
    group takes); the body filter reads whole bodies, the time filter quarantine times."""
    first, second = poisoned.quarantine_ids
    with psycopg.connect(broker_conn) as conn:
        conn.execute("UPDATE broker.quarantine SET error = 'TimeoutError: settlement'"
                     " WHERE quarantine_id = %s", [second])
    path = f"/api/queues/{QUEUE}/quarantine"
    page = ui.get(path, "viewer").json()
    assert [(g["error"], g["count"], g["quarantine_ids"]) for g in page["groups"]] == [
        ("ValueError: bad trade", 1, [first]), ("TimeoutError: settlement", 1, [second])]
    assert all(g["first_quarantined_at"] == g["last_quarantined_at"] for g in page["groups"])
    by_body = ui.get(path, "viewer", params={"body": "SECOND"}).json()
    assert [m["quarantine_id"] for m in by_body["messages"]] == [second]
    assert [g["quarantine_ids"] for g in by_body["groups"]] == [[second]]
    assert ui.get(path, "viewer", params={"body": "poison"}).json()["messages"] == []
    quarantined_at = dt.datetime.fromisoformat(page["messages"][1]["quarantined_at"])
    later = (quarantined_at + dt.timedelta(seconds=1)).isoformat()
    assert ui.get(path, "viewer", params={"since": later}).json()["messages"] == []
    since = ui.get(path, "viewer", params={"since": quarantined_at.isoformat()}).json()
    assert second in [m["quarantine_id"] for m in since["messages"]]
    assert ui.get(path, "viewer", params={"since": "yesterday"}).status_code == 422


def test_a_large_quarantine_lists_the_oldest_and_groups_every_match(
        ui: Ui, poisoned: PoisonedQueue, broker_conn: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the page's limit the oldest are listed and ``truncated`` says more match; each
    group counts all its matches and carries the ids of its oldest ones, as many as one replay
    takes; the error filter narrows in the database, the body filter too."""
    first, second = poisoned.quarantine_ids
    more = MESSAGE_LIMIT + 10
    with psycopg.connect(broker_conn) as conn:
        conn.execute(
            "INSERT INTO broker.quarantine (queue_id, conversation_handle,"
            " conversation_group_id, service_name, service_contract_name, message_type_name,"
            " message_sequence_number, message_id, message_body, error, attempts,"
            " quarantined_at)"
            " SELECT queue_id, conversation_handle, conversation_group_id, service_name,"
            " service_contract_name, message_type_name, message_sequence_number + n,"
            " gen_random_uuid(), convert_to('price ' || n, 'UTF8'), 'KeyError: price',"
            " attempts, quarantined_at + n * interval '1 second'"
            " FROM broker.quarantine, generate_series(1, %s) n WHERE quarantine_id = %s",
            [more, second])
        added = [i for (i,) in conn.execute(
            "SELECT quarantine_id FROM broker.quarantine WHERE error = 'KeyError: price'"
            " ORDER BY quarantined_at")]
    monkeypatch.setattr(quarantine_page, "GROUP_IDS", 100)
    path = f"/api/queues/{QUEUE}/quarantine"
    page = ui.get(path, "viewer").json()
    assert (page["truncated"], len(page["messages"])) == (True, MESSAGE_LIMIT)
    assert [m["quarantine_id"] for m in page["messages"][:3]] == [first, second, added[0]]
    assert [(g["error"], g["count"]) for g in page["groups"]] == [
        ("KeyError: price", more), ("ValueError: bad trade", 2)]
    assert page["groups"][0]["quarantine_ids"] == added[:100]
    assert page["groups"][1]["quarantine_ids"] == [first, second]
    narrowed = ui.get(path, "viewer", params={"error": "BAD trade"}).json()
    assert (narrowed["truncated"], [m["quarantine_id"] for m in narrowed["messages"]]) == (
        False, [first, second])
    by_body = ui.get(path, "viewer", params={"body": "PRICE 1"}).json()
    # price 1, price 10 to 19, price 100 to 199: 111 of them, listed and grouped.
    assert (by_body["truncated"], len(by_body["messages"])) == (False, 111)
    assert [(g["error"], g["count"], len(g["quarantine_ids"])) for g in by_body["groups"]] == [
        ("KeyError: price", 111, 100)]


def test_a_body_filter_is_refused_to_users_who_may_not_see_bodies(
        bodies_withheld: None, ui: Ui, poisoned: PoisonedQueue) -> None:
    # Which messages match a body filter would tell what the masked bodies hold.
    response = ui.get(f"/api/queues/{QUEUE}/quarantine", "admin", params={"body": "first"})
    assert response.status_code == 403
    assert "Broker Message Bodies" in response.json()["detail"]
    assert len(ui.get(f"/api/queues/{QUEUE}/quarantine", "admin").json()["messages"]) == 2


@pytest.mark.parametrize("role", ["viewer", "user"])
def test_roles_below_op_may_not_write(ui: Ui, poisoned: PoisonedQueue, role: str) -> None:
    for path, body in WRITES:
        response = ui.post(path, body, role)
        assert response.status_code == 403, (path, response.text)
    assert queue_row(ui)["enabled"] is False
    assert queue_row(ui)["quarantined"] == 2
    # A refused request is no action of the audit log's.
    refused = [owner for event in ("broker_queue_status", "broker_replay_and_enable")
               for owner, _ in audit_events(event)]
    assert f"ui_{role}" not in refused


def test_a_write_from_another_site_is_refused_and_changes_nothing(
        ui: Ui, poisoned: PoisonedQueue) -> None:
    for site in ("cross-site", "same-site", "none"):
        response = ui.post(f"/api/queues/{QUEUE}/replay-and-enable",
                           {"quarantine_ids": poisoned.quarantine_ids}, "admin",
                           headers={"Sec-Fetch-Site": site})
        assert response.status_code == 403, response.text
        assert "cross-origin" in response.json()["detail"]
    row = queue_row(ui)
    assert (row["enabled"], row["quarantined"], row["depth"]) == (False, 2, 1)


def test_a_write_needs_a_json_body(ui: Ui, poisoned: PoisonedQueue) -> None:
    response = ui.client.post(f"/api/queues/{QUEUE}/status", data={"enabled": "true"},
                              headers=ui._auth("admin"))
    assert response.status_code == 415
    assert queue_row(ui)["enabled"] is False


def test_replay_and_enable_then_the_queue_drains(ui: Ui, poisoned: PoisonedQueue,
                                                 broker: Broker) -> None:
    response = ui.post(f"/api/queues/{QUEUE}/replay-and-enable",
                       {"quarantine_ids": poisoned.quarantine_ids}, "op",
                       headers={"Sec-Fetch-Site": "same-origin"})
    assert response.status_code == 200, response.text
    assert response.json()["replayed"] == 2
    row = queue_row(ui)
    assert (row["enabled"], row["quarantined"], row["depth"]) == (True, 0, 3)
    with broker.transaction() as tx:
        bodies = [m.text() for m in tx.receive(QUEUE, 10)]
    assert bodies == ["first", "second", "poison"]
    assert queue_row(ui)["depth"] == 0
    assert audit_events("broker_replay_and_enable")[-1] == ("ui_op", "broker_replay_and_enable")


def test_replay_and_enable_is_one_transaction(ui: Ui, poisoned: PoisonedQueue,
                                              app: App, broker_conn: str) -> None:
    # The second message's conversation ends: it can no longer be replayed (error 50112),
    # after the first one was.
    with psycopg.connect(broker_conn) as conn:
        conn.execute("UPDATE broker.endpoints SET state = 'CD' WHERE conversation_handle = "
                     "(SELECT conversation_handle FROM broker.quarantine"
                     " WHERE quarantine_id = %s)", [poisoned.quarantine_ids[1]])
    response = ui.post(f"/api/queues/{QUEUE}/replay-and-enable",
                       {"quarantine_ids": poisoned.quarantine_ids}, "op")
    assert response.status_code == 409, response.text
    assert response.json()["error_number"] == 50112
    row = queue_row(ui)
    assert (row["enabled"], row["quarantined"], row["depth"]) == (False, 2, 1)


def test_replay_of_a_message_not_in_the_queues_quarantine_changes_nothing(
        ui: Ui, poisoned: PoisonedQueue) -> None:
    response = ui.post(f"/api/queues/{QUEUE}/replay-and-enable",
                       {"quarantine_ids": [*poisoned.quarantine_ids, 999_999]}, "op")
    assert response.status_code == 404
    assert response.json()["error_number"] == 15151
    assert "999999" in response.json()["detail"]
    assert queue_row(ui)["enabled"] is False


def test_enable_and_disable_a_queue(ui: Ui, poisoned: PoisonedQueue) -> None:
    path = f"/api/queues/{QUEUE}/status"
    assert ui.post(path, {"enabled": True}, "op").status_code == 200
    assert queue_row(ui)["enabled"] is True
    assert ui.post(path, {"enabled": False}, "op").status_code == 200
    row = queue_row(ui)
    assert (row["enabled"], row["disabled_reason"], row["poison"]) == (False, "ADMIN", None)
    assert len(audit_events("broker_queue_status")) >= 2


def test_an_unknown_queue_answers_with_the_broker_error_number(ui: Ui, app: App) -> None:
    response = ui.get("/api/queues/no_such_queue", "viewer")
    assert response.status_code == 404
    assert response.json()["error_number"] == 208
    response = ui.post("/api/queues/no_such_queue/status", {"enabled": True}, "op")
    assert response.status_code == 404
    # ALTER QUEUE's own error for a queue it cannot find.
    assert response.json()["error_number"] in (208, 15151)
    assert "no_such_queue" in response.json()["detail"]


@pytest.fixture
def reader_ui(app: App, broker_conn: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The pages on a login of their own holding docs/security.md's read-only UI grants and
    RECEIVE on q_t, not ALTER."""
    from airflow_broker.ui import api

    with roles.role(broker_conn, *roles.APPLICATION_GRANTS,
                    roles.broker_grant("VIEW DEFINITION", "DATABASE"),
                    roles.broker_grant("RECEIVE", f"QUEUE::{QUEUE}"),
                    prefix="ui", login=True) as name:
        monkeypatch.setenv("AIRFLOW_CONN_BROKER_UI",
                           connection_json(roles.login_dsn(broker_conn, name)))
        monkeypatch.setenv("AIRFLOW__BROKER__UI_CONN_ID", "broker_ui")
        try:
            yield
        finally:
            api.close_brokers()


def test_the_logins_refusals_come_back_with_their_numbers(
        reader_ui: None, ui: Ui, poisoned: PoisonedQueue) -> None:
    """The auth manager lets an admin through; the UI's login may read and replay but not
    enable the queue: 404 with the broker's 15151, and nothing changes."""
    row = queue_row(ui, "admin")
    assert (row["may_receive"], row["may_alter"]) == (True, False)
    quarantine = ui.get(f"/api/queues/{QUEUE}/quarantine", "admin").json()
    assert (quarantine["may_receive"], quarantine["may_alter"]) == (True, False)
    for path, body in ((f"/api/queues/{QUEUE}/status", {"enabled": True}),
                       (f"/api/queues/{QUEUE}/replay-and-enable",
                        {"quarantine_ids": poisoned.quarantine_ids})):
        response = ui.post(path, body, "admin")
        assert response.status_code == 404, response.text
        assert response.json()["error_number"] == 15151
    row = queue_row(ui, "admin")
    assert (row["enabled"], row["quarantined"]) == (False, 2)
    response = ui.post(f"/api/queues/{QUEUE}/replay",
                       {"quarantine_ids": poisoned.quarantine_ids}, "op")
    assert response.status_code == 200, response.text
    row = queue_row(ui, "admin")
    assert (row["enabled"], row["quarantined"], row["depth"]) == (False, 0, 3)


def test_a_queue_the_login_sees_but_may_not_read_is_403_with_229(
        reader_ui: None, ui: Ui, app: App) -> None:
    """q_i is visible to the login (VIEW DEFINITION on the database) without RECEIVE."""
    for path in ("/api/queues/q_i", "/api/queues/q_i/quarantine"):
        response = ui.get(path, "admin")
        assert response.status_code == 403, response.text
        assert response.json()["error_number"] == 229


def test_health_shows_doctors_findings_without_secrets_and_runs_again_on_a_post(
        ui: Ui, poisoned: PoisonedQueue, broker: Broker) -> None:
    assert ui.get("/api/health").status_code == 401
    assert ui.client.post("/api/health", json={}).status_code == 401
    report = ui.get("/api/health", "viewer").json()
    assert report["healthy"] is False
    assert {"queues", "routes", "permissions"} <= set(report["checks"])
    assert report["not_checked"] == []
    [disabled] = [f for f in report["findings"] if f["subject"] == QUEUE]
    assert disabled["severity"] == "error" and "POISON" in disabled["problem"].upper()
    assert disabled["fix"]
    # A route whose address holds a password, to a far broker that does not answer.
    with broker.transaction() as tx:
        tx.create_route("far_route", "postgresql://far_user:s3cret-pass@127.0.0.1:1/db",
                        service_name="//Far/Service")
    # A page view shows the last report; only the button runs the checks again.
    assert ui.get("/api/health", "viewer").json()["checked_at"] == report["checked_at"]
    response = ui.post("/api/health", {}, "viewer", headers={"Sec-Fetch-Site": "same-origin"})
    assert response.status_code == 200, response.text
    assert response.json()["run"] == report["run"] + 1
    assert "far_route" in response.text
    assert "s3cret-pass" not in response.text
    assert ui.post("/api/health", {}, "viewer",
                   headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403


def test_health_as_the_least_privileged_login_says_what_it_could_not_check(
        reader_ui: None, ui: Ui) -> None:
    report = ui.get("/api/health", "viewer").json()
    not_checked = {f["check"] for f in report["findings"]
                   if f["problem"].startswith("not checked")}
    assert "queues" in not_checked
    # Not "healthy" without a word: the page says how many checks did not run.
    assert set(report["not_checked"]) == not_checked
    assert all(f["severity"] == "info" for f in report["findings"]
               if f["check"] in not_checked)


def fire_and_forget_leak(app: App) -> str:
    with app.broker.transaction() as tx:
        handle = tx.begin_dialog("I", "T", "C")
        tx.send(handle, "Req", "fire")
        tx.end_conversation(handle)
    with app.broker.transaction() as tx:
        received = tx.receive("q_t")
        tx.end_conversation(received[0].conversation_handle)
    return str(received[0].conversation_handle)


def leaked(ui: Ui) -> list[str]:
    response = ui.get("/api/conversations", "viewer", params={"leaked": "true"})
    assert response.status_code == 200, response.text
    return [c["conversation_handle"] for c in response.json()["conversations"]]


def test_a_leak_is_cleaned_up_only_after_its_handle_is_typed(ui: Ui, app: App) -> None:
    handle = fire_and_forget_leak(app)
    with app.broker.transaction() as tx:
        open_handle = str(tx.begin_dialog("I", "T", "C"))
    listing = ui.get("/api/conversations", "viewer").json()
    by_handle = {c["conversation_handle"]: c for c in listing["conversations"]}
    assert by_handle[handle]["is_leaked"] is True
    assert by_handle[open_handle]["is_leaked"] is False
    assert ui.get("/api/conversations", "viewer", params={"state": "XX"}).status_code == 422
    path = f"/api/conversations/{handle}/cleanup"
    assert ui.post(path, {}, "viewer").status_code == 403
    for body in ({}, {"confirm": None}, {"confirm": "yes"}, {"confirm": open_handle}):
        response = ui.post(path, body, "op")
        assert response.status_code == 400, (body, response.text)
        assert handle in response.json()["detail"]
    assert leaked(ui) == [handle]
    # Not a leak: WITH CLEANUP would end it without telling the peer.
    response = ui.post(f"/api/conversations/{open_handle}/cleanup", {"confirm": open_handle},
                       "op")
    assert response.status_code == 409, response.text
    response = ui.post(path, {"confirm": handle}, "op")
    assert response.status_code == 200, response.text
    assert leaked(ui) == []
    assert audit_events("broker_conversation_cleanup")[-1][0] == "ui_op"


def test_cleanup_is_refused_with_229_to_a_login_without_control(
        reader_ui: None, ui: Ui, app: App) -> None:
    handle = fire_and_forget_leak(app)
    assert leaked(ui) == [handle]
    response = ui.post(f"/api/conversations/{handle}/cleanup", {"confirm": handle}, "admin")
    assert response.status_code == 403, response.text
    assert response.json()["error_number"] == 229
    assert leaked(ui) == [handle]


def test_a_deep_queue_shows_its_head_and_an_estimated_depth(ui: Ui, app: App,
                                                            broker_conn: str) -> None:
    """The overview counts up to DEPTH_EXACT_LIMIT ready messages and estimates a deeper
    queue from PostgreSQL's statistics; a queue page shows the head RECEIVE would take, not a
    sort of the whole backlog."""
    from airflow_broker.ui.console import DEPTH_EXACT_LIMIT, MESSAGE_LIMIT

    first = app.dialog()
    with app.broker.transaction() as tx:
        tx.send_many(first, "Req", [f"first {n}" for n in range(10)])
    row = queue_row(ui)
    assert (row["depth"], row["depth_is_estimate"]) == (10, False)
    oldest = row["oldest_message_at"]

    sent = 10
    while sent <= 2 * DEPTH_EXACT_LIMIT:
        with app.broker.transaction() as tx:
            tx.send_many(tx.begin_dialog("I", "T", "C"), "Req", ["more"] * 500)
        sent += 500
    with psycopg.connect(broker_conn, autocommit=True) as conn:
        conn.execute("ANALYZE broker.queue_messages")
    row = queue_row(ui)
    assert row["depth_is_estimate"] is True
    assert 0.75 * sent <= row["depth"] <= 1.25 * sent
    assert row["oldest_message_at"] == oldest  # the head's, unchanged by later sends

    page = ui.get(f"/api/queues/{QUEUE}", "op").json()
    assert page["truncated"] is True
    messages = [m for g in page["groups"] for m in g["messages"]]
    assert len(messages) == MESSAGE_LIMIT
    # RECEIVE takes the first conversation's group first (its target endpoint's, one
    # handle), its messages in sequence order.
    head = page["groups"][0]["messages"]
    assert len({m["conversation_handle"] for m in head}) == 1
    assert [m["body"] for m in head] == [f"first {n}" for n in range(10)]
    assert [m["message_sequence_number"] for m in head] == list(range(10))


FAR = "//Far/Settlement"
OTHER = "//Far/Ledger"
# Nothing listens on port 1: each attempt fails at once with "unreachable".
UNREACHABLE = "postgresql://far_user:s3cret-pass@127.0.0.1:1/far"


@pytest.fixture
def waiting(app: App) -> Iterator[None]:
    """Messages on two routes to a far broker that does not answer, each tried once and
    backing off: two for FAR on one conversation, one for OTHER."""
    with app.broker.transaction() as tx:
        tx.create_route("far_route", UNREACHABLE, service_name=FAR)
        tx.create_route("other_route", UNREACHABLE, service_name=OTHER)
        far = tx.begin_dialog("I", FAR, "C")
        tx.send(far, "Req", "first")
        tx.send(far, "Req", "second")
        tx.send(tx.begin_dialog("I", OTHER, "C"), "Req", "third")
    transport = Transport(app.broker)
    try:
        assert transport.step().held == 3
        yield
    finally:
        transport.close()


def transmission_rows(broker: Broker) -> dict[str, tuple[Any, ...]]:
    """Per destination service: whether its messages are due, their attempts and status."""
    with broker.transaction() as tx:
        rows = tx.conn.execute(
            "SELECT to_service_name, bool_and(next_attempt_at <= broker.utc_now()),"
            " max(attempts), min(transmission_status)"
            " FROM broker.transmission_queue GROUP BY 1").fetchall()
    return {service: tuple(rest) for service, *rest in rows}


def test_transmission_shows_what_waits_per_route_without_its_address(
        ui: Ui, waiting: None) -> None:
    assert ui.get("/api/transmission").status_code == 401
    response = ui.get("/api/transmission", "viewer")
    assert response.status_code == 200, response.text
    body = response.json()
    routes = {r["to_service_name"]: r for r in body["routes"]}
    assert set(routes) == {FAR, OTHER}
    far = routes[FAR]
    assert (far["delivery"], far["messages"], far["conversations"], far["attempts"]) == (
        "remote", 2, 1, 1)
    assert far["to_broker_instance"] is None
    assert far["transmission_status"].startswith("The target service broker is unreachable")
    assert far["oldest_enqueue_time"] is not None
    assert far["next_attempt_at"] > far["last_attempt_at"]
    assert far["may_retry"] is True
    assert routes[OTHER]["messages"] == 1
    assert body["permissions"]["retry_transmission"] is False
    # The route's address carries a password: the page never shows it.
    assert "s3cret-pass" not in response.text


def test_retry_now_makes_one_routes_messages_due_and_the_transport_tries_at_once(
        ui: Ui, waiting: None, app: App) -> None:
    before = transmission_rows(app.broker)
    assert before[FAR][0] is False and before[OTHER][0] is False
    response = ui.post("/api/transmission/retry", {"to_service_name": FAR}, "op",
                       headers={"Sec-Fetch-Site": "same-origin"})
    assert response.status_code == 200, response.text
    assert response.json()["retried"] == 2
    after = transmission_rows(app.broker)
    # Due now, its attempts and last status kept (the back-off goes on from there); the
    # other route untouched.
    assert after[FAR] == (True, *before[FAR][1:])
    assert after[OTHER] == before[OTHER]
    assert audit_events("broker_transmission_retry")[-1] == ("ui_op",
                                                             "broker_transmission_retry")
    transport = Transport(app.broker)
    try:
        assert transport.step().held == 2
    finally:
        transport.close()
    assert transmission_rows(app.broker)[FAR][:2] == (False, 2)
    # A route nothing waits on: nothing to do.
    response = ui.post("/api/transmission/retry", {"to_service_name": "//Nowhere"}, "op")
    assert (response.status_code, response.json()["retried"]) == (200, 0)


@pytest.mark.parametrize("role", ["viewer", "user"])
def test_roles_below_op_may_not_retry(ui: Ui, waiting: None, app: App, role: str) -> None:
    before = transmission_rows(app.broker)
    response = ui.post("/api/transmission/retry", {"to_service_name": FAR}, role)
    assert response.status_code == 403, response.text
    assert ui.post("/api/transmission/retry", {"to_service_name": FAR}).status_code == 401
    assert transmission_rows(app.broker) == before
    assert f"ui_{role}" not in [owner for owner, _ in audit_events("broker_transmission_retry")]


def test_a_retry_from_another_site_or_without_json_is_refused(
        ui: Ui, waiting: None, app: App) -> None:
    before = transmission_rows(app.broker)
    for site in ("cross-site", "same-site", "none"):
        response = ui.post("/api/transmission/retry", {"to_service_name": FAR}, "admin",
                           headers={"Sec-Fetch-Site": site})
        assert response.status_code == 403, response.text
        assert "cross-origin" in response.json()["detail"]
    response = ui.client.post("/api/transmission/retry", data={"to_service_name": FAR},
                              headers=ui._auth("admin"))
    assert response.status_code == 415
    assert transmission_rows(app.broker) == before


def test_the_logins_refusal_of_a_retry_comes_back_with_229(
        reader_ui: None, ui: Ui, waiting: None, app: App) -> None:
    """The UI's login sees the routes (VIEW DEFINITION on the database) but may not RECEIVE
    from q_i, the sending service's queue: an admin's retry is the broker's to refuse."""
    [far] = [r for r in ui.get("/api/transmission", "admin").json()["routes"]
             if r["to_service_name"] == FAR]
    assert far["may_retry"] is False
    before = transmission_rows(app.broker)
    response = ui.post("/api/transmission/retry", {"to_service_name": FAR}, "admin")
    assert response.status_code == 403, response.text
    assert response.json()["error_number"] == 229
    assert "q_i" in response.json()["detail"]
    assert transmission_rows(app.broker) == before


def test_a_queue_page_lists_its_reader_runs_with_their_task_instances(
        ui: Ui, app: App) -> None:
    """A reader run started by ActivatedReaderOperator keeps its task instance; the queue page
    lists the queue's runs, newest first, with their counts and that task instance."""
    from airflow_broker.readers import runs

    submitted = {"dag_id": "broker_spark_readers", "run_id": "manual__1",
                 "task_id": "brokerage_readers", "map_index": -1, "try_number": 2}
    first, second = uuid.uuid4(), uuid.uuid4()
    runs.begin_run(app.broker, first, QUEUE, {"queue": QUEUE})
    runs.finish_run(app.broker, first)
    runs.begin_run(app.broker, second, QUEUE, {"queue": QUEUE, "airflow": submitted})
    page = ui.get(f"/api/queues/{QUEUE}", "viewer").json()
    assert [r["run_id"] for r in page["reader_runs"]] == [str(second), str(first)]
    newest, oldest = page["reader_runs"]
    assert newest["task_instance"] == submitted and newest["ended_at"] is None
    assert (newest["readers"], newest["received"], newest["failed_readers"]) == (0, None, [])
    assert oldest["task_instance"] is None and oldest["ended_at"] is not None
    assert page["activations"] == []


# A sensor that receives into the Airflow inbox, a task that ends the conversation it
# received on, and two tasks that never run (their upstream succeeds): one naming a queue by a
# template, one a queue that does not exist.
TAB_TASKS = """
    from airflow_broker.operators import EnableQueueOperator

    received = WaitForReceiveSensor(task_id="received", queue_name="q_t",
                                    receive_messages=True, timeout=60, poll_interval=0.2)
    end = EndConversationOperator(
        task_id="end",
        conversation_handle="{{ ti.xcom_pull(task_ids='received')[0]['conversation_handle'] }}")
    alerts = QueueDisabledSensor(task_id="alerts", queue_names=["q_t", "{{ params.queue }}"],
                                 trigger_rule="all_failed")
    enable = EnableQueueOperator(task_id="enable", queue_name="no_such_queue",
                                 trigger_rule="all_failed")
    received >> end >> [alerts, enable]
"""


@pytest.fixture
def tab_run(run_dag: RunDag, app: App) -> Any:
    """A run of t_ui_tabs that received one message; the DAG stays serialized in Airflow."""
    with app.broker.transaction() as tx:
        tx.send(tx.begin_dialog("I", "T", "C"), "Req", "for the tab")
    with dag_file(TAB_DAG, TAB_TASKS):
        dag_run = run_dag(TAB_DAG)
    assert task_states(dag_run) == {"received": "success", "end": "success",
                                    "alerts": "skipped", "enable": "skipped"}
    return dag_run


def ti_path(dag_run: Any, task_id: str) -> str:
    # A manual run's id has a "+" (its time zone), which a query string must escape.
    return f"/api/dags/{TAB_DAG}/task-instance?" + urlencode(
        {"run_id": dag_run.run_id, "task_id": task_id, "map_index": -1})


def test_the_dag_tab_lists_the_queues_of_the_dags_broker_tasks_with_their_state(
        ui: Ui, tab_run: Any) -> None:
    response = ui.get(f"/api/dags/{TAB_DAG}/queues", "viewer")
    assert response.status_code == 200, response.text
    queues = {q["raw"]: q for q in response.json()["queues"]}
    # QueueDisabledSensor's notifications arrive on a queue of its own.
    assert set(queues) == {"q_t", "{{ params.queue }}", "no_such_queue",
                           "AirflowBrokerAlertQueue"}
    q_t = queues["q_t"]
    assert (q_t["name"], q_t["is_template"]) == ("q_t", False)
    assert [(t["task_id"], t["field"]) for t in q_t["tasks"]] == [
        ("received", "queue_name"), ("alerts", "queue_names")]
    assert q_t["tasks"][0]["task_type"] == "WaitForReceiveSensor"
    # As the overview shows it.
    assert (q_t["state"]["enabled"], q_t["state"]["depth"], q_t["state"]["quarantined"]) == (
        True, 0, 0)
    # A template is shown as written, not resolved.
    templated = queues["{{ params.queue }}"]
    assert (templated["name"], templated["is_template"], templated["state"]) == (
        None, True, None)
    # No queue of that name the pages' login may see.
    assert queues["no_such_queue"]["state"] is None
    assert ui.get("/api/dags/no_such_dag/queues", "viewer").status_code == 404


def test_the_task_instance_tab_shows_the_inbox_and_the_conversation(
        ui: Ui, tab_run: Any) -> None:
    response = ui.get(ti_path(tab_run, "received"), "viewer")
    assert response.status_code == 200, response.text
    sensor = response.json()
    assert (sensor["state"], sensor["is_broker_task"], sensor["rendered"]) == (
        "success", True, True)
    assert sensor["fields"]["queue_name"] == "q_t"
    assert sensor["consumer"] == f"task:{TAB_DAG}/{tab_run.run_id}/received/-1"
    [message] = sensor["inbox"]
    assert (message["queue_name"], message["state"], message["message_type_name"],
            message["body"]) == ("q_t", "claimed", "Req", "for the tab")
    [conversation] = sensor["conversations"]
    assert conversation["conversation_handle"] == message["conversation_handle"]
    assert (conversation["service_name"], conversation["far_service"]) == ("T", "I")

    end = ui.get(ti_path(tab_run, "end"), "viewer").json()
    assert end["fields"]["conversation_handle"] == message["conversation_handle"]
    assert end["inbox"] == []
    [ended] = end["conversations"]
    assert ended["conversation_handle"] == message["conversation_handle"]
    # Ended by the target: closed, or waiting for the initiator to end its side.
    assert ended["state"] in ("CD", "DO")

    # A task that never ran has nothing rendered.
    skipped = ui.get(ti_path(tab_run, "alerts"), "viewer").json()
    assert (skipped["state"], skipped["rendered"], skipped["fields"]) == ("skipped", False, {})
    assert ui.get(ti_path(tab_run, "nothing"), "viewer").status_code == 404


def test_the_tabs_need_a_login_and_are_read_only(ui: Ui, tab_run: Any) -> None:
    for path in (f"/api/dags/{TAB_DAG}/queues", ti_path(tab_run, "received")):
        assert ui.get(path).status_code == 401, path
        assert ui.post(path, {}, "admin").status_code == 405, path


def test_a_user_the_auth_manager_refuses_the_dag_gets_403(
        dag_withheld: None, ui: Ui, tab_run: Any) -> None:
    for path in (f"/api/dags/{TAB_DAG}/queues", ti_path(tab_run, "received")):
        response = ui.get(path, "admin")
        assert response.status_code == 403, (path, response.text)
        assert "for the tab" not in response.text
    # Other DAGs' tabs are not affected.
    assert ui.get("/api/dags/broker_stock_trade/queues", "admin").status_code == 200


def test_a_user_the_auth_manager_refuses_task_instances_gets_403_on_their_tab(
        task_instances_withheld: None, ui: Ui, tab_run: Any) -> None:
    assert ui.get(f"/api/dags/{TAB_DAG}/queues", "viewer").status_code == 200
    response = ui.get(ti_path(tab_run, "received"), "viewer")
    assert response.status_code == 403, response.text


def test_end_conversation_with_error_tells_the_peer_and_bad_input_changes_nothing(
        ui: Ui, app: App) -> None:
    """END CONVERSATION WITH ERROR from the conversations page: the peer receives the Error
    message with the operator's code and description; a viewer is refused, and a code the
    broker refuses comes back with its number, with nothing changed."""
    with app.broker.transaction() as tx:
        handle = tx.begin_dialog("I", "T", "C")
        tx.send(handle, "Req", "<order id='1'/>")
    path = f"/api/conversations/{handle}/end-with-error"
    body = {"error": 50001, "description": "stopped by an operator"}
    assert ui.post(path, body, "viewer").status_code == 403
    response = ui.post(path, {"error": 0, "description": "no code"}, "op")
    assert response.status_code == 400, response.text
    assert response.json()["error_number"] == 50109  # InvalidErrorCode: codes are > 0
    states = {c["conversation_handle"]: c["state"]
              for c in ui.get("/api/conversations", "viewer").json()["conversations"]}
    assert states[str(handle)] == "CO"

    response = ui.post(path, body, "op")
    assert response.status_code == 200, response.text
    assert audit_events("broker_conversation_end_with_error")[-1][0] == "ui_op"
    with app.broker.transaction() as tx:
        received = tx.receive("q_t")
    # The Error comes first, before the data still on the queue (T-RC-08).
    assert [m.message_type_name for m in received] == [ERROR, "Req"]
    (error,) = [m.error() for m in received if m.is_error]
    assert (error.code, error.description) == (50001, "stopped by an operator")


def test_an_operator_turns_activation_on_and_off_and_sets_max_queue_readers(
        ui: Ui, app: App) -> None:
    """ALTER QUEUE ... WITH ACTIVATION from a queue page: shown to everyone, changed by an
    operator; a value the broker refuses comes back with its number and changes nothing."""
    with app.broker.transaction() as tx:
        tx.alter_queue(QUEUE, activation_status=False, max_queue_readers=1,
                       activation_procedure="public.usp_drain")
    path = f"/api/queues/{QUEUE}/activation"
    page = ui.get(f"/api/queues/{QUEUE}", "viewer").json()
    assert page["activation"] == {"enabled": False, "procedure": "public.usp_drain",
                                  "max_queue_readers": 1, "execute_as": None}
    assert ui.post(path, {"enabled": True}, "viewer").status_code == 403
    response = ui.post(path, {"max_queue_readers": -1}, "op")
    assert response.status_code == 400, response.text
    assert response.json()["error_number"] == 50106
    assert ui.get(f"/api/queues/{QUEUE}", "op").json()["activation"]["max_queue_readers"] == 1

    assert ui.post(path, {"enabled": True, "max_queue_readers": 3}, "op").status_code == 200
    page = ui.get(f"/api/queues/{QUEUE}", "op").json()
    assert (page["activation"]["enabled"], page["activation"]["max_queue_readers"]) == (True, 3)
    assert page["may_alter"] is True
    assert ui.post(path, {"enabled": False}, "op").status_code == 200
    assert ui.get(f"/api/queues/{QUEUE}", "op").json()["activation"]["enabled"] is False
    # Every authorised attempt is in the audit log, the one the broker refused too; the
    # viewer's, refused before it, is not.
    assert audit_events("broker_queue_activation") == [("ui_op", "broker_queue_activation")] * 3


def test_an_operator_discards_quarantined_messages(ui: Ui, poisoned: PoisonedQueue) -> None:
    """Discard from the quarantine page: the messages stay recorded as discarded and are never
    delivered; a viewer is refused, and an id not in the queue's quarantine discards none."""
    path = f"/api/queues/{QUEUE}/discard"
    first, second = poisoned.quarantine_ids
    assert ui.post(path, {"quarantine_ids": [first]}, "viewer").status_code == 403
    response = ui.post(path, {"quarantine_ids": [first, 999_999]}, "op")
    assert response.status_code == 404, response.text
    assert response.json()["error_number"] == 15151
    assert queue_row(ui)["quarantined"] == 2
    response = ui.post(path, {"quarantine_ids": [first]}, "op")
    assert response.json() == {"queue_name": QUEUE, "discarded": 1}
    left = ui.get(f"/api/queues/{QUEUE}/quarantine", "op").json()["messages"]
    assert [m["quarantine_id"] for m in left] == [second]
    assert queue_row(ui)["depth"] == 1  # nothing went back on the queue
    assert audit_events("broker_discard")[-1] == ("ui_op", "broker_discard")


def test_the_overview_counts_receives_and_shows_a_stuck_queue_monitor(
        ui: Ui, app: App, broker_conn: str) -> None:
    """The overview's receive counter (the page's rate) counts RECEIVEs that took messages;
    a queue with activation shows its monitor, stuck once NOTIFIED for a minute while
    messages wait, as stuck_queue_monitors says."""
    before = queue_row(ui)
    assert before["monitor"] is None  # no activation, no monitor
    for body in ("a", "b"):
        with app.broker.transaction() as tx:
            tx.send(app.dialog(), "Req", body)
    with app.broker.transaction() as tx:
        assert len(tx.receive(QUEUE, 1)) == 1
    with app.broker.transaction() as tx:
        assert len(tx.receive(QUEUE, 5)) == 1
    with app.broker.transaction() as tx:
        assert tx.receive(QUEUE, 5) == []  # an empty RECEIVE is not counted
    assert queue_row(ui)["receives"] == before["receives"] + 2

    with app.broker.transaction() as tx:
        tx.alter_queue(QUEUE, activation_status=True, max_queue_readers=1,
                       activation_procedure="public.usp_drain")
        tx.send(app.dialog(), "Req", "waits")
    assert queue_row(ui)["monitor"] == {"state": "INACTIVE", "since": None, "stuck": False,
                                        "last_activated_at": None}
    # As the monitor leaves a queue whose reader never received: NOTIFIED two minutes ago.
    with psycopg.connect(broker_conn) as conn:
        conn.execute("INSERT INTO broker.queue_monitor_state (queue_id, state, state_since,"
                     " last_activated_time) SELECT object_id, 'NOTIFIED',"
                     " broker.utc_now() - interval '2 minutes',"
                     " broker.utc_now() - interval '2 minutes'"
                     " FROM broker.queues WHERE name = %s", [QUEUE])
    monitor = queue_row(ui)["monitor"]
    assert (monitor["state"], monitor["stuck"]) == ("NOTIFIED", True)
    assert None not in (monitor["since"], monitor["last_activated_at"])


def test_one_conversation_end_to_end_its_two_endpoints_and_the_messages_waiting(
        ui: Ui, app: App, broker_conn: str) -> None:
    """Both endpoints of a conversation inside one broker, from either handle, with the
    messages waiting in the target's queue, each endpoint as sys.conversation_endpoints shows
    it (a local target has received what the initiator sent); a handle the login cannot see is
    404 with 8426."""
    handle = app.dialog()
    with app.broker.transaction() as tx:
        tx.send(handle, "Req", "one")
        tx.send(handle, "Req", "two")
    path = f"/api/conversations/{handle}"
    assert ui.get(path).status_code == 401
    page = ui.get(path, "viewer").json()
    initiator, target = page["endpoints"]
    assert (initiator["conversation_handle"], initiator["is_initiator"],
            initiator["service_name"], initiator["queue_name"], initiator["far_service"]) == (
        str(handle), True, "I", "q_i", "T")
    assert (target["is_initiator"], target["service_name"], target["queue_name"],
            target["far_service"]) == (False, "T", "q_t", "I")
    assert initiator["conversation_id"] == target["conversation_id"]
    assert (initiator["send_sequence"], target["receive_sequence"]) == (2, 2)
    with psycopg.connect(broker_conn) as conn:
        catalog = {str(h): (state_desc, received, security) for h, state_desc, received, security
                   in conn.execute("SELECT conversation_handle, state_desc, receive_sequence,"
                                   " security_timestamp FROM broker.conversation_endpoints")}
    for endpoint in (initiator, target):
        state_desc, received, security = catalog[endpoint["conversation_handle"]]
        assert (endpoint["state_desc"], endpoint["receive_sequence"],
                endpoint["security_timestamp"]) == (
            state_desc, received, security.replace(tzinfo=dt.UTC).isoformat())
    assert [(m["conversation_handle"], m["place"], m["message_sequence_number"],
             m["message_type_name"], m["status"], m["body"]) for m in page["messages"]] == [
        (target["conversation_handle"], "queue", 0, "Req", "ready", "one"),
        (target["conversation_handle"], "queue", 1, "Req", "ready", "two")]
    from_target = ui.get(f"/api/conversations/{target['conversation_handle']}", "viewer").json()
    assert from_target["endpoints"] == page["endpoints"]
    response = ui.get(f"/api/conversations/{uuid.uuid4()}", "viewer")
    assert response.status_code == 404
    assert response.json()["error_number"] == 8426


def test_a_conversation_to_a_far_broker_shows_what_waits_to_be_sent_and_why(
        ui: Ui, waiting: None) -> None:
    listed = ui.get("/api/conversations", "viewer").json()["conversations"]
    [handle] = [c["conversation_handle"] for c in listed if c["far_service"] == FAR]
    page = ui.get(f"/api/conversations/{handle}", "viewer").json()
    [initiator] = page["endpoints"]  # the target is the far broker's
    assert (initiator["far_service"], initiator["send_sequence"]) == (FAR, 2)
    assert initiator["transmission_status"].startswith(
        "The target service broker is unreachable")
    assert [(m["place"], m["message_sequence_number"], m["status"], m["body"])
            for m in page["messages"]] == [
        ("transmission", 0, "waiting to be sent", "first"),
        ("transmission", 1, "waiting to be sent", "second")]
    assert all(m["transmission_status"].startswith("The target service broker is unreachable")
               for m in page["messages"])
    # The route's address carries a password: the page never shows it.
    assert "s3cret-pass" not in str(page)


def test_ui_permissions_under_another_auth_manager_says_there_is_nothing_to_create(
        airflow_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from airflow_broker.cli import main

    assert main(["ui-permissions"]) == 0
    said = capsys.readouterr().out
    assert "SimpleAuthManager, not FAB's: it keeps no list of resources" in said
