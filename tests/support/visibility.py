"""What PUBLIC may use of the broker schema: as the installed grants say, and as the list in
docs/security.md ("What PUBLIC may use") says."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg

SECURITY_DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
SECTION = "## What PUBLIC may use"

# Functions as 'name()', relations as 'name'.
_GRANTED_TO_PUBLIC = """
SELECT p.proname || '()'
  FROM pg_proc p
 WHERE p.pronamespace = 'broker'::regnamespace
   AND has_function_privilege('public', p.oid, 'EXECUTE')
UNION
SELECT c.relname
  FROM pg_class c
 WHERE c.relnamespace = 'broker'::regnamespace
   AND ((c.relkind IN ('r', 'v', 'm', 'p', 'f')
         AND has_table_privilege('public', c.oid,
                                 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER'))
        OR (c.relkind = 'S'
            AND has_sequence_privilege('public', c.oid, 'USAGE, SELECT, UPDATE')))
"""


def granted_to_public(dsn: str) -> set[str]:
    """Every function PUBLIC may execute ('name()') and every table, view or sequence it holds
    any right on ('name'), in the broker schema of ``dsn``."""
    with psycopg.connect(dsn) as conn:
        return {name for (name,) in conn.execute(_GRANTED_TO_PUBLIC).fetchall()}


def public_views(dsn: str) -> list[str]:
    """The views PUBLIC may select from."""
    with psycopg.connect(dsn) as conn:
        return [name for (name,) in conn.execute(
            "SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'broker'::regnamespace"
            " AND c.relkind = 'v' AND has_table_privilege('public', c.oid, 'SELECT')"
            " ORDER BY 1").fetchall()]


def documented_public_objects(text: str | None = None) -> set[str]:
    """The views ('name', marked '(view)') and functions ('name()') that docs/security.md lists
    as PUBLIC's, from the first column of the table of its section "What PUBLIC may use"."""
    text = SECURITY_DOC.read_text() if text is None else text
    start = text.index(SECTION) + len(SECTION)
    end = text.find("\n## ", start)
    listed: set[str] = set()
    for line in text[start:end if end >= 0 else None].splitlines():
        if not line.startswith("| `"):
            continue
        first_cell = line.split("|")[1]
        for name, call, view in re.findall(r"`(\w+)(\(\))?`( \(view\))?", first_cell):
            assert call or view, f"neither a function nor a view: {first_cell.strip()}"
            listed.add(name + call)
    return listed
