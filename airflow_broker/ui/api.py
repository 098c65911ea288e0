"""The FastAPI app behind the broker's pages, mounted by Airflow's api-server at ``/broker``.

Every route needs Airflow's logged-in user and the auth manager's consent (access.py); every
write is a POST with a JSON body, refused when another site sent it, and goes to Airflow's
audit log. The broker is reached through the Airflow connection ``[broker] ui_conn_id``
(``broker_default`` unless configured).
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from pathlib import Path
from typing import Annotated, Any

from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.logging.decorators import action_logging
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, Field

from airflow_broker.broker import Broker
from airflow_broker.errors import BrokerError, InvalidArgument, NotFound, PermissionDenied
from airflow_broker.ui import access, console, dags, quarantine, transmission

DIST = Path(__file__).parent / "www" / "dist"
BUNDLE = "broker-ui.umd.cjs"

app = FastAPI(title="Service Broker", description="The broker's queues and quarantine",
              docs_url=None, redoc_url=None, openapi_url=None)

Reader = Annotated[BaseUser, Depends(access.requires("GET"))]


def conn_id() -> str:
    from airflow.configuration import conf

    from airflow_broker.hooks.broker import BrokerHook

    return str(conf.get("broker", "ui_conn_id", fallback=BrokerHook.default_conn_name))


def doctor_conn_id() -> str:
    """The Health page's connection: the pages' own unless ``[broker] ui_doctor_conn_id``
    names one whose login may run every check (docs/ui.md)."""
    from airflow.configuration import conf

    return str(conf.get("broker", "ui_doctor_conn_id", fallback=None) or conn_id())


_brokers: dict[str, Broker] = {}
_brokers_lock = threading.Lock()


def broker() -> Broker:
    """One engine (a small pool) per connection id for the life of the api-server."""
    return _broker(conn_id())


def _broker(name: str) -> Broker:
    with _brokers_lock:
        engine = _brokers.get(name)
        if engine is None:
            from airflow_broker.hooks.broker import BrokerHook

            engine = BrokerHook(name, max_connections=2).get_broker()
            _brokers[name] = engine
        return engine


def close_brokers() -> None:
    with _brokers_lock:
        for engine in _brokers.values():
            engine.close()
        _brokers.clear()
    _health.clear()


BrokerDep = Annotated[Broker, Depends(broker)]


@app.exception_handler(BrokerError)
async def broker_error(request: Request, error: BrokerError) -> JSONResponse:
    # The broker's refusals of the pages' login: 403 for a permission it lacks on an object it
    # may see (229), 404 for one it may not see or alter (208, 15151), 400 for a value it
    # refuses (an error code of END CONVERSATION WITH ERROR), 409 for a state that forbids it.
    code = (404 if isinstance(error, NotFound) else 403 if isinstance(error, PermissionDenied)
            else 400 if isinstance(error, InvalidArgument) else 409)
    return JSONResponse(console.error_body(error), status_code=code)


@app.exception_handler(console.NotLeaked)
async def not_leaked(request: Request, error: console.NotLeaked) -> JSONResponse:
    return JSONResponse({"detail": str(error), "error_number": None}, status_code=409)


@app.exception_handler(console.NotConfirmed)
async def not_confirmed(request: Request, error: console.NotConfirmed) -> JSONResponse:
    return JSONResponse({"detail": str(error), "error_number": None}, status_code=400)


# -- the front end ---------------------------------------------------------------------------

@app.get("/static/{name}", include_in_schema=False)
def static(name: str) -> FileResponse:
    """The built bundle; Airflow's UI imports it as a module, which needs a JavaScript type."""
    if name != BUNDLE or not (DIST / name).is_file():
        raise HTTPException(404, "not found")
    return FileResponse(DIST / name, media_type="application/javascript",
                        headers={"Cache-Control": "no-cache"})


# -- reads -----------------------------------------------------------------------------------

