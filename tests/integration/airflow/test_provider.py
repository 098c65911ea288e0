"""Registration with Airflow: the built wheel, installed on its own, shows up in
``airflow providers list / hooks / triggers / queues / notifications``, and every example DAG
imports; in process, the provider info, the connection form, the hook and the common-messaging
``broker`` scheme."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tomllib
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from sqlalchemy import text

from tests.fixtures.airflow import ROOT, connection_json, scratch_dir
from tests.support.airflow_provider import BrokerHook

CLI_COMMANDS = {
    "list": ["providers", "list", "-o", "json"],
    "hooks": ["providers", "hooks", "-o", "json"],
    "triggers": ["providers", "triggers", "-o", "json"],
    "queues": ["providers", "queues", "-o", "json"],
    "notifications": ["providers", "notifications", "-o", "json"],
}

IMPORT_DAGS = f"""
import json
import airflow_broker
from airflow.dag_processing.dagbag import DagBag

bag = DagBag({str(ROOT / "dags")!r})
print(json.dumps({{"dags": sorted(bag.dag_ids), "errors": bag.import_errors,
                  "package": airflow_broker.__file__}}))
"""


@pytest.fixture(scope="module")
def installed() -> Iterator[tuple[Path, dict[str, str]]]:
    """A virtual environment holding only the built wheel of airflow-broker, on top of this
    environment's other packages (a .pth file), so nothing comes from the source tree."""
    with scratch_dir("installed") as base:
        yield from _install(base)


