"""A throw-away PostgreSQL server on 127.0.0.1 for the tests that share a study across processes.

The server binaries come from Debian's ``postgresql`` package (``.ci/run``
installs it); the fixture makes a cluster in a temporary folder, starts it on a
free loopback port, yields a SQLAlchemy URL, and stops it (``-m immediate``)
afterwards. PostgreSQL refuses to run as root, so as root the server runs as
the ``postgres`` user the package creates.

Where the binaries are absent the tests skip and say why; under CI (``CI`` set)
they fail instead, since CI is where the promise is kept.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

__all__ = ["postgres_url", "server_binaries"]


def server_binaries() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``, or None."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    found = shutil.which("initdb")
    if found:
        candidates.insert(0, str(Path(found).resolve().parent))
    for folder in candidates:
        if (Path(folder) / "initdb").exists() and (Path(folder) / "pg_ctl").exists():
            return Path(folder)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_server_user(argv: list) -> list:
    if os.geteuid() != 0:
        return argv
    pwd.getpwnam("postgres")  # KeyError: the package's user is missing
    return ["runuser", "-u", "postgres", "--", *argv]


def _missing(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must install Debian's postgresql package (.ci/run)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def postgres_url():
    """``postgresql+psycopg://postgres@127.0.0.1:PORT/postgres`` of a fresh server."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _missing("the PostgreSQL driver psycopg is not installed (pip install "
                 "'layout-sweep[postgres]')")
    binaries = server_binaries()
    if binaries is None:
        _missing("PostgreSQL's server binaries (initdb, pg_ctl) are not installed")
    # Not under pytest's tmp folders: those are private to root, and the server runs as postgres.
    root = Path(tempfile.mkdtemp(prefix="layout-sweep-pg-"))
    data, sockets, log = root / "data", root / "sockets", root / "server.log"
    sockets.mkdir()
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        for path in (root, sockets):
            os.chown(path, user.pw_uid, user.pw_gid)
    _run([str(binaries / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
          "--no-sync"])
    port = _free_port()
    options = f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off"
    try:
        _run([str(binaries / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w",
              "-t", "60", "start"])
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(_as_server_user([str(binaries / "pg_ctl"), "-D", str(data), "-m",
                                        "immediate", "stop"]), capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


def _run(argv):
    done = subprocess.run(_as_server_user(argv), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(argv)}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
