"""The peer's side of every scenario: pgmq's SQL functions through psycopg, one transaction per
call (BEGIN, statements, COMMIT), as our side does through its Python API. Message bodies are
passed as text and cast to jsonb, pgmq's message type."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg

from bench.ops import OpParams, json_body

# pgmq's visibility timeout for read(): long enough that nothing reappears during a measurement.
VISIBILITY_SECONDS = 30
# Request/reply (scenario h): readers wait in read_with_poll for up to 5 s (our readers'
# WAITFOR time-out), checking every 10 ms rather than pgmq's default 100 ms, so an empty
# moment costs pgmq about what it costs our readers, which are woken by NOTIFY.
POLL_SECONDS = 5
POLL_INTERVAL_MS = 10


class _PgmqOp:
    """A load worker's connection and what its op reads of the params (an OpFactory)."""

    def __init__(self, dsn: str, worker: int, params: OpParams) -> None:
        self.conn = psycopg.connect(dsn)
        self.queue = params.queue
        self.reply_queue = params.reply_queue
        self.qty = params.batch
        self.body = json_body(params.body_size)

    def close(self) -> None:
        self.conn.close()


class Send(_PgmqOp):
    """``pgmq.send`` of one message per transaction (also h's requester)."""

    def __call__(self) -> int:
        with self.conn.transaction():
            self.conn.execute("SELECT pgmq.send(%s, %s::jsonb)", [self.queue, self.body])
        return 1


class CommitSender(Send):
    """The sender of the latency scenarios (e, k): Send's transaction, stamped as its COMMIT
    is issued, as ours is."""

    def __init__(self, dsn: str, params: OpParams) -> None:
        super().__init__(dsn, 0, params)

    def step(self, entering: Callable[[float], None]) -> tuple[float, int]:
        with self.conn.transaction():
            self.conn.execute("SELECT pgmq.send(%s, %s::jsonb)", [self.queue, self.body])
            issued = time.perf_counter()
        return issued, 1


class SendBatch(_PgmqOp):
    """``pgmq.send_batch`` of ``batch`` messages in one call."""

    def __init__(self, dsn: str, worker: int, params: OpParams) -> None:
        super().__init__(dsn, worker, params)
        self.bodies = [self.body] * params.batch

    def __call__(self) -> int:
        with self.conn.transaction():
            self.conn.execute(
                "SELECT pgmq.send_batch(%s, %s::jsonb[])", [self.queue, self.bodies]
            ).fetchall()
        return len(self.bodies)


class ReadDelete(_PgmqOp):
    """``pgmq.read`` (vt 30 s) of ``batch`` messages, then ``pgmq.delete`` of them, one
    transaction: pgmq's at-least-once pattern, the closest to a transactional RECEIVE."""

    def __call__(self) -> int:
        with self.conn.transaction():
            rows = self.conn.execute(
                "SELECT * FROM pgmq.read(%s, %s, %s)", [self.queue, VISIBILITY_SECONDS, self.qty]
            ).fetchall()
            if len(rows) == 1:
                self.conn.execute(
                    "SELECT pgmq.delete(%s, %s::bigint)", [self.queue, rows[0][0]]
                ).fetchall()
            elif rows:
                self.conn.execute(
                    "SELECT pgmq.delete(%s, %s::bigint[])", [self.queue, [r[0] for r in rows]]
                ).fetchall()
        return len(rows)


class Pop(_PgmqOp):
    """``pgmq.pop``: read and delete in one statement (at-most-once)."""

    def __call__(self) -> int:
        with self.conn.transaction():
            rows: list[Any] = self.conn.execute(
                "SELECT * FROM pgmq.pop(%s, %s)", [self.queue, self.qty]
            ).fetchall()
        return len(rows)


class PollReceiver(_PgmqOp):
    """``pgmq.read_with_poll`` at its defaults (max_poll_seconds 5, poll_interval_ms 100), then
    delete and commit; the timestamp is taken when the read returns."""

    def __init__(self, dsn: str, params: OpParams) -> None:
        super().__init__(dsn, 0, params)

    def step(self, entering: Callable[[float], None]) -> tuple[float, int]:
        with self.conn.transaction():
            entering(time.perf_counter())
            rows = self.conn.execute(
                "SELECT * FROM pgmq.read_with_poll(%s, %s, 1)", [self.queue, VISIBILITY_SECONDS]
            ).fetchall()
            returned = time.perf_counter()
            for row in rows:
                self.conn.execute("SELECT pgmq.delete(%s, %s::bigint)", [self.queue, row[0]])
        return returned, len(rows)


class _Poll(_PgmqOp):
    def take(self, queue: str) -> list[Any]:
        """Waits for one message (read_with_poll) and deletes it, in the caller's transaction."""
        rows: list[Any] = self.conn.execute(
            "SELECT * FROM pgmq.read_with_poll(%s, %s, 1, %s, %s)",
            [queue, VISIBILITY_SECONDS, POLL_SECONDS, POLL_INTERVAL_MS],
        ).fetchall()
        for row in rows:
            self.conn.execute("SELECT pgmq.delete(%s, %s::bigint)", [queue, row[0]])
        return rows


class RequestAnswer(_Poll):
    """h's peer, the responder: read the request, delete it, ``pgmq.send`` the reply to the
    reply queue, one transaction (pgmq has no dialogs, so nothing to end)."""

    def __call__(self) -> int:
        with self.conn.transaction():
            rows = self.take(self.queue)
            for _ in rows:
                self.conn.execute("SELECT pgmq.send(%s, %s::jsonb)", [self.reply_queue, self.body])
        return len(rows)


class ReplyTake(_Poll):
    """h's peer, the requester's reader: read the reply and delete it, one transaction."""

    def __call__(self) -> int:
        with self.conn.transaction():
            return len(self.take(self.reply_queue))
