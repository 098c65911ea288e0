"""Results: rows of peer vs ours with their targets, as a table and as JSON.

A target is reported PASS or MISS and never fails the run: the numbers are the product.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

TargetKind = Literal["ratio_at_least", "ratio_at_most", "ours_at_least", "ours_at_most"]
# "unavailable": the scenario cannot run on this machine (e.g. no Java for Spark); "failed": it
# ran and broke, while the other scenarios' results stand. The note says why.
Status = Literal["measured", "not yet measurable", "unavailable", "failed", "skipped"]


@dataclass(frozen=True)
class Target:
    kind: TargetKind
    value: float
    text: str

    def verdict(self, ours: float | None, ratio: float | None) -> str:
        measured = ratio if self.kind.startswith("ratio") else ours
        if measured is None or math.isnan(measured):
            return "n/a"
        passed = (measured <= self.value if self.kind.endswith("at_most")
                  else measured >= self.value)
        return "PASS" if passed else "MISS"


@dataclass
class Row:
    name: str
    unit: str
    peer_label: str
    peer: float | None
    ours: float | None
    higher_is_better: bool = True
    target: Target | None = None
    # Per-round values behind the medians, for the JSON.
    peer_rounds: list[float] = field(default_factory=list)
    ours_rounds: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.peer is None or self.ours is None or self.peer == 0:
            return None
        return self.ours / self.peer

    @property
    def round_ratios(self) -> list[float]:
        """Ours over peer round by round (each round measures both sides, one after the other);
        empty when the rounds do not pair up."""
        if len(self.peer_rounds) != len(self.ours_rounds):
            return []
        return [ours / peer for peer, ours in zip(self.peer_rounds, self.ours_rounds, strict=True)
                if peer]

    @property
    def verdict(self) -> str:
        return self.target.verdict(self.ours, self.ratio) if self.target else ""

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "unit": self.unit,
            "higher_is_better": self.higher_is_better,
            "peer_label": self.peer_label,
            "peer": self.peer,
            "ours": self.ours,
            "ours_over_peer": self.ratio,
            "ours_over_peer_rounds": self.round_ratios,
            "target": None if self.target is None else {
                "kind": self.target.kind, "value": self.target.value, "text": self.target.text,
            },
            "verdict": self.verdict or None,
            "peer_rounds": self.peer_rounds,
            "ours_rounds": self.ours_rounds,
            "note": self.note,
        }


@dataclass
class Scenario:
    id: str
    title: str
    status: Status = "measured"
    note: str = ""
    rows: list[Row] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "status": self.status, "note": self.note,
                "rows": [row.as_json() for row in self.rows]}


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile: with 200 samples p99 is the second largest, not interpolated."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _as_ratio(row: Row, ratio: float) -> str:
    return f"{ratio:.0%}" if row.peer_label.startswith("bare") else f"{ratio:.2f}x"


def _ratio(row: Row) -> str:
    return "-" if row.ratio is None else _as_ratio(row, row.ratio)


def _round_range(row: Row) -> str:
    """The lowest and highest ratio of a round: where a target falls inside, the verdict is the
    machine's as much as the code's."""
    ratios = row.round_ratios
    if len(ratios) < 2:
        return ""
    low, high = _as_ratio(row, min(ratios)), _as_ratio(row, max(ratios))
    return f"{low.rstrip('x%')}-{high}"


def table(scenarios: Sequence[Scenario]) -> str:
    """A plain-text table (also valid Markdown)."""
    header = ["", "Measurement", "vs peer", "Unit", "Peer", "Ours", "Ours/peer", "Per round",
              "Target", ""]
    lines = [header]
    for scenario in scenarios:
        if scenario.status != "measured":
            lines.append([scenario.id, scenario.title, "-", "-", "-", "-", "-", "", "-",
                          scenario.status])
            continue
        for row in scenario.rows:
            unit = row.unit + ("" if row.higher_is_better else " (lower=better)")
            lines.append([
                scenario.id, row.name, row.peer_label, unit, _number(row.peer),
                _number(row.ours), _ratio(row), _round_range(row),
                row.target.text if row.target else "",
                row.verdict,
            ])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    right = {4, 5, 6, 7}

    def render(line: list[str]) -> str:
        cells = [c.rjust(w) if i in right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(line, widths, strict=True))]
        return "| " + " | ".join(cells) + " |"

    rule = "|" + "|".join(
        "-" * (w + 1) + ":" if i in right else "-" * (w + 2) for i, w in enumerate(widths)
    ) + "|"
    return "\n".join([render(lines[0]), rule, *(render(line) for line in lines[1:])])
