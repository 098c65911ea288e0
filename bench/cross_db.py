"""Scenario k: SEND to RECEIVE between two brokers in two databases of one server, against the
same SEND and RECEIVE within one database.

Broker A is the run's database, with the initiator service. Broker B is a second database on
the same server, created for k with a freshly installed broker schema (so a broker instance of
its own) and dropped when k ends; it holds the target service. A has a route to the target
service, B one back to the initiator's, which the acknowledgements need. A broker worker for A
(activation off, default interval of 1 s) runs in a thread of this process, as a deployment
runs one: its transport thread LISTENs on ``broker_transmit`` and delivers when a SEND for B
commits, in B's own transaction. The peer of every measurement is the same producer and reader
with the target service in A: local delivery, nothing for the transport to do (the worker runs
all the same).

Every measurement starts from a new dialog and a new broker worker, the previous dialogs
removed on both sides: what the transport had not delivered when a measurement ended is
dropped, not drained (a producer of 100 messages per transaction outruns the transport by far).

k1, throughput: one producer SENDs on its dialog, one message per transaction (and, as a second
row, 100 per transaction with one send_many), while one reader waits in WAITFOR (RECEIVE
TOP(100)) and commits, in B (across) or in A (local). The rate is what the reader received
per second of the measurement, which lasts until the reader's last RECEIVE that returned
messages: messages that arrived on the far queue and were received there, end to end. After
the warm-ups, what they sent is delivered and removed before the measurement starts.

k2, latency: as scenario e, from the sender issuing its COMMIT in A to the waiting RECEIVE
returning the message in B (across) or in A (local).
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, replace

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from airflow_broker import Broker
from airflow_broker.migrations import install as install_broker
from airflow_broker.worker import BrokerWorker
from airflow_broker.worker.transport import address_of, next_step_size
from bench import ours_setup
from bench.latency import alternate_samples
from bench.ops import FLOOR_READER_SETTINGS, OpParams, floors, with_settings
from bench.ours_ops import MESSAGE_TYPE
from bench.report import Row, Scenario, Target, median
from bench.rounds import Contender, alternate, time_budget
from bench.scenario import Env, register
from bench.workers import Measurement

TITLE = "SEND to RECEIVE between two brokers in two databases, vs within one database"
FAR_SERVICE, FAR_QUEUE = "Bench_far", "bench_far"
LOCAL_SERVICE, LOCAL_QUEUE = "Bench_k_local", "bench_k_local"
ROUTE_TO_FAR, ROUTE_BACK = "bench_to_far", "bench_to_initiator"
PEER_LABEL = "the same within one database (local delivery)"
PRODUCER, READER = 0, 1
# The first step of a transport (the broker worker's default batch size).
BATCH = 1000
# k1's contenders, as the note lists them.
KEYS = ("across1", "local1", "across100", "local100", "floor_across100", "floor_local100")
TOP = 100
# Batches between two brokers at least 0.8x the same within one.
BATCH_TARGET = Target("ratio_at_least", 0.8, ">= 0.8x local delivery")
SIDES = ("across", "local")
# What is in flight (message 0, the warm-ups) must be delivered within this time.
DELIVERY_TIMEOUT = 60.0
TABLES = ("broker.queue_messages", "broker.endpoints", "broker.dialog_groups",
          "broker.transmissions")
# The far service as A sees it: a service of another broker, known by name only.
FAR_IN_A = ours_setup.Target(FAR_SERVICE, FAR_QUEUE, service_id=-1, queue_id=-1)
# A's transmissions of the dialogs to the far service.
_OURS_IN_FLIGHT = ("conversation_handle IN (SELECT conversation_handle FROM broker.endpoints"
                   " WHERE is_initiator AND far_service = %s)")


def route_uri(dsn: str) -> str:
    """The route address of the broker at ``dsn``, without ``options``: B is made durable with
    ALTER DATABASE, whatever the harness's connection options say."""
    params = conninfo_to_dict(dsn)
    params.pop("options", None)
    return address_of(make_conninfo("", **params))


def far_database_name(dsn: str) -> str:
    """B's database: the run's, with a suffix (within PostgreSQL's 63 bytes for a name)."""
    suffix = "_k_far"
    base = str(conninfo_to_dict(dsn).get("dbname") or "bench")
    return base.encode()[:63 - len(suffix)].decode(errors="ignore") + suffix


