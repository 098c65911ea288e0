"""What reaches the Spark executors: the readers' Python environment and the handler's code.

Executors run Python on other machines, which have neither this project nor psycopg. Spark's
own ways carry them there:

- the engine and its dependencies travel as a packed virtual environment, a ``tar.gz`` passed
  with ``spark.archives`` (``#environment``) and run as ``./environment/bin/python``, which is
  what Spark's documentation recommends (with venv-pack) for YARN, Kubernetes and standalone.
  The environment is a subset of the one Airflow runs in, written straight from its installed
  files, so it holds the very versions Airflow uses and needs no package index (venv-pack packs
  a virtual environment that exists on disk and refuses editable installs). Like venv-pack's,
  it does not contain Python itself: ``bin/python`` links to a base interpreter of the same
  version that the cluster's machines have at that path;
- the handler's module, or its top-level package zipped, travels with ``py_files``.

Both are built once per content and kept in the user's cache directory.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import importlib.util
import io
import logging
import os
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import platformdirs

from airflow_broker.callables import split_name

log = logging.getLogger(__name__)

ARCHIVE_ALIAS = "environment"
# The interpreter inside the unpacked archive, relative to the executor's working directory.
ARCHIVE_PYTHON = f"./{ARCHIVE_ALIAS}/bin/python"
# A batch handler is given a pandas DataFrame with Arrow columns.
BATCH_DISTRIBUTIONS = ("pandas", "pyarrow")
PROJECT = "airflow-broker"


def cache_dir() -> Path:
    path = Path(platformdirs.user_cache_dir("airflow-broker")) / "spark"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def distributions(extra_names: Iterable[str] = ()) -> list[metadata.Distribution]:
    """The installed distributions the readers need: this project's own requirements (without
    its extras), those of ``extra_names``, and theirs, as Airflow's environment has them."""
    from packaging.requirements import Requirement

    found: dict[str, metadata.Distribution] = {}
    pending: list[tuple[str, frozenset[str]]] = [(PROJECT, frozenset())]
    pending += [(name, frozenset()) for name in extra_names]
    seen: set[tuple[str, frozenset[str]]] = set()
    while pending:
        name, extras = pending.pop()
        key = (_canonical(name), extras)
        if key in seen:
            continue
        seen.add(key)
        dist = metadata.distribution(name)
        found[_canonical(name)] = dist
        for text in dist.requires or []:
            requirement = Requirement(text)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": extra})
                                     for extra in (*extras, "")):
                pending.append((requirement.name, frozenset(requirement.extras)))
    return sorted(found.values(), key=lambda d: _canonical(d.metadata["Name"]))


def _project_dir() -> Path:
    import airflow_broker

    return Path(airflow_broker.__file__).resolve().parent


