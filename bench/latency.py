"""Scenario e: WAITFOR wake-up latency, from the sender issuing its COMMIT to the waiting
receiver's RECEIVE returning, with receiver and sender in two processes. The stamp is taken as
COMMIT is issued because no receiver can see the message earlier; once COMMIT returns, the
sender may be scheduled after the receiver has already woken, and the latency would go negative.

Each sample: the receiver starts waiting and says so; after a random 20-120 ms (so the send lands
at a uniformly random point of pgmq's 100 ms poll cycle, and our receiver is surely inside its
wait) the sender sends and commits. perf_counter is the same monotonic clock in both processes.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from bench import ours_setup, pgmq_peer
from bench.ops import OpParams
from bench.report import Row, Scenario, Target, median, percentile
from bench.scenario import Env, register
from bench.workers import StepperTask

RECEIVER, SENDER = 0, 1
# The first wake-up of a receiver also starts its listener and compiles the functions.
WARMUP_SAMPLES = 1
# The receivers give up after 5 s; a sample is abandoned a little after that.
SAMPLE_TIMEOUT = 15.0
# Seconds per sample allowed to one side in one round (at least MIN_BUDGET): healthy samples
# take 20-120 ms of delay plus the wake-up, so only wake-ups that take seconds hit this bound.
BUDGET_PER_SAMPLE = 0.5
MIN_BUDGET = 5.0


def samples(env: Env, receiver: str, sender: str, params: OpParams, count: int,
            rng: random.Random, *, receiver_dsn: str | None = None,
            sender_dsn: str | None = None) -> tuple[list[float], int]:
    """Wake-up latencies in seconds, and how many receives timed out. Receiver and sender use
    the run's database unless given another (k: the receiver in the far broker's)."""
    pool = env.pool
    pool.open_stepper(RECEIVER, StepperTask(receiver, receiver_dsn or env.dsn, params))
    pool.open_stepper(SENDER, StepperTask(sender, sender_dsn or env.dsn, params))
    latencies: list[float] = []
    timeouts = 0
    deadline = time.monotonic() + max(MIN_BUDGET, count * BUDGET_PER_SAMPLE)
    try:
        for index in range(WARMUP_SAMPLES + count):
            if index > WARMUP_SAMPLES and time.monotonic() > deadline:
                break
            pool.send(RECEIVER, "step")
            pool.expect(RECEIVER, "entering", SAMPLE_TIMEOUT)
            time.sleep(rng.uniform(0.02, 0.12))
            pool.send(SENDER, "step")
            committed, _ = pool.expect(SENDER, "stepped", SAMPLE_TIMEOUT)[1]
            returned, got = pool.expect(RECEIVER, "stepped", SAMPLE_TIMEOUT)[1]
            if index < WARMUP_SAMPLES:
                continue
            if got:
                latencies.append(returned - committed)
            else:
                timeouts += 1
    finally:
        pool.close_stepper(SENDER)
        pool.close_stepper(RECEIVER)
    return latencies, timeouts


@dataclass
class Wakeups:
    """Alternating rounds of wake-up samples, per side."""

    # Every sample, in seconds.
    latencies: dict[str, list[float]]
    # Each round's median, in milliseconds.
    p50s: dict[str, list[float]]
    timeouts: dict[str, int]

    def ms(self, side: str, fraction: float) -> float | None:
        """The side's percentile, in milliseconds."""
        value = percentile(self.latencies[side], fraction)
        return None if value is None else value * 1000


def alternate_samples(env: Env, label: str, sides: tuple[str, str], seed: int, what: str,
                      ready: Callable[[str], tuple[str, str, OpParams, str | None]]) -> Wakeups:
    """``env.options.latency_samples`` wake-ups per side over the rounds, the sides in the
    opposite order every other round (bench.rounds' rule). ``ready(side)`` readies the side
    for a round and returns its receiver op, its sender op, their params and the receiver's
    database (None: the run's)."""
    rounds = env.options.rounds
    per_round = math.ceil(env.options.latency_samples / rounds)
    rng = random.Random(seed)
    result = Wakeups({side: [] for side in sides}, {side: [] for side in sides},
                     dict.fromkeys(sides, 0))
    for number in range(rounds):
        for side in sides if number % 2 == 0 else sides[::-1]:
            receiver, sender, params, receiver_dsn = ready(side)
            got, missed = samples(env, receiver, sender, params, per_round, rng,
                                  receiver_dsn=receiver_dsn)
            result.latencies[side] += got
            result.timeouts[side] += missed
            p50 = median(got)
            if p50 is not None:
                result.p50s[side].append(p50 * 1000)
            env.progress(
                f"{label} round {number + 1}/{rounds} {side}: {len(got)} {what}, p50 "
                f"{(p50 or 0) * 1000:.2f} ms" + (f", {missed} timed out" if missed else "")
            )
    return result


@register("e")
def wakeup(env: Env) -> Scenario:
    target = env.catalog.targets["wait"]
    handle = str(ours_setup.begin_dialogs(env.broker, target, 1)[0])
    sides = {
        "ours": ("ours.wait_receiver", "ours.commit_sender", OpParams(target.queue, (handle,))),
        "pgmq": ("pgmq.poll_receiver", "pgmq.commit_sender", OpParams(target.queue)),
    }

    def ready(side: str) -> tuple[str, str, OpParams, None]:
        with env.transaction() as conn:
            ours_setup.purge(conn, target)
            pgmq_peer.purge(conn, target.queue)
        return (*sides[side], None)

    measured = alternate_samples(env, "e", ("ours", "pgmq"), 7, "wake-ups", ready)
    latencies, p50s, timeouts = measured.latencies, measured.p50s, measured.timeouts
    note = (
        f"{len(latencies['ours'])} samples for ours, {len(latencies['pgmq'])} for pgmq; "
        f"timeouts: ours {timeouts['ours']}, pgmq {timeouts['pgmq']}"
    )
    peer = "pgmq.read_with_poll (poll 100 ms)"
    return Scenario("e", "WAITFOR wake-up latency, sender COMMIT to receiver return", note=note,
                    rows=[
        Row("wake-up latency p50", "ms", peer, measured.ms("pgmq", 0.5),
            measured.ms("ours", 0.5), higher_is_better=False,
            target=Target("ours_at_most", 2.0, "ours <= 2 ms"),
            peer_rounds=p50s["pgmq"], ours_rounds=p50s["ours"]),
        Row("wake-up latency p99", "ms", peer, measured.ms("pgmq", 0.99),
            measured.ms("ours", 0.99), higher_is_better=False,
            target=Target("ours_at_most", 10.0, "ours <= 10 ms")),
    ])
