"""Scenarios a, b, c, d and f: messages per second through SEND and RECEIVE, against pgmq and
against a bare INSERT."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

from bench import ours_setup, pgmq_peer
from bench.ops import BARE_TABLE, OpParams
from bench.ours_ops import MESSAGE_TYPE
from bench.report import Row, Scenario, Target, median
from bench.rounds import Contender, Fill, alternate, time_budget
from bench.scenario import Env, register
from bench.workers import Measurement

OUR_TABLES = ("broker.queue_messages", "broker.endpoints", "broker.dialog_groups")
# Readers spread over this many dialogs, so two readers never wait for one conversation group.
RECEIVE_DIALOGS = 200
# SEND against PostgreSQL's own durable INSERT+COMMIT, by producers: the limit that matters
# (pgmq.send is reported beside it, without a target).
SEND_TARGETS = {1: Target("ratio_at_least", 0.8, ">= 80% of bare INSERT"),
                2: Target("ratio_at_least", 0.7, ">= 70% of bare INSERT")}
# Against the complete checked floors (bench/floors.sql): what a design that keeps everything
# ours keeps reaches on the same machine in the same run.
CHECKED_SEND_TARGET = Target("ratio_at_least", 0.9, ">= 0.9x complete checked floor")
CHECKED_RECEIVE_TARGET = Target("ratio_at_least", 0.9, ">= 0.9x complete checked floor")


def _pgmq_table(queue: str) -> str:
    return f"pgmq.q_{queue}"


def empty_send_queues(env: Env) -> tuple[Callable[[], int], Callable[[], int]]:
    """Readies the send queues, ours and pgmq's: empty, vacuumed; returns the time budget."""
    target = env.catalog.targets["send"]
    budget = time_budget(env.options.seconds)

    def ours_ready() -> int:
        with env.transaction() as conn:
            ours_setup.purge(conn, target)
        env.settle(OUR_TABLES)
        return budget

    def pgmq_ready() -> int:
        pgmq_peer.purge(env.admin, target.queue)
        env.settle([_pgmq_table(target.queue)])
        return budget

    return ours_ready, pgmq_ready


def empty_bare_table(env: Env) -> Callable[[], int]:
    """Readies the bare INSERT's table: empty, vacuumed; returns the time budget."""
    budget = time_budget(env.options.seconds)

    def bare_ready() -> int:
        env.admin.execute(f"DELETE FROM {BARE_TABLE}")
        env.settle([BARE_TABLE])
        return budget

    return bare_ready


@register("a", "f")
def send_one(env: Env) -> list[Scenario]:
    """a: SEND one message per transaction vs pgmq.send; f, when selected: the same SEND vs a
    bare INSERT."""
    bare = env.options.selected("f")
    target = env.catalog.targets["send"]
    # One open dialog per producer, begun once and reused.
    handles = tuple(str(h) for h in ours_setup.begin_dialogs(env.broker, target, 2))
    ours_ready, pgmq_ready = empty_send_queues(env)
    bare_ready = empty_bare_table(env)
    contenders = []
    for workers in (1, 2):
        who = f"{workers} producer{'s' if workers > 1 else ''}"
        contenders += [
            Contender(f"ours{workers}", f"ours SEND, {who}", "ours.send", workers,
                      OpParams(target.queue, handles), ours_ready),
            Contender(f"piped{workers}", f"ours SEND, pipelined, {who}", "ours.send", workers,
                      OpParams(target.queue, handles, pipeline=True), ours_ready),
            Contender(f"pgmq{workers}", f"pgmq.send, {who}", "pgmq.send", workers,
                      OpParams(target.queue), pgmq_ready),
            Contender(f"checked{workers}", f"the complete checked floor of SEND, {who}",
                      "bare.send_floor_checked", workers,
                      OpParams(target.queue, handles, message_type=MESSAGE_TYPE), ours_ready),
        ]
        if bare:
            contenders += [
                Contender(f"bare{workers}", f"bare INSERT, {who}", "bare.insert", workers,
                          OpParams(""), bare_ready),
                Contender(f"floor{workers}", f"the floor of SEND, {who}", "bare.send_floor",
                          workers, OpParams(target.queue, handles, message_type=MESSAGE_TYPE),
                          ours_ready),
            ]
    rates = alternate(env, "a/f", contenders)

    a = Scenario("a", "SEND, one message per transaction, on an open conversation")
    f = Scenario("f", "The physical limit: a bare 100-byte INSERT + COMMIT per transaction")
    for workers in (1, 2):
        who = f"{workers} producer{'s' if workers > 1 else ''}"
        # As is, and in a pipelined transaction (BEGIN, SEND and COMMIT in one round trip).
        for key, how in (("ours", ""), ("piped", ", pipelined")):
            a.rows.append(Row(
                f"SEND 1 msg/tx{how}, {who}", "msg/s", "pgmq.send",
                median(rates[f"pgmq{workers}"]), median(rates[f"{key}{workers}"]),
                peer_rounds=rates[f"pgmq{workers}"], ours_rounds=rates[f"{key}{workers}"],
            ))
            # Against the same SEND with everything ours keeps, in one statement.
            a.rows.append(Row(
                f"SEND 1 msg/tx{how}, {who}", "msg/s", "the complete checked floor of SEND",
                median(rates[f"checked{workers}"]), median(rates[f"{key}{workers}"]),
                target=CHECKED_SEND_TARGET, peer_rounds=rates[f"checked{workers}"],
                ours_rounds=rates[f"{key}{workers}"],
            ))
            if bare:
                f.rows.append(Row(
                    f"SEND 1 msg/tx{how} as % of bare INSERT, {who}", "msg/s", "bare INSERT",
                    median(rates[f"bare{workers}"]), median(rates[f"{key}{workers}"]),
                    target=SEND_TARGETS[workers],
                    peer_rounds=rates[f"bare{workers}"], ours_rounds=rates[f"{key}{workers}"],
                ))
        if bare:
            # What any design that numbers a conversation's messages writes, without a check:
            # the most a SEND could reach against the bare INSERT on this machine.
            f.rows.append(Row(
                f"the floor of SEND (floors.sql) as % of bare INSERT, {who}", "msg/s",
                "bare INSERT", median(rates[f"bare{workers}"]),
                median(rates[f"floor{workers}"]), target=SEND_TARGETS[workers],
                peer_rounds=rates[f"bare{workers}"], ours_rounds=rates[f"floor{workers}"],
            ))
    return [a, f] if bare else [a]