class FloorTransport:
    """k's floor of the transport, in a thread of this process as A's broker worker runs: what
    any store-and-forward delivery between two databases does at least (floors.sql). It reads
    a batch of due messages in A, stores them on B's queue in one transaction of B's, then
    removes them from A's transmission queue; it polls every millisecond while nothing is due.
    No routes, states, checks, acknowledgement messages or retry times. Its steps grow with a
    backlog as the broker's transport's do (airflow_broker.worker.transport)."""

    def __init__(self, sender_dsn: str, receiver_dsn: str) -> None:
        self.dsns = (with_settings(sender_dsn, **FLOOR_READER_SETTINGS),
                     with_settings(receiver_dsn, **FLOOR_READER_SETTINGS))
        self.stopping = threading.Event()
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="bench-k-floor-transport",
                                       daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=60)
        if self.thread.is_alive():
            raise RuntimeError("k: the floor's transport did not stop within 60 s")
        if self.failure is not None:
            raise RuntimeError(f"k: the floor's transport failed: {self.failure}")

    def _run(self) -> None:
        blocks = floors()
        try:
            with psycopg.connect(self.dsns[0], autocommit=True) as sender, \
                    psycopg.connect(self.dsns[1]) as receiver:
                size = BATCH
                while not self.stopping.is_set():
                    rows = sender.execute(blocks["transmit_take"], {"limit": size}).fetchall()
                    if not rows:
                        self.stopping.wait(0.001)
                        continue
                    ids, conversations, initiators, seqs, types, bodies = (
                        list(column) for column in zip(*rows, strict=True))
                    with receiver.transaction():
                        receiver.execute(blocks["transmit_accept"], {
                            "conversation_ids": conversations, "from_initiator": initiators,
                            "seqs": seqs, "types": types, "bodies": bodies})
                    sender.execute(blocks["transmit_acknowledged"], {"ids": ids})
                    size = next_step_size(size, BATCH, len(rows),
                                          sum(len(body) for body in bodies if body is not None))
        except BaseException as exc:  # reported by stop()
            self.failure = exc


