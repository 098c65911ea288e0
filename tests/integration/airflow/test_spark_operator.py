"""ActivatedReaderOperator and QuarantineOperator through dag.test(), and what the operator
submits for each cluster manager: what it ships, and where the DSN's password goes."""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import stat
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from psycopg.conninfo import conninfo_to_dict

from airflow_broker.operators import ActivatedReaderOperator
from airflow_broker.operators.spark import ReaderRunFailed
from airflow_broker.spark import cluster as spark_cluster
from tests.fixtures.airflow import RunDag, task_states, xcom
from tests.support.brokers import App
from tests.support.helpers import count
from tests.support.quarantine import quarantined
from tests.support.spark_cluster import SparkCluster


def run_reader_job(run_dag: RunDag, app: App, monkeypatch: pytest.MonkeyPatch,
                   master: str) -> dict[str, Any]:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL",
                       json.dumps({"conn_type": "spark", "host": master}))
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
    summary: dict[str, Any] = xcom(dag_run, "read")
    assert (summary["received"], summary["processed"], summary["replied"],
            summary["quarantined"], summary["readers"]) == (100, 99, 99, 1, 2)
    assert count(app.broker, "SELECT count(*) FROM public.results") == 99
    discarded = xcom(dag_run, "discard")
    assert len(discarded) == 1
    assert quarantined(app.broker, "q_t") == []
    # The run knows the task instance that submitted it (the broker's queue page links it).
    assert summary["airflow"] == {"dag_id": "t_spark_reader", "run_id": dag_run.run_id,
                                  "task_id": "read", "map_index": -1, "try_number": 1}
    return summary


