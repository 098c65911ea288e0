"""No password of a route or DSN in what the broker prints, logs or stores as text: every
form a libpq connection string gives it, in `airflow-broker doctor` (text and JSON), the
transport's log and transmission_status."""

from __future__ import annotations

import json
import logging

import pytest

from airflow_broker.cli import main
from airflow_broker.redaction import redact
from tests.support.brokers import Pair, rows

SECRET = "Sup3r-s3cret"


@pytest.mark.parametrize(("text", "shown"), [
    (f"postgresql://u:{SECRET}@db.example:5432/b", "postgresql://u:***@db.example:5432/b"),
    (f"postgresql://u:{SECRET}%2F%40x@db/b?sslmode=require",
     "postgresql://u:***@db/b?sslmode=require"),
    (f"postgresql://u:{SECRET}@x@db/b", "postgresql://u:***@db/b"),
    (f"postgresql://u@db/b?password={SECRET}&sslmode=require",
     "postgresql://u@db/b?password=***&sslmode=require"),
    (f"postgres://db/b?sslmode=require&PASSWORD={SECRET}",
     "postgres://db/b?sslmode=require&PASSWORD=***"),
    (f"host=db user=u password={SECRET} dbname=b", "host=db user=u password=*** dbname=b"),
    (f"host=db password = '{SECRET} \\' x' dbname=b", "host=db password = *** dbname=b"),
    (f'invalid percent-encoded token: "{SECRET}%zz"', 'invalid percent-encoded token: "***"'),
    ("FATAL: password authentication failed for user \"u\"",
     "FATAL: password authentication failed for user \"u\""),
    ("postgresql://u@db/b?broker_schema=x", "postgresql://u@db/b?broker_schema=x"),
])
def test_every_form_of_a_password_is_masked(text: str, shown: str) -> None:
    assert redact(text) == shown


BAD_ROUTES = {
    "query": f"postgresql://nobody@127.0.0.1:1/nowhere?password={SECRET}",
    "escapes": f"postgresql://nobody:{SECRET}%zz@127.0.0.1:1/nowhere",
    "userinfo": f"postgresql://nobody:{SECRET}@127.0.0.1:1/nowhere",
}


@pytest.mark.parametrize("form", sorted(BAD_ROUTES))
def test_no_password_in_doctor_logs_or_transmission_status(
        pair: Pair, form: str, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    with pair.a.transaction() as tx:
        tx.create_route("to_T", BAD_ROUTES[form], service_name="T")
    pair.routes(forward=False)
    with pair.a.transaction() as tx:
        tx.send(pair.dialog(), "Req", "hello")
    with caplog.at_level(logging.INFO):
        assert pair.ta.step().held == 1
    (status,) = rows(pair.a, "SELECT transmission_status FROM broker.transmission_queue")[0]
    # Unreachable, or refused for a malformed address: either way the reason is kept.
    assert status.startswith("The target service broker ") and SECRET not in status
    assert "transport: postgresql://nobody" in caplog.text and SECRET not in caplog.text
    main(["doctor", "--dsn", pair.a.dsn])
    text = capsys.readouterr().out
    main(["doctor", "--dsn", pair.a.dsn, "--json"])
    report = capsys.readouterr().out
    assert "to_T" in text and SECRET not in text
    assert SECRET not in report and any(
        f["check"] == "routes" for f in json.loads(report)["findings"])


def test_a_dsn_that_cannot_connect_is_reported_without_its_password(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--dsn", f"postgresql://u:{SECRET}%zz@127.0.0.1:1/b"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("airflow-broker: cannot connect: ") and SECRET not in err
