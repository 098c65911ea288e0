"""The system tier's hooks: every test here is marked ``system``; a failed test's report carries
the tails of the deployment's logs, and the session's folder is kept and named at the end. The
fixtures are tests/fixtures/system.py."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_broker import Broker
from tests.fixtures.system import FAILED_KEY, HOME_KEY, TIMINGS_KEY, SystemDatabases
from tests.support.deployment import Deployment
from tests.support.system_events import set_up_events_app

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.system)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    if report.failed and item.path.is_relative_to(HERE):
        item.session.stash[FAILED_KEY] = True
        deployment = getattr(item, "funcargs", {}).get("airflow_deployment")
        if isinstance(deployment, Deployment):
            report.sections.append(("system deployment logs", deployment.log_tails()))
    return report


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int,
                            config: pytest.Config) -> None:
    timings = config.stash.get(TIMINGS_KEY, None)
    if timings:
        terminalreporter.write_line(
            "system deployment startup: " + ", ".join(f"{k} {v:.1f} s"
                                                      for k, v in timings.items()))
    home = config.stash.get(HOME_KEY, None)
    if home is not None and home.exists():
        terminalreporter.write_line(f"system deployment files kept in {home}")


@pytest.fixture(scope="session")
def events_app(system_databases: SystemDatabases) -> Iterator[Broker]:
    """The application of tests/system/dags/s_events.py, set up once for the modules that
    use it (tests/support/system_events.py)."""
    with Broker(system_databases.broker_dsn, poll_interval=0.2) as broker:
        set_up_events_app(broker, system_databases)
        yield broker
