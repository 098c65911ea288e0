"""The ``airflow-broker`` command."""

from __future__ import annotations

import argparse
import logging
import sys

import psycopg

from airflow_broker.broker import Broker
from airflow_broker.embedded import EmbeddedPostgres, default_data_dir
from airflow_broker.errors import BrokerError
from airflow_broker.redaction import redact


def _install(args: argparse.Namespace) -> int:
    with Broker(args.dsn, schema=args.schema) as broker:
        report = broker.install(owner=args.owner)
    if report.applied:
        print(f"schema {report.schema}: applied {', '.join(report.applied)}")
    else:
        print(f"schema {report.schema}: already current")
    return 0


def _demo(args: argparse.Namespace) -> int:
    if args.ui:
        from airflow_broker.demos.ui_demo import run_ui_demo

        return run_ui_demo(args.dsn, accounts=args.accounts or 100,
                           trades_per_account=args.trades or 30, port=args.port,
                           until_done=args.until_done)
    if not args.engine_only:
        from airflow_broker.demos.airflow_demo import run_demo as run_airflow_demo

        return run_airflow_demo(args.dsn, accounts=args.accounts or 100,
                                trades_per_account=args.trades or 30)
    from airflow_broker.demos.demo import run_demo

    result = run_demo(args.dsn, accounts=args.accounts or 40, trades_per_account=args.trades or 25)
    ok = (result.booked + 1 == result.sent and result.acknowledged == result.booked
          and result.booked_in_order and len(result.errors) == 1 and result.endpoints_left == 0)
    return 0 if ok else 1


def _worker(args: argparse.Namespace) -> int:
    from airflow_broker.worker import BrokerWorker

    with Broker(args.dsn, schema=args.schema, application_name="airflow-broker-worker") as broker:
        worker = BrokerWorker(broker, batch_size=args.batch_size, interval=args.interval,
                              activation_targets=args.activation_target)
        if args.once:
            print(worker.run_once())
        else:
            worker.run()
    return 0


def _ui_permissions(args: argparse.Namespace) -> int:
    from airflow_broker.ui.fab import NotFab, register_resources

    try:
        done = register_resources()
    except NotFab as other:
        print(f"the auth manager is {other}, not FAB's: it keeps no list of resources, and "
              "the broker's pages ask it about theirs by name (docs/ui.md)")
        return 0
    for action, resource in done.created:
        print(f"created {action} on {resource!r}, given to {done.admin_role}")
    if done.existing:
        print(f"{len(done.existing)} of the broker's permissions were there already "
              f"(given to {done.admin_role})")
    return 0


def _cleanup(args: argparse.Namespace) -> int:
    from airflow_broker.admin.cleanup import cleanup_leaked_endpoints

    with Broker(args.dsn, schema=args.schema) as broker:
        summary = cleanup_leaked_endpoints(broker, batch_size=args.batch_size,
                                           dry_run=args.dry_run, progress=not args.quiet)
    print(f"leaked endpoints found: {summary.found}")
    for (service, far_service), n in summary.by_far_service.items():
        print(f"  {n:>10}  {service} <- {far_service}")
    if summary.dry_run:
        print("dry run: nothing was removed (run without --dry-run to end them WITH CLEANUP)")
    else:
        print(f"removed with END CONVERSATION WITH CLEANUP: {summary.removed} "
              f"in {summary.seconds:.1f} s (each logged in {args.schema or 'broker'}.cleanup_log)")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from airflow_broker.admin.doctor import diagnose

    with Broker(args.dsn, schema=args.schema) as broker:
        report = diagnose(broker)
    print(report.to_json() if args.json else report.to_text())
    return 0 if report.healthy else 1


