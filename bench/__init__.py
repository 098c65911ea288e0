"""Benchmarks of airflow-broker against pgmq on the same PostgreSQL.

``python -m bench`` runs every scenario; ``bench.run(Options(...))`` is the same from Python and
returns the JSON-ready result. See docs/performance.md for what each scenario measures.
"""

from __future__ import annotations

from typing import Any

from bench.pgmq_peer import PgmqUnavailable
from bench.scenario import Options

__all__ = ["Options", "PgmqUnavailable", "run"]


def run(options: Options) -> dict[str, Any]:
    """bench.suite.run. Imported when called: the Spark scenario ships this package to its
    executors, which import bench.queue_drain and must not load every scenario with it."""
    from bench import suite

    return suite.run(options)
