"""The leak article's scenarios at volume, the cleanup command, and the broker worker's
behaviour when it is killed (spec 15, 28.4; DESIGN.md invariants)."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from airflow_broker import Broker
from airflow_broker.cli import main
from airflow_broker.worker import BrokerWorker, wait_until_idle
from tests.support.brokers import App
from tests.support.helpers import count


def execute(broker: Broker, statement: str) -> None:
    with psycopg.connect(broker.dsn) as conn:
        conn.execute(statement)


def correct_dialogs(broker: Broker, n: int, batch: int = 1000) -> None:
    """n dialogs with the correct pattern: the initiator sends, the target receives and ends
    first, the initiator receives the EndDialog and ends. Server-side loops keep it fast."""
    for _ in range(n // batch):
        execute(broker, f"""DO $$ DECLARE h uuid; BEGIN FOR i IN 1..{batch} LOOP
            h := broker.begin_dialog('I', 'T', 'C');
            PERFORM broker.send(ARRAY[h], 'Req', 'x'::bytea); END LOOP; END $$""")
        execute(broker, """DO $$ DECLARE r record; BEGIN
            FOR r IN SELECT conversation_handle FROM broker.endpoints
                      WHERE NOT is_initiator AND state = 'CO' LOOP
                PERFORM broker.receive('q_t', NULL, r.conversation_handle);
                PERFORM broker.end_conversation(r.conversation_handle);
            END LOOP; END $$""")
        execute(broker, """DO $$ DECLARE r record; BEGIN
            FOR r IN SELECT conversation_handle FROM broker.endpoints
                      WHERE is_initiator AND state = 'DI' LOOP
                PERFORM broker.receive('q_i', NULL, r.conversation_handle);
                PERFORM broker.end_conversation(r.conversation_handle);
            END LOOP; END $$""")


def fire_and_forget_dialogs(broker: Broker, n: int) -> None:
    execute(broker, f"""DO $$ DECLARE h uuid; BEGIN FOR i IN 1..{n} LOOP
        h := broker.begin_dialog('I', 'T', 'C');
        PERFORM broker.send(ARRAY[h], 'Req', 'x'::bytea);
        PERFORM broker.end_conversation(h); END LOOP; END $$""")
    execute(broker, """DO $$ DECLARE r record; BEGIN
        FOR r IN SELECT conversation_handle FROM broker.endpoints
                  WHERE NOT is_initiator AND state = 'DI' LOOP
            PERFORM broker.receive('q_t', NULL, r.conversation_handle);
            PERFORM broker.end_conversation(r.conversation_handle);
        END LOOP; END $$""")


@pytest.mark.slow
def test_soak_20000_correct_dialogs_leave_nothing(app: App) -> None:
    correct_dialogs(app.broker, 20_000)
    assert count(app.broker, "SELECT count(*) FROM broker.endpoints") == 20_000
    assert count(app.broker, "SELECT count(*) FROM broker.endpoints"
                             " WHERE state = 'CD' AND NOT is_initiator"
                             " AND security_timestamp > '1900-01-01'") == 20_000
    assert count(app.broker, "SELECT count(*) FROM broker.leaked_endpoints") == 0
    worker = BrokerWorker(app.broker)
    assert wait_until_idle(worker).endpoints_reclaimed == 0
    app.broker.advance_clock(dt.timedelta(minutes=31))
    assert wait_until_idle(worker).endpoints_reclaimed == 20_000
    assert count(app.broker, "SELECT count(*) FROM broker.endpoints") == 0
    assert count(app.broker, "SELECT count(*) FROM broker.dialog_groups") == 0
    assert count(app.broker, "SELECT count(*) FROM broker.queue_messages") == 0


@pytest.mark.slow
def test_5000_fire_and_forget_leaks_are_reported_and_cleaned_exactly(
    app: App, capsys: pytest.CaptureFixture[str]
) -> None:
    fire_and_forget_dialogs(app.broker, 5_000)
    correct_dialogs(app.broker, 100, batch=100)  # CLOSED, but protected for 30 minutes
    with app.broker.transaction() as tx:
        open_handles = [tx.begin_dialog("I", "T", "C") for _ in range(50)]
        for h in open_handles:
            tx.send(h, "Req", "still talking")
    assert count(app.broker, "SELECT count(*) FROM broker.leaked_endpoints") == 5_000
    with psycopg.connect(app.broker.dsn) as conn:
        per_service = conn.execute("SELECT service_name, far_service, leaked"
                                   " FROM broker.leaked_endpoint_counts").fetchall()
        survivors = set(conn.execute(
            "SELECT conversation_handle FROM broker.endpoints WHERE conversation_handle NOT IN"
            " (SELECT conversation_handle FROM broker.leaked_endpoints)").fetchall())
    assert per_service == [("T", "I", 5_000)]

    assert main(["cleanup", "--dsn", app.broker.dsn, "--dry-run", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "leaked endpoints found: 5000" in out and "dry run" in out
    assert count(app.broker, "SELECT count(*) FROM broker.leaked_endpoints") == 5_000

    assert main(["cleanup", "--dsn", app.broker.dsn, "--batch-size", "1000", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "removed with END CONVERSATION WITH CLEANUP: 5000" in out
    assert count(app.broker, "SELECT count(*) FROM broker.leaked_endpoints") == 0
    assert count(app.broker, "SELECT count(*) FROM broker.cleanup_log") == 5_000
    with psycopg.connect(app.broker.dsn) as conn:
        remaining = set(conn.execute("SELECT conversation_handle FROM broker.endpoints")
                        .fetchall())
    assert remaining == survivors  # nothing else was touched
    assert len(remaining) == 100 + 2 * 50


WORKER_SCRIPT = r"""
import sys
from airflow_broker import Broker
from airflow_broker.worker import BrokerWorker
with Broker(sys.argv[1], application_name="killable-worker") as broker:
    BrokerWorker(broker, batch_size=int(sys.argv[2]), interval=0.05).run()
