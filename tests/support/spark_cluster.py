"""A Spark standalone cluster on 127.0.0.1: a master and workers as separate JVMs, started the
way ``sbin/start-master.sh`` and ``start-worker.sh`` start them (``spark-class`` with the
Master and Worker classes), from the Spark that pip installed with pyspark.

The workers' environment is a machine's without this project: no PYTHONPATH, no virtual
environment, and ``python3`` on PATH is a bare virtual environment (no psycopg, no
airflow-broker), so whatever the readers import must be shipped by the job.
Used by the system tier and bench/spark_readers.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import venv
from pathlib import Path
from typing import IO, Any

import psutil
import pyspark

PYSPARK_HOME = Path(pyspark.__file__ or "pyspark").resolve().parent
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
SERVICE_PORT = re.compile(r"Successfully started service '(\w+)' on port (\d+)")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class SparkCluster:
    def __init__(self, work: Path, *, workers: int = 2, cores: int = 1,
                 memory: str = "1g") -> None:
        self.work = work
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.port = free_port()
        self.ui_port = free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []
        self.bare_python = work / "bare-python" / "bin" / "python3"

    def environment(self) -> dict[str, str]:
        dropped = ("PYTHON", "PYSPARK", "SPARK_", "VIRTUAL_ENV", "AIRFLOW", "PYTEST")
        env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
        path = [p for p in env.get("PATH", "").split(os.pathsep)
                if p and Path(p).resolve() != Path(sys.executable).parent.resolve()]
        env.update({
            "PATH": os.pathsep.join([str(self.bare_python.parent), *path]),
            "SPARK_HOME": str(PYSPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.work / "logs"),
            # Never read a developer's ~/.spark or conf folder.
            "SPARK_CONF_DIR": str(self.work / "conf"),
        })
        return env

    def _launch(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.work / "logs" / f"{name}.log").open("ab")
        self._logs.append(log)
        process = subprocess.Popen(
            [str(PYSPARK_HOME / "bin" / "spark-class"), *args], env=self.environment(),
            stdout=log, stderr=subprocess.STDOUT, cwd=self.work, start_new_session=True)
        self.processes.append(process)
        return process

    def start(self, timeout: float = 120) -> SparkCluster:
        (self.work / "logs").mkdir(parents=True, exist_ok=True)
        (self.work / "conf").mkdir(exist_ok=True)
        venv.create(self.work / "bare-python", with_pip=False)
        deadline = time.monotonic() + timeout
        master = self._launch("master", "org.apache.spark.deploy.master.Master",
                              "--host", "127.0.0.1", "--port", str(self.port),
                              "--webui-port", str(self.ui_port))
        self._bound_ports(master, deadline)
        for n in range(self.workers):
            work_dir = self.work / f"worker-{n}"
            work_dir.mkdir()
            self._launch(f"worker-{n}", "org.apache.spark.deploy.worker.Worker",
                         "--host", "127.0.0.1", "--cores", str(self.cores),
                         "--memory", self.memory, "--webui-port", str(free_port()),
                         "--work-dir", str(work_dir), self.master_url)
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"a Spark daemon exited:\n{self.log_tails()}")
            try:
                if self.state().get("aliveworkers") == self.workers:
                    return self
            except OSError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"the Spark cluster did not start:\n{self.log_tails()}")

    def _bound_ports(self, master: subprocess.Popen[bytes], deadline: float) -> None:
        """The ports the master bound, from its log. A port chosen free can be taken before
        the master binds it (another cluster, or any client's ephemeral port, on a busy
        machine); Spark then binds the next one, and says so."""
        log = self.work / "logs" / "master.log"
        while time.monotonic() < deadline:
            if master.poll() is not None:
                raise RuntimeError(f"the Spark master exited:\n{self.log_tails()}")
            bound = dict(SERVICE_PORT.findall(log.read_text(errors="replace")))
            if "sparkMaster" in bound and "MasterUI" in bound:
                self.port, self.ui_port = int(bound["sparkMaster"]), int(bound["MasterUI"])
                self.master_url = f"spark://127.0.0.1:{self.port}"
                return
            time.sleep(0.2)
        raise TimeoutError(f"the Spark master did not start:\n{self.log_tails()}")

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/",
                                    timeout=5) as response:
            result: dict[str, Any] = json.load(response)
            return result

    def executors(self) -> list[psutil.Process]:
        """The executor JVMs the workers launched."""
        found = []
        for worker in self.processes[1:]:
            try:
                children = psutil.Process(worker.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            for child in children:
                try:
                    if EXECUTOR_CLASS in " ".join(child.cmdline()):
                        found.append(child)
                except psutil.NoSuchProcess:
                    continue
        return found

    def python_workers(self) -> list[psutil.Process]:
        """The Python processes (pyspark daemons and workers) under the executors."""
        found = []
        for executor in self.executors():
            try:
                found += [c for c in executor.children(recursive=True)
                          if "python" in c.name()]
            except psutil.NoSuchProcess:
                continue
        return found

    def log_tails(self, lines: int = 30) -> str:
        out = []
        for log in sorted((self.work / "logs").glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name}\n" + "\n".join(text))
        for stderr in sorted(self.work.glob("worker-*/app-*/*/stderr")):
            text = stderr.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {stderr.relative_to(self.work)}\n" + "\n".join(text))
        return "\n".join(out)

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        for log in self._logs:
            log.close()
