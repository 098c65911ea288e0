"""Scenario i: the memory of a reader process draining a large queue in batches of 100.

Our queue holds the messages in dialogs of 100 (RECEIVE returns one conversation group at a time);
pgmq's holds the same number. One drain per side: a drain of a million messages is a long
measurement of its own, and peak memory is not a number that needs a median.
"""

from __future__ import annotations

import math

from bench import ours_setup, pgmq_peer
from bench.ops import OpParams
from bench.report import Row, Scenario, Target
from bench.scenario import Env, register
from bench.throughput import OUR_TABLES
from bench.workers import Measurement

BATCH = 100
# Bounds the drain; a million messages take well under a minute on a laptop.
DRAIN_SECONDS = 1_800.0


def _mib(kib: int | None) -> float | None:
    return None if kib is None else kib / 1024


@register("i")
def drain(env: Env) -> Scenario:
    target = env.catalog.targets["drain"]
    count = env.options.drain_messages
    budget = math.ceil(count / BATCH) + 100
    measured: dict[str, Measurement] = {}
    for side, op in (("ours", "ours.receive"), ("pgmq", "pgmq.read_delete")):
        env.progress(f"i filling {count:,} messages for {side}")
        with env.transaction() as conn:
            if side == "ours":
                ours_setup.purge(conn, target)
                ours_setup.add_dialogs(conn, env.catalog, target, math.ceil(count / BATCH), BATCH)
            else:
                pgmq_peer.purge(conn, target.queue)
                pgmq_peer.fill(conn, target.queue, count, 100)
        env.settle(OUR_TABLES if side == "ours" else [f"pgmq.q_{target.queue}"])
        env.progress(f"i draining {count:,} messages, {side}")
        measured[side] = env.measure(
            op, 1, OpParams(target.queue, batch=BATCH), seconds=DRAIN_SECONDS, max_ops=budget,
            warmup_ops=0, track_rss=True,
        )
        result = measured[side].results[0]
        env.progress(
            f"i {side}: drained {result.messages:,} in {result.elapsed:.1f} s, RSS "
            f"{_mib(result.rss_first_kib) or 0:.1f} MiB after the first batch, peak "
            f"{_mib(result.rss_peak_kib) or 0:.1f} MiB"
        )
    ours, pgmq = measured["ours"].results[0], measured["pgmq"].results[0]

    def growth(first: int | None, peak: int | None) -> float | None:
        return None if not first or peak is None else peak / first

    drained = f"{ours.messages:,} messages drained by ours, {pgmq.messages:,} by pgmq"
    return Scenario("i", f"Reader memory draining {count:,} messages in batches of {BATCH}",
                    note=drained, rows=[
        Row("reader RSS after the first batch", "MiB", "pgmq read(100)+delete",
            _mib(pgmq.rss_first_kib), _mib(ours.rss_first_kib), higher_is_better=False),
        Row("reader RSS at the end", "MiB", "pgmq read(100)+delete",
            _mib(pgmq.rss_end_kib), _mib(ours.rss_end_kib), higher_is_better=False),
        Row("reader peak RSS during the drain", "MiB", "pgmq read(100)+delete",
            _mib(pgmq.rss_peak_kib), _mib(ours.rss_peak_kib), higher_is_better=False),
        Row("peak RSS / RSS after the first batch", "x", "pgmq read(100)+delete",
            growth(pgmq.rss_first_kib, pgmq.rss_peak_kib),
            growth(ours.rss_first_kib, ours.rss_peak_kib), higher_is_better=False,
            target=Target("ours_at_most", 1.10, "flat within 10%")),
        Row("drain throughput", "msg/s", "pgmq read(100)+delete", measured["pgmq"].rate,
            measured["ours"].rate),
    ])
