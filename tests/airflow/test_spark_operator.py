"""ActivatedReaderOperator and QuarantineOperator through dag.test() (issue 6)."""

from __future__ import annotations

import json

import psycopg
import pytest

from airflow_broker import quarantine
from tests.airflow.conftest import ROOT, RunDag, task_states, xcom
from tests.conftest import App
from tests.helpers import count


@pytest.mark.slow
def test_activated_reader_job(run_dag: RunDag, app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL",
                       json.dumps({"conn_type": "spark", "host": "local[2]"}))
    monkeypatch.setenv("AIRFLOW_BROKER_TEST_ROOT", str(ROOT))
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
