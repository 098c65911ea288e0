"""BrokerHook: the broker behind an Airflow connection (type ``broker``, or ``postgres``).

Tasks get the engine (:class:`airflow_broker.Broker`) from it; triggers get psycopg
``AsyncConnection``\\ s, so nothing in the triggerer blocks its event loop. Messages travel
between tasks (XCom) and from triggers (events) as JSON dicts: see :func:`message_to_dict`.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from airflow.sdk import BaseHook
from psycopg.conninfo import make_conninfo

from airflow_broker import Broker, Message, Transaction, decode_body
from airflow_broker._statements import runner_of
from airflow_broker.migrations import pending
from airflow_broker.queries import DEFAULT_SCHEMA

if TYPE_CHECKING:
    from airflow.sdk import Connection
    from sqlalchemy.engine import Engine


# Connection extras that are libpq parameters and go into the DSN as they are.
LIBPQ_EXTRAS = frozenset({
    "sslmode", "sslcert", "sslkey", "sslrootcert", "sslcrl", "sslpassword", "connect_timeout",
    "application_name", "options", "target_session_attrs", "keepalives", "keepalives_idle",
    "keepalives_interval", "keepalives_count", "gssencmode", "passfile", "service",
    "channel_binding", "load_balance_hosts",
})

# The columns of broker.airflow_inbox that rebuild a Message, in Message's field order.
MESSAGE_COLUMNS = (
    "status", "priority", "queuing_order", "conversation_group_id", "conversation_handle",
    "message_sequence_number", "service_name", "service_id", "service_contract_name",
    "service_contract_id", "message_type_name", "message_type_id", "validation",
    "message_body", "message_id", "attempts",
)
INBOX_COLUMNS = ("inbox_id", "consumer", "queue_name", "state", *MESSAGE_COLUMNS)


@dataclass(frozen=True)
class BrokerConnectionInfo:
    """What a connection resolves to: a libpq DSN and the broker schema."""

    dsn: str
    schema: str

    @classmethod
    def from_connection(cls, conn: Connection, schema: str | None = None) -> BrokerConnectionInfo:
        extra = dict(conn.extra_dejson or {})
        # Connection forms have stored custom fields both with and without this prefix.
        prefix = f"extra__{BrokerHook.conn_type}__"
        for key, value in list(extra.items()):
            if key.startswith(prefix) and value not in (None, ""):
                extra.setdefault(key[len(prefix):], value)
        params: dict[str, Any] = {k: v for k, v in extra.items()
                                  if k in LIBPQ_EXTRAS and v not in (None, "")}
        if conn.host:
            params["host"] = conn.host
        if conn.port:
            params["port"] = conn.port
        if conn.login:
            params["user"] = conn.login
        if conn.password:
            params["password"] = conn.password
        if conn.schema:
            # The connection form's "Database" (Airflow keeps it in the schema field).
            params["dbname"] = conn.schema
        params.setdefault("application_name", "airflow-broker")
        broker_schema = schema or extra.get("broker_schema") or DEFAULT_SCHEMA
        return cls(make_conninfo("", **params), str(broker_schema))


def message_to_dict(
    message: Message,
    *,
    queue_name: str | None = None,
    inbox_id: int | None = None,
    consumer: str | None = None,
) -> dict[str, Any]:
    """A received message as JSON for XCom and trigger events: ids as strings, the body both
    as text (None when it is not text) and, exactly, as base64."""
    body = message.message_body
    try:
        text = decode_body(body)
    except UnicodeDecodeError:
        text = None
    return {
        "queue_name": queue_name,
        "inbox_id": inbox_id,
        "consumer": consumer,
        "message_id": str(message.message_id),
        "conversation_handle": str(message.conversation_handle),
        "conversation_group_id": str(message.conversation_group_id),
        "message_sequence_number": message.message_sequence_number,
        "message_type_name": message.message_type_name,
        "service_name": message.service_name,
        "service_id": message.service_id,
        "service_contract_name": message.service_contract_name,
        "service_contract_id": message.service_contract_id,
        "message_type_id": message.message_type_id,
        "validation": message.validation,
        "priority": message.priority,
        "queuing_order": message.queuing_order,
        "status": message.status,
        "attempts": message.attempts,
        "body": text,
        "body_base64": None if body is None else base64.b64encode(body).decode("ascii"),
    }


def message_from_dict(data: Mapping[str, Any]) -> Message:
    """The Message behind :func:`message_to_dict` (``Message.xml()``, ``.json()`` work on it)."""
    encoded = data.get("body_base64")
    return Message(
        status=int(data.get("status", 1)),
        priority=int(data["priority"]),
        queuing_order=int(data["queuing_order"]),
        conversation_group_id=uuid.UUID(str(data["conversation_group_id"])),
        conversation_handle=uuid.UUID(str(data["conversation_handle"])),
        message_sequence_number=int(data["message_sequence_number"]),
        service_name=str(data["service_name"]),
        service_id=int(data["service_id"]),
        service_contract_name=str(data["service_contract_name"]),
        service_contract_id=int(data["service_contract_id"]),
        message_type_name=str(data["message_type_name"]),
        message_type_id=int(data["message_type_id"]),
        validation=str(data["validation"]),
        message_body=None if encoded is None else base64.b64decode(encoded),
        message_id=uuid.UUID(str(data["message_id"])),
        attempts=int(data.get("attempts") or 0),
    )


def inbox_row_to_dict(row: Sequence[Any]) -> dict[str, Any]:
    """A row of INBOX_COLUMNS as the JSON dict of :func:`message_to_dict`."""
    inbox_id, consumer, queue_name, _state = row[:4]
    return message_to_dict(Message(*row[4:]), queue_name=queue_name, inbox_id=inbox_id,
                           consumer=consumer)


def task_consumer(dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
    """The inbox consumer of one task instance: every try of it shares the key."""
    return f"task:{dag_id}/{run_id}/{task_id}/{map_index}"


def _payloads(items: Iterable[Any]) -> list[Mapping[str, Any]]:
    """Message dicts from message dicts, lists of them, or asset events whose payload is one."""
    found: list[Mapping[str, Any]] = []
    for item in items:
        extra = getattr(item, "extra", None)
        if isinstance(extra, Mapping) and "payload" in extra:
            item = extra["payload"]
        if isinstance(item, Mapping):
            if "message_id" in item:
                found.append(item)
            elif isinstance(item.get("messages"), list):
                found.extend(_payloads(item["messages"]))
        elif isinstance(item, list | tuple):
            found.extend(_payloads(item))
    return found


class BrokerHook(BaseHook):
    """Access to the Service Broker behind an Airflow connection.

    The connection is of type ``broker`` (host, port, login, password, database and the
    ``broker_schema`` extra) or an ordinary ``postgres`` connection (``broker_schema`` in its
    extras, default ``broker``). libpq options such as ``sslmode`` may be given as extras.

    :param broker_conn_id: the Airflow connection
    :param broker_schema: overrides the connection's broker schema
    :param max_connections: size of the engine's connection pool
    """

    conn_name_attr = "broker_conn_id"
    default_conn_name = "broker_default"
    conn_type = "broker"
    hook_name = "Service Broker on PostgreSQL"

    def __init__(
        self,
        broker_conn_id: str = default_conn_name,
        *,
        broker_schema: str | None = None,
        max_connections: int = 4,
        poll_interval: float = 0.5,
    ) -> None:
        super().__init__()
        self.broker_conn_id = broker_conn_id
        self.broker_schema = broker_schema
        self.max_connections = max_connections
        self.poll_interval = poll_interval
        self._broker: Broker | None = None
        self._info: BrokerConnectionInfo | None = None

    # Connection details

    def get_conn_info(self) -> BrokerConnectionInfo:
        if self._info is None:
            conn = self.get_connection(self.broker_conn_id)
            self._info = BrokerConnectionInfo.from_connection(conn, self.broker_schema)
        return self._info

    async def aget_conn_info(self) -> BrokerConnectionInfo:
        """The same, without blocking the event loop (for triggers)."""
        if self._info is None:
            conn = await self.aget_connection(self.broker_conn_id)
            self._info = BrokerConnectionInfo.from_connection(conn, self.broker_schema)
        return self._info

    @property
    def schema(self) -> str:
        return self.get_conn_info().schema

    # The engine

    def get_broker(self) -> Broker:
        """The engine on this connection, created once per hook (``close()`` ends it)."""
        if self._broker is None:
            info = self.get_conn_info()
            self._broker = Broker(
                info.dsn,
                schema=info.schema,
                min_connections=1,
                max_connections=self.max_connections,
                poll_interval=self.poll_interval,
                application_name=f"airflow-broker {self.broker_conn_id}"[:63],
            )
        return self._broker

    def get_conn(self) -> Broker:
        return self.get_broker()

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """A broker transaction: commits when the block ends, rolls back when it raises."""
        with self.get_broker().transaction() as tx:
            yield tx

    def close(self) -> None:
        if self._broker is not None:
            self._broker.close()
            self._broker = None

    def __enter__(self) -> BrokerHook:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get_sqlalchemy_engine(self, engine_kwargs: dict[str, Any] | None = None) -> Engine:
        """An SQLAlchemy engine (psycopg 3 driver) on the same database, for your own tables."""
        from sqlalchemy import create_engine

        dsn = self.get_conn_info().dsn
        return create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn),
                             **(engine_kwargs or {}))

    async def aconnect(self, *, autocommit: bool = True) -> psycopg.AsyncConnection[Any]:
        """A new psycopg AsyncConnection (the caller closes it): what triggers use."""
        info = await self.aget_conn_info()
        return await psycopg.AsyncConnection.connect(info.dsn, autocommit=autocommit)

    def test_connection(self) -> tuple[bool, str]:
        """Connects, and checks that the broker schema is installed and current."""
        try:
            info = self.get_conn_info()
            with psycopg.connect(info.dsn, autocommit=True, connect_timeout=10) as conn:
                row = conn.execute("SELECT current_setting('server_version')").fetchone()
                version = row[0] if row else "?"
            missing = pending(info.dsn, info.schema)
        except Exception as exc:
            return False, f"cannot connect: {exc}"
        if missing:
            return False, (f"connected to PostgreSQL {version}, but broker schema "
                           f"{info.schema!r} needs {len(missing)} file(s) applied "
                           f"(run `airflow-broker install`): {', '.join(missing[:5])}")
        return True, f"connected to PostgreSQL {version}; broker schema {info.schema!r} is current"

    # The Airflow inbox (broker.airflow_inbox): messages received for a consumer and kept
    # until the consumer has used them.

    def claimed(self, consumer: str) -> list[dict[str, Any]]:
        """What ``consumer`` holds in the inbox, oldest first."""
        broker = self.get_broker()
        with broker.pool.connection() as conn:
            rows = conn.execute(broker.queries["inbox_claimed"], [consumer]).fetchall()
        return [inbox_row_to_dict(row) for row in rows]

    def claim(
        self,
        consumer: str,
        queue_name: str,
        *,
        top: int | None = None,
        conversation_handle: uuid.UUID | str | None = None,
        conversation_group_id: uuid.UUID | str | None = None,
        message_type_names: Sequence[str] | None = None,
        dag_id: str | None = None,
        run_id: str | None = None,
    ) -> list[dict[str, Any]]:
        """RECEIVE into the inbox for ``consumer``, in one transaction: the messages leave the
        queue only when they are safely in the inbox."""
        params = [consumer, queue_name, top,
                  None if conversation_handle is None else str(conversation_handle),
                  None if conversation_group_id is None else str(conversation_group_id),
                  list(message_type_names) if message_type_names else None, dag_id, run_id]
        with self.transaction() as tx:
            runner = runner_of(tx)
            rows = runner.run(runner.queries["inbox_claim"], params)
        return [inbox_row_to_dict(row) for row in rows]

    def peek(
        self,
        queue_name: str,
        *,
        limit: int = 1,
        conversation_handle: uuid.UUID | str | None = None,
        conversation_group_id: uuid.UUID | str | None = None,
        message_type_names: Sequence[str] | None = None,
    ) -> list[Message]:
        """Messages RECEIVE could take now, left where they are."""
        params = [queue_name, limit,
                  None if conversation_handle is None else str(conversation_handle),
                  None if conversation_group_id is None else str(conversation_group_id),
                  list(message_type_names) if message_type_names else None]
        with self.transaction() as tx:
            runner = runner_of(tx)
            return [Message(*row) for row in runner.run(runner.queries["peek"], params)]

    def queue_state(self, queue_name: str) -> dict[str, Any]:
        """Whether the queue is enabled, and why not (``disabled_reason``: ADMIN or POISON)."""
        with self.transaction() as tx:
            cursor = tx.conn.execute(runner_of(tx).queries["airflow_queue_state"], [queue_name])
            names = [d.name for d in cursor.description or ()]
            row = cursor.fetchone()
        return dict(zip(names, row or (), strict=False))

    def ack(self, items: Iterable[Any]) -> int:
        """Removes messages from the inbox once they are used: message dicts (as XCom or a
        trigger event carries them) or asset events. Returns how many were removed."""
        by_consumer: dict[str, list[int]] = {}
        for payload in _payloads(items):
            if payload.get("inbox_id") is not None and payload.get("consumer"):
                by_consumer.setdefault(str(payload["consumer"]), []).append(
                    int(payload["inbox_id"]))
        removed = 0
        with self.transaction() as tx:
            runner = runner_of(tx)
            for consumer, ids in by_consumer.items():
                removed += int(runner.scalar(runner.queries["inbox_ack"], [consumer, ids]) or 0)
        return removed

    def ack_consumer(self, consumer: str) -> int:
        """Removes everything ``consumer`` holds."""
        with self.transaction() as tx:
            runner = runner_of(tx)
            return int(runner.scalar(runner.queries["inbox_ack_consumer"], [consumer]) or 0)

    @contextmanager
    def consume(self, items: Iterable[Any]) -> Iterator[tuple[Transaction, list[Message]]]:
        """Processes inbox messages exactly once: in one transaction, marks them consumed in the
        inbox and hands them to the block with the transaction, so replies you SEND, the
        conversations you END and your own tables commit together with their removal. A
        message that an earlier, committed transaction consumed is left out (a second asset
        event for it, a retried task). A message that is not in the inbox at all raises
        BrokerError 50120 before the block runs, and nothing is consumed.

        >>> with hook.consume(triggering_asset_events[asset]) as (tx, messages):
        ...     for message in messages:
        ...         tx.send(message.conversation_handle, "Ack", "<ok/>")
        """
        payloads: dict[tuple[str, int], Mapping[str, Any]] = {}
        for payload in _payloads(items):
            if payload.get("inbox_id") is not None and payload.get("consumer"):
                payloads.setdefault((str(payload["consumer"]), int(payload["inbox_id"])),
                                    payload)
        with self.transaction() as tx:
            consumed: set[int] = set()
            if payloads:
                keys = sorted(payloads, key=lambda key: key[1])
                runner = runner_of(tx)
                rows = runner.run(runner.queries["inbox_consume"],
                                  [[consumer for consumer, _ in keys],
                                   [inbox_id for _, inbox_id in keys]])
                consumed = {int(row[0]) for row in rows}
            skipped = len(payloads) - len(consumed)
            if skipped:
                self.log.info("%d message(s) were consumed by an earlier transaction and are "
                              "left out", skipped)
            yield tx, [message_from_dict(payload) for (_, inbox_id), payload
                       in sorted(payloads.items(), key=lambda item: item[0][1])
                       if inbox_id in consumed]


def messages_from_events(items: Iterable[Any]) -> list[Message]:
    """Messages carried by asset events (``triggering_asset_events[asset]``), by message
    dicts, or by a sensor's XCom, as :class:`airflow_broker.Message` objects."""
    return [message_from_dict(p) for p in _payloads(items)]