def _quarantine(args: argparse.Namespace) -> int:
    from airflow_broker.poison import quarantine

    with Broker(args.dsn, schema=args.schema) as broker:
        if args.action == "list":
            with broker.transaction() as tx:
                rows = quarantine.list_quarantined(tx, args.queue, args.all)
            if args.json:
                import dataclasses
                import json

                print(json.dumps([{**dataclasses.asdict(r), "message_body": r.body_text(10**9)}
                                  for r in rows], default=str, indent=2))
                return 0
            print(f"{len(rows)} quarantined messages")
            for r in rows:
                print(f"  #{r.quarantine_id} {r.status} {r.queue_name} conversation "
                      f"{r.conversation_handle} seq {r.message_sequence_number} "
                      f"{r.message_type_name} attempts {r.attempts}")
                print(f"      error: {r.error}")
                print(f"      body:  {r.body_text()}")
            return 0
        ids = args.ids
        if args.all:
            with broker.transaction() as tx:
                ids = [r.quarantine_id for r in quarantine.list_quarantined(tx, args.queue)]
        if not ids:
            print("nothing to do: give quarantine ids, or --all with --queue")
            return 2
        with broker.transaction() as tx:
            done = (quarantine.replay if args.action == "replay" else quarantine.discard)(tx, ids)
        print(f"{args.action}ed {done} messages")
    return 0


def _enable_queue(args: argparse.Namespace) -> int:
    from airflow_broker.admin.enable_queue import run_enable_queue

    return run_enable_queue(args)


