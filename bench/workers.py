"""Load generators in child processes, so two producers or readers never share one GIL and the
parent's own connections stay idle while a measurement runs.

The pool's processes are started once (spawn: the parent may hold threads and connections that
must not be forked) and reused for every measurement; each measurement opens its own
connections in the workers, warms them up, and starts all workers together.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from bench.ops import OpParams

# A worker that does not answer within its task's time plus this is considered stuck.
ANSWER_SLACK = 120.0
# How often (in transactions) a memory-tracking worker samples its RSS, besides VmHWM.
RSS_EVERY = 16


class BenchError(RuntimeError):
    pass


@dataclass(frozen=True)
class LoadTask:
    op: str
    dsn: str
    worker: int
    params: OpParams
    seconds: float
    max_ops: int
    warmup_ops: int = 10
    record_latencies: bool = False
    track_rss: bool = False


@dataclass(frozen=True)
class LoadResult:
    messages: int
    transactions: int
    elapsed: float
    exhausted: bool
    latencies: tuple[float, ...] = ()
    rss_first_kib: int | None = None
    rss_end_kib: int | None = None
    rss_peak_kib: int | None = None
    # The worker process's own CPU during the measurement, in seconds.
    cpu: float = 0.0


@dataclass(frozen=True)
class StepperTask:
    op: str
    dsn: str
    params: OpParams


@dataclass
class Measurement:
    """The workers of one measurement, combined: they start together, so the rate is the sum of
    messages over the longest worker's time."""

    results: list[LoadResult] = field(default_factory=list)

    @property
    def messages(self) -> int:
        return sum(r.messages for r in self.results)

    @property
    def elapsed(self) -> float:
        return max((r.elapsed for r in self.results), default=0.0)

    @property
    def rate(self) -> float:
        return self.messages / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def exhausted(self) -> bool:
        return any(r.exhausted for r in self.results)

    @property
    def latencies(self) -> list[float]:
        return [x for r in self.results for x in r.latencies]


