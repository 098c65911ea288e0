"""A queue reader: RECEIVE, process, commit, until the queue stays empty; the loop of an
activated procedure, run by each Spark task of the reader application (and usable as an
activation target or anywhere else).

User logic is a per-message function ``handle(message, ctx)`` or a batch function
``handle_batch(frame, ctx)`` that takes a pandas DataFrame of the batch (Arrow-backed) and
returns one result per row. A result is None (nothing to reply), a reply body (str or bytes,
sent with ``reply_message_type``), or an Exception instance for a message that failed. The
function can also ``ctx.send()`` and ``ctx.end_conversation()`` and run its own SQL through
``ctx.tx``: everything commits together with the RECEIVE, or not at all.

Each message is processed inside a savepoint, so one failing message never undoes the others.
What happens to a failing message is the poison strategy's decision
(:mod:`airflow_broker.poison.strategies`): roll the batch back, quarantine the message, end its
conversation with an error, or park it for a retry on a conversation timer. The reader carries
the decision out in its transaction, through :mod:`airflow_broker.poison.quarantine` and
:mod:`airflow_broker.poison.parking`.

EndDialog and Error messages end the conversation on this side (after the handler has seen an
Error, if it wants to); DialogTimer messages retry parked messages under a strategy that parks
them, and otherwise go to the handler.
"""

from __future__ import annotations

import logging
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import psycopg

from airflow_broker._statements import runner_of
from airflow_broker.broker import Broker
from airflow_broker.callables import load_callable
from airflow_broker.dialogs import Body
from airflow_broker.errors import IncorrectSyntax, QueueDisabledError, ValueOutOfRange
from airflow_broker.messages import Message
from airflow_broker.poison import parking
from airflow_broker.poison.quarantine import quarantine_message
from airflow_broker.poison.strategies import Action, Failure, PoisonStrategy, get_strategy
from airflow_broker.readers.runs import AttemptLog, ReaderStats
from airflow_broker.reconnect import Outage, connection_lost
from airflow_broker.transaction import Transaction

log = logging.getLogger(__name__)

# Failures a reader keeps to report (its attempt's summary, the task log); the quarantine table
# keeps every quarantined message.
KEPT_EVENTS = 20
# How long a reader waits for the database to come back (a restart, a failover) before it
# fails with the error that lost it, so that its Spark task (and then Airflow) retries instead.
OUTAGE_LIMIT_SECONDS = 300.0


class _RollbackBatch(Exception):
    """The poison strategy's Action.ROLL_BACK, carried out: the batch's transaction rolls back.
    Control flow inside the reader, never raised to a caller, so no BrokerError."""


@dataclass
class ReaderConfig:
    queue_name: str
    handler: str
    batch: bool = False
    batch_size: int = 100
    waitfor_timeout: float = 1.0
    idle_exit: float = 5.0
    # A name of airflow_broker.poison.strategies' registry, or package.module:ClassName.
    strategy: str = "quarantine"
    max_attempts: int = 3
    retry_delay: int = 30
    reply_message_type: str | None = None
    error_code: int = 500

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.max_attempts < 1 or self.retry_delay < 1:
            raise ValueOutOfRange("batch_size, max_attempts and retry_delay must be 1 or more")
        poison = get_strategy(self.strategy)
        if self.batch and poison.per_message:
            raise IncorrectSyntax(f"{self.strategy} needs a per-message handler")

    @property
    def poison(self) -> PoisonStrategy:
        return get_strategy(self.strategy)


def default(setting: str) -> Any:
    """ReaderConfig's default for ``setting``: the one place the reader's defaults are written
    (the Spark job's options and ActivatedReaderOperator's arguments take theirs from here)."""
    return ReaderConfig.__dataclass_fields__[setting].default



