"""What differs per Spark cluster manager for the reader job: which deploy modes run a Python
application, and how the broker's DSN and its password reach the driver and the executors.

The password never goes on spark-submit's command line (every user of the machine reads it, and
the Spark UI shows it) nor into the tasks' closures. The DSN without its password travels as
``AIRFLOW_BROKER_DSN``, the password as ``PGPASSWORD`` (libpq reads it; Spark's default
``spark.redaction.regex`` hides every setting whose name contains "password" in its UI, REST API
and event logs), both in a properties file only the job's user can read:

- client mode, any manager: the driver runs where spark-submit runs and gets both from
  spark-submit's environment;
- executors of standalone, YARN and local: ``spark.executorEnv.*``;
- YARN cluster mode: also ``spark.yarn.appMasterEnv.*`` for the driver;
- Kubernetes: the password comes from a Kubernetes secret (``secretKeyRef``), since executor
  environment variables are written into the pod specs; the DSN as ``driverEnv``/``executorEnv``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from airflow_broker.broker import DSN_ENV

PASSWORD_VARIABLE = "PGPASSWORD"


def manager(master: str) -> str:
    """local, standalone, yarn, kubernetes or other (the master URL's kind)."""
    if master.startswith("local"):
        return "local"
    if master.startswith("spark://"):
        return "standalone"
    if master.startswith("yarn"):
        return "yarn"
    if master.startswith("k8s://"):
        return "kubernetes"
    return "other"


def check_deploy_mode(master: str, deploy_mode: str | None) -> None:
    """Refuses, before anything is submitted, what Spark would refuse after starting: cluster
    mode for a Python application where the manager cannot run one."""
    if deploy_mode == "cluster" and manager(master) not in ("yarn", "kubernetes"):
        raise ValueError(
            f"Spark runs Python applications in cluster deploy mode only on YARN and "
            f"Kubernetes, not on {master}: use client mode (the default; the driver runs where "
            "the Airflow task runs and only waits for the readers on the executors)")


def split_password(dsn: str) -> tuple[str, str | None]:
    """The DSN without its password, and the password."""
    params = conninfo_to_dict(dsn)
    password = params.pop("password", None)
    return make_conninfo("", **params), None if password is None else str(password)


def job_settings(dsn: str, master: str, deploy_mode: str | None,
                 kubernetes_secret: str | None = None) -> dict[str, str]:
    """The Spark settings that give the job's driver and executors the DSN and its password.

    ``kubernetes_secret`` is ``name:key`` of a Kubernetes secret holding the password.
    """
    plain, password = split_password(dsn)
    kind = manager(master)
    cluster = deploy_mode == "cluster"
    settings = {f"spark.executorEnv.{DSN_ENV}": plain}
    if kind == "yarn" and cluster:
        settings[f"spark.yarn.appMasterEnv.{DSN_ENV}"] = plain
    if kind == "kubernetes" and cluster:
        settings[f"spark.kubernetes.driverEnv.{DSN_ENV}"] = plain
    if password is None:
        return settings
    if kind == "kubernetes":
        if not kubernetes_secret or ":" not in kubernetes_secret:
            raise ValueError(
                "on Kubernetes the broker connection's password reaches the pods from a "
                "Kubernetes secret: create one (kubectl create secret generic broker-dsn "
                "--from-literal=password=...) and pass kubernetes_password_secret="
                "'broker-dsn:password'; environment variables would land in the pod specs")
        settings[f"spark.kubernetes.executor.secretKeyRef.{PASSWORD_VARIABLE}"] = \
            kubernetes_secret
        if cluster:
            settings[f"spark.kubernetes.driver.secretKeyRef.{PASSWORD_VARIABLE}"] = \
                kubernetes_secret
        return settings
    settings[f"spark.executorEnv.{PASSWORD_VARIABLE}"] = password
    if kind == "yarn" and cluster:
        settings[f"spark.yarn.appMasterEnv.{PASSWORD_VARIABLE}"] = password
    return settings


def driver_environment(dsn: str) -> dict[str, str]:
    """The client-mode driver's environment (spark-submit's)."""
    plain, password = split_password(dsn)
    env = {DSN_ENV: plain}
    if password is not None:
        env[PASSWORD_VARIABLE] = password
    return env


def spark_defaults(spark_home: str | None) -> Path | None:
    """spark-defaults.conf, which spark-submit stops reading once given --properties-file."""
    conf_dir = os.environ.get("SPARK_CONF_DIR") or (
        os.path.join(spark_home, "conf") if spark_home else None)
    if conf_dir is None:
        return None
    path = Path(conf_dir) / "spark-defaults.conf"
    return path if path.is_file() else None


def _escape(text: str) -> str:
    # java.util.Properties: backslash escapes, and a value must stay on its line.
    return (text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
            .replace("\t", "\\t"))


def write_properties(path: Path, settings: Mapping[str, str], *,
                     include: Path | None = None) -> Path:
    """Writes ``settings`` as a Spark properties file readable by its owner only, after the
    content of ``include`` (the user's properties file, or spark-defaults.conf), whose keys the
    settings override."""
    lines = [include.read_text(encoding="utf-8")] if include is not None else []
    lines += [f"{_escape(key)}={_escape(value)}" for key, value in settings.items()]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write("\n".join(lines) + "\n")
    return path
