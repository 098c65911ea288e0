"""ActivatedReaderOperator: a SparkSubmit job whose tasks are queue readers."""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator
from psycopg import sql

import airflow_broker.spark_reader as spark_reader
from airflow_broker import quarantine
from airflow_broker.reader import STRATEGIES

if TYPE_CHECKING:
    from airflow.sdk import Context

    from hooks.broker import BrokerHook
else:
    from airflow_broker.hooks.broker import BrokerHook


def default_spark_binary() -> str:
    """spark-submit of the environment Airflow runs in (pip-installed pyspark puts it next to
    the interpreter), else whatever is on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    if os.path.exists(beside):
        return beside
    return shutil.which("spark-submit") or "spark-submit"


class ActivatedReaderOperator(SparkSubmitOperator):
    """Submits the reader application (airflow_broker/spark_reader.py): ``readers`` Spark
    tasks, each a queue reader with its own connection, RECEIVE-process-commit until the queue
    stays empty for ``idle_exit`` seconds. Returns the run's summary (received, processed,
    replied, quarantined, retried, ended, failed, per reader) to XCom.

    :param queue_name: the queue to read
    :param handler: ``package.module:function``, called per message (or per batch with
        ``batch=True``); it must be importable where the Spark tasks run, and must not
        import Airflow (Airflow forbids its database to a task's child processes)
    :param readers: parallel readers (default: the queue's MAX_QUEUE_READERS)
    :param poison_strategy: retry, quarantine, end_conversation, disable or timer_retry
    :param timer_retry_delay: seconds before a timer_retry retries a parked message
    :param broker_conn_id: the broker connection; its DSN reaches the job through the
        environment, never the command line
    :param conn_id: the Spark connection (JSON form, e.g. ``{"conn_type": "spark", "host":
        "local[2]"}``; the URI form spark://local[2] silently means yarn)
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
        batch_size: int = 100,
        waitfor_timeout: float = 1.0,
        idle_exit: float = 5.0,
        poison_strategy: str = "quarantine",
        max_attempts: int = 3,
        timer_retry_delay: int = 30,
        reply_message_type: str | None = None,
        conn_id: str = "spark_default",
        spark_binary: str | None = None,
        **kwargs: Any,
    ) -> None:
        if poison_strategy not in STRATEGIES:
            raise ValueError(f"poison_strategy must be one of {STRATEGIES}")
        kwargs.setdefault("name", f"broker-reader-{queue_name}")
        conf = {"spark.ui.enabled": "false", **(kwargs.pop("conf", None) or {})}
        super().__init__(application=spark_reader.__file__, conn_id=conn_id,
                         spark_binary=spark_binary or default_spark_binary(), conf=conf,
                         **kwargs)
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

    # SparkSubmitOperator.execute returns nothing; this one returns the summary for XCom.
    def execute(self, context: Context) -> dict[str, Any]:  # type: ignore[override]
        run_id = uuid.uuid4()
        with BrokerHook(self.broker_conn_id) as hook:
            info = hook.get_conn_info()
            self.application_args = self.reader_arguments(info.schema, run_id)
            self.env_vars = {"PYSPARK_PYTHON": sys.executable, **(self.env_vars or {}),
                             "AIRFLOW_BROKER_DSN": info.dsn}
            self.log.info("submitting %s reader(s) for queue %s, handler %s, strategy %s",
                          self.readers or "MAX_QUEUE_READERS", self.queue_name, self.handler,
                          self.poison_strategy)
            super().execute(context)
            with hook.transaction() as tx:
                rows = tx.run(sql.SQL("SELECT summary FROM {}.reader_runs WHERE run_id = %s")
                              .format(sql.Identifier(info.schema)), [run_id])
        if not rows:
            raise RuntimeError(f"the reader job ended without recording run {run_id}")
        summary: dict[str, Any] = rows[0][0]
        self.log.info("reader run %s: received %s, processed %s, replied %s, quarantined %s, "
                      "retried %s", run_id, summary["received"], summary["processed"],
                      summary["replied"], summary["quarantined"], summary["retried"])
        return summary


class QuarantineOperator(BaseOperator):
    """Replays quarantined messages onto their conversations (after the handler was fixed) or
    discards them: the ids given, or every open one of ``queue_name``. Returns the ids done."""

    template_fields: Sequence[str] = ("quarantine_ids", "queue_name")

    def __init__(self, *, action: str, quarantine_ids: Sequence[int] | None = None,
                 queue_name: str | None = None,
                 broker_conn_id: str = BrokerHook.default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if action not in ("replay", "discard"):
            raise ValueError("action must be replay or discard")
        if quarantine_ids is None and queue_name is None:
            raise ValueError("give quarantine_ids, or queue_name for all of a queue")
        self.action = action
        self.quarantine_ids = quarantine_ids
        self.queue_name = queue_name
        self.broker_conn_id = broker_conn_id

    def execute(self, context: Context) -> list[int]:
        with BrokerHook(self.broker_conn_id) as hook:
            broker = hook.get_broker()
            ids = ([int(i) for i in self.quarantine_ids] if self.quarantine_ids is not None
                   else [q.quarantine_id
                         for q in quarantine.list_quarantined(broker, self.queue_name)])
            if ids:
                (quarantine.replay if self.action == "replay" else quarantine.discard)(broker,
                                                                                       ids)
        self.log.info("%s %d quarantined messages: %s", "replayed" if self.action == "replay"
                      else "discarded", len(ids), ids)
        return ids
