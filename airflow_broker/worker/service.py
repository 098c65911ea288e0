"""The broker worker: the background work SQL Server does inside its engine.

Each pass validates the XML bodies SEND held for want of a trusted verdict, fires due
conversation timers, expires lifetimes, delivers what waits in the
transmission queue (to this broker, and through the transport to brokers in other databases),
reclaims closed endpoints, purges Airflow inbox rows consumed a week ago, resolves receiving
transactions for poison-message detection, handles replies on event notification dialogs, and
runs the queue monitors that start activated readers, each step in short transactions of its own
(``run_once``). Several workers may run at once: every step takes its rows with SKIP LOCKED and
is atomic, so a worker killed half-way leaves nothing half done. ``run`` repeats passes until
SIGTERM or SIGINT, and reconnects when PostgreSQL restarts; meanwhile a transport thread
delivers to other brokers as soon as a SEND for one commits (LISTEN), and at least every
``interval``.
"""

from __future__ import annotations

import functools
import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from types import FrameType

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from airflow_broker.broker import Broker
from airflow_broker.errors import MessageTooLarge
from airflow_broker.poison.detection import resolve_all_receives
from airflow_broker.reconnect import Outage
from airflow_broker.validation import MessageTypeInfo, verdict
from airflow_broker.worker.activation import ActivationManager, configured_targets
from airflow_broker.worker.transport import Transport

log = logging.getLogger(__name__)

# Steps that take a batch size and return how many rows they handled.
STEPS = ("fire_timers", "expire_lifetimes", "retry_transmissions", "reclaim_endpoints",
         "process_notification_replies", "purge_consumed_inbox")


@dataclass
class PassResult:
    timers_fired: int = 0
    lifetimes_expired: int = 0
    messages_delivered: int = 0
    endpoints_reclaimed: int = 0
    notification_replies: int = 0
    inbox_rows_purged: int = 0
    messages_validated: int = 0
    messages_transmitted: int = 0
    queues_disabled: int = 0
    readers_started: int = 0

    def __add__(self, other: PassResult) -> PassResult:
        return PassResult(*(getattr(self, f.name) + getattr(other, f.name)
                            for f in fields(self)))

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))