@register("b")
def send_batch(env: Env) -> Scenario:
    """b: 100 SENDs in one transaction (one send_many call) vs one pgmq.send_batch of 100."""
    target = env.catalog.targets["send"]
    handles = tuple(str(h) for h in ours_setup.begin_dialogs(env.broker, target, 1))
    ours_ready, pgmq_ready = empty_send_queues(env)
    rates = alternate(env, "b", [
        Contender("ours", "ours 100 x SEND in 1 tx", "ours.send_batch", 1,
                  OpParams(target.queue, handles, batch=100), ours_ready),
        Contender("pgmq", "pgmq.send_batch(100)", "pgmq.send_batch", 1,
                  OpParams(target.queue, batch=100), pgmq_ready),
    ])
    return Scenario("b", "SEND, 100 messages per transaction", rows=[Row(
        "100 SENDs per tx (send_many)", "msg/s", "pgmq.send_batch(100)",
        median(rates["pgmq"]), median(rates["ours"]),
        target=Target("ratio_at_least", 1.0, ">= 1.0x send_batch"),
        peer_rounds=rates["pgmq"], ours_rounds=rates["ours"],
    )])


def receive_contenders(
    env: Env, target_name: str, top: int, fill_per_second: int, cap: int, workers: int,
    peers: list[tuple[str, str, str]],
    ours: tuple[tuple[str, str, str], ...] = (("ours", "ours RECEIVE", "ours.receive"),),
) -> list[Contender]:
    """Each RECEIVE TOP(top) op on our tables (``ours``: key, label, op) and each peer op,
    with queues pre-filled before every measurement."""
    target = env.catalog.targets[target_name]
    seconds = env.options.seconds
    fills: dict[str, Fill] = {}

    def fill_for(key: str) -> Fill:
        return fills.setdefault(key, Fill(int(fill_per_second * seconds) + 10 * top, cap))

    def ours_ready(key: str) -> int:
        size = fill_for(key).size
        with env.transaction() as conn:
            ours_setup.purge(conn, target)
            ours_setup.add_dialogs(
                conn, env.catalog, target, RECEIVE_DIALOGS, math.ceil(size / RECEIVE_DIALOGS)
            )
        env.settle(OUR_TABLES)
        return size

    def pgmq_ready(key: str) -> int:
        size = fill_for(key).size
        with env.transaction() as conn:
            pgmq_peer.purge(conn, target.queue)
            pgmq_peer.fill(conn, target.queue, size, 100)
        env.settle([_pgmq_table(target.queue)])
        return size

    who = f"{workers} reader{'s' if workers > 1 else ''}"
    contenders = [Contender(
        f"{key}{workers}", f"{label} TOP({top}), {who}", op, workers,
        OpParams(target.queue, batch=top), functools.partial(ours_ready, key),
        _after(fill_for(key), seconds),
    ) for key, label, op in ours]
    for key, label, op in peers:
        contenders.append(Contender(
            f"{key}{workers}", f"{label}, {who}", op, workers, OpParams(target.queue, batch=top),
            functools.partial(pgmq_ready, key), _after(fill_for(key), seconds),
        ))
    return contenders


