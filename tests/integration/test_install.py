"""Installing and upgrading the broker schema."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import psycopg

from airflow_broker import Broker
from airflow_broker.migrations import functions, install, migrations, pending
from airflow_broker.queries import QUERIES_DIR


def test_install_is_idempotent_and_reports_what_it_did(empty_dsn: str) -> None:
    first = install(empty_dsn)
    assert first.applied == [f.name for f in migrations()] + [f.name for f in functions()]
    assert pending(empty_dsn) == []
    again = install(empty_dsn)
    assert again.applied == []


def test_upgrade_keeps_data(empty_dsn: str) -> None:
    """A schema installed by an older release (only the first migration applied, and data in
    it) is upgraded in place."""
    first_migration = migrations()[0].name
    install(empty_dsn, up_to=first_migration.split("__")[0])
    with psycopg.connect(empty_dsn) as conn:
        conn.execute("""INSERT INTO broker.message_types (name, validation_kind, created_at)
                        VALUES ('KeptType', 'NONE', now())""")
    later = [f.name for f in migrations()[1:]] + [f.name for f in functions()]
    assert pending(empty_dsn) == later
    with Broker(empty_dsn) as broker:
        report = broker.install()
        assert report.applied == later
        with broker.transaction() as tx:
            tx.create_contract("UsesKept", {"KeptType": "ANY"})
            tx.create_queue("q")
            tx.create_service("S", "q", ["UsesKept"])
            handle = tx.begin_dialog("S", "S", "UsesKept")
            tx.send(handle, "KeptType", b"still works")
        with broker.transaction() as tx:
            assert [m.message_body for m in tx.receive("q")] == [b"still works"]


def test_changed_function_file_is_reapplied(empty_dsn: str) -> None:
    install(empty_dsn)
    with psycopg.connect(empty_dsn) as conn:
        conn.execute("INSERT INTO broker.schema_migrations (name, checksum) VALUES ('x', 'y')")
        conn.execute("UPDATE broker.schema_migrations SET checksum = 'stale'"
                     " WHERE name = '30_send.sql'")
    # CREATE OR REPLACE resets a function's security: the privileges follow every change.
    assert pending(empty_dsn) == ["30_send.sql", "99_privileges.sql"]
    assert install(empty_dsn).applied == ["30_send.sql", "99_privileges.sql"]
    with psycopg.connect(empty_dsn) as conn:
        definer = conn.execute(
            "SELECT bool_and(prosecdef), bool_and(has_function_privilege('public', oid,"
            " 'EXECUTE')) FROM pg_proc WHERE oid::regproc::text = 'broker.send'").fetchone()
    assert definer == (True, True)


# Planned in place inside the statements that call them (99_privileges.sql).
IN_PLACE = ["broker.max_message_size()", "broker.role_may(name,text,smallint,integer,oid)"]


def _routines_without_jit_off(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [str(name) for (name,) in conn.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc p"
            " WHERE p.pronamespace = 'broker'::regnamespace"
            "   AND NOT coalesce('jit=off' = ANY (p.proconfig), false)"
            " ORDER BY 1").fetchall()]


def test_no_statement_of_the_broker_is_jit_compiled(empty_dsn: str) -> None:
    """On a server with JIT (jit=on, the default where PostgreSQL is built with LLVM), the
    planner settings of the broker's functions put their statements' estimated costs past
    jit_above_cost, and each SEND compiled them anew (265 ms instead of 1 ms on PostgreSQL 15
    with LLVM). Every routine of the schema runs with JIT off, also after a function file is
    applied again (CREATE OR REPLACE resets a function's settings); the two that PostgreSQL
    plans in place become part of statements that run with JIT off."""
    install(empty_dsn)
    with psycopg.connect(empty_dsn) as conn:
        routines = conn.execute("SELECT count(*) FROM pg_proc"
                                " WHERE pronamespace = 'broker'::regnamespace").fetchone()
    assert routines is not None and routines[0] > 100
    assert _routines_without_jit_off(empty_dsn) == IN_PLACE
    with psycopg.connect(empty_dsn) as conn:
        conn.execute("UPDATE broker.schema_migrations SET checksum = 'stale'"
                     " WHERE name = '30_send.sql'")
    assert install(empty_dsn).applied == ["30_send.sql", "99_privileges.sql"]
    assert _routines_without_jit_off(empty_dsn) == IN_PLACE


def test_the_permission_check_is_planned_in_place(empty_dsn: str) -> None:
    """SEND, RECEIVE, END CONVERSATION and BEGIN DIALOG check permissions with role_may()
    inside their own statements, where PostgreSQL plans its query in place: as a call of its
    own it cost about 15 us, and 40-60 us in RECEIVE's statement. A SECURITY DEFINER or a SET
    on it would turn it back into a call."""
    install(empty_dsn)
    _assert_planned_in_place(empty_dsn)
    # An install from before: both ran with the owner's rights and settings, and an upgrade
    # that changes neither file undoes it.
    with psycopg.connect(empty_dsn) as conn:
        for routine in IN_PLACE:
            conn.execute(f"ALTER ROUTINE {routine} SECURITY DEFINER SET jit = off")
        conn.execute("UPDATE broker.schema_migrations SET checksum = 'stale'"
                     " WHERE name = '30_send.sql'")
    assert install(empty_dsn).applied == ["30_send.sql", "99_privileges.sql"]
    _assert_planned_in_place(empty_dsn)


def _assert_planned_in_place(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("SET search_path = broker")
        plan = "\n".join(str(row[0]) for row in conn.execute(
            "EXPLAIN VERBOSE SELECT q.name FROM queues q WHERE (SELECT * FROM role_may("
            "session_user, 'RECEIVE', 1::smallint, q.object_id, q.principal_id))"))
        assert "role_may" not in plan and "permissions" in plan, plan
        plan = "\n".join(str(row[0]) for row in conn.execute(
            "EXPLAIN VERBOSE SELECT max_message_size()"))
        assert "max_message_size" not in plan and "67108864" in plan, plan


def test_schema_name_is_configurable(empty_dsn: str) -> None:
    with Broker(empty_dsn, schema="Trading Broker") as broker:
        broker.install()
        with broker.transaction() as tx:
            tx.create_queue("q", schema="public")
            tx.create_service("S", "q", ["DEFAULT"])
            handle = tx.begin_dialog("S", "S")
            tx.send(handle, "DEFAULT", b"in a schema with a space")
        with broker.transaction() as tx:
            (message,) = tx.receive("q", waitfor=True, timeout=5)
    assert message.message_body == b"in a schema with a space"
    with psycopg.connect(empty_dsn) as conn:
        schemas = {r[0] for r in conn.execute("SELECT nspname FROM pg_namespace").fetchall()}
    assert "Trading Broker" in schemas and "broker" not in schemas


def test_wheel_maps_airflow_folders_into_the_package(tmp_path: Path) -> None:
    """hooks/, operators/ and sensors/ install inside airflow_broker, never at the top of
    site-packages, and the SQL files ship with the package."""
    root = Path(__file__).resolve().parents[2]
    # setuptools builds in the source tree's build/, and ships what an earlier build left
    # there (a module or SQL file since moved): the wheel is built from a clean one.
    shutil.rmtree(root / "build", ignore_errors=True)
    try:
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
             "-w", str(tmp_path), str(root)],
            check=True,
        )
    finally:
        shutil.rmtree(root / "build", ignore_errors=True)
    (wheel,) = tmp_path.glob("airflow_broker-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"airflow_broker", wheel.name.split("-py3")[0] + ".dist-info"}
    assert len(names) == len(set(names))
    for package in ("hooks", "operators", "sensors", "triggers", "notifications", "queues",
                    "admin", "demos", "poison", "readers", "spark", "worker", "ui"):
        assert f"airflow_broker/{package}/__init__.py" in names
    # The UI's built bundle, and none of its sources or build tools.
    assert [n for n in names if "/www/" in n] == ["airflow_broker/ui/www/dist/broker-ui.umd.cjs"]
    # Every module of the source tree is in the wheel.
    package_dir = root / "airflow_broker"
    assert {f"airflow_broker/{p.relative_to(package_dir)}" for p in package_dir.rglob("*.py")
            if "__pycache__" not in p.parts} <= set(names)
    shipped_sql = {n.rsplit("/", 1)[1] for n in names if n.endswith(".sql")}
    assert shipped_sql == ({f.name for f in migrations()} | {f.name for f in functions()}
                           | {f.name for f in QUERIES_DIR.glob("*.sql")})
    for package in ("hooks", "operators", "sensors"):
        assert importlib.import_module(f"airflow_broker.{package}").__name__.endswith(package)


# Imports every module of the installed package under the names users use, and prints any
# whose file is not in the checkout given as the first argument.
IMPORT_EVERY_MODULE = """
import importlib, pathlib, pkgutil, sys
import airflow_broker
checkout = pathlib.Path(sys.argv[1]).resolve()
# The Airflow folders by name: a checkout without links has no such packages to walk.
names = ["airflow_broker"] + [f"airflow_broker.{folder}" for folder in (
    "hooks", "operators", "sensors", "triggers", "notifications", "queues")] + [
    m.name for m in pkgutil.walk_packages(airflow_broker.__path__, "airflow_broker.")
    if not any(part.startswith("_") for part in m.name.split("."))]
for name in names:
    path = pathlib.Path(importlib.import_module(name).__file__).resolve()
    if checkout not in path.parents:
        print("elsewhere:", name, path)
print(len(names), "modules")
"""


def editable_install(tmp_path: Path, symlinks: bool) -> tuple[Path, Path,
                                                              subprocess.CompletedProcess[str]]:
    """A fresh clone (with or without symbolic links) installed editable into a new
    environment whose dependencies come from this one (no download): the clone, the
    environment's python and pip's result."""
    root = Path(__file__).resolve().parents[2]
    clone = tmp_path / "clone"
    subprocess.run(["git", "-c", f"core.symlinks={str(symlinks).lower()}", "clone", "-q",
                    str(root), str(clone)], check=True)
    assert (clone / "airflow_broker" / "hooks").is_symlink() == symlinks
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig;"
                              " print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    (Path(purelib) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python),
                                "install", "--no-deps", "--no-build-isolation", "-e",
                                str(clone)], capture_output=True, text=True, cwd=tmp_path)
    return clone, python, installed


def test_an_editable_install_of_a_fresh_clone_imports_every_module(tmp_path: Path) -> None:
    """CONTRIBUTING's set-up from a fresh clone: every public module imports under the name
    users use, from the clone (the Airflow folders through the tree's links), and setuptools
    says nothing a newcomer would have to look into."""
    clone, python, installed = editable_install(tmp_path, symlinks=True)
    assert installed.returncode == 0, installed.stderr
    assert "warning" not in (installed.stdout + installed.stderr).lower(), installed.stderr
    result = subprocess.run([str(python), "-c", IMPORT_EVERY_MODULE, str(clone)],
                            capture_output=True, text=True, cwd=tmp_path,
                            env={**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow"),
                                 "PYTHONPATH": ""})
    assert result.returncode == 0, result.stderr
    assert "elsewhere:" not in result.stdout, result.stdout


def test_a_checkout_without_symbolic_links_is_refused_saying_why(tmp_path: Path) -> None:
    """git's core.symlinks=false (Windows without Developer Mode) leaves text files where
    the links were: the install stops at the first of them, naming it (CONTRIBUTING)."""
    _, _, installed = editable_install(tmp_path, symlinks=False)
    assert installed.returncode != 0
    assert "airflow_broker/hooks' exists, but is not a directory" in installed.stderr
