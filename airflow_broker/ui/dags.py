"""What the broker's tabs on a DAG's and a task instance's pages read from Airflow's metadata
database: the broker tasks of a DAG as the api-server has it (the latest serialized version,
what Airflow's own DAG pages show) and what Airflow rendered for one task instance.

Nothing here imports a DAG file: the api-server never parses DAGs, and a queue name that is a
template stays a template (it has a value only in a run, on the task instance's tab).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# The operators and sensors of this provider; ActivatedReaderOperator is one of them.
BROKER_MODULE = "airflow_broker."
# The fields that name queues, on every broker task that has them.
QUEUE_FIELDS = ("queue_name", "queue_names", "notification_queue_name")
# What a task instance's tab shows of its rendered fields: the broker objects it named. A
# message body (SendMessageOperator.body) is left out: bodies are for users the auth manager
# allows them (Broker Message Bodies), and Airflow's Rendered Templates tab has it anyway.
BROKER_FIELDS = (
    "queue_name", "queue_names", "notification_queue_name", "notification_service_name",
    "conversation_handle", "conversation_group_id", "related_conversation_handle",
    "related_conversation_group_id", "from_service_name", "to_service_name", "contract_name",
    "message_type_name", "message_type_names", "broker_conn_id",
)
HANDLE_FIELDS = ("conversation_handle", "related_conversation_handle")


@dataclass(frozen=True)
class QueueUse:
    """One queue a task names: ``name`` when the DAG gives a plain name, else ``raw`` (a
    template, or a value computed in the run such as another task's XCom)."""

    task_id: str
    task_type: str
    field: str
    name: str | None
    raw: str


def _unwrap(value: Any) -> Any:
    # Airflow serializes tuples, sets and the like as {"__type": ..., "__var": [...]}.
    if isinstance(value, dict) and "__var" in value and isinstance(value["__var"], list):
        return value["__var"]
    return value


def is_template(value: str) -> bool:
    return "{{" in value or "{%" in value


def _uses(task_id: str, task_type: str, field: str, value: Any) -> list[QueueUse]:
    value = _unwrap(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [use for v in value for use in _uses(task_id, task_type, field, v)]
    if isinstance(value, str):
        return [QueueUse(task_id, task_type, field, None if is_template(value) else value,
                         value)]
    return [QueueUse(task_id, task_type, field, None, json.dumps(value, default=str))]


def _tasks(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [task.get("__var", task) for task in data.get("dag", {}).get("tasks", [])]


def serialized_dag(dag_id: str) -> dict[str, Any] | None:
    """The latest serialized version of the DAG, as JSON; None when Airflow has none."""
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = SerializedDagModel.get(dag_id, session=session)
        if row is None:
            return None
        data = row.data
    return data if isinstance(data, dict) else None


def queue_uses(data: dict[str, Any]) -> list[QueueUse]:
    """The queues the broker tasks of a serialized DAG name, in task order."""
    uses: list[QueueUse] = []
    for task in _tasks(data):
        if not str(task.get("_task_module", "")).startswith(BROKER_MODULE):
            continue
        # A mapped task keeps its fixed arguments apart; an expanded one has no value yet.
        fixed = {**task.get("partial_kwargs", {}), **task}
        expanded = task.get("expand_input", {}).get("value", {})
        if isinstance(expanded, dict) and isinstance(expanded.get("__var"), dict):
            expanded = expanded["__var"]
        for field in QUEUE_FIELDS:
            if fixed.get(field) is not None:
                uses += _uses(task["task_id"], task.get("task_type", ""), field, fixed[field])
            elif isinstance(expanded, dict) and field in expanded:
                uses.append(QueueUse(task["task_id"], task.get("task_type", ""), field, None,
                                     "(expanded per mapped task instance)"))
    return uses


def task_of(data: dict[str, Any] | None, task_id: str) -> dict[str, Any] | None:
    for task in _tasks(data or {}):
        if task.get("task_id") == task_id:
            return task
    return None


def is_broker_task(task: dict[str, Any] | None) -> bool:
    return task is not None and str(task.get("_task_module", "")).startswith(BROKER_MODULE)


@dataclass(frozen=True)
class TaskInstanceRecord:
    state: str | None
    operator: str | None
    # None: Airflow has rendered nothing for it yet (it has not run).
    rendered_fields: dict[str, Any] | None


def task_instance(dag_id: str, run_id: str, task_id: str,
                  map_index: int) -> TaskInstanceRecord | None:
    """The task instance's state and rendered fields; None when there is no such task
    instance."""
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskinstancekey import TaskInstanceKey
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        found = session.execute(
            select(TaskInstance.state, TaskInstance.operator).where(
                TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id,
                TaskInstance.task_id == task_id, TaskInstance.map_index == map_index)).first()
        if found is None:
            return None
        rendered = RenderedTaskInstanceFields.get_templated_fields(
            TaskInstanceKey(dag_id, task_id, run_id, map_index=map_index), session=session)
    state, operator = found
    return TaskInstanceRecord(None if state is None else str(state), operator,
                              rendered if isinstance(rendered, dict) else None)


def broker_fields(rendered: dict[str, Any] | None) -> dict[str, Any]:
    """The rendered fields that name broker objects, as Airflow stored them (redacted where
    Airflow redacts)."""
    return {field: rendered[field] for field in BROKER_FIELDS
            if rendered and rendered.get(field) not in (None, "", [])}
