"""An Airflow deployment as users run it: ``airflow api-server``, ``scheduler``,
``dag-processor`` and ``triggerer`` as separate processes (LocalExecutor, metadata on
PostgreSQL), plus ``airflow-broker worker``, all from the virtual environment that holds the
project's wheel.

Each component runs in a process group of its own (a new session), so that killing a component
takes its children with it (LocalExecutor workers, the triggerer's trigger runner, the
api-server's workers), as when the container or host of that component dies.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.install import InstalledProject

AIRFLOW_COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
BROKER_WORKER = "broker-worker"

# How long a component may take to exit after SIGTERM before it gets SIGKILL.
STOP_GRACE_SECONDS = 30.0
# A guard against a hang, not a performance bound: a wait that would otherwise poll forever
# while every process stays alive fails after this long, with the logs' tails.
OVERALL_GUARD_SECONDS = 600.0
# supervise()'s delay before it starts a component that exited again: systemd's RestartSec as
# docs/airflow.md recommends it, long enough that a server's crash recovery is over before
# the restarts would exhaust a StartLimitBurst.
RESTART_SECONDS = 5.0


class DeploymentError(AssertionError):
    """A wait on the deployment ended without its condition: a component died, or the guard
    ran out. The message carries the tails of the component logs."""


@dataclass
class Component:
    """One long-running process of the deployment and its log."""

    name: str
    command: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    # Every process group started for this component: a component killed without its group
    # may leave children behind, which the session's teardown still ends.
    groups: list[int] = field(default_factory=list)
    starts: int = 0
    # False after a deliberate kill: waits then no longer need this component alive.
    expected: bool = False
    # Exit codes of the exits supervise() restarted it after.
    exits: list[int] = field(default_factory=list)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid


class Deployment:
    """The running deployment. ``env`` is the complete environment of every component."""

    def __init__(self, home: Path, project: InstalledProject, env: Mapping[str, str], *,
                 api_url: str, api_user: tuple[str, str], broker_dsn: str,
                 passwords: Mapping[str, str] | None = None) -> None:
        self.home = home
        self.project = project
        self.env = dict(env)
        self.api_url = api_url
        self.api_user = api_user  # (username, password) of the simple auth manager
        # Every user of the simple auth manager, with its password.
        self.passwords = dict(passwords or {api_user[0]: api_user[1]})
        self.broker_dsn = broker_dsn
        self.dags_folder = Path(self.env["AIRFLOW__CORE__DAGS_FOLDER"])
        # Apart from AIRFLOW_HOME/logs, which holds the task and DAG-processing logs.
        self.log_dir = home / "component-logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.components: dict[str, Component] = {}
        # While supervise() runs, a component that exits is started again, not a failure.
        self._supervisor: threading.Thread | None = None
        for name in AIRFLOW_COMPONENTS:
            command = [str(project.script("airflow")), name]
            if name in ("scheduler", "triggerer"):
                # Their log servers would listen on every interface; the api-server reads
                # task and trigger logs from the shared log folder instead.
                command.append("--skip-serve-logs")
            self.components[name] = Component(name, command, self.log_dir / f"{name}.log")
        self.components[BROKER_WORKER] = Component(
            BROKER_WORKER,
            [str(project.script("airflow-broker")), "-v", "worker", "--dsn", broker_dsn,
             "--interval", "0.5"],
            self.log_dir / f"{BROKER_WORKER}.log")

    # -- processes -------------------------------------------------------------------------

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Runs a one-off command of the deployment's environment (``airflow ...``,
        ``airflow-broker ...``), from the deployment's home."""
        command = [str(self.project.script(args[0])), *args[1:]]
        done = subprocess.run(command, env=self.env, cwd=self.home, capture_output=True,
                              text=True, check=False)
        if check and done.returncode != 0:
            raise DeploymentError(f"{' '.join(args)} failed ({done.returncode}):\n"
                                  f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}")
        return done

    def start(self, name: str) -> Component:
        """Starts ``name``; its output goes to its log (appended to across restarts)."""
        component = self.components[name]
        if component.alive():
            raise RuntimeError(f"{name} is already running (pid {component.pid})")
        component.starts += 1
        component.expected = True
        with component.log_path.open("ab") as log:
            log.write(f"\n===== start #{component.starts} of {name} =====\n".encode())
            log.flush()
            # The working directory is the deployment's home, never the checkout: a source
            # tree on sys.path would shadow the installed wheel.
            component.process = subprocess.Popen(
                component.command, env=self.env, cwd=self.home, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        component.groups.append(component.process.pid)
        return component

    def start_all(self) -> None:
        for name in self.components:
            self.start(name)

    def kill(self, name: str, *, whole_group: bool = True) -> None:
        """SIGKILLs ``name`` (with its children unless ``whole_group`` is False) and reaps it;
        ``restart()`` brings it back."""
        component = self.components[name]
        process = component.process
        if process is None or process.poll() is not None:
            raise RuntimeError(f"{name} is not running")
        component.expected = False
        if whole_group:
            _signal_group(process.pid, signal.SIGKILL)
        else:
            process.send_signal(signal.SIGKILL)
        process.wait()
        self._append_to_log(component, f"===== {name} killed (SIGKILL, "
                                       f"{'group' if whole_group else 'process only'}) =====")

    def restart(self, name: str) -> Component:
        """Starts ``name`` again after ``kill()`` (or a crash)."""
        return self.start(name)

    def stop(self, name: str) -> None:
        """SIGTERM, then SIGKILL if it has not exited in time; children left behind by
        earlier kills are ended too."""
        component = self.components[name]
        component.expected = False
        process = component.process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for group in component.groups:
            _signal_group(group, signal.SIGKILL)
        component.groups.clear()

    def stop_all(self) -> None:
        # Readers of the queues first (the broker worker), Airflow's producers of work last.
        for name in reversed(list(self.components)):
            with contextlib.suppress(Exception):
                self.stop(name)

    def alive(self, *names: str) -> bool:
        """Whether the named components (all by default) are running."""
        return all(self.components[n].alive() for n in names or self.components)

    def dead(self) -> list[str]:
        return [n for n, c in self.components.items() if not c.alive()]

    @contextlib.contextmanager
    def supervise(self, restart_after: float = RESTART_SECONDS) -> Iterator[None]:
        """Plays systemd's ``Restart=always`` for every component that should run: one that
        exits is started again ``restart_after`` seconds later, its exit code kept in
        ``Component.exits`` and written to its log. Waits meanwhile need components alive only
        when they check."""
        assert self._supervisor is None, "already supervised"
        stop = threading.Event()

        def watch() -> None:
            exited: dict[str, float] = {}
            while not stop.wait(0.2):
                for name, component in self.components.items():
                    process = component.process
                    if not component.expected or process is None:
                        continue
                    code = process.poll()
                    if code is None:
                        continue
                    seen = exited.setdefault(name, time.monotonic())
                    if time.monotonic() - seen < restart_after:
                        continue
                    del exited[name]
                    component.exits.append(code)
                    # What the exited process left of its group goes, as systemd's
                    # KillMode=control-group ends a unit's remaining processes.
                    _signal_group(process.pid, signal.SIGKILL)
                    self._append_to_log(component, f"===== {name} exited ({code}); started "
                                                   "again by the supervisor =====")
                    self.start(name)

        self._supervisor = threading.Thread(target=watch, name="deployment-supervisor",
                                            daemon=True)
        self._supervisor.start()
        try:
            yield
        finally:
            stop.set()
            self._supervisor.join()
            self._supervisor = None

    # -- waiting ---------------------------------------------------------------------------

    def wait_for(self, condition: Callable[[], bool], what: str, *,
                 needs: tuple[str, ...] = (), interval: float = 0.2) -> None:
        """Polls ``condition`` while the components in ``needs`` (by default every one not
        deliberately killed) are alive; fails with the logs' tails when one dies first, or
        after the overall guard."""
        needed = needs or tuple(n for n, c in self.components.items() if c.expected)
        # Under supervise(), an exit is the supervisor's to answer, not the wait's.
        watching = bool(needs) or self._supervisor is None
        deadline = time.monotonic() + OVERALL_GUARD_SECONDS
        while not condition():
            if watching and not self.alive(*needed):
                if condition():
                    return
                dead = [n for n in needed if not self.components[n].alive()]
                raise DeploymentError(f"{what}: {', '.join(dead)} exited\n{self.log_tails()}")
            if time.monotonic() > deadline:
                raise DeploymentError(f"{what}: still not the case after "
                                      f"{OVERALL_GUARD_SECONDS:.0f} s\n{self.log_tails()}")
            time.sleep(interval)

    # -- logs ------------------------------------------------------------------------------

    def log_tail(self, name: str, chars: int = 4000) -> str:
        path = self.components[name].log_path
        if not path.exists():
            return ""
        with path.open("rb") as log:
            log.seek(0, os.SEEK_END)
            size = log.tell()
            log.seek(max(0, size - chars))
            return log.read().decode(errors="replace")

    def log_tails(self, chars: int = 4000) -> str:
        parts = []
        for name, component in self.components.items():
            state = "running" if component.alive() else (
                "not started" if component.process is None
                else f"exited {component.process.returncode}")
            parts.append(f"----- {name} ({state}, pid {component.pid}, {component.log_path})"
                         f" -----\n{self.log_tail(name, chars)}")
        return "\n".join(parts)

    def _append_to_log(self, component: Component, line: str) -> None:
        with component.log_path.open("ab") as log:
            log.write(f"\n{line}\n".encode())


def _signal_group(group: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signum)
