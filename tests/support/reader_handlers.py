"""Handlers for the reader and Spark reader tests (imported by reader processes too)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psycopg
from lxml import etree
from psycopg import sql

from airflow_broker import Message
from airflow_broker._statements import runner_of
from airflow_broker.poison.strategies import Action, Failure, PoisonStrategy
from airflow_broker.readers.queue_reader import ReaderContext


def _book(message: Message, ctx: ReaderContext) -> str:
    doc = etree.fromstring(message.message_body or b"")  # malformed trades raise here
    runner_of(ctx.tx).run(sql.SQL(
        "INSERT INTO public.results (message_id, conversation_handle, sequence, trade, pid)"
        " VALUES (%s, %s, %s, %s, %s)"),
        [message.message_id, message.conversation_handle, message.message_sequence_number,
         doc.get("id"), os.getpid()])
    return f'<ack trade="{doc.get("id")}"/>'


def book_trade(message: Message, ctx: ReaderContext) -> str:
    """Books a trade in public.results, in the reader's transaction, and acknowledges it."""
    return _book(message, ctx)


def book_trade_slowly(message: Message, ctx: ReaderContext) -> str:
    """book_trade taking 5 ms a message, so that a drain lasts long enough for a fault to
    fall into it."""
    time.sleep(0.005)
    return _book(message, ctx)


class Hold:
    """Stops a reader of this process inside its transaction, at its ``after``-th message,
    until released: a fault made meanwhile falls into a batch in flight, whatever the
    machine's speed."""

    def __init__(self) -> None:
        self.after = 0
        self.seen = 0
        self.holding = threading.Event()
        self.released = threading.Event()

    def arm(self, after: int) -> None:
        self.after, self.seen = after, 0
        self.holding.clear()
        self.released.clear()

    def pass_by(self) -> None:
        self.seen += 1
        if self.seen == self.after:
            self.holding.set()
            self.released.wait(timeout=300)


HOLD = Hold()


def book_trade_held(message: Message, ctx: ReaderContext) -> str:
    """book_trade, held by HOLD after it has booked its message."""
    booked = _book(message, ctx)
    HOLD.pass_by()
    return booked


def book_trades(frame: Any, ctx: ReaderContext) -> list[object]:
    """The batch form: one result per row, an exception for a trade that cannot be booked."""
    results: list[object] = []
    for row in frame.itertuples():
        message = Message(row.status, row.priority, row.queuing_order,
                          row.conversation_group_id, row.conversation_handle,
                          row.message_sequence_number, row.service_name, row.service_id,
                          row.service_contract_name, row.service_contract_id,
                          row.message_type_name, row.message_type_id, row.validation,
                          row.message_body, row.message_id, row.attempts)
        try:
            results.append(_book(message, ctx))
        except Exception as exc:
            results.append(exc)
    return results


def flaky_until_fixed(message: Message, ctx: ReaderContext) -> str:
    """Fails while public.handler_fixed says false."""
    rows = runner_of(ctx.tx).run(sql.SQL("SELECT fixed FROM public.handler_fixed"))
    if not rows or not rows[0][0]:
        raise RuntimeError("the handler has a bug")
    return _book(message, ctx)


def book_or_die(message: Message, ctx: ReaderContext) -> str:
    """Books trades; on the trade marked "die-here", the first time, records its process id and
    hangs, so the test can kill this reader in the middle of its transaction."""
    if b"die-here" in (message.message_body or b""):
        dsn = os.environ["AIRFLOW_BROKER_DSN"]
        with psycopg.connect(dsn, autocommit=True) as side:
            # One victim only: the reader that takes the message over must not hang too.
            first = side.execute("INSERT INTO public.victim (only_one, pid) VALUES (1, %s)"
                                 " ON CONFLICT DO NOTHING RETURNING pid", [os.getpid()]).fetchone()
        if first:
            time.sleep(300)
    return _book(message, ctx)


class EndMalformedTrades(PoisonStrategy):
    """A strategy of a user's own: a malformed trade ends its conversation with an error (the
    trader must hear of it); any other failure is retried, then quarantined."""

    def decide(self, failure: Failure) -> Action:
        if isinstance(failure.error, etree.XMLSyntaxError):
            return Action.END_CONVERSATION
        return Action.ROLL_BACK if failure.attempts_left else Action.QUARANTINE
