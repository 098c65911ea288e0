"""XML checks that PostgreSQL cannot make: well-formedness of any encoding and XML Schema
validation against a schema collection (lxml), run before the body reaches SEND."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from lxml import etree

from airflow_broker.errors import MessageTooLarge
from airflow_broker.messages import MAX_MESSAGE_SIZE, decode_body, parse_xml


class _RefuseExternal(etree.Resolver):
    """Answers every xs:include, xs:import and xs:redefine with an empty document: a schema
    collection must not make the sending client read its local files."""

    def resolve(  # type: ignore[override]  # lxml-stubs lack the context argument
            self, system_url: str, public_id: str, context: object) -> object:
        return self.resolve_string("", context, base_url=system_url)


_SCHEMA_PARSER = etree.XMLParser(resolve_entities=False, no_network=True)
_SCHEMA_PARSER.resolvers.add(_RefuseExternal())


@dataclass(frozen=True)
class MessageTypeInfo:
    """What SEND needs to know about a message type to check a body as the target would."""

    name: str
    validation_kind: str
    xml_collection_id: int | None
    schemas: tuple[str, ...]

    @property
    def checked_as(self) -> str | None:
        """The verdict label SQL checks against the type's current validation."""
        if self.validation_kind == "WELL_FORMED_XML":
            return "WELL_FORMED_XML"
        if self.validation_kind == "VALID_XML":
            return f"VALID_XML:{self.xml_collection_id}"
        return None


def well_formed_error(body: bytes) -> str | None:
    """None when the body is an XML document or fragment, else the parser's complaint."""
    try:
        parse_xml(body)
        return None
    except etree.XMLSyntaxError as document_error:
        try:
            text = decode_body(body) or ""
        except UnicodeDecodeError as exc:
            return f"{document_error} ({exc})"
        if text.lstrip().startswith("<?xml"):
            return str(document_error)
        try:
            # A fragment (several top-level elements, or text) is acceptable too.
            parse_xml(f"<fragment>{text}</fragment>".encode())
            return None
        except etree.XMLSyntaxError:
            return str(document_error)
    except (UnicodeDecodeError, ValueError) as exc:
        return str(exc)


_schema_cache: dict[str, etree.XMLSchema] = {}
_schema_lock = threading.Lock()


def compile_schema(xsd: str) -> etree.XMLSchema:
    """The compiled XMLSchema of an XSD document; raises etree.XMLSchemaParseError or
    etree.XMLSyntaxError when it is not a valid schema."""
    with _schema_lock:
        schema = _schema_cache.get(xsd)
        if schema is None:
            schema = etree.XMLSchema(etree.fromstring(xsd.encode(), parser=_SCHEMA_PARSER))
            _schema_cache[xsd] = schema
        return schema


def schema_error(body: bytes, schemas: Sequence[str]) -> str | None:
    """None when the body is valid against one schema of the collection, else why not."""
    problem = well_formed_error(body)
    if problem is not None:
        return problem
    document = parse_xml(body)
    reasons = []
    for xsd in schemas:
        try:
            schema = compile_schema(xsd)
        except (etree.XMLSchemaParseError, etree.XMLSyntaxError) as exc:
            # A collection stored through SQL is not checked: the target could not validate
            # against it either, so the body is refused rather than SEND failing.
            reasons.append(f"the schema collection holds a schema that is not valid: {exc}")
            continue
        if schema.validate(document):
            return None
        reasons.append(str(schema.error_log.last_error))  # type: ignore[attr-defined]
    return "; ".join(reasons) or "no schema in the collection"


def verdict(info: MessageTypeInfo, body: bytes | None) -> str | None:
    """The reason the target would reject the body (None when it would accept it)."""
    if body is None or info.validation_kind not in ("WELL_FORMED_XML", "VALID_XML"):
        return None
    if len(body) > MAX_MESSAGE_SIZE:
        # Refused before lxml spends time and memory on it; SEND would refuse it anyway.
        raise MessageTooLarge(f"The message body of {len(body)} bytes is larger than the "
                                 f"maximum message size of {MAX_MESSAGE_SIZE} bytes.")
    if info.validation_kind == "WELL_FORMED_XML":
        return well_formed_error(body)
    return schema_error(body, info.schemas)
