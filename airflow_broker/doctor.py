"""``airflow-broker doctor``: the checks an administrator makes by hand, each finding with what
it means and how to fix it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from airflow_broker import migrations
from airflow_broker.activation import is_python_target, load_target
from airflow_broker.broker import Broker

ERROR = "error"
WARNING = "warning"
INFO = "info"


@dataclass(frozen=True)
class Finding:
    severity: str
    check: str
    subject: str
    problem: str
    fix: str


@dataclass
class Report:
    schema: str
    findings: list[Finding] = field(default_factory=list)
    checks_run: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not any(f.severity in (ERROR, WARNING) for f in self.findings)

    def to_json(self) -> str:
        return json.dumps({
            "schema": self.schema,
            "healthy": self.healthy,
            "checks": self.checks_run,
            "findings": [dataclasses.asdict(f) for f in self.findings],
        }, indent=2, default=str)

    def to_text(self) -> str:
        lines = [f"airflow-broker doctor: schema {self.schema}, {len(self.checks_run)} checks"]
        if not self.findings:
            lines.append("  everything looks right")
        for f in sorted(self.findings, key=lambda f: (f.severity != ERROR,
                                                      f.severity != WARNING)):
            lines.append(f"  [{f.severity.upper()}] {f.check}: {f.subject}")
            lines.append(f"      {f.problem}")
            lines.append(f"      fix: {f.fix}")
        lines.append("healthy" if self.healthy else "problems found")
        return "\n".join(lines)


Check = Callable[[psycopg.Connection[tuple[Any, ...]], str], Iterator[Finding]]


def _rows(conn: psycopg.Connection[tuple[Any, ...]], query: str, schema: str,
          params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    return conn.execute(sql.SQL(query).format(s=sql.Identifier(schema)), params).fetchall()


def check_queues(conn: psycopg.Connection[tuple[Any, ...]], schema: str) -> Iterator[Finding]:
    for name, receive, enqueue, reason, since, ready in _rows(conn, """
            SELECT name, is_receive_enabled, is_enqueue_enabled, disabled_reason, disabled_at,
                   ready_messages
              FROM {s}.queue_status WHERE NOT (is_receive_enabled AND is_enqueue_enabled)
             ORDER BY name""", schema):
        if reason == "POISON":
            detail = _rows(conn, """SELECT reason, message_ids FROM {s}.queue_disable_events e
                                     JOIN {s}.queues q ON q.object_id = e.queue_id
                                    WHERE q.name = %s ORDER BY e.disabled_at DESC LIMIT 1""",
                           schema, (name,))
            why = detail[0][0] if detail else "poison-message detection"
            ids = ", ".join(str(m) for m in (detail[0][1] if detail else []))
            yield Finding(
                ERROR, "queues", name,
                f"disabled by poison-message detection since {since}: {why}; "
                f"{ready} messages wait. Messages that kept failing: {ids or 'unknown'}.",
                "turn activation off, enable the queue (ALTER QUEUE ... STATUS = ON, or "
                "`airflow-broker enable-queue`), inspect the messages in a transaction you roll "
                "back, END CONVERSATION WITH ERROR on the poisoned conversation (or fix the "
                "reader), then turn activation on again")
        else:
            state = "receive" if not receive else ""
            state += (" and " if state and not enqueue else "") + ("enqueue" if not enqueue else "")
            yield Finding(
                WARNING, "queues", name,
                f"{state} disabled (STATUS = OFF) since {since}; {ready} messages wait, and "
                "messages sent to it are held in the transmission queue",
                "ALTER QUEUE ... WITH STATUS = ON when it should work again")


def check_activation(conn: psycopg.Connection[tuple[Any, ...]], schema: str) -> Iterator[Finding]:
    for name, enabled, procedure, readers in _rows(conn, """
            SELECT name, is_activation_enabled, activation_procedure, max_readers
              FROM {s}.queues ORDER BY name""", schema):
        if enabled and not procedure:
            yield Finding(ERROR, "activation", name,
                          "activation is on but no procedure is configured",
                          "ALTER QUEUE ... WITH ACTIVATION (PROCEDURE_NAME = ...)")
        elif enabled and readers == 0:
            yield Finding(WARNING, "activation", name,
                          "activation is on with MAX_QUEUE_READERS = 0: nothing is ever started "
                          "(warning 9648)",
                          "ALTER QUEUE ... WITH ACTIVATION (MAX_QUEUE_READERS = n)")
        if procedure and is_python_target(procedure):
            try:
                load_target(procedure)
            except Exception as exc:
                yield Finding(ERROR if enabled else WARNING, "activation", name,
                              f"the activation procedure {procedure!r} cannot be loaded here: "
                              f"{type(exc).__name__}: {exc}",
                              "install the package that provides it where the broker worker "
                              "runs, or correct PROCEDURE_NAME")


def check_monitors(conn: psycopg.Connection[tuple[Any, ...]], schema: str) -> Iterator[Finding]:
    for name, stuck_for, last_activated in _rows(conn, """
            SELECT queue_name, stuck_for, last_activated_time FROM {s}.stuck_queue_monitors
             ORDER BY queue_name""", schema):
        yield Finding(
            ERROR, "queue monitors", name,
            f"the queue monitor has been NOTIFIED for {stuck_for} (reader started at "
            f"{last_activated}) while messages wait, and no RECEIVE has happened since: the "
            "reader does not RECEIVE from this queue, so activation will not start it again",
            "fix the reader, then recycle the monitor: ALTER QUEUE ... WITH ACTIVATION "
            "(STATUS = OFF), then (STATUS = ON)")
    for name, state, since in _rows(conn, """
            SELECT queue_name, state, state_since FROM {s}.dm_broker_queue_monitors
             WHERE queue_name NOT IN (SELECT queue_name FROM {s}.stuck_queue_monitors)
             ORDER BY queue_name""", schema):
        yield Finding(INFO, "queue monitors", name, f"monitor {state} since {since}",
                      "nothing to do")


def check_leaks(conn: psycopg.Connection[tuple[Any, ...]], schema: str) -> Iterator[Finding]:
    for service, far_service, leaked, oldest in _rows(conn, """
            SELECT service_name, far_service, leaked, oldest FROM {s}.leaked_endpoint_counts
             ORDER BY leaked DESC""", schema):
        yield Finding(
            WARNING, "endpoint leaks", f"{service} <- {far_service}",
            f"{leaked} CLOSED target endpoints that will not be reclaimed for decades (oldest "
            f"from {oldest}): the initiator ends its dialogs before the target answered "
            "(fire-and-forget)",
            "let the target end first and the initiator end on EndDialog, or give dialogs a "
            "LIFETIME; then `airflow-broker cleanup --dry-run` and `airflow-broker cleanup`")


def check_transmission_queue(conn: psycopg.Connection[tuple[Any, ...]],
                             schema: str) -> Iterator[Finding]:
    for to_service, status, waiting, oldest in _rows(conn, """
            SELECT to_service_name, transmission_status, count(*), min(enqueue_time)
              FROM {s}.transmission_queue GROUP BY 1, 2 ORDER BY 3 DESC""", schema):
        near = _rows(conn, """SELECT name FROM {s}.service_defs
                               WHERE lower(name) = lower(%s) AND name <> %s""",
                     schema, (to_service, to_service))
        hint = (f" A service named {near[0][0]!r} exists: TO SERVICE names match byte for byte, "
                "case included." if near else "")
        yield Finding(
            WARNING, "transmission queue", to_service,
            f"{waiting} messages wait since {oldest}: {status}{hint}",
            "create the service (or correct the TO SERVICE name), or enable the target queue; "
            "held messages are delivered on the next retry")


def check_services(conn: psycopg.Connection[tuple[Any, ...]], schema: str) -> Iterator[Finding]:
    for service, far_service, refused in _rows(conn, """
            SELECT far_service, service_name, count(*) FROM {s}.error_audit
             WHERE code = -8408 GROUP BY 1, 2 ORDER BY 3 DESC""", schema):
        yield Finding(
            ERROR, "services", service,
            f"{refused} dialogs from {far_service} were refused (-8408) because the service "
            "does not accept their contract; the initiators had ended, so only the audit "
            "table saw the errors",
            "ALTER SERVICE ... (ADD CONTRACT ...) on the target, or begin dialogs on a contract "
            "it accepts")
    for service, contract, in_error in _rows(conn, """
            SELECT e.far_service, c.name, count(*) FROM {s}.endpoints e
              JOIN {s}.contracts c USING (service_contract_id)
              JOIN {s}.queue_messages m ON m.conversation_handle = e.conversation_handle
             WHERE e.state = 'ER' AND m.message_type_id = 1
               AND {s}.utf16le_decode(m.message_body) LIKE '%%<Code>-8408</Code>%%'
             GROUP BY 1, 2""", schema):
        yield Finding(
            ERROR, "services", service,
            f"does not accept contract {contract!r}: {in_error} dialogs to it ended in error "
            "-8408",
            f"ALTER SERVICE [{service}] (ADD CONTRACT [{contract}]), or begin dialogs on a "
            "contract it accepts")
    for name, service in _rows(conn, """
            SELECT n.name, n.service_name FROM {s}.event_subscriptions n
             WHERE NOT EXISTS (SELECT 1 FROM {s}.service_defs d
                                JOIN {s}.service_def_contracts u USING (service_id)
                                JOIN {s}.contracts c USING (service_contract_id)
                               WHERE d.name = n.service_name
                                 AND c.name = 'http://schemas.microsoft.com/SQL/Notifications/PostEventNotification')
             ORDER BY 1""", schema):
        yield Finding(
            ERROR, "event notifications", name,
            f"its service {service!r} does not exist or does not accept the contract "
            "PostEventNotification, so its events cannot be delivered",
            "create the service with the PostEventNotification contract, or drop and "
            "recreate the notification")


CHECKS: dict[str, Check] = {
    "queues": check_queues,
    "activation": check_activation,
    "queue monitors": check_monitors,
    "endpoint leaks": check_leaks,
    "transmission queue": check_transmission_queue,
    "services": check_services,
}


def diagnose(broker: Broker) -> Report:
    report = Report(broker.schema)
    pending = migrations.pending(broker.dsn, broker.schema)
    report.checks_run.append("schema")
    if pending:
        installed = not set(pending) >= {f.name for f in migrations.migrations()}
        report.findings.append(Finding(
            ERROR, "schema", broker.schema,
            ("the broker schema is not current: " if installed
             else "the broker schema is not installed: ") + ", ".join(pending) + " to apply",
            "airflow-broker install"))
        if not installed:
            return report
    with broker.pool.connection() as conn:
        for name, check in CHECKS.items():
            report.checks_run.append(name)
            report.findings.extend(check(conn, broker.schema))
        conn.rollback()
    return report
