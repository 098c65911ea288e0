"""bench/floors.sql's statements, their shared parts put in place (bench.ops.floors)."""

from __future__ import annotations

import re
from importlib import resources

from airflow_broker.queries import named_blocks
from bench.ops import floors


def test_every_part_is_put_in_and_used() -> None:
    blocks = named_blocks(resources.files("bench").joinpath("floors.sql").read_text(),
                          "floors.sql")
    statements = floors()
    assert set(statements) == {name for name in blocks if not name.startswith("_")}
    for name, text in statements.items():
        assert not re.search(r"\{\w*\}|\{_", text), name
    named = {found for text in blocks.values() for found in re.findall(r"\{(_\w+)", text)}
    assert named == {name for name in blocks if name.startswith("_")}


def test_a_part_takes_the_indentation_of_the_line_that_names_it() -> None:
    text = floors()["receive_checked"]
    assert ("       AND (pg_has_role(session_user, (SELECT nspowner FROM pg_namespace\n"
            "                                        WHERE nspname = 'broker'), 'MEMBER')\n"
            "            OR EXISTS (SELECT 1 FROM broker.permissions p\n"
            "                        WHERE p.class = 1 AND p.major_id = q.object_id\n") in text
    assert "), picked AS (" in text and "WHERE m.queue_id = (SELECT object_id FROM q)" in text
