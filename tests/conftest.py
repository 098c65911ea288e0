"""The test tiers, each a folder:

* ``tests/unit``: no database (a fixture refuses to connect to one);
* ``tests/integration``: a real PostgreSQL, one fresh database per test, Airflow through
  ``dag.test()`` and Spark on ``local[2]`` (``tests/integration/airflow``);
* ``tests/least_privilege``: the broker schema owned by a dedicated role, and applications
  logged in as roles with only the documented grants;
* ``tests/system``: the deployment users run, Airflow's components as separate processes and
  a Spark standalone cluster.

Each test is marked with its tier (``pytest -m unit``, ``-m "not system"``). The fixtures are
plugins in ``tests/fixtures``; helpers that tests share are in ``tests/support``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["tests.fixtures.postgres", "tests.fixtures.airflow", "tests.fixtures.system"]

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "integration", "least_privilege", "system")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = item.path.relative_to(TESTS).parts[0]
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