@app.get("/api/overview")
def get_overview(user: Reader, engine: BrokerDep) -> dict[str, Any]:
    return {"queues": console.overview(engine), "permissions": access.permissions(user),
            "user": user.get_name()}


@app.get("/api/queues/{queue_name}")
def get_queue(queue_name: str, user: Reader, engine: BrokerDep) -> dict[str, Any]:
    perms = access.permissions(user)
    return {**console.queue_messages(engine, queue_name, bodies=perms["view_bodies"]),
            # Whether the broker lets the pages' login ALTER it: no button it would refuse.
            "may_alter": console.queue_rights(engine, queue_name)["may_alter"],
            "permissions": perms}


@app.get("/api/queues/{queue_name}/quarantine")
def get_quarantine(queue_name: str, engine: BrokerDep,
                   user: Annotated[BaseUser, Depends(access.requires("GET", access.QUARANTINE))],
                   error: Annotated[str | None, Query(max_length=200)] = None,
                   body: Annotated[str | None, Query(max_length=200)] = None,
                   since: dt.datetime | None = None) -> dict[str, Any]:
    """The queue's quarantine, filtered by error text, body content (for users who may see
    bodies) and time, and grouped by error: a group's ids replay or discard the whole group."""
    perms = access.permissions(user)
    try:
        found = quarantine.quarantine(engine, queue_name, bodies=perms["view_bodies"],
                                      error_contains=error, body_contains=body, since=since)
    except quarantine.BodiesWithheld as refused:
        raise HTTPException(403, str(refused)) from refused
    rights = console.queue_rights(engine, queue_name)
    return {"queue_name": queue_name, "permissions": perms, **found, **rights}


# -- writes ----------------------------------------------------------------------------------

class QueueStatusBody(BaseModel):
    enabled: bool


class ReplayBody(BaseModel):
    quarantine_ids: list[int] = Field(min_length=1, max_length=quarantine.GROUP_IDS)


# Authorisation before the audit log: a refused request is not an action.
@app.post("/api/queues/{queue_name}/status",
          dependencies=[Depends(access.requires("POST", access.QUEUES)),
                        Depends(action_logging(event="broker_queue_status"))])
def post_queue_status(queue_name: str, body: QueueStatusBody,
                      engine: BrokerDep) -> dict[str, Any]:
    console.set_queue_status(engine, queue_name, body.enabled)
    return {"queue_name": queue_name, "enabled": body.enabled}


class ActivationBody(BaseModel):
    enabled: bool | None = None
    max_queue_readers: int | None = None


@app.post("/api/queues/{queue_name}/activation",
          dependencies=[Depends(access.requires("POST", access.QUEUES)),
                        Depends(action_logging(event="broker_queue_activation"))])
def post_queue_activation(queue_name: str, body: ActivationBody,
                          engine: BrokerDep) -> dict[str, Any]:
    console.set_activation(engine, queue_name, body.enabled, body.max_queue_readers)
    return {"queue_name": queue_name, "activation_enabled": body.enabled,
            "max_queue_readers": body.max_queue_readers}


@app.post("/api/queues/{queue_name}/replay-and-enable",
          dependencies=[Depends(access.requires("POST", access.QUARANTINE, access.QUEUES)),
                        Depends(action_logging(event="broker_replay_and_enable"))])
def post_replay_and_enable(queue_name: str, body: ReplayBody,
                           engine: BrokerDep) -> dict[str, Any]:
    replayed = quarantine.replay_and_enable(engine, queue_name, body.quarantine_ids)
    return {"queue_name": queue_name, "replayed": replayed, "enabled": True}



@app.post("/api/queues/{queue_name}/discard",
          dependencies=[Depends(access.requires("POST", access.QUARANTINE)),
                        Depends(action_logging(event="broker_discard"))])
def post_discard(queue_name: str, body: ReplayBody, engine: BrokerDep) -> dict[str, Any]:
    return {"queue_name": queue_name,
            "discarded": quarantine.discard(engine, queue_name, body.quarantine_ids)}


