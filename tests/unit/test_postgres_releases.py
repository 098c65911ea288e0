"""`airflow-broker doctor`'s check of the server's release against the table of PostgreSQL
releases the package was built with."""

from __future__ import annotations

import datetime as dt

import pytest

from airflow_broker.admin import postgres_releases as releases
from airflow_broker.admin.doctor import WARNING, release_finding
from tests.support.postgres_builds import BUILDS, release

TODAY = dt.date(2026, 11, 27)


def version_num(version: str) -> int:
    major, minor = version.split(".")
    return int(major) * 10000 + int(minor)


@pytest.mark.parametrize("major", sorted(releases.LATEST_MINOR))
def test_the_latest_minor_of_a_supported_major_is_current(major: int) -> None:
    latest = releases.LATEST_MINOR[major]
    before_end = dt.date.fromisoformat(releases.END_OF_LIFE[major]) - dt.timedelta(days=1)
    assert release_finding(version_num(latest), min(TODAY, before_end)) is None


def test_an_older_minor_lacks_the_security_releases_after_it() -> None:
    finding = release_finding(version_num("16.2"), TODAY)
    assert finding is not None
    assert (finding.severity, finding.check, finding.subject) == (
        WARNING, "server", "PostgreSQL 16.2")
    assert f"the latest known on {releases.WRITTEN} is 16.16" in finding.problem
    assert finding.fix.startswith("upgrade to 16.16 ")


def test_minors_compare_as_numbers_not_as_text() -> None:
    # 17.12 > 17.9 although "17.12" < "17.9"; 170012 is what the server reports for 17.12.
    assert releases.LATEST_MINOR[17] == "17.12"
    assert release_finding(170012, TODAY) is None
    assert release_finding(170009, TODAY) is not None


def test_a_major_past_its_end_of_life_gets_no_more_fixes() -> None:
    finding = release_finding(version_num(releases.LATEST_MINOR[14]), TODAY)
    assert finding is not None
    assert "past its end of life (2026-11-12)" in finding.problem
    assert finding.fix.startswith(f"upgrade to PostgreSQL {max(releases.LATEST_MINOR)} ")
    unsupported = release_finding(130022, TODAY)
    assert unsupported is not None and "PostgreSQL 13 is past its end of life" in (
        unsupported.problem)


def test_a_major_newer_than_the_table_is_not_judged() -> None:
    assert release_finding((max(releases.LATEST_MINOR) + 1) * 10000 + 1, TODAY) is None


def test_the_table_covers_the_supported_majors_and_says_when_it_was_written() -> None:
    assert set(releases.LATEST_MINOR) == set(releases.END_OF_LIFE) == set(range(14, 19))
    for major, latest in releases.LATEST_MINOR.items():
        assert latest.startswith(f"{major}.")
    assert dt.date.fromisoformat(releases.WRITTEN)


def test_every_supported_major_has_a_test_server_of_a_release_the_table_knows() -> None:
    """`make test-postgres` can run the engine's tiers on each major the doctor counts as
    supported, and no pinned build is newer than the table (which would mean the table is out
    of date)."""
    assert set(BUILDS) == set(releases.LATEST_MINOR)
    for major, latest in releases.LATEST_MINOR.items():
        build_minor = int(release(major).split(".")[1])
        assert release(major).startswith(f"{major}.")
        assert build_minor <= int(latest.split(".")[1]), (major, release(major), latest)