@dataclass
class Brokers:
    """Both sides of k, and the broker worker of A while one runs."""

    env: Env
    far_dsn: str
    # The far service and its queue, in B.
    far: ours_setup.Target
    # The local peer's target service, in A.
    local: ours_setup.Target
    worker: BrokerWorker | None = None
    thread: threading.Thread | None = None
    worker_broker: Broker | None = None
    floor_transport: FloorTransport | None = None

    def far_connection(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.far_dsn, autocommit=True)

    def start_worker(self) -> None:
        """A's broker worker, activation off, in a thread of this process."""
        broker = Broker(self.env.dsn, min_connections=1, max_connections=4,
                        application_name="bench-k-worker")
        worker = BrokerWorker(broker, activation=False)
        thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False},
                                  name="bench-k-worker", daemon=True)
        thread.start()
        self.worker, self.thread, self.worker_broker = worker, thread, broker

    def start_floor_transport(self) -> None:
        """The floor's transport instead of A's broker worker."""
        self.stop_worker()
        self.floor_transport = FloorTransport(self.env.dsn, self.far_dsn)
        self.floor_transport.start()

    def stop_worker(self) -> None:
        """Stops A's broker worker, or the floor's transport; what it has not delivered to B
        is dropped: the worker's transport stops only once nothing is due (it goes on while
        its batches are full)."""
        floor, self.floor_transport = self.floor_transport, None
        if floor is not None:
            floor.stop()
        if self.worker is not None:
            self.worker.stop()
        if floor is not None or self.worker is not None:
            with self.env.transaction() as conn:
                conn.execute(f"DELETE FROM broker.transmissions WHERE {_OURS_IN_FLIGHT}",
                             [FAR_SERVICE])
        if self.worker is not None:
            # Ends the transport thread's wait for a NOTIFY at once.
            self.nudge()
        if self.thread is not None:
            # The transport thread ends its step, or its wait for a NOTIFY (the interval).
            self.thread.join(timeout=60)
            if self.thread.is_alive():
                raise RuntimeError("k: the broker worker did not stop within 60 s")
        if self.worker_broker is not None:
            self.worker_broker.close()
        self.worker = self.thread = self.worker_broker = None

    def nudge(self) -> None:
        """Wakes the transport as a SEND for B does. Used outside the measurements only: only
        a SEND that finds nothing of its conversation waiting notifies, so the messages of a
        burst after the first one wait for the worker's next interval."""
        self.env.admin.execute("SELECT pg_notify('broker_transmit', '')")

    def in_flight(self) -> int:
        """Messages A still has to deliver to B (in its transmission queue)."""
        row = self.env.admin.execute(
            f"SELECT count(*) FROM broker.transmissions WHERE {_OURS_IN_FLIGHT}", [FAR_SERVICE]
        ).fetchone()
        return int(row[0]) if row else 0

    def delivered(self, what: str) -> None:
        """Waits until A's transmission queue is empty: everything went to B."""
        deadline = time.monotonic() + DELIVERY_TIMEOUT
        if self.in_flight() > 0:
            self.nudge()
        while (left := self.in_flight()) > 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"k: {left} messages still in A's transmission queue "
                                   f"{DELIVERY_TIMEOUT:.0f} s after {what}")
            time.sleep(0.005)

    def purge_far(self) -> None:
        with self.far_connection() as conn:
            ours_setup.purge(conn, self.far)

    def purge_local(self) -> None:
        with self.env.transaction() as conn:
            ours_setup.purge(conn, self.local)

    def fresh_dialog(self, side: str) -> uuid.UUID:
        """A new dialog for ``side``, everything of the earlier ones removed on both sides,
        its message 0 delivered (and, across, acknowledged), the tables vacuumed and
        analyzed, and a new broker worker running."""
        self.stop_worker()
        with self.env.transaction() as conn:
            ours_setup.forget_dialogs(conn, FAR_IN_A, self.local)
        with self.far_connection() as conn:
            ours_setup.forget_dialogs(conn, self.far)
        target = FAR_IN_A if side == "across" else self.local
        [handle] = ours_setup.begin_dialogs(self.env.broker, target, 1)
        self.start_worker()
        self.delivered("message 0")
        self.purge_local()
        with self.far_connection() as conn:
            ours_setup.purge(conn, self.far)
            for table in TABLES:
                schema, relation = table.split(".")
                conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(
                    sql.Identifier(schema, relation)))
        self.env.settle(TABLES)
        return handle


def _create_far_database(env: Env, name: str) -> str:
    ident = sql.Identifier(name)
    env.admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
    env.admin.execute(sql.SQL("CREATE DATABASE {}").format(ident))
    # Durable commits in B whatever the server's default, also for the transport's sessions.
    env.admin.execute(sql.SQL("ALTER DATABASE {} SET synchronous_commit = on").format(ident))
    far_dsn = make_conninfo(env.dsn, dbname=name)
    install_broker(far_dsn)
    return far_dsn


def _target(conn: psycopg.Connection[tuple[object, ...]], service: str,
            queue: str) -> ours_setup.Target:
    row = conn.execute("SELECT service_id, service_queue_id FROM broker.service_defs"
                       " WHERE name = %s", [service]).fetchone()
    assert row is not None
    return ours_setup.Target(service, queue, int(str(row[0])), int(str(row[1])))


def _set_up(env: Env, far_dsn: str) -> Brokers:
    """B: the contract, the target service and the route back; A: the local peer's target
    service and the route to B."""
    with Broker(far_dsn, min_connections=1, max_connections=1) as far, \
            far.transaction() as tx:
        tx.create_message_type(MESSAGE_TYPE)
        tx.create_contract(ours_setup.CONTRACT, {MESSAGE_TYPE: "ANY"})
        tx.create_queue(FAR_QUEUE)
        tx.create_service(FAR_SERVICE, FAR_QUEUE, [ours_setup.CONTRACT])
        tx.create_route(ROUTE_BACK, route_uri(env.dsn),
                        service_name=ours_setup.INITIATOR_SERVICE)
        far_target = _target(tx.conn, FAR_SERVICE, FAR_QUEUE)
    with env.broker.transaction() as tx:
        conn = tx.conn
        if conn.execute("SELECT 1 FROM broker.service_defs WHERE name = %s",
                        [LOCAL_SERVICE]).fetchone() is None:
            tx.create_queue(LOCAL_QUEUE)
            tx.create_service(LOCAL_SERVICE, LOCAL_QUEUE, [ours_setup.CONTRACT])
        # A database kept from an earlier run may hold the route, to an older B.
        if conn.execute("SELECT 1 FROM broker.route_defs WHERE name = %s",
                        [ROUTE_TO_FAR]).fetchone() is not None:
            tx.drop_route(ROUTE_TO_FAR)
        tx.create_route(ROUTE_TO_FAR, route_uri(far_dsn), service_name=FAR_SERVICE)
        local = _target(conn, LOCAL_SERVICE, LOCAL_QUEUE)
    return Brokers(env, far_dsn, far_target, local)


