"""The wheel installed with pip's resolver into an Airflow that users already run: nothing
they had is upgraded or downgraded, the provider is found, and its DAG-facing modules import.

The user's environments are made the way Airflow's installation guide makes them: Airflow
and its providers first, pinned, then the provider, with the environment's versions as
constraints. They are resolved from the package index at the time of the run (Airflow's
published constraints files live on GitHub, which the tests do not reach): the newest Airflow
with a Spark provider of the 5.x line and PySpark 3.5 (a Spark 3.5 cluster's driver), and the
lowest Airflow the provider supports with the newest Spark provider and PySpark 4.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UV = Path(sys.executable).with_name("uv")

USER_ENVIRONMENTS = {
    "newest Airflow, Spark 3.5": ["apache-airflow==3.3.2",
                                  "apache-airflow-providers-apache-spark==5.6.0",
                                  "pyspark==3.5.2"],
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


@pytest.mark.slow
@pytest.mark.parametrize("environment", sorted(USER_ENVIRONMENTS))
def test_the_wheel_installs_into_an_airflow_without_changing_what_was_there(
        environment: str, wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    subprocess.run([str(UV), "venv", "--quiet", "--seed", "--python", sys.executable,
                    str(venv)], check=True)
    subprocess.run([str(UV), "pip", "install", "--quiet", "--python", str(python),
                    *USER_ENVIRONMENTS[environment]], check=True)
    before = freeze(python)
    # As docs/airflow.md installs the provider: Airflow named at its version, and the
    # environment's versions as the constraints file (Airflow's own constraints files pin
    # what Airflow was installed with in the same way).
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in before.items()))
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         f"apache-airflow=={before['apache-airflow']}", f"{wheel}[airflow,spark]",
         "-c", str(constraints)], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr
    after = freeze(python)

    changed = {name: (version, after.get(name)) for name, version in before.items()
               if after.get(name) != version}
    assert changed == {}, f"pip changed what the user had: {changed}"
    assert after["airflow-broker"]
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow"), "PYTHONPATH": ""}
    result = subprocess.run([str(python), "-c", CHECK], capture_output=True, text=True,
                            cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {"provider": True, "hook": True}
