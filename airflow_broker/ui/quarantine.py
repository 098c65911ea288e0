"""What the Quarantine page of the broker's UI reads and does: a queue's quarantined and
parked messages, filtered and grouped by error, replayed (and the queue enabled in the same
transaction) or discarded (sql/functions/67_console.sql: console_quarantine, console_replay,
console_discard), as far as the pages' login may RECEIVE from the queue."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from airflow_broker._statements import runner_of
from airflow_broker.broker import Broker
from airflow_broker.messages import decode_body
from airflow_broker.ui.console import MESSAGE_LIMIT, body_text, iso

# The most ids a group carries, and the most one replay or discard takes.
GROUP_IDS = 10_000


class BodiesWithheld(PermissionError):
    """A filter on body content for a caller that may not see bodies: which messages match
    would tell what they hold."""


def _utc(value: dt.datetime) -> dt.datetime:
    # The broker keeps UTC in timestamp without time zone; a naive value is taken as UTC.
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC)
    return value.replace(tzinfo=None)


def _body_matches(body: bytes | None, needle: str) -> bool:
    try:
        text = decode_body(body)
    except UnicodeDecodeError:
        return False
    return text is not None and needle in text.casefold()


def _message(row: Sequence[Any], bodies: bool) -> dict[str, Any]:
    (quarantine_id, status, quarantined_at, attempts, handle, type_name, sequence, message_id,
     body, error) = row
    return {
        "quarantine_id": quarantine_id,
        "status": status,
        "quarantined_at": iso(quarantined_at),
        "attempts": attempts,
        "conversation_handle": str(handle),
        "message_type_name": type_name,
        "message_sequence_number": sequence,
        "message_id": str(message_id),
        "error": error,
        "body": body_text(body) if bodies else None,
        "body_masked": not bodies,
    }


def quarantine(broker: Broker, queue_name: str, *, bodies: bool,
               error_contains: str | None = None, body_contains: str | None = None,
               since: dt.datetime | None = None) -> dict[str, Any]:
    """The queue's quarantined and parked (``retrying``) messages whose error holds
    ``error_contains`` and whose whole body holds ``body_contains`` (both ignoring case),
    quarantined at or after ``since``: the oldest MESSAGE_LIMIT of them (``truncated`` when
    more match), and all of them grouped by error (``groups``, see by_error()).

    The database filters by error and time and counts the groups; a body filter decodes each
    body as the client does (UTF-16 with a byte-order mark, else UTF-8), so it reads the
    queue's whole quarantine within the other filters: a search, as a message browser's is."""
    if body_contains and not bodies:
        raise BodiesWithheld("filtering by body content needs the right to see bodies"
                             " (Broker Message Bodies)")
    after = None if since is None else _utc(since)
    body_needle = (body_contains or "").casefold()
    with broker.transaction() as tx:
        runner = runner_of(tx)
        if not body_needle:
            rows = runner.run(runner.queries["ui_quarantine"],
                              [queue_name, error_contains, after, MESSAGE_LIMIT + 1])
            groups = [{
                "error": error, "count": int(count), "quarantine_ids": list(ids),
                "first_quarantined_at": iso(first), "last_quarantined_at": iso(last),
            } for error, count, first, last, ids in runner.run(
                runner.queries["ui_quarantine_groups"],
                [queue_name, error_contains, after, GROUP_IDS])]
        else:
            rows = [row for row in runner.run(runner.queries["ui_quarantine"],
                                              [queue_name, error_contains, after, None])
                    if _body_matches(row[8], body_needle)]
            groups = by_error([_message(row, False) for row in rows])
    return {"messages": [_message(row, bodies) for row in rows[:MESSAGE_LIMIT]],
            "truncated": len(rows) > MESSAGE_LIMIT, "groups": groups}


def by_error(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages (oldest first) grouped by their error, the largest group first, as
    console_quarantine_groups() groups them: how many, when the first and the last were
    quarantined, and the ids of the oldest GROUP_IDS (what replaying the group takes, that many
    at a time)."""
    groups: dict[str, dict[str, Any]] = {}
    for message in messages:
        group = groups.setdefault(message["error"], {
            "error": message["error"], "count": 0, "quarantine_ids": [],
            "first_quarantined_at": message["quarantined_at"]})
        group["count"] += 1
        if len(group["quarantine_ids"]) < GROUP_IDS:
            group["quarantine_ids"].append(message["quarantine_id"])
        group["last_quarantined_at"] = message["quarantined_at"]
    return sorted(groups.values(), key=lambda g: -g["count"])


def replay(broker: Broker, queue_name: str, quarantine_ids: Sequence[int], *,
           enable: bool) -> int:
    """Puts the messages back on their conversations, in sequence order (RECEIVE on the
    queue), and with ``enable`` enables the queue (ALTER on it): all in one transaction, so
    readers never meet a queue enabled without its replayed messages, nor replayed messages
    on a queue still disabled, and a refusal of either changes nothing. An id not waiting in
    the queue's quarantine is one the login cannot find (15151), and nothing is replayed."""
    with broker.transaction() as tx:
        runner = runner_of(tx)
        ((replayed,),) = runner.run(runner.queries["ui_replay"],
                                    [queue_name, sorted(set(quarantine_ids))])
        if enable:
            tx.alter_queue(queue_name, status=True)
    return int(replayed)


def discard(broker: Broker, queue_name: str, quarantine_ids: Sequence[int]) -> int:
    """Discards quarantined messages of the queue (RECEIVE on it): kept as ``discarded``,
    never delivered; an id not waiting in its quarantine refuses them all (15151)."""
    with broker.transaction() as tx:
        runner = runner_of(tx)
        ((discarded,),) = runner.run(runner.queries["ui_discard"],
                                     [queue_name, sorted(set(quarantine_ids))])
    return int(discarded)


def replay_and_enable(broker: Broker, queue_name: str, quarantine_ids: Sequence[int]) -> int:
    return replay(broker, queue_name, quarantine_ids, enable=True)