@register("k")
def cross_database(env: Env) -> Scenario:
    name = far_database_name(env.dsn)
    env.progress(f"k: creating database {name} with a broker of its own (broker B)")
    try:
        far_dsn = _create_far_database(env, name)
    except psycopg.errors.InsufficientPrivilege as exc:
        env.progress(f"k unavailable: {exc}")
        return Scenario("k", TITLE, status="unavailable",
                        note=f"k needs a second database on the same server: {exc}")
    brokers: Brokers | None = None
    try:
        brokers = _set_up(env, far_dsn)
        rows, notes = _throughput(env, brokers)
        latency_rows, latency_note = _latency(env, brokers)
    except (RuntimeError, psycopg.Error) as exc:
        # BenchError (a load worker failed or is stuck) is a RuntimeError.
        env.progress(f"k failed: {exc}")
        return Scenario("k", TITLE, status="failed", note=f"k failed: {exc}")
    finally:
        try:
            if brokers is not None:
                brokers.stop_worker()
                with env.transaction() as conn:
                    ours_setup.forget_dialogs(conn, FAR_IN_A, brokers.local)
        finally:
            env.admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))
    return Scenario("k", TITLE, note=f"{notes} {latency_note}", rows=rows + latency_rows)


def _throughput(env: Env, brokers: Brokers) -> tuple[list[Row], str]:
    budget = time_budget(env.options.seconds)
    # A reader that finds nothing for this long stops. Longer than the worker's interval
    # (1 s): the transport may wait that long for its next step (see docs/performance.md).
    wait = 1.5 if env.options.quick else 3.0
    sent: dict[str, list[float]] = {}
    left: dict[str, list[int]] = {}
    contenders: list[Contender] = []

    def received(measured: Measurement) -> float:
        return (measured.results[READER].messages / measured.elapsed
                if measured.elapsed > 0 else 0.0)

    def add(key: str, side: str, ops: tuple[str, str], label: str,
            floor: bool = False) -> None:
        across = side == "across"

        def prepare() -> int:
            handle = brokers.fresh_dialog(side)
            if floor and across:
                brokers.start_floor_transport()
            contender.params = replace(contender.params, handles=(str(handle),))
            return budget

        def before_go() -> None:
            # What the warm-ups sent goes, so the reader counts what the measurement sent.
            if across:
                brokers.delivered("the warm-up")
                brokers.purge_far()
            else:
                brokers.purge_local()

        def after(measured: Measurement) -> None:
            producer, reader = measured.results[PRODUCER], measured.results[READER]
            rate = producer.messages / producer.elapsed if producer.elapsed > 0 else 0.0
            sent.setdefault(key, []).append(rate)
            missing = producer.messages - reader.messages
            left.setdefault(key, []).append(missing)
            env.progress(
                f"k {label}: {rate:,.0f} sent/s, {received(measured):,.0f} received/s over "
                f"{measured.elapsed:.1f} s; {missing:,} of {producer.messages:,} sent not "
                "received by the end"
            )

        contender = Contender(
            key, label, ops, 2,
            # batch: the reader's TOP, and the messages of one send_many.
            OpParams(FAR_QUEUE if across else LOCAL_QUEUE, batch=TOP, wait=wait,
                     message_type=MESSAGE_TYPE),
            prepare, after, received,
            dsns=(env.dsn, brokers.far_dsn if across else env.dsn), warmups=(10, 0),
            before_go=before_go,
        )
        contenders.append(contender)

    for batch, op, what in ((1, "ours.send", "1 msg/tx"), (TOP, "ours.send_batch", "100/tx")):
        for side in SIDES:
            add(f"{side}{batch}", side, (op, "ours.receive_wait"),
                f"SEND {what}, {'A to B' if side == 'across' else 'within A'}")
    # The floor of each side (floors.sql): what any design moves with the same producer,
    # transport and reader, none of them checking anything.
    for side in SIDES:
        add(f"floor_{side}{TOP}", side, ("bare.send_floor_batch", "bare.receive_floor_wait"),
            f"the floor of SEND 100/tx, {'A to B' if side == 'across' else 'within A'}",
            floor=True)
    rates = alternate(env, "k1", contenders)
    rows = [
        Row(f"SEND {what} to RECEIVE TOP(100)+commit, received/s, 1 producer + 1 reader",
            "msg/s", PEER_LABEL, median(rates[f"local{batch}"]),
            median(rates[f"across{batch}"]),
            target=BATCH_TARGET if batch == TOP else None,
            peer_rounds=rates[f"local{batch}"], ours_rounds=rates[f"across{batch}"])
        for batch, what in ((1, "1 msg/tx"), (TOP, "100 msg/tx (send_many)"))
    ]
    rows += [
        Row("the floor of SEND 100 msg/tx to RECEIVE TOP(100)+commit, received/s",
            "msg/s", "the floor within one database", median(rates[f"floor_local{TOP}"]),
            median(rates[f"floor_across{TOP}"]), target=BATCH_TARGET,
            peer_rounds=rates[f"floor_local{TOP}"], ours_rounds=rates[f"floor_across{TOP}"]),
        Row("SEND 100 msg/tx to RECEIVE TOP(100)+commit, A to B, received/s", "msg/s",
            "the floor A to B", median(rates[f"floor_across{TOP}"]),
            median(rates[f"across{TOP}"]),
            peer_rounds=rates[f"floor_across{TOP}"], ours_rounds=rates[f"across{TOP}"]),
        Row("SEND 100 msg/tx to RECEIVE TOP(100)+commit, within A, received/s", "msg/s",
            "the floor within A", median(rates[f"floor_local{TOP}"]),
            median(rates[f"local{TOP}"]),
            peer_rounds=rates[f"floor_local{TOP}"], ours_rounds=rates[f"local{TOP}"]),
    ]

    def sent_median(key: str) -> str:
        value = median(sent.get(key, []))
        return "-" if value is None else f"{value:,.0f}"

    note = (
        "k1: ours = A to B through the transport, peer = within A. Sent per second (medians): "
        + ", ".join(f"{key} {sent_median(key)}" for key in KEYS)
        + ". Sent but not received when a measurement ended, per round: "
        + "; ".join(f"{key} " + ", ".join(f"{n:,}" for n in left.get(key, []))
                    for key in KEYS)
        + "."
    )
    return rows, note


def _latency(env: Env, brokers: Brokers) -> tuple[list[Row], str]:
    def ready(side: str) -> tuple[str, str, OpParams, str | None]:
        across = side == "across"
        handle = brokers.fresh_dialog(side)
        params = OpParams(FAR_QUEUE if across else LOCAL_QUEUE, (str(handle),))
        return ("ours.wait_receiver", "ours.commit_sender", params,
                brokers.far_dsn if across else None)

    measured = alternate_samples(env, "k2", SIDES, 11, "samples", ready)
    latencies, p50s, timeouts = measured.latencies, measured.p50s, measured.timeouts
    rows = [
        Row(f"SEND commit to WAITFOR RECEIVE return, {name}", "ms", PEER_LABEL,
            measured.ms("local", fraction), measured.ms("across", fraction),
            higher_is_better=False,
            peer_rounds=p50s["local"] if fraction == 0.5 else [],
            ours_rounds=p50s["across"] if fraction == 0.5 else [])
        for name, fraction in (("p50", 0.5), ("p99", 0.99))
    ]
    note = (
        f"k2: {len(latencies['across'])} samples A to B, {len(latencies['local'])} within A; "
        f"timeouts: A to B {timeouts['across']}, within A {timeouts['local']}."
    )
    return rows, note

