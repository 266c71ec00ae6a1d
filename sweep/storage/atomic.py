"""Atomic writes: a file is written aside, flushed to disk and renamed over its final path.

A temporary name is ``<path>.tmp-<pid>`` (``-<random>`` added when several may
be written at once), so a name left by a process that no longer runs is known
to be garbage and removed (:func:`remove_dead_asides`).
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

__all__ = ["partial_path", "aside", "is_aside", "fsync_file", "fsync_dir", "replace",
           "remove_dead_asides", "writable_file"]

_ASIDE = re.compile(r"\.tmp-(\d+)(?:-[0-9a-f]+)?$")


def writable_file(path) -> Path:
    """``path`` as a Path, if it can name a file to write: its directory exists and it is
    not a directory. Else FileNotFoundError / IsADirectoryError saying so (a write into a
    missing directory had failed on the temporary name, as "Permission denied" or a bare
    FileNotFoundError, after the work)."""
    path = Path(path)
    if not path.parent.is_dir():
        raise FileNotFoundError(f"expected a file in an existing directory, but got "
                                f"{str(path)!r} ({path.parent} does not exist)")
    if path.is_dir():
        raise IsADirectoryError(f"expected a file, but got the directory {str(path)!r}")
    return path


def partial_path(path) -> Path:
    """Where a streamed sweep stages its blocks until complete: the directory ``<path>.partial``."""
    path = Path(path)
    return path.with_name(path.name + ".partial")


def aside(path: Path, token: bool = False) -> Path:
    """A temporary name next to ``path``: ``<path>.tmp-<pid>`` (``-<random>`` with token)."""
    suffix = f".tmp-{os.getpid()}" + (f"-{uuid.uuid4().hex[:8]}" if token else "")
    return path.with_name(path.name + suffix)


def is_aside(name: str) -> bool:
    """Whether ``name`` is a temporary name made by :func:`aside`."""
    return _ASIDE.search(name) is not None


def fsync_file(path) -> None:
    """Flush the file at ``path`` to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path) -> None:
    """Persist a rename in ``path`` (best effort: not every system syncs directories)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace(tmp: Path, path: Path) -> None:
    """Flush ``tmp`` to disk and rename it to ``path`` (atomic on POSIX and Windows)."""
    fsync_file(tmp)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def remove_dead_asides(path: Path) -> None:
    """Delete ``<path>.tmp-<pid>`` files and dirs left by processes that no longer run."""
    for leftover in list(path.parent.glob(path.name + ".tmp-*")) + list(
            path.parent.glob(partial_path(path).name + ".tmp-*")):
        match = _ASIDE.search(leftover.name)
        if match and not _alive(int(match[1])):
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)
