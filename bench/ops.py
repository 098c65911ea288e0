"""What one transaction of a contender does, as run by the load workers.

An Op does one transaction per call and returns how many messages it moved (0: nothing left, so
the load loop stops). A Stepper is driven one step at a time by the parent, for the WAITFOR
latency scenario where a receiver and a sender in two processes take turns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import psycopg
from psycopg.rows import TupleRow

BARE_TABLE = "bench.bare_insert"

Conn = psycopg.Connection[TupleRow]


@dataclass(frozen=True)
class OpParams:
    # Our queue name or pgmq queue name, depending on the op.
    queue: str
    # Conversation handles (text) of our dialogs; worker i uses handles[i] unless the op picks
    # at random.
    handles: tuple[str, ...] = ()
    batch: int = 1
    body_size: int = 100
    seed: int = 0
    # Request/reply (scenario h): the queue replies come back to, and, for ours, the
    # initiating service, the target service and the contract of the dialogs.
    reply_queue: str = ""
    dialog: tuple[str, str, str] = ("", "", "")
    # Readers that wait (WAITFOR): how long one RECEIVE waits before it gives up, in seconds.
    wait: float = 5.0
    # Ours: Broker.transaction(pipeline=True), statements without an answer sent with the next
    # one or with the COMMIT.
    pipeline: bool = False


class Op(Protocol):
    def __call__(self) -> int: ...

    def close(self) -> None: ...


# A step returns (perf_counter timestamp, messages moved); ``entering`` tells the parent the
# step is about to block, before it does.
class Stepper(Protocol):
    def step(self, entering: Callable[[float], None]) -> tuple[float, int]: ...

    def close(self) -> None: ...


OpFactory = Callable[[str, int, OpParams], Op]
StepperFactory = Callable[[str, OpParams], Stepper]


def binary_body(size: int) -> bytes:
    return b"x" * size


def json_body(size: int) -> str:
    """A JSON document of exactly ``size`` bytes, so pgmq stores what we store."""
    return '{"p":"' + "x" * max(size - 8, 0) + '"}'


class BareInsert:
    """The physical limit: one 100-byte row into an index-free table, one commit."""

    def __init__(self, dsn: str, worker: int, params: OpParams) -> None:
        self.conn = psycopg.connect(dsn)
        self.body = binary_body(params.body_size)
        self.query = f"INSERT INTO {BARE_TABLE} (payload) VALUES (%s)"

    def __call__(self) -> int:
        with self.conn.transaction():
            self.conn.execute(self.query, [self.body])
        return 1

    def close(self) -> None:
        self.conn.close()
