"""The benchmark harness (bench/) runs end to end in its quickest mode.

Only the shape of the result is checked, never a number's size: a test must not depend on how
fast the machine is. The quick run includes the Spark readers (j), so it starts spark-submit once:
about 15 s of the run; and delivery between two brokers (k), which creates a second database on
the server for a few seconds.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from bench import (
    Options,
    PgmqUnavailable,
    client_cost,
    commit_cost,
    dialog_cost,
    jit_cost,
    permission_cost,
    run,
)
from bench.cross_db import far_database_name
from bench.scenario import SCENARIOS, Env
from bench.spark_readers import drain, missing_requirements


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
    assert set(scenarios) == set(SCENARIOS)
    measured = list(SCENARIOS)
    if missing_requirements() is not None:
        # Without Java (or spark-submit) the Spark readers cannot run: j must say so.
        assert scenarios["j"]["status"] == "unavailable", scenarios["j"]
        measured.remove("j")
    for scenario_id in measured:
        scenario = scenarios[scenario_id]
        assert scenario["status"] == "measured", scenario_id
        assert scenario["rows"], scenario_id
        for row in scenario["rows"]:
            for side in ("ours", "peer"):
                value = row[side]
                assert isinstance(value, int | float) and math.isfinite(value), (
                    scenario_id, row["name"], side, value,
                )
    assert_delivery_between_brokers(scenarios["k"], bench_dsn)


def assert_delivery_between_brokers(k: dict[str, object], bench_dsn: str) -> None:
    """k reports throughput (one message per transaction and 100) and latency (p50, p99) for
    both sides, across two databases and within one, the floor of both sides (its transport
    delivered to B), and drops the database it created."""
    assert k["status"] == "measured", k
    rows = cast(list[dict[str, object]], k["rows"])
    names = [str(row["name"]) for row in rows]
    assert len(rows) == 7, names
    assert sum("received/s" in name for name in names) == 5, names
    assert [name.rsplit(", ", 1)[-1] for name in names[5:]] == ["p50", "p99"], names
    floor = rows[2]
    assert str(floor["name"]).startswith("the floor of SEND 100"), floor
    assert floor["peer_label"] == "the floor within one database", floor
    assert [row["peer_label"] for row in rows[3:5]] == ["the floor A to B",
                                                        "the floor within A"], names
    for row in rows:
        for side in ("ours", "peer"):
            value = row[side]
            assert isinstance(value, int | float) and math.isfinite(value), (row, side)
            if row["unit"] == "ms" or row is floor:
                # The floor's own transport moved messages from A to B.
                assert value > 0, (row, side)
    for row in rows[:2] + rows[5:]:
        assert "one database" in str(row["peer_label"]), row
    with psycopg.connect(bench_dsn) as conn:
        left = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                            [far_database_name(bench_dsn)]).fetchone()
    assert left is None, "k left its second database behind"


def test_spark_scenario_without_java_says_so_and_does_not_fail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    said: list[str] = []
    # It must stop before it touches the database.
    env = cast(Env, SimpleNamespace(progress=said.append))
    scenario = drain(env)
    assert scenario.status == "unavailable"
    assert "Java" in scenario.note and not scenario.rows
    assert said and "Java" in said[0]


def test_permission_cost_measures_before_and_after_side_by_side(bench_dsn: str) -> None:
    """bench.permission_cost installs the schema of the commit before the permission checks
    next to the current one and reports both for each variant, then leaves nothing behind."""
    report = permission_cost.run(Options(rounds=1, seconds=0.2, dsn=bench_dsn),
                                 permission_cost.default_before())
    rows = {line.split("|")[1].strip(): line for line in report.splitlines()
            if line.startswith("| ") and line.split("|")[3].strip().endswith("x")}
    assert set(rows) == {"before, application", "after, application", "after, schema owner"}
    for line in rows.values():
        send, receive = (float(cell.strip().replace(",", ""))
                         for cell in line.split("|")[2:5:2])
        assert send > 0 and receive > 0
    with psycopg.connect(bench_dsn) as conn:
        left = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'broker%'"
                            " UNION ALL SELECT rolname FROM pg_roles"
                            " WHERE rolname = 'bench_application'").fetchall()
    assert left == []


def test_commit_cost_reports_ours_and_bare_after_a_pause_and_in_a_loop(bench_dsn: str) -> None:
    report = commit_cost.run(Options(rounds=1, dsn=bench_dsn), commits=5)
    rows = [line.split("|")[1:5] for line in report.splitlines()
            if line.startswith("| ") and line.rstrip().endswith("x |")]
    assert [name.strip() for name, *_ in rows] == [
        "bare INSERT, after a pause", "ours SEND, after a pause",
        "bare INSERT, tight loop", "ours SEND, tight loop"]
    for _, p50, p90, ratio in rows:
        assert 0 < float(p50) <= float(p90)
        assert float(ratio.strip().rstrip("x")) > 0


def test_client_cost_reports_ours_and_plain_psycopg_side_by_side(bench_dsn: str) -> None:
    report = client_cost.run(Options(rounds=1, dsn=bench_dsn), transactions=20)
    rows = [[cell.strip() for cell in line.split("|")[1:6]] for line in report.splitlines()
            if line.startswith("| ") and line.rstrip().endswith("x |")]
    assert [(step, name.split(":")[0]) for step, name, *_ in rows] == [
        (step, side) for step in client_cost.STEPS for side in ("ours", "plain psycopg")]
    for _, _, cpu, _, ratio in rows:
        assert float(cpu.replace(",", "")) > 0
        assert float(ratio.rstrip("x")) > 0
    assert all(row[4] == "1.00x" for row in rows[1::2])
    # The warm-up and the round of each side: every SEND a message of 100 bytes on the queue,
    # every END an EndDialog after its dialog's first (empty) message; every RECEIVE took one
    # of the messages sent for it, and left none.
    each = 2 * (20 + 2)
    with psycopg.connect(bench_dsn) as conn:
        bodies: dict[int, int] = dict(conn.execute(
            "SELECT coalesce(length(m.message_body), 0), count(*)"
            " FROM broker.queue_messages m GROUP BY 1").fetchall())
        end_dialogs = conn.execute(
            "SELECT count(*) FROM broker.queue_messages m JOIN broker.message_types t"
            " ON t.message_type_id = m.message_type_id"
            " WHERE t.name = 'http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog'"
        ).fetchone()
    assert bodies[100] == each
    assert end_dialogs == (each,)
    assert bodies[0] == 2 * each


def test_dialog_cost_reports_each_step_plain_pipelined_the_checked_floor_and_pgmq(
        bench_dsn: str) -> None:
    """bench.dialog_cost runs the three steps of a dialog (each checks that it found its work,
    or the run fails) plain, pipelined and as their complete checked floor, and pgmq's
    request/reply, and
    reports the time and CPU of each; the test server runs on this machine, so the backends'
    CPU is there too."""
    costs = dialog_cost.run(calls=5, repeat=1, dsn=bench_dsn)
    steps = ["BEGIN DIALOG + SEND + COMMIT", "RECEIVE + SEND reply + END + COMMIT",
             "RECEIVE + END + COMMIT"]
    assert list(costs) == [*steps, *(f"{s}, pipelined" for s in steps),
                           *(f"{s}, the complete checked floor" for s in steps),
                           dialog_cost.PGMQ_STEP]
    for name, cost in costs.items():
        assert cost.wall > 0 and cost.client >= 0, name
        assert cost.backend is not None and cost.backend >= 0, name
        # Poison detection's side backend records the steps that receive, and only those, the
        # complete checked floor's as ours.
        assert (cost.side is not None) == ("RECEIVE" in name), name


def test_jit_cost_measures_send_and_receive_with_jit_on_and_off(bench_dsn: str) -> None:
    """bench.jit_cost runs SEND and RECEIVE (each RECEIVE checks that it found the message a
    SEND left) in sessions with JIT on and off, and says whether the server can JIT-compile
    (the embedded one cannot)."""
    with psycopg.connect(bench_dsn) as conn:
        row = conn.execute("SELECT pg_jit_available()").fetchone()
    available, medians = jit_cost.run(bench_dsn, calls=3, rounds=2)
    assert row is not None and available is row[0]
    assert set(medians) == {"on", "off"}
    for setting, (send, receive) in medians.items():
        assert send > 0 and receive > 0, setting


def test_ui_console_measures_every_page_in_each_state(bench_dsn: str, tmp_path: Path) -> None:
    """bench.ui_console on a small broker: each page measured empty, filled and vacuumed, and
    the depths the overview showed checked against what was sent (exact below the limit,
    estimated above)."""
    from bench import ui_console

    out = tmp_path / "ui.json"
    assert ui_console.main(["--queues", "3", "--messages", "2400", "--repeat", "2",
                            "--dsn", bench_dsn, "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    assert (written["queues"], written["messages"]) == (3, 2400)
    results = written["results"]
    assert list(results) == list(ui_console.STATES)
    for pages in results.values():
        assert set(pages) == {"overview", "queue page (deep queue)", "conversations"}
        assert all(len(samples) == 2 and all(t > 0 for t in samples)
                   for samples in pages.values())
