"""`airflow-broker doctor` finds each fault an administrator looks for."""

from __future__ import annotations

import datetime as dt
import json
import os

import psycopg
import pytest

from airflow_broker.admin import postgres_releases as releases
from airflow_broker.cli import main
from airflow_broker.messages import MAX_MESSAGE_SIZE
from airflow_broker.worker.activation import ActivationManager
from tests.support.brokers import App

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def doctor(dsn: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object]]:
    code = main(["doctor", "--dsn", dsn, "--json"])
    return code, json.loads(capsys.readouterr().out)


def findings(report: dict[str, object], check: str) -> list[dict[str, str]]:
    return [f for f in report["findings"] if f["check"] == check]  # type: ignore[attr-defined]


def server_release(dsn: str) -> tuple[int, int]:
    with psycopg.connect(dsn) as conn:
        return divmod(conn.info.server_version, 10000)


def latest_release_is(monkeypatch: pytest.MonkeyPatch, major: int, minor: int) -> None:
    monkeypatch.setitem(releases.LATEST_MINOR, major, f"{major}.{minor}")
    monkeypatch.setitem(releases.END_OF_LIFE, major, "9999-12-31")


def test_healthy_broker(app: App, capsys: pytest.CaptureFixture[str],
                        monkeypatch: pytest.MonkeyPatch) -> None:
    # The broker's health on whatever server the tests use: the server's own release as the
    # latest (the release check has tests of its own).
    latest_release_is(monkeypatch, *server_release(app.broker.dsn))
    code, report = doctor(app.broker.dsn, capsys)
    assert code == 0 and report["healthy"] is True
    assert report["findings"] == []
    assert main(["doctor", "--dsn", app.broker.dsn]) == 0
    assert "everything looks right" in capsys.readouterr().out


def test_a_server_without_the_latest_minor_release_is_reported(
        app: App, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    major, minor = server_release(app.broker.dsn)
    latest_release_is(monkeypatch, major, minor + 1)
    code, report = doctor(app.broker.dsn, capsys)
    assert code == 1
    (finding,) = findings(report, "server")
    assert finding["severity"] == "warning"
    assert finding["subject"] == f"PostgreSQL {major}.{minor}"
    assert finding["fix"].startswith(f"upgrade to {major}.{minor + 1} ")


def test_schema_not_installed(empty_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = doctor(empty_dsn, capsys)
    assert code == 1
    (finding,) = findings(report, "schema")
    assert "not installed" in finding["problem"] and finding["fix"] == "airflow-broker install"


def test_doctor_finds_each_fault(
    app: App, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = app.broker
    # 1. A queue disabled by poison-message detection.
    with broker.transaction() as tx:
        tx.create_queue("q_poisoned")
        tx.create_service("Poisoned", "q_poisoned", ["C"])
        handle = tx.begin_dialog("I", "Poisoned", "C")
        tx.send(handle, "Req", "cannot be processed")
    for _ in range(5):
        with pytest.raises(RuntimeError), broker.transaction() as tx:
            assert tx.receive("q_poisoned")
            raise RuntimeError("fails")
    # 2. A queue monitor stuck in NOTIFIED: its reader never RECEIVEs.
    monkeypatch.setenv("PYTHONPATH", ROOT)
    with broker.transaction() as tx:
        tx.create_queue("q_stub", activation_procedure="tests.support.activation_readers:stub",
                        max_queue_readers=1)
        tx.create_service("Stubbed", "q_stub", ["C"])
        tx.send(tx.begin_dialog("I", "Stubbed", "C"), "Req", "waits forever")
    manager = ActivationManager(broker, ["tests.support.activation_readers:*"])
    assert manager.step() == 1
    manager.stop()
    manager.close()
    broker.advance_clock(dt.timedelta(minutes=2))
    # 3. Leaked endpoints: fire-and-forget dialogs.
    for _ in range(3):
        with broker.transaction() as tx:
            h = tx.begin_dialog("I", "T", "C")
            tx.send(h, "Req", "fire")
            tx.end_conversation(h)
    with broker.transaction() as tx:
        for m in tx.receive("q_t"):
            if m.is_end_dialog:
                tx.end_conversation(m.conversation_handle)
    while True:
        with broker.transaction() as tx:
            batch = tx.receive("q_t")
            for m in batch:
                if m.is_end_dialog:
                    tx.end_conversation(m.conversation_handle)
        if not batch:
            break
    # 4. A service that lacks the contract its dialogs use.
    with broker.transaction() as tx:
        tx.create_queue("q_nocontract")
        tx.create_service("NoContract", "q_nocontract")
        tx.send(tx.begin_dialog("I", "NoContract", "C"), "Req", "refused")
    # 5. Messages held for a service whose name differs only in case.
    with broker.transaction() as tx:
        tx.send(tx.begin_dialog("I", "t", "C"), "Req", "wrong case")

    code, report = doctor(broker.dsn, capsys)
    assert code == 1 and report["healthy"] is False
    (poisoned,) = findings(report, "queues")
    assert poisoned["subject"] == "q_poisoned" and poisoned["severity"] == "error"
    assert "poison" in poisoned["problem"] and "5 consecutive" in poisoned["problem"]
    stuck = [f for f in findings(report, "queue monitors") if f["severity"] == "error"]
    assert [f["subject"] for f in stuck] == ["q_stub"]
    assert "STATUS = OFF" in stuck[0]["fix"]
    (leak,) = findings(report, "endpoint leaks")
    assert leak["subject"] == "T <- I" and leak["problem"].startswith("3 CLOSED")
    services = findings(report, "services")
    assert any(f["subject"] == "NoContract" and "-8408" in f["problem"] for f in services)
    (held,) = findings(report, "transmission queue")
    assert held["subject"] == "t" and "'T' exists" in held["problem"]

    assert main(["doctor", "--dsn", broker.dsn]) == 1
    text = capsys.readouterr().out
    assert "[ERROR] queues: q_poisoned" in text and "problems found" in text


def test_doctor_finds_a_message_over_the_maximum_size(
        app: App, capsys: pytest.CaptureFixture[str]) -> None:
    """A body over the limit can no longer be sent (50122); one stored before the limit is an
    error finding, naming its queue and conversation, instead of a queue that stops silently."""
    handle = app.dialog()
    with app.broker.transaction() as tx:
        tx.send(handle, "Req", b"small")
    with psycopg.connect(app.broker.dsn) as conn:
        target = conn.execute(
            "UPDATE broker.queue_messages SET message_body = decode(repeat('00', %s), 'hex')"
            " RETURNING conversation_handle", [MAX_MESSAGE_SIZE + 1]).fetchone()
    assert target is not None
    code, report = doctor(app.broker.dsn, capsys)
    assert code == 1
    (finding,) = findings(report, "messages")
    assert finding["subject"] == "q_t" and finding["severity"] == "error"
    assert f"{MAX_MESSAGE_SIZE + 1:,} bytes" in finding["problem"]
    assert str(target[0]) in finding["problem"]
