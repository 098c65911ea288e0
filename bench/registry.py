"""Op names, as the parent sends them to the workers (names pickle; classes need not)."""

from __future__ import annotations

from bench import ours_ops, pgmq_ops
from bench.ops import BareInsert, OpFactory, StepperFactory

LOAD_OPS: dict[str, OpFactory] = {
    "ours.send": ours_ops.SendOne,
    "ours.send_batch": ours_ops.SendBatch,
    "ours.send_random": ours_ops.SendRandom,
    "ours.receive": ours_ops.Receive,
    "pgmq.send": pgmq_ops.Send,
    "pgmq.send_batch": pgmq_ops.SendBatch,
    "pgmq.read_delete": pgmq_ops.ReadDelete,
    "pgmq.pop": pgmq_ops.Pop,
    "bare.insert": BareInsert,
}

STEPPERS: dict[str, StepperFactory] = {
    "ours.wait_receiver": ours_ops.WaitReceiver,
    "ours.commit_sender": ours_ops.CommitSender,
    "pgmq.poll_receiver": pgmq_ops.PollReceiver,
    "pgmq.commit_sender": pgmq_ops.CommitSender,
}