def _status_kib(field_name: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Resets VmHWM, so the peak covers this measurement only: the process is reused."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def _run_load(pipe: Connection, task: LoadTask) -> bool:
    """Runs one measurement; False when the parent asked the worker to stop instead."""
    from bench.registry import LOAD_OPS

    op = LOAD_OPS[task.op](task.dsn, task.worker, task.params)
    try:
        for _ in range(task.warmup_ops):
            if op() == 0:
                break
        pipe.send(("ready",))
        if pipe.recv()[0] != "go":
            return False
        peak_resets = task.track_rss and _reset_peak_rss()
        peak_sampled = 0
        latencies: list[float] = []
        messages = transactions = 0
        exhausted = False
        rss_first: int | None = None
        # A reader fed while it reads may wait past the end for its last messages: those
        # arrived after the measurement and do not count.
        window_only = bool(getattr(op, "window_only", False))
        start = last = time.perf_counter()
        cpu_start = time.process_time()
        deadline = start + task.seconds
        while transactions < task.max_ops and last < deadline:
            moved = op()
            now = time.perf_counter()
            if moved == 0:
                exhausted = True
                break
            if window_only and now > deadline:
                break
            if task.record_latencies:
                latencies.append(now - last)
            last = now
            messages += moved
            transactions += 1
            if task.track_rss and (transactions == 1 or transactions % RSS_EVERY == 0):
                rss = _status_kib("VmRSS") or 0
                rss_first = rss if transactions == 1 else rss_first
                peak_sampled = max(peak_sampled, rss)
        cpu = time.process_time() - cpu_start
        rss_end = _status_kib("VmRSS") if task.track_rss else None
        peak = max(peak_sampled, rss_end or 0, (_status_kib("VmHWM") or 0) if peak_resets else 0)
        result = LoadResult(
            messages=messages,
            transactions=transactions,
            elapsed=last - start,
            exhausted=exhausted,
            latencies=tuple(latencies),
            rss_first_kib=rss_first,
            rss_end_kib=rss_end,
            rss_peak_kib=peak if task.track_rss else None,
            cpu=cpu,
        )
        pipe.send(("done", result))
        return True
    finally:
        op.close()


def _run_stepper(pipe: Connection, task: StepperTask) -> bool:
    """Serves steps until told to close; False when told to stop instead."""
    from bench.registry import STEPPERS

    stepper = STEPPERS[task.op](task.dsn, task.params)
    try:
        pipe.send(("ready",))
        while True:
            command = pipe.recv()[0]
            if command != "step":
                break
            result = stepper.step(lambda at: pipe.send(("entering", at)))
            pipe.send(("stepped", result))
    finally:
        stepper.close()
    if command == "stop":
        return False
    pipe.send(("closed",))
    return True


def worker_main(pipe: Connection) -> None:
    while True:
        try:
            message = pipe.recv()
        except EOFError:
            return
        kind = message[0]
        if kind == "stop":
            return
        try:
            if kind == "load":
                serving = _run_load(pipe, message[1])
            else:
                serving = _run_stepper(pipe, message[1])
        except Exception:
            pipe.send(("error", traceback.format_exc()))
            serving = True
        if not serving:
            return


class WorkerPool:
    def __init__(self, size: int = 2) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipes: list[Connection] = []
        self._processes: list[Any] = []
        for index in range(size):
            parent_end, child_end = context.Pipe()
            process = context.Process(
                target=worker_main, args=(child_end,), name=f"bench-worker-{index}", daemon=True
            )
            process.start()
            child_end.close()
            self._pipes.append(parent_end)
            self._processes.append(process)

    @property
    def size(self) -> int:
        return len(self._pipes)

    def send(self, worker: int, *message: object) -> None:
        self._pipes[worker].send(message)

    def expect(self, worker: int, kind: str, timeout: float) -> tuple[Any, ...]:
        pipe = self._pipes[worker]
        if not pipe.poll(timeout):
            raise BenchError(f"bench worker {worker} did not answer within {timeout:.0f} s")
        message: tuple[Any, ...] = pipe.recv()
        if message[0] == "error":
            raise BenchError(f"bench worker {worker} failed:\n{message[1]}")
        if message[0] != kind:
            raise BenchError(f"bench worker {worker} answered {message[0]!r}, not {kind!r}")
        return message

    def run_load(self, tasks: Sequence[LoadTask],
                 before_go: Callable[[], None] | None = None) -> Measurement:
        """One measurement; ``before_go`` runs when every worker has warmed up, just before
        they start (e.g. to clear away what the warm-up left)."""
        if len(tasks) > self.size:
            raise BenchError(f"{len(tasks)} workers asked for, the pool has {self.size}")
        for index, task in enumerate(tasks):
            self.send(index, "load", task)
        for index, task in enumerate(tasks):
            self.expect(index, "ready", ANSWER_SLACK + task.warmup_ops)
        if before_go is not None:
            try:
                before_go()
            except BaseException:
                # The workers wait for "go": let them run and answer, so they serve the next
                # measurement.
                for index in range(len(tasks)):
                    self.send(index, "go")
                for index, task in enumerate(tasks):
                    with contextlib.suppress(BenchError):
                        self.expect(index, "done", task.seconds + ANSWER_SLACK)
                raise
        # Started one after the other, microseconds apart: each measures its own time.
        for index in range(len(tasks)):
            self.send(index, "go")
        results = [
            self.expect(index, "done", task.seconds + ANSWER_SLACK)[1]
            for index, task in enumerate(tasks)
        ]
        return Measurement(results)

    def open_stepper(self, worker: int, task: StepperTask) -> None:
        self.send(worker, "open", task)
        self.expect(worker, "ready", ANSWER_SLACK)

    def close_stepper(self, worker: int) -> None:
        self.send(worker, "close")
        self.expect(worker, "closed", ANSWER_SLACK)

    def close(self) -> None:
        for pipe in self._pipes:
            with contextlib.suppress(OSError):
                pipe.send(("stop",))
        for process in self._processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
        for pipe in self._pipes:
            pipe.close()
