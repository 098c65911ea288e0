"""The queues of a serialized DAG's broker tasks, as the Broker tab of a DAG lists them
(airflow_broker/ui/dags.py), on serialized DAGs written as Airflow writes them."""

from __future__ import annotations

from typing import Any

from airflow_broker.ui.dags import QueueUse, broker_fields, queue_uses


def serialized(*tasks: dict[str, Any]) -> dict[str, Any]:
    return {"dag": {"tasks": [{"__type": "operator", "__var": task} for task in tasks]}}


def task(task_id: str, module: str, task_type: str, **fields: Any) -> dict[str, Any]:
    return {"task_id": task_id, "_task_module": module, "task_type": task_type, **fields}


def test_plain_names_templates_lists_and_values_of_the_run() -> None:
    data = serialized(
        task("wait", "airflow_broker.sensors.broker", "WaitForReceiveSensor",
             queue_name="q_t"),
        task("read", "airflow_broker.operators.broker", "ReceiveMessagesOperator",
             queue_name="{{ params.queue }}"),
        task("alerts", "airflow_broker.sensors.queue_disabled", "QueueDisabledSensor",
             queue_names={"__type": "tuple", "__var": ["q_a", "q_b"]},
             notification_queue_name="AirflowBrokerAlertQueue"),
        task("from_xcom", "airflow_broker.operators.broker", "EnableQueueOperator",
             queue_name={"__type": "xcomref", "__var": {"task_id": "pick"}}),
        # Not the broker's: a queue_name of another provider is another kind of queue.
        task("other", "airflow.providers.amazon.aws.operators.sqs", "SqsPublishOperator",
             queue_name="sqs"),
    )
    uses = queue_uses(data)
    assert [(u.task_id, u.field, u.name) for u in uses] == [
        ("wait", "queue_name", "q_t"),
        ("read", "queue_name", None),
        ("alerts", "queue_names", "q_a"),
        ("alerts", "queue_names", "q_b"),
        ("alerts", "notification_queue_name", "AirflowBrokerAlertQueue"),
        ("from_xcom", "queue_name", None),
    ]
    assert uses[1] == QueueUse("read", "ReceiveMessagesOperator", "queue_name", None,
                               "{{ params.queue }}")
    assert "xcomref" in uses[5].raw


def test_a_mapped_tasks_fixed_and_expanded_queue_names() -> None:
    data = serialized(
        task("fixed", "airflow_broker.operators.broker", "ReceiveMessagesOperator",
             _is_mapped=True, partial_kwargs={"queue_name": "q_t"}),
        task("expanded", "airflow_broker.operators.broker", "EnableQueueOperator",
             _is_mapped=True, partial_kwargs={},
             expand_input={"type": "dict-of-lists",
                           "value": {"__var": {"queue_name": ["a", "b"]}, "__type": "dict"}}),
    )
    assert [(u.task_id, u.name, u.raw) for u in queue_uses(data)] == [
        ("fixed", "q_t", "q_t"),
        ("expanded", None, "(expanded per mapped task instance)"),
    ]


def test_rendered_broker_fields_leave_out_bodies_and_empty_values() -> None:
    rendered: dict[str, Any] = {"conversation_handle": "h", "message_type_name": "Req",
                                "body": "secret", "to_service_name": None,
                                "message_type_names": []}
    assert broker_fields(rendered) == {"conversation_handle": "h", "message_type_name": "Req"}
    assert broker_fields(None) == {}
