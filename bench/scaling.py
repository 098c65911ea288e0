"""Scenario l: how SEND and RECEIVE scale with the number of producers and readers, ours
against pgmq (and SEND against the bare INSERT), at 1, 2, 4 and 8 workers.

Each worker is a process of its own with its own connection, as each of a deployment's
producers and readers is. SEND: one message per transaction, each producer on its own open
dialog (producers on one conversation would queue on its group lock, by design). RECEIVE:
TOP(1) and commit, readers spread over 200 dialogs, so none waits for another's group.

A curve, not a target: where it bends is what a user on another machine needs. Past the
machine's cores, more workers measure contention for the CPU, not the engine's scaling; the
environment in the JSON says how many cores the run had.
"""

from __future__ import annotations

import os

from bench import ours_setup
from bench.ops import OpParams
from bench.report import Row, Scenario, median
from bench.rounds import Contender, alternate
from bench.scenario import Env, Options, register
from bench.throughput import (
    OUR_TABLES,
    empty_bare_table,
    empty_send_queues,
    receive_contenders,
)

WORKERS = (1, 2, 4, 8)
WORKERS_QUICK = (1, 2)


def _who(workers: int, kind: str) -> str:
    return f"{workers} {kind}{'s' if workers > 1 else ''}"


def _processes(options: Options) -> int:
    return max(WORKERS_QUICK if options.quick else WORKERS)


@register("l", processes=_processes)
def scaling(env: Env) -> Scenario:
    counts = WORKERS_QUICK if env.options.quick else WORKERS
    target = env.catalog.targets["send"]
    handles = tuple(str(h) for h in ours_setup.begin_dialogs(env.broker, target, max(counts)))
    ours_ready, pgmq_ready = empty_send_queues(env)
    bare_ready = empty_bare_table(env)
    contenders: list[Contender] = []
    for workers in counts:
        who = _who(workers, "producer")
        contenders += [
            Contender(f"send{workers}", f"ours SEND, {who}", "ours.send", workers,
                      OpParams(target.queue, handles), ours_ready),
            Contender(f"pgmq.send{workers}", f"pgmq.send, {who}", "pgmq.send", workers,
                      OpParams(target.queue), pgmq_ready),
            Contender(f"bare{workers}", f"bare INSERT, {who}", "bare.insert", workers,
                      OpParams(""), bare_ready),
        ]
        contenders += receive_contenders(
            env, "recv1", 1, 3_000, 500_000, workers,
            [("read", "pgmq read+delete", "pgmq.read_delete")],
            (("receive", "ours RECEIVE", "ours.receive"),),
        )
    env.progress(f"l: {len(contenders)} measurements per round, at {counts} workers")
    rates = alternate(env, "l", contenders)

    rows = []
    for workers in counts:
        who = _who(workers, "producer")
        rows += [
            Row(f"SEND 1 msg/tx, {who}", "msg/s", "pgmq.send",
                median(rates[f"pgmq.send{workers}"]), median(rates[f"send{workers}"]),
                peer_rounds=rates[f"pgmq.send{workers}"], ours_rounds=rates[f"send{workers}"]),
            Row(f"SEND 1 msg/tx as % of bare INSERT, {who}", "msg/s", "bare INSERT",
                median(rates[f"bare{workers}"]), median(rates[f"send{workers}"]),
                peer_rounds=rates[f"bare{workers}"], ours_rounds=rates[f"send{workers}"]),
        ]
    for workers in counts:
        who = _who(workers, "reader")
        rows.append(Row(
            f"RECEIVE TOP(1)+commit, {who}", "msg/s", "pgmq read+delete",
            median(rates[f"read{workers}"]), median(rates[f"receive{workers}"]),
            peer_rounds=rates[f"read{workers}"], ours_rounds=rates[f"receive{workers}"]))
    cores = os.cpu_count() or 0
    note = (f"Measured on {cores} cores: with more workers than cores, each worker and its "
            "backend share the CPU with the others, so the points past that measure contention. "
            f"Tables settled ({', '.join(OUR_TABLES)}) before each of our measurements.")
    return Scenario("l", "Scaling: SEND and RECEIVE at 1, 2, 4 and 8 workers", note=note,
                    rows=rows)
