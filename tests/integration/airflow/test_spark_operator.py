"""ActivatedReaderOperator and QuarantineOperator through dag.test(), and what the operator
submits for each cluster manager: what it ships, and where the DSN's password goes."""

from __future__ import annotations

import json
import os
import stat
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from airflow_broker.operators import ActivatedReaderOperator
from airflow_broker.operators.spark import ReaderRunFailed
from airflow_broker.poison import quarantine
from airflow_broker.spark import cluster as spark_cluster
from tests.fixtures.airflow import RunDag, task_states, xcom
from tests.support.brokers import App
from tests.support.helpers import count


@pytest.mark.slow
def test_activated_reader_job(run_dag: RunDag, app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL",
                       json.dumps({"conn_type": "spark", "host": "local[2]"}))
    with psycopg.connect(app.broker.dsn) as conn:
        conn.execute("CREATE TABLE public.results (message_id uuid PRIMARY KEY,"
                     " conversation_handle uuid, sequence bigint, trade text, pid integer)")
    with app.broker.transaction() as tx:
        for c in range(20):
            handle = tx.begin_dialog("I", "T", "C")
            tx.send_many(handle, "Req", [f"<trade id='{c}-{i}'/>" if (c, i) != (3, 3)
                                         else "<trade" for i in range(5)])
    dag_run = run_dag("t_spark_reader")
    assert set(task_states(dag_run).values()) == {"success"}, task_states(dag_run)
    summary = xcom(dag_run, "read")
    assert (summary["received"], summary["processed"], summary["replied"],
            summary["quarantined"], summary["readers"]) == (100, 99, 99, 1, 2)
    assert count(app.broker, "SELECT count(*) FROM public.results") == 99
    discarded = xcom(dag_run, "discard")
    assert len(discarded) == 1
    assert quarantine.list_quarantined(app.broker, "q_t") == []


PASSWORD = "s3cret-Pa55word"
DSN = f"host=db.example.test port=5432 dbname=trading user=reader password={PASSWORD}"


def spark_conn(monkeypatch: pytest.MonkeyPatch, master: str, **extra: str) -> str:
    conn_id = "spark_under_test"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}",
                       json.dumps({"conn_type": "spark", "host": master, "extra": extra}))
    return conn_id


def prepared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, master: str,
             **options: Any) -> tuple[ActivatedReaderOperator, list[str], str]:
    """The spark-submit command the operator would run, and its properties file."""
    extra = {"deploy-mode": options.pop("deploy_mode")} if "deploy_mode" in options else {}
    options.setdefault("handler", "airflow_broker.demos.trading:book_trade")
    operator = ActivatedReaderOperator(
        task_id="read", queue_name="q_t", conn_id=spark_conn(monkeypatch, master, **extra),
        **options)
    operator.prepare(DSN, "broker", uuid.uuid4(), tmp_path)
    assert operator.properties_file is not None
    properties = Path(operator.properties_file)
    command = operator._get_hook()._build_spark_submit_command(operator.application)
    return operator, command, properties.read_text()


@pytest.mark.parametrize(("master", "deploy_mode"), [
    ("spark://127.0.0.1:7077", "client"), ("yarn", "client"), ("yarn", "cluster"),
    ("local[2]", "client")])
def test_the_password_is_on_no_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            master: str, deploy_mode: str) -> None:
    operator, command, properties = prepared(tmp_path, monkeypatch, master,
                                             deploy_mode=deploy_mode)
    assert PASSWORD not in " ".join(command)
    assert PASSWORD not in json.dumps(operator.conf)
    assert operator.env_vars is None
    # Only the job's user reads it; the executors get it as PGPASSWORD, which libpq reads
    # and Spark's UI redacts.
    assert stat.S_IMODE(os.stat(operator.properties_file or "").st_mode) == 0o600
    assert f"spark.executorEnv.PGPASSWORD={PASSWORD}" in properties.splitlines()
    (dsn,) = [line.split("=", 1)[1] for line in properties.splitlines()
              if line.startswith("spark.executorEnv.AIRFLOW_BROKER_DSN=")]
    assert conninfo_to_dict(dsn) == {"host": "db.example.test", "port": "5432",
                                     "dbname": "trading", "user": "reader"}
    assert (f"spark.yarn.appMasterEnv.PGPASSWORD={PASSWORD}" in properties) == (
        deploy_mode == "cluster")
    # The client-mode driver gets it from spark-submit's environment, never the hook's
    # env_vars (which it would turn into --conf spark.yarn.appMasterEnv.* arguments).
    assert operator.submit_environment(DSN)["PGPASSWORD"] == PASSWORD