@app.post("/api/queues/{queue_name}/replay",
          dependencies=[Depends(access.requires("POST", access.QUARANTINE)),
                        Depends(action_logging(event="broker_replay"))])
def post_replay(queue_name: str, body: ReplayBody, engine: BrokerDep) -> dict[str, Any]:
    """Replays without enabling: what a login with RECEIVE and without ALTER on the queue may
    do (the queue's readers take the messages once someone enables it)."""
    replayed = quarantine.replay(engine, queue_name, body.quarantine_ids, enable=False)
    return {"queue_name": queue_name, "replayed": replayed, "enabled": None}


# -- health ----------------------------------------------------------------------------------

# The last report, kept for the api-server's life: a page view shows it, and only the button
# (a POST) runs the checks again, which read the whole catalog and reach far brokers.
_health: dict[str, Any] = {}
_health_lock = threading.Lock()


def _run_health() -> dict[str, Any]:
    name = doctor_conn_id()
    # Numbered, so the page can tell a new report from the last one made within a second.
    run = int(_health.get(name, {}).get("run", 0)) + 1
    report = {**console.health(_broker(name)), "run": run}
    _health[name] = report
    return report


@app.get("/api/health")
def get_health(user: Reader) -> dict[str, Any]:
    with _health_lock:
        report = _health.get(doctor_conn_id()) or _run_health()
    return {**report, "permissions": access.permissions(user)}


@app.post("/api/health",
          dependencies=[Depends(access.requires("POST")),
                        Depends(action_logging(event="broker_health_check"))])
def post_health(user: Reader) -> dict[str, Any]:
    """Runs the checks again; a second click while they run waits for that run's report."""
    with _health_lock:
        report = _run_health()
    return {**report, "permissions": access.permissions(user)}


# -- conversations ---------------------------------------------------------------------------

@app.get("/api/conversations")
def get_conversations(
        user: Reader, engine: BrokerDep,
        state: Annotated[str | None, Query(pattern="^(SO|SI|CO|DI|DO|ER|CD)$")] = None,
        leaked: bool = False) -> dict[str, Any]:
    return {**console.conversations(engine, state=state, leaked_only=leaked),
            "permissions": access.permissions(user)}


class CleanupBody(BaseModel):
    # The handle, typed by the user: a cleanup is never one click.
    confirm: str | None = Field(default=None, max_length=100)


@app.get("/api/conversations/{handle}")
def get_conversation(handle: uuid.UUID, engine: BrokerDep,
                     user: Annotated[BaseUser, Depends(access.requires(
                         "GET", access.CONVERSATIONS))]) -> dict[str, Any]:
    perms = access.permissions(user)
    return {**console.conversation(engine, handle, bodies=perms["view_bodies"]),
            "permissions": perms}


@app.post("/api/conversations/{handle}/cleanup",
          dependencies=[Depends(access.requires("POST", access.CONVERSATIONS)),
                        Depends(action_logging(event="broker_conversation_cleanup"))])
def post_cleanup(handle: uuid.UUID, body: CleanupBody, engine: BrokerDep) -> dict[str, Any]:
    console.cleanup_leak(engine, handle, body.confirm)
    return {"conversation_handle": str(handle), "cleaned_up": True}


class EndWithErrorBody(BaseModel):
    # Checked by the broker (its error numbers), not here: the page shows what END
    # CONVERSATION itself says of a bad code or description.
    error: int
    description: str = Field(max_length=4000)


@app.post("/api/conversations/{handle}/end-with-error",
          dependencies=[Depends(access.requires("POST", access.CONVERSATIONS)),
                        Depends(action_logging(event="broker_conversation_end_with_error"))])
def post_end_with_error(handle: uuid.UUID, body: EndWithErrorBody,
                        engine: BrokerDep) -> dict[str, Any]:
    console.end_with_error(engine, handle, body.error, body.description)
    return {"conversation_handle": str(handle), "ended_with_error": body.error}


# -- transmission ----------------------------------------------------------------------------

