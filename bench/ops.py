"""What one transaction of a contender does, as run by the load workers.

An Op does one transaction per call and returns how many messages it moved (0: nothing left, so
the load loop stops). A Stepper is driven one step at a time by the parent, for the WAITFOR
latency scenario where a receiver and a sender in two processes take turns.
"""

from __future__ import annotations

import functools
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import ClassVar, Protocol

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import TupleRow

from airflow_broker.poison.side_channel import SideChannel
from airflow_broker.queries import named_blocks

BARE_TABLE = "bench.bare_insert"
# The broker's EndDialog message type (message_types.message_type_id).
END_DIALOG_TYPE = 2


# A part of floors.sql's statements written once: {_name} or {_name(argument, ...)}.
_FRAGMENT = re.compile(r"\{(_\w+)(?:\((.*?)\))?\}")


@functools.cache
def floors() -> dict[str, str]:
    """What any SEND, RECEIVE or dialog writes at least, without the broker's checks
    (floors.sql). Read as a resource, and on first use: the Spark scenario ships this package
    as a zip."""
    blocks = named_blocks(resources.files("bench").joinpath("floors.sql").read_text(),
                          "floors.sql")
    return {name: _expand(text, blocks) for name, text in blocks.items()
            if not name.startswith("_")}


def _expand(text: str, blocks: dict[str, str]) -> str:
    """``text`` with each fragment it names in place (floors.sql's blocks whose names start
    with _): its arguments put in for {0}, {1}, ... and its lines after the first indented as
    the line that names it."""
    lines = []
    for line in text.split("\n"):
        found = _FRAGMENT.search(line)
        while found:
            arguments = found.group(2).split(", ") if found.group(2) else []
            fragment = _expand(blocks[found.group(1)], blocks).format(*arguments)
            indent = line[:len(line) - len(line.lstrip(" "))]
            fragment = fragment.replace("\n", "\n" + indent)
            line = line[:found.start()] + fragment + line[found.end():]
            found = _FRAGMENT.search(line, found.start() + len(fragment))
        lines.append(line)
    return "\n".join(lines)

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
    # The message type of our SENDs (bench.ours_ops.MESSAGE_TYPE), for ops that write our
    # tables without the broker's functions.
    message_type: str = ""


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


def with_settings(dsn: str, **settings: str) -> str:
    """The DSN with these settings added to its own options (``-c name=value``)."""
    if not settings:
        return dsn
    options = str(conninfo_to_dict(dsn).get("options") or "")
    extra = " ".join(f"-c {name}={value}" for name, value in settings.items())
    return make_conninfo(dsn, options=f"{options} {extra}".strip())


# The floors' readers plan as the broker's RECEIVE does: without sequential scans, and so
# without JIT, as the broker's functions run (disabled scans raise the estimated costs past
# jit_above_cost); and once, with a generic plan, as its take of the messages does (a custom
# plan of a RECEIVE that also checks its queue was estimated cheaper than the generic one, and
# planned again on every call: 0.6 ms).
FLOOR_READER_SETTINGS = {"enable_seqscan": "off", "jit": "off",
                         "plan_cache_mode": "force_generic_plan"}


class _Connected:
    """A load worker's connection, with ``SETTINGS`` added to the DSN's options, and its
    body."""

    SETTINGS: ClassVar[dict[str, str]] = {}

    def __init__(self, dsn: str, worker: int, params: OpParams) -> None:
        self.conn = psycopg.connect(with_settings(dsn, **self.SETTINGS))
        self.body = binary_body(params.body_size)

    def close(self) -> None:
        self.conn.close()


class BareInsert(_Connected):
    """The physical limit: one 100-byte row into an index-free table, one commit."""

    def __init__(self, dsn: str, worker: int, params: OpParams) -> None:
        super().__init__(dsn, worker, params)
        self.query = f"INSERT INTO {BARE_TABLE} (payload) VALUES (%s)"

    def __call__(self) -> int:
        with self.conn.transaction():
            self.conn.execute(self.query, [self.body])
        return 1


class _FloorStatement(_Connected):
    """One block of floors.sql, ``query`` with ``params``, in a transaction of its own that
    moves ``moved`` messages."""

    query: str
    params: dict[str, object]
    moved = 1

    def __call__(self) -> int:
        with self.conn.transaction():
            self.conn.execute(self.query, self.params)
        return self.moved