@pytest.mark.slow
@pytest.mark.spark_job
def test_activated_reader_job(run_dag: RunDag, app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    run_reader_job(run_dag, app, monkeypatch, "local[2]")


@pytest.mark.slow
@pytest.mark.spark_job
def test_activated_reader_job_on_a_standalone_cluster_of_this_pyspark(
        run_dag: RunDag, app: App, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The cluster's Spark is the installed PySpark's own (4.x with constraints.txt, 3.5 in
    `make test-lowest`), its executors' Python a bare one: the operator ships the engine and
    the handler, and the readers book on the executors, not in the driver."""
    cluster = SparkCluster(tmp_path / "spark").start()
    try:
        summary = run_reader_job(run_dag, app, monkeypatch, cluster.master_url)
        assert summary["failed_readers"] == []
        apps = cluster.state()["completedapps"]
        assert [a["state"] for a in apps] == ["FINISHED"], cluster.log_tails()
        # The readers ran in executors the workers launched (their folders hold the logs).
        assert list((tmp_path / "spark").glob(f"worker-*/{apps[0]['id']}/*/stderr"))
    finally:
        cluster.stop()


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
@pytest.mark.spark_job
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


# A stand-in for spark-submit on the cluster managers this machine does not have: it records
# its arguments and answers as spark-submit does. On success it plays the driver that the
# cluster runs: with the DSN the properties file gives the driver (YARN's application master,
# Kubernetes' driver pod), it begins and finishes the reader run, with no reader.
STAND_IN = '''#!{python}
import json, os, sys
args = sys.argv[1:]
with open({record!r}, "a") as out:
    out.write(json.dumps(args) + "\\n")
outcome = os.environ.get("STAND_IN_OUTCOME", "success")
if outcome != "success":
    print("Exception in thread \\"main\\" org.apache.spark.SparkException: " + outcome)
    print("\\tat org.apache.spark.deploy.SparkSubmit.error(SparkSubmit.scala:1044)")
    sys.exit(1)
properties = dict(line.split("=", 1) for line in
                  open(args[args.index("--properties-file") + 1]).read().splitlines()
                  if "=" in line and not line.startswith("#"))
dsn = (properties.get("spark.yarn.appMasterEnv.AIRFLOW_BROKER_DSN")
       or properties["spark.kubernetes.driverEnv.AIRFLOW_BROKER_DSN"])
app_args = args[next(i for i, a in enumerate(args) if a.endswith("reader.py")) + 1:]
run_id = app_args[app_args.index("--run-id") + 1]
queue = app_args[app_args.index("--queue") + 1]
import uuid
from airflow_broker import Broker
from airflow_broker.readers import runs
with Broker(dsn) as broker:
    runs.begin_run(broker, uuid.UUID(run_id), queue, {{"readers_wanted": 0}})
    runs.finish_run(broker, uuid.UUID(run_id))
if "k8s://" in args[args.index("--master") + 1]:
    print("\\t container status: terminated, exit code: 0")
    print("Exit code: 0")
else:
    print("INFO Client: Application report for application_1700000000000_0001 "
          "(state: FINISHED)")
'''


def stand_in_spark_submit(tmp_path: Path) -> tuple[Path, Path]:
    record = tmp_path / "spark-submit.calls"
    script = tmp_path / "bin" / "spark-submit"
    script.parent.mkdir()
    script.write_text(STAND_IN.format(python=sys.executable, record=str(record)))
    script.chmod(0o755)
    return script, record


def a_trade_waiting(app: App) -> None:
    """A message for the readers: on an empty queue the operator submits nothing."""
    with app.broker.transaction() as tx:
        tx.send(tx.begin_dialog("I", "T", "C"), "Req", "<trade id='1'/>")


def docs_connection(monkeypatch: pytest.MonkeyPatch, manager: str) -> tuple[str, dict[str, Any]]:
    """The Spark connection docs/spark.md shows for ``manager``, set as the docs set it, and
    the operator's arguments it shows with it."""
    text = (Path(__file__).parents[3] / "docs" / "spark.md").read_text()
    section = text[text.index(f"### {manager}"):]
    (conn,) = [line.split("=", 1)[1].strip("'") for line in section.splitlines()
               if line.startswith("export AIRFLOW_CONN_SPARK_DEFAULT=")][:1]
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", conn)
    options: dict[str, Any] = {}
    if manager == "Kubernetes":
        options = {"kubernetes_password_secret": "broker-dsn:password",
                   "conf": {"spark.kubernetes.container.image": "apache/spark:4.0.0-python3"}}
        assert 'kubernetes_password_secret="broker-dsn:password"' in section
        # The Spark provider needs the cncf.kubernetes provider for k8s:// masters (only to
        # track and kill driver pods, which this job does not ask for); this environment does
        # not install it.
        import airflow.providers.apache.spark.hooks.spark_submit as hook_module
        monkeypatch.setattr(hook_module, "kube_client", object(), raising=False)
    return conn, options


@pytest.mark.parametrize("manager", ["YARN", "Kubernetes"])
def test_the_documented_cluster_connections_submit(
        broker_conn: str, app: App, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        manager: str) -> None:
    """docs/spark.md's connection for YARN and Kubernetes, through execute(): spark-submit is
    called with it (cluster mode, the queue, the namespace), and the task returns the run's
    summary."""
    conn, options = docs_connection(monkeypatch, manager)
    spark_submit, record = stand_in_spark_submit(tmp_path)
    a_trade_waiting(app)
    operator = ActivatedReaderOperator(
        task_id="book_trades", queue_name="q_t", handler="airflow_broker.demos.trading:book_trade",
        spark_binary=str(spark_submit), **options)
    summary = operator.execute({})
    assert summary["run_id"] and summary["readers"] == 0, summary
    (args,) = [json.loads(line) for line in record.read_text().splitlines()]
    assert args[args.index("--deploy-mode") + 1] == "cluster"
    assert args[args.index("--master") + 1] == json.loads(conn)["host"]
    if manager == "YARN":
        assert args[args.index("--queue") + 1] == "etl"
    else:
        assert "spark.kubernetes.namespace=spark" in args
    assert "--archives" in args      # the packed environment
    assert operator.properties_file is None


@pytest.mark.parametrize(("manager", "reason"), [
    ("YARN", "When running with master 'yarn' either HADOOP_CONF_DIR or YARN_CONF_DIR must "
             "be set in the environment."),
    ("Kubernetes", "Must specify the driver container image")])
def test_a_refused_submission_fails_the_task_with_spark_submits_reason(
        broker_conn: str, app: App, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str], manager: str, reason: str) -> None:
    """spark-submit refuses the job, so no driver ever reaches the database: the task fails
    with spark-submit's own reason, the run (recorded before the job) reports no reader, and
    the log says both."""
    _, options = docs_connection(monkeypatch, manager)
    spark_submit, record = stand_in_spark_submit(tmp_path)
    a_trade_waiting(app)
    monkeypatch.setenv("STAND_IN_OUTCOME", reason)
    operator = ActivatedReaderOperator(
        task_id="book_trades", queue_name="q_t", handler="airflow_broker.demos.trading:book_trade",
        spark_binary=str(spark_submit), **options)
    with pytest.raises(ReaderRunFailed) as failed:
        operator.execute({})
    message = str(failed.value)
    assert reason in message and "Cannot find the reader run" not in message
    # The Spark provider 6.3 gives spark-submit's output in its error; with 5.x the operator
    # adds it.
    assert "Error code is: 1" in str(failed.value.__cause__)
    assert message.count("Last spark-submit output") == 1
    logged = "".join(capfd.readouterr())
    assert "the Spark job of reader run" in logged and reason in logged
    assert "0 reader(s)" in logged  # the run's summary: no driver started a reader
    assert record.exists()
    # Ended, as the broker's queue page shows it, not running for good.
    with psycopg.connect(app.broker.dsn) as conn:
        assert conn.execute("SELECT ended_at IS NOT NULL FROM broker.reader_runs").fetchall() == [
            (True,)]


@pytest.mark.parametrize("waiting", ["nothing", "a message in a group a reader holds"])
def test_a_queue_with_nothing_to_receive_submits_no_job(
        broker_conn: str, app: App, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str], waiting: str) -> None:
    """An activation notification that comes after the readers drained the queue (or while
    they hold what is left) costs no Spark application: the run is recorded, ends at once with
    no reader, and the task succeeds with its summary; submit_when_empty submits anyway."""
    docs_connection(monkeypatch, "YARN")
    spark_submit, record = stand_in_spark_submit(tmp_path)
    with contextlib.ExitStack() as held:
        if waiting != "nothing":
            a_trade_waiting(app)
            # The group's lock, as a reader at work on it holds it.
            tx = held.enter_context(app.broker.transaction())
            assert tx.get_conversation_group("q_t") is not None
        operator = ActivatedReaderOperator(
            task_id="book_trades", queue_name="q_t",
            handler="airflow_broker.demos.trading:book_trade", spark_binary=str(spark_submit))
        summary = operator.execute({})
        assert not record.exists()
        assert (summary["readers"], summary["received"], summary["processed"]) == (0, 0, 0)
        assert "ends without a Spark job" in "".join(capfd.readouterr())
        with psycopg.connect(app.broker.dsn) as conn:
            ended = conn.execute("SELECT ended_at IS NOT NULL FROM broker.reader_runs"
                                 " WHERE run_id = %s", [summary["run_id"]]).fetchone()
        assert ended == (True,)
    operator = ActivatedReaderOperator(
        task_id="book_trades", queue_name="q_t", submit_when_empty=True,
        handler="airflow_broker.demos.trading:book_trade", spark_binary=str(spark_submit))
    operator.execute({})
    assert len(record.read_text().splitlines()) == 1


