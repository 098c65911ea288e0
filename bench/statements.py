"""The statements inside the broker's SQL functions, as EXPLAIN can run them.

A statement the benchmark explains is marked in its ``sql/functions`` file by a comment on the
lines before it: ``-- explain NAME: var1 type1, var2 type2, ...`` (continued on comment lines
that start with ``--   ``). Its text is taken from there up to its semicolon; PL/pgSQL's
``INTO`` target, ``RETURN QUERY`` and an assignment around a scalar subquery are left out, and
the named variables become ``$1``, ``$2``, ... of the given types. So the benchmark explains
what the functions run, not copies that drift from them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from airflow_broker.migrations import functions

_MARK = re.compile(r"^[ \t]*-- explain (\w+): (.*(?:\n[ \t]*--   .*)*)$", re.M)
_INTO = re.compile(r"\s+INTO\s+[\w.,\s]+?(?=\s+FROM\b|\s*$)")
_ASSIGNED = re.compile(r"^\w+\s*:=\s*\((.*)\)$", re.S)


@dataclass(frozen=True)
class Statement:
    text: str
    types: tuple[str, ...]

    def prepare(self, name: str) -> str:
        """``PREPARE name (types) AS text``."""
        return f"PREPARE {name} ({', '.join(self.types)}) AS {self.text}"


def engine_statements() -> dict[str, Statement]:
    found: dict[str, Statement] = {}
    for file in functions():
        text = file.text
        for mark in _MARK.finditer(text):
            name = mark.group(1)
            declared = re.sub(r"\n[ \t]*--   ", " ", mark.group(2))
            variables = [item.strip().rsplit(" ", 1) for item in declared.split(",")]
            end = text.index(";", mark.end())
            statement = text[mark.end():end].strip()
            statement = statement.removeprefix("RETURN QUERY").strip()
            assigned = _ASSIGNED.match(statement)
            if assigned:
                statement = assigned.group(1).strip()
            if statement.startswith(("SELECT", "WITH")):
                statement = _INTO.sub("", statement, count=1)
            for number, (variable, _) in enumerate(variables, 1):
                statement = re.sub(rf"(?<![\w.]){re.escape(variable)}(?!\w)", f"${number}",
                                   statement)
            if name in found:
                raise ValueError(f"{file.name}: statement {name!r} is marked twice")
            found[name] = Statement(statement, tuple(t for _, t in variables))
    return found
