"""What the permission checks cost SEND and RECEIVE: scenarios a and c (1 message per
transaction, one client) before and after, in one run.

"before" is the broker schema as an earlier commit's SQL installed it (default: the commit
before sql/migrations/V012__permissions.sql, the last without permission checks), and "after"
the current one, side by side in one database: ``broker_before`` and ``broker``. Both are
driven at the SQL level (the functions' signatures did not change), so the Python client is
the same for both and the difference is the server's. Each is measured as an application's
login with that version's grants (before: rights on the tables; after: RECEIVE and
REFERENCES), and the current one also as the schema's owner, whose checks stop at the first
test. Variants alternate within each round; the table gives medians and after/before ratios.

    .venv/bin/python -m bench.permission_cost              # 5 rounds of 5 s, ~3 minutes
    .venv/bin/python -m bench.permission_cost --rounds 3 --seconds 2
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from airflow_broker.migrations import SqlFile, apply_file, install
from airflow_broker.queries import Queries
from bench.harness import database, durable
from bench.report import median
from bench.rounds import rotated
from bench.scenario import Options

ROOT = Path(__file__).resolve().parent.parent
SQL = "airflow_broker/sql"
PERMISSIONS_MIGRATION = f"{SQL}/migrations/V012__permissions.sql"
BEFORE, AFTER = "broker_before", "broker"
APP = "bench_application"
MESSAGE_TYPE = "BenchMessage"
BODY = b"x" * 100


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def default_before() -> str:
    """The commit before the permission checks came: the parent of the commit that added
    their migration, or HEAD while that migration is not committed yet."""
    added = _git("log", "--diff-filter=A", "--format=%H", "--", PERMISSIONS_MIGRATION)
    return _git("rev-parse", f"{added.split()[-1]}^" if added else "HEAD")


def _files_at(commit: str, folder: str) -> list[SqlFile]:
    names = sorted(_git("ls-tree", "--name-only", commit, f"{SQL}/{folder}/").split())
    return [SqlFile(Path(name).name, _git("show", f"{commit}:{name}"))
            for name in names if name.endswith(".sql")]


def install_at(dsn: str, schema: str, commit: str) -> None:
    """The broker schema as ``commit``'s SQL installs it, in ``schema``."""
    queries = Queries(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(queries["create_schema"])
        conn.execute(queries["create_schema_migrations"])
        for file in [*_files_at(commit, "migrations"), *_files_at(commit, "functions")]:
            apply_file(conn, queries, file)


@dataclass
class Side:
    """One schema's catalogue: a dialog to SEND on, and a queue filled for RECEIVE."""

    schema: str
    handle: uuid.UUID
    queue: str

    def send(self) -> bytes:
        return Queries(self.schema).call(
            "send", 6, ["uuid[]", "text", "bytea", "boolean", "text", "text"])

    def receive(self) -> bytes:
        return Queries(self.schema).call("receive", 4, ["text", "bigint", "uuid", "uuid"])


def _call(conn: psycopg.Connection[tuple[object, ...]], schema: str, function: str,
          args: list[object], casts: list[str]) -> object:
    row = conn.execute(Queries(schema).call(function, len(args), casts), args).fetchone()
    return row[0] if row else None


def create_contract(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        _call(conn, schema, "create_message_type", [MESSAGE_TYPE], ["text"])
        _call(conn, schema, "create_contract", ["BenchContract", [MESSAGE_TYPE], ["ANY"]],
              ["text", "text[]", "text[]"])


def set_up(dsn: str, schema: str, variant: str, fill: int) -> Side:
    """A variant's own services and queues, as the superuser (so that no variant drains a
    queue another one reads); ``fill`` messages waiting on its receive queue."""
    prefix = f"{schema}_{variant}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        for queue in ("initiator", "send", "receive"):
            _call(conn, schema, "create_queue", [f"{prefix}_{queue}"], ["text"])
        _call(conn, schema, "create_service", [f"{prefix}_Initiator", f"{prefix}_initiator", []],
              ["text", "text", "text[]"])
        for target in ("send", "receive"):
            _call(conn, schema, "create_service",
                  [f"{prefix}_{target}", f"{prefix}_{target}", ["BenchContract"]],
                  ["text", "text", "text[]"])
        handles = {
            target: _call(conn, schema, "begin_dialog",
                          [f"{prefix}_Initiator", f"{prefix}_{target}", "BenchContract"],
                          ["text", "text", "text"])
            for target in ("send", "receive")
        }
        sent = 0
        while sent < fill:
            batch = min(1000, fill - sent)
            with conn.transaction():
                _call(conn, schema, "send_many",
                      [handles["receive"], MESSAGE_TYPE, [BODY] * batch, None, None],
                      ["uuid", "text", "bytea[]", "text", "text[]"])
            sent += batch
    handle = handles["send"]
    assert isinstance(handle, uuid.UUID)
    return Side(schema, handle, f"{prefix}_receive")


def grant(dsn: str) -> None:
    """The application login: before, rights on the tables (what that version needed);
    after, the broker permissions of docs/security.md."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(APP)))
        for schema in (BEFORE, AFTER):
            conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                sql.Identifier(schema), sql.Identifier(APP)))
        for what in ("ALL TABLES", "ALL SEQUENCES"):
            conn.execute(sql.SQL("GRANT ALL ON {} IN SCHEMA {} TO {}").format(
                sql.SQL(what), sql.Identifier(BEFORE), sql.Identifier(APP)))
        for permission, securable in (("RECEIVE", f"QUEUE::{AFTER}_app_initiator"),
                                      ("RECEIVE", f"QUEUE::{AFTER}_app_receive"),
                                      ("REFERENCES", "CONTRACT::BenchContract")):
            _call(conn, AFTER, "grant_permission", [permission, securable, APP],
                  ["text", "text", "text"])


@dataclass(frozen=True)
class Variant:
    name: str
    side: Side
    dsn: str


def rate(conn: psycopg.Connection[tuple[object, ...]], step: Callable[[], None],
         seconds: float) -> float:
    done = 0
    started = time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        with conn.transaction():
            step()
        done += 1
    return done / (time.perf_counter() - started)


def measure(variant: Variant, seconds: float) -> tuple[float, float]:
    side = variant.side
    with psycopg.connect(variant.dsn) as conn:
        send, receive = side.send(), side.receive()

        def send_one() -> None:
            conn.execute(send, [[side.handle], MESSAGE_TYPE, BODY, False, None, None])

        def receive_one() -> None:
            if not conn.execute(receive, [side.queue, 1, None, None]).fetchall():
                raise RuntimeError(f"{side.queue} ran dry: fill it with more messages")

        return rate(conn, send_one, seconds), rate(conn, receive_one, seconds)


@contextmanager
def prepared(options: Options, before: str) -> Iterator[list[Variant]]:
    with database(options) as (base_dsn, _):
        dsn = durable(base_dsn)
        # Enough for every round of the receiving variants at a few thousand a second.
        fill = int(4000 * options.seconds * options.rounds) + 1000
        install_at(dsn, BEFORE, before)
        install(dsn, AFTER)
        for schema in (BEFORE, AFTER):
            create_contract(dsn, schema)
        sides = [set_up(dsn, BEFORE, "app", fill), set_up(dsn, AFTER, "app", fill),
                 set_up(dsn, AFTER, "owner", fill)]
        grant(dsn)
        app = make_conninfo(dsn, user=APP)
        try:
            yield [Variant("before, application", sides[0], app),
                   Variant("after, application", sides[1], app),
                   Variant("after, schema owner", sides[2], dsn)]
        finally:
            with psycopg.connect(dsn, autocommit=True) as conn:
                for schema in (BEFORE, AFTER):
                    conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(
                        sql.Identifier(schema)))
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(APP)))
                conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(APP)))


def run(options: Options, before: str) -> str:
    results: dict[str, list[tuple[float, float]]] = {}
    with prepared(options, before) as variants:
        for r in range(options.rounds):
            # Each round starts with another variant, so none always runs on a warmer cache.
            for variant in rotated(variants, r):
                results.setdefault(variant.name, []).append(measure(variant, options.seconds))
                print(f"round {r + 1}: {variant.name}: SEND {results[variant.name][-1][0]:,.0f}"
                      f" msg/s, RECEIVE {results[variant.name][-1][1]:,.0f} msg/s",
                      file=sys.stderr)
    base_send = median([s for s, _ in results["before, application"]]) or 1.0
    base_receive = median([r for _, r in results["before, application"]]) or 1.0
    lines = [f"before = {before[:10]}; {options.rounds} rounds of {options.seconds:g} s;"
             " medians, msg/s", "",
             "| Variant | a: SEND 1 msg/tx | after/before | c: RECEIVE TOP(1)+commit |"
             " after/before |", "|---|---:|---:|---:|---:|"]
    for name, values in results.items():
        send = median([s for s, _ in values]) or 0.0
        receive = median([r for _, r in values]) or 0.0
        lines.append(f"| {name} | {send:,.0f} | {send / base_send:.2f}x | {receive:,.0f} |"
                     f" {receive / base_receive:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.permission_cost",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--before", help="the commit to compare with (default: the last one"
                                         " without permission checks)")
    parser.add_argument("--dsn", help="PostgreSQL to use (default: an embedded one)")
    args = parser.parse_args(argv)
    options = Options(rounds=args.rounds, seconds=args.seconds, dsn=args.dsn)
    print(run(options, args.before or default_before()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