def _install(base: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(base / "dist"), str(ROOT)], check=True)
    (wheel,) = (base / "dist").glob("airflow_broker-*.whl")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip()
    # Lines of a .pth file only extend sys.path: the editable install's import hook (itself
    # a .pth in that folder) stays inactive, and the wheel's copy comes first.
    Path(purelib, "_shared_environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--ignore-installed",
                    "--no-index", "-q", str(wheel)], check=True, cwd=base)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update({"AIRFLOW_HOME": str(base / "home"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"})
    yield python, env


def run_airflow(installed: tuple[Path, dict[str, str]], args: list[str]) -> Any:
    python, env = installed
    done = subprocess.run([str(python), "-m", "airflow", *args], env=env, cwd=python.parent,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout[done.stdout.index("["):])


def test_airflow_cli_lists_the_installed_provider(installed: tuple[Path, dict[str, str]]
                                                  ) -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        outputs = dict(zip(CLI_COMMANDS, pool.map(lambda a: run_airflow(installed, a),
                                                  CLI_COMMANDS.values()), strict=True))
    (ours,) = [p for p in outputs["list"] if p["package_name"] == "airflow-broker"]
    assert ours["version"] == "0.1.0"
    assert "Service Broker" in ours["description"]
    (hook,) = [h for h in outputs["hooks"] if h["connection_type"] == "broker"]
    assert hook["class"] == "airflow_broker.hooks.broker.BrokerHook"
    assert hook["conn_id_attribute_name"] == "broker_conn_id"
    assert hook["package_name"] == "airflow-broker"
    triggers = [t for t in outputs["triggers"] if t["package_name"] == "airflow-broker"]
    assert sorted(t["class"] for t in triggers) == ["airflow_broker.triggers.broker",
                                                   "airflow_broker.triggers.stream"]
    assert {"queue_class_names": "airflow_broker.queues.broker.BrokerMessageQueueProvider"} \
        in outputs["queues"]
    assert {"notification_class_name":
            "airflow_broker.notifications.broker.QueueDisabledNotifier"} \
        in outputs["notifications"]


def test_the_provider_names_no_address_it_does_not_have(
        installed: tuple[Path, dict[str, str]]) -> None:
    """Airflow takes documentation-url from the distribution's "Documentation" project URL.
    The project has no public home, so its metadata names none (rather than a repository that
    does not exist), and the provider info only links to PostgreSQL."""
    assert "urls" not in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (info,) = run_airflow(installed, ["providers", "get", "airflow-broker", "--full",
                                      "-o", "json"])
    assert info["documentation-url"] is None
    assert [i["external-doc-url"] for i in info["integrations"]] == [
        "https://www.postgresql.org/"]


def test_every_example_dag_imports(installed: tuple[Path, dict[str, str]]) -> None:
    python, env = installed
    done = subprocess.run([str(python), "-c", IMPORT_DAGS], env=env, cwd=python.parent,
                          capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["errors"] == {}
    assert str(python.parent.parent) in result["package"]  # the wheel, not the source tree
    assert result["dags"] == sorted([
        "broker_enable_queue", "broker_maintenance", "broker_orders", "broker_orders_client",
        "broker_orders_setup", "broker_queue_alerts", "broker_spark_readers",
        "broker_spark_readers_setup", "broker_stock_trade", "broker_stock_trade_brokerage",
        "broker_trading_demo"])


def test_provider_info_matches_the_runtime_schema() -> None:
    from airflow_broker.get_provider_info import get_provider_info

    schema = json.loads(resources.files("airflow").joinpath("provider_info.schema.json")
                        .read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    assert info["package-name"] == "airflow-broker"


def test_connection_form_is_declarative(airflow_db: Path) -> None:
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()  # type: ignore[no-untyped-call]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the deprecated hook methods would warn
        widgets = manager.connection_form_widgets
        behaviours = manager.field_behaviours
    assert "extra__broker__broker_schema" in widgets
    assert "extra__broker__sslmode" in widgets
    assert behaviours["broker"]["relabeling"] == {"schema": "Database"}


def test_ssl_mode_starts_unchosen(airflow_db: Path) -> None:
    """What the UI's connection form gets (GET /ui/connections/hook_meta): its dropdown
    preselects the choice equal to the field's value, so None among the choices showed a
    chosen "null", saved as "sslmode": null. Nothing is chosen now, and the field stays
    optional (the "null" type)."""
    from airflow.api_fastapi.core_api.services.ui.connections import HookMetaService

    (meta,) = [m for m in HookMetaService.hook_meta_data() if m.connection_type == "broker"]
    assert meta.extra_fields is not None
    sslmode = meta.extra_fields["sslmode"]
    assert sslmode["value"] is None and "default" not in sslmode["schema"]
    assert sslmode["schema"]["enum"] == ["disable", "allow", "prefer", "require", "verify-ca",
                                         "verify-full"]
    assert "null" in sslmode["schema"]["type"]


def test_message_queue_trigger_resolves_the_broker_scheme() -> None:
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

    by_scheme = MessageQueueTrigger(scheme="broker", queue_name="OrderQueue", batch_size=5)
    classpath, kwargs = by_scheme.serialize()
    assert classpath == "airflow_broker.triggers.broker.BrokerMessageTrigger"
    assert kwargs["queue_name"] == "OrderQueue" and kwargs["batch_size"] == 5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the queue= form is deprecated by common-messaging
        by_uri = MessageQueueTrigger(queue="broker://orders_conn/OrderQueue")
        classpath, kwargs = by_uri.serialize()
    assert classpath == "airflow_broker.triggers.broker.BrokerMessageTrigger"
    assert (kwargs["broker_conn_id"], kwargs["queue_name"]) == ("orders_conn", "OrderQueue")


def test_hook(broker_conn: str, empty_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with BrokerHook() as hook:
        ok, message = hook.test_connection()
        assert ok, message
        assert hook.get_broker() is hook.get_broker()  # one engine per hook
        with hook.transaction() as tx:
            tx.create_queue("q")
        engine = hook.get_sqlalchemy_engine()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM broker.service_queues"
                                     " WHERE name = 'q'")).scalar() == 1
        engine.dispose()

    # An ordinary postgres connection works too; this database has no broker schema yet.
    monkeypatch.setenv("AIRFLOW_CONN_PLAIN_PG", connection_json(empty_dsn, "postgres"))
    with BrokerHook("plain_pg") as hook:
        ok, message = hook.test_connection()
    assert not ok and "airflow-broker install" in message


def test_connection_fields_make_the_dsn() -> None:
    from airflow.sdk import Connection
    from psycopg.conninfo import conninfo_to_dict

    from tests.support.airflow_provider import BrokerConnectionInfo

    conn = Connection(conn_id="x", conn_type="broker", host="db.example", port=6432,
                      login="app", password="s3cret", schema="trading",
                      extra=json.dumps({"extra__broker__broker_schema": "Trading Broker",
                                        "sslmode": "require", "unrelated": "ignored"}))
    info = BrokerConnectionInfo.from_connection(conn)
    assert info.schema == "Trading Broker"
    params = conninfo_to_dict(info.dsn)
    assert params == {"host": "db.example", "port": "6432", "user": "app",
                      "password": "s3cret", "dbname": "trading", "sslmode": "require",
                      "application_name": "airflow-broker"}
    assert BrokerConnectionInfo.from_connection(conn, "override").schema == "override"
