"""Scenario h: complete dialogs per second, with a producer and two readers running at once in
three processes.

Ours, each step one transaction, measured as is and in pipelined transactions
(``Broker.transaction(pipeline=True)``): the initiator BEGINs a dialog and SENDs the request; a
target reader RECEIVEs it (WAITFOR), SENDs the reply and ENDs the conversation (the target ends
first); an initiator-side reader RECEIVEs the reply and the EndDialog (WAITFOR) and ENDs its
side. A dialog counts when that last END has committed.

pgmq has no dialogs. Its side is the same request/reply over two queues, each step one
transaction: pgmq.send of the request; read_with_poll + delete of the request and pgmq.send of
the reply; read_with_poll + delete of the reply. It does the same messaging without the
dialog's state (no endpoints, no conversation groups, no EndDialog, no ordering per
conversation), so the ratio prices the dialog, not a like-for-like alternative.

The floor (bench/floors.sql) runs the same three steps on our tables with the least any design
that keeps the dialog's state writes, without any of the broker's checks: both endpoints and
their groups created with message 0; the request taken, the reply and the EndDialog delivered
and both endpoints' states changed; the reply and EndDialog taken and the initiator's endpoint
removed. Its readers poll every millisecond. What it reaches against pgmq is the most a dialog
could reach on the machine.

Three more floors add, one after the other, what the broker's guarantees cost at least:
- with poison detection's record: each receiving transaction also posts its record on a side
  connection, as the broker's RECEIVE does (floors.sql's receive_record);
- complete and checked: everything ours keeps for the common case, each a join or a
  condition of the same statement (floors.sql's blocks ending in _checked): what Service
  Broker checks before it acts (the services, the contract, the message type's direction,
  the states, the queues enabled, the caller's permission), validation's type check, the
  largest message size, the names, validation and attempts RECEIVE returns, the counter the
  queue monitor reads, the record's check of the reader, and WAITFOR: the writers NOTIFY a
  queue's waiters, and the readers wait for it, registered among the waiters, instead of
  polling;
- with each statement apart: the same, with BEGIN DIALOG and the SEND of message 0, and the
  target's SEND of the reply and its END CONVERSATION, each a statement of its own, as
  Service Broker's statements are issued one after the other in a transaction that is not
  pipelined.
None of them keeps replay protection's timestamps or the ordering lock of the broker's record.

Before each of our measurements the dialogs of the previous one are removed, and the tables
are vacuumed and analyzed holding a standing population, as a broker in use holds one (a target
endpoint stays 30 minutes after its END): 10,000 other dialogs with a message each, waiting on
a queue nobody reads. Statistics taken on empty tables would have PostgreSQL plan and cache
sequential scans for the broker's statements as the measurement starts, and keep them while the
tables grow (measured: about a third fewer dialogs per second).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from bench import ours_setup, pgmq_peer
from bench.cpu import machine_cpu
from bench.ops import OpParams
from bench.ours_ops import MESSAGE_TYPE
from bench.report import Row, Scenario, Target, median
from bench.rounds import Contender, alternate, time_budget
from bench.scenario import Env, register
from bench.workers import Measurement

PRODUCER, ANSWERER, CLOSER = 0, 1, 2
OURS_OPS = ("ours.dialog_begin", "ours.dialog_answer", "ours.dialog_close")
PGMQ_OPS = ("pgmq.request_send", "pgmq.request_answer", "pgmq.reply_take")
FLOOR_OPS = ("bare.dialog_begin", "bare.dialog_answer", "bare.dialog_close")
RECORDED_FLOOR_OPS = ("bare.dialog_begin", "bare.dialog_answer_recorded",
                      "bare.dialog_close_recorded")
CHECKED_FLOOR_OPS = ("bare.dialog_begin_checked", "bare.dialog_answer_checked",
                     "bare.dialog_close_checked")
APART_FLOOR_OPS = ("bare.dialog_begin_apart", "bare.dialog_answer_apart",
                   "bare.dialog_close_checked")
REQUEST_QUEUE, REPLY_QUEUE = "bench_request", "bench_reply"
PEER_LABEL = "pgmq request/reply over 2 queues (no dialog)"
STANDING_DIALOGS = 10_000
STANDING_DIALOGS_QUICK = 1_000
TABLES = ("broker.queue_messages", "broker.endpoints", "broker.dialog_groups")


def _completed(measured: Measurement) -> float:
    """Dialogs (or request/reply pairs) finished by the last step, per second of the
    measurement."""
    if measured.elapsed <= 0:
        return 0.0
    return measured.results[CLOSER].messages / measured.elapsed


@register("h")
def full_dialog(env: Env) -> Scenario:
    target = env.catalog.targets["dialog"]
    initiator = env.catalog.dialog_initiator
    standing = env.catalog.targets["standing"]
    dialogs = STANDING_DIALOGS_QUICK if env.options.quick else STANDING_DIALOGS
    env.progress(f"h standing population: {dialogs:,} dialogs with a message waiting")
    with env.transaction() as conn:
        ours_setup.forget_dialogs(conn, standing)
        ours_setup.add_dialogs(conn, env.catalog, standing, dialogs, 1)
    try:
        return _measure(env, target, initiator, dialogs)
    finally:
        # The scenarios after this one find the tables as they were.
        with env.transaction() as conn:
            ours_setup.forget_dialogs(conn, standing, initiator, target)


def _measure(env: Env, target: ours_setup.Target, initiator: ours_setup.Target,
             standing: int) -> Scenario:
    budget = time_budget(env.options.seconds)
    # Per side, per round: what each of the three processes did per second.
    stages: dict[str, list[tuple[float, float, float]]] = {
        "ours": [], "piped": [], "floor": [], "recorded": [], "checked": [],
        "apart": [], "pgmq": []}
    # Per side, per round: this machine's CPU and the three clients' per completed dialog, µs.
    cpu: dict[str, list[tuple[float, float]]] = {side: [] for side in stages}
    cpu_at_start: float | None = None

    def cpu_start() -> None:
        nonlocal cpu_at_start
        cpu_at_start = machine_cpu()

    def ours_ready() -> int:
        with env.transaction() as conn:
            ours_setup.forget_dialogs(conn, initiator, target)
        env.settle(TABLES)
        return budget

    def pgmq_ready() -> int:
        for queue in (REQUEST_QUEUE, REPLY_QUEUE):
            pgmq_peer.purge(env.admin, queue)
        env.settle([f"pgmq.q_{REQUEST_QUEUE}", f"pgmq.q_{REPLY_QUEUE}"])
        return budget

    def note_stages(side: str) -> Callable[[Measurement], None]:
        def after(measured: Measurement) -> None:
            start, end = cpu_at_start, machine_cpu()
            completed = measured.results[CLOSER].messages
            if start is not None and end is not None and completed:
                clients = sum(r.cpu for r in measured.results)
                cpu[side].append(((end - start) / completed * 1e6,
                                  clients / completed * 1e6))
            elapsed = measured.elapsed or 1.0
            rates = tuple(r.messages / elapsed for r in measured.results)
            stages[side].append((rates[0], rates[1], rates[2]))
            env.progress(
                f"h {side}: {rates[PRODUCER]:,.0f} begun, {rates[ANSWERER]:,.0f} answered, "
                f"{rates[CLOSER]:,.0f} completed per second"
            )

        return after

    def on_our_tables(key: str, label: str, ops: tuple[str, str, str],
                      pipeline: bool = False) -> Contender:
        """Ours or one of the floors: the same dialogs, on our tables."""
        return Contender(
            key, label, ops, 3,
            OpParams(target.queue, reply_queue=initiator.queue,
                     dialog=(initiator.service, target.service, ours_setup.CONTRACT),
                     pipeline=pipeline, message_type=MESSAGE_TYPE),
            ours_ready, note_stages(key), _completed, "dialogs/s", before_go=cpu_start)

    rates = alternate(env, "h", [
        on_our_tables("ours", "ours full dialog, 1 producer + 2 readers", OURS_OPS),
        on_our_tables("piped", "ours full dialog, pipelined, 1 producer + 2 readers", OURS_OPS,
                      pipeline=True),
        on_our_tables("floor", "the floor of a dialog, 1 producer + 2 readers", FLOOR_OPS),
        on_our_tables("recorded", "the floor of a dialog with poison detection's record, "
                      "1 producer + 2 readers", RECORDED_FLOOR_OPS),
        on_our_tables("checked", "the complete checked floor of a dialog, "
                      "1 producer + 2 readers", CHECKED_FLOOR_OPS),
        on_our_tables("apart", "the complete checked floor with each Service Broker "
                      "statement apart, 1 producer + 2 readers", APART_FLOOR_OPS),
        Contender("pgmq", "pgmq request/reply, 1 producer + 2 readers", PGMQ_OPS, 3,
                  OpParams(REQUEST_QUEUE, reply_queue=REPLY_QUEUE),
                  pgmq_ready, note_stages("pgmq"), _completed, "dialogs/s",
                  before_go=cpu_start),
    ])

    def stage_medians(side: str) -> str:
        if not stages[side]:
            return "-"
        begun, answered, completed = (statistics.median(s[i] for s in stages[side])
                                      for i in range(3))
        return f"{begun:,.0f} begun, {answered:,.0f} answered, {completed:,.0f} completed"

    def cpu_medians(side: str) -> str:
        if not cpu[side]:
            return "-"
        machine, clients = (statistics.median(c[i] for c in cpu[side]) for i in range(2))
        return f"{machine:,.0f} µs ({clients:,.0f} µs in the three clients)"

    note = (
        "This machine's CPU per completed dialog, medians over rounds: ours "
        + cpu_medians("ours") + "; pipelined " + cpu_medians("piped") + "; the floor "
        + cpu_medians("floor") + "; the floor with poison detection's record "
        + cpu_medians("recorded") + "; the complete checked floor "
        + cpu_medians("checked") + "; the same with each statement apart "
        + cpu_medians("apart") + "; pgmq " + cpu_medians("pgmq") + ". "
        "Per second, medians over rounds: ours " + stage_medians("ours") + "; pipelined "
        + stage_medians("piped") + "; the floor " + stage_medians("floor")
        + "; the floor with poison detection's record " + stage_medians("recorded")
        + "; the complete checked floor " + stage_medians("checked")
        + "; the same with each statement apart " + stage_medians("apart") + "; pgmq "
        + stage_medians("pgmq") + ". Pipelined: each "
        "step in Broker.transaction(pipeline=True), so the SENDs and ENDs after a statement "
        "with an answer travel with the COMMIT. The peer is not a dialog: pgmq has none, so its "
        "side is the same request/reply over two queues (send; read+delete, send reply; "
        "read+delete), without endpoints, conversation groups, EndDialog or END CONVERSATION. "
        "The floor is the least any design that keeps the dialog's state writes for the same "
        "three steps, without the broker's checks (bench/floors.sql): the most a dialog could "
        "reach against pgmq on this machine. The floors after it add poison detection's "
        "record, then everything ours keeps for the common case (Service Broker's checks, "
        "validation's type check, WAITFOR's wake-up and waiting, the record's check) in the "
        "same statements, then each of Service Broker's statements as a statement of its own "
        "(bench/dialogs.py). "
        f"Our tables held {standing:,} other dialogs with a message each (a broker in use) "
        "when analyzed."
    )
    goal = Target("ratio_at_least", 1.0, ">= 1.0x request/reply")
    # Against the complete checked floor with Service Broker's statements apart, as ours
    # issues them: what a design keeping everything ours keeps reaches in the same run.
    floor_goal = Target("ratio_at_least", 0.85, ">= 0.85x complete checked floor")
    cpu_goal = Target("ratio_at_most", 1.2, "<= 1.2x complete checked floor")
    apart = "the complete checked floor, statements apart"
    return Scenario(
        "h", "Full dialog: BEGIN + SEND; RECEIVE + SEND + END; RECEIVE + END", note=note,
        rows=[Row(
            f"complete dialogs{how}, 1 producer + 2 readers", "dialogs/s", PEER_LABEL,
            median(rates["pgmq"]), median(rates[key]), target=goal,
            peer_rounds=rates["pgmq"], ours_rounds=rates[key],
        ) for key, how in (("ours", ""), ("piped", ", pipelined"))] + [Row(
            f"the floor of a dialog{how} (floors.sql), 1 producer + 2 readers", "dialogs/s",
            PEER_LABEL, median(rates["pgmq"]), median(rates[key]), target=goal,
            peer_rounds=rates["pgmq"], ours_rounds=rates[key],
        ) for key, how in (("floor", ""), ("recorded", " with poison detection's record"),
                           ("checked", ", complete and checked"),
                           ("apart", ", complete and checked, statements apart"))]
        + [Row(
            f"complete dialogs{how}, 1 producer + 2 readers", "dialogs/s", apart,
            median(rates["apart"]), median(rates[key]), target=floor_goal,
            peer_rounds=rates["apart"], ours_rounds=rates[key],
        ) for key, how in (("ours", ""), ("piped", ", pipelined"))]
        + [Row(
            f"this machine's CPU per complete dialog{how}", "µs", apart,
            median([c[0] for c in cpu["apart"]]), median([c[0] for c in cpu[key]]),
            higher_is_better=False, target=cpu_goal,
            peer_rounds=[c[0] for c in cpu["apart"]], ours_rounds=[c[0] for c in cpu[key]],
        ) for key, how in (("ours", ""), ("piped", ", pipelined"))]
        + [Row(
            f"this machine's CPU per complete dialog{how}", "µs", PEER_LABEL,
            median([c[0] for c in cpu["pgmq"]]), median([c[0] for c in cpu[key]]),
            higher_is_better=False,
            peer_rounds=[c[0] for c in cpu["pgmq"]], ours_rounds=[c[0] for c in cpu[key]],
        ) for key, how in (("ours", ""), ("piped", ", pipelined"), ("floor", ", the floor"),
                           ("recorded", ", the floor with poison detection's record"),
                           ("checked", ", the complete checked floor"),
                           ("apart", ", the same with the statements apart"))],
    )
