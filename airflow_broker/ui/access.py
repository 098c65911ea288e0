"""Who may use the broker's pages: Airflow's logged-in user, authorised by Airflow's auth
manager on the broker's custom resources.

A mounted plugin app inherits no authentication from Airflow, so every route depends on
:func:`requires`. Airflow's UI sends its session as an HttpOnly, SameSite=Lax cookie and the
FastAPI side has no CSRF token; writes are therefore POSTs with a JSON body, and a write
whose ``Sec-Fetch-Site`` says another site sent it is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any, Literal

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.base_auth_manager import BaseAuthManager
from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, HTTPException, Request, status

BROKER = "Broker"
BODIES = "Broker Message Bodies"
QUEUES = "Broker Queues"
QUARANTINE = "Broker Quarantine"
CONVERSATIONS = "Broker Conversations"
TRANSMISSION = "Broker Transmission"

Method = Literal["GET", "POST"]
# Every method and resource the pages ask the auth manager about: what an auth manager that
# keeps a list of resources (FAB's) must know of (fab.py).
ASKED: tuple[tuple[Method, str], ...] = (
    ("GET", BROKER), ("GET", BODIES), ("GET", QUARANTINE), ("GET", CONVERSATIONS),
    ("GET", TRANSMISSION), ("POST", QUEUES), ("POST", QUARANTINE), ("POST", CONVERSATIONS),
    ("POST", TRANSMISSION),
)
# SimpleAuthManager's roles, lowest first; a write needs OP or above under it.
SIMPLE_ROLES = ("VIEWER", "USER", "OP", "ADMIN")
SIMPLE_WRITE_ROLE = "OP"


def _simple_role_allows(auth_manager: BaseAuthManager[Any], user: BaseUser,
                        method: Method) -> bool:
    """SimpleAuthManager (3.3) lets every logged-in user through is_authorized_custom_view,
    whatever the method and resource: a write needs the OP role there as well."""
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import (
        SimpleAuthManager,
    )

    if method == "GET" or not isinstance(auth_manager, SimpleAuthManager):
        return True
    role = str(getattr(user, "role", None) or "").upper()
    return role in SIMPLE_ROLES and (
        SIMPLE_ROLES.index(role) >= SIMPLE_ROLES.index(SIMPLE_WRITE_ROLE))


def allowed(user: BaseUser, method: Method, resource: str) -> bool:
    auth_manager = get_auth_manager()
    return bool(auth_manager.is_authorized_custom_view(
        method=method, resource_name=resource, user=user)) and _simple_role_allows(
        auth_manager, user, method)


def permissions(user: BaseUser) -> dict[str, bool]:
    """What the front end may offer this user; it renders no button the user may not use."""
    return {
        "view_bodies": allowed(user, "GET", BODIES),
        "enable_disable_queue": allowed(user, "POST", QUEUES),
        "replay_quarantine": allowed(user, "POST", QUARANTINE) and allowed(user, "POST", QUEUES),
        "replay_only": allowed(user, "POST", QUARANTINE),
        "discard_quarantine": allowed(user, "POST", QUARANTINE),
        "cleanup_conversation": allowed(user, "POST", CONVERSATIONS),
        "end_conversation": allowed(user, "POST", CONVERSATIONS),
        "retry_transmission": allowed(user, "POST", TRANSMISSION),
    }


def same_origin_write(request: Request) -> None:
    """Refuses a write a browser reports as sent by another site (absent: not a browser, or an
    old one; SameSite=Lax keeps the cookie off cross-site POSTs there)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site != "same-origin":
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            f"cross-origin write refused (Sec-Fetch-Site: {site})")
    if "application/json" not in request.headers.get("content-type", ""):
        raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
                            "writes take a JSON body (Content-Type: application/json)")


def requires(method: Method, *resources: str) -> Callable[..., Coroutine[Any, Any, BaseUser]]:
    """A dependency: the logged-in user (401 without one), authorised for ``method`` on the
    Broker resource and each of ``resources`` (403 otherwise)."""

    async def dependency(request: Request, user: GetUserDep) -> BaseUser:
        if method != "GET":
            same_origin_write(request)
        for resource in (BROKER, *resources):
            # GET on Broker is the entry to the pages; writes are judged on their own resource.
            needed: Method = "GET" if resource == BROKER else method
            if not allowed(user, needed, resource):
                raise HTTPException(status.HTTP_403_FORBIDDEN,
                                    f"{user.get_name()} may not {needed} {resource}")
        return user

    return dependency


# Module level: the tabs' dependency below names it in an annotation, which FastAPI resolves
# in this module's namespace (annotations are strings here).
BROKER_READER = requires("GET")


def requires_dag(*entities: DagAccessEntity) -> Callable[..., BaseUser]:
    """A dependency for the tabs on a DAG's pages: :func:`requires` GET (the Broker view), and
    the auth manager's consent to read the DAG named by the ``dag_id`` path or query parameter
    and each of ``entities`` of it (a task instance's tab: TASK_INSTANCE), judged by Airflow's
    own check for its DAG pages (its team included), 403 otherwise. The broker's tab shows
    nothing of a DAG its user may not open in Airflow."""
    # Not async: Airflow's check reads the DAG's team from the metadata database.
    def dependency(request: Request,
                   user: Annotated[BaseUser, Depends(BROKER_READER)]) -> BaseUser:
        for entity in (None, *entities):
            requires_access_dag("GET", entity)(request, user)
        return user

    return dependency
