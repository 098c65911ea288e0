"""The wheel installed with pip's resolver into an Airflow that users already run: nothing
they had is upgraded or downgraded, the provider is found, and its DAG-facing modules import.

The user's environments are made the way Airflow's installation guide makes them: Airflow
and its providers first, pinned, then the provider, with the environment's versions as
constraints. They are resolved from the package index at the time of the run (Airflow's
published constraints files live on GitHub, which the tests do not reach): the newest Airflow
with a Spark provider of the 5.x line, PySpark 3.5 (a Spark 3.5 cluster's driver) and the FAB
auth manager most deployments log in with, and the lowest Airflow the provider supports with the
newest Spark provider and PySpark 4.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from airflow_broker.demos.ui_demo import sqlalchemy_url
from tests.fixtures.airflow import connection_json

ROOT = Path(__file__).resolve().parents[2]
UV = Path(sys.executable).with_name("uv")

FAB_ENVIRONMENT = "newest Airflow, Spark 3.5, FAB"
USER_ENVIRONMENTS = {
    FAB_ENVIRONMENT: ["apache-airflow==3.3.2", "apache-airflow-providers-apache-spark==5.6.0",
                      "pyspark==3.5.2", "apache-airflow-providers-fab==3.10.2"],
    "lowest Airflow, Spark 4": ["apache-airflow==3.3.0",
                                "apache-airflow-providers-apache-spark==6.3.4",
                                "pyspark==4.2.0"],
}

CHECK = """
import json
from airflow.providers_manager import ProvidersManager
from airflow_broker.operators import ActivatedReaderOperator
from airflow_broker.sensors import WaitForReceiveSensor
providers = ProvidersManager().providers
print(json.dumps({"provider": "airflow-broker" in providers,
                  "hook": "broker" in ProvidersManager().hooks}))
