"""Cleaning up leaked conversation endpoints (the leak article's remedy, spec 15.4).

Leaked endpoints are CLOSED targets whose security timestamp was never initialised and whose
lifetime is far away (the fire-and-forget pattern): reclaim would not remove them for decades.
They are removed with END CONVERSATION WITH CLEANUP, in batches of their own transactions, so a
long cleanup never holds locks for long and can be interrupted and resumed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tqdm import tqdm

from airflow_broker.broker import Broker


@dataclass
class CleanupSummary:
    found: int
    removed: int = 0
    by_far_service: dict[tuple[str, str], int] = field(default_factory=dict)
    seconds: float = 0.0
    dry_run: bool = False


def leak_counts(broker: Broker) -> dict[tuple[str, str], int]:
    """Leaked endpoints per (local service, far service)."""
    with broker.pool.connection() as conn:
        rows = conn.execute(broker.queries["leak_counts"]).fetchall()
    return {(service, far): int(n) for service, far, n in rows}


def cleanup_leaked_endpoints(
    broker: Broker, *, batch_size: int = 1000, dry_run: bool = False, progress: bool = True
) -> CleanupSummary:
    started = time.monotonic()
    counts = leak_counts(broker)
    summary = CleanupSummary(found=sum(counts.values()), by_far_service=counts, dry_run=dry_run)
    if dry_run or not summary.found:
        summary.seconds = time.monotonic() - started
        return summary
    batch = broker.queries.call("cleanup_leaked_endpoints", 1)
    with tqdm(total=summary.found, unit="endpoint", disable=not progress,
              desc="END CONVERSATION WITH CLEANUP") as bar:
        while True:
            with broker.pool.connection() as conn, conn.transaction():
                row = conn.execute(batch, [batch_size]).fetchone()
            removed = int(row[0]) if row else 0
            summary.removed += removed
            bar.update(removed)
            if removed < batch_size:
                break
    summary.seconds = time.monotonic() - started
    return summary
