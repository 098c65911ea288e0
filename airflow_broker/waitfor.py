"""WAITFOR wake-ups.

PostgreSQL delivers NOTIFY only to sessions outside a transaction, while WAITFOR(RECEIVE) waits
inside one. So each Broker keeps one listener connection of its own, in a background thread, that
LISTENs on the channels of the queues someone waits on and wakes those waiters. A notification is
only a hint: the waiter runs RECEIVE again, and also polls, so a lost notification (or a listener
that reconnects after a PostgreSQL restart) delays a wake-up but never loses a message.

A waiter is registered in the queue_waiters table while it waits: SEND notifies only queues that
have waiters (NOTIFY serialises committing transactions on a database-wide lock), and the table
is what tasks_waiting counts.
"""

from __future__ import annotations

import contextlib
import logging
import queue as queue_module
import select
import socket
import threading
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from airflow_broker.queries import Queries
from airflow_broker.reconnect import Outage

log = logging.getLogger(__name__)


@dataclass
class _Command:
    kind: str  # "register" or "unregister"
    waiter_id: uuid.UUID
    queue_id: int
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


class Waiter:
    def __init__(self) -> None:
        self._event = threading.Event()

    def wake(self) -> None:
        self._event.set()

    def wait(self, seconds: float) -> bool:
        """Waits up to ``seconds`` for a wake-up; True when woken. Clears the wake-up."""
        woken = self._event.wait(seconds)
        self._event.clear()
        return woken



def queue_channel(schema: str, queue_id: int | str) -> str:
    """The NOTIFY channel of a queue: SEND's wake_waiters() (00_support.sql) notifies it."""
    return f"{schema}_queue_{queue_id}"


class WakeUps:
    """The listener of one Broker. Started on first use; ``close()`` stops it."""

    def __init__(self, dsn: str, schema: str) -> None:
        self._dsn = dsn
        self._schema = schema
        self._queries = Queries(schema)
        self._commands: queue_module.Queue[_Command] = queue_module.Queue()
        self._waiters: dict[int, dict[uuid.UUID, Waiter]] = defaultdict(dict)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        # Rung when a command is queued or the listener must stop: the listener sleeps in
        # select() on it and on its connection, so it takes a registration at once.
        self._bell, self._bell_ringer = socket.socketpair()
        self._bell.setblocking(False)
        self._bell_ringer.setblocking(False)
        self._outage = Outage(f"WAITFOR listener of schema {schema}", initial=0.1,
                              maximum=5.0, logger=log)

    def channel(self, queue_id: int) -> str:
        return queue_channel(self._schema, queue_id)

    @contextmanager
    def waiting(self, queue_id: int) -> Iterator[Waiter]:
        """Registers a waiter on the queue for the duration of the block."""
        self._ensure_started()
        waiter = Waiter()
        waiter_id = uuid.uuid4()
        with self._lock:
            self._waiters[queue_id][waiter_id] = waiter
        try:
            self._submit(_Command("register", waiter_id, queue_id), wait=True)
            yield waiter
        finally:
            with self._lock:
                self._waiters[queue_id].pop(waiter_id, None)
            self._submit(_Command("unregister", waiter_id, queue_id), wait=False)

    def close(self) -> None:
        self._stopping.set()
        self._ring()
        if self._thread is not None:
            self._thread.join(timeout=5)
            if self._thread.is_alive():
                return  # it still sleeps on the bell: leave the sockets to the garbage collector
            self._thread = None
        # Left open, each closed Broker leaks two sockets (a ResourceWarning in every task).
        self._bell.close()
        self._bell_ringer.close()

    def _ensure_started(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._stopping.clear()
                self._thread = threading.Thread(
                    target=self._run, name=f"airflow-broker-wakeups-{self._schema}", daemon=True
                )
                self._thread.start()

    def _ring(self) -> None:
        # A full socket buffer means the bell is ringing already.
        with contextlib.suppress(BlockingIOError):
            self._bell_ringer.send(b"\0")

    def _silence(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while self._bell.recv(4096):
                pass

    def _submit(self, command: _Command, *, wait: bool) -> None:
        self._commands.put(command)
        self._ring()
        if wait:
            # Registration normally takes a round trip; if the listener cannot reach the
            # database, the waiter falls back to polling after a short while.
            command.done.wait(timeout=5)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                with psycopg.connect(self._dsn, autocommit=True) as conn:
                    self._outage.recovered()
                    self._serve(conn)
            except psycopg.Error as exc:
                # Waiters poll meanwhile; the reconnect registers them again.
                self._wake_everyone()
                self._outage.wait(exc, self._stopping)

    def _serve(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        listening: set[int] = set()
        registered: dict[uuid.UUID, int] = {}
        # queue_waiters rows are hints that steer SEND's NOTIFY, and every listener is gone
        # after a crash anyway: their commits need not wait for the disk (a wait registers and
        # unregisters, two commits).
        conn.execute("SET synchronous_commit = off")
        # Notifications that arrive while a statement runs on the connection.
        conn.add_notify_handler(lambda notify: self._wake_channel(notify.channel))
        # After a reconnect, waiters still present are registered again.
        with self._lock:
            current = [(w, q) for q, ws in self._waiters.items() for w in ws]
        for waiter_id, queue_id in current:
            self._register(conn, listening, registered, waiter_id, queue_id)
        encoding = conn.info.encoding
        while not self._stopping.is_set():
            self._drain_commands(conn, listening, registered)
            bell = self._bell.fileno()
            ready, _, _ = select.select([conn.fileno(), bell], [], [], 1.0)
            if bell in ready:
                self._silence()
            if conn.fileno() in ready:
                # The connection is idle here: read what arrived (a lost connection raises)
                # and take the notifications out of libpq ourselves.
                conn.pgconn.consume_input()
                while (notify := conn.pgconn.notifies()) is not None:
                    self._wake_channel(notify.relname.decode(encoding))

    def _drain_commands(
        self,
        conn: psycopg.Connection[tuple[object, ...]],
        listening: set[int],
        registered: dict[uuid.UUID, int],
    ) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue_module.Empty:
                return
            try:
                if command.kind == "register":
                    self._register(conn, listening, registered, command.waiter_id, command.queue_id)
                else:
                    registered.pop(command.waiter_id, None)
                    conn.execute(self._queries["waiters_remove"], [[command.waiter_id]])
            except psycopg.Error as exc:
                # The reconnect registers the waiters still present again.
                command.error = exc
                raise
            finally:
                command.done.set()

    def _register(
        self,
        conn: psycopg.Connection[tuple[object, ...]],
        listening: set[int],
        registered: dict[uuid.UUID, int],
        waiter_id: uuid.UUID,
        queue_id: int,
    ) -> None:
        fresh = queue_id not in listening
        if fresh:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel(queue_id))))
            listening.add(queue_id)
        conn.execute(self._queries["waiter_register"], [waiter_id, queue_id, fresh])
        registered[waiter_id] = queue_id

    def _wake_channel(self, channel: str) -> None:
        prefix = queue_channel(self._schema, "")
        if not channel.startswith(prefix):
            return
        queue_id = int(channel[len(prefix) :])
        with self._lock:
            waiters = list(self._waiters.get(queue_id, {}).values())
        for waiter in waiters:
            waiter.wake()

    def _wake_everyone(self) -> None:
        with self._lock:
            waiters = [w for ws in self._waiters.values() for w in ws.values()]
        for waiter in waiters:
            waiter.wake()
