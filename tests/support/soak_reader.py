"""A queue reader process for the fault soak (tests/integration/test_fault_soak.py): RECEIVE a
batch, record it in soak_log in the same transaction, commit; until killed. Any error (the server
restarted under it) ends the process, and the soak starts another."""

from __future__ import annotations

import random
import sys
import time

from psycopg import sql

from airflow_broker import Broker
from airflow_broker._statements import runner_of


def main(dsn: str) -> None:
    rng = random.Random()
    with Broker(dsn, poll_interval=0.2, max_connections=2) as broker:
        while True:
            with broker.transaction() as tx:
                batch = tx.receive("q_t", rng.randint(1, 20), waitfor=True, timeout=1.0)
                if batch:
                    runner_of(tx).run(sql.SQL(
                        "INSERT INTO public.soak_log (conversation_handle, seq, body)"
                        " SELECT * FROM unnest(%s::uuid[], %s::bigint[], %s::text[])"),
                        [[m.conversation_handle for m in batch],
                         [m.message_sequence_number for m in batch],
                         [m.text() for m in batch]])
                # Kills land inside transactions as often as between them; the pause also
                # makes the drain last long enough (at least 7 s with three readers) for
                # several kills and the restart.
                time.sleep(rng.uniform(0.02, 0.1))


if __name__ == "__main__":
    main(sys.argv[1])
