"""What the broker operators share: their base class, the warnings they give, and the way
they read handles and bodies given through XCom or templates."""

from __future__ import annotations

import base64
import json
import uuid
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from airflow.exceptions import AirflowProviderDeprecationWarning
from airflow.sdk import BaseOperator
from lxml import etree

from airflow_broker.dialogs import conversation_handle
from airflow_broker.errors import HandleIsNull, IncorrectSyntax
from airflow_broker.hooks.broker import BrokerHook
from airflow_broker.messages import parse_xml

if TYPE_CHECKING:
    pass

BODY_FORMATS = ("auto", "text", "json", "xml", "bytes")


class FireAndForgetWarning(UserWarning):
    """A dialog begun, sent on and ended by the initiator in one transaction."""


class BrokerDeprecationWarning(AirflowProviderDeprecationWarning):
    """A parameter of airflow-broker that has a new name; the old one still works, for now."""

    deprecated_provider_since = "0.1.0"


def renamed(old_name: str, old_value: Any, new_name: str, new_value: Any) -> Any:
    """``new_value``, or ``old_value`` given under the parameter's deprecated name."""
    if old_value is None:
        return new_value
    if new_value is not None:
        raise IncorrectSyntax(
            f"{old_name} is the deprecated name of {new_name}: give only {new_name}")
    warnings.warn(f"{old_name} is deprecated: use {new_name}, as the engine does",
                  BrokerDeprecationWarning, stacklevel=3)
    return old_value


def to_handle(value: Any) -> uuid.UUID:
    """A conversation handle from a UUID, its string, or a dict that carries one."""
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, Mapping):
        value = value.get("conversation_handle")
    if value is None or str(value).strip() in ("", "None"):
        raise HandleIsNull("no conversation handle given")
    return conversation_handle(str(value).strip())


def to_handles(value: Any) -> list[uuid.UUID]:
    """Handles from one handle or a list of them (a list rendered as text is accepted)."""
    if isinstance(value, str) and value.strip().startswith("["):
        value = json.loads(value.replace("'", '"'))
    if isinstance(value, list | tuple | set):
        return [to_handle(v) for v in value]
    return [to_handle(value)]


def encode_body(body: Any, body_format: str = "auto") -> bytes | None:
    """A message body as bytes. ``auto``: bytes as they are, str as UTF-8 text, an lxml
    element as XML, anything else as JSON. ``json`` and ``xml`` check str bodies (JSON text,
    well-formed XML); ``bytes`` takes str as base64."""
    if body_format not in BODY_FORMATS:
        raise IncorrectSyntax(f"body_format must be one of {BODY_FORMATS}, not {body_format!r}")
    if body is None:
        return None
    if isinstance(body, etree._Element):
        if body_format not in ("auto", "xml"):
            raise IncorrectSyntax(f"an XML element cannot be sent as {body_format}")
        return etree.tostring(body, encoding="utf-8")
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    if body_format == "bytes":
        return base64.b64decode(str(body), validate=True)
    if body_format == "json":
        if isinstance(body, str):
            json.loads(body)
            return body.encode("utf-8")
        return json.dumps(body).encode("utf-8")
    if body_format == "xml":
        text = str(body)
        parse_xml(text.encode("utf-8"))
        return text.encode("utf-8")
    if body_format == "text" or isinstance(body, str):
        return str(body).encode("utf-8")
    return json.dumps(body).encode("utf-8")


class BrokerBaseOperator(BaseOperator):
    """Holds the connection id and hands out a hook that is closed when ``execute`` ends."""

    def __init__(self, *, broker_conn_id: str = BrokerHook.default_conn_name,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.broker_conn_id = broker_conn_id

    @contextmanager
    def hook(self) -> Iterator[BrokerHook]:
        hook = BrokerHook(self.broker_conn_id)
        try:
            yield hook
        finally:
            hook.close()
