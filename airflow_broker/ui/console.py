"""What the broker's pages in Airflow's UI read and change, as JSON-ready dicts.

Everything goes through broker functions every login may call, which apply the broker's
permission checks to the pages' login (sql/functions/67_console.sql, queue_state,
alter_queue): the login sees the queues it may see, reads messages and the quarantine of the
queues it may RECEIVE from, replays there, and enables the queues it may ALTER. Each call is
one broker transaction.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any

from airflow_broker._statements import runner_of
from airflow_broker.broker import Broker
from airflow_broker.errors import BrokerError, ConversationNotFound, InvalidObjectName
from airflow_broker.messages import decode_body

# The queue page shows the head of each queue, not all of a backlog of millions; the
# conversations page the newest endpoints, not all of millions of leaks.
MESSAGE_LIMIT = 500
CONVERSATION_LIMIT = 500
# The overview counts each queue's ready messages up to this many and estimates beyond.
DEPTH_EXACT_LIMIT = 1000
# The newest reader runs and activations a queue page lists.
RUN_LIMIT = 20
RUN_COUNTS = ("readers", "attempts", "received", "processed", "quarantined", "retried")
# A sensor receives a batch at a time; a task instance's tab shows the first of them.
INBOX_LIMIT = 500
STATES = ("SO", "SI", "CO", "DI", "DO", "ER", "CD")
BODY_PREVIEW = 2000


class NotLeaked(LookupError):
    """END CONVERSATION WITH CLEANUP was asked of an endpoint that is not a leak."""


class NotConfirmed(ValueError):
    """A cleanup without the typed confirmation: the handle itself."""


def iso(value: dt.datetime | None) -> str | None:
    # The broker keeps UTC in timestamp without time zone.
    return None if value is None else value.replace(tzinfo=dt.UTC).isoformat()


def body_text(body: bytes | None) -> str | None:
    try:
        text = decode_body(body)
    except UnicodeDecodeError:
        return f"<{len(body or b'')} bytes, not text>"
    if text is not None and len(text) > BODY_PREVIEW:
        return text[:BODY_PREVIEW] + "…"
    return text


def overview(broker: Broker) -> list[dict[str, Any]]:
    """Every queue the login may see."""
    with broker.transaction() as tx:
        runner = runner_of(tx)
        rows = runner.run(runner.queries["ui_queues"], [DEPTH_EXACT_LIMIT])
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    queues = []
    for (name, schema, enabled, reason, disabled_at, activation, max_readers, ready, oldest,
         readers, poison_reason, poison_at, poison_messages, quarantined, may_receive,
         may_alter, estimated, monitor_state, monitor_since, monitor_stuck, last_activated,
         receives) in rows:
        by_poison = not enabled and reason == "POISON"
        queues.append({
            "name": name,
            "schema": schema,
            "enabled": bool(enabled),
            "disabled_reason": None if enabled else reason,
            "disabled_at": None if enabled else iso(disabled_at),
            # The event that disabled it; kept after re-enabling only as history.
            "poison": {
                "reason": poison_reason, "at": iso(poison_at),
                "message_ids": [str(m) for m in poison_messages or ()],
            } if by_poison and poison_reason else None,
            "activation_enabled": bool(activation),
            "max_readers": max_readers,
            "depth": int(ready or 0),
            # Above DEPTH_EXACT_LIMIT, PostgreSQL's statistics: an overview that refreshes
            # every few seconds must not count a backlog of millions each time.
            "depth_is_estimate": bool(estimated),
            "oldest_message_at": iso(oldest),
            "oldest_message_age_seconds": None if oldest is None
            else max(0.0, (now - oldest).total_seconds()),
            "readers_running": int(readers or 0),
            # sys.dm_broker_queue_monitors' state; None for a queue no monitor watches.
            "monitor": None if monitor_state is None else {
                "state": monitor_state, "since": iso(monitor_since),
                "stuck": bool(monitor_stuck), "last_activated_at": iso(last_activated)},
            # RECEIVEs that took messages, ever: the page's rate is its change between
            # refreshes.
            "receives": int(receives),
            "quarantined": int(quarantined or 0),
            # What the login may do here, as the broker will judge it.
            "may_receive": bool(may_receive),
            "may_alter": bool(may_alter),
        })
    return queues


def queue_rights(broker: Broker, queue_name: str) -> dict[str, bool]:
    """Whether the login may RECEIVE from and ALTER a queue it may see, as the broker judges
    it: the pages offer no action the broker would refuse."""
    with broker.transaction() as tx:
        runner = runner_of(tx)
        rows = runner.run(runner.queries["ui_queue_rights"], [queue_name])
    may_receive, may_alter = rows[0] if rows else (False, False)
    return {"may_receive": bool(may_receive), "may_alter": bool(may_alter)}


def queue_messages(broker: Broker, queue_name: str, *, bodies: bool) -> dict[str, Any]:
    """The head of the queue (the first MESSAGE_LIMIT messages RECEIVE would take), by
    conversation group in the order RECEIVE picks them; bodies only when ``bodies``."""
    with broker.transaction() as tx:
        runner = runner_of(tx)
        state = runner.run(runner.queries["ui_queue_state"], [queue_name])
        if not state:
            raise InvalidObjectName(f"Invalid object name '{queue_name}'.")
        rows = runner.run(runner.queries["ui_queue_messages"], [queue_name, MESSAGE_LIMIT + 1])
        activation = runner.run(runner.queries["ui_queue_activation"], [queue_name])
        runs = runner.run(runner.queries["ui_reader_runs"], [queue_name, RUN_LIMIT])
        activations = runner.run(runner.queries["ui_activations"], [queue_name, RUN_LIMIT])
    groups: dict[str, dict[str, Any]] = {}
    for group, handle, sequence, type_name, status, priority, enqueued, message_id, body \
            in rows[:MESSAGE_LIMIT]:
        entry = groups.setdefault(str(group), {"conversation_group_id": str(group),
                                               "messages": []})
        entry["messages"].append({
            "conversation_handle": str(handle),
            "message_sequence_number": sequence,
            "message_type_name": type_name,
            "status": status,
            "priority": priority,
            "enqueued_at": iso(enqueued),
            "message_id": str(message_id),
            "body": body_text(body) if bodies else None,
            "body_masked": not bodies,
        })
    name, _schema, enabled, reason, disabled_at, ready, poison_reason = state[0]
    return {
        "name": name,
        "enabled": bool(enabled),
        "disabled_reason": None if enabled else reason,
        "disabled_at": None if enabled else iso(disabled_at),
        "poison_reason": None if enabled else poison_reason,
        "depth": int(ready or 0),
        "truncated": len(rows) > MESSAGE_LIMIT,
        "groups": list(groups.values()),
        "activation": dict(zip(("enabled", "procedure", "max_queue_readers", "execute_as"),
                               activation[0], strict=True)) if activation else None,
        "reader_runs": [_reader_run(*run) for run in runs],
        "activations": [{
            "task_id": str(task_id), "procedure": procedure, "execute_as": execute_as,
            "started_at": iso(started), "ended_at": iso(ended), "outcome": outcome,
            "messages_received": received, "rollbacks": rollbacks, "exception": exception,
        } for (task_id, procedure, execute_as, started, ended, outcome, received, rollbacks,
               exception) in activations],
    }


def _reader_run(run_id: uuid.UUID, started: dt.datetime, ended: dt.datetime | None,
                airflow: dict[str, Any] | None, summary: dict[str, Any] | None
                ) -> dict[str, Any]:
    summary = summary or {}
    return {
        "run_id": str(run_id),
        "started_at": iso(started),
        "ended_at": iso(ended),
        # dag_id, run_id, task_id, map_index, try_number of the task that submitted it.
        "task_instance": airflow,
        **{key: summary.get(key) for key in RUN_COUNTS},
        "failed_readers": summary.get("failed_readers") or [],
    }


def set_queue_status(broker: Broker, queue_name: str, enabled: bool) -> None:
    """ALTER QUEUE ... WITH STATUS = ON / OFF."""
    with broker.transaction() as tx:
        tx.alter_queue(queue_name, status=enabled)


def set_activation(broker: Broker, queue_name: str, enabled: bool | None,
                   max_queue_readers: int | None) -> None:
    """ALTER QUEUE ... WITH ACTIVATION (STATUS = ON / OFF, MAX_QUEUE_READERS = n); a setting
    left None keeps its value. The broker checks ALTER and the values."""
    with broker.transaction() as tx:
        tx.alter_queue(queue_name, activation_status=enabled,
                       max_queue_readers=max_queue_readers)


def health(broker: Broker) -> dict[str, Any]:
    """``airflow-broker doctor``'s report (its findings redacted as the CLI's are), worst
    first."""
    from airflow_broker.admin.doctor import ERROR, WARNING, diagnose

    report = diagnose(broker)
    findings = sorted(report.findings, key=lambda f: (f.severity != ERROR,
                                                      f.severity != WARNING))
    return {
        "schema": report.schema,
        "healthy": report.healthy,
        "checks": report.checks_run,
        "not_checked": report.not_checked,
        "checked_at": dt.datetime.now(dt.UTC).isoformat(),
        "findings": [{"severity": f.severity, "check": f.check, "subject": f.subject,
                      "problem": f.problem, "fix": f.fix} for f in findings],
    }


def conversations(broker: Broker, *, state: str | None = None,
                  leaked_only: bool = False) -> dict[str, Any]:
    """The conversations the login may see (RECEIVE on their service's queue), newest first,
    leaks flagged, with counts per state."""
    if state is not None and state not in STATES:
        raise ValueError(f"no conversation state {state!r}: one of {', '.join(STATES)}")
    with broker.transaction() as tx:
        runner = runner_of(tx)
        rows = runner.run(runner.queries["ui_conversations"],
                          [state, leaked_only, CONVERSATION_LIMIT + 1])
        counts = runner.run(runner.queries["ui_conversation_counts"])
    return {
        "conversations": [_conversation(row) for row in rows[:CONVERSATION_LIMIT]],
        "truncated": len(rows) > CONVERSATION_LIMIT,
        "counts": [{"state": s, "endpoints": int(n), "leaked": int(leaked)}
                   for s, n, leaked in counts],
    }


def conversation(broker: Broker, handle: uuid.UUID, *, bodies: bool) -> dict[str, Any]:
    """One conversation end to end, as far as the login may see it (RECEIVE on each
    endpoint's queue; 8426 for a handle it may not see): its endpoints in this broker, the
    messages waiting in their queues and those waiting in the transmission queue to be sent,
    each with its transmission status."""
    with broker.transaction() as tx:
        runner = runner_of(tx)
        endpoints = runner.run(runner.queries["ui_conversation_endpoints"], [handle])
        messages = runner.run(runner.queries["ui_conversation_messages"],
                              [handle, MESSAGE_LIMIT])
    return {
        "endpoints": [{
            "conversation_handle": str(h), "conversation_id": str(cid),
            "is_initiator": bool(initiator), "service_name": service, "queue_name": queue,
            "far_service": far_service, "far_broker_instance": far_instance,
            "state": state, "state_desc": state_desc,
            "lifetime": iso(lifetime), "security_timestamp": iso(security),
            "send_sequence": int(sent), "receive_sequence": int(received),
            "created_at": iso(created), "transmission_status": status or None,
        } for (h, cid, initiator, service, queue, far_service, far_instance, state, state_desc,
               lifetime, security, sent, received, created, status) in endpoints],
        "messages": [{
            "conversation_handle": str(h), "place": place, "message_sequence_number": seq,
            "message_type_name": type_name, "status": status, "at": iso(at),
            "transmission_status": transmission or None, "message_id": str(message_id),
            "body": body_text(body) if bodies else None, "body_masked": not bodies,
        } for (h, place, seq, type_name, status, at, transmission, message_id, body)
            in messages],
    }


def cleanup_leak(broker: Broker, handle: uuid.UUID, confirm: str | None) -> None:
    """END CONVERSATION WITH CLEANUP of one leaked endpoint, once the user typed its handle:
    the peer is never told, so it is for leaks alone. The broker allows it to the schema's
    owner only (229 otherwise)."""
    if (confirm or "").strip().lower() != str(handle):
        raise NotConfirmed(f"type the conversation handle {handle} to confirm the cleanup")
    with broker.transaction() as tx:
        runner = runner_of(tx)
        found = runner.run(runner.queries["ui_conversation"], [handle])
        if not found:
            raise ConversationNotFound(
                f"The conversation handle \"{handle}\" is not found.")
        if not found[0][1]:
            raise NotLeaked(f"conversation {handle} is not a leaked endpoint: END CONVERSATION "
                            "WITH CLEANUP is only for leaks")
        tx.end_conversation(handle, cleanup=True)


def queues_by_name(broker: Broker) -> dict[str, dict[str, Any]]:
    """The overview's queues by the names a DAG may give them: ``name`` and
    ``schema.name``."""
    found: dict[str, dict[str, Any]] = {}
    for queue in overview(broker):
        found.setdefault(queue["name"], queue)
        found[f"{queue['schema']}.{queue['name']}"] = queue
    return found


def _conversation(row: Sequence[Any]) -> dict[str, Any]:
    (handle, conversation_id, initiator, service, far_service, state_code, state_desc,
     lifetime, created_at, leaked) = row
    return {
        "conversation_handle": str(handle),
        "conversation_id": str(conversation_id),
        "is_initiator": bool(initiator),
        "service_name": service,
        "far_service": far_service,
        "state": state_code,
        "state_desc": state_desc,
        "lifetime": iso(lifetime),
        "created_at": iso(created_at),
        "is_leaked": bool(leaked),
    }


def task_instance(broker: Broker, consumer: str, handles: Sequence[uuid.UUID], *,
                  bodies: bool) -> dict[str, Any]:
    """What the broker knows of one task instance: what ``consumer`` (its Airflow inbox key)
    received, of the queues the login may RECEIVE from, and the endpoints of ``handles`` and
    of those messages' conversations that the login may see."""
    with broker.transaction() as tx:
        runner = runner_of(tx)
        rows = runner.run(runner.queries["ui_inbox"], [consumer, INBOX_LIMIT + 1])
        wanted = list(dict.fromkeys([*handles, *(row[7] for row in rows[:INBOX_LIMIT])]))
        endpoints = [found[0] for handle in wanted
                     if (found := runner.run(runner.queries["ui_conversation_endpoint"],
                                             [handle]))]
    return {
        "consumer": consumer,
        "inbox": [{
            "inbox_id": inbox_id,
            "queue_name": queue_name,
            "state": state,
            "claimed_at": iso(claimed_at),
            "delivered_at": iso(delivered_at),
            "consumed_at": iso(consumed_at),
            "conversation_group_id": str(group),
            "conversation_handle": str(handle),
            "message_sequence_number": sequence,
            "service_name": service,
            "service_contract_name": contract,
            "message_type_name": type_name,
            "message_id": str(message_id),
            "body": body_text(body) if bodies else None,
            "body_masked": not bodies,
        } for (inbox_id, queue_name, state, claimed_at, delivered_at, consumed_at, group,
               handle, sequence, service, contract, type_name, message_id, body)
            in rows[:INBOX_LIMIT]],
        "truncated": len(rows) > INBOX_LIMIT,
        "conversations": [_conversation(row) for row in endpoints],
    }


def end_with_error(broker: Broker, handle: uuid.UUID, error: int, description: str) -> None:
    """END CONVERSATION WITH ERROR: the peer gets an Error message with the code and the
    description, and what still waited to be delivered is dropped. The broker checks the code,
    the description and the login's right to end the conversation."""
    with broker.transaction() as tx:
        tx.end_conversation(handle, error=error, description=description)


def error_body(error: BrokerError) -> dict[str, Any]:
    return {"detail": str(error), "error_number": error.number}
