"""Test DAG: every operator on the test application (tests/fixtures/postgres.py App: contract C with
Req sent by the initiator I on q_i and Resp by the target T on q_t)."""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import chain, dag
from lxml import etree

from airflow_broker import Message, Transaction
from airflow_broker.operators import (
    BeginConversationTimerOperator,
    BeginDialogOperator,
    BrokerSetupOperator,
    EndConversationOperator,
    ReceiveMessagesOperator,
    SendMessageOperator,
)

SPEC = """
message_types:
  - {name: Req}
  - {name: Resp}
  - {name: XmlReq, validation: WELL_FORMED_XML}
contracts:
  C: {message_types: {Req: INITIATOR, Resp: TARGET}}
  CX: {message_types: {XmlReq: INITIATOR, Resp: TARGET}}
queues:
  - {name: q_i}
  - {name: q_t, poison_threshold: 3}
services:
  - {name: I, queue_name: q_i}
  - {name: T, queue_name: q_t, contracts: [C, CX, DEFAULT]}
"""


def reply_and_end(messages: list[Message], tx: Transaction, context: Any) -> None:
    """The target's activated procedure: answers every request and ends the conversation
    (an initiator that has already ended gets no answer)."""
    ended = {m.conversation_handle for m in messages if m.is_end_dialog or m.is_error}
    for message in messages:
        if message.message_type_name != "Resp" and message.conversation_handle not in ended \
                and not message.is_end_dialog:
            tx.send(message.conversation_handle, "Resp", f"re: {message.text()}")
    for handle in dict.fromkeys(m.conversation_handle for m in messages):
        tx.end_conversation(handle)


@dag(dag_id="t_operators", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
     catchup=False, params={"note": "templated"})
def t_operators() -> None:
    setup = BrokerSetupOperator(task_id="setup", spec=SPEC)
    setup_again = BrokerSetupOperator(task_id="setup_again", spec=SPEC)
    begin = BeginDialogOperator(task_id="begin", from_service_name="I", to_service_name="T",
                                contract_name="C", lifetime=600)
    send_text = SendMessageOperator(task_id="send_text", conversation_handle=begin.output,
                                    message_type_name="Req", body="{{ params.note }} text")
    send_bytes = SendMessageOperator(task_id="send_bytes", conversation_handle=begin.output,
                                     message_type_name="Req", body=b"\x00\x01raw")
    send_json = SendMessageOperator(task_id="send_json", conversation_handle=begin.output,
                                    message_type_name="Req", body={"order": 7, "ok": True})
    timer = BeginConversationTimerOperator(task_id="timer", conversation_handle=begin.output,
                                           timeout=300)
    send_xml = SendMessageOperator(
        task_id="send_xml", from_service_name="I", to_service_name="T", contract_name="CX",
        message_type_name="XmlReq", body=etree.fromstring("<order id='8'/>"))
    fire_and_forget = SendMessageOperator(
        task_id="fire_and_forget", from_service_name="I", to_service_name="T",
        contract_name="C", message_type_name="Req", body="forget me", end_conversation=True)
    target = ReceiveMessagesOperator(task_id="target", queue_name="q_t",
                                     callback=reply_and_end, until_empty=True)
    with_error = BeginDialogOperator(task_id="with_error", from_service_name="I",
                                     to_service_name="T", contract_name="C")
    end_with_error = EndConversationOperator(task_id="end_with_error",
                                             conversation_handle=with_error.output,
                                             error=42, description="gave up")
    orphan = BeginDialogOperator(task_id="orphan", from_service_name="I", to_service_name="T",
                                 contract_name="C")
    cleanup = EndConversationOperator(task_id="cleanup", conversation_handle=orphan.output,
                                      cleanup=True)
    chain(setup, setup_again, begin, send_text, send_bytes, send_json, timer, send_xml,
          fire_and_forget, target, with_error, end_with_error, orphan, cleanup)


t_operators()
