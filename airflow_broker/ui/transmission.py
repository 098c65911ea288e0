"""What the Transmission page of the broker's UI reads and retries: the transmission queue
per route (sql/functions/67_console.sql, console_transmissions and
console_retry_transmissions), as far as the pages' login may see and act."""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow_broker._statements import runner_of
from airflow_broker.broker import Broker
from airflow_broker.ui.console import iso

# Routes, not messages: a far broker down for a day is one row, however much waits for it.
ROUTE_LIMIT = 500


def transmissions(broker: Broker) -> dict[str, Any]:
    """What waits in the transmission queue, per route (destination service and broker
    instance), oldest first, as far as the login may see it; never a route's address."""
    with broker.transaction() as tx:
        runner = runner_of(tx)
        rows = runner.run(runner.queries["ui_transmissions"], [ROUTE_LIMIT + 1])
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    return {
        "routes": [{
            "to_service_name": service,
            "to_broker_instance": instance,
            "delivery": delivery,
            "messages": int(messages),
            "conversations": int(conversations),
            "oldest_enqueue_time": iso(oldest),
            "oldest_age_seconds": None if oldest is None
            else max(0.0, (now - oldest).total_seconds()),
            "attempts": int(attempts or 0),
            # Empty: not attempted yet (sys.transmission_queue's convention).
            "transmission_status": status or "",
            "last_attempt_at": iso(last_attempt),
            "next_attempt_at": iso(next_attempt),
            "may_retry": bool(may_retry),
        } for (service, instance, delivery, messages, conversations, oldest, attempts, status,
               last_attempt, next_attempt, may_retry) in rows[:ROUTE_LIMIT]],
        "truncated": len(rows) > ROUTE_LIMIT,
    }


def retry_transmissions(broker: Broker, to_service_name: str,
                        to_broker_instance: str | None) -> int:
    """Retry now: what waits for the route is due at once (the broker worker's next pass
    sends it). The broker refuses it with 229 to a login without RECEIVE on a sending
    service's queue; returns how many messages were made due."""
    with broker.transaction() as tx:
        runner = runner_of(tx)
        ((count,),) = runner.run(runner.queries["ui_retry_transmissions"],
                                 [to_service_name, to_broker_instance])
    return int(count)
