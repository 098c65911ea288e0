"""The Spark reader application, submitted with spark-submit on local[2]."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

import airflow_broker.spark.reader as spark_reader
from tests.support import roles
from tests.support.brokers import App
from tests.support.helpers import count
from tests.support.quarantine import quarantined

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def spark_submit(dsn: str, *args: str, master: str = "local[2]") -> subprocess.Popen[str]:
    env = {**os.environ,
           "AIRFLOW_BROKER_DSN": dsn,
           "PYSPARK_PYTHON": sys.executable,
           "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT)}
    command = [str(VENV_BIN / "spark-submit"), "--master", master,
               "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2",
               spark_reader.__file__, *args]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def summary_of(output: str) -> dict[str, object]:
    (line,) = [line for line in output.splitlines()
               if line.startswith(spark_reader.SUMMARY_MARKER)]
    result: dict[str, object] = json.loads(line.split(" ", 1)[1])
    return result


@pytest.fixture
def trading(app: App) -> App:
    with psycopg.connect(app.broker.dsn) as conn:
        conn.execute("CREATE TABLE public.results (message_id uuid PRIMARY KEY,"
                     " conversation_handle uuid, sequence bigint, trade text, pid integer,"
                     " booked bigserial)")
        conn.execute("CREATE TABLE public.victim (only_one integer PRIMARY KEY, pid integer)")
    return app


def send_trades(app: App, conversations: int, per_conversation: int, groups: int,
                bad_every: int = 0, marker: tuple[int, int] | None = None) -> int:
    """Trades on `conversations` dialogs; the brokerage side moves them into `groups`
    conversation groups, so several conversations share a group and a lock. Returns how
    many trades are well-formed."""
    good = 0
    with app.broker.transaction() as tx:
        handles = [tx.begin_dialog("I", "T", "C") for _ in range(conversations)]
        for c, handle in enumerate(handles):
            for i in range(per_conversation):
                n = c * per_conversation + i
                if bad_every and n % bad_every == bad_every - 1:
                    body = f"<trade id='{n}'>"
                else:
                    extra = " note='die-here'" if marker == (c, i) else ""
                    body = f"<trade id='{n}'{extra}/>"
                    good += 1
                tx.send(handle, "Req", body)
    group_ids = [uuid.uuid4() for _ in range(groups)]
    with psycopg.connect(app.broker.dsn) as conn:
        targets = [h for (h,) in conn.execute(
            "SELECT conversation_handle FROM broker.endpoints WHERE NOT is_initiator"
            " ORDER BY created_at, conversation_handle")]
    with app.broker.transaction() as tx:
        for i, target in enumerate(targets):
            tx.move_conversation(target, group_ids[i % groups])
    return good


def assert_exactly_once_in_order(app: App, expected: int) -> None:
    with psycopg.connect(app.broker.dsn) as conn:
        assert conn.execute("SELECT count(*) FROM public.results").fetchone() == (expected,)
        out_of_order = conn.execute(
            "SELECT count(*) FROM (SELECT sequence, lag(sequence) OVER"
            " (PARTITION BY conversation_handle ORDER BY booked) AS previous"
            " FROM public.results) s WHERE sequence <= previous").fetchone()
    assert out_of_order == (0,)


@pytest.mark.slow
@pytest.mark.spark_job
def test_spark_readers_process_2000_messages_exactly_once(trading: App) -> None:
    """As docs/security.md's Spark reader: a login with RECEIVE on its queue (and the rights
    its handler needs on the application's own tables), nothing on the broker's tables."""
    good = send_trades(trading, 200, 10, 50, bad_every=97)
    assert good == 2000 - 20
    with roles.role(trading.broker.dsn, *roles.APPLICATION_GRANTS,
                    roles.broker_grant("RECEIVE", "QUEUE::q_t"),
                    "GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO {}",
                    "GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {}",
                    prefix="spark", login=True) as reader:
        job = spark_submit(roles.login_dsn(trading.broker.dsn, reader), "--queue", "q_t",
                           "--handler", "tests.support.reader_handlers:book_trade",
                           "--readers", "2", "--batch-size", "50", "--idle-exit", "3",
                           "--reply-message-type", "Resp")
        output, _ = job.communicate(timeout=600)
    assert job.returncode == 0, output[-3000:]
    summary = summary_of(output)
    assert summary["readers"] == 2
    assert (summary["received"], summary["processed"], summary["replied"],
            summary["quarantined"]) == (2000, good, good, 20)
    per_reader = summary["per_reader"]
    assert isinstance(per_reader, list) and all(r["received"] > 0 for r in per_reader)
    assert_exactly_once_in_order(trading, good)
    # Every reply reached the trader side.
    assert count(trading.broker, "SELECT count(*) FROM public.q_i"
                                 " WHERE message_type_name = 'Resp'") == good
    held = quarantined(trading.broker, "q_t")
    assert len(held) == 20 and all("XMLSyntaxError" in q.error for q in held)
    with psycopg.connect(trading.broker.dsn) as conn:
        stored = conn.execute("SELECT summary->>'processed' FROM broker.reader_runs"
                              " WHERE run_id = %s", [summary["run_id"]]).fetchone()
    assert stored == (str(good),)


@pytest.mark.slow
@pytest.mark.spark_job
def test_a_killed_spark_reader_loses_nothing(trading: App) -> None:
    good = send_trades(trading, 40, 10, 10, marker=(7, 3))
    # local[2,4]: a failed Spark task is retried, as on a cluster.
    job = spark_submit(trading.broker.dsn, "--queue", "q_t",
                       "--handler", "tests.support.reader_handlers:book_or_die", "--readers", "2",
                       "--batch-size", "20", "--idle-exit", "3", "--reply-message-type", "Resp",
                       master="local[2,4]")
    deadline = time.monotonic() + 300
    victim = None
    while victim is None:
        assert time.monotonic() < deadline and job.poll() is None, "the reader never hung"
        with psycopg.connect(trading.broker.dsn) as conn:
            row = conn.execute("SELECT pid FROM public.victim").fetchone()
        victim = row[0] if row else None
        time.sleep(0.2)
    booked_before = count(trading.broker, "SELECT count(*) FROM public.results")
    os.kill(victim, signal.SIGKILL)  # the reader dies in the middle of its transaction
    output, _ = job.communicate(timeout=600)
    assert job.returncode == 0, output[-3000:]
    assert booked_before < good
    assert_exactly_once_in_order(trading, good)
    assert quarantined(trading.broker) == []


@pytest.mark.slow
@pytest.mark.spark_job
def test_spark_readers_go_on_in_place_through_a_database_crash(
        trading: App, restart_postgres: Callable[..., None]) -> None:
    """PostgreSQL crash-restarted (``-m immediate``) under two Spark readers in the middle of
    their drain. On local[2] a failed Spark task is not retried: the job succeeds only because
    each reader rolled its batch back and went on, on a new connection."""
    good = send_trades(trading, 40, 30, 10)
    job = spark_submit(trading.broker.dsn, "--queue", "q_t",
                       "--handler", "tests.support.reader_handlers:book_trade_slowly",
                       "--readers", "2", "--batch-size", "20", "--idle-exit", "5",
                       "--reply-message-type", "Resp")
    deadline = time.monotonic() + 300
    while count(trading.broker, "SELECT count(*) FROM public.results") < 100:
        assert time.monotonic() < deadline and job.poll() is None, "the readers never started"
        time.sleep(0.2)
    restart_postgres("immediate")
    output, _ = job.communicate(timeout=600)
    assert job.returncode == 0, output[-3000:]
    summary = summary_of(output)
    assert (summary["received"], summary["processed"], summary["quarantined"]) == (good, good, 0)
    assert_exactly_once_in_order(trading, good)
    assert "reader of q_t reconnected to PostgreSQL" in output
