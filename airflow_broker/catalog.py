"""Catalog statements: CREATE / ALTER / DROP of message types, XML schema collections,
contracts, queues, services and routes, and the broker's own settings (spec 2-5, 21)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Mapping, Sequence

from lxml import etree

from airflow_broker.errors import InvalidXmlSchema
from airflow_broker.permissions import PermissionStatements
from airflow_broker.validation import compile_schema


class CatalogStatements(PermissionStatements):
    __slots__ = ()

    def create_message_type(
        self, name: str, validation: str = "NONE", *, schema_collection: str | None = None,
        authorization: str | None = None,
    ) -> int:
        """CREATE MESSAGE TYPE; validation is NONE, EMPTY, WELL_FORMED_XML or VALID_XML (with
        ``schema_collection``)."""
        q = self._runner.function("create_message_type", 3, ["text", "text", "text"])
        result: int = self._runner.scalar(q, [name, validation, schema_collection])
        self._authorize(f"MESSAGE TYPE::{name}", authorization)
        self._runner.shared.forget_message_types()
        return result

    def _authorize(self, securable: str, owner: str | None) -> None:
        """CREATE ... AUTHORIZATION owner: the object is created by the login, then given."""
        if owner is not None:
            self.alter_authorization(securable, owner)

    def alter_message_type(
        self, name: str, validation: str, *, schema_collection: str | None = None
    ) -> None:
        runner = self._runner
        runner.run(runner.function("alter_message_type", 3, ["text", "text", "text"]),
                   [name, validation, schema_collection])
        self._runner.shared.forget_message_types()

    def drop_message_type(self, name: str) -> None:
        self._runner.run(self._runner.function("drop_message_type", 1, ["text"]), [name])
        self._runner.shared.forget_message_types()

    def create_xml_schema_collection(self, name: str, schemas: Sequence[str]) -> int:
        """CREATE XML SCHEMA COLLECTION from XSD documents, each checked to be a valid schema."""
        for xsd in schemas:
            try:
                compile_schema(xsd)
            except (etree.XMLSchemaParseError, etree.XMLSyntaxError) as exc:
                raise InvalidXmlSchema(f"The XML schema is not valid: {exc}") from None
        q = self._runner.function("create_xml_schema_collection", 2, ["text", "text[]"])
        result: int = self._runner.scalar(q, [name, list(schemas)])
        return result

    def drop_xml_schema_collection(self, name: str) -> None:
        self._runner.run(self._runner.function("drop_xml_schema_collection", 1, ["text"]), [name])

    def create_contract(
        self, name: str, message_types: Mapping[str, str] | Iterable[tuple[str, str]], *,
        authorization: str | None = None,
    ) -> int:
        """CREATE CONTRACT; ``message_types`` maps each message type to INITIATOR, TARGET or
        ANY (a list of pairs may repeat a type, which SQL Server rejects with 8403)."""
        pairs = list(message_types.items() if isinstance(message_types, Mapping) else message_types)
        q = self._runner.function("create_contract", 3, ["text", "text[]", "text[]"])
        result: int = self._runner.scalar(q, [name, [t for t, _ in pairs], [d for _, d in pairs]])
        self._authorize(f"CONTRACT::{name}", authorization)
        return result

    def drop_contract(self, name: str) -> None:
        self._runner.run(self._runner.function("drop_contract", 1, ["text"]), [name])

    def create_queue(
        self,
        name: str,
        *,
        status: bool = True,
        retention: bool = False,
        activation_status: bool | None = None,
        activation_procedure: str | None = None,
        max_queue_readers: int | None = None,
        execute_as: str | None = None,
        poison_message_handling: bool = True,
        schema: str = "public",
        authorization: str | None = None,
    ) -> int:
        """CREATE QUEUE; also creates the read-only view ``schema.name`` over its messages."""
        q = self._runner.function(
            "create_queue", 9,
            ["text", "boolean", "boolean", "boolean", "text", "integer", "text", "boolean", "text"],
        )
        result: int = self._runner.scalar(q, [
            name, status, retention, activation_status, activation_procedure,
            max_queue_readers, execute_as, poison_message_handling, schema,
        ])
        self._authorize(f"QUEUE::{schema}.{name}", authorization)
        return result

    def alter_queue(
        self,
        name: str,
        *,
        status: bool | None = None,
        retention: bool | None = None,
        activation_status: bool | None = None,
        activation_procedure: str | None = None,
        max_queue_readers: int | None = None,
        execute_as: str | None = None,
        poison_message_handling: bool | None = None,
        drop_activation: bool = False,
    ) -> None:
        """ALTER QUEUE; settings left as None keep their value."""
        q = self._runner.function(
            "alter_queue", 9,
            ["text", "boolean", "boolean", "boolean", "text", "integer", "text", "boolean",
             "boolean"],
        )
        self._runner.run(q, [
            name, status, retention, activation_status, activation_procedure,
            max_queue_readers, execute_as, poison_message_handling, drop_activation,
        ])

    def tune_queue(
        self,
        name: str,
        *,
        activation_ramp_interval: dt.timedelta | None = None,
        activation_min_readers: int | None = None,
        poison_threshold: int | None = None,
    ) -> None:
        """Settings beyond SQL Server: the activation ramp-up interval (SQL Server: 5 s), a
        floor of activated readers while messages wait (SQL Server: 0), and how many
        consecutive rolled-back receiving transactions disable the queue (SQL Server: 5)."""
        q = self._runner.function("tune_queue", 4, ["text", "interval", "integer", "integer"])
        self._runner.run(
            q, [name, activation_ramp_interval, activation_min_readers, poison_threshold])

    def drop_queue(self, name: str) -> None:
        self._runner.run(self._runner.function("drop_queue", 1, ["text"]), [name])

    def create_service(self, name: str, queue_name: str, contracts: Sequence[str] = (), *,
                       authorization: str | None = None) -> int:
        """CREATE SERVICE on a queue, target for ``contracts`` (none: it can only initiate).
        ``authorization`` makes a role its owner, whose SEND permissions decide where the
        service's dialogs may go."""
        q = self._runner.function("create_service", 3, ["text", "text", "text[]"])
        result: int = self._runner.scalar(q, [name, queue_name, list(contracts)])
        self._authorize(f"SERVICE::{name}", authorization)
        return result

    def alter_service(
        self,
        name: str,
        *,
        queue_name: str | None = None,
        add_contracts: Sequence[str] = (),
        drop_contracts: Sequence[str] = (),
    ) -> None:
        q = self._runner.function("alter_service", 4, ["text", "text", "text[]", "text[]"])
        self._runner.run(q, [name, queue_name, list(add_contracts), list(drop_contracts)])

    def drop_service(self, name: str) -> None:
        self._runner.run(self._runner.function("drop_service", 1, ["text"]), [name])

    def create_event_notification(
        self,
        name: str,
        queue_name: str,
        events: Sequence[str],
        service_name: str,
        broker_instance: str = "current database",
    ) -> int:
        """CREATE EVENT NOTIFICATION name ON QUEUE queue FOR events TO SERVICE service.

        ``events``: QUEUE_ACTIVATION and/or BROKER_QUEUE_DISABLED. The service must accept the
        contract http://schemas.microsoft.com/SQL/Notifications/PostEventNotification."""
        runner = self._runner
        q = runner.function("create_event_notification", 5,
                            ["text", "text", "text[]", "text", "text"])
        result: int = runner.scalar(q, [name, queue_name, list(events), service_name,
                                        broker_instance])
        return result

    def drop_event_notification(self, name: str, queue_name: str) -> None:
        runner = self._runner
        runner.run(runner.function("drop_event_notification", 2, ["text", "text"]),
                   [name, queue_name])

    def create_route(
        self,
        name: str,
        address: str,
        *,
        service_name: str | None = None,
        broker_instance: str | None = None,
        lifetime: int | None = None,
        mirror_address: str | None = None,
    ) -> int:
        """CREATE ROUTE name WITH SERVICE_NAME, BROKER_INSTANCE, LIFETIME (seconds), ADDRESS.

        ``address``: 'LOCAL', 'TRANSPORT', a PostgreSQL URI (add ``broker_schema=name`` to its
        query when the far broker's schema is not "broker"), or ``airflow://conn_id`` to keep
        credentials in an Airflow connection. A route without SERVICE_NAME matches every
        service."""
        runner = self._runner
        q = runner.function("create_route", 6, ["text", "text", "text", "text", "integer", "text"])
        result: int = runner.scalar(q, [name, address, service_name, broker_instance, lifetime,
                                        mirror_address])
        return result

    def alter_route(
        self,
        name: str,
        *,
        address: str | None = None,
        service_name: str | None = None,
        broker_instance: str | None = None,
        lifetime: int | None = None,
        mirror_address: str | None = None,
    ) -> None:
        """ALTER ROUTE: settings left None keep their value; '' removes SERVICE_NAME,
        BROKER_INSTANCE or MIRROR_ADDRESS; a LIFETIME counts from now."""
        runner = self._runner
        q = runner.function("alter_route", 6, ["text", "text", "text", "text", "integer", "text"])
        runner.run(q, [name, address, service_name, broker_instance, lifetime, mirror_address])

    def drop_route(self, name: str) -> None:
        self._runner.run(self._runner.function("drop_route", 1, ["text"]), [name])

    def alter_broker(self, option: str) -> uuid.UUID:
        """ALTER DATABASE ... SET ENABLE_BROKER | DISABLE_BROKER | NEW_BROKER |
        ERROR_BROKER_CONVERSATIONS, for this broker schema; returns its broker instance.

        NEW_BROKER and ERROR_BROKER_CONVERSATIONS fail every conversation (Error -9719 here,
        -9720 to peers in other brokers); NEW_BROKER also gives the broker a new instance id.
        Nothing waits for an exclusive lock, unlike SQL Server's ENABLE_BROKER."""
        runner = self._runner
        result: uuid.UUID = runner.scalar(runner.function("alter_broker", 1, ["text"]), [option])
        return result
