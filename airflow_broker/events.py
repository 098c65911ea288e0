"""EVENT_INSTANCE documents of event notifications (spec 19.3)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from lxml import etree

from airflow_broker.messages import EVENT_NOTIFICATION, Message

QUEUE_ACTIVATION = "QUEUE_ACTIVATION"
BROKER_QUEUE_DISABLED = "BROKER_QUEUE_DISABLED"


@dataclass(frozen=True)
class EventInstance:
    """The parsed body of an EventNotification message.

    QUEUE_ACTIVATION names the queue (``schema_name``, ``object_name``); BROKER_QUEUE_DISABLED,
    as in SQL Server, identifies it by ``database_id`` and ``object_id`` only, which
    ``broker.service_queues.object_id`` resolves.
    """

    event_type: str
    post_time: dt.datetime | None
    database_name: str | None
    database_id: int | None
    schema_name: str | None
    object_name: str | None
    object_id: int | None
    object_type: str | None
    document: etree._Element

    @classmethod
    def from_message(cls, message: Message) -> EventInstance:
        if message.message_type_name != EVENT_NOTIFICATION:
            raise ValueError(f"{message.message_type_name!r} is not an EventNotification message")
        root = message.xml()
        if root is None or root.tag != "EVENT_INSTANCE":
            raise ValueError("the message body is not an EVENT_INSTANCE document")

        def text(tag: str) -> str | None:
            value = root.findtext(tag)
            return value if value else None

        def number(tag: str) -> int | None:
            value = text(tag)
            return int(value) if value is not None else None

        post = text("PostTime")
        return cls(
            event_type=text("EventType") or "",
            post_time=dt.datetime.fromisoformat(post) if post else None,
            database_name=text("DatabaseName"),
            database_id=number("DatabaseID"),
            schema_name=text("SchemaName"),
            object_name=text("ObjectName"),
            object_id=number("ObjectID"),
            object_type=text("ObjectType"),
            document=root,
        )


def queue_disabled_event(message: Message) -> EventInstance | None:
    """The BROKER_QUEUE_DISABLED event a message carries; None for any other message."""
    try:
        event = EventInstance.from_message(message)
    except ValueError:
        return None
    return event if event.event_type == BROKER_QUEUE_DISABLED else None
