"""The project installed as users install it: a wheel built from the source tree and installed
into a virtual environment of its own.

The new environment gets everything else (Airflow, its providers, PySpark, ...) from the test
environment's site-packages through a path line in a ``.pth`` file. Path lines are added to
``sys.path`` as they are, without processing the ``.pth`` files inside them, so the editable
install of the test environment (a ``.pth`` finder) stays inert and ``airflow_broker`` comes
from the wheel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Interpreter and installer entry points of a venv that must not be replaced by the test
# environment's.
_OWN_SCRIPTS = ("python", "activate", "Activate", "pip", "pydoc", "deactivate")


@dataclass(frozen=True)
class InstalledProject:
    """A virtual environment holding the project's wheel."""

    prefix: Path
    wheel: Path

    @property
    def bin(self) -> Path:
        return self.prefix / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"

    def script(self, name: str) -> Path:
        return self.bin / name

    def path_env(self, path: str | None) -> str:
        """PATH with this environment first: spark-submit, python3 and airflow are looked up
        on PATH by Airflow, the Spark provider and the pyspark launch scripts."""
        return os.pathsep.join([str(self.bin), *([path] if path else [])])


def _package_sources() -> list[str]:
    """Top-level folders the wheel is built from, those of pyproject.toml's packages (the
    Airflow parts are linked into airflow_broker/, and copied through the links)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages: list[str] = config["tool"]["setuptools"]["packages"]
    return sorted({p.split(".")[0] for p in packages})


def build_wheel(work: Path) -> Path:
    """Builds the project's wheel from a copy of the sources: setuptools writes ``build/`` and
    ``*.egg-info`` next to the sources, and others may be building in the checkout at the same
    time."""
    source = work / "source"
    source.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for folder in _package_sources():
        shutil.copytree(ROOT / folder, source / folder, ignore=ignore)
    dist = work / "dist"
    # No build isolation: setuptools and wheel come from the test environment, so the build
    # needs no network.
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
          "--no-index", "--wheel-dir", str(dist), str(source)], work / "build.log")
    (wheel,) = dist.glob("airflow_broker-*.whl")
    return wheel


def _run(command: list[str], log: Path) -> None:
    """Runs a build step with its (verbose) output in ``log``, shown only when it fails."""
    with log.open("ab") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{tail}")


def _copy_scripts(source_bin: Path, target_bin: Path, target_python: Path) -> None:
    """Makes the test environment's commands (airflow, spark-submit, ...) available in the new
    environment: Python console scripts are rewritten to run the new interpreter (their
    shebang would otherwise start the test environment's, which imports the editable
    install); shell scripts are linked, as they find their companions next to themselves."""
    for entry in sorted(source_bin.iterdir()):
        target = target_bin / entry.name
        if (not entry.is_file() or target.exists() or entry.name.startswith(_OWN_SCRIPTS)
                or entry.name == "__pycache__"):
            continue
        head = entry.read_bytes()[:256]
        first_line = head.split(b"\n", 1)[0]
        interpreter = Path(first_line[2:].strip().decode(errors="replace"))
        if (first_line.startswith(b"#!") and interpreter.parent == source_bin
                and interpreter.name.startswith("python")):
            body = entry.read_bytes().split(b"\n", 1)[1]
            target.write_bytes(b"#!" + str(target_python).encode() + b"\n" + body)
            target.chmod(0o755)
        else:
            target.symlink_to(entry)


def install_project(work: Path) -> InstalledProject:
    """Builds the wheel and installs it into a new virtual environment under ``work``."""
    wheel = build_wheel(work / "wheel")
    prefix = work / "venv"
    # Without pip: the test environment's pip installs into it (--python), which is much
    # faster than ensurepip.
    log = work / "install.log"
    _run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], log)
    project = InstalledProject(prefix, wheel)
    site_packages = Path(subprocess.run(
        [str(project.python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True).stdout.strip())
    (site_packages / "airflow_broker_system_deps.pth").write_text(
        sysconfig.get_path("purelib") + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(project.python), "install", "--no-deps",
          "--no-index", str(wheel)], log)
    _copy_scripts(Path(sys.executable).parent, project.bin, project.python)
    return project


def imported_from(project: InstalledProject, module: str) -> Path:
    """Where the new environment imports ``module`` from. Run outside the checkout: ``-c``
    puts the working directory first on sys.path, where the source tree would shadow the
    wheel."""
    out = subprocess.run(
        [str(project.python), "-c", f"import {module}; print({module}.__file__)"],
        check=True, capture_output=True, text=True, cwd=project.prefix,
        env={"PATH": project.path_env(None)})
    return Path(out.stdout.strip())
