"""``python -m bench.recovery``: how long each component takes to work again after a fault of
its PostgreSQL.

Faults, each on a primary with a synchronous streaming standby (``tests/support/standby_pair``)
and every client on the multi-host DSN that docs/airflow.md recommends:

* **crash-restart**: ``pg_ctl restart -m immediate`` of the primary, as its two halves
  (``stop -m immediate``, ``start``; recovery from the WAL);
* **terminate**: ``pg_terminate_backend`` of every other session of the broker's database;
* **failover**: the primary's postmaster killed with SIGKILL, the standby promoted (a new pair
  for each repetition); with ``--promote-after SECONDS`` the promotion waits that long, as a
  failover manager's decision does (``failover+10s``).

Components, all running through the fault, each on a Broker of its own:

* **RECEIVE loop**: a transaction that RECEIVEs one message (of thousands sent beforehand),
  every 20 ms; the time is to the commit of the first one begun after the fault;
* **WAITFOR**: a WAITFOR (RECEIVE) on a Broker that polls once an hour, so only a NOTIFY wakes
  it, while another Broker SENDs every 50 ms; the time is to the first message received that
  was sent after the fault;
* **worker timer**: ``airflow-broker worker`` (its default 1 s interval, queue activation on);
  a conversation timer falls due once the server is back (the broker clock is moved past it);
  the time is to the timer's message on its queue;
* **plain INSERT**: the floor, for reference: a new connection (on the same DSN) and an
  INSERT, tried every 10 ms once the fault's command returned (``pg_ctl restart``,
  ``pg_terminate_backend``, ``pg_ctl promote``).

Each time runs from the moment the fault took effect: ``pg_ctl stop -m immediate`` returned
(``pg_ctl start`` follows at once), ``pg_terminate_backend`` returned (it waits for the backends to
exit), the last process of the old primary gone; an operation counts when it began after
that. The application loops retry a lost
transaction after 0.1 s, doubling up to 2 s (``reconnect.Outage``). Prints the median and the
range of each over the repetitions and writes them to ``bench/results/recovery.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from airflow_broker import Broker
from airflow_broker.reconnect import Outage, retry_while_disconnected
from airflow_broker.worker import BrokerWorker
from tests.support.helpers import terminate_sessions
from tests.support.standby_pair import DATABASE, StandbyPair, standby_pair

FAULTS = ("crash-restart", "terminate", "failover")
COMPONENTS = ("plain INSERT", "RECEIVE loop", "WAITFOR", "worker timer")
DEFAULT_JSON = Path(__file__).parent / "results" / "recovery.json"
BACKLOG = 3000  # the RECEIVE loop's messages: a minute's worth
TIMER = 5  # message_type_id of DEFAULT's timer message


def deploy(dsn: str) -> None:
    with Broker(dsn) as broker, broker.transaction() as tx:
        tx.create_message_type("Req")
        tx.create_contract("C", {"Req": "INITIATOR"})
        for queue in ("q_i", "q_t", "q_r"):
            tx.create_queue(queue)
        tx.create_service("I", "q_i")
        tx.create_service("T", "q_t", ["C"])
        tx.create_service("R", "q_r", ["C"])
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE public.recovery_probe (at timestamptz DEFAULT now())")


class Clients:
    """The components of one measurement, running in threads until ``close()``."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.stop = threading.Event()
        self.brokers: list[Broker] = []
        self.commits: list[tuple[float, float]] = []  # RECEIVE loop: (begun, committed)
        self.woken: list[tuple[float, float]] = []  # WAITFOR: (sent, received)
        self.worker = BrokerWorker(self._broker(), transport=False)
        self.threads = [threading.Thread(target=self.worker.run,
                                         kwargs={"handle_signals": False})]
        for loop in (self._receive_loop, self._waitfor_loop, self._send_loop):
            self.threads.append(threading.Thread(target=loop, daemon=True))
        for thread in self.threads:
            thread.start()

    def _broker(self, poll_interval: float = 0.5) -> Broker:
        broker = Broker(self.dsn, poll_interval=poll_interval)
        self.brokers.append(broker)
        return broker

    def _outage(self, what: str) -> Outage:
        return Outage(what, initial=0.1, maximum=2.0)

    def _receive_loop(self) -> None:
        broker = self._broker()
        outage = self._outage("RECEIVE loop")

        def attempt() -> tuple[float, float] | None:
            begun = time.monotonic()
            with broker.transaction() as tx:
                if not tx.receive("q_r", 1):
                    return None
            return begun, time.monotonic()

        while not self.stop.is_set():
            done = retry_while_disconnected(attempt, outage, self.stop)
            if done is not None:
                self.commits.append(done)
            self.stop.wait(0.02)

    def _waitfor_loop(self) -> None:
        broker = self._broker(poll_interval=3600)
        outage = self._outage("WAITFOR")

        def attempt() -> list[str]:
            with broker.transaction() as tx:
                return [m.text() or "" for m in tx.receive("q_t", waitfor=True, timeout=1)]

        while not self.stop.is_set():
            bodies = retry_while_disconnected(attempt, outage, self.stop) or []
            now = time.monotonic()
            self.woken.extend((float(body), now) for body in bodies)

    def _send_loop(self) -> None:
        broker = self._broker()
        outage = self._outage("sender")
        handle = retry_while_disconnected(lambda: _dialog(broker, "T"), outage, self.stop)
        if handle is None:
            return

        def attempt() -> None:
            with broker.transaction() as tx:
                tx.send(handle, "Req", repr(time.monotonic()))

        while not self.stop.is_set():
            retry_while_disconnected(attempt, outage, self.stop)
            self.stop.wait(0.05)

    def close(self) -> None:
        self.stop.set()
        self.worker.stop()
        for thread in self.threads:
            thread.join(timeout=60)
        for broker in self.brokers:
            broker.close()


