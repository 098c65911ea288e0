"""The README's first command: the demo through Airflow (dag.test()) and two Spark readers."""

from __future__ import annotations

import pytest

from airflow_broker.demos.airflow_demo import run_demo
from tests.fixtures.airflow import scratch_dir


@pytest.mark.slow
def test_demo_runs_through_airflow_and_spark(
    dsn: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with scratch_dir("demo-home") as home:
        monkeypatch.setenv("AIRFLOW_BROKER_DEMO_HOME", str(home))
        assert run_demo(dsn, accounts=12, trades_per_account=6) == 0
    out = capsys.readouterr().out
    assert "trades sent ................ 72" in out
    assert "booked, in sequence order .." in out and "(yes)" in out
    assert "ALERT: queue SettlementQueue was disabled (POISON)" in out
    assert "endpoints reclaimed / left . 12 / 0" in out