@dataclass
class ReaderContext:
    """What a handler is given: the reader's transaction and a few conveniences."""

    tx: Transaction
    queue_name: str
    stats: ReaderStats
    ended: set[uuid.UUID] = field(default_factory=set)

    @property
    def schema(self) -> str:
        """The reader's broker schema, for the handler's SQL on the broker's views or on
        tables beside them (run on ``tx.conn``, in the reader's transaction)."""
        return runner_of(self.tx).schema

    def send(self, conversation_handle: uuid.UUID, message_type: str, body: Body = None) -> None:
        self.tx.send(conversation_handle, message_type, body)
        self.stats.replied += 1

    def end_conversation(self, conversation_handle: uuid.UUID, *, error: int | None = None,
                         description: str | None = None) -> None:
        if conversation_handle in self.ended:
            return
        self.tx.end_conversation(conversation_handle, error=error, description=description)
        self.ended.add(conversation_handle)
        self.stats.ended += 1


def messages_frame(messages: Sequence[Message]) -> Any:
    """The batch as a pandas DataFrame with Arrow-backed columns."""
    import pandas as pd

    frame = pd.DataFrame([asdict(m) for m in messages])
    for column in ("conversation_group_id", "conversation_handle", "message_id"):
        frame[column] = frame[column].astype(str)
    return frame.convert_dtypes(dtype_backend="pyarrow")