class SendFloor(_FloorStatement):
    """The floor of a SEND: what any SEND on an open local conversation writes, in one
    statement without the broker's checks (floors.sql), on this worker's own conversation, as
    SendOne does."""

    def __init__(self, dsn: str, worker: int, params: OpParams) -> None:
        super().__init__(dsn, worker, params)
        self.query = floors()["send"]
        self.params = {"handle": params.handles[worker % len(params.handles)],
                       "body": self.body, "message_type": params.message_type}


class SendFloorChecked(SendFloor):
    """a and f's complete checked floor of SEND: floors.sql's send_checked, one transaction
    per message."""

    def __init__(self, dsn: str, worker: int, params: OpParams) -> None:
        super().__init__(dsn, worker, params)
        self.query = floors()["send_checked"]


class SendFloorBatch(_FloorStatement):
    """k's floor of a producer: send_many of ``batch`` messages (floors.sql) on this worker's
    conversation, into the peer's queue or, for a service of another broker, into the
    transmission queue."""

    def __init__(self, dsn: str, worker: int, params: OpParams) -> None:
        super().__init__(dsn, worker, params)
        handle = params.handles[worker % len(params.handles)]
        row = self.conn.execute("SELECT is_remote FROM broker.endpoints"
                                " WHERE conversation_handle = %s", [handle]).fetchone()
        self.conn.commit()
        if row is None:
            raise RuntimeError(f"no endpoint {handle}")
        self.query = floors()["send_batch_remote" if row[0] else "send_batch"]
        self.moved = params.batch
        self.params = {"handle": handle, "count": params.batch,
                       "bodies": [self.body] * params.batch,
                       "message_type": params.message_type}


# The floor's RECEIVE looks for a free conversation group among the queue's first 16 ready
# messages, then, when another reader holds all of those, further on (as the broker's RECEIVE
# goes on past held groups).
RECEIVE_WINDOWS = (16, 256, 4096)


def receive_floor(conn: Conn, queue: str, top: int | None,
                  block: str = "receive") -> list[TupleRow]:
    """floors.sql's RECEIVE (or ``block``, another of its RECEIVEs) in the caller's
    transaction."""
    for window in RECEIVE_WINDOWS:
        taken = conn.execute(floors()[block],
                             {"queue": queue, "top": top, "window": window}).fetchall()
        if taken:
            return taken
    return []


class ReceiveRecorder:
    """Poison detection's record of a floor reader's receiving transactions (floors.sql's
    receive_record), as the broker's RECEIVE keeps it: prepared on a side connection in
    autocommit and posted there without waiting for it, its answer read before the next one is
    posted, through the broker's own side channel (airflow_broker.poison.side_channel). The rows
    taken carry the message id and the transaction id as their fourth and fifth columns.
    ``checked``: the record with its check of the reader (receive_record_checked)."""

    def __init__(self, dsn: str, conn: Conn, queue: str, checked: bool = False) -> None:
        self.conn = conn
        row = conn.execute("SELECT object_id FROM broker.queues WHERE name = %s",
                           [queue]).fetchone()
        conn.commit()
        if row is None:
            raise RuntimeError(f"no queue {queue}")
        self.queue_id = int(str(row[0]))
        # Named after its reader ("-side" added), as the broker's own side channel, so that
        # bench.dialog_cost finds the side backend of the reader it measures.
        reader = conn.info.get_parameters().get("application_name")
        self.side = SideChannel(dsn, reader or "bench-floor-reader", None)
        self.block = "receive_record_checked" if checked else "receive_record"
        self.query = floors()[self.block].encode()

    def record(self, taken: list[TupleRow]) -> None:
        ids = ",".join(str(row[3]) for row in taken)
        self.side.post_prepared(b"bench_" + self.block.encode(), self.query, [
            b"%d" % self.queue_id, str(taken[0][4]).encode(), b"{%s}" % ids.encode(),
            b"%d" % self.conn.info.backend_pid])

    def close(self) -> None:
        self.side.close()


class ReceiveFloor(_Connected):
    """c's floor: RECEIVE TOP(batch) (floors.sql) and commit; ``checked``: with the checks
    Service Broker's RECEIVE makes (receive_checked) and poison detection's record."""

    SETTINGS = FLOOR_READER_SETTINGS

    def __init__(self, dsn: str, worker: int, params: OpParams, checked: bool = False) -> None:
        super().__init__(dsn, worker, params)
        self.queue, self.top = params.queue, params.batch
        self.block = "receive_checked" if checked else "receive"
        self.recorder = (ReceiveRecorder(dsn, self.conn, self.queue, checked=True)
                         if checked else None)

    def __call__(self) -> int:
        with self.conn.transaction():
            taken = receive_floor(self.conn, self.queue, self.top, self.block)
            if taken and self.recorder is not None:
                self.recorder.record(taken)
            return len(taken)

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.close()
        super().close()


