"""Our side of every scenario, through the public Python API (Broker.transaction, tx.send,
tx.receive), because that is what users run; pgmq is driven through plain psycopg calls with the
same transaction pattern (BEGIN, statements, COMMIT) so the client protocol is the same."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable

from airflow_broker import END_DIALOG, Broker
from bench.ops import OpParams, binary_body

MESSAGE_TYPE = "BenchMessage"
WAIT_TIMEOUT = 5.0


class _BrokerOp:
    def __init__(self, dsn: str, connections: int = 1) -> None:
        self.broker = Broker(dsn, min_connections=1, max_connections=connections)

    def close(self) -> None:
        self.broker.close()


class SendOne(_BrokerOp):
    """SEND one message per transaction on this worker's own open conversation: producers on
    one conversation would serialise on its conversation-group lock, by design."""

    def __init__(self, dsn: str, worker: int, params: OpParams) -> None:
        super().__init__(dsn)
        self.handle = uuid.UUID(params.handles[worker % len(params.handles)])
        self.body = binary_body(params.body_size)
        self.pipeline = params.pipeline

    def __call__(self) -> int:
        with self.broker.transaction(pipeline=self.pipeline) as tx:
            tx.send(self.handle, MESSAGE_TYPE, self.body)
        return 1


class CommitSender(SendOne):
    """The sender of the latency scenarios (e, k): SendOne's transaction, stamped as its
    COMMIT is issued. No receiver can see the message before that moment, so a latency from it
    is never below the true one; a stamp taken when COMMIT returns can come after the receiver
    has woken, when the sender is scheduled late."""

    def __init__(self, dsn: str, params: OpParams) -> None:
        super().__init__(dsn, 0, params)

    def step(self, entering: Callable[[float], None]) -> tuple[float, int]:
        with self.broker.transaction(pipeline=self.pipeline) as tx:
            tx.send(self.handle, MESSAGE_TYPE, self.body)
            issued = time.perf_counter()
        return issued, 1


class SendBatch(SendOne):
    """``batch`` SENDs in one transaction, as one send_many call (the batch API, as
    pgmq.send_batch is pgmq's)."""

    def __init__(self, dsn: str, worker: int, params: OpParams) -> None:
        super().__init__(dsn, worker, params)
        self.batch = params.batch
        self.bodies = [self.body] * self.batch

    def __call__(self) -> int:
        with self.broker.transaction() as tx:
            tx.send_many(self.handle, MESSAGE_TYPE, self.bodies)
        return self.batch


class SendRandom(SendOne):
    """SEND on a conversation picked at random among many, so the endpoint rows are not all
    hot in the buffer cache (the cost-growth scenario)."""

    def __init__(self, dsn: str, worker: int, params: OpParams) -> None:
        super().__init__(dsn, worker, params)
        self.handles = [uuid.UUID(h) for h in params.handles]
        self.rng = random.Random(params.seed * 1000 + worker)

    def __call__(self) -> int:
        with self.broker.transaction() as tx:
            tx.send(self.rng.choice(self.handles), MESSAGE_TYPE, self.body)
        return 1


class Receive(_BrokerOp):
    """RECEIVE TOP(batch) and commit."""

    def __init__(self, dsn: str, worker: int, params: OpParams) -> None:
        super().__init__(dsn)
        self.queue = params.queue
        self.top = params.batch

    def __call__(self) -> int:
        with self.broker.transaction() as tx:
            return len(tx.receive(self.queue, top=self.top))


class ReceiveAutocommit(Receive):
    """RECEIVE TOP(batch) outside a transaction: one statement that commits its removal (c's
    like-for-like with pgmq.pop)."""

    def __call__(self) -> int:
        return len(self.broker.receive(self.queue, top=self.top))


class WaitReceive(_BrokerOp):
    """WAITFOR (RECEIVE TOP(batch)) and commit, for a reader fed while it reads (k): it waits
    for messages instead of stopping at an empty queue, and stops (returns 0) only when none
    came within ``params.wait`` seconds. Warmed up when built (its connection, its statements
    and its WAITFOR listener), so it needs no warm-up transactions that would take messages.
    What a RECEIVE returns after the measurement's end is not counted (``window_only``)."""

    window_only = True

    def __init__(self, dsn: str, worker: int, params: OpParams) -> None:
        # One pooled connection for the transaction; the WAITFOR listener has its own.
        super().__init__(dsn, connections=2)
        self.queue = params.queue
        self.top = params.batch
        self.wait = params.wait
        with self.broker.transaction() as tx:
            tx.receive(self.queue, top=self.top, waitfor=True, timeout=0.01)

    def __call__(self) -> int:
        with self.broker.transaction() as tx:
            return len(tx.receive(self.queue, top=self.top, waitfor=True, timeout=self.wait))


class WaitReceiver(_BrokerOp):
    """WAITFOR (RECEIVE TOP(1)), TIMEOUT 5 s; the timestamp is taken when RECEIVE returns,
    before the commit, which is not part of the wake-up."""

    def __init__(self, dsn: str, params: OpParams) -> None:
        # One pooled connection for the transaction; the listener has its own.
        super().__init__(dsn, connections=2)
        self.queue = params.queue

    def step(self, entering: Callable[[float], None]) -> tuple[float, int]:
        with self.broker.transaction() as tx:
            entering(time.perf_counter())
            got = tx.receive(self.queue, top=1, waitfor=True, timeout=WAIT_TIMEOUT)
            returned = time.perf_counter()
        return returned, len(got)


class DialogBegin(_BrokerOp):
    """h, the initiator: BEGIN DIALOG and SEND the request, one transaction per dialog."""

    def __init__(self, dsn: str, worker: int, params: OpParams) -> None:
        super().__init__(dsn)
        self.from_service, self.to_service, self.contract = params.dialog
        self.body = binary_body(params.body_size)
        self.pipeline = params.pipeline

    def __call__(self) -> int:
        with self.broker.transaction(pipeline=self.pipeline) as tx:
            handle = tx.begin_dialog(self.from_service, self.to_service, self.contract)
            tx.send(handle, MESSAGE_TYPE, self.body)
        return 1


class DialogAnswer(_BrokerOp):
    """h, the target reader: WAITFOR (RECEIVE) the request of one dialog (one conversation
    group), SEND the reply and END CONVERSATION, one transaction; returns the dialogs answered
    (0 only when nothing came within the WAITFOR time-out)."""

    def __init__(self, dsn: str, worker: int, params: OpParams) -> None:
        # One pooled connection for the transaction; the WAITFOR listener has its own.
        super().__init__(dsn, connections=2)
        self.queue = params.queue
        self.body = binary_body(params.body_size)
        self.pipeline = params.pipeline

    def __call__(self) -> int:
        with self.broker.transaction(pipeline=self.pipeline) as tx:
            requests = tx.receive(self.queue, waitfor=True, timeout=WAIT_TIMEOUT)
            for request in requests:
                tx.send(request.conversation_handle, MESSAGE_TYPE, self.body)
                tx.end_conversation(request.conversation_handle)
        return len(requests)


class DialogClose(_BrokerOp):
    """h, the initiator-side reader: WAITFOR (RECEIVE) the reply and the EndDialog of one dialog
    (they were committed together, so one RECEIVE returns both) and END CONVERSATION, one
    transaction; returns the dialogs completed."""

    def __init__(self, dsn: str, worker: int, params: OpParams) -> None:
        super().__init__(dsn, connections=2)
        self.queue = params.reply_queue
        self.pipeline = params.pipeline

    def __call__(self) -> int:
        with self.broker.transaction(pipeline=self.pipeline) as tx:
            messages = tx.receive(self.queue, waitfor=True, timeout=WAIT_TIMEOUT)
            ended = 0
            for message in messages:
                if message.message_type_name == END_DIALOG:
                    tx.end_conversation(message.conversation_handle)
                    ended += 1
            if len(messages) != 2 * ended:
                kinds = [m.message_type_name for m in messages]
                raise RuntimeError(f"expected a reply and an EndDialog per dialog, got {kinds}")
        return ended
