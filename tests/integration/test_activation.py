"""Queue monitors and internal activation (spec 20; T-AC-01..04)."""

from __future__ import annotations

import datetime as dt
import itertools
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from airflow_broker import Broker
from airflow_broker.admin.doctor import diagnose
from airflow_broker.worker import BrokerWorker
from airflow_broker.worker.activation import (
    TARGETS_VARIABLE,
    ActivationManager,
    activation_command,
)
from tests.support import roles
from tests.support.brokers import App
from tests.support.helpers import count, wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def importable_readers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Activated reader processes import tests.support.activation_readers."""
    monkeypatch.setenv("PYTHONPATH", ROOT)


@pytest.fixture
def activation_app(app: App, monkeypatch: pytest.MonkeyPatch) -> App:
    # The worker's list of what it may start: this folder's readers.
    monkeypatch.setenv(TARGETS_VARIABLE, "tests.support.activation_readers:*")
    with psycopg.connect(app.broker.dsn) as conn:
        conn.execute("CREATE TABLE public.processed (message_id uuid PRIMARY KEY,"
                     " task_id uuid NOT NULL)")
        conn.execute("CREATE TABLE public.reader_control (stop boolean NOT NULL)")
        conn.execute("INSERT INTO public.reader_control VALUES (false)")
        conn.execute("CREATE TABLE public.reader_identity (role_name text, messages integer)")
    return app


def fill(app: App, dialogs: int, per_dialog: int = 1) -> None:
    with app.broker.transaction() as tx:
        for d in range(dialogs):
            handle = tx.begin_dialog("I", "T", "C")
            for i in range(per_dialog):
                tx.send(handle, "Req", f"{d}-{i}")


def monitor(broker: Broker, queue: str = "q_t") -> tuple[object, ...]:
    with psycopg.connect(broker.dsn) as conn:
        row = conn.execute("SELECT state, last_activated_time, last_empty_rowset_time,"
                           " activated_readers FROM broker.dm_broker_queue_monitors"
                           " WHERE queue_name = %s", [queue]).fetchone()
    return row or ("NO MONITOR", None, None, 0)


@pytest.fixture
def manager(activation_app: App) -> Iterator[ActivationManager]:
    m = ActivationManager(activation_app.broker)
    try:
        yield m
    finally:
        with psycopg.connect(activation_app.broker.dsn, autocommit=True) as conn:
            conn.execute("UPDATE public.reader_control SET stop = true")
        m.stop(timeout=30)
        m.close()


def all_exited(manager: ActivationManager) -> bool:
    return all(r.process.poll() is not None for r in manager.readers.values())


def test_T_AC_01_queue_monitor_basics(activation_app: App, manager: ActivationManager) -> None:
    broker = activation_app.broker
    with broker.transaction() as tx:
        tx.alter_queue("q_t", activation_status=True,
                       activation_procedure="tests.support.activation_readers:receive_one",
                       max_queue_readers=1)
    assert manager.step() == 0
    assert monitor(broker)[0] == "INACTIVE"
    fill(activation_app, 10)
    assert manager.step() == 1
    state, last_activated, _, readers = monitor(broker)
    assert state == "NOTIFIED" and last_activated is not None and readers == 1
    # The procedure receives one message per call; the monitor calls it again until a
    # RECEIVE comes back empty.
    deadline = time.monotonic() + 120
    while count(broker, "SELECT count(*) FROM public.processed") < 10 or manager.readers:
        assert time.monotonic() < deadline
        manager.step()
        assert len(manager.readers) <= 1
        time.sleep(0.05)
    wait_until(lambda: (manager.step() or True) and monitor(broker)[0] == "INACTIVE",
               "the monitor to go INACTIVE", 60)
    state, _, last_empty, readers = monitor(broker)
    assert state == "INACTIVE" and last_empty is not None and readers == 0
    assert count(broker, "SELECT count(*) FROM public.processed") == 10
    with psycopg.connect(broker.dsn) as conn:
        log = conn.execute("SELECT outcome, messages_received FROM broker.activation_log"
                           " ORDER BY started_at").fetchall()
    assert all(outcome == "ended" for outcome, _ in log)
    assert sum(n for _, n in log) == 10


def test_T_AC_02_ramp_up_and_cap(activation_app: App, manager: ActivationManager) -> None:
    broker = activation_app.broker
    with broker.transaction() as tx:
        tx.alter_queue("q_t", activation_status=True,
                       activation_procedure="tests.support.activation_readers:slow",
                       max_queue_readers=4)
    fill(activation_app, 400)
    receives_so_far = "SELECT coalesce(pg_sequence_last_value(receive_counter), 0)" \
                      " FROM broker.queues WHERE name = 'q_t'"

    def step_after_receives() -> int:
        before = count(broker, receives_so_far)
        wait_until(lambda: count(broker, receives_so_far) > before, "a RECEIVE")
        return manager.step()

    assert manager.step() == 1                      # INACTIVE -> NOTIFIED
    assert step_after_receives() == 0               # NOTIFIED -> RECEIVES_OCCURRING
    assert monitor(broker)[0] == "RECEIVES_OCCURRING"
    broker.advance_clock(dt.timedelta(seconds=4))
    assert step_after_receives() == 0               # not 5 seconds yet
    for expected_readers in (2, 3, 4):
        broker.advance_clock(dt.timedelta(seconds=5))
        assert step_after_receives() == 1
        assert len(manager.readers) == expected_readers
        assert step_after_receives() == 0           # at most one per interval
    broker.advance_clock(dt.timedelta(seconds=5))
    assert step_after_receives() == 0               # the cap
    with broker.transaction() as tx:
        tx.alter_queue("q_t", max_queue_readers=6)
    assert step_after_receives() == 1               # a raised cap applies at once
    with broker.transaction() as tx:
        tx.alter_queue("q_t", max_queue_readers=2)
    broker.advance_clock(dt.timedelta(seconds=10))
    assert step_after_receives() == 0
    assert len(manager.readers) == 5                # running readers are not stopped
    assert count(broker, "SELECT max(activated_readers) FROM broker.dm_broker_queue_monitors") == 5


def test_T_AC_02_one_group_backlog_starts_at_most_two_readers(
    activation_app: App, manager: ActivationManager
) -> None:
    broker = activation_app.broker
    with broker.transaction() as tx:
        tx.alter_queue("q_t", activation_status=True,
                       activation_procedure="tests.support.activation_readers:hold_group",
                       max_queue_readers=4)
    fill(activation_app, 1, per_dialog=200)  # one conversation: one group
    assert manager.step() == 1
    wait_until(lambda: count(broker, "SELECT count(*) FROM public.processed") > 0,
               "the first reader to hold the group")
    manager.step()
    broker.advance_clock(dt.timedelta(seconds=6))
    assert manager.step() == 1  # one extra reader...
    # A new reader is a new process: on a loaded machine it can take seconds to reach its
    # first RECEIVE, and until then the backlog looks unattended.
    wait_until(lambda: count(broker, "SELECT count(*) FROM broker.queue_waiters w"
                                     " JOIN broker.queues q ON q.object_id = w.queue_id"
                                     " WHERE q.name = 'q_t'") > 0,
               "the extra reader waiting in RECEIVE")
    for _ in range(4):
        # ...which finds the group locked and waits in RECEIVE, so no more are needed.
        time.sleep(1.0)
        broker.advance_clock(dt.timedelta(seconds=6))
        manager.step()
    assert len(manager.readers) == 2


def test_T_AC_03_stub_procedure_leaves_the_monitor_notified(
    activation_app: App, manager: ActivationManager
) -> None:
    broker = activation_app.broker
    with broker.transaction() as tx:
        tx.alter_queue("q_t", activation_status=True,
                       activation_procedure="tests.support.activation_readers:stub",
                       max_queue_readers=1)
    fill(activation_app, 3)
    assert manager.step() == 1
    wait_until(lambda: all_exited(manager), "the stub to return")
    for _ in range(3):
        fill(activation_app, 1)
        broker.advance_clock(dt.timedelta(seconds=30))
        assert manager.step() == 0          # never started again
    assert monitor(broker)[0] == "NOTIFIED"
    with psycopg.connect(broker.dsn) as conn:
        stuck = conn.execute("SELECT queue_name FROM broker.stuck_queue_monitors").fetchall()
    assert stuck == [("q_t",)]
    # Changing the procedure does not help; recycling activation does.
    with broker.transaction() as tx:
        tx.alter_queue("q_t", activation_procedure="tests.support.activation_readers:drain")
    assert manager.step() == 0
    with broker.transaction() as tx:
        tx.alter_queue("q_t", activation_status=False)
        tx.alter_queue("q_t", activation_status=True)
    assert manager.step() == 1
    wait_until(lambda: count(broker, "SELECT count(*) FROM public.processed") == 6,
               "the new procedure to drain the queue")


def test_T_AC_04_status_changes_and_execute_as(
    activation_app: App, manager: ActivationManager, login_role: str
) -> None:
    broker = activation_app.broker
    role = login_role
    with broker.transaction() as tx:
        tx.alter_queue("q_t", activation_status=False,
                       activation_procedure="tests.support.activation_readers:whoami",
                       max_queue_readers=1, execute_as=role)
    fill(activation_app, 2)
    assert manager.step() == 0          # activation is off
    with broker.transaction() as tx:
        tx.alter_queue("q_t", activation_status=True)
    assert manager.step() == 1          # OFF -> ON with messages: at once
    wait_until(lambda: all_exited(manager), "the reader to finish")
    manager.step()
    with psycopg.connect(broker.dsn) as conn:
        identity = conn.execute("SELECT role_name FROM public.reader_identity").fetchall()
        log = conn.execute("SELECT execute_as, outcome FROM broker.activation_log").fetchall()
    assert identity and {r for (r,) in identity} == {role}
    assert log[0] == (role, "ended")
    assert not [f for f in diagnose(broker).findings if "log in as" in f.problem]
    # A role that cannot log in leaves the queue's readers failing: doctor says so.
    with psycopg.connect(broker.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(sql.Identifier(role)))
    (finding,) = [f for f in diagnose(broker).findings if "log in as" in f.problem]
    assert finding.subject == "q_t" and "cannot log in" in finding.problem
    assert f"ALTER ROLE {role} LOGIN" in finding.fix


def test_an_activated_reader_logs_in_as_its_role_without_the_workers_secrets(
    activation_app: App, manager: ActivationManager, login_role: str,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """EXECUTE AS a role: the reader authenticates as the role (RESET ROLE leaves it the role,
    and it cannot SET ROLE to the worker's login), and none of the worker's credentials reach
    its environment."""
    broker = activation_app.broker
    role = login_role
    monkeypatch.setenv("PGPASSWORD", "worker-secret-1")
    monkeypatch.setenv("AIRFLOW_CONN_WAREHOUSE", "postgresql://etl:worker-secret-2@db/warehouse")
    with psycopg.connect(broker.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.reader_credentials (current_role_name text,"
                     " session_role_name text, escalation text, secrets text[], messages int)")
    with broker.transaction() as tx:
        tx.alter_queue("q_t", activation_status=True, max_queue_readers=1, execute_as=role,
                       activation_procedure="tests.support.activation_readers:"
                                            "credentials_check")
    fill(activation_app, 2)
    assert manager.step() == 1
    wait_until(lambda: all_exited(manager), "the reader to finish")
    manager.step()
    with psycopg.connect(broker.dsn) as conn:
        rows = conn.execute("SELECT * FROM public.reader_credentials").fetchall()
        log = conn.execute("SELECT outcome FROM broker.activation_log").fetchall()
    assert log == [("ended",)]
    ((current, session, escalation, secrets, messages),) = rows
    assert (current, session) == (role, role)
    assert escalation.startswith("refused")
    assert secrets == [] and messages >= 1


def test_T_AC_04_turning_activation_off_leaves_running_readers(
    activation_app: App, manager: ActivationManager
) -> None:
    broker = activation_app.broker
    with broker.transaction() as tx:
        tx.alter_queue("q_t", activation_status=True,
                       activation_procedure="tests.support.activation_readers:slow",
                       max_queue_readers=2)
    fill(activation_app, 50)
    assert manager.step() == 1
    with broker.transaction() as tx:
        tx.alter_queue("q_t", activation_status=False)
    broker.advance_clock(dt.timedelta(seconds=30))
    assert manager.step() == 0
    (reader,) = manager.readers.values()
    assert reader.process.poll() is None    # still running
    before = count(broker, "SELECT count(*) FROM public.processed")
    wait_until(lambda: count(broker, "SELECT count(*) FROM public.processed") > before,
               "the running reader to keep receiving")


def test_T_AC_01_no_reader_starts_while_the_broker_is_disabled(
        activation_app: App, manager: ActivationManager) -> None:
    """Activation needs the broker enabled in the database, as SQL Server's queue-monitor
    troubleshooting lists; with ENABLE_BROKER again the waiting message gets its reader."""
    broker = activation_app.broker
    with broker.transaction() as tx:
        tx.alter_queue("q_t", activation_status=True,
                       activation_procedure="tests.support.activation_readers:receive_one",
                       max_queue_readers=1)
    fill(activation_app, 1)
    with broker.transaction() as tx:
        tx.alter_broker("DISABLE_BROKER")
    assert manager.step() == 0
    assert monitor(broker)[0] == "NO MONITOR"
    with broker.transaction() as tx:
        tx.alter_broker("ENABLE_BROKER")
    assert manager.step() == 1


def test_a_procedure_that_cannot_start_stops_only_its_own_queue(
        activation_app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unbalanced quote in one queue's procedure is that queue's finding: the worker's pass
    goes on, other queues are activated and timers fire."""
    broker = activation_app.broker
    monkeypatch.setenv(TARGETS_VARIABLE, os.environ[TARGETS_VARIABLE] + ',echo "x')
    with broker.transaction() as tx:
        tx.create_queue("q_bad", activation_status=True, activation_procedure='echo "x',
                        max_queue_readers=1)
        tx.create_service("Bad", "q_bad", ["C"])
        tx.alter_queue("q_t", activation_status=True,
                       activation_procedure="tests.support.activation_readers:receive_one",
                       max_queue_readers=1)
        bad = tx.begin_dialog("I", "Bad", "C")
        tx.send(bad, "Req", "for the bad queue")
        timed = tx.begin_dialog("I", "T", "C")
        tx.begin_conversation_timer(timed, 1)
    fill(activation_app, 1)
    broker.advance_clock(dt.timedelta(seconds=2))
    worker = BrokerWorker(broker, transport=False)
    try:
        result = worker.run_once()
        assert result.timers_fired == 1
        assert result.readers_started == 1  # q_t's reader; q_bad's could not start
        with psycopg.connect(broker.dsn) as conn:
            log = conn.execute(
                "SELECT q.name, a.outcome, a.exception FROM broker.activation_log a"
                " JOIN broker.queues q ON q.object_id = a.queue_id ORDER BY q.name").fetchall()
        assert [(name, outcome) for name, outcome, _ in log if name == "q_bad"] == [
            ("q_bad", "aborted")]
        assert any("No closing quotation" in (text or "") for name, _, text in log
                   if name == "q_bad")
        findings = [f for f in diagnose(broker).findings
                    if f.check == "activation" and f.subject == "q_bad"]
        assert [f.severity for f in findings] == ["error", "error"]
        assert "not a command line" in findings[0].problem
        assert "did not start the activation procedure" in findings[1].problem
    finally:
        if worker.activation is not None:
            worker.activation.stop(timeout=30)
            worker.activation.close()


def test_failing_reader_is_logged_and_poisons_the_queue(
    activation_app: App, manager: ActivationManager
) -> None:
    broker = activation_app.broker
    with broker.transaction() as tx:
        tx.alter_queue("q_t", activation_status=True,
                       activation_procedure="tests.support.activation_readers:fail_after_receive",
                       max_queue_readers=1)
    fill(activation_app, 1)
    deadline = time.monotonic() + 120
    while count(broker, "SELECT count(*) FROM broker.service_queues"
                        " WHERE name = 'q_t' AND NOT is_receive_enabled") == 0:
        assert time.monotonic() < deadline, "poison detection never disabled the queue"
        manager.step()
        broker.advance_clock(dt.timedelta(seconds=1))
        time.sleep(0.1)
    wait_until(lambda: all_exited(manager), "the last reader to exit")
    manager.step()
    with psycopg.connect(broker.dsn) as conn:
        log = conn.execute("SELECT outcome, rollbacks, exception FROM broker.activation_log"
                           " ORDER BY started_at").fetchall()
    assert len(log) >= 5
    assert all(outcome == "aborted" for outcome, _, _ in log)
    assert all(rollbacks == 1 for _, rollbacks, _ in log)
    assert all("this message cannot be processed" in text for _, _, text in log)
    assert monitor(broker)[0] == "NO MONITOR"  # a disabled queue has no monitor


@pytest.mark.slow
def test_activation_drains_1000_messages_with_at_most_3_readers(activation_app: App) -> None:
    broker = activation_app.broker
    with broker.transaction() as tx:
        tx.alter_queue("q_t", activation_status=True,
                       activation_procedure="tests.support.activation_readers:drain",
                       max_queue_readers=3)
        tx.tune_queue("q_t", activation_ramp_interval=dt.timedelta(seconds=1))
    fill(activation_app, 1000)
    worker = BrokerWorker(broker, interval=0.2)
    thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
    thread.start()
    try:
        wait_until(lambda: count(broker, "SELECT count(*) FROM public.processed") == 1000,
                   "activation to drain the queue", limit=300)
        wait_until(lambda: count(broker, "SELECT count(*) FROM broker.activated_tasks") == 0,
                   "the readers to exit", limit=60)
    finally:
        worker.stop()
        thread.join(timeout=60)
    with psycopg.connect(broker.dsn) as conn:
        log = conn.execute("SELECT started_at, ended_at, messages_received, outcome"
                           " FROM broker.activation_log ORDER BY started_at").fetchall()
    assert len(log) >= 2
    assert sum(n for _, _, n, _ in log) == 1000
    assert {o for *_, o in log} == {"ended"}
    # The ramp-up: readers started one at a time, at least the interval apart, never more
    # than 3 running at once.
    starts = [s for s, *_ in log]
    assert all(b - a >= dt.timedelta(seconds=1) for a, b in itertools.pairwise(starts)
               if b < max(e for _, e, _, _ in log))
    events = sorted([(s, 1) for s, *_ in log] + [(e, -1) for _, e, _, _ in log])
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    assert 2 <= peak <= 3


def test_a_procedure_off_the_workers_list_never_runs(activation_app: App,
                                                     tmp_path: Path) -> None:
    """The right to alter a queue is not the right to run a program on the worker's machine:
    a command target missing from the worker's list is refused, logged and reported."""
    broker = activation_app.broker
    ran = tmp_path / "ran"
    with broker.transaction() as tx:
        tx.alter_queue("q_t", activation_status=True, max_queue_readers=1,
                       activation_procedure=f"touch {ran}")
        # A Python target of another module is refused as well.
        tx.create_queue("q_py", activation_status=True, max_queue_readers=1,
                        activation_procedure="airflow_broker.demos.trading:book_trade")
        tx.create_service("Py", "q_py", ["C"])
        tx.send(tx.begin_dialog("I", "Py", "C"), "Req", "for q_py")
    fill(activation_app, 1)
    worker = BrokerWorker(broker, transport=False)
    try:
        assert worker.run_once().readers_started == 0
    finally:
        assert worker.activation is not None
        worker.activation.stop(timeout=30)
        worker.activation.close()
    assert not ran.exists()
    with psycopg.connect(broker.dsn) as conn:
        log = conn.execute("SELECT outcome, exception FROM broker.activation_log"
                           " ORDER BY started_at").fetchall()
    assert [outcome for outcome, _ in log] == ["aborted", "aborted"]
    assert all("is not among the worker's activation targets" in e for _, e in log)
    findings = {f.subject: f for f in diagnose(broker).findings if f.check == "activation"}
    assert f"touch {ran}" in findings["q_t"].problem
    assert "airflow_broker.demos.trading:book_trade" in findings["q_py"].problem
    assert "--activation-target" in findings["q_py"].fix
    assert count(broker, "SELECT count(*) FROM broker.queue_messages") == 2


@pytest.fixture
def login_role(activation_app: App) -> Iterator[str]:
    """A role that can log in, with RECEIVE on the queue q_t and every right on public;
    dropped afterwards (roles outlive databases)."""
    with roles.role(activation_app.broker.dsn, *roles.APPLICATION_GRANTS,
                    roles.broker_grant("RECEIVE", "QUEUE::q_t"),
                    "GRANT USAGE ON SCHEMA public TO {}",
                    "GRANT ALL ON ALL TABLES IN SCHEMA public TO {}",
                    # Tables a test creates afterwards.
                    "ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT ALL ON TABLES TO {}",
                    prefix="reader", login=True) as name:
        yield name


DRAIN_PROCEDURE = """
CREATE PROCEDURE public.usp_drain() LANGUAGE plpgsql AS $$
DECLARE
    m record;
BEGIN
    FOR m IN SELECT * FROM broker.receive('q_t', 100, NULL, NULL) LOOP
        IF convert_from(m.message_body, 'UTF8') = 'poison' THEN
            RAISE EXCEPTION 'message % cannot be processed', m.message_id;
        END IF;
        INSERT INTO public.processed VALUES (m.message_id, gen_random_uuid());
        INSERT INTO public.reader_identity VALUES (current_user, 1);
    END LOOP;
END
$$
"""


@pytest.fixture
def drain_manager(activation_app: App, monkeypatch: pytest.MonkeyPatch
                  ) -> Iterator[ActivationManager]:
    """public.usp_drain installed, the worker's list of targets empty (a procedure run as a
    role needs no place on it), and the activation manager that starts it."""
    monkeypatch.delenv(TARGETS_VARIABLE)
    with psycopg.connect(activation_app.broker.dsn, autocommit=True) as conn:
        conn.execute(DRAIN_PROCEDURE)
    manager = ActivationManager(activation_app.broker)
    try:
        yield manager
    finally:
        manager.stop(timeout=30)
        manager.close()


def test_T_AC_a_postgresql_procedure_drains_its_queue_as_its_role(
    activation_app: App, login_role: str, drain_manager: ActivationManager
) -> None:
    """PROCEDURE_NAME = 'public.usp_drain' under EXECUTE AS a role: the worker calls the
    PL/pgSQL procedure, as the role, until the queue is empty; no place on the worker's list
    of targets is needed, since nothing runs on the worker's machine."""
    broker, manager = activation_app.broker, drain_manager
    with broker.transaction() as tx:
        tx.alter_queue("q_t", activation_status=True, max_queue_readers=1,
                       activation_procedure="public.usp_drain", execute_as=login_role)
    fill(activation_app, 3, 2)
    assert manager.step() == 1
    wait_until(lambda: all_exited(manager), "the procedure's reader to finish")
    manager.step()
    assert count(broker, "SELECT count(*) FROM public.processed") == 6
    assert count(broker, "SELECT count(DISTINCT role_name) FROM public.reader_identity"
                         " WHERE role_name = %s", (login_role,)) == 1
    assert count(broker, "SELECT count(*) FROM broker.activation_log"
                         " WHERE outcome = 'ended' AND execute_as = %s", (login_role,)) == 1
    # The queue's page in Airflow's UI shows the activation: the procedure, as whom, how it
    # ended. Its RECEIVEs happen in the database, out of the activated reader's count: not
    # known, rather than a false 0.
    from airflow_broker.ui import console

    (activation,) = console.queue_messages(broker, "q_t", bodies=False)["activations"]
    assert (activation["procedure"], activation["execute_as"], activation["outcome"],
            activation["messages_received"], activation["rollbacks"]) == (
        "public.usp_drain", login_role, "ended", None, None)
    assert activation["ended_at"] >= activation["started_at"]


def test_T_AC_execute_as_owner_logs_in_as_the_queues_owner(
    activation_app: App, login_role: str, drain_manager: ActivationManager
) -> None:
    """EXECUTE AS OWNER on a queue a role owns runs its procedure as that role, never as the
    worker's login: owning a queue is not a way to the worker's rights."""
    broker, manager = activation_app.broker, drain_manager
    with broker.transaction() as tx:
        tx.alter_authorization("QUEUE::q_t", login_role)
        tx.alter_queue("q_t", activation_status=True, max_queue_readers=1,
                       activation_procedure="public.usp_drain", execute_as="OWNER")
    fill(activation_app, 2, 1)
    assert manager.step() == 1
    wait_until(lambda: all_exited(manager), "the procedure's reader to finish")
    assert count(broker, "SELECT count(*) FROM public.processed") == 2
    assert count(broker, "SELECT count(*) FROM public.reader_identity"
                         " WHERE role_name <> %s", (login_role,)) == 0
    assert count(broker, "SELECT count(*) FROM public.reader_identity") > 0


def test_T_AC_a_failing_procedure_counts_for_poison_detection(
    activation_app: App, login_role: str, drain_manager: ActivationManager
) -> None:
    """Each failed CALL rolls back what the procedure received, and counts: five in a row
    disable the queue, and the reader stops."""
    broker, manager = activation_app.broker, drain_manager
    with broker.transaction() as tx:
        tx.alter_queue("q_t", activation_status=True, max_queue_readers=1,
                       activation_procedure="public.usp_drain", execute_as=login_role)
        handle = tx.begin_dialog("I", "T", "C")
        tx.send(handle, "Req", "poison")
    assert manager.step() == 1
    wait_until(lambda: all_exited(manager), "the procedure's reader to stop")
    manager.step()
    assert count(broker, "SELECT count(*) FROM broker.service_queues"
                         " WHERE name = 'q_t' AND NOT is_receive_enabled") == 1
    assert count(broker, "SELECT count(*) FROM public.processed") == 0
    # The poison message is still there, for the administrator to see.
    assert count(broker, "SELECT count(*) FROM broker.queue_messages"
                         " WHERE message_body = convert_to('poison', 'UTF8')") == 1


def test_T_AC_a_procedure_without_a_role_needs_the_workers_list(
    activation_app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A procedure without EXECUTE AS a role would run with the worker's rights: off the
    worker's list, it is refused and recorded."""
    broker = activation_app.broker
    monkeypatch.delenv(TARGETS_VARIABLE)
    manager = ActivationManager(broker)
    try:
        with psycopg.connect(broker.dsn, autocommit=True) as conn:
            conn.execute(DRAIN_PROCEDURE)
        with broker.transaction() as tx:
            tx.alter_queue("q_t", activation_status=True, max_queue_readers=1,
                           activation_procedure="public.usp_drain")
        fill(activation_app, 1)
        assert manager.step() == 0
        with psycopg.connect(broker.dsn) as conn:
            (error,) = conn.execute("SELECT exception FROM broker.activation_log"
                                    " WHERE outcome = 'aborted'").fetchone() or ("",)
        assert "not among the worker's activation targets" in error
        assert count(broker, "SELECT count(*) FROM public.processed") == 0
    finally:
        manager.close()


def test_doctor_reports_an_activation_procedure_that_does_not_exist(
    activation_app: App, login_role: str
) -> None:
    broker = activation_app.broker
    with broker.transaction() as tx:
        tx.alter_queue("q_t", activation_status=True, max_queue_readers=1,
                       activation_procedure="public.usp_missing", execute_as=login_role)
    (finding,) = [f for f in diagnose(broker).findings
                  if f.check == "activation" and "usp_missing" in f.problem]
    assert finding.severity == "error" and finding.subject == "q_t"
    assert "CREATE PROCEDURE public.usp_missing()" in finding.fix
    with psycopg.connect(broker.dsn, autocommit=True) as conn:
        conn.execute(DRAIN_PROCEDURE.replace("usp_drain", "usp_missing"))
    assert not [f for f in diagnose(broker).findings if "usp_missing" in f.problem]


def test_activation_goes_on_in_the_next_step_after_a_database_fault(
        activation_app: App, manager: ActivationManager,
        database_fault: Callable[[], None]) -> None:
    """The leader's connection, which holds the activation lock, dies with the fault: the next
    step takes the lock again on a new connection and starts a reader, instead of reporting
    another worker as the leader for a pass."""
    broker = activation_app.broker
    with broker.transaction() as tx:
        tx.alter_queue("q_t", activation_status=True,
                       activation_procedure="tests.support.activation_readers:receive_one",
                       max_queue_readers=1)
    assert manager.step() == 0  # the leader's connection is open, the monitor INACTIVE
    fill(activation_app, 3)
    database_fault()
    assert manager.step() == 1
    # The reader receives one message a call; the monitor starts it again while messages wait.
    wait_until(lambda: (manager.step() or True)
               and count(broker, "SELECT count(*) FROM public.processed") == 3,
               "the readers to process the messages", 120)


def test_an_activated_reader_process_starts_without_a_warning() -> None:
    """The reader's command line, as the manager runs it: Python has nothing to warn about
    (a module run with -m that its package imports already is imported twice, and runpy says
    so in every reader's log)."""
    command = activation_command("tests.support.activation_readers:hold_group")
    started = subprocess.run([*command[:1], "-W", "error", *command[1:-1], "--help"],
                             capture_output=True, text=True, check=False)
    assert started.returncode == 0, started.stderr
    assert started.stderr == ""
