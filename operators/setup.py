"""Declarative broker setup: message types, XML schema collections, contracts, queues,
services, event notifications and routes from a dict or YAML, applied idempotently
(``apply_spec``, and BrokerSetupOperator, which runs it in a task).

Objects that exist and match are left alone; queues, services, message types and routes that
differ are altered; event notifications are dropped and created again. Contracts and XML schema
collections cannot be altered (SQL Server has no ALTER CONTRACT either), so a difference there
is an error that names the object. Everything happens in one transaction.

Spec::

    message_types:
      - {name: //Trading/TradeEntry, validation: WELL_FORMED_XML}
    contracts:
      - name: //Trading/TradeContract
        message_types: {//Trading/TradeEntry: INITIATOR, //Trading/TradeAck: TARGET}
    queues:
      - {name: TraderQueue, retention: false, poison_threshold: 5}
    services:
      - {name: //Trading/TraderService, queue_name: TraderQueue, contracts: []}
    event_notifications:
      - {name: alerts, queue_name: TraderQueue, events: [BROKER_QUEUE_DISABLED],
         service_name: //Alerts/Service}
    routes:
      - {name: brokerage, service_name: //Trading/BrokerageService,
         address: "airflow://brokerage_db"}

Each section may also be a mapping from name to settings.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import yaml

from airflow_broker import Transaction
from airflow_broker._statements import runner_of
from airflow_broker.errors import BrokerError, InvalidSpec
from airflow_broker.operators._base import BrokerBaseOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

SECTIONS = ("xml_schema_collections", "message_types", "contracts", "queues", "services",
            "event_notifications", "routes")
ROUTE_SETTINGS = ("address", "service_name", "broker_instance", "mirror_address")
VALIDATIONS = ("NONE", "EMPTY", "WELL_FORMED_XML", "VALID_XML")
DIRECTIONS = ("INITIATOR", "TARGET", "ANY")
QUEUE_SETTINGS = ("status", "retention", "activation_status", "activation_procedure",
                  "max_queue_readers", "execute_as", "poison_message_handling")
QUEUE_TUNING = ("poison_threshold", "activation_min_readers", "activation_ramp_interval")


# The spec is malformed, or asks for a change the broker cannot make (error 50123).
SpecError = InvalidSpec


@dataclass
class SetupReport:
    created: list[str] = field(default_factory=list)
    altered: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, list[str]]:
        return {"created": self.created, "altered": self.altered, "unchanged": self.unchanged}


def load_spec(spec: Mapping[str, Any] | str | None) -> dict[str, list[dict[str, Any]]]:
    """The spec as lists of objects per section; a string is YAML text."""
    if spec is None:
        return {s: [] for s in SECTIONS}
    raw: Any = yaml.safe_load(spec) if isinstance(spec, str) else spec
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise SpecError("a broker spec is a mapping of sections")
    unknown = set(raw) - set(SECTIONS)
    if unknown:
        raise SpecError(f"unknown section(s) {sorted(unknown)}; known: {list(SECTIONS)}")
    result: dict[str, list[dict[str, Any]]] = {}
    for section in SECTIONS:
        entries = raw.get(section) or []
        if isinstance(entries, Mapping):
            entries = [{"name": name, **(settings or {})} for name, settings in entries.items()]
        if not isinstance(entries, list):
            raise SpecError(f"section {section!r} must be a list or a mapping")
        for entry in entries:
            if not isinstance(entry, Mapping) or not entry.get("name"):
                raise SpecError(f"every entry of {section!r} needs a name: {entry!r}")
        result[section] = [dict(e) for e in entries]
    return result


class _Catalog:
    """What the broker already holds, read in the setup transaction."""

    def __init__(self, tx: Transaction) -> None:
        self.tx = tx

    def rows(self, query: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        runner = runner_of(self.tx)
        return runner.run(runner.queries[query], params or [])

    def xml_collection(self, name: str) -> list[str] | None:
        rows = self.rows("spec_xml_collection", [name])
        return list(rows[0][0]) if rows else None

    def message_type(self, name: str) -> tuple[str, str | None] | None:
        rows = self.rows("spec_message_type", [name])
        return (rows[0][0], rows[0][1]) if rows else None

    def contract(self, name: str) -> dict[str, str] | None:
        usages = self.rows("spec_contract", [name])
        if not usages:
            return None
        return {t: ("ANY" if i and g else "INITIATOR" if i else "TARGET") for t, i, g in usages}

    def queue(self, name: str) -> dict[str, Any] | None:
        rows = self.rows("spec_queue", [name])
        if not rows:
            return None
        keys = ("status", "retention", "activation_status", "activation_procedure",
                "max_queue_readers", "execute_as", "poison_message_handling",
                "poison_threshold", "activation_min_readers", "activation_ramp_interval",
                "schema")
        return dict(zip(keys, rows[0], strict=True))

    def queue_id(self, name: str) -> int | None:
        rows = self.rows("spec_queue_id", [name])
        return rows[0][0] if rows else None

    def service(self, name: str) -> tuple[int, set[str]] | None:
        rows = self.rows("spec_service", [name])
        if not rows:
            return None
        return rows[0][0], {c for _, c in rows if c is not None}

    def route(self, name: str) -> dict[str, Any] | None:
        rows = self.rows("spec_route", [name])
        return dict(zip(ROUTE_SETTINGS, rows[0], strict=True)) if rows else None

    def event_notification(self, name: str, queue_name: str) -> tuple[set[str], str, str] | None:
        rows = self.rows("spec_event_notification", [name, queue_name])
        if not rows:
            return None
        return {e.upper() for e in rows[0][0]}, rows[0][1], rows[0][2]


def _interval(value: Any) -> dt.timedelta | None:
    if value is None or isinstance(value, dt.timedelta):
        return value
    return dt.timedelta(seconds=float(value))


def apply_spec(tx: Transaction, spec: Mapping[str, Any] | str | None) -> SetupReport:
    """Creates or updates what ``spec`` declares, in ``tx``; returns what it did."""
    objects = load_spec(spec)
    catalog = _Catalog(tx)
    report = SetupReport()

    for entry in objects["xml_schema_collections"]:
        name, schemas = entry["name"], [str(s) for s in entry.get("schemas") or []]
        label = f"xml schema collection {name}"
        existing = catalog.xml_collection(name)
        if existing is None:
            tx.create_xml_schema_collection(name, schemas)
            report.created.append(label)
        elif existing != schemas:
            raise SpecError(f"{label} exists with other schemas; it cannot be altered "
                            "(drop it, or give the new version another name)")
        else:
            report.unchanged.append(label)

    for entry in objects["message_types"]:
        name = entry["name"]
        validation = str(entry.get("validation", "NONE")).upper()
        collection = entry.get("schema_collection")
        if validation not in VALIDATIONS:
            raise SpecError(f"message type {name}: validation must be one of {VALIDATIONS}")
        label = f"message type {name}"
        found = catalog.message_type(name)
        if found is None:
            tx.create_message_type(name, validation, schema_collection=collection)
            report.created.append(label)
        elif found != (validation, collection):
            tx.alter_message_type(name, validation, schema_collection=collection)
            report.altered.append(label)
        else:
            report.unchanged.append(label)

    for entry in objects["contracts"]:
        name = entry["name"]
        usages = entry.get("message_types") or {}
        if not isinstance(usages, Mapping):
            raise SpecError(f"contract {name}: message_types maps each type to "
                            f"one of {DIRECTIONS}")
        wanted = {str(t): str(d).upper() for t, d in usages.items()}
        if any(d not in DIRECTIONS for d in wanted.values()):
            raise SpecError(f"contract {name}: every direction must be one of {DIRECTIONS}")
        label = f"contract {name}"
        found_usages = catalog.contract(name)
        if found_usages is None:
            tx.create_contract(name, wanted)
            report.created.append(label)
        elif found_usages != wanted:
            raise SpecError(f"{label} exists with other message types ({found_usages}); "
                            "contracts cannot be altered: drop it or use a new name")
        else:
            report.unchanged.append(label)

    for entry in objects["queues"]:
        name = entry["name"]
        label = f"queue {name}"
        settings = {k: entry[k] for k in QUEUE_SETTINGS if k in entry}
        tuning = {k: entry[k] for k in QUEUE_TUNING if k in entry}
        if "activation_ramp_interval" in tuning:
            tuning["activation_ramp_interval"] = _interval(tuning["activation_ramp_interval"])
        current = catalog.queue(name)
        if current is None:
            tx.create_queue(name, schema=str(entry.get("schema", "public")), **settings)
            if tuning:
                tx.tune_queue(name, **tuning)
            report.created.append(label)
            continue
        changed = {k: v for k, v in settings.items() if current[k] != v}
        changed_tuning = {k: v for k, v in tuning.items() if current[k] != v}
        if changed:
            tx.alter_queue(name, **changed)
        if changed_tuning:
            tx.tune_queue(name, **changed_tuning)
        (report.altered if changed or changed_tuning else report.unchanged).append(label)

    for entry in objects["services"]:
        name = entry["name"]
        queue_name = entry.get("queue_name")
        if not queue_name:
            raise SpecError(f"service {name} needs a queue_name")
        contracts = [str(c) for c in entry.get("contracts") or []]
        label = f"service {name}"
        found_service = catalog.service(name)
        if found_service is None:
            tx.create_service(name, queue_name, contracts)
            report.created.append(label)
            continue
        current_queue_id, current_contracts = found_service
        queue_change = (None if catalog.queue_id(queue_name) == current_queue_id
                        else queue_name)
        add = [c for c in contracts if c not in current_contracts]
        drop = sorted(current_contracts - set(contracts))
        if queue_change is not None or add or drop:
            tx.alter_service(name, queue_name=queue_change, add_contracts=add,
                             drop_contracts=drop)
            report.altered.append(label)
        else:
            report.unchanged.append(label)

    for entry in objects["event_notifications"]:
        name = entry["name"]
        queue_name = entry.get("queue_name")
        service_name = entry.get("service_name")
        if not queue_name or not service_name:
            raise SpecError(f"event notification {name} needs queue_name and service_name")
        events = [str(e).upper() for e in entry.get("events") or ["BROKER_QUEUE_DISABLED"]]
        instance = str(entry.get("broker_instance", "current database"))
        label = f"event notification {name} on {queue_name}"
        found_notification = catalog.event_notification(name, queue_name)
        if found_notification == (set(events), service_name, instance):
            report.unchanged.append(label)
            continue
        if found_notification is not None:
            tx.drop_event_notification(name, queue_name)
        tx.create_event_notification(name, queue_name, events, service_name, instance)
        (report.altered if found_notification is not None else report.created).append(label)

    for entry in objects["routes"]:
        name = entry["name"]
        if not entry.get("address"):
            raise SpecError(f"route {name} needs an address")
        wanted_route = {k: entry.get(k) for k in ROUTE_SETTINGS}
        if wanted_route["broker_instance"] is not None:
            wanted_route["broker_instance"] = str(wanted_route["broker_instance"]).lower()
        label = f"route {name}"
        found_route = catalog.route(name)
        if found_route is None:
            tx.create_route(name, str(entry["address"]), lifetime=entry.get("lifetime"),
                            service_name=wanted_route["service_name"],
                            broker_instance=wanted_route["broker_instance"],
                            mirror_address=wanted_route["mirror_address"])
            report.created.append(label)
        elif found_route != wanted_route:
            # An empty string removes a setting in ALTER ROUTE.
            tx.alter_route(name, lifetime=entry.get("lifetime"),
                           **{k: ("" if v is None else v) for k, v in wanted_route.items()})
            report.altered.append(label)
        else:
            report.unchanged.append(label)

    return report


__all__ = ["BrokerError", "SetupReport", "SpecError", "apply_spec", "load_spec"]


class BrokerSetupOperator(BrokerBaseOperator):
    """Creates or updates message types, XML schema collections, contracts, queues, services
    and event notifications from a dict, YAML text or a ``.yaml`` file (rendered as a template,
    found like any template file), idempotently and in one transaction.

    Returns ``{"created": [...], "altered": [...], "unchanged": [...]}``.
    """

    template_fields: Sequence[str] = ("spec", "broker_conn_id")
    template_ext: Sequence[str] = (".yaml", ".yml")

    def __init__(self, *, spec: Mapping[str, Any] | str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec

    def execute(self, context: Context) -> dict[str, list[str]]:
        with self.hook() as hook, hook.transaction() as tx:
            report = apply_spec(tx, self.spec)
        for kind in ("created", "altered"):
            for label in getattr(report, kind):
                self.log.info("%s %s", kind, label)
        self.log.info("%d object(s) unchanged", len(report.unchanged))
        return report.as_dict()