def test_kubernetes_takes_the_password_from_a_secret() -> None:
    """At the level of the settings: the Spark provider's hook builds nothing for a k8s://
    master without the cncf.kubernetes provider, which this environment does not install."""
    master = "k8s://https://k8s.example.test:6443"
    with pytest.raises(ValueError, match="Kubernetes secret"):
        spark_cluster.job_settings(DSN, master, "client")
    settings = spark_cluster.job_settings(DSN, master, "cluster", "broker-dsn:password")
    assert PASSWORD not in json.dumps(settings)
    assert settings["spark.kubernetes.executor.secretKeyRef.PGPASSWORD"] == "broker-dsn:password"
    assert settings["spark.kubernetes.driver.secretKeyRef.PGPASSWORD"] == "broker-dsn:password"
    assert conninfo_to_dict(settings["spark.kubernetes.driverEnv.AIRFLOW_BROKER_DSN"]) == {
        "host": "db.example.test", "port": "5432", "dbname": "trading", "user": "reader"}
    spark_cluster.check_deploy_mode(master, "cluster")


def test_the_engine_travels_packed_and_the_handler_with_py_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "desk_handlers.py").write_text("def handle(message, ctx):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "work").mkdir()
    operator, command, _ = prepared(tmp_path / "work", monkeypatch, "spark://127.0.0.1:7077",
                                    handler="desk_handlers:handle")
    archives = command[command.index("--archives") + 1]
    assert archives.endswith(".tar.gz#environment")
    assert command[command.index("--py-files") + 1] == str(tmp_path / "desk_handlers.py")
    assert operator.conf is not None
    assert operator.conf["spark.pyspark.python"] == "./environment/bin/python"
    # Client mode: the driver runs here, in Airflow's environment.
    assert operator.conf["spark.pyspark.driver.python"] == sys.executable


def test_an_interpreter_of_the_cluster_instead_of_the_packed_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    operator, command, _ = prepared(tmp_path, monkeypatch, "yarn",
                                    python_environment="cluster",
                                    cluster_python="/opt/python3.11/bin/python3")
    assert "--archives" not in command
    assert operator.conf is not None
    assert operator.conf["spark.pyspark.python"] == "/opt/python3.11/bin/python3"


def test_cluster_mode_on_standalone_is_refused_before_anything_is_submitted(
        broker_conn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    submitted = tmp_path / "submitted"
    spark_submit = tmp_path / "spark-submit"
    spark_submit.write_text(f"#!/bin/sh\ntouch {submitted}\n")
    spark_submit.chmod(0o755)
    operator = ActivatedReaderOperator(
        task_id="read", queue_name="q_t", handler="airflow_broker.demos.trading:book_trade",
        spark_binary=str(spark_submit), deploy_mode="cluster",
        conn_id=spark_conn(monkeypatch, "spark://127.0.0.1:7077"))
    with pytest.raises(ValueError, match="cluster deploy mode only on YARN and Kubernetes"):
        operator.execute({})
    assert not submitted.exists()


@pytest.mark.slow
def test_a_reader_that_fails_for_good_fails_the_task(
        broker_conn: str, app: App, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every attempt of the readers fails (the handler is not there): the task fails, and
    says which readers failed and why."""
    with app.broker.transaction() as tx:
        tx.send_many(tx.begin_dialog("I", "T", "C"), "Req", ["<a/>", "<b/>"])
    operator = ActivatedReaderOperator(
        # Written in two parts, or tests/integration/test_example_handlers.py would look for it.
        task_id="read", queue_name="q_t",
        handler="tests.support.reader_handlers:" + "no_such_handler",
        readers=2, idle_exit=1, conn_id=spark_conn(monkeypatch, "local[2]"))
    with pytest.raises(ReaderRunFailed) as failed:
        operator.execute({})
    assert "failed for good" in str(failed.value)
    assert count(app.broker, "SELECT count(*) FROM broker.queue_messages") == 2
    with psycopg.connect(app.broker.dsn) as conn:
        (summary,) = [r[0] for r in conn.execute(
            "SELECT broker.reader_run_summary(run_id) FROM broker.reader_runs")]
    assert summary["failed_readers"] and summary.get("received", 0) == 0
    assert any(a["status"] == "failed" and "no_such_handler" in a["error"]
               for a in summary["per_attempt"])