def _server(args: argparse.Namespace) -> int:
    if args.listen and args.action != "start":
        print("airflow-broker: --listen goes with `server start`", file=sys.stderr)
        return 2
    server = EmbeddedPostgres(args.data_dir, keep_running=args.action == "start",
                              listen=args.listen, port=args.port)
    if args.action == "stop":
        server.stop()
        print(f"stopped the embedded PostgreSQL in {server.data_dir}")
        return 0
    uri = server.ensure_database()
    # The TCP DSN names the password file; the password itself is never printed.
    print(server.tcp_dsn() if args.tcp or args.listen else uri)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="airflow-broker",
        description="SQL Server Service Broker semantics on PostgreSQL.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    commands = parser.add_subparsers(dest="command", required=True)

    install = commands.add_parser("install", help="create or upgrade the broker schema")
    install.add_argument("--dsn", help="PostgreSQL DSN (default: AIRFLOW_BROKER_DSN, else the "
                                       "embedded PostgreSQL)")
    install.add_argument("--schema", help="broker schema (default: AIRFLOW_BROKER_SCHEMA or "
                                          "broker)")
    install.add_argument("--owner", help="the role that owns the schema, whose rights the "
                                         "broker's functions run with (default: the login; "
                                         "docs/security.md)")
    install.set_defaults(run=_install)

    def connection_options(command: argparse.ArgumentParser) -> None:
        command.add_argument("--dsn", help="PostgreSQL DSN (default: AIRFLOW_BROKER_DSN, else "
                                           "the embedded PostgreSQL)")
        command.add_argument("--schema", help="broker schema (default: AIRFLOW_BROKER_SCHEMA "
                                              "or broker)")

    worker = commands.add_parser(
        "worker", help="run the background work: timers, lifetimes, delivery, reclaim")
    connection_options(worker)
    worker.add_argument("--once", action="store_true", help="one pass, then exit")
    worker.add_argument("--interval", type=float, default=1.0, help="seconds between passes")
    worker.add_argument("--batch-size", type=int, default=1000,
                        help="rows per transaction (a transport step grows to 8 times this "
                             "while a backlog lasts)")
    worker.add_argument("--activation-target", action="append", metavar="PATTERN",
                        help="an activation procedure this worker may start, e.g. "
                             "'trading.readers:*' (repeat for more; default: "
                             "AIRFLOW_BROKER_ACTIVATION_TARGETS, comma-separated); queues with "
                             "any other procedure are refused")
    worker.set_defaults(run=_worker)

    cleanup = commands.add_parser(
        "cleanup", help="end leaked conversation endpoints WITH CLEANUP, in batches")
    connection_options(cleanup)
    cleanup.add_argument("--dry-run", action="store_true", help="report, remove nothing")
    cleanup.add_argument("--batch-size", type=int, default=1000,
                         help="endpoints per transaction")
    cleanup.add_argument("--quiet", action="store_true", help="no progress bar")
    cleanup.set_defaults(run=_cleanup)

    doctor = commands.add_parser(
        "doctor", help="check queues, activation, monitors, leaks, held messages and services")
    connection_options(doctor)
    doctor.add_argument("--json", action="store_true", help="machine-readable report")
    doctor.set_defaults(run=_doctor)

    quarantine = commands.add_parser(
        "quarantine", help="list, replay or discard messages a reader moved aside")
    connection_options(quarantine)
    quarantine.add_argument("action", choices=["list", "replay", "discard"])
    quarantine.add_argument("ids", nargs="*", type=int, help="quarantine ids")
    quarantine.add_argument("--queue", help="only this queue")
    quarantine.add_argument("--all", action="store_true",
                            help="list: also replayed and discarded ones; replay/discard: "
                                 "every open one (of --queue)")
    quarantine.add_argument("--json", action="store_true")
    quarantine.set_defaults(run=_quarantine)

    enable_queue = commands.add_parser(
        "enable-queue", help="enable a queue again (ALTER QUEUE ... STATUS = ON) once the "
                             "cause of a poison-message disable is fixed")
    connection_options(enable_queue)
    enable_queue.add_argument("queue", help="queue name (or schema.name)")
    enable_queue.set_defaults(run=_enable_queue)

    demo = commands.add_parser(
        "demo", help="run the stock-trade demo through Airflow and Spark readers")
    demo.add_argument("--dsn", help="PostgreSQL DSN (default: the embedded PostgreSQL)")
    demo.add_argument("--accounts", type=int, default=None,
                      help="dialogs, one per account (default 100; 40 with --engine-only)")
    demo.add_argument("--trades", type=int, default=None,
                      help="trades per account (default 30; 25 with --engine-only)")
    demo.add_argument("--engine-only", action="store_true",
                      help="the engine alone, without Airflow and Spark (a few seconds)")
    demo.add_argument("--ui", action="store_true",
                      help="in an Airflow deployment (api-server, scheduler, dag-processor, "
                           "triggerer), keeping Airflow's UI and the broker's pages up until "
                           "Ctrl-C")
    demo.add_argument("--port", type=int, default=None,
                      help="with --ui: the api-server's port (default: a free one)")
    demo.add_argument("--until-done", action="store_true",
                      help="with --ui: stop when the demo's DAG run has finished")
    demo.set_defaults(run=_demo)

    ui_permissions = commands.add_parser(
        "ui-permissions",
        help="under Airflow's FAB auth manager: create the resources of the broker's pages "
             "(Broker, Broker Queues, ...) with can_read and can_create, given to Admin, so "
             "that `airflow roles add-perms` can grant them to other roles; run where Airflow's "
             "configuration is")
    ui_permissions.set_defaults(run=_ui_permissions)

    server = commands.add_parser(
        "server", help="the embedded PostgreSQL: start it (and keep it running), print its "
                       "URI, or stop it")
    server.add_argument("action", choices=["start", "uri", "stop"])
    server.add_argument("--data-dir", default=None,
                        help=f"data directory (default: {default_data_dir()})")
    server.add_argument("--listen", metavar="ADDRESS", nargs="?", const="127.0.0.1",
                        help="start: also listen on TCP at this address (127.0.0.1 when none "
                             "is given, or an address other hosts reach), with scram-sha-256 "
                             "and a generated password kept in a 0600 file of the data "
                             "directory")
    server.add_argument("--port", type=int, help="start --listen: the TCP port (default: a "
                                                 "free one, kept for later starts)")
    server.add_argument("--tcp", action="store_true",
                        help="uri: the TCP DSN (without the password: it names the file)")
    server.set_defaults(run=_server)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        code: int = args.run(args)
        return code
    except BrokerError as exc:
        print(f"airflow-broker: {exc}", file=sys.stderr)
        return 2
    except psycopg.Error as exc:
        # libpq's messages may quote the connection string given.
        what = "database error" if exc.sqlstate else "cannot connect"
        print(f"airflow-broker: {what}: {redact(str(exc).strip())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
