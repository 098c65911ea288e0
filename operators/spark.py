"""ActivatedReaderOperator: a SparkSubmit job whose tasks are queue readers."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

import airflow_broker.spark.reader as spark_reader
from airflow_broker.errors import IncorrectSyntax
from airflow_broker.hooks.broker import BrokerHook
from airflow_broker.poison.strategies import get_strategy
from airflow_broker.readers import runs as reader_runs
from airflow_broker.readers.queue_reader import default
from airflow_broker.spark import cluster as spark_cluster
from airflow_broker.spark import shipping as spark_shipping

if TYPE_CHECKING:
    from airflow.sdk import Context

# Failures of a run written into the task log, one line each; the rest are counted.
LOGGED_EVENTS = 20

# The last lines of spark-submit's output that a failed job's error carries (the Spark
# provider 6.3 adds them to its own error; 5.x gives only the exit code).
SUBMIT_OUTPUT_LINES = 20


def default_spark_binary() -> str:
    """spark-submit of the environment Airflow runs in (pip-installed pyspark puts it next to
    the interpreter), else whatever is on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    if os.path.exists(beside):
        return beside
    return shutil.which("spark-submit") or "spark-submit"


class ReaderRunFailed(RuntimeError):
    """A reader of the run failed for good (Spark gave up on its task), or the job failed."""


# The Spark provider's durable mode reconnects a retried task to the application an earlier
# try submitted (YARN with yarn_track_via_rm_api, Kubernetes with track_driver_via_k8s_api).
# That application reports under the earlier try's run id, which the new try does not know,
# so the operator submits anew on every try instead: the new readers go on with what is left
# in the queue (every message is received and processed in one transaction).
NOT_DURABLE = ("ActivatedReaderOperator submits the readers anew on every try (durable=False): "
               "a reconnected application would report under an earlier try's run id; the "
               "new readers go on with what is left in the queue")


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in this process's environment while spark-submit starts from it (the
    client-mode driver inherits them; the hook's env_vars would put them on the command line
    for YARN and Kubernetes)."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def submitted_by(context: Context | dict[str, Any]) -> dict[str, Any]:
    """The task instance in the context, as the reader run keeps it (key ``airflow``)."""
    ti = context.get("ti")
    if ti is None:
        return {}
    return {"airflow": {"dag_id": ti.dag_id, "run_id": ti.run_id, "task_id": ti.task_id,
                        "map_index": ti.map_index, "try_number": ti.try_number}}


def _join(*parts: str | None) -> str | None:
    joined = ",".join(p for p in parts if p)
    return joined or None