class QueueReader:
    def __init__(self, broker: Broker, config: ReaderConfig,
                 handler: Callable[..., Any] | None = None,
                 attempt_log: AttemptLog | None = None) -> None:
        self.broker = broker
        self.config = config
        self.handler = handler or load_callable(config.handler)
        self.poison = config.poison
        self.stats = ReaderStats()
        # The attempt's failures: what the strategy did with each, for the run's summary.
        self.events: list[dict[str, Any]] = []
        self.attempt_log = attempt_log

    def run(self) -> ReaderStats:
        """Reads until RECEIVE has found nothing for ``idle_exit`` seconds, or the queue is
        disabled (a reader never spins on error 9617). A lost connection (a restart, a
        terminated session, a failover) is waited out in place for up to
        OUTAGE_LIMIT_SECONDS, with airflow_broker.reconnect's policy: the batch in flight
        rolls back and is received again (without an attempt log, a batch whose COMMIT
        answer was lost is not counted, though it may have committed; with one, the counts
        are taken from the database after the outage). The attempt log, if any, is told how
        it ended: finished, or failed with the error (an attempt whose process dies says
        nothing, and is reported lost once its reader runs again)."""
        try:
            self._read()
        except Exception as exc:
            if self.attempt_log is not None:
                try:
                    self.attempt_log.fail(exc)
                except Exception as unrecorded:
                    # The database that failed the reader may refuse the record too: the
                    # reader's own error is the one to raise; this one is only noted.
                    exc.add_note(f"the attempt's failure was not recorded: {unrecorded}")
            raise
        if self.attempt_log is not None:
            self.attempt_log.end("finished")
        return self.stats

    def _read(self) -> None:
        idle_since = time.monotonic()
        outage = Outage(f"reader of {self.config.queue_name}")
        lost_since: float | None = None
        while time.monotonic() - idle_since < self.config.idle_exit:
            try:
                if lost_since is not None and self.attempt_log is not None:
                    # A COMMIT whose answer was lost may have gone through: the counts are
                    # what the database holds, not what this process believes.
                    self.stats, self.events = self.attempt_log.committed()
                got = self.run_batch()
            except _RollbackBatch:
                got = True
            except QueueDisabledError as exc:
                log.error("queue %s is disabled, the reader stops: %s", self.config.queue_name,
                          exc)
                break
            except psycopg.OperationalError as exc:
                # The batch's transaction died with its connection, so its messages are on the
                # queue again; the next batch, on a new connection, receives them again.
                if not connection_lost(exc):
                    raise
                if lost_since is None:
                    lost_since = time.monotonic()
                elif time.monotonic() - lost_since > OUTAGE_LIMIT_SECONDS:
                    raise
                outage.wait(exc)
                # Time without a connection is not time with an empty queue.
                idle_since = time.monotonic()
                continue
            outage.recovered()
            lost_since = None
            if got:
                idle_since = time.monotonic()

    def run_batch(self) -> bool:
        """One transaction: RECEIVE a batch, process it, commit. False when nothing came.

        The counts are those of committed work: a batch rolled back leaves only its failures
        and retries counted (its messages come back and are counted when they commit)."""
        before, events_before = replace(self.stats), len(self.events)
        try:
            with self.broker.transaction() as tx:
                messages = tx.receive(self.config.queue_name, self.config.batch_size,
                                      waitfor=True, timeout=self.config.waitfor_timeout)
                if not messages:
                    return False
                self.stats.received += len(messages)
                self.stats.batches += 1
                ctx = ReaderContext(tx, self.config.queue_name, self.stats)
                self._process(ctx, messages)
                if self.attempt_log is not None:
                    self.attempt_log.progress(tx, self.stats, self.events)
        except BaseException:
            failed, retried = self.stats.failed, self.stats.retried
            self.stats = replace(before, failed=failed, retried=retried)
            if failed == before.failed:
                del self.events[events_before:]
            elif self.attempt_log is not None:
                self.attempt_log.save(self.stats, self.events)
            raise
        return True

    def _event(self, message: Message, attempts: int, exc: BaseException, action: str) -> None:
        if len(self.events) < KEPT_EVENTS:
            self.events.append({
                "message_id": str(message.message_id),
                "conversation_handle": str(message.conversation_handle),
                "sequence": message.message_sequence_number,
                "message_type": message.message_type_name, "attempt": attempts,
                "error": f"{type(exc).__name__}: {exc}"[:500], "action": action})

    def _process(self, ctx: ReaderContext, messages: list[Message]) -> None:
        parked = self._parked_conversations(ctx.tx, {m.conversation_handle for m in messages})
        batch: list[Message] = []
        for message in messages:
            if message.conversation_handle in ctx.ended:
                continue
            if message.is_end_dialog or message.is_error:
                if message.is_error:
                    log.warning("conversation %s ended with error %s", message.conversation_handle,
                                message.error())
                ctx.end_conversation(message.conversation_handle)
            elif message.is_dialog_timer and self.poison.parks:
                if not self._retry_parked(ctx, message.conversation_handle):
                    parked.discard(message.conversation_handle)
            elif message.conversation_handle in parked:
                # Earlier messages of this conversation wait for their retry: keep the order.
                self._park(ctx, message, "waiting behind a message being retried", None,
                           count_attempt=False)
            elif self.config.batch:
                batch.append(message)
            elif not self._process_one(ctx, message):
                parked.add(message.conversation_handle)
        if batch:
            self._process_batch(ctx, batch)

    def _process_one(self, ctx: ReaderContext, message: Message) -> bool:
        """Processes one message; False when it was parked for a timer retry."""
        try:
            with ctx.tx.savepoint():
                self._reply(ctx, message, self.handler(message, ctx))
            self.stats.processed += 1
            return True
        except _RollbackBatch:
            raise
        except Exception as exc:
            return self._failed(ctx, message, exc, traceback.format_exc())

    def _process_batch(self, ctx: ReaderContext, messages: list[Message]) -> None:
        try:
            with ctx.tx.savepoint():
                results = list(self.handler(messages_frame(messages), ctx))
            if len(results) != len(messages):
                raise ValueError(f"the batch handler returned {len(results)} results for "
                                 f"{len(messages)} messages")
        except Exception as exc:
            # The whole batch failed: each message takes its own way through the strategy.
            tb = traceback.format_exc()
            for message in messages:
                self._failed(ctx, message, exc, tb)
            return
        for message, result in zip(messages, results, strict=True):
            if isinstance(result, BaseException):
                self._failed(ctx, message, result, "".join(traceback.format_exception(result)))
                continue
            try:
                with ctx.tx.savepoint():
                    self._reply(ctx, message, result)
                self.stats.processed += 1
            except Exception as exc:
                self._failed(ctx, message, exc, traceback.format_exc())

    def _reply(self, ctx: ReaderContext, message: Message, result: Any) -> None:
        if result is None:
            return
        if self.config.reply_message_type is None:
            raise ValueError("the handler returned a reply, but no reply_message_type is set")
        if message.conversation_handle in ctx.ended:
            return
        if ctx.tx.send_if_open(message.conversation_handle, self.config.reply_message_type,
                               result):
            self.stats.replied += 1
        else:
            log.info("conversation %s: the peer has ended it, the reply is dropped",
                     message.conversation_handle)

    def _failed(self, ctx: ReaderContext, message: Message, exc: BaseException,
                tb: str) -> bool:
        """Carries out the poison strategy's decision; False when the message was parked for a
        retry."""
        if ctx.tx.conn.broken or ctx.tx.conn.closed:
            # The reader's own connection is gone, not the message at fault: the batch goes
            # back to the queue with its transaction, and _read() reconnects.
            raise exc
        self.stats.failed += 1
        attempts = message.attempts + 1
        log.warning("message %s (%s #%s) failed on attempt %s: %s", message.message_id,
                    message.message_type_name, message.message_sequence_number, attempts, exc)
        action = self.poison.decide(Failure(message, exc, attempts, self.config.max_attempts))
        if action is Action.PARK and not self.poison.parks:
            raise TypeError(f"{self.poison!r} parked a message but does not say it parks")
        self._event(message, attempts, exc, action.value)
        if action is Action.ROLL_BACK:
            self.stats.retried += 1
            raise _RollbackBatch(str(exc)) from exc
        if action is Action.END_CONVERSATION:
            ctx.end_conversation(message.conversation_handle, error=self.config.error_code,
                                 description=f"{type(exc).__name__}: {exc}"[:3000])
            return True
        if action is Action.PARK:
            self._park(ctx, message, f"{type(exc).__name__}: {exc}", tb)
            ctx.tx.begin_conversation_timer(message.conversation_handle, self.config.retry_delay)
            self.stats.retried += 1
            return False
        self._quarantine(ctx, message, f"{type(exc).__name__}: {exc}", tb, attempts)
        return True

    def _quarantine(self, ctx: ReaderContext, message: Message, error: str, tb: str,
                    attempts: int) -> None:
        quarantine_message(ctx.tx, self.config.queue_name, message, error, tb, attempts)
        self.stats.quarantined += 1

    def _park(self, ctx: ReaderContext, message: Message, error: str, tb: str | None,
              count_attempt: bool = True) -> None:
        parking.park(ctx.tx, self.config.queue_name, message, error, tb,
                     message.attempts + (1 if count_attempt else 0))

    def _parked_conversations(self, tx: Transaction, handles: set[uuid.UUID]) -> set[uuid.UUID]:
        if not self.poison.parks:
            return set()
        return parking.parked_conversations(tx, handles)

    def _retry_parked(self, ctx: ReaderContext, conversation: uuid.UUID) -> bool:
        """The DialogTimer of a conversation with parked messages: try them again, in order.
        True while some still wait for a later retry."""
        for parked in parking.parked_messages(ctx.tx, conversation):
            message = parked.message
            try:
                with ctx.tx.savepoint():
                    self._reply(ctx, message, self.handler(message, ctx))
            except Exception as exc:
                attempts = message.attempts + 1
                action = parking.retry_action(
                    self.poison, Failure(message, exc, attempts, self.config.max_attempts))
                self._event(message, attempts, exc, action.value)
                if action is Action.QUARANTINE:
                    parking.settle(ctx.tx, parked, "quarantined", attempts,
                                   f"{type(exc).__name__}: {exc}", traceback.format_exc())
                    self.stats.quarantined += 1
                    # What waited behind it is released, in order, for the next timer.
                    continue
                parking.settle(ctx.tx, parked, "failed", attempts,
                               f"{type(exc).__name__}: {exc}")
                ctx.tx.begin_conversation_timer(conversation, self.config.retry_delay)
                self.stats.retried += 1
                return True
            parking.settle(ctx.tx, parked, "done")
            self.stats.processed += 1
        return False
