"""The README's first command: the demo runs end to end and tells the truth in its summary."""

from __future__ import annotations

import pytest

from airflow_broker.cli import main
from airflow_broker.demos.demo import run_demo


def test_demo_books_every_trade_once_in_order(
    dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_demo(dsn, accounts=6, trades_per_account=5, desks=2)
    assert result.sent == 31
    assert result.booked == 30
    assert result.acknowledged == 30
    assert result.booked_in_order
    assert len(result.errors) == 1 and result.errors[0].startswith("-9615")
    assert set(result.readers) <= {"reader-1", "reader-2"}
    assert result.ended == 6
    assert result.reclaimed == 6
    assert result.endpoints_left == 0
    out = capsys.readouterr().out
    assert "trades booked ........... 30" in out
    assert "errors received ......... 1" in out


def test_demo_command_is_repeatable(dsn: str) -> None:
    for _ in range(2):
        assert main(["demo", "--engine-only", "--dsn", dsn, "--accounts", "3",
                     "--trades", "2"]) == 0


def test_install_command(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["install", "--dsn", dsn, "--schema", "other_broker"]) == 0
    assert "applied" in capsys.readouterr().out
    assert main(["install", "--dsn", dsn, "--schema", "other_broker"]) == 0
    assert "already current" in capsys.readouterr().out
