"""Unit tests run without a database: connecting to one fails the test."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest


@pytest.fixture(autouse=True)
def no_database(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a unit test connected to a database: it belongs in "
                             "tests/integration")

    monkeypatch.setattr(psycopg.Connection, "connect", refuse)
    monkeypatch.setattr(psycopg.AsyncConnection, "connect", refuse)
