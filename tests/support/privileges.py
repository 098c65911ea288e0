"""Helpers of the least-privilege tier (tests/least_privilege): applications' objects and
grants, logins as their roles, and snapshots that show a denial changed nothing."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from airflow_broker import Broker
from airflow_broker.transaction import Transaction
from tests.support import roles


@dataclass
class Application:
    """The objects of one application: initiator service I on queue q_i, target service T on
    q_t, contract C of Req (sent by the initiator) and Resp (by the target)."""

    prefix: str

    def name(self, object_name: str) -> str:
        return f"{self.prefix}{object_name}"

    def create(self, tx: Transaction) -> None:
        n = self.name
        tx.create_message_type(n("Req"))
        tx.create_message_type(n("Resp"))
        tx.create_contract(n("C"), {n("Req"): "INITIATOR", n("Resp"): "TARGET"})
        tx.create_queue(n("q_i"))
        tx.create_queue(n("q_t"))
        tx.create_service(n("I"), n("q_i"))
        tx.create_service(n("T"), n("q_t"), [n("C")])

    def sender_grants(self) -> tuple[str, ...]:
        """What an application that begins dialogs from I and sends on them holds."""
        return (roles.broker_grant("RECEIVE", f"QUEUE::{self.name('q_i')}"),
                roles.broker_grant("REFERENCES", f"CONTRACT::{self.name('C')}"))

    def reader_grants(self) -> tuple[str, ...]:
        """What an application that reads T's queue, replies and ends holds."""
        return (roles.broker_grant("RECEIVE", f"QUEUE::{self.name('q_t')}"),)


def login(dsn: str, role_name: str) -> Broker:
    """A Broker that logs in as ``role_name``: the principal every permission check sees."""
    return Broker(roles.login_dsn(dsn, role_name), poll_interval=0.2)


def snapshot(dsn: str) -> dict[str, list[str]]:
    """Every row of every table of the broker schema (and of public, where queue views and
    applications' tables live), as text: equal snapshots mean an unchanged database."""
    with psycopg.connect(dsn) as conn:
        tables = conn.execute(
            "SELECT format('%I.%I', schemaname, tablename) FROM pg_tables"
            " WHERE schemaname IN ('broker', 'public') ORDER BY 1").fetchall()
        return {
            table: [r[0] for r in conn.execute(sql.SQL(
                "SELECT t::text FROM {} t ORDER BY 1").format(sql.SQL(table))).fetchall()]
            for (table,) in tables
        }
