"""Re-enabling a disabled queue once the cause is fixed (``airflow-broker enable-queue``).

Poison-message detection disables a queue (STATUS = OFF) after five consecutive rolled-back
receiving transactions. Fix the reader or remove the message first: enabling the queue again
lets readers at the same messages, and five more failures disable it again.
"""

from __future__ import annotations

import argparse
import datetime as dt
from dataclasses import asdict, dataclass
from typing import Any

from airflow_broker._statements import runner_of
from airflow_broker.broker import Broker
from airflow_broker.errors import InvalidObjectName


@dataclass(frozen=True)
class QueueStatus:
    queue_name: str
    schema_name: str
    is_receive_enabled: bool
    disabled_reason: str | None
    disabled_at: dt.datetime | None
    ready_messages: int
    # Why poison detection disabled it last (the engine's queue_disable_events).
    poison_reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        result = asdict(self)
        if self.disabled_at is not None:
            result["disabled_at"] = self.disabled_at.isoformat()
        return result


@dataclass(frozen=True)
class EnableResult:
    before: QueueStatus
    after: QueueStatus

    @property
    def changed(self) -> bool:
        return not self.before.is_receive_enabled and self.after.is_receive_enabled

    def as_dict(self) -> dict[str, Any]:
        return {"before": self.before.as_dict(), "after": self.after.as_dict(),
                "changed": self.changed}


def queue_status(broker: Broker, queue_name: str) -> QueueStatus:
    """The queue's state from ``queue_status``; BrokerError 208 when there is no such queue."""
    with broker.transaction() as tx:
        runner = runner_of(tx)
        rows = runner.run(runner.queries["queue_status"], [queue_name])
    if not rows:
        raise InvalidObjectName(f"Invalid object name '{queue_name}'.")
    name, schema_name, enabled, reason, since, ready, poison = rows[0]
    return QueueStatus(name, schema_name, bool(enabled), reason, since, int(ready or 0), poison)


def enable_queue(broker: Broker, queue_name: str) -> EnableResult:
    """ALTER QUEUE ... WITH STATUS = ON; what was held for the queue while it was disabled is
    delivered at once. Enabling a queue that is enabled changes nothing."""
    before = queue_status(broker, queue_name)
    if not before.is_receive_enabled:
        with broker.transaction() as tx:
            tx.alter_queue(queue_name, status=True)
    return EnableResult(before, queue_status(broker, queue_name))


def run_enable_queue(args: argparse.Namespace) -> int:
    """``airflow-broker enable-queue QUEUE [--dsn] [--schema]``."""
    with Broker(args.dsn, schema=args.schema) as broker:
        result = enable_queue(broker, args.queue)
    before = result.before
    if not result.changed:
        print(f"queue {before.queue_name} is already enabled "
              f"({before.ready_messages} message(s) ready)")
        return 0
    since = before.disabled_at.isoformat(sep=" ", timespec="seconds") if before.disabled_at \
        else "?"
    print(f"queue {before.queue_name} enabled; it was disabled since {since} UTC "
          f"({before.disabled_reason or 'unknown reason'}"
          f"{': ' + before.poison_reason if before.poison_reason else ''})")
    print(f"{result.after.ready_messages} message(s) ready")
    return 0