class ReceiveFloorChecked(ReceiveFloor):
    """c's floor with the checks and poison detection's record."""

    def __init__(self, dsn: str, worker: int, params: OpParams) -> None:
        super().__init__(dsn, worker, params, checked=True)


class DialogFloorBegin(_FloorStatement):
    """h's floor, the initiator: BEGIN DIALOG and SEND the request (floors.sql), one
    transaction per dialog; ``checked``: with the checks any design keeping Service Broker's
    rules makes (dialog_begin_checked)."""

    def __init__(self, dsn: str, worker: int, params: OpParams, checked: bool = False) -> None:
        super().__init__(dsn, worker, params)
        initiator, target, contract = params.dialog
        self.query = floors()["dialog_begin_checked" if checked else "dialog_begin"]
        self.params = {"initiator": initiator, "target": target, "contract": contract,
                       "message_type": params.message_type, "body": self.body}


class DialogFloorBeginApart(_Connected):
    """h's floor with the checks, the initiator, its BEGIN DIALOG and its SEND of message 0 a
    statement each (floors.sql's begin_dialog_checked and send_first_checked), as Service
    Broker's API issues them."""

    def __init__(self, dsn: str, worker: int, params: OpParams) -> None:
        super().__init__(dsn, worker, params)
        self.initiator, self.target, self.contract = params.dialog
        self.message_type = params.message_type

    def __call__(self) -> int:
        handle = uuid.uuid4()
        with self.conn.transaction():
            self.conn.execute(floors()["begin_dialog_checked"],
                              {"initiator": self.initiator, "target": self.target,
                               "contract": self.contract, "handle": handle,
                               "group": uuid.uuid4()})
            self.conn.execute(floors()["send_first_checked"],
                              {"handle": handle, "initiator": self.initiator,
                               "message_type": self.message_type, "body": self.body})
        return 1


class _PollingFloorReader(_Connected):
    """Takes up to ``top`` messages of one conversation group of ``queue`` (floors.sql; all of
    them when None) and acts on them in the same transaction; polls every millisecond while
    there are none, up to ``wait`` seconds, as pgmq's readers poll (0 messages then).

    ``recorded``: each receiving transaction also keeps poison detection's record
    (ReceiveRecorder). ``checked``: the statements with everything the broker keeps, the
    record with its check, and waiting as WAITFOR waits: registered among the queue's waiters
    (once, for the reader's session) and woken by the writers' NOTIFY instead of polling."""

    SETTINGS = FLOOR_READER_SETTINGS

    def __init__(self, dsn: str, worker: int, params: OpParams, queue: str,
                 top: int | None = None, recorded: bool = False,
                 checked: bool = False) -> None:
        super().__init__(dsn, worker, params)
        self.queue, self.top = queue, top
        # The statements with the checks any design keeping Service Broker's rules makes
        # (floors.sql's blocks ending in _checked).
        self.suffix = "_checked" if checked else ""
        self.wait = params.wait
        self.message_type = params.message_type
        self.recorder = (ReceiveRecorder(dsn, self.conn, queue, checked=checked)
                         if recorded else None)
        self.waiter: uuid.UUID | None = None
        if checked:
            self.waiter = uuid.uuid4()
            with self.conn.transaction():
                queue_id = self.conn.execute(
                    "INSERT INTO broker.queue_waiters (waiter_id, queue_id, backend_pid, since)"
                    " SELECT %s, object_id, pg_backend_pid(), now() AT TIME ZONE 'UTC'"
                    " FROM broker.queues WHERE name = %s RETURNING queue_id",
                    [self.waiter, queue]).fetchone()
                if queue_id is None:
                    raise RuntimeError(f"no queue {queue}")
                self.conn.execute(f'LISTEN "broker_queue_{queue_id[0]}"')

    def record(self, taken: list[TupleRow]) -> None:
        if self.recorder is not None:
            self.recorder.record(taken)

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.close()
        if self.waiter is not None:
            with self.conn.transaction():
                self.conn.execute("DELETE FROM broker.queue_waiters WHERE waiter_id = %s",
                                  [self.waiter])
        super().close()

    def pause(self, deadline: float) -> None:
        """Until the queue may hold a message: a NOTIFY (one that came during the last
        transaction is kept by the connection), or a millisecond when polling."""
        if self.waiter is None:
            time.sleep(0.001)
            return
        for _ in self.conn.notifies(timeout=max(0.0, min(0.1, deadline - time.monotonic())),
                                    stop_after=1):
            pass

    def act(self, taken: list[TupleRow]) -> int:
        """What the transaction does with the messages; returns what it moved."""
        return len(taken)

    def __call__(self) -> int:
        deadline = time.monotonic() + self.wait
        while True:
            with self.conn.transaction():
                taken = receive_floor(self.conn, self.queue, self.top,
                                      "receive" + self.suffix)
                if taken:
                    self.record(taken)
                    return self.act(taken)
            if time.monotonic() > deadline:
                return 0
            self.pause(deadline)


