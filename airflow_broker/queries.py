"""Named queries: the SQL that Python runs besides calls of the broker's functions, kept in
``sql/queries/*.sql`` as blocks headed ``-- name --``, and rendered once per schema.

Calls of the broker's functions (one per Service Broker statement) are rendered by
:meth:`Queries.call`, so their text stays identical and psycopg prepares it after a few calls.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from pathlib import Path

from psycopg import sql

QUERIES_DIR = Path(__file__).parent / "sql" / "queries"
DEFAULT_SCHEMA = "broker"
_HEADER = re.compile(r"^-- (\w+) --$", re.M)


def named_blocks(text: str, source: str) -> dict[str, str]:
    """The blocks of a file's ``text`` headed ``-- name --``, their comment lines left out (a
    ``%`` in a comment would be taken for a parameter)."""
    texts: dict[str, str] = {}
    parts = _HEADER.split(text)
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in texts:
            raise ValueError(f"{source}: query {name!r} is named twice")
        lines = [line for line in body.splitlines() if not line.lstrip().startswith("--")]
        texts[name] = "\n".join(lines).strip().rstrip(";")
    return texts


@functools.cache
def query_texts() -> dict[str, str]:
    """Every named query, ``{schema}`` where the broker's schema goes."""
    texts: dict[str, str] = {}
    for path in sorted(QUERIES_DIR.glob("*.sql")):
        for name, text in named_blocks(path.read_text(), path.name).items():
            if name in texts:
                raise ValueError(f"{path.name}: query {name!r} is named twice")
            texts[name] = text
    return texts


class Queries:
    """The named queries and the function calls of one broker schema."""

    def __init__(self, schema: str = DEFAULT_SCHEMA) -> None:
        self.schema = schema
        self._schema_sql = sql.Identifier(schema).as_string(None)
        self._rendered: dict[str, bytes] = {}
        self._calls: dict[tuple[str, int, tuple[str, ...]], bytes] = {}

    def __getitem__(self, name: str) -> bytes:
        text = self._rendered.get(name)
        if text is None:
            text = query_texts()[name].replace("{schema}", self._schema_sql).encode()
            self._rendered[name] = text
        return text

    def call(self, function: str, arity: int, casts: Sequence[str] | None = None) -> bytes:
        """``SELECT * FROM schema.function(%s, ...)``, each argument cast as ``casts`` says."""
        key = (function, arity, tuple(casts or ()))
        text = self._calls.get(key)
        if text is None:
            # Lists of bytes go in binary: psycopg's text format escapes each element in
            # Python (389 µs for 100 bodies of 100 bytes, against 25 µs in binary).
            args = [
                sql.SQL("{}::{}").format(
                    sql.SQL("%b" if cast == "bytea[]" else "%s"), sql.SQL(cast)
                ) if cast else sql.SQL("%s")
                for cast in (casts or [""] * arity)
            ]
            query = sql.SQL("SELECT * FROM {}.{}({})").format(
                sql.Identifier(self.schema), sql.Identifier(function), sql.SQL(", ").join(args)
            )
            text = query.as_bytes(None)
            self._calls[key] = text
        return text
