"""Two brokers in two databases (or on two servers) for the delivery tests: the catalogue's
application split in two, initiator service I in broker A and target service T in broker B,
with a route each way."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import TupleRow

from airflow_broker import Broker, Message
from airflow_broker.worker import BrokerWorker
from airflow_broker.worker.transport import Outcome, Transport


def deploy_application(broker: Broker, *, initiator: bool = True, target: bool = True) -> None:
    with broker.transaction() as tx:
        tx.create_message_type("Req")
        tx.create_message_type("Resp")
        tx.create_contract("C", {"Req": "INITIATOR", "Resp": "TARGET"})
        if initiator:
            tx.create_queue("q_i")
            tx.create_service("I", "q_i")
        if target:
            tx.create_queue("q_t")
            tx.create_service("T", "q_t", ["C"])


def standard_application(broker: Broker) -> App:
    """The tests' application: message types Req and Resp, contract C, queues q_i and q_t, and
    services I and T (T also takes DEFAULT, for timers and plain messages)."""
    with broker.transaction() as tx:
        tx.create_message_type("Req")
        tx.create_message_type("Resp")
        tx.create_contract("C", {"Req": "INITIATOR", "Resp": "TARGET"})
        tx.create_queue("q_i")
        tx.create_queue("q_t")
        tx.create_service("I", "q_i")
        tx.create_service("T", "q_t", ["C", "DEFAULT"])
    return App(broker)


@dataclass
class Pair:
    a: Broker
    b: Broker
    a_uri: str
    b_uri: str
    transports: list[Transport] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ta = Transport(self.a, batch_size=500)
        self.tb = Transport(self.b, batch_size=500)
        self.transports += [self.ta, self.tb]

    def routes(self, *, forward: bool = True, back: bool = True) -> None:
        if forward:
            with self.a.transaction() as tx:
                tx.create_route("to_T", self.b_uri, service_name="T")
        if back:
            with self.b.transaction() as tx:
                tx.create_route("to_I", self.a_uri, service_name="I")

    def pump(self, rounds: int = 4) -> None:
        """Transports of both sides, back and forth, until nothing is due."""
        for _ in range(rounds):
            moved = self.ta.run_until_idle().sent + self.tb.run_until_idle().sent
            if not moved:
                return

    def dialog(self, *, lifetime: int | None = None, **kwargs: Any) -> uuid.UUID:
        with self.a.transaction() as tx:
            if lifetime is not None:
                kwargs["lifetime"] = lifetime
            return tx.begin_dialog("I", "T", "C", **kwargs)

    def close(self) -> None:
        for t in self.transports:
            t.close()


def receive_all(broker: Broker, queue_name: str, top: int = 10_000) -> list[Message]:
    with broker.transaction() as tx:
        return tx.receive(queue_name, top=top)


def rows(broker: Broker, query: str, params: Sequence[Any] = ()) -> list[TupleRow]:
    with psycopg.connect(broker.dsn) as conn:
        return conn.execute(query, params).fetchall()


def one(broker: Broker, query: str, params: Sequence[Any] = ()) -> Any:
    found = rows(broker, query, params)
    assert found, query
    return found[0][0]


def worker(broker: Broker) -> BrokerWorker:
    return BrokerWorker(broker, activation=False, transport=False)


def advance(broker: Broker, seconds: float) -> dt.datetime:
    return broker.advance_clock(dt.timedelta(seconds=seconds))


class FaultyTransport(Transport):
    """A transport whose far side commits and whose answer is then lost (as when the
    connection drops after the far broker's COMMIT): ``lose`` answers are lost."""

    def __init__(self, broker: Broker, lose: int = 1, **kwargs: Any) -> None:
        super().__init__(broker, **kwargs)
        self.lose = lose

    def _push(self, address: str, me: str,
              batch: Sequence[TupleRow]) -> tuple[list[Outcome], str]:
        answer = super()._push(address, me, batch)
        if self.lose > 0:
            self.lose -= 1
            raise OSError("the acknowledgement was lost on its way back")
        return answer


@dataclass(frozen=True)
class App:
    """The catalogue's standard application (spec 28): contract C = (Req SENT BY INITIATOR,
    Resp SENT BY TARGET), initiator service I on queue q_i, target service T on queue q_t."""

    broker: Broker

    def dialog(self, contract: str = "C", **kwargs: object) -> uuid.UUID:
        with self.broker.transaction() as tx:
            return tx.begin_dialog("I", "T", contract, **kwargs)  # type: ignore[arg-type]