class ReceiveFloorWait(_PollingFloorReader):
    """k's floor of a reader: RECEIVE TOP(batch) (floors.sql) and commit, polling while the
    queue is empty."""

    def __init__(self, dsn: str, worker: int, params: OpParams) -> None:
        super().__init__(dsn, worker, params, params.queue, params.batch)


class DialogFloorAnswer(_PollingFloorReader):
    """h's floor, the target reader: RECEIVE the request, SEND the reply and END, one
    transaction."""

    def __init__(self, dsn: str, worker: int, params: OpParams,
                 recorded: bool = False, checked: bool = False) -> None:
        super().__init__(dsn, worker, params, params.queue, recorded=recorded, checked=checked)

    # The statements of the reply and the END: one, or (``apart``) SEND and END CONVERSATION
    # each as a statement of its own, as Service Broker's API issues them.
    apart = False

    def act(self, taken: list[TupleRow]) -> int:
        params = {"message_type": self.message_type, "body": self.body}
        statements = (("dialog_reply_checked", "dialog_end_target_checked") if self.apart
                      else ("dialog_reply_and_end" + self.suffix,))
        for handle, *_ in taken:
            for statement in statements:
                self.conn.execute(floors()[statement], {"handle": handle, **params})
        return len(taken)


class DialogFloorClose(_PollingFloorReader):
    """h's floor, the initiator-side reader: RECEIVE the reply and the EndDialog, END, one
    transaction; returns the dialogs completed."""

    def __init__(self, dsn: str, worker: int, params: OpParams,
                 recorded: bool = False, checked: bool = False) -> None:
        super().__init__(dsn, worker, params, params.reply_queue, recorded=recorded,
                         checked=checked)

    def act(self, taken: list[TupleRow]) -> int:
        ended = [handle for handle, message_type, *_ in taken
                 if message_type == END_DIALOG_TYPE]
        if len(taken) != 2 * len(ended):
            raise RuntimeError(f"expected a reply and an EndDialog per dialog, got {taken}")
        for handle in ended:
            self.conn.execute(floors()["dialog_end" + self.suffix], {"handle": handle})
        return len(ended)


class DialogFloorAnswerRecorded(DialogFloorAnswer):
    """h's floor with poison detection's record, the target reader."""

    def __init__(self, dsn: str, worker: int, params: OpParams) -> None:
        super().__init__(dsn, worker, params, recorded=True)


class DialogFloorCloseRecorded(DialogFloorClose):
    """h's floor with poison detection's record, the initiator-side reader."""

    def __init__(self, dsn: str, worker: int, params: OpParams) -> None:
        super().__init__(dsn, worker, params, recorded=True)


class DialogFloorBeginChecked(DialogFloorBegin):
    """h's floor with the checks, the initiator."""

    def __init__(self, dsn: str, worker: int, params: OpParams) -> None:
        super().__init__(dsn, worker, params, checked=True)


class DialogFloorAnswerChecked(DialogFloorAnswer):
    """h's floor with the checks and poison detection's record, the target reader."""

    def __init__(self, dsn: str, worker: int, params: OpParams) -> None:
        super().__init__(dsn, worker, params, recorded=True, checked=True)


class DialogFloorAnswerApart(DialogFloorAnswerChecked):
    """h's floor with the checks and poison detection's record, the target reader, its SEND
    and its END CONVERSATION a statement each."""

    apart = True


class DialogFloorCloseChecked(DialogFloorClose):
    """h's floor with the checks and poison detection's record, the initiator-side reader."""

    def __init__(self, dsn: str, worker: int, params: OpParams) -> None:
        super().__init__(dsn, worker, params, recorded=True, checked=True)
