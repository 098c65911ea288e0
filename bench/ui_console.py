"""``python -m bench.ui_console``: how fast the broker's pages in Airflow's UI answer on a big
broker, and what their auto-refresh costs the database.

The pages read through airflow_broker.ui.console (one broker transaction per page, the
functions of sql/functions/67_console.sql); this measures those calls, the database's share of
a page, side by side on the same 200 queues in three states, in one run:

* **empty**: the queues and their services, no message;
* **filled**: ``--messages`` waiting (default 1,000,000), half of them on one deep queue and the
  rest spread over the others, 1,000 to a conversation, measured right after the SENDs (the
  visibility map not yet set: counts read the heap);
* **vacuumed**: the same after VACUUM (ANALYZE), as autovacuum leaves a quiet queue.

Pages: the overview (every queue, its depth and oldest message), a queue page (the deep queue's
head, at most 500 messages by conversation group) and the conversations page. Each is called
``--repeat`` times; the table shows the median and the 95th percentile, and each state's
median as a ratio of the empty broker's. The overview refreshes every 3 s in each open browser
tab (ui/www/src/usePolling.js): its median divided by 3 s is the share of one database core
that an open overview keeps busy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from airflow_broker import Broker
from airflow_broker.migrations import install
from airflow_broker.operators.setup import apply_spec
from airflow_broker.ui import console
from bench.harness import embedded_database

DEFAULT_JSON = Path(__file__).parent / "results" / "ui_console.json"
REFRESH_SECONDS = 3.0  # REFRESH_MS of ui/www/src/usePolling.js
MESSAGE_TYPE = "//Bench/UI/Event"
CONTRACT = "//Bench/UI/Contract"
SENDER = "//Bench/UI/Sender"
PER_CONVERSATION = 1000
BATCH = 1000  # messages per SEND transaction while filling
BODY = b'{"order": 1, "item": "widget", "quantity": 3}'
STATES = ("empty", "filled", "vacuumed")


def queue_name(n: int) -> str:
    return f"ui_queue_{n:03d}"


def spec(queues: int) -> dict[str, Any]:
    return {
        "message_types": [{"name": MESSAGE_TYPE}],
        "contracts": [{"name": CONTRACT, "message_types": {MESSAGE_TYPE: "INITIATOR"}}],
        "queues": [{"name": "ui_sender"}] + [{"name": queue_name(n)} for n in range(queues)],
        "services": [{"name": SENDER, "queue_name": "ui_sender"}] + [
            {"name": f"//Bench/UI/Service{n:03d}", "queue_name": queue_name(n),
             "contracts": [CONTRACT]} for n in range(queues)],
    }


def distribution(queues: int, messages: int) -> list[int]:
    """Messages per queue: half on queue 0, the rest spread evenly."""
    deep = messages // 2
    rest = messages - deep
    spread = [rest // (queues - 1) + (1 if n < rest % (queues - 1) else 0)
              for n in range(queues - 1)] if queues > 1 else []
    return [deep + (rest if queues == 1 else 0), *spread]


def fill(broker: Broker, queues: int, messages: int) -> None:
    sent = 0
    started = time.monotonic()
    for n, count in enumerate(distribution(queues, messages)):
        left = count
        while left > 0:
            with broker.transaction() as tx:
                handle = tx.begin_dialog(SENDER, f"//Bench/UI/Service{n:03d}", CONTRACT)
                conversation = min(left, PER_CONVERSATION)
                for start in range(0, conversation, BATCH):
                    tx.send_many(handle, MESSAGE_TYPE, [BODY] * min(BATCH, conversation - start))
            left -= conversation
            sent += conversation
        if n % 20 == 0:
            rate = sent / max(time.monotonic() - started, 1e-9)
            print(f"  filled {n + 1}/{queues} queues, {sent:,} messages ({rate:,.0f}/s)",
                  flush=True)


def vacuum(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")


def timed(call: Callable[[], object], repeat: int) -> list[float]:
    call()  # the first call plans the statements and warms the cache
    samples = []
    for _ in range(repeat):
        began = time.perf_counter()
        call()
        samples.append(time.perf_counter() - began)
    return samples


def pages(broker: Broker, deep_queue: str) -> dict[str, Callable[[], object]]:
    return {
        "overview": lambda: console.overview(broker),
        "queue page (deep queue)": lambda: console.queue_messages(broker, deep_queue,
                                                                  bodies=False),
        "conversations": lambda: console.conversations(broker),
    }


def measure(broker: Broker, repeat: int) -> dict[str, list[float]]:
    return {page: timed(call, repeat) for page, call in pages(broker, queue_name(0)).items()}


def check(broker: Broker, queues: int, messages: int) -> float:
    """The pages show what was sent (a benchmark of pages that show nothing measures nothing):
    exact depths up to console.DEPTH_EXACT_LIMIT, estimates above it. Returns the largest
    error of an estimate, relative to the depth sent."""
    shown = {q["name"]: q for q in console.overview(broker)}
    worst = 0.0
    for n, sent in enumerate(distribution(queues, messages)):
        queue = shown.get(queue_name(n))
        if queue is None:
            raise SystemExit(f"the overview does not show {queue_name(n)}")
        if sent <= console.DEPTH_EXACT_LIMIT:
            if (queue["depth"], queue["depth_is_estimate"]) != (sent, False):
                raise SystemExit(f"{queue_name(n)}: {sent} sent, the overview shows {queue}")
        elif not queue["depth_is_estimate"] or queue["depth"] <= console.DEPTH_EXACT_LIMIT:
            raise SystemExit(f"{queue_name(n)}: {sent} sent, the overview shows {queue}")
        else:
            worst = max(worst, abs(queue["depth"] - sent) / sent)
    return worst


@contextmanager
def database(dsn: str | None) -> Iterator[str]:
    if dsn is not None:
        yield dsn
        return
    with embedded_database("bench_ui") as embedded:
        yield embedded


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def table(results: dict[str, dict[str, list[float]]]) -> str:
    lines = ["| Page | " + " | ".join(f"{s}: median (p95)" for s in results)
             + " | " + " | ".join(f"{s} / empty" for s in list(results)[1:]) + " |",
             "|---|" + "---|" * (2 * len(results) - 1)]
    first = next(iter(results.values()))
    for page in first:
        cells = [f"{statistics.median(r[page]) * 1000:.1f} ms"
                 f" ({percentile(r[page], 0.95) * 1000:.1f})" for r in results.values()]
        base = statistics.median(first[page])
        ratios = [f"{statistics.median(r[page]) / base:.2f}x" for r in list(results.values())[1:]]
        lines.append(f"| {page} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines)


def refresh_load(results: dict[str, dict[str, list[float]]]) -> str:
    parts = [f"{state}: {statistics.median(r['overview']) / REFRESH_SECONDS:.1%}"
             for state, r in results.items()]
    return ("share of one database core an open overview keeps busy (median / "
            f"{REFRESH_SECONDS:g} s refresh): " + ", ".join(parts))


def run(dsn: str, queues: int, messages: int, repeat: int) -> dict[str, dict[str, list[float]]]:
    install(dsn)
    results: dict[str, dict[str, list[float]]] = {}
    with Broker(dsn) as broker:
        with broker.transaction() as tx:
            apply_spec(tx, spec(queues))
        check(broker, queues, 0)
        print(f"{queues} queues, measuring the empty broker", flush=True)
        results["empty"] = measure(broker, repeat)
        print(f"sending {messages:,} messages", flush=True)
        fill(broker, queues, messages)
        print(f"  estimated depths off by at most {check(broker, queues, messages):.0%}"
              " (statistics from before the SENDs, if any)", flush=True)
        results["filled"] = measure(broker, repeat)
        print("VACUUM (ANALYZE)", flush=True)
        vacuum(dsn)
        print(f"  estimated depths off by at most {check(broker, queues, messages):.0%}",
              flush=True)
        results["vacuumed"] = measure(broker, repeat)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.ui_console", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queues", type=int, default=200)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--dsn", help="an empty database to use (default: the embedded server)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args(argv)
    if args.queues < 2 or args.messages < args.queues or args.repeat < 1:
        raise SystemExit("--queues must be at least 2, --messages at least --queues, "
                         "--repeat at least 1")
    with database(args.dsn) as dsn:
        results = run(dsn, args.queues, args.messages, args.repeat)
    print(table(results))
    print(refresh_load(results))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"queues": args.queues, "messages": args.messages,
                                     "results": results}, indent=2) + "\n")
    print(f"written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
