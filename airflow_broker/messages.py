"""Received messages and the decoding of their bodies."""

from __future__ import annotations

import codecs
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from lxml import etree

ERROR_NS = "http://schemas.microsoft.com/SQL/ServiceBroker/Error"

ERROR = "http://schemas.microsoft.com/SQL/ServiceBroker/Error"
END_DIALOG = "http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog"
DIALOG_TIMER = "http://schemas.microsoft.com/SQL/ServiceBroker/DialogTimer"
EVENT_NOTIFICATION = "http://schemas.microsoft.com/SQL/Notifications/EventNotification"
DEFAULT = "DEFAULT"


# The largest body SEND accepts (64 MiB); the SQL function max_message_size() is the authority
# and says why.
MAX_MESSAGE_SIZE = 64 * 1024 * 1024


def decode_body(body: bytes | None) -> str | None:
    """Text of a body: UTF-16 when it starts with a byte-order mark (as broker-generated XML
    does), UTF-8 otherwise."""
    if body is None:
        return None
    if body.startswith(codecs.BOM_UTF16_LE) or body.startswith(codecs.BOM_UTF16_BE):
        return body.decode("utf-16")
    if body.startswith(codecs.BOM_UTF8):
        return body[len(codecs.BOM_UTF8) :].decode("utf-8")
    return body.decode("utf-8")


@dataclass(frozen=True)
class ErrorDocument:
    """The body of an Error message: positive codes come from END CONVERSATION WITH ERROR,
    negative ones from the broker (the negated SQL Server error number)."""

    code: int
    description: str


@dataclass(frozen=True)
class Message:
    """One row returned by RECEIVE, with Service Broker's queue columns."""

    status: int
    priority: int
    queuing_order: int
    conversation_group_id: uuid.UUID
    conversation_handle: uuid.UUID
    message_sequence_number: int
    service_name: str
    service_id: int
    service_contract_name: str
    service_contract_id: int
    message_type_name: str
    message_type_id: int
    validation: str
    message_body: bytes | None
    message_id: uuid.UUID
    # How often this message came back after a receiving transaction rolled back.
    attempts: int = 0

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Message:
        """A row of RECEIVE: the columns of the schema's ``received_message`` type, which are
        the fields above in their order (a test holds the two together), then whatever the
        statement adds after them."""
        return cls(**dict(zip(RECEIVED_COLUMNS, row, strict=False)))

    @property
    def is_end_dialog(self) -> bool:
        return self.message_type_name == END_DIALOG

    @property
    def is_error(self) -> bool:
        return self.message_type_name == ERROR

    @property
    def is_dialog_timer(self) -> bool:
        return self.message_type_name == DIALOG_TIMER

    def text(self) -> str | None:
        return decode_body(self.message_body)

    def xml(self) -> etree._Element | None:
        """The body parsed as an XML document (encoding declarations and BOMs honoured)."""
        if self.message_body is None:
            return None
        return parse_xml(self.message_body)

    def json(self) -> Any:
        text = self.text()
        return None if text is None else json.loads(text)

    def error(self) -> ErrorDocument:
        """The Code and Description of an Error message."""
        if not self.is_error:
            raise ValueError(f"message type {self.message_type_name!r} is not an Error message")
        return parse_error_body(self.message_body)


# No network access, no entity expansion: bodies come from other applications. huge_tree lifts
# libxml2's 10 MB limit on a single text node, which refused valid bodies as -9615: the size of
# a body is bounded by the message size, not by the parser.
XML_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=True)


def parse_xml(data: bytes) -> etree._Element:
    """An XML document from another application, parsed without entities or network."""
    return etree.fromstring(data, parser=XML_PARSER)


def parse_error_body(body: bytes | None) -> ErrorDocument:
    if body is None:
        raise ValueError("an Error message always has a body")
    root = parse_xml(body)
    code = root.findtext(f"{{{ERROR_NS}}}Code")
    description = root.findtext(f"{{{ERROR_NS}}}Description") or ""
    if code is None:
        raise ValueError("the Error document has no Code element")
    return ErrorDocument(code=int(code), description=description)


# What a row of RECEIVE starts with: the received_message type's columns, in order.
RECEIVED_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(Message))
