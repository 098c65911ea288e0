"""The fault soak: 20,000 messages drained by reader processes SIGKILLed every 1-2 s, with one
immediate (crash) restart of PostgreSQL on the way: nothing lost, nothing twice, every
conversation in order."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import psycopg
import pytest

from airflow_broker import Broker
from airflow_broker.embedded import EmbeddedPostgres
from airflow_broker.migrations import install
from tests.fixtures.postgres import embedded_in_temp_dir

CONVERSATIONS = 100
PER_CONVERSATION = 200
READERS = 3
# A guard against a hang, not a speed bound: the soak fails when no message was recorded for
# this long while readers run.
NO_PROGRESS_GUARD = 120.0


@pytest.fixture
def soak_server() -> Iterator[EmbeddedPostgres]:
    """A server of its own: the soak restarts it."""
    with embedded_in_temp_dir("airflow-broker-soak-pg-") as server:
        yield server


def start_reader(dsn: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    return subprocess.Popen([sys.executable, "-m", "tests.support.soak_reader", dsn], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def recorded(dsn: str) -> int | None:
    """Rows in soak_log, or None while the server is restarting."""
    try:
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            row = conn.execute("SELECT count(*) FROM public.soak_log").fetchone()
            return None if row is None else int(row[0])
    except psycopg.OperationalError:
        return None


@pytest.mark.slow
def test_fault_soak_readers_killed_and_a_crash_restart_lose_and_duplicate_nothing(
        soak_server: EmbeddedPostgres) -> None:
    dsn = soak_server.ensure_database("soak")
    install(dsn)
    with Broker(dsn) as broker:
        with broker.transaction() as tx:
            tx.create_message_type("Req")
            tx.create_contract("C", {"Req": "INITIATOR"})
            tx.create_queue("q_i")
            tx.create_queue("q_t")
            # The soak is about delivery: killed readers' rollbacks must not disable the queue.
            tx.alter_queue("q_t", poison_message_handling=False)
            tx.create_service("I", "q_i")
            tx.create_service("T", "q_t", ["C"])
        with broker.transaction() as tx:
            for c in range(CONVERSATIONS):
                handle = tx.begin_dialog("I", "T", "C")
                tx.send_many(handle, "Req", [f"{c}:{n}" for n in range(PER_CONVERSATION)])
    total = CONVERSATIONS * PER_CONVERSATION
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.soak_log (logged bigint GENERATED ALWAYS AS IDENTITY,"
                     " conversation_handle uuid NOT NULL, seq bigint NOT NULL, body text)")

    rng = random.Random(7)
    readers = [start_reader(dsn) for _ in range(READERS)]
    kills = restarts = 0
    seen, progressed_at = 0, time.monotonic()
    try:
        while seen < total:
            time.sleep(rng.uniform(1.0, 2.0))
            victim = rng.randrange(READERS)
            if readers[victim].poll() is None:
                readers[victim].send_signal(signal.SIGKILL)
                kills += 1
            readers[victim].wait()
            if restarts == 0 and kills == 3:
                soak_server.restart("immediate")
                restarts += 1
            # Readers that the restart ended are started again with the killed one.
            readers = [r if r.poll() is None else start_reader(dsn) for r in readers]
            now = recorded(dsn)
            if now is not None and now > seen:
                seen, progressed_at = now, time.monotonic()
            assert time.monotonic() - progressed_at < NO_PROGRESS_GUARD, \
                f"no progress beyond {seen} of {total}"
    finally:
        for reader in readers:
            reader.kill()
            reader.wait()

    assert restarts == 1
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT conversation_handle, seq, body FROM public.soak_log"
                            " ORDER BY logged").fetchall()
        left = conn.execute("SELECT count(*) FROM broker.queue_messages").fetchone()
    assert len(rows) == total
    assert len({(handle, seq) for handle, seq, _ in rows}) == total  # nothing twice
    per_conversation: dict[object, list[int]] = {}
    for handle, seq, body in rows:
        per_conversation.setdefault(handle, []).append(seq)
        assert body.split(":")[1] == str(seq)
    assert len(per_conversation) == CONVERSATIONS
    # In the order they were committed, each conversation's messages are 0, 1, 2, ...
    assert all(seqs == list(range(PER_CONVERSATION)) for seqs in per_conversation.values())
    assert left == (0,)