class ActivatedReaderOperator(SparkSubmitOperator):
    """Submits the reader application (airflow_broker/spark/reader.py): Spark tasks that are
    queue readers, each with its own connection, RECEIVE-process-commit until the queue stays
    empty for ``idle_exit`` seconds. As many readers as the queue's MAX_QUEUE_READERS (or
    ``readers``), never more than the cluster runs at once.

    Returns the run's summary to XCom, summed from the database over every attempt of every
    reader (received, processed, replied, quarantined, retried, ended, failed; readers,
    attempts, task_retries, max_concurrent, per_reader, per_attempt, events), and fails when a
    reader failed for good. The failures are summarised in the task log.

    What reaches the executors (see docs/spark.md):

    - the engine and its dependencies, as a packed Python environment built from Airflow's own
      (``python_environment="packed"``, the default), whose ``bin/python`` links to
      ``cluster_python`` (default: the base interpreter of Airflow's environment, for clusters
      built from the same image); or, with ``python_environment="cluster"``, the interpreter
      the job is configured with (``spark.pyspark.python`` of the spark-defaults.conf, or
      ``cluster_python``; Spark takes the executors' interpreter from the driver's settings,
      never from the workers' PYSPARK_PYTHON), which must have airflow-broker installed;
    - the handler's module or top-level package, as ``py_files`` (``ship_handler``);
    - the DSN, as ``AIRFLOW_BROKER_DSN``, and its password, as ``PGPASSWORD``, through a
      properties file readable by the job's user only (for Kubernetes the password comes from
      the secret ``kubernetes_password_secret``), never the command line.

    :param queue_name: the queue to read
    :param handler: ``package.module:function``, called per message (or per batch with
        ``batch=True``); it must not import Airflow (Airflow forbids its database to a task's
        child processes)
    :param readers: readers at most (default: the queue's MAX_QUEUE_READERS)
    :param poison_strategy: retry, quarantine, end_conversation, disable, timer_retry, or a
        strategy of your own (``package.module:ClassName``; see airflow_broker.poison.strategies)
    :param timer_retry_delay: seconds before a timer_retry retries a parked message
    :param broker_conn_id: the broker connection
    :param conn_id: the Spark connection (JSON form, e.g. ``{"conn_type": "spark", "host":
        "spark://10.0.0.5:7077"}``; the URI form spark://local[2] silently means yarn)
    :param python_environment: ``packed`` or ``cluster``, see above
    :param cluster_python: the interpreter path on the cluster's machines
    :param ship_handler: ship the handler's code with ``py_files``
    :param kubernetes_password_secret: ``name:key`` of the Kubernetes secret with the password
    :param submit_when_empty: submit the job also when the queue holds no message a RECEIVE
        could take as the task starts (by default such a run ends at once with no reader, so
        a late QUEUE_ACTIVATION notification costs no Spark application; docs/spark.md)
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields, "queue_name", "handler", "poison_strategy",
        "reply_message_type",
    )

    def __init__(
        self,
        *,
        queue_name: str,
        handler: str,
        broker_conn_id: str = BrokerHook.default_conn_name,
        readers: int | None = None,
        batch: bool = False,
        batch_size: int = default("batch_size"),
        waitfor_timeout: float = default("waitfor_timeout"),
        idle_exit: float = default("idle_exit"),
        poison_strategy: str = default("strategy"),
        max_attempts: int = default("max_attempts"),
        timer_retry_delay: int = default("retry_delay"),
        reply_message_type: str | None = None,
        conn_id: str = "spark_default",
        spark_binary: str | None = None,
        python_environment: str = "packed",
        cluster_python: str | None = None,
        ship_handler: bool = True,
        kubernetes_password_secret: str | None = None,
        submit_when_empty: bool = False,
        **kwargs: Any,
    ) -> None:
        get_strategy(poison_strategy)  # a clear error at parse time for an unknown name
        if python_environment not in ("packed", "cluster"):
            raise IncorrectSyntax("python_environment must be packed or cluster")
        kwargs.setdefault("name", f"broker-reader-{queue_name}")
        conf = {"spark.ui.enabled": "false", **(kwargs.pop("conf", None) or {})}
        if kwargs.get("durable") or kwargs.get("reconnect_on_retry"):
            raise IncorrectSyntax(NOT_DURABLE)
        super().__init__(application=spark_reader.__file__, conn_id=conn_id,
                         spark_binary=spark_binary or default_spark_binary(), conf=conf,
                         **kwargs)
        # Every try submits anew, see NOT_DURABLE: durable is the Spark provider's from 6.2
        # (ResumableJobMixin), reconnect_on_retry its name in 6.1.
        for attribute in ("durable", "reconnect_on_retry"):
            if hasattr(self, attribute):
                setattr(self, attribute, False)
        self.queue_name = queue_name
        self.handler = handler
        self.broker_conn_id = broker_conn_id
        self.readers = readers
        self.batch = batch
        self.batch_size = batch_size
        self.waitfor_timeout = waitfor_timeout
        self.idle_exit = idle_exit
        self.poison_strategy = poison_strategy
        self.max_attempts = max_attempts
        # Not retry_delay: that is BaseOperator's delay between task retries.
        self.timer_retry_delay = timer_retry_delay
        self.reply_message_type = reply_message_type
        self.python_environment = python_environment
        self.cluster_python = cluster_python
        self.ship_handler = ship_handler
        self.kubernetes_password_secret = kubernetes_password_secret
        self.submit_when_empty = submit_when_empty

    def reader_arguments(self, schema: str, run_id: uuid.UUID) -> list[str]:
        args = ["--queue", self.queue_name, "--handler", self.handler, "--schema", schema,
                "--batch-size", str(self.batch_size),
                "--waitfor-timeout", str(self.waitfor_timeout),
                "--idle-exit", str(self.idle_exit), "--strategy", self.poison_strategy,
                "--max-attempts", str(self.max_attempts),
                "--retry-delay", str(self.timer_retry_delay), "--run-id", str(run_id)]
        if self.readers:
            args += ["--readers", str(self.readers)]
        if self.batch:
            args.append("--batch")
        if self.reply_message_type:
            args += ["--reply-message-type", self.reply_message_type]
        return args

    def prepare(self, dsn: str, schema: str, run_id: uuid.UUID, work_dir: Path) -> None:
        """Sets up the submission: the reader's arguments, what is shipped, and the properties
        file (in ``work_dir``) with the DSN. Refuses a deploy mode the cluster manager cannot
        run before anything is submitted."""
        resolved = self._get_hook()._connection
        master, deploy_mode = resolved["master"], resolved["deploy_mode"]
        spark_cluster.check_deploy_mode(master, deploy_mode)
        self.application_args = self.reader_arguments(schema, run_id)
        conf = dict(self.conf or {})
        shipped = (spark_shipping.handler_py_files(self.handler) if self.ship_handler
                   else [])
        self.py_files = _join(*self._own_py_files(shipped), *shipped)
        if "spark.pyspark.python" not in conf:
            if spark_cluster.manager(master) == "local":
                # The executors are this machine's Airflow task: its interpreter has it all
                # (and local mode unpacks archives away from the Python workers' directory).
                conf["spark.pyspark.python"] = sys.executable
            elif self.python_environment == "packed":
                archive = spark_shipping.packed_environment(batch=self.batch,
                                                            base_python=self.cluster_python)
                # SparkSubmitOperator keeps its archives private; the hook reads them there.
                self._archives = _join(self._archives,
                                       f"{archive}#{spark_shipping.ARCHIVE_ALIAS}")
                conf["spark.pyspark.python"] = spark_shipping.ARCHIVE_PYTHON
            elif self.cluster_python:
                conf["spark.pyspark.python"] = self.cluster_python
        if deploy_mode != "cluster":
            # The driver runs here, in Airflow's environment, which has pyspark and the engine.
            conf.setdefault("spark.pyspark.driver.python", sys.executable)
        self.conf = conf
        settings = spark_cluster.job_settings(dsn, master, deploy_mode,
                                              self.kubernetes_password_secret)
        include = (Path(self.properties_file) if self.properties_file else
                   spark_cluster.spark_defaults(os.environ.get("SPARK_HOME")
                                                or self.spark_home()))
        self.properties_file = str(spark_cluster.write_properties(
            work_dir / "reader.properties", settings, include=include))

    def _own_py_files(self, shipped: list[str]) -> list[str]:
        """The ``py_files`` given to the operator, without the handler's module it ships
        itself. Spark adds every file by its name: a second file of the same name fails the
        job (FileAlreadyExistsException, in the driver's log only), so it is refused here."""
        kept: list[str] = []
        for path in (p.strip() for p in (self.py_files or "").split(",")):
            if not path:
                continue
            name = os.path.basename(path)
            twin = next((s for s in [*shipped, *kept] if os.path.basename(s) == name), None)
            if twin is None:
                kept.append(path)
            elif os.path.realpath(path) == os.path.realpath(twin):
                self.log.info("py_files: %s is shipped once (the operator ships the handler's "
                              "module itself unless ship_handler=False)", path)
            else:
                raise ValueError(
                    f"py_files names {path} and {twin}, two files called {name}: Spark adds "
                    "files by their name and fails the job on the second "
                    "(FileAlreadyExistsException). The operator ships the handler's module "
                    "itself: leave it out of py_files, or set ship_handler=False and ship it "
                    "with py_files yourself")
        return kept

    def _get_hook(self) -> SparkSubmitHook:
        """The provider's hook, keeping the last lines of spark-submit's output (which it
        writes into the task log line by line) for the error of a failed job."""
        hook = super()._get_hook()
        self._submit_output: deque[str] = deque(maxlen=SUBMIT_OUTPUT_LINES)
        process = getattr(hook, "_process_spark_submit_log", None)
        mask = getattr(hook, "_mask_cmd", None)
        if process is None or mask is None:
            return hook

        def keep(lines: Iterable[Any]) -> None:
            def kept() -> Iterator[Any]:
                for line in lines:
                    self._submit_output.append(mask([str(line).strip()]))
                    yield line
            process(kept())

        hook._process_spark_submit_log = keep  # type: ignore[method-assign,assignment]
        return hook

    def job_failure(self, error: Exception) -> str:
        """The job's error as the task reports it: the provider's, with spark-submit's last
        lines of output when it does not give them itself."""
        reason = str(error)
        output = getattr(self, "_submit_output", None)
        if output and "spark-submit output" not in reason:
            reason += "\nLast spark-submit output:\n" + "\n".join(output)
        return reason

    def spark_home(self) -> str | None:
        return pip_spark_home(self._spark_binary or default_spark_binary())

    def submit_environment(self, dsn: str) -> dict[str, str]:
        env = spark_cluster.driver_environment(dsn)
        home = self.spark_home()
        if home is not None and "SPARK_HOME" not in os.environ:
            env["SPARK_HOME"] = home
        return env

    # SparkSubmitOperator.execute returns nothing; this one returns the summary for XCom.
    def execute(self, context: Context) -> dict[str, Any]:  # type: ignore[override]
        run_id = uuid.uuid4()
        user_properties = self.properties_file
        with BrokerHook(self.broker_conn_id) as hook, \
                tempfile.TemporaryDirectory(prefix="broker-reader-") as work_dir:
            info = hook.get_conn_info()
            self.prepare(info.dsn, info.schema, run_id, Path(work_dir))
            job_error: Exception | None = None
            try:
                # Recorded before the job, with the task instance that submits it: the run is
                # there to report (and to link from the broker's queue page) even when no driver
                # ever starts; a queue the login may not RECEIVE from fails here, before Spark.
                reader_runs.begin_run(hook.get_broker(), run_id, self.queue_name,
                                      {"queue": self.queue_name, **submitted_by(context)})
                if not self.submit_when_empty and not hook.peek(self.queue_name):
                    self.log.info("queue %s holds no message a reader could receive now: reader "
                                  "run %s ends without a Spark job", self.queue_name, run_id)
                    # Counted as a run whose readers received nothing.
                    summary = {**asdict(reader_runs.ReaderStats()),
                               **reader_runs.finish_run(hook.get_broker(), run_id)}
                    self.report(summary)
                    return summary
                self.log.info("submitting the readers of queue %s (at most %s), handler %s, "
                              "strategy %s, run %s", self.queue_name,
                              self.readers or "MAX_QUEUE_READERS", self.handler,
                              self.poison_strategy, run_id)
                try:
                    with _environment(self.submit_environment(info.dsn)):
                        super().execute(context)
                except Exception as exc:
                    job_error = exc
                    self.log.error("the Spark job of reader run %s failed: %s", run_id,
                                   self.job_failure(exc))
            finally:
                self.properties_file = user_properties
            try:
                # A failed job is over without its driver's word: ended here, not running for good.
                summary = (reader_runs.run_summary if job_error is None
                           else reader_runs.finish_run)(hook.get_broker(), run_id)
            except Exception as summary_error:
                if job_error is None:
                    raise
                # The database went out of reach during the job (the run was recorded before
                # it): the job's own reason comes first, the summary's error after it.
                self.log.error("and the summary of reader run %s could not be read: %s",
                               run_id, summary_error)
                # Raised here, the summary's error is its __context__; the job's, its cause.
                raise ReaderRunFailed(
                    f"reader run {run_id} of queue {self.queue_name} failed: the Spark job: "
                    f"{self.job_failure(job_error)}\n"
                    f"(and the run's summary could not be read: {summary_error})"
                ) from job_error
        self.report(summary)
        if job_error is not None or summary["failed_readers"]:
            failed = (f"readers {summary['failed_readers']} failed for good; "
                      if summary["failed_readers"] else "")
            raise ReaderRunFailed(
                f"reader run {run_id} of queue {self.queue_name} failed: {failed}"
                "the Spark job: "
                f"{self.job_failure(job_error) if job_error else 'succeeded'}") from job_error
        return summary

    def report(self, summary: dict[str, Any]) -> None:
        """The run in the task log: totals, each reader attempt, and the failures."""
        self.log.info(
            "reader run %s: %s reader(s) (%s at once, the cluster runs %s), %s attempt(s), "
            "%s task retry(ies); received %s, processed %s, replied %s, quarantined %s, "
            "retried %s, failed %s, ended %s", summary["run_id"], summary["readers"],
            summary["max_concurrent"], summary.get("slots") or "any number",
            summary["attempts"], summary["task_retries"], summary.get("received", 0),
            summary.get("processed", 0), summary.get("replied", 0),
            summary.get("quarantined", 0), summary.get("retried", 0), summary.get("failed", 0),
            summary.get("ended", 0))
        for attempt in summary["per_attempt"]:
            self.log.info("  reader %s, try %s, on %s (pid %s): %s after %ss; received %s, "
                          "processed %s, quarantined %s%s", attempt["reader"],
                          attempt["try"], attempt["host"], attempt["pid"],
                          attempt["status"], attempt["seconds"], attempt.get("received", 0),
                          attempt.get("processed", 0), attempt.get("quarantined", 0),
                          f"; {attempt['error']}" if attempt["error"] else "")
        events = summary["events"]
        for event in events[:LOGGED_EVENTS]:
            self.log.warning("  message %s (%s #%s of conversation %s), attempt %s: %s -> %s",
                             event["message_id"], event["message_type"], event["sequence"],
                             event["conversation_handle"], event["attempt"], event["error"],
                             event["action"])
        if len(events) > LOGGED_EVENTS:
            self.log.warning("  ... and %d more failures (the quarantine table holds every "
                             "quarantined message)", len(events) - LOGGED_EVENTS)


def pip_spark_home(spark_binary: str) -> str | None:
    """pip's pyspark package folder when ``spark_binary`` is the spark-submit pip installed
    next to Airflow's interpreter: its launcher finds that folder only through a ``python3``
    on PATH that has pyspark, so spark-submit is told it."""
    if Path(spark_binary).parent != Path(sys.executable).parent:
        return None
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    return str(Path(spec.origin).parent)
