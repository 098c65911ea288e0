"""Code the documentation quotes from the example DAGs stays what the DAGs run: a code block
after ``<!-- include PATH NAME -->`` equals the lines between ``# [START NAME]`` and
``# [END NAME]`` in PATH (the example DAGs themselves run in every test tier)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = re.compile(r"<!-- include (\S+) (\w+) -->\n```\w*\n(.*?)```", re.S)


def region(path: Path, name: str) -> str:
    text = path.read_text()
    start = text.index(f"# [START {name}]\n") + len(f"# [START {name}]\n")
    return text[start:text.index(f"# [END {name}]", start)]


def test_quoted_examples_equal_their_source() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    quoted = [(page.name, match) for page in pages
              for match in INCLUDE.finditer(page.read_text())]
    assert quoted, "no page quotes an example any more: remove this test or the markers"
    for page, match in quoted:
        source, name, block = match.groups()
        assert block == region(ROOT / source, name), f"{page} quotes {source} [{name}]"
