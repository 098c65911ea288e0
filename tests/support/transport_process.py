"""A transport process for the fault tests: ``python -m tests.support.transport_process DSN N``
delivers the broker's transmission queue in batches of 100, prints a line after each far
commit, and after the N-th far commit stops before applying the acknowledgements, so that a
test can kill it in between."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from psycopg.rows import TupleRow

from airflow_broker import Broker
from airflow_broker.worker.transport import Outcome, Transport


class PausingTransport(Transport):
    def __init__(self, broker: Broker, stop_after: int) -> None:
        super().__init__(broker, batch_size=100)
        self.stop_after = stop_after
        self.batches = 0

    def _push(self, address: str, me: str,
              batch: Sequence[TupleRow]) -> tuple[list[Outcome], str]:
        answer = super()._push(address, me, batch)
        print(f"far-committed {len(batch)}", flush=True)
        self.batches += 1
        if self.batches >= self.stop_after:
            time.sleep(3600)
        return answer


def main() -> None:
    with Broker(sys.argv[1]) as broker:
        transport = PausingTransport(broker, int(sys.argv[2]))
        while transport.step().sent:
            pass


if __name__ == "__main__":
    main()