"""


@pytest.mark.slow
def test_worker_killed_mid_batch_fires_every_timer_exactly_once(app: App) -> None:
    timers = 3_000
    execute(app.broker, f"""DO $$ DECLARE h uuid; BEGIN FOR i IN 1..{timers} LOOP
        h := broker.begin_dialog('I', 'T', 'C');
        PERFORM broker.begin_conversation_timer(h, 5); END LOOP; END $$""")
    app.broker.advance_clock(dt.timedelta(seconds=6))
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    fired = "SELECT count(*) FROM broker.queue_messages WHERE message_type_id = 5"
    for attempt in range(3):
        process = subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, app.broker.dsn, "500"],
                                   env=env)
        # Kill it while its transaction is running, once some timers have fired.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with psycopg.connect(app.broker.dsn) as conn:
                busy = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name ="
                    " 'killable-worker' AND state IN ('active', 'idle in transaction')"
                ).fetchone()
            if (busy and busy[0] and count(app.broker, fired) > 0) or process.poll() is not None:
                break
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        if count(app.broker, fired) >= timers:
            break
        assert attempt < 2 or count(app.broker, fired) < timers
    with Broker(app.broker.dsn) as broker:
        wait_until_idle(BrokerWorker(broker, batch_size=500))
    assert count(app.broker, fired) == timers
    assert count(app.broker, """SELECT count(*) FROM (SELECT conversation_handle
                                 FROM broker.queue_messages WHERE message_type_id = 5
                                 GROUP BY conversation_handle HAVING count(*) > 1) d""") == 0
    assert count(app.broker, "SELECT count(*) FROM broker.endpoints"
                             " WHERE dialog_timer > '1900-01-01'") == 0


def test_worker_stops_on_sigterm(app: App) -> None:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    process = subprocess.Popen([sys.executable, "-m", "airflow_broker.cli", "-v", "worker",
                                "--dsn", app.broker.dsn, "--interval", "0.1"],
                               env=env, stderr=subprocess.PIPE, text=True)
    # The signal goes once the worker says it started (its handlers are set by then): a fixed
    # pause lost the race on a loaded machine, and the default action killed the process.
    assert process.stderr is not None
    started = ""
    while "broker worker started" not in started:
        line = process.stderr.readline()
        assert line, f"the worker exited before it started: {started}"
        started += line
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 0
    assert "SIGTERM received" in err and "broker worker stopped" in err


def test_worker_once_delivers_held_messages_when_the_service_appears(app: App) -> None:
    with app.broker.transaction() as tx:
        handle = tx.begin_dialog("I", "Later", "C")
        tx.send(handle, "Req", "waits for the service")
    worker = BrokerWorker(app.broker)
    assert worker.run_once().messages_delivered == 0
    with app.broker.transaction() as tx:
        tx.create_queue("q_later")
        tx.create_service("Later", "q_later", ["C"])
    assert worker.run_once().messages_delivered == 0  # backing off: next attempt in 4 s
    app.broker.advance_clock(dt.timedelta(seconds=5))
    assert worker.run_once().messages_delivered == 1
    with app.broker.transaction() as tx:
        assert [m.text() for m in tx.receive("q_later")] == ["waits for the service"]


def test_two_workers_at_once_fire_each_timer_once(app: App) -> None:
    timers = 2_000
    execute(app.broker, f"""DO $$ DECLARE h uuid; BEGIN FOR i IN 1..{timers} LOOP
        h := broker.begin_dialog('I', 'T', 'C');
        PERFORM broker.begin_conversation_timer(h, 5); END LOOP; END $$""")
    app.broker.advance_clock(dt.timedelta(seconds=6))
    with Broker(app.broker.dsn) as other:
        workers = [BrokerWorker(app.broker, batch_size=50), BrokerWorker(other, batch_size=50)]
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda w: w.run_once(), workers))
    assert sum(r.timers_fired for r in results) == timers
    assert all(r.timers_fired > 0 for r in results)  # both took part
    assert count(app.broker, "SELECT count(*) FROM broker.queue_messages"
                             " WHERE message_type_id = 5") == timers


def test_worker_survives_a_postgres_restart(
    app: App, restart_postgres: Callable[[], None]
) -> None:
    worker = BrokerWorker(app.broker, interval=0.1)
    thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
    thread.start()
    try:
        handle = app.dialog()
        restart_postgres()
        deadline = time.monotonic() + 60
        while True:  # the application reconnects too
            try:
                with app.broker.transaction() as tx:
                    tx.begin_conversation_timer(handle, 1)
                break
            except psycopg.OperationalError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        app.broker.advance_clock(dt.timedelta(seconds=2))
        fired = "SELECT count(*) FROM broker.queue_messages WHERE message_type_id = 5"
        while count(app.broker, fired) == 0:
            assert time.monotonic() < deadline, "the worker did not come back"
            time.sleep(0.1)
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert count(app.broker, fired) == 1