def _after(fill: Fill, seconds: float) -> Callable[[Measurement], None]:
    def grow(measured: Measurement) -> None:
        fill.after(measured, seconds)

    return grow


@register("c")
def receive_one(env: Env) -> Scenario:
    """c: RECEIVE TOP(1) + commit vs pgmq read+delete and vs pgmq.pop, 1 and 2 readers."""
    peers = [("read", "pgmq read+delete", "pgmq.read_delete"), ("pop", "pgmq.pop", "pgmq.pop")]
    ours = (("ours", "ours RECEIVE", "ours.receive"),
            ("auto", "ours autocommit RECEIVE", "ours.receive_autocommit"),
            ("floor", "the floor of RECEIVE", "bare.receive_floor"),
            ("checked", "the complete checked floor of RECEIVE",
             "bare.receive_floor_checked"))
    contenders = []
    for workers in (1, 2):
        contenders += receive_contenders(env, "recv1", 1, 3_000, 500_000, workers, peers, ours)
    rates = alternate(env, "c", contenders)
    scenario = Scenario("c", "RECEIVE TOP(1) + commit")
    read_target = Target("ratio_at_least", 1.5, ">= 1.5x read+delete")
    pop_target = Target("ratio_at_least", 1.0, ">= 1.0x pop")
    for workers in (1, 2):
        who = f"{workers} reader{'s' if workers > 1 else ''}"
        # The transaction's RECEIVE against both; the autocommit RECEIVE (one statement that
        # commits the removal, at-most-once as pop is) against pop.
        for ours_key, ours_label, key, label, target in (
                ("ours", "RECEIVE TOP(1)+commit", "read", "pgmq read+delete", read_target),
                ("ours", "RECEIVE TOP(1)+commit", "pop", "pgmq.pop", pop_target),
                ("auto", "autocommit RECEIVE TOP(1) (Broker.receive)", "pop", "pgmq.pop",
                 pop_target),
                # Without any check or record, the most a transactional RECEIVE could reach.
                ("floor", "the floor of RECEIVE TOP(1)+commit (floors.sql)", "read",
                 "pgmq read+delete", read_target),
                ("floor", "the floor of RECEIVE TOP(1)+commit (floors.sql)", "pop", "pgmq.pop",
                 pop_target),
                # With everything ours keeps for the common case: Service Broker's checks in
                # the same statement, and poison detection's record with its check.
                ("checked", "the complete checked floor of RECEIVE TOP(1)+commit",
                 "read", "pgmq read+delete", read_target),
                ("checked", "the complete checked floor of RECEIVE TOP(1)+commit",
                 "pop", "pgmq.pop", pop_target),
                # Ours against a design that keeps everything ours keeps.
                ("ours", "RECEIVE TOP(1)+commit", "checked",
                 "the complete checked floor of RECEIVE", CHECKED_RECEIVE_TARGET)):
            scenario.rows.append(Row(
                f"{ours_label}, {who}", "msg/s", label,
                median(rates[f"{key}{workers}"]), median(rates[f"{ours_key}{workers}"]),
                target=target, peer_rounds=rates[f"{key}{workers}"],
                ours_rounds=rates[f"{ours_key}{workers}"],
            ))
    return scenario


@register("d")
def receive_batch(env: Env) -> Scenario:
    """d: RECEIVE TOP(100) + commit vs pgmq read 100 + delete of the array of ids."""
    contenders = receive_contenders(
        env, "recv100", 100, 30_000, 2_000_000, 1,
        [("read", "pgmq read(100)+delete", "pgmq.read_delete")],
    )
    rates = alternate(env, "d", contenders)
    return Scenario("d", "RECEIVE TOP(100) + commit", rows=[Row(
        "RECEIVE TOP(100)+commit, 1 reader", "msg/s", "pgmq read(100)+delete(ids)",
        median(rates["read1"]), median(rates["ours1"]),
        target=Target("ratio_at_least", 1.0, ">= 1.0x"),
        peer_rounds=rates["read1"], ours_rounds=rates["ours1"],
    )])
