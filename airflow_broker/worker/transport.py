"""The transport: delivers what waits in the transmission queue to brokers in other databases
or on other servers (spec 21.4).

A step takes the due messages of conversations whose peer lives in another broker, in
sequence order, groups them by route address, and calls the far broker's
``accept_transmissions`` in the far broker's own transaction. When that has committed, the
answers (acknowledgements, Errors, reasons to wait) are applied in the local transaction that
selected the messages. There is no distributed transaction: if anything dies between the two
commits, the messages are sent again, the far broker recognises them by (conversation,
direction, sequence number), acknowledges them again and enqueues them once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow

from airflow_broker.broker import Broker
from airflow_broker.errors import AddressError, BrokerError
from airflow_broker.queries import DEFAULT_SCHEMA, Queries
from airflow_broker.reconnect import usable
from airflow_broker.redaction import redact
from airflow_broker.validation import MessageTypeInfo, verdict

log = logging.getLogger(__name__)

UNREACHABLE = "The target service broker is unreachable: {}"
REFUSED = "The target service broker failed the transmission: {}"
# A route address whose scheme is not postgresql:// is resolved by the entry point of that
# name in this group: the package registers `airflow` (an Airflow connection), whose reading
# needs Airflow, which the engine never imports.
RESOLVERS = "airflow_broker.route_addresses"


@dataclass(frozen=True)
class FarBroker:
    """Where a route address leads: a libpq DSN and the far broker's schema."""

    dsn: str
    schema: str


def resolve_address(address: str) -> FarBroker:
    """``postgresql://...[?broker_schema=name]``, or ``scheme://name`` resolved by the entry
    point ``scheme`` of :data:`RESOLVERS`: ``airflow://conn_id`` is an Airflow connection of
    type ``broker`` or ``postgres``, read through Airflow's connections."""
    parts = urlsplit(address)
    scheme = parts.scheme.lower()
    if scheme not in ("postgresql", "postgres"):
        (resolver,) = entry_points(group=RESOLVERS, name=scheme) or [None]
        if resolver is None:
            raise AddressError(f"{redact(address)}: not a postgresql:// or airflow:// address")
        try:
            resolve = resolver.load()
        except ImportError as exc:  # Airflow is an optional extra
            raise AddressError(
                f"{redact(address)}: {scheme}:// addresses need a package that is not "
                f"installed ({exc})") from None
        try:
            dsn, schema = resolve(address[len(scheme) + len("://"):])
        except Exception as exc:  # Airflow raises its own not-found types per version
            raise AddressError(redact(f"{address}: {exc}")) from None
        return FarBroker(dsn, schema)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = next((v for k, v in query if k == "broker_schema"), DEFAULT_SCHEMA)
    rest = [(k, v) for k, v in query if k != "broker_schema"]
    # %20 for spaces: libpq does not read '+' as one (options=-c%20name%3Dvalue).
    return FarBroker(urlunsplit(parts._replace(query=urlencode(rest, quote_via=quote))), schema)


def address_of(dsn: str, schema: str | None = None) -> str:
    """The route address (a postgresql:// URI) of the broker at ``dsn``, which may also be a
    key=value connection string; ``schema`` when the broker's schema is not "broker"."""
    params = {k: str(v) for k, v in conninfo_to_dict(dsn).items()}
    user = quote(params.pop("user", ""), safe="")
    password = params.pop("password", "")
    dbname = quote(params.pop("dbname", ""), safe="")
    netloc = user + (f":{quote(password, safe='')}" if password else "") + "@"
    if params.get("host") and not params["host"].startswith("/"):
        # A socket directory stays in the query; a host name goes in the authority.
        netloc += params.pop("host") + (f":{params.pop('port')}" if "port" in params else "")
    if schema is not None:
        params["broker_schema"] = schema
    query = f"?{urlencode(params, quote_via=quote)}" if params else ""
    return f"postgresql://{netloc}/{dbname}{query}"


@dataclass
class Outcome:
    outcome: str
    code: int | None = None
    description: str | None = None
    status: str | None = None
    peer_flag: bool = False


@dataclass
class StepResult:
    sent: int = 0
    acknowledged: int = 0
    refused: int = 0
    held: int = 0
    # The bodies of what was sent, in bytes.
    body_bytes: int = 0