"""


def freeze(python: Path) -> dict[str, str]:
    listed = subprocess.run([str(UV), "pip", "list", "--python", str(python),
                             "--format", "json"], check=True, capture_output=True, text=True)
    return {p["name"].lower(): p["version"] for p in json.loads(listed.stdout)}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # setuptools ships what an earlier build left in build/: build from a clean tree.
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    try:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                        "--no-build-isolation", "-q", "-w", str(out), str(ROOT)], check=True)
    finally:
        shutil.rmtree(ROOT / "build", ignore_errors=True)
    (built,) = out.glob("airflow_broker-*.whl")
    return built


@dataclass
class UserAirflow:
    """A user's Airflow with the provider installed into it as docs/airflow.md says."""

    name: str
    python: Path
    home: Path
    before: dict[str, str]
    after: dict[str, str]

    def run(self, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        # Airflow's variables of this process (the tests' own Airflow) stay out.
        clean = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        return subprocess.run(args, capture_output=True, text=True, cwd=self.home,
                              env={**clean, "AIRFLOW_HOME": str(self.home / "airflow"),
                                   "PYTHONPATH": "", **env})

    def bin(self, name: str) -> str:
        return str(self.python.with_name(name))


@pytest.fixture(scope="module", params=sorted(USER_ENVIRONMENTS))
def user_airflow(request: pytest.FixtureRequest, wheel: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> UserAirflow:
    name: str = request.param
    home = tmp_path_factory.mktemp("user-airflow")
    venv = home / "venv"
    python = venv / "bin" / "python"
    subprocess.run([str(UV), "venv", "--quiet", "--seed", "--python", sys.executable,
                    str(venv)], check=True)
    subprocess.run([str(UV), "pip", "install", "--quiet", "--python", str(python),
                    *USER_ENVIRONMENTS[name]], check=True)
    before = freeze(python)
    # As docs/airflow.md installs the provider: Airflow named at its version, and the
    # environment's versions as the constraints file (Airflow's own constraints files pin
    # what Airflow was installed with in the same way).
    constraints = home / "constraints.txt"
    constraints.write_text("".join(f"{n}=={version}\n" for n, version in before.items()))
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         f"apache-airflow=={before['apache-airflow']}", f"{wheel}[airflow,spark]",
         "-c", str(constraints)], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr
    return UserAirflow(name, python, home, before, freeze(python))


@pytest.mark.slow
def test_the_wheel_installs_into_an_airflow_without_changing_what_was_there(
        user_airflow: UserAirflow) -> None:
    before, after = user_airflow.before, user_airflow.after
    changed = {name: (version, after.get(name)) for name, version in before.items()
               if after.get(name) != version}
    assert changed == {}, f"pip changed what the user had: {changed}"
    assert after["airflow-broker"]
    result = user_airflow.run([str(user_airflow.python), "-c", CHECK], {})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {"provider": True, "hook": True}


FAB_AUTH_MANAGER = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"

# Two FAB users, each with a token, and what the broker's pages answer them.
FAB_USERS = """
import json
import secrets

from airflow.api_fastapi.app import init_auth_manager
from airflow.providers.fab.auth_manager.cli_commands.utils import get_application_builder
from fastapi.testclient import TestClient

from airflow_broker.ui import api

answers = {}
with get_application_builder() as appbuilder:
    manager = appbuilder.sm
    auth = init_auth_manager()
    for name, role in (("broker_admin", "Admin"), ("broker_viewer", "Broker viewer")):
        user = manager.add_user(name, name, "user", f"{name}@example.com",
                                manager.find_role(role), password=secrets.token_urlsafe())
        token = {"Authorization": f"Bearer {auth.generate_jwt(user)}"}
        with TestClient(api.app) as client:
            overview = client.get("/api/overview", headers=token)
            enable = client.post("/api/queues/NoSuchQueue/status", json={"enabled": True},
                                 headers=token)
        answers[name] = {"overview": overview.status_code,
                         "permissions": overview.json().get("permissions"),
                         "enable": enable.status_code}
    with TestClient(api.app) as client:
        answers["anonymous"] = {"overview": client.get("/api/overview").status_code}
print(json.dumps(answers))
"""


@pytest.mark.slow
@pytest.mark.parametrize("user_airflow", [FAB_ENVIRONMENT], indirect=True)
def test_under_fab_an_admin_grants_the_broker_pages_with_airflows_own_commands(
        user_airflow: UserAirflow, empty_dsn: str, dsn: str) -> None:
    """docs/ui.md's steps for the FAB auth manager: FAB refuses to grant a resource it does
    not know, `airflow-broker ui-permissions` creates the broker's (Admin gets them), then
    `airflow roles add-perms` grants them and the pages answer each user as granted."""
    meta = sqlalchemy_url(empty_dsn)
    env = {"AIRFLOW__CORE__AUTH_MANAGER": FAB_AUTH_MANAGER,
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": meta,
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": meta,
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex * 2,
           "AIRFLOW_CONN_BROKER_DEFAULT": connection_json(dsn)}
    airflow, broker = user_airflow.bin("airflow"), user_airflow.bin("airflow-broker")

    def ok(args: list[str]) -> str:
        done = user_airflow.run(args, env)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    ok([airflow, "db", "migrate"])
    ok([airflow, "roles", "create", "Broker viewer"])
    grant = [airflow, "roles", "add-perms", "Broker viewer", "-r", "Broker", "-a", "can_read"]
    refused = user_airflow.run(grant, env)
    assert refused.returncode != 0
    assert "Resource named 'Broker' does not exist" in refused.stdout + refused.stderr

    created = ok([broker, "ui-permissions"])
    assert "created can_read on 'Broker', given to Admin" in created
    assert "created can_create on 'Broker Quarantine', given to Admin" in created
    assert "9 of the broker's permissions were there already" in ok([broker, "ui-permissions"])
    ok(grant)

    answers = json.loads(ok([str(user_airflow.python), "-c", FAB_USERS]).splitlines()[-1])
    assert answers["anonymous"] == {"overview": 401}
    admin, viewer = answers["broker_admin"], answers["broker_viewer"]
    assert admin["overview"] == 200 and all(admin["permissions"].values()), admin
    # Past the auth manager: the broker itself answers that the queue does not exist.
    assert admin["enable"] == 404, admin
    assert viewer["overview"] == 200 and not any(viewer["permissions"].values()), viewer
    assert viewer["enable"] == 403, viewer
