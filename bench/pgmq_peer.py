"""The peer: pgmq, installed from its PyPI package, which bundles pgmq's SQL-only install.

Only the SQL file is used (the package's Python client is never imported), so the peer runs the
same psycopg calls as our side and no client library of either side is measured.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import psycopg
from psycopg import sql

from bench.ops import Conn, json_body

PACKAGE = "pgmq"
# Pinned so two runs compare against the same peer; the package pins pgmq's SQL version.
PACKAGE_VERSION = "1.1.4"


class PgmqUnavailable(RuntimeError):
    """pgmq could not be installed or its SQL install script could not be found."""


def installed_version() -> str | None:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def ensure_package() -> str:
    """Installs the pgmq package with pip when missing; returns its version."""
    version = installed_version()
    if version is not None:
        return version
    command = [
        sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
        f"{PACKAGE}=={PACKAGE_VERSION}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    version = installed_version()
    if done.returncode != 0 or version is None:
        detail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise PgmqUnavailable(
            f"could not install {PACKAGE}=={PACKAGE_VERSION} from PyPI (pip exit code "
            f"{done.returncode}); the benchmark needs it as its peer. pip said:\n"
            + "\n".join(detail)
        )
    return version


def install_script() -> Path:
    """The SQL-only install script shipped inside the package."""
    files = importlib.metadata.distribution(PACKAGE).files or []
    for entry in files:
        if entry.name == "pgmq.sql":
            path = Path(str(entry.locate()))
            if path.is_file():
                return path
    raise PgmqUnavailable(f"the installed {PACKAGE} package has no pgmq.sql install script")


def sql_version(script: Path) -> str:
    pin = script.with_name("VERSION")
    return pin.read_text(encoding="utf-8").strip() if pin.is_file() else "unknown"


def install(dsn: str) -> str:
    """Installs pgmq's schema into the database once; returns the SQL version."""
    script = install_script()
    with psycopg.connect(dsn, autocommit=True) as conn:
        present = conn.execute("SELECT to_regclass('pgmq.meta') IS NOT NULL").fetchone()
        if not (present and present[0]):
            # The script's CREATE FUNCTIONs are not idempotent, hence the check above.
            with conn.transaction():
                conn.execute(script.read_text(encoding="utf-8").encode())
    return sql_version(script)


def table(queue: str) -> sql.Identifier:
    return sql.Identifier("pgmq", f"q_{queue}".lower())


def create_queue(conn: Conn, queue: str) -> None:
    conn.execute("SELECT pgmq.create(%s)", [queue])


def purge(conn: Conn, queue: str) -> None:
    """Deletes every message. Not pgmq.purge_queue, which truncates: our queue table is shared
    by every queue and cannot be truncated, so both sides start from DELETE + VACUUM alike."""
    conn.execute(sql.SQL("DELETE FROM {}").format(table(queue)))


def fill(
    conn: Conn, queue: str, count: int, body_size: int
) -> None:
    """``count`` visible messages, as send_batch writes them, in one set-based INSERT."""
    if count <= 0:
        return
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (vt, message) SELECT clock_timestamp(), %s::jsonb"
            " FROM generate_series(1, %s)"
        ).format(table(queue)),
        [json_body(body_size), count],
    )


def visible(conn: Conn, queue: str) -> int:
    row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table(queue))).fetchone()
    return int(row[0]) if row else 0
