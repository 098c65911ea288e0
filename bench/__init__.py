"""Benchmarks of airflow-broker against pgmq on the same PostgreSQL.

``python -m bench`` runs every scenario; ``bench.run(Options(...))`` is the same from Python and
returns the JSON-ready result. See docs/performance.md for what each scenario measures.
"""

from bench.harness import Options, run
from bench.pgmq_peer import PgmqUnavailable

__all__ = ["Options", "PgmqUnavailable", "run"]