def _dialog(broker: Broker, target: str) -> uuid.UUID:
    with broker.transaction() as tx:
        return tx.begin_dialog("I", target, "C")


def _timers(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM broker.queue_messages"
                           " WHERE message_type_id = %s", [TIMER]).fetchone()
    return int(row[0]) if row else 0


def _insert(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO public.recovery_probe DEFAULT VALUES")
    return True


def _until(condition: Callable[[], bool], what: str, limit: float = 120.0) -> float:
    """Waits for ``condition`` (a lost connection counts as not yet); returns when it held."""
    deadline = time.monotonic() + limit
    while True:
        with contextlib.suppress(psycopg.OperationalError):
            if condition():
                return time.monotonic()
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up waiting: {what}")
        time.sleep(0.01)


def measure(pair: StandbyPair, fault: str, promote_after: float = 0.0) -> dict[str, float]:
    dsn = pair.dsn
    with Broker(dsn) as broker:
        handle = _dialog(broker, "T")
        with broker.transaction() as tx:
            tx.begin_conversation_timer(handle, 3600)
        with broker.transaction() as tx:
            backlog = tx.begin_dialog("I", "R", "C")
            for _ in range(BACKLOG):
                tx.send(backlog, "Req", "")
    timers = _timers(dsn)
    clients = Clients(dsn)
    try:
        # Every component has done its work once: connections are open, the waiter listens.
        _until(lambda: bool(clients.commits) and bool(clients.woken), "the clients to start")
        started = time.monotonic()
        if fault == "crash-restart":
            pair.crash_primary()
            started = time.monotonic()
            pair.start_primary()
        elif fault == "terminate":
            # Returns once every backend has exited.
            terminate_sessions(primary_only(pair))
            started = time.monotonic()
        else:
            pair.fail_over(promote_after)
            assert pair.killed_at is not None
            started = pair.killed_at
        back = _until(lambda: _insert(dsn), "a plain INSERT")
        with Broker(dsn) as broker:
            broker.advance_clock(dt.timedelta(hours=2))
        fired = _until(lambda: _timers(dsn) > timers, "the timer to fire")
        _until(lambda: any(b > started for b, _ in clients.commits), "a RECEIVE to commit")
        _until(lambda: any(s > started for s, _ in clients.woken), "a WAITFOR to wake")
        first_commit = min(c for b, c in clients.commits if b > started)
        first_wake = min(r for s, r in clients.woken if s > started)
        return {"plain INSERT": back - started, "RECEIVE loop": first_commit - started,
                "WAITFOR": first_wake - started, "worker timer": fired - started}
    finally:
        clients.close()


def primary_only(pair: StandbyPair) -> str:
    """pg_terminate_backend must run on the primary itself."""
    return pair.admin_dsn(pair.primary_port, DATABASE)


@contextmanager
def deployed_pair() -> Iterator[StandbyPair]:
    with standby_pair() as pair:
        deploy(pair.dsn)
        yield pair


def run(repetitions: int, faults: tuple[str, ...],
        promote_after: float = 0.0) -> dict[str, dict[str, list[float]]]:
    results: dict[str, dict[str, list[float]]] = {}
    for fault in faults:
        samples: dict[str, list[float]] = {c: [] for c in COMPONENTS}
        if fault == "failover":
            for _ in range(repetitions):
                with deployed_pair() as pair:
                    for name, value in measure(pair, fault, promote_after).items():
                        samples[name].append(value)
                print(f"  {fault}: {len(samples['plain INSERT'])} done", flush=True)
        else:
            with deployed_pair() as pair:
                for _ in range(repetitions):
                    for name, value in measure(pair, fault).items():
                        samples[name].append(value)
                    print(f"  {fault}: {len(samples['plain INSERT'])} done", flush=True)
        results[f"failover+{promote_after:g}s" if fault == "failover" and promote_after
                else fault] = samples
    return results


def table(results: dict[str, dict[str, list[float]]]) -> str:
    faults = list(results)
    lines = ["| Component | " + " | ".join(faults) + " |",
             "|---|" + "---|" * len(faults)]
    for component in COMPONENTS:
        cells = []
        for fault in faults:
            values = results[fault][component]
            cells.append(f"{statistics.median(values):.2f} s ({min(values):.2f}-"
                         f"{max(values):.2f})" if values else "-")
        lines.append(f"| {component} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.recovery", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--only", help=f"comma-separated faults among {','.join(FAULTS)}")
    parser.add_argument("--promote-after", type=float, default=0.0,
                        help="seconds between the primary's death and the promotion")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--verbose", action="store_true",
                        help="show the reconnect log lines of every component")
    args = parser.parse_args(argv)
    faults = tuple(f.strip() for f in args.only.split(",")) if args.only else FAULTS
    if unknown := set(faults) - set(FAULTS):
        raise SystemExit(f"unknown fault(s): {', '.join(sorted(unknown))}")
    # One warning per outage per connection, and psycopg's pool's per attempt, would bury the
    # table.
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR)
    results = run(args.repetitions, faults, args.promote_after)
    print(table(results))
    print(f"\nmedian (range) over {args.repetitions} repetition"
          f"{'s' if args.repetitions != 1 else ''}, from the moment the fault took effect")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
