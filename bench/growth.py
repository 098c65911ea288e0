"""Scenario g: cost growth. RECEIVE TOP(1) + commit latency as the waiting messages grow, and
SEND latency as the open conversations grow, each at the same sizes for both sides.

At size N our queue holds N messages over N/2 dialogs (N endpoints, two messages per dialog and
its group); pgmq's queue holds N messages. pgmq has no conversations, so its SEND reference is
pgmq.send into its queue of N messages.
"""

from __future__ import annotations

import time

from bench import ours_setup, pgmq_peer
from bench.ops import OpParams
from bench.report import Row, Scenario, Target, median
from bench.scenario import Env, register
from bench.throughput import OUR_TABLES

SAMPLED_DIALOGS = 1_000
# Per measurement: at most this long, and at most a tenth of the queue, so its size holds.
SECONDS_CAP = 2.0
MAX_OPS = 500


def _fill_to(env: Env, size: int, conversations: int) -> int:
    """Grows both queues to ``size`` ready messages and our dialogs to ``size / 2``; returns
    the number of our dialogs now."""
    catalog = env.catalog
    target = catalog.targets["growth"]
    wanted = max(size // 2, 1)
    with env.transaction() as conn:
        ours_setup.add_dialogs(conn, catalog, target, wanted - conversations, 2)
    _top_up(env, size)
    return max(wanted, conversations)


def _top_up(env: Env, size: int) -> None:
    catalog = env.catalog
    target = catalog.targets["growth"]
    with env.transaction() as conn:
        missing = size - ours_setup.ready(conn, target)
        if missing > 0:
            handles = ours_setup.sample_dialogs(conn, catalog, target, 200)
            ours_setup.top_up(conn, catalog, target, handles, missing)
        missing = size - pgmq_peer.visible(conn, target.queue)
        pgmq_peer.fill(conn, target.queue, missing, 100)


@register("g")
def cost_growth(env: Env) -> Scenario:
    catalog = env.catalog
    target = catalog.targets["growth"]
    sizes = env.options.growth_sizes
    rounds = env.options.rounds
    seconds = min(env.options.seconds, SECONDS_CAP)
    # latency[kind][side][size]: the median latency (ms) of each round.
    latency: dict[str, dict[str, dict[int, list[float]]]] = {
        kind: {side: {size: [] for size in sizes} for side in ("ours", "pgmq")}
        for kind in ("receive", "send")
    }
    conversations = 0
    for size in sizes:
        started = time.monotonic()
        env.progress(f"g filling to {size:,} messages / endpoints")
        conversations = _fill_to(env, size, conversations)
        env.settle([*OUR_TABLES, f"pgmq.q_{target.queue}"])
        with env.transaction() as conn:
            handles = tuple(
                str(h) for h in ours_setup.sample_dialogs(conn, catalog, target, SAMPLED_DIALOGS)
            )
        env.progress(f"g filled to {size:,} in {time.monotonic() - started:.1f} s")
        budget = max(50, min(MAX_OPS, size // 10))
        contenders = [
            ("receive", "ours", "ours.receive", OpParams(target.queue, batch=1)),
            ("receive", "pgmq", "pgmq.read_delete", OpParams(target.queue, batch=1)),
            ("send", "ours", "ours.send_random", OpParams(target.queue, handles, seed=size)),
            ("send", "pgmq", "pgmq.send", OpParams(target.queue)),
        ]
        for number in range(rounds):
            order = contenders if number % 2 == 0 else contenders[::-1]
            for kind, side, op, params in order:
                # The rounds at one size follow each other without a settle.
                env.await_autovacuum()
                measured = env.measure(op, 1, params, seconds=seconds, max_ops=budget,
                                       warmup_ops=5, record_latencies=True)
                value = median(measured.latencies)
                if value is not None:
                    latency[kind][side][size].append(value * 1000)
                if kind == "receive":
                    _top_up(env, size)
                env.progress(
                    f"g {size:,} round {number + 1}/{rounds} {side} {kind}: "
                    f"{(value or 0) * 1000:.2f} ms median of {len(measured.latencies)}"
                )
    return _scenario(latency, sizes)


def _scenario(latency: dict[str, dict[str, dict[int, list[float]]]],
              sizes: tuple[int, ...]) -> Scenario:
    scenario = Scenario("g", "Cost growth: latency as waiting messages and endpoints grow")
    small, large = sizes[0], sizes[-1]
    for kind, label, what, peer_label in (
        ("receive", "RECEIVE TOP(1)+commit latency", "waiting", "pgmq read+delete"),
        ("send", "SEND latency", "endpoints", "pgmq.send (no conversations)"),
    ):
        ours, pgmq = latency[kind]["ours"], latency[kind]["pgmq"]
        for size in sizes:
            scenario.rows.append(Row(
                f"{label}, {size:,} {what}", "ms", peer_label, median(pgmq[size]),
                median(ours[size]), higher_is_better=False,
                peer_rounds=pgmq[size], ours_rounds=ours[size],
            ))
        scenario.rows.append(Row(
            f"{label} growth, {large:,} vs {small:,}", "x", peer_label,
            _growth(pgmq, small, large), _growth(ours, small, large), higher_is_better=False,
            target=Target("ours_at_most", 1.3, f"ours <= 1.3x at {small:,}"),
        ))
    return scenario


def _growth(values: dict[int, list[float]], small: int, large: int) -> float | None:
    low, high = median(values[small]), median(values[large])
    if low is None or high is None or low == 0:
        return None
    return high / low