def _tree(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            yield path


def _dist_files(dist: metadata.Distribution) -> Iterator[tuple[str, Path]]:
    """(path inside site-packages, installed file) of a distribution; the project itself comes
    from its package folder, which an editable install does not list."""
    if _canonical(dist.metadata["Name"]) == PROJECT:
        root = _project_dir()
        for path in _tree(root):
            yield f"airflow_broker/{path.relative_to(root).as_posix()}", path
        return
    if dist.files is None:
        raise RuntimeError(f"{dist.metadata['Name']} lists no files (no RECORD): it cannot be "
                           "packed for the Spark executors")
    for entry in dist.files:
        relative = entry.as_posix()
        # Scripts and data files outside site-packages are not needed to import anything.
        if relative.startswith("..") or "__pycache__" in entry.parts:
            continue
        path = Path(str(dist.locate_file(entry)))
        if path.is_file():
            yield relative, path


def _fingerprint(dists: list[metadata.Distribution], base_python: str) -> str:
    digest = hashlib.sha256()
    digest.update(f"{sys.version}|{sysconfig.get_platform()}|{base_python}".encode())
    for dist in dists:
        digest.update(f"|{dist.metadata['Name']}=={dist.version}".encode())
    # The project may be an editable install whose code changes without a new version.
    for relative, path in _dist_files(metadata.distribution(PROJECT)):
        digest.update(relative.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def base_interpreter() -> str:
    """The interpreter Airflow's environment was made from (its virtual environment's base)."""
    return str(getattr(sys, "_base_executable", None) or sys.executable)


def packed_environment(*, batch: bool = False, base_python: str | None = None) -> Path:
    """The readers' environment as a ``tar.gz`` in venv layout, built when its content changed.

    ``base_python`` is the interpreter the cluster's machines have, which ``bin/python`` links
    to (default: the base interpreter of Airflow's environment, for clusters built from the
    same image). It must be the same Python version as Airflow's: the compiled parts of
    psycopg and lxml are those of this environment.
    """
    base = base_python or base_interpreter()
    dists = distributions(BATCH_DISTRIBUTIONS if batch else ())
    name = f"readers-env-py{sys.version_info.major}{sys.version_info.minor}-" \
           f"{_fingerprint(dists, base)}.tar.gz"
    target = cache_dir() / name
    if target.exists():
        log.info("the readers' Python environment is packed already: %s", target)
        return target
    log.info("packing the readers' Python environment (%d distributions: %s) into %s",
             len(dists), ", ".join(f"{d.metadata['Name']} {d.version}" for d in dists), target)
    site = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
    fd, temporary = tempfile.mkstemp(dir=target.parent, suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
            _add_text(tar, "pyvenv.cfg",
                      f"home = {os.path.dirname(base)}\n"
                      "include-system-site-packages = false\n"
                      f"version = {'.'.join(map(str, sys.version_info[:3]))}\n")
            _add_link(tar, "bin/python", base)
            _add_link(tar, "bin/python3", "python")
            for dist in dists:
                for relative, path in _dist_files(dist):
                    tar.add(str(path), arcname=f"{site}/{relative}", recursive=False)
        os.replace(temporary, target)
    except BaseException:
        os.unlink(temporary)
        raise
    log.info("packed the readers' Python environment: %.1f MB",
             target.stat().st_size / 1_000_000)
    return target


def _add_text(tar: tarfile.TarFile, name: str, text: str) -> None:
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def _add_link(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = target
    info.mode = 0o755
    tar.addfile(info)


def handler_py_files(handler: str) -> list[str]:
    """The files that carry the handler's code to the executors: its module when it is a
    top-level module, else its top-level package zipped. Nothing for the project's own
    handlers, which travel in the packed environment."""
    module, _ = split_name(handler)
    top = module.split(".")[0]
    if top == "airflow_broker":
        return []
    spec = importlib.util.find_spec(top)
    if spec is None:
        raise ValueError(f"the handler's module {top!r} cannot be imported where the operator "
                         "runs, so it cannot be shipped to the Spark executors: put it in the "
                         "DAGs folder or the Python path of Airflow's workers, or ship it "
                         "yourself with py_files and ship_handler=False")
    if spec.submodule_search_locations:
        return [str(_zipped_package(top, [Path(p) for p in spec.submodule_search_locations]))]
    if spec.origin and spec.origin.endswith(".py"):
        return [spec.origin]
    raise ValueError(f"the handler's module {top!r} ({spec.origin}) is not Python source: "
                     "install it in the readers' environment instead")


def _zipped_package(top: str, locations: list[Path]) -> Path:
    files = [(f"{top}/{path.relative_to(root).as_posix()}", path)
             for root in locations for path in _tree(root)]
    digest = hashlib.sha256()
    for name, path in files:
        digest.update(name.encode())
        digest.update(path.read_bytes())
    target = cache_dir() / f"{top}-{digest.hexdigest()[:16]}.zip"
    if not target.exists():
        fd, temporary = tempfile.mkstemp(dir=target.parent, suffix=".partial")
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, path in files:
                zf.write(path, name)
        os.replace(temporary, target)
    return target
