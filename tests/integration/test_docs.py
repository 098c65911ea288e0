"""What users read first stays true: the README example runs, and every error number the
broker can raise is documented."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg

from airflow_broker import Broker
from airflow_broker.worker.transport import address_of

ROOT = Path(__file__).resolve().parents[2]


def test_readme_example_runs(dsn: str, far_dsn: str) -> None:
    readme = (ROOT / "README.md").read_text()
    example, *snippets = re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
    assert "with Broker() as broker:" in example
    code = example.replace("with Broker() as broker:", "with Broker(dsn) as broker:")
    exec(compile(code, "README.md", "exec"), {"dsn": dsn})
    with Broker(dsn) as broker, broker.transaction() as tx:
        assert tx.receive("TraderQueue") == []  # acknowledged, and both sides have ended
    with psycopg.connect(dsn) as conn:
        states = conn.execute("SELECT is_initiator, state FROM broker.conversation_endpoints")
        assert states.fetchall() == [(False, "CD")]  # the target waits for reclaim
    # The example between two databases runs on this database and a second one.
    [between] = [s for s in snippets if "postgresql://app@db1/trading" in s]
    snippets.remove(between)
    code = (between.replace('"postgresql://app@db1/trading"', repr(address_of(dsn)))
            .replace('"postgresql://app@db2/brokerage"', repr(address_of(far_dsn))))
    namespace: dict[str, object] = {"Broker": Broker}
    exec(compile(code, "README.md", "exec"), namespace)
    with psycopg.connect(dsn) as conn:
        waiting = conn.execute("SELECT to_service_name, transmission_status"
                               " FROM broker.transmission_queue").fetchall()
    assert waiting == [("//Trading/BrokerageService", "")]
    for name in ("trader", "brokerage"):
        opened = namespace[name]
        assert isinstance(opened, Broker)
        opened.close()
    # The shorter snippets run inside a transaction, as their text assumes; the role the
    # activation snippet's readers run as exists, as EXECUTE AS needs.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE ROLE trading_reader LOGIN")
    try:
        for snippet in snippets:
            with Broker(dsn) as broker, broker.transaction() as tx:
                exec(compile(snippet, "README.md", "exec"), {"tx": tx})
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP OWNED BY trading_reader")
            conn.execute("DROP ROLE trading_reader")


def test_every_error_number_is_documented(dsn: str) -> None:
    documented = set(re.findall(r"^\| (\d+) \|", (ROOT / "docs/errors.md").read_text(), re.M))
    with psycopg.connect(dsn) as conn:
        raised = {str(n) for (n,) in conn.execute(
            "SELECT error_number FROM broker.error_messages").fetchall()}
    assert raised <= documented, sorted(raised - documented)
