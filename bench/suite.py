"""The scenarios of ``python -m bench``: importing this module loads every scenario module,
and each registers its measurements (bench.scenario.register). The one place that names them:
the harness imports none, so a new scenario is a module here and nothing else."""

from __future__ import annotations

from typing import Any

# Imported for their registrations; the order they run in is bench.scenario.RUN_ORDER's.
from bench import (  # noqa: F401
    cross_db,
    dialogs,
    growth,
    latency,
    memory,
    scaling,
    spark_readers,
    throughput,
)
from bench.harness import RunResult
from bench.harness import execute as execute_measurements
from bench.scenario import Options, registered

__all__ = ["execute", "run"]


def execute(options: Options) -> RunResult:
    """Runs the selected scenarios (bench.harness.execute with every registered one)."""
    return execute_measurements(options, registered())


def run(options: Options) -> dict[str, Any]:
    """``execute`` for callers that only want the JSON-ready result."""
    return execute(options).data
