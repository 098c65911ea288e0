"""What ``airflow-broker doctor`` reports: findings (each with what it means and how to fix
it), the report that holds them, and what a check is."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg

from airflow_broker.queries import Queries
from airflow_broker.redaction import redact

ERROR = "error"
WARNING = "warning"
INFO = "info"


@dataclass(frozen=True)
class Finding:
    severity: str
    check: str
    subject: str
    problem: str
    fix: str

    def __post_init__(self) -> None:
        # Findings quote addresses and driver errors; the report never shows a password.
        for name in ("subject", "problem", "fix"):
            object.__setattr__(self, name, redact(getattr(self, name)))


@dataclass
class Report:
    schema: str
    findings: list[Finding] = field(default_factory=list)
    checks_run: list[str] = field(default_factory=list)
    # Checks the login could not run (it lacks the schema owner's rights): no finding of
    # theirs means nothing then.
    not_checked: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not any(f.severity in (ERROR, WARNING) for f in self.findings)

    def to_json(self) -> str:
        return json.dumps({
            "schema": self.schema,
            "healthy": self.healthy,
            "checks": self.checks_run,
            "not_checked": self.not_checked,
            "findings": [dataclasses.asdict(f) for f in self.findings],
        }, indent=2, default=str)

    def to_text(self) -> str:
        lines = [f"airflow-broker doctor: schema {self.schema}, {len(self.checks_run)} checks"]
        if not self.findings:
            lines.append("  everything looks right")
        for f in sorted(self.findings, key=lambda f: (f.severity != ERROR,
                                                      f.severity != WARNING)):
            lines.append(f"  [{f.severity.upper()}] {f.check}: {f.subject}")
            lines.append(f"      {f.problem}")
            lines.append(f"      fix: {f.fix}")
        lines.append("healthy" if self.healthy else "problems found")
        return "\n".join(lines)


Check = Callable[[psycopg.Connection[tuple[Any, ...]], str], Iterator[Finding]]


def rows(conn: psycopg.Connection[tuple[Any, ...]], query: str, schema: str,
          params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The rows of the named query ``query`` (sql/queries/doctor.sql)."""
    return conn.execute(Queries(schema)[query], params).fetchall()