@app.get("/api/transmission")
def get_transmission(
        engine: BrokerDep,
        user: Annotated[BaseUser, Depends(access.requires("GET", access.TRANSMISSION))],
) -> dict[str, Any]:
    return {**transmission.transmissions(engine), "permissions": access.permissions(user)}


class RetryBody(BaseModel):
    # The route as sys.transmission_queue names it; in the body, since service names are
    # URIs ('//Far/Service', 'postgresql://...') that a path would mangle.
    to_service_name: str = Field(min_length=1, max_length=256)
    to_broker_instance: str | None = Field(default=None, max_length=128)


@app.post("/api/transmission/retry",
          dependencies=[Depends(access.requires("POST", access.TRANSMISSION)),
                        Depends(action_logging(event="broker_transmission_retry"))])
def post_transmission_retry(body: RetryBody, engine: BrokerDep) -> dict[str, Any]:
    retried = transmission.retry_transmissions(engine, body.to_service_name,
                                               body.to_broker_instance)
    return {"to_service_name": body.to_service_name,
            "to_broker_instance": body.to_broker_instance, "retried": retried}


# -- the tabs on a DAG's and a task instance's pages ------------------------------------------

DagReader = Annotated[BaseUser, Depends(access.requires_dag())]
TaskInstanceReader = Annotated[BaseUser,
                               Depends(access.requires_dag(DagAccessEntity.TASK_INSTANCE))]


@app.get("/api/dags/{dag_id}/queues")
def get_dag_queues(dag_id: str, user: DagReader, engine: BrokerDep) -> dict[str, Any]:
    """The queues the DAG's broker tasks name, each with its state as the overview shows it
    (None: no queue of that name that the pages' login may see); a name that is a template
    or is computed in the run is shown as written, with no state."""
    data = dags.serialized_dag(dag_id)
    if data is None:
        raise HTTPException(404, f"Airflow has no serialized DAG {dag_id}")
    uses = dags.queue_uses(data)
    states = console.queues_by_name(engine) if any(use.name for use in uses) else {}
    queues: dict[str, dict[str, Any]] = {}
    for use in uses:
        entry = queues.setdefault(use.name or use.raw, {
            "name": use.name, "raw": use.raw, "is_template": use.name is None,
            "state": states.get(use.name) if use.name else None, "tasks": []})
        entry["tasks"].append({"task_id": use.task_id, "task_type": use.task_type,
                               "field": use.field})
    return {"dag_id": dag_id, "queues": list(queues.values()),
            "permissions": access.permissions(user)}


def _handle(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


@app.get("/api/dags/{dag_id}/task-instance")
def get_task_instance(
        dag_id: str, user: TaskInstanceReader, engine: BrokerDep,
        run_id: Annotated[str, Query(min_length=1, max_length=250)],
        task_id: Annotated[str, Query(min_length=1, max_length=250)],
        map_index: Annotated[int, Query(ge=-1)] = -1) -> dict[str, Any]:
    """What the broker knows of one task instance: the broker fields Airflow rendered for
    it, what it received into the Airflow inbox, and the conversations of both."""
    from airflow_broker.hooks.broker import task_consumer

    record = dags.task_instance(dag_id, run_id, task_id, map_index)
    if record is None:
        raise HTTPException(404, f"no task instance {dag_id}/{run_id}/{task_id}/{map_index}")
    fields = dags.broker_fields(record.rendered_fields)
    handles = [h for field in dags.HANDLE_FIELDS if (h := _handle(fields.get(field)))]
    perms = access.permissions(user)
    known = console.task_instance(engine, task_consumer(dag_id, run_id, task_id, map_index),
                                  handles, bodies=perms["view_bodies"])
    return {
        "dag_id": dag_id, "run_id": run_id, "task_id": task_id, "map_index": map_index,
        "state": record.state, "operator": record.operator,
        "is_broker_task": dags.is_broker_task(dags.task_of(dags.serialized_dag(dag_id),
                                                           task_id)),
        "rendered": record.rendered_fields is not None, "fields": fields,
        **known, "permissions": perms,
    }
