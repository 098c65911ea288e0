"""Activation targets used by the activation tests (imported by activated reader processes)."""

from __future__ import annotations

import os
import time
import uuid

import psycopg
from psycopg import sql

from airflow_broker import Transaction
from airflow_broker._statements import runner_of
from airflow_broker.worker.activation import ActivationContext


def _stop_requested(ctx: ActivationContext) -> bool:
    with ctx.broker.transaction() as tx:
        rows = runner_of(tx).run(sql.SQL("SELECT stop FROM public.reader_control"))
    return bool(rows and rows[0][0])


def _record(ctx: ActivationContext, tx: Transaction, message_ids: list[uuid.UUID]) -> None:
    runner_of(tx).run(sql.SQL("INSERT INTO public.processed (message_id, task_id)"
                              " SELECT m, %s FROM unnest(%s::uuid[]) m"),
                      [ctx.task_id, message_ids])


def receive_one(ctx: ActivationContext) -> None:
    """Receives one message per activation, as the spec's T-AC-01 procedure does."""
    with ctx.broker.transaction() as tx:
        messages = tx.receive(ctx.queue_name, 1)
        _record(ctx, tx, [m.message_id for m in messages])


def drain(ctx: ActivationContext) -> None:
    """The usual activated procedure: RECEIVE until the queue stays empty for a second."""
    while True:
        with ctx.broker.transaction() as tx:
            messages = tx.receive(ctx.queue_name, 10, waitfor=True, timeout=1.0)
            _record(ctx, tx, [m.message_id for m in messages])
        if not messages:
            return
        time.sleep(0.05)


def slow(ctx: ActivationContext) -> None:
    """A busy reader that keeps its queue's backlog: one message, then a pause, until told to
    stop."""
    while not _stop_requested(ctx):
        with ctx.broker.transaction() as tx:
            messages = tx.receive(ctx.queue_name, 1, waitfor=True, timeout=0.3)
            _record(ctx, tx, [m.message_id for m in messages])
        time.sleep(0.2)


def stub(ctx: ActivationContext) -> None:
    """Never RECEIVEs: the stub-procedure trap of spec 20.4."""


def fail_after_receive(ctx: ActivationContext) -> None:
    with ctx.broker.transaction() as tx:
        tx.receive(ctx.queue_name, 1)
        raise RuntimeError("this message cannot be processed")


def whoami(ctx: ActivationContext) -> None:
    with ctx.broker.transaction() as tx:
        messages = tx.receive(ctx.queue_name)
        runner_of(tx).run(sql.SQL("INSERT INTO public.reader_identity (role_name, messages)"
                                  " VALUES (current_user, %s)"), [len(messages)])


def hold_group(ctx: ActivationContext) -> None:
    """Works long on each message inside its transaction, so its conversation group stays
    locked while it works."""
    while not _stop_requested(ctx):
        with ctx.broker.transaction() as tx:
            messages = tx.receive(ctx.queue_name, 1, waitfor=True, timeout=0.5)
            _record(ctx, tx, [m.message_id for m in messages])
            if messages:
                time.sleep(2.0)


def credentials_check(ctx: ActivationContext) -> None:
    """Records who the reader is, whether it can become another role, and which of the
    worker's secrets reached its environment."""
    secrets = sorted(name for name, value in os.environ.items()
                     if "worker-secret" in value or name.startswith("AIRFLOW_CONN_")
                     or name == "PGPASSWORD")
    with psycopg.connect(os.environ["AIRFLOW_BROKER_DSN"], autocommit=True) as conn:
        conn.execute("RESET ROLE")
        current, session = conn.execute("SELECT current_user, session_user").fetchone() or ("", "")
        try:
            conn.execute("SET ROLE postgres")
            escalated = "postgres"
        except psycopg.Error as exc:
            escalated = f"refused: {exc.sqlstate}"
    with ctx.broker.transaction() as tx:
        messages = tx.receive(ctx.queue_name)
        runner_of(tx).run(
            sql.SQL("INSERT INTO public.reader_credentials VALUES (%s, %s, %s, %s, %s)"),
            [current, session, escalated, secrets, len(messages)])
