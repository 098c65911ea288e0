"""``airflow-broker doctor``: the checks an administrator makes by hand, each finding with what
it means and how to fix it. Its findings and report (admin/findings.py) are read by name from
here too, hence the re-exports below."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import psycopg

from airflow_broker import migrations
from airflow_broker.admin import postgres_releases as releases
from airflow_broker.admin.findings import ERROR as ERROR
from airflow_broker.admin.findings import INFO as INFO
from airflow_broker.admin.findings import WARNING as WARNING
from airflow_broker.admin.findings import Check, rows
from airflow_broker.admin.findings import Finding as Finding
from airflow_broker.admin.findings import Report as Report
from airflow_broker.broker import Broker
from airflow_broker.errors import AddressError
from airflow_broker.messages import MAX_MESSAGE_SIZE
from airflow_broker.queries import Queries
from airflow_broker.redaction import redact
from airflow_broker.worker.activation import activation_command, is_python_target, load_target
from airflow_broker.worker.procedures import is_procedure_target
from airflow_broker.worker.transport import resolve_address


def release_finding(version_num: int, today: dt.date) -> Finding | None:
    """What a server of ``server_version_num`` (180006 is 18.6) lacks, by the table of releases
    known when this package was built; nothing for a major newer than the table."""
    major, minor = divmod(version_num, 10000)
    running = f"PostgreSQL {major}.{minor}" if major >= 10 else f"PostgreSQL {version_num}"
    newest = max(releases.LATEST_MINOR)
    latest = releases.LATEST_MINOR.get(major)
    end = releases.END_OF_LIFE.get(major)
    if latest is None or (end is not None and today > dt.date.fromisoformat(end)):
        if major > newest:
            return None
        return Finding(
            WARNING, "server", running,
            f"PostgreSQL {major} is past its end of life" + (f" ({end})" if end else "")
            + ": it gets no more security fixes",
            f"upgrade to PostgreSQL {newest} (pg_upgrade, or a dump and restore)")
    if minor < int(latest.split(".")[1]):
        return Finding(
            WARNING, "server", running,
            f"lacks the fixes of later releases of PostgreSQL {major}, security fixes among "
            f"them: the latest known on {releases.WRITTEN} is {latest}",
            f"upgrade to {latest} (a minor upgrade: new binaries and a restart, no dump and "
            "restore)")
    return None


def check_server(conn: psycopg.Connection[tuple[Any, ...]], schema: str) -> Iterator[Finding]:
    finding = release_finding(conn.info.server_version, dt.date.today())
    if finding is not None:
        yield finding


def check_queues(conn: psycopg.Connection[tuple[Any, ...]], schema: str) -> Iterator[Finding]:
    for name, receive, enqueue, reason, since, ready in rows(conn, "doctor_disabled_queues",
                                                              schema):
        if reason == "POISON":
            detail = rows(conn, "doctor_last_disable_event",
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


def check_oversized_messages(conn: psycopg.Connection[tuple[Any, ...]],
                             schema: str) -> Iterator[Finding]:
    # SEND refuses bodies over the maximum (50122), so these predate the limit. The biggest
    # cannot be received at all: RECEIVE's output passes PostgreSQL's 1 GB limit and fails on
    # every try, before poison detection can count it, and the queue stops without a word.
    for name, messages, largest, handles in rows(conn, "doctor_oversized_messages", schema):
        yield Finding(
            ERROR, "messages", name,
            f"{messages} message(s) larger than the maximum message size of "
            f"{MAX_MESSAGE_SIZE:,} bytes (the largest {largest:,} bytes), sent before the limit; "
            "a RECEIVE that reaches one may fail every time and hold up its conversation "
            f"group. Conversations: {', '.join(str(h) for h in handles)}",
            "END CONVERSATION ... WITH CLEANUP on those conversations (or WITH ERROR, to tell "
            "the sender), and send such payloads as a reference to where they are stored")


def check_activation(conn: psycopg.Connection[tuple[Any, ...]], schema: str) -> Iterator[Finding]:
    for name, enabled, procedure, readers in rows(conn, "doctor_activation_settings", schema):
        if enabled and not procedure:
            yield Finding(ERROR, "activation", name,
                          "activation is on but no procedure is configured",
                          "ALTER QUEUE ... WITH ACTIVATION (PROCEDURE_NAME = ...)")
        elif enabled and readers == 0:
            yield Finding(WARNING, "activation", name,
                          "activation is on with MAX_QUEUE_READERS = 0: nothing is ever started "
                          "(warning 9648)",
                          "ALTER QUEUE ... WITH ACTIVATION (MAX_QUEUE_READERS = n)")
        if procedure and is_procedure_target(procedure):
            if not rows(conn, "doctor_procedure_exists", schema, (procedure,)):
                yield Finding(ERROR if enabled else WARNING, "activation", name,
                              f"the activation procedure {procedure!r} is no PostgreSQL "
                              "procedure without arguments in this database",
                              f"CREATE PROCEDURE {procedure}() ..., or correct PROCEDURE_NAME")
        elif procedure and is_python_target(procedure):
            try:
                load_target(procedure)
            except Exception as exc:
                yield Finding(ERROR if enabled else WARNING, "activation", name,
                              f"the activation procedure {procedure!r} cannot be loaded here: "
                              f"{type(exc).__name__}: {exc}",
                              "install the package that provides it where the broker worker "
                              "runs, or correct PROCEDURE_NAME")
        elif procedure:
            try:
                activation_command(procedure)
            except ValueError as exc:
                yield Finding(ERROR if enabled else WARNING, "activation", name,
                              f"the activation procedure {procedure!r} is not a command line "
                              f"the worker can start: {exc}",
                              "ALTER QUEUE ... WITH ACTIVATION (PROCEDURE_NAME = ...) with "
                              "balanced quotes, or a package.module:function")
    for name, role, exists in rows(conn, "doctor_reader_roles", schema):
        yield Finding(ERROR, "activation", name,
                      f"its readers log in as EXECUTE AS role {role!r}, which "
                      + ("cannot log in" if exists else "does not exist"),
                      f"CREATE ROLE / ALTER ROLE {role} LOGIN, with its password in the "
                      "broker worker's PGPASSFILE (or a pg_hba.conf rule for it)")
    # What the worker last did for each activated queue: a procedure it could not or may not
    # start is refused there, every pass, in its log; here it is said once, with the fix.
    for name, error in rows(conn, "doctor_last_activation", schema):
        if error and error.startswith("could not start"):
            yield Finding(ERROR, "activation", name,
                          f"the broker worker did not start the activation procedure: {error}",
                          "add it to the worker's activation targets (airflow-broker worker "
                          "--activation-target PATTERN) if it is meant to run there, or "
                          "correct PROCEDURE_NAME")


def check_monitors(conn: psycopg.Connection[tuple[Any, ...]], schema: str) -> Iterator[Finding]:
    for name, stuck_for, last_activated in rows(conn, "doctor_stuck_monitors", schema):
        yield Finding(
            ERROR, "queue monitors", name,
            f"the queue monitor has been NOTIFIED for {stuck_for} (reader started at "
            f"{last_activated}) while messages wait, and no RECEIVE has happened since: the "
            "reader does not RECEIVE from this queue, so activation will not start it again",
            "fix the reader, then recycle the monitor: ALTER QUEUE ... WITH ACTIVATION "
            "(STATUS = OFF), then (STATUS = ON)")
    for name, state, since in rows(conn, "doctor_queue_monitors", schema):
        yield Finding(INFO, "queue monitors", name, f"monitor {state} since {since}",
                      "nothing to do")


def check_leaks(conn: psycopg.Connection[tuple[Any, ...]], schema: str) -> Iterator[Finding]:
    for service, far_service, leaked, oldest in rows(conn, "doctor_leaked_endpoints", schema):
        yield Finding(
            WARNING, "endpoint leaks", f"{service} <- {far_service}",
            f"{leaked} CLOSED target endpoints that will not be reclaimed for decades (oldest "
            f"from {oldest}): the initiator ends its dialogs before the target answered "
            "(fire-and-forget)",
            "let the target end first and the initiator end on EndDialog, or give dialogs a "
            "LIFETIME; then `airflow-broker cleanup --dry-run` and `airflow-broker cleanup`")


def check_transmission_queue(conn: psycopg.Connection[tuple[Any, ...]],
                             schema: str) -> Iterator[Finding]:
    for to_service, status, waiting, oldest, attempts, next_attempt in rows(
            conn, "doctor_transmission_queue", schema):
        near = rows(conn, "doctor_services_alike",
                     schema, (to_service, to_service))
        hint = (f" A service named {near[0][0]!r} exists: TO SERVICE names match byte for byte, "
                "case included." if near else "")
        yield Finding(
            WARNING, "transmission queue", to_service,
            f"{waiting} messages wait since {oldest} ({attempts} attempts, next at "
            f"{next_attempt}): {status or 'not attempted yet'}{hint}",
            "create the service (or correct the TO SERVICE name), or enable the target queue; "
            "held messages are delivered on the next retry")


def check_routes(conn: psycopg.Connection[tuple[Any, ...]], schema: str) -> Iterator[Finding]:
    """Routes in both directions: every route's far broker is reachable, has the service, and
    has a route back to each local service that talks to it (without one, messages arrive
    but are never acknowledged and are sent again for ever)."""
    me = str(rows(conn, "doctor_broker_instance", schema)[0][0])
    for far_service, in rows(conn, "doctor_unrouted_far_services", schema):
        yield Finding(
            ERROR, "routes", far_service,
            "conversations with this service in another broker have no route to it: "
            "replies wait in the transmission queue and what it sends cannot be "
            "acknowledged",
            f"CREATE ROUTE ... WITH SERVICE_NAME = '{far_service}', ADDRESS = "
            "'postgresql://...' (create_route)")
    for name, service, instance, address in rows(conn, "doctor_remote_routes", schema):
        senders = [r[0] for r in rows(conn, "doctor_route_senders", schema,
                                       (service, service, service, service))]
        yield from _check_far_broker(name, service, instance, address, me, senders)
    for far_service, status, waiting in rows(conn, "doctor_unacknowledged", schema):
        yield Finding(
            ERROR, "routes", far_service,
            f"{waiting} conversations cannot acknowledge what {far_service!r} sent them: "
            f"{status}",
            f"create a route here for service '{far_service}' to the broker it lives in")


def _check_far_broker(route: str, service: str | None, instance: str | None, address: str,
                      me: str, senders: list[str]) -> Iterator[Finding]:
    subject = f"route {route} ({redact(address)})"
    try:
        far = resolve_address(address)
        conn = psycopg.connect(far.dsn, connect_timeout=5, autocommit=True)
    except (psycopg.Error, AddressError, OSError) as exc:
        yield Finding(ERROR, "routes", subject,
                      f"the far broker is unreachable: {str(exc).strip().splitlines()[0]}",
                      "check the address (ALTER ROUTE) and that the server is running")
        return
    far_queries = Queries(far.schema)
    with conn:
        try:
            guid, enabled = conn.execute(
                far_queries["doctor_far_identity"]).fetchone() or (None, None)
        except psycopg.Error:
            yield Finding(ERROR, "routes", subject,
                          f"there is no broker schema {far.schema!r} at this address",
                          "install the broker there (airflow-broker install), or name its "
                          "schema with broker_schema=... in the address")
            return
        if guid == me:
            yield Finding(ERROR, "routes", subject,
                          f"the far broker has this broker's own instance id {me} (a copied or "
                          "restored database): neither will accept the other's messages",
                          "ALTER DATABASE ... SET NEW_BROKER (alter_broker('NEW_BROKER')) in "
                          "one of them")
        if instance is not None and instance != guid:
            yield Finding(ERROR, "routes", subject,
                          f"BROKER_INSTANCE is {instance} but the address leads to broker "
                          f"{guid}", "correct BROKER_INSTANCE or ADDRESS (ALTER ROUTE)")
        if not enabled:
            yield Finding(WARNING, "routes", subject,
                          "the far broker is disabled (DISABLE_BROKER): messages wait",
                          "ALTER DATABASE ... SET ENABLE_BROKER there")
        if service is not None and conn.execute(
                far_queries["doctor_far_service_exists"], [service]).fetchone() is None:
            near = conn.execute(far_queries["doctor_far_service_alike"], [service]).fetchone()
            hint = (f"; it has {near[0]!r}: service names match byte for byte, case included"
                    if near else "")
            yield Finding(ERROR, "routes", subject,
                          f"the far broker has no service {service!r}{hint}",
                          "create the service there, or correct the route's SERVICE_NAME")
        for sender in senders:
            back = conn.execute(far_queries["doctor_route_back"], [sender, me]).fetchone()
            if back is None or back[0] in (None, "LOCAL"):
                yield Finding(
                    ERROR, "routes", subject,
                    f"the far broker has no route back to service {sender!r}: what this broker "
                    "sends arrives there but is never acknowledged, and is sent again and "
                    "again (the classic missing return route)",
                    f"on the far broker: CREATE ROUTE ... WITH SERVICE_NAME = '{sender}', "
                    "ADDRESS = '<this broker's address>'")


def check_services(conn: psycopg.Connection[tuple[Any, ...]], schema: str) -> Iterator[Finding]:
    for service, far_service, refused in rows(conn, "doctor_refused_contracts_audited", schema):
        yield Finding(
            ERROR, "services", service,
            f"{refused} dialogs from {far_service} were refused (-8408) because the service "
            "does not accept their contract; the initiators had ended, so only the audit "
            "table saw the errors",
            "ALTER SERVICE ... (ADD CONTRACT ...) on the target, or begin dialogs on a contract "
            "it accepts")
    for service, contract, in_error in rows(conn, "doctor_refused_contracts_waiting", schema):
        yield Finding(
            ERROR, "services", service,
            f"does not accept contract {contract!r}: {in_error} dialogs to it ended in error "
            "-8408",
            f"ALTER SERVICE [{service}] (ADD CONTRACT [{contract}]), or begin dialogs on a "
            "contract it accepts")
    for name, service in rows(conn, "doctor_notifications_without_contract", schema):
        yield Finding(
            ERROR, "event notifications", name,
            f"its service {service!r} does not exist or does not accept the contract "
            "PostEventNotification, so its events cannot be delivered",
            "create the service with the PostEventNotification contract, or drop and "
            "recreate the notification")


def check_permissions(conn: psycopg.Connection[tuple[Any, ...]],
                      schema: str) -> Iterator[Finding]:
    for grantee, tables in rows(conn, "doctor_table_grants", schema):
        yield Finding(
            ERROR, "permissions", grantee,
            f"holds rights on the broker's tables ({tables}), which pass by every SEND, "
            "RECEIVE and REFERENCES check: what applications needed before the broker "
            "enforced its permissions (docs/security.md)",
            f"REVOKE ALL ON ALL TABLES IN SCHEMA {schema} FROM {grantee}; then grant broker "
            "permissions (broker.grant_permission)")


CHECKS: dict[str, Check] = {
    "server": check_server,
    "queues": check_queues,
    "messages": check_oversized_messages,
    "activation": check_activation,
    "queue monitors": check_monitors,
    "endpoint leaks": check_leaks,
    "transmission queue": check_transmission_queue,
    "routes": check_routes,
    "services": check_services,
    "permissions": check_permissions,
}


def _not_checked(check: str, schema: str) -> Finding:
    return Finding(
        INFO, check, schema,
        "not checked: this login may not read what the check reads (the schema owner's "
        "catalog and tables)",
        "run airflow-broker doctor as the broker worker (a member of the schema's owner)")


def diagnose(broker: Broker) -> Report:
    """Every check, as far as the broker's login may run them: a check that needs the schema
    owner's rights the login lacks is reported as not checked, and the others still run."""
    report = Report(broker.schema)
    report.checks_run.append("schema")
    try:
        pending = migrations.pending(broker.dsn, broker.schema)
    except psycopg.errors.InsufficientPrivilege:
        report.findings.append(_not_checked("schema", broker.schema))
        report.not_checked.append("schema")
        pending = []
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
            try:
                report.findings.extend(check(conn, broker.schema))
            except psycopg.errors.InsufficientPrivilege:
                conn.rollback()
                report.findings.append(_not_checked(name, broker.schema))
                report.not_checked.append(name)
        conn.rollback()
    return report