# A backlog is delivered in growing steps: each full step doubles the next one, up to this many
# times the batch size, while the bodies of the full step came to less than GROWTH_BYTES (so a
# step of large bodies never grows past about twice that). Every step reads past the rows the
# earlier ones removed, until VACUUM takes them away: with a backlog, steps of 1,000 spent more
# on that than on the messages, and fell further behind the more there was to deliver.
MAX_GROWTH = 8
GROWTH_BYTES = 16 * 1024 * 1024


def next_step_size(size: int, batch_size: int, sent: int, body_bytes: int) -> int:
    """The size of the step after one of ``size`` that sent ``sent`` messages with
    ``body_bytes`` of bodies: back to the batch size after a step that was not full."""
    if sent < size:
        return batch_size
    if body_bytes < GROWTH_BYTES:
        return min(2 * size, MAX_GROWTH * batch_size)
    return size


class Transport:
    """Delivers this broker's transmission queue to far brokers; see the module docstring.

    Several transports (one per broker worker) may run at once: each conversation is taken by
    one of them at a time.
    """

    def __init__(self, broker: Broker, *, batch_size: int = 1000,
                 connect_timeout: int = 5, statement_timeout: float = 60.0) -> None:
        self.broker = broker
        self.batch_size = batch_size
        self.connect_timeout = connect_timeout
        self.statement_timeout = statement_timeout
        # An open connection per address, with what the address resolved to when it was
        # opened: an airflow:// address is looked up again only to connect again, not for
        # every batch (a metadata database query, or a call to a paid secrets service).
        self._far: dict[str, tuple[FarBroker, psycopg.Connection[TupleRow]]] = {}
        self._lock = threading.Lock()
        self._outbound = broker.queries["outbound_transmissions"]
        self._identity = broker.queries["broker_instance_text"]
        self._apply = broker.queries["apply_transmission_outcomes"]

    def step(self, size: int | None = None) -> StepResult:
        """One batch of up to ``size`` messages (the batch size by default): send what is due
        and apply the answers. Returns what happened."""
        result = StepResult()
        with self._lock, self.broker.pool.connection() as conn, conn.transaction():
            rows = conn.execute(self._outbound, [size or self.batch_size]).fetchall()
            if not rows:
                return result
            result.body_bytes = sum(len(row[13]) for row in rows if row[13] is not None)
            identity = conn.execute(self._identity).fetchone()
            assert identity is not None
            me = str(identity[0])
            by_address: dict[str, list[TupleRow]] = {}
            for row in rows:
                by_address.setdefault(row[2], []).append(row)
            for address, batch in by_address.items():
                far_guid: str | None = None
                try:
                    outcomes, far_guid = self._push(address, me, batch)
                except (psycopg.OperationalError, AddressError, OSError) as exc:
                    reason = _reason(exc)
                    log.warning("transport: %s: %s", redact(address), reason)
                    outcomes = [Outcome("hold", status=UNREACHABLE.format(reason))] * len(batch)
                except psycopg.Error as exc:
                    # Reached, but the far broker failed the batch (an older schema there, a
                    # permission missing): nothing of it was committed.
                    reason = _reason(exc)
                    log.error("transport: %s refused a batch: %s", redact(address), reason)
                    outcomes = [Outcome("hold", status=REFUSED.format(reason))] * len(batch)
                conn.execute(self._apply, [
                    [r[0] for r in batch], [o.outcome for o in outcomes],
                    [o.code for o in outcomes], [o.description for o in outcomes],
                    [o.status for o in outcomes], [o.peer_flag for o in outcomes], far_guid,
                ])
                result.sent += len(batch)
                for o in outcomes:
                    if o.outcome == "ack":
                        result.acknowledged += 1
                    elif o.outcome == "error":
                        result.refused += 1
                    else:
                        result.held += 1
        if result.sent:
            log.debug("transport: %s", result)
        return result

    def run_until_idle(self, limit: int = 1000,
                       should_stop: Callable[[], bool] | None = None) -> StepResult:
        """Steps until nothing is due, ``limit`` steps have run or ``should_stop()``; each
        full step makes the next one larger (MAX_GROWTH, GROWTH_BYTES)."""
        total = StepResult()
        size = self.batch_size
        for _ in range(limit):
            if should_stop is not None and should_stop():
                break
            r = self.step(size)
            total.sent += r.sent
            total.acknowledged += r.acknowledged
            total.refused += r.refused
            total.held += r.held
            total.body_bytes += r.body_bytes
            if r.sent < size or r.held:
                break
            size = next_step_size(size, self.batch_size, r.sent, r.body_bytes)
        return total

    def _connection(self, address: str) -> tuple[FarBroker, psycopg.Connection[TupleRow]]:
        known = self._far.get(address)
        if known is not None and usable(known[1]):
            return known
        if known is not None:
            # The far server ended it while it sat idle (a restart, a failover): a new one,
            # with the address resolved again.
            known[1].close()
        far = resolve_address(address)
        conn = psycopg.connect(
            far.dsn, autocommit=True, connect_timeout=self.connect_timeout,
            application_name=f"{self.broker.application_name}-transport")
        # A far server that hangs must not hold this broker's conversations for ever.
        conn.execute(self.broker.queries["statement_timeout"],
                     [f"{int(self.statement_timeout * 1000)}ms"])
        self._far[address] = (far, conn)
        return far, conn

    def _push(self, address: str, me: str,
              batch: Sequence[TupleRow]) -> tuple[list[Outcome], str]:
        far, conn = self._connection(address)
        try:
            return self._accept(conn, far.schema, me, batch)
        except psycopg.OperationalError:
            # A connection that broke since its last use (the far server restarted, or its
            # credentials were rotated) gets one fresh try, with the address resolved again.
            self._far.pop(address, None)
            conn.close()
            far, conn = self._connection(address)
            return self._accept(conn, far.schema, me, batch)

    def _accept(self, conn: psycopg.Connection[TupleRow], schema: str, me: str,
                batch: Sequence[TupleRow]) -> tuple[list[Outcome], str]:
        queries = Queries(schema)
        (_tid, _handle, _address, conversation_ids, sender_is_initiator, from_services,
         to_services, to_instances, contracts, lifetimes, flags, seqs, types,
         bodies) = (list(column) for column in zip(*batch, strict=True))
        checked_as, problems = self._verdicts(conn, queries, types, bodies)
        with conn.transaction():
            rows = conn.execute(
                queries["accept_transmissions"],
                [me, conversation_ids, sender_is_initiator, from_services, to_services,
                 to_instances, contracts, lifetimes, flags, seqs, types,
                 [bytes(b) if b is not None else None for b in bodies], checked_as, problems],
            ).fetchall()
        if len(rows) != len(batch):
            raise psycopg.DataError(f"the far broker answered {len(rows)} of {len(batch)}")
        far_guid = str(rows[0][5]) if rows else ""
        return [Outcome(r[0], r[1], r[2], r[3], bool(r[4])) for r in rows], far_guid

    def _verdicts(self, conn: psycopg.Connection[TupleRow], queries: Queries,
                  types: list[Any], bodies: list[Any]) -> tuple[list[str | None],
                                                                list[str | None]]:
        """XML checks as the far broker's message types define them (lxml, here)."""
        infos: dict[str, MessageTypeInfo] = {}
        names = sorted({t for t in types if t is not None})
        with conn.transaction():
            for name, kind, collection, schemas in conn.execute(
                    queries["xml_message_types"], [names]):
                infos[name] = MessageTypeInfo(name, kind, collection, tuple(schemas or ()))
        checked: list[str | None] = []
        problems: list[str | None] = []
        for name, body in zip(types, bodies, strict=True):
            info = infos.get(name)
            if info is None or not body:
                checked.append(None)
                problems.append(None)
            else:
                checked.append(info.checked_as)
                problems.append(verdict(info, bytes(body)))
        return checked, problems

    def close(self) -> None:
        for _far, conn in self._far.values():
            conn.close()
        self._far.clear()


def _reason(exc: BaseException) -> str:
    """The first line of a driver error, which libpq lets quote a connection string: it goes
    into logs and transmission_status."""
    text = (exc.message if isinstance(exc, BrokerError) else str(exc)).strip().splitlines()
    return redact(text[0]) if text else type(exc).__name__