def test_a_provider_refusal_comes_first(
        broker_conn: str, app: App, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """YARN tracking through the ResourceManager's REST API without its address: the Spark
    provider refuses before submitting, and that is what the task says first."""
    if "yarn_track_via_rm_api" not in inspect.signature(SparkSubmitOperator.__init__).parameters:
        pytest.skip("the Spark provider installed has no yarn_track_via_rm_api (before 6.1)")
    docs_connection(monkeypatch, "YARN")
    spark_submit, record = stand_in_spark_submit(tmp_path)
    a_trade_waiting(app)
    operator = ActivatedReaderOperator(
        task_id="book_trades", queue_name="q_t", handler="airflow_broker.demos.trading:book_trade",
        spark_binary=str(spark_submit), yarn_track_via_rm_api=True)
    with pytest.raises(ReaderRunFailed) as failed:
        operator.execute({})
    assert "yarn_resourcemanager_webapp_address" in str(failed.value)
    assert not record.exists()


def test_durable_submissions_are_refused() -> None:
    with pytest.raises(Exception, match="anew on every try"):
        ActivatedReaderOperator(task_id="read", queue_name="q_t", durable=True,
                                handler="airflow_broker.demos.trading:book_trade")
    operator = ActivatedReaderOperator(task_id="read", queue_name="q_t",
                                       handler="airflow_broker.demos.trading:book_trade")
    # The Spark provider's durable mode, from 6.2 (reconnect_on_retry in 6.1), is off.
    assert getattr(operator, "durable", False) is False
    assert getattr(operator, "reconnect_on_retry", False) is False


def test_the_shipped_handler_module_in_py_files_is_shipped_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "desk_handlers.py").write_text("def handle(message, ctx):\n    pass\n")
    (tmp_path / "helpers.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "work").mkdir()
    _, command, _ = prepared(
        tmp_path / "work", monkeypatch, "spark://127.0.0.1:7077", handler="desk_handlers:handle",
        py_files=f"{tmp_path / 'helpers.py'},{tmp_path / 'desk_handlers.py'}")
    assert command[command.index("--py-files") + 1] == (
        f"{tmp_path / 'helpers.py'},{tmp_path / 'desk_handlers.py'}")


def test_another_file_of_the_handler_modules_name_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "desk_handlers.py").write_text("def handle(message, ctx):\n    pass\n")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "desk_handlers.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "work").mkdir()
    with pytest.raises(ValueError, match="FileAlreadyExistsException"):
        prepared(tmp_path / "work", monkeypatch, "spark://127.0.0.1:7077",
                 handler="desk_handlers:handle",
                 py_files=str(tmp_path / "old" / "desk_handlers.py"))


def test_the_operator_and_the_spark_job_default_to_the_readers_own_settings() -> None:
    from airflow_broker.readers.queue_reader import ReaderConfig
    from airflow_broker.spark.reader import parse_args

    config = ReaderConfig(queue_name="q", handler="m:f")
    job = parse_args(["--queue", "q", "--handler", "m:f"])
    operator = inspect.signature(ActivatedReaderOperator.__init__).parameters
    for setting, option, argument in [
            ("batch_size", "batch_size", "batch_size"),
            ("waitfor_timeout", "waitfor_timeout", "waitfor_timeout"),
            ("idle_exit", "idle_exit", "idle_exit"),
            ("strategy", "strategy", "poison_strategy"),
            ("max_attempts", "max_attempts", "max_attempts"),
            ("retry_delay", "retry_delay", "timer_retry_delay")]:
        assert getattr(job, option) == getattr(config, setting), setting
        assert operator[argument].default == getattr(config, setting), setting