class BrokerWorker:
    def __init__(self, broker: Broker, *, batch_size: int = 1000, interval: float = 1.0,
                 activation: bool = True, transport: bool = True,
                 activation_targets: Sequence[str] | None = None) -> None:
        """``activation_targets``: the activation procedures this worker may start (patterns,
        default: AIRFLOW_BROKER_ACTIVATION_TARGETS)."""
        self.broker = broker
        self.batch_size = batch_size
        self.interval = interval
        self.activation = (ActivationManager(broker, activation_targets
                                             if activation_targets is not None
                                             else configured_targets())
                           if activation else None)
        self.transport = Transport(broker, batch_size=batch_size) if transport else None
        self._stop = threading.Event()

    def _step(self, step: str) -> int:
        """One step until it has nothing left, one batch per transaction."""
        done = 0
        while not self._stop.is_set():
            with self.broker.pool.connection() as conn, conn.transaction():
                row = conn.execute(self.broker.queries.call(step, 1),
                                   [self.batch_size]).fetchone()
            count = int(row[0]) if row else 0
            done += count
            if count < self.batch_size:
                break
        return done

    def _validate_held(self) -> int:
        """Validates the XML bodies SEND held for want of a trusted verdict (32_validation.sql),
        as the target would, and releases or refuses each; before the transmission queue is
        delivered, so a released message goes in the same pass."""
        done = 0
        while not self._stop.is_set():
            with self.broker.pool.connection() as conn, conn.transaction():
                rows = conn.execute(self.broker.queries["held_for_validation"],
                                    [self.batch_size]).fetchall()
                for transmission_id, body, name, kind, collection, schemas in rows:
                    info = MessageTypeInfo(name, kind, collection, tuple(schemas))
                    try:
                        problem = verdict(info, body)
                    except MessageTooLarge as exc:
                        problem = str(exc)
                    conn.execute(self.broker.queries["settle_validation"],
                                 [transmission_id, problem])
            done += len(rows)
            if len(rows) < self.batch_size:
                break
        return done

    def _resolve_receives(self) -> int:
        with self.broker.pool.connection() as conn, conn.transaction():
            return resolve_all_receives(conn, self.broker.queries)

    def _transmit(self) -> int:
        if self.transport is None:
            return 0
        result = self.transport.run_until_idle()
        return result.acknowledged + result.refused

    def _isolated(self, name: str, step: Callable[[], int]) -> int:
        """Runs one step; a failure of the step is logged and the pass goes on with the next,
        so one bad row or setting cannot stop timers, lifetimes and poison checks for every
        queue. A lost database ends the pass: run() reconnects."""
        try:
            return step()
        except psycopg.OperationalError:
            raise
        except Exception:
            log.exception("broker worker: step %s failed; the other steps go on", name)
            return 0

    def run_once(self, *, transmit: bool = True) -> PassResult:
        """One pass of every step; returns what it did."""
        validated = self._isolated("validate", self._validate_held)
        fired, expired, delivered, reclaimed, replies, purged = (
            self._isolated(step, functools.partial(self._step, step)) for step in STEPS)
        activation = self.activation
        return PassResult(
            timers_fired=fired, lifetimes_expired=expired, messages_delivered=delivered,
            endpoints_reclaimed=reclaimed, notification_replies=replies,
            inbox_rows_purged=purged, messages_validated=validated,
            messages_transmitted=self._isolated("transmit", self._transmit) if transmit else 0,
            queues_disabled=self._isolated("resolve_receives", self._resolve_receives),
            readers_started=0 if activation is None
            else self._isolated("activation", activation.step),
        )

    def stop(self) -> None:
        self._stop.set()

    def run(self, *, handle_signals: bool = True) -> PassResult:
        """Passes every ``interval`` seconds until stop(), SIGTERM or SIGINT."""
        if handle_signals:
            def on_signal(signum: int, _frame: FrameType | None) -> None:
                log.info("broker worker: %s received, stopping after this step",
                         signal.Signals(signum).name)
                self.stop()

            signal.signal(signal.SIGTERM, on_signal)
            signal.signal(signal.SIGINT, on_signal)
        total = PassResult()
        outage = Outage("broker worker", initial=self.interval, logger=log)
        log.info("broker worker started on schema %s", self.broker.schema)
        sender = None
        if self.transport is not None:
            sender = threading.Thread(target=self._transport_loop, name="broker-transport",
                                      daemon=True)
            sender.start()
        while not self._stop.is_set():
            try:
                result = self.run_once(transmit=sender is None)
                outage.recovered()
            except psycopg.OperationalError as exc:
                # The pool replaces the connections the server ended (Broker's check); the
                # pass runs again once the server answers.
                outage.wait(exc, self._stop)
                continue
            total = total + result
            if result.total:
                log.info("broker worker: %s", result)
            self._stop.wait(self.interval)
        if sender is not None:
            sender.join()
        if self.transport is not None:
            self.transport.close()
        if self.activation is not None:
            self.activation.stop()
            self.activation.close()
        log.info("broker worker stopped: %s", total)
        return total


    def _transport_loop(self) -> None:
        """Delivers to other brokers when a SEND for one commits (NOTIFY), or every interval."""
        assert self.transport is not None
        channel = sql.Identifier(f"{self.broker.schema}_transmit")
        outage = Outage("broker transport", initial=self.interval, logger=log)
        backoff = self.interval
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.broker.dsn, autocommit=True) as listener:
                    listener.execute(sql.SQL("LISTEN {}").format(channel))
                    while not self._stop.is_set():
                        result = self.transport.run_until_idle(should_stop=self._stop.is_set)
                        outage.recovered()
                        backoff = self.interval
                        if result.sent:
                            log.info("broker transport: %s", result)
                            if result.acknowledged or result.refused:
                                # More may have been sent meanwhile: look again at once.
                                continue
                        self._wait_for_sends(listener)
            except psycopg.OperationalError as exc:
                outage.wait(exc, self._stop)
            except Exception:
                # The thread must outlive any one failed batch; nothing of it was committed.
                log.exception("broker transport: a batch failed; retrying in %.0f s", backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _wait_for_sends(self, listener: psycopg.Connection[TupleRow]) -> None:
        """Until a SEND for another broker commits (its NOTIFY) or the interval has passed;
        stop() is noticed within a second."""
        deadline = time.monotonic() + self.interval
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            for _ in listener.notifies(timeout=min(left, 1.0), stop_after=1):
                return


def wait_until_idle(worker: BrokerWorker, limit: float = 60.0) -> PassResult:
    """Passes until one does nothing (for tests and one-shot callers)."""
    total = PassResult()
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        result = worker.run_once()
        total = total + result
        if not result.total:
            break
    return total
