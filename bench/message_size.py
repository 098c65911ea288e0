"""``python -m bench.message_size``: what one large body costs a PostgreSQL backend.

For bodies of 1, 16 and 64 MiB (64 MiB is the maximum message size), side by side in one run:

* **ours**: SEND of the body on a dialog, then RECEIVE of it, each on a fresh connection;
* **plain**: PostgreSQL's own floor, an INSERT of the same bytes into a one-column table and a
  DELETE ... RETURNING of them (a SELECT that also removes the row, as RECEIVE does), the same
  way.

The number is the backend's peak private memory during the statement, above what it held
before: ``RssAnon`` of the backend process in /proc, sampled every 2 ms from another thread
(shared buffers are not private, so a backend's cache does not count). Prints each peak in
MiB, its ratio to the body size and ours/plain, and writes them to
``bench/results/message_size.json``. Needs Linux (the /proc file) and the embedded server.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

from airflow_broker import Broker
from airflow_broker.embedded import EmbeddedPostgres
from airflow_broker.messages import MAX_MESSAGE_SIZE
from airflow_broker.migrations import install

MIB = 1024 * 1024
SIZES = (1 * MIB, 16 * MIB, MAX_MESSAGE_SIZE)
DEFAULT_JSON = Path(__file__).parent / "results" / "message_size.json"


def rss_anon_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise RuntimeError(f"no RssAnon for process {pid}")


def peak_mib(conn: psycopg.Connection[tuple[object, ...]], work: Callable[[], None]) -> float:
    """The backend's peak private memory above its baseline while ``work`` runs."""
    pid = conn.info.backend_pid
    baseline = rss_anon_kib(pid)
    peak = baseline
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_anon_kib(pid))
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        work()
    finally:
        done.set()
        sampler.join()
    return max(peak - baseline, 0) / 1024


def measure_ours(dsn: str, body: bytes) -> tuple[float, float]:
    with Broker(dsn, max_connections=1) as broker:
        with broker.transaction() as tx:
            handle = tx.begin_dialog("I", "T", "C")
        with broker.pool.connection() as conn:
            session = broker.session(conn)

            def send() -> None:
                session.send(handle, "Req", body)
                conn.commit()

            sent = peak_mib(conn, send)
    with Broker(dsn, max_connections=1) as broker, broker.pool.connection() as conn:
        session = broker.session(conn)
        received: list[int] = []

        def receive() -> None:
            received.extend(len(m.message_body or b"") for m in session.receive("q_t", 1))
            conn.commit()

        taken = peak_mib(conn, receive)
    if received != [len(body)]:
        raise RuntimeError(f"RECEIVE returned {received}, not one body of {len(body)} bytes")
    return sent, taken


def measure_plain(dsn: str, body: bytes) -> tuple[float, float]:
    with psycopg.connect(dsn) as conn:

        def insert() -> None:
            conn.execute("INSERT INTO public.plain_bodies (b) VALUES (%s)", [body])
            conn.commit()

        inserted = peak_mib(conn, insert)
    with psycopg.connect(dsn) as conn:

        def select() -> None:
            conn.execute("DELETE FROM public.plain_bodies RETURNING b").fetchall()
            conn.commit()

        selected = peak_mib(conn, select)
    return inserted, selected


def prepare(dsn: str) -> None:
    install(dsn)
    with Broker(dsn) as broker, broker.transaction() as tx:
        tx.create_message_type("Req")
        tx.create_contract("C", {"Req": "INITIATOR"})
        tx.create_queue("q_i")
        tx.create_queue("q_t")
        tx.create_service("I", "q_i")
        tx.create_service("T", "q_t", ["C"])
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.plain_bodies (b bytea)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.message_size", description=__doc__)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="airflow-broker-bench-size-") as data_dir:
        server = EmbeddedPostgres(data_dir)
        try:
            dsn = server.ensure_database("message_size")
            prepare(dsn)
            print(f"{'body':>8} {'SEND':>9} {'INSERT':>9} {'ratio':>6}   "
                  f"{'RECEIVE':>9} {'SELECT':>9} {'ratio':>6}   (peak backend MiB)", flush=True)
            for size in SIZES:
                # Random bytes: PostgreSQL compresses what it can, which would flatter both.
                body = os.urandom(size)
                sent, received = measure_ours(dsn, body)
                inserted, selected = measure_plain(dsn, body)
                row = {"body_mib": size / MIB, "send_mib": sent, "insert_mib": inserted,
                       "receive_mib": received, "select_mib": selected,
                       "send_per_body": sent / (size / MIB),
                       "receive_per_body": received / (size / MIB),
                       "send_vs_insert": sent / inserted if inserted else None,
                       "receive_vs_select": received / selected if selected else None}
                rows.append(row)
                print(f"{size / MIB:>7.0f}M {sent:>9.1f} {inserted:>9.1f} "
                      f"{row['send_vs_insert'] or 0:>5.2f}x   {received:>9.1f} {selected:>9.1f} "
                      f"{row['receive_vs_select'] or 0:>5.2f}x", flush=True)
        finally:
            server.stop()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    print(f"written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
