"""A small client of Airflow's REST API v2 for the system tests.

It logs in as the simple auth manager's user (``POST /auth/token``) and sends the JWT as a
bearer token, logging in again when the token is refused. Waits poll while the deployment's
processes are alive (``Deployment.wait_for``) rather than for a fixed time.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import httpx

from tests.support.deployment import Deployment

HEARTBEATS = ("scheduler", "triggerer", "dag-processor")
TERMINAL_RUN_STATES = frozenset({"success", "failed"})
TERMINAL_TI_STATES = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})


class ApiError(AssertionError):
    pass


class AirflowApi:
    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        self.username, self.password = deployment.api_user
        self.http = httpx.Client(base_url=deployment.api_url, timeout=60.0)
        self._token: str | None = None

    def close(self) -> None:
        self.http.close()

    # -- plumbing --------------------------------------------------------------------------

    def login(self) -> str:
        response = self.http.post("/auth/token",
                                  json={"username": self.username, "password": self.password})
        if response.status_code != 201:
            raise ApiError(f"login failed: {response.status_code} {response.text}")
        token: str = response.json()["access_token"]
        self._token = token
        return token

    def request(self, method: str, path: str, *, expect: tuple[int, ...] = (200,),
                **kwargs: Any) -> httpx.Response:
        extra_headers: dict[str, str] = kwargs.pop("headers", {})
        for attempt in range(2):
            token = self._token or self.login()
            response = self.http.request(method, path, headers={
                **extra_headers, "Authorization": f"Bearer {token}"}, **kwargs)
            if response.status_code == 401 and attempt == 0:
                self._token = None  # expired (or signed before a restart): log in again
                continue
            break
        if response.status_code not in expect:
            raise ApiError(f"{method} {path}: {response.status_code} {response.text}")
        return response

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs).json()

    # -- monitor ---------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``/api/v2/monitor/health``: the metadatabase and the heartbeats of the scheduler,
        triggerer and dag-processor. Needs no login."""
        response = self.http.get("/api/v2/monitor/health")
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def healthy(self) -> bool:
        try:
            health = self.health()
        except httpx.HTTPError:
            return False  # not listening yet
        parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
        return all((health.get(p) or {}).get("status") == "healthy" for p in parts)

    def heartbeat(self, component: str) -> dt.datetime | None:
        """The latest heartbeat of ``scheduler``, ``triggerer`` or ``dag-processor``."""
        key = component.replace("-", "_")
        try:
            value = (self.health().get(key) or {}).get(f"latest_{key}_heartbeat")
        except httpx.HTTPError:
            return None
        return dt.datetime.fromisoformat(value) if value else None

    def restart(self, component: str) -> None:
        """Starts a killed component again and waits until it is up: for the components
        with a heartbeat, until one arrives that is newer than the restart."""
        started = dt.datetime.now(dt.UTC)
        self.deployment.restart(component)
        if component in HEARTBEATS:
            def beats() -> bool:
                latest = self.heartbeat(component)
                return latest is not None and latest > started

            self.deployment.wait_for(beats, f"{component} heartbeat after its restart",
                                     interval=0.5)
        elif component == "api-server":
            self.deployment.wait_for(lambda: self.heartbeat("scheduler") is not None,
                                     "the api-server answering after its restart",
                                     interval=0.5)

    # -- DAGs ------------------------------------------------------------------------------

    def dag(self, dag_id: str) -> dict[str, Any] | None:
        response = self.request("GET", f"/api/v2/dags/{dag_id}", expect=(200, 404))
        if response.status_code == 404:
            return None
        result: dict[str, Any] = response.json()
        return result

    def wait_for_dag(self, dag_id: str) -> dict[str, Any]:
        """Waits until the dag-processor has parsed and stored ``dag_id``; fails at once when
        the file that defines it does not import."""
        def parsed() -> bool:
            if self.dag(dag_id) is not None:
                return True
            errors = self.import_errors_of(dag_id)
            if errors:
                raise ApiError(f"DAG {dag_id} does not import:\n" + "\n".join(
                    f"{e['filename']}:\n{e['stack_trace']}" for e in errors))
            return False

        self.deployment.wait_for(parsed, f"DAG {dag_id} parsed", interval=0.5)
        dag = self.dag(dag_id)
        assert dag is not None
        return dag

    def import_errors(self) -> list[dict[str, Any]]:
        errors: list[dict[str, Any]] = self.get("/api/v2/importErrors",
                                                params={"limit": 100})["import_errors"]
        return errors

    def import_errors_of(self, dag_id: str) -> list[dict[str, Any]]:
        """Import errors of the DAG files that mention ``dag_id``."""
        files = {p.name for p in self.deployment.dags_folder.glob("*.py")
                 if dag_id in p.read_text(errors="replace")}
        return [e for e in self.import_errors() if Path(e["filename"]).name in files]

    def set_paused(self, dag_id: str, paused: bool) -> None:
        self.request("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": paused})

    def unpause(self, dag_id: str) -> None:
        self.set_paused(dag_id, False)

    # -- DAG runs --------------------------------------------------------------------------

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        """Triggers a run now (no logical date); returns its run id."""
        response = self.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", expect=(200,),
                                json={"logical_date": None, "conf": conf or {}})
        run_id: str = response.json()["dag_run_id"]
        return run_id

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
        return result

    def dag_runs(self, dag_id: str, *, state: str | None = None) -> list[dict[str, Any]]:
        """Every run of ``dag_id`` (in the given state), oldest first."""
        runs: list[dict[str, Any]] = []
        while True:
            params: dict[str, Any] = {"order_by": "id", "limit": 100, "offset": len(runs)}
            if state is not None:
                params["state"] = state
            page = self.get(f"/api/v2/dags/{dag_id}/dagRuns", params=params)
            runs += page["dag_runs"]
            if not page["dag_runs"] or len(runs) >= page["total_entries"]:
                return runs

    def wait_for_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        """Waits until the run is finished (success or failed) and returns it."""
        self.deployment.wait_for(
            lambda: self.dag_run(dag_id, run_id)["state"] in TERMINAL_RUN_STATES,
            f"DAG run {dag_id}/{run_id} finished")
        return self.dag_run(dag_id, run_id)

    def run_dag(self, dag_id: str, conf: dict[str, Any] | None = None) -> dict[str, Any]:
        """Waits for ``dag_id`` to be parsed, unpauses it (runs of a paused DAG are not
        scheduled), triggers it and waits for the run to finish; returns the run."""
        self.wait_for_dag(dag_id)
        self.unpause(dag_id)
        return self.wait_for_run(dag_id, self.trigger(dag_id, conf))

    # -- task instances and XCom -----------------------------------------------------------

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        tis: list[dict[str, Any]] = self.get(
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return tis

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        """``{task_id: state}``; mapped instances as ``task_id[map_index]``."""
        return {ti["task_id"] if ti["map_index"] < 0 else f"{ti['task_id']}[{ti['map_index']}]":
                ti["state"] for ti in self.task_instances(dag_id, run_id)}

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value",
             map_index: int = -1) -> Any:
        """A task's XCom as stored (JSON values come back as they were pushed)."""
        entry = self.get(
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}",
            params={"map_index": map_index})
        return entry["value"]

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1,
                 map_index: int = -1) -> str:
        """A task try's log, one event a line (for failure messages)."""
        response = self.request(
            "GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/"
                   f"{try_number}", params={"map_index": map_index},
            headers={"Accept": "application/json"}, expect=(200, 404))
        if response.status_code == 404:
            return f"(no log: {response.text})"
        lines = []
        for entry in response.json().get("content", []):
            if isinstance(entry, dict):
                extra = {k: v for k, v in entry.items() if k not in ("timestamp", "event")}
                lines.append(f"{entry.get('timestamp', '')} {entry.get('event', '')} "
                             f"{extra if extra else ''}".rstrip())
            else:
                lines.append(str(entry))
        return "\n".join(lines)

    def log_entries(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1,
                    map_index: int = -1) -> list[dict[str, Any]]:
        """A task try's log as Airflow's structured events (``event``, ``level``, ...)."""
        response = self.request(
            "GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/"
                   f"{try_number}", params={"map_index": map_index},
            headers={"Accept": "application/json"})
        return [e if isinstance(e, dict) else {"event": str(e)}
                for e in response.json().get("content", [])]

    def warnings(self, dag_id: str, run_id: str) -> list[str]:
        """Every warning or error a user would find in the logs of the run's tasks (all
        tries), as ``task_id: event``."""
        found = []
        for ti in self.task_instances(dag_id, run_id):
            for attempt in range(1, (ti.get("try_number") or 0) + 1):
                for entry in self.log_entries(dag_id, run_id, ti["task_id"], attempt,
                                              ti["map_index"]):
                    level = str(entry.get("level", "")).lower()
                    text = str(entry.get("event", ""))
                    if level in ("warning", "error", "critical") or "Warning:" in text:
                        found.append(f"{ti['task_id']}: {level} {text[:500]}")
        return found

    def run_report(self, dag_id: str, run_id: str) -> str:
        """The run's task states and the logs of its tasks that did not succeed."""
        parts = [f"{dag_id}/{run_id}: {self.task_states(dag_id, run_id)}"]
        for ti in self.task_instances(dag_id, run_id):
            if ti["state"] != "success" and ti.get("try_number"):
                parts.append(f"--- log of {ti['task_id']} (try {ti['try_number']}) ---\n"
                             + self.task_log(dag_id, run_id, ti["task_id"], ti["try_number"],
                                             ti["map_index"]))
        return "\n".join(parts)
