"""Op names, as the parent sends them to the workers (names pickle; classes need not)."""

from __future__ import annotations

from bench import ours_ops, pgmq_ops
from bench.ops import (
    BareInsert,
    DialogFloorAnswer,
    DialogFloorAnswerApart,
    DialogFloorAnswerChecked,
    DialogFloorAnswerRecorded,
    DialogFloorBegin,
    DialogFloorBeginApart,
    DialogFloorBeginChecked,
    DialogFloorClose,
    DialogFloorCloseChecked,
    DialogFloorCloseRecorded,
    OpFactory,
    ReceiveFloor,
    ReceiveFloorChecked,
    ReceiveFloorWait,
    SendFloor,
    SendFloorBatch,
    SendFloorChecked,
    StepperFactory,
)

LOAD_OPS: dict[str, OpFactory] = {
    "ours.send": ours_ops.SendOne,
    "ours.send_batch": ours_ops.SendBatch,
    "ours.send_random": ours_ops.SendRandom,
    "ours.receive": ours_ops.Receive,
    "ours.receive_autocommit": ours_ops.ReceiveAutocommit,
    "ours.receive_wait": ours_ops.WaitReceive,
    "ours.dialog_begin": ours_ops.DialogBegin,
    "ours.dialog_answer": ours_ops.DialogAnswer,
    "ours.dialog_close": ours_ops.DialogClose,
    "pgmq.send": pgmq_ops.Send,
    "pgmq.send_batch": pgmq_ops.SendBatch,
    "pgmq.read_delete": pgmq_ops.ReadDelete,
    "pgmq.pop": pgmq_ops.Pop,
    "pgmq.request_send": pgmq_ops.Send,
    "pgmq.request_answer": pgmq_ops.RequestAnswer,
    "pgmq.reply_take": pgmq_ops.ReplyTake,
    "bare.insert": BareInsert,
    "bare.send_floor": SendFloor,
    "bare.send_floor_checked": SendFloorChecked,
    "bare.receive_floor": ReceiveFloor,
    "bare.receive_floor_checked": ReceiveFloorChecked,
    "bare.send_floor_batch": SendFloorBatch,
    "bare.receive_floor_wait": ReceiveFloorWait,
    "bare.dialog_begin": DialogFloorBegin,
    "bare.dialog_answer": DialogFloorAnswer,
    "bare.dialog_close": DialogFloorClose,
    "bare.dialog_answer_recorded": DialogFloorAnswerRecorded,
    "bare.dialog_close_recorded": DialogFloorCloseRecorded,
    "bare.dialog_begin_checked": DialogFloorBeginChecked,
    "bare.dialog_answer_checked": DialogFloorAnswerChecked,
    "bare.dialog_answer_apart": DialogFloorAnswerApart,
    "bare.dialog_begin_apart": DialogFloorBeginApart,
    "bare.dialog_close_checked": DialogFloorCloseChecked,
}

STEPPERS: dict[str, StepperFactory] = {
    "ours.wait_receiver": ours_ops.WaitReceiver,
    "ours.commit_sender": ours_ops.CommitSender,
    "pgmq.poll_receiver": pgmq_ops.PollReceiver,
    "pgmq.commit_sender": pgmq_ops.CommitSender,
}
