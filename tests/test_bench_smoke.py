"""The benchmark harness (bench/) runs end to end in its quickest mode.

Only the shape of the result is checked, never a number's size: a test must not depend on how
fast the machine is.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from bench import Options, PgmqUnavailable, run

MEASURED = ("a", "b", "c", "d", "e", "f", "g", "i")
NOT_YET_MEASURABLE = ("h", "j")


@pytest.fixture
def bench_dsn(server_dsn: str) -> Iterator[str]:
    """A new, empty database: the harness installs the broker schema and pgmq itself."""
    name = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(server_dsn, dbname=name)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def test_quick_run_reports_every_scenario_for_ours_and_the_peer(bench_dsn: str) -> None:
    try:
        result = run(Options.quick_preset(dsn=bench_dsn))
    except PgmqUnavailable as exc:
        pytest.fail(f"the benchmark's peer, pgmq, could not be installed from PyPI: {exc}")

    # The JSON written by `python -m bench` is this object: it must be strict JSON.
    json.dumps(result, allow_nan=False)
    scenarios = {scenario["id"]: scenario for scenario in result["scenarios"]}
    assert set(scenarios) == {*MEASURED, *NOT_YET_MEASURABLE}
    for scenario_id in MEASURED:
        scenario = scenarios[scenario_id]
        assert scenario["status"] == "measured", scenario_id
        assert scenario["rows"], scenario_id
        for row in scenario["rows"]:
            for side in ("ours", "peer"):
                value = row[side]
                assert isinstance(value, int | float) and math.isfinite(value), (
                    scenario_id, row["name"], side, value,
                )
    for scenario_id in NOT_YET_MEASURABLE:
        assert scenarios[scenario_id]["status"] == "not yet measurable", scenario_id
