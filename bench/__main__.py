"""``python -m bench``: runs the benchmark, prints the table, writes the JSON."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.harness import DSN_ENV
from bench.pgmq_peer import PgmqUnavailable
from bench.report import table
from bench.scenario import SCENARIOS, Options
from bench.suite import execute

DEFAULT_JSON = Path(__file__).parent / "results" / "latest.json"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="airflow-broker vs pgmq on one PostgreSQL: every scenario for both sides, "
        "alternating, several rounds; medians and ours/peer ratios as a table and as JSON. "
        f"Uses the PostgreSQL at ${DSN_ENV} when set, else starts an embedded one.",
    )
    parser.add_argument("--rounds", type=int, help="rounds per scenario (default 5)")
    parser.add_argument("--seconds", type=float,
                        help="length of each throughput measurement (default 5)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run of a few seconds: tiny sizes, numbers not meaningful")
    parser.add_argument("--only", help=f"comma-separated scenarios among {','.join(SCENARIOS)}")
    parser.add_argument("--samples", type=int,
                        help="latency samples per side in e and k (200; --quick: 3)")
    parser.add_argument("--sizes", help="cost-growth sizes, comma-separated "
                        "(default 1000,100000,1000000; --quick: 1000,10000)")
    parser.add_argument("--drain", type=int,
                        help="messages drained in the memory scenario (1000000; --quick: 20000)")
    parser.add_argument("--spark-messages", type=int,
                        help="messages drained by the Spark readers and their peer "
                        "(20000; --quick: 400)")
    parser.add_argument("--dsn", help=f"PostgreSQL to use (default: ${DSN_ENV}, else embedded); "
                        "use a database of its own: the run leaves its tables there")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON,
                        help="where to write the JSON result (default bench/results/latest.json)")
    return parser


def options_from(args: argparse.Namespace) -> Options:
    only = None
    if args.only:
        only = frozenset(s.strip() for s in args.only.split(",") if s.strip())
        unknown = only - set(SCENARIOS)
        if unknown:
            raise SystemExit(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else None
    chosen = {
        "rounds": args.rounds, "seconds": args.seconds, "latency_samples": args.samples,
        "growth_sizes": sizes, "drain_messages": args.drain, "spark_messages": args.spark_messages,
        "only": only, "dsn": args.dsn,
        "json_path": args.json,
    }
    if args.quick:
        return Options.quick_preset(**chosen)
    return Options(**{k: v for k, v in chosen.items() if v is not None})


def main(argv: list[str] | None = None) -> int:
    options = options_from(_parser().parse_args(argv))
    if options.rounds < 1 or options.seconds <= 0:
        raise SystemExit("--rounds must be at least 1 and --seconds positive")
    try:
        result = execute(options)
    except PgmqUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(table(result.scenarios))
    settings = result.data["settings"]
    print(
        f"\n{settings['rounds']} round{'s' if settings['rounds'] != 1 else ''}, "
        f"{settings['seconds']} s per throughput measurement, "
        f"{result.data['duration_s']} s in all; medians over rounds."
        + (f" JSON: {options.json_path}" if options.json_path else "")
    )
    failed = [s for s in result.scenarios if s.status in ("failed", "unavailable")]
    for scenario in failed:
        print(f"{scenario.id} {scenario.status}: {scenario.note}", file=sys.stderr)
    return 1 if any(s.status == "failed" for s in failed) else 0


if __name__ == "__main__":
    sys.exit(main())
