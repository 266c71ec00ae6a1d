"""Where a study lives: in memory, a journal file shared by local processes, or an RDB.

A journal file is opened with :class:`OwnedFileLock`, a lock that records its
owner (host, pid, process start time), so that a lock left by a killed
search is recognised and removed at once instead of after optuna's 30 s grace
period; and it is checked first (:func:`repair_journal`): a last line torn by
a kill in the middle of a write is cut (and kept in ``<file>.torn-<time>``),
so that every complete trial survives and the next write starts on a line of
its own. An RDB URL is opened here, not by optuna, so that a missing
directory, an unreachable server or a missing driver is one
:class:`StorageError` naming the URL and the fix.
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import time
import uuid
import warnings
from pathlib import Path
from typing import Optional

from optuna.storages.journal import JournalFileOpenLock

__all__ = ["open_storage", "JOURNAL_SUFFIXES", "StorageError", "JournalWarning",
           "OwnedFileLock", "repair_journal"]

#: A path ending so names a journal file.
JOURNAL_SUFFIXES = (".log", ".jsonl", ".journal")

#: A lock file with no owner written in it (its owner died between creating and
#: writing it, or an optuna lock) is stale once older than this [s].
UNNAMED_GRACE = 3.0

#: A lock whose owner cannot be checked (another host) is stale once unchanged this long [s]
#: (optuna's own grace period).
GRACE_PERIOD = 30.0

_READ_BLOCK = 1 << 16


class StorageError(ValueError):
    """A storage that cannot be opened: names the file or URL, what is wrong and the fix."""


class JournalWarning(UserWarning):
    """A journal file repaired on opening: a stale lock removed, a torn last line cut."""


def _start_time(pid: int) -> Optional[str]:
    """The start time of process ``pid`` (``/proc/<pid>/stat`` field 22), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # fields[0] is field 3 (the state); a zombie has exited.
    return None if fields[0] == b"Z" else fields[19].decode()


def _alive(pid: int, start: Optional[str]) -> bool:
    """Whether process ``pid`` of this host runs (and is the one that started at ``start``)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    if os.path.isdir("/proc/self"):
        now = _start_time(pid)
        return now is not None and (start is None or now == start)
    return True


class OwnedFileLock(JournalFileOpenLock):
    """A journal file lock (``<file>.lock``) that records who holds it.

    The lock is the file created with ``O_CREAT | O_EXCL`` (as optuna's
    ``JournalFileOpenLock``) holding one JSON line ``{"host", "pid",
    "start"}``. A process waiting for it removes it, with a
    :class:`JournalWarning`, when it is stale: its owner is a process of this
    host that no longer runs; it names no owner and is older than
    :data:`UNNAMED_GRACE`; or it stayed unchanged for ``grace_period``
    (an owner on another host).

    Parameters
    ----------
    filepath : str
        The journal file the lock protects.
    grace_period : float
        [s] See above.
    """

    def __init__(self, filepath: str, grace_period: float = GRACE_PERIOD) -> None:
        super().__init__(str(filepath), grace_period=None)  # sets _lock_file: <file>.lock
        self.grace_period = float(grace_period)

    def acquire(self) -> bool:
        """Take the lock, waiting for a live owner and removing a stale one; True."""
        sleep, seen, changed = 0.001, None, time.monotonic()
        while True:
            try:
                fd = os.open(self._lock_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                try:
                    st = os.lstat(self._lock_file)
                except FileNotFoundError:
                    continue
                if (st.st_ino, st.st_mtime_ns) != seen:
                    seen, changed = (st.st_ino, st.st_mtime_ns), time.monotonic()
                held = time.monotonic() - changed
                if self._remove_if_stale(st, held):
                    sleep = 0.001
                    continue
                time.sleep(sleep)
                sleep = min(2 * sleep, 0.1)
                continue
            try:
                os.write(fd, self._owner())
            except BaseException:
                os.close(fd)
                os.unlink(self._lock_file)
                raise
            os.close(fd)
            return True

    def release(self) -> None:
        """Remove the lock (``RuntimeError`` if this process did not hold it)."""
        moved = f"{self._lock_file}.{uuid.uuid4().hex}.rename"
        try:
            os.rename(self._lock_file, moved)
        except OSError:
            raise RuntimeError(f"{self._lock_file}: expected a lock this process holds, but "
                               f"there is none") from None
        os.unlink(moved)

    @staticmethod
    def _owner() -> bytes:
        pid = os.getpid()
        return (json.dumps({"host": socket.gethostname(), "pid": pid,
                            "start": _start_time(pid)}) + "\n").encode()

    def _stale(self, st, held: float) -> Optional[str]:
        """Who left the lock file of ``st`` if it is stale (else None)."""
        owner = None
        if not os.path.islink(self._lock_file):
            try:
                with open(self._lock_file, "rb") as f:
                    owner = json.loads(f.read(4096))
            except (OSError, ValueError):
                owner = None
        if isinstance(owner, dict) and isinstance(owner.get("pid"), int):
            if owner.get("host") == socket.gethostname():
                if not _alive(owner["pid"], owner.get("start")):
                    return f"pid {owner['pid']} (no longer running)"
                return None
            if held > self.grace_period:
                return (f"pid {owner['pid']} on {owner.get('host')} (unchanged for "
                        f"{held:.0f} s)")
            return None
        if time.time() - st.st_mtime > UNNAMED_GRACE:
            return f"an unnamed owner ({time.time() - st.st_mtime:.0f} s old, no owner in it)"
        return None

    def _remove_if_stale(self, st, held: float) -> bool:
        """Remove the lock file of ``st`` if it is stale; whether it was removed."""
        who = self._stale(st, held)
        if who is None:
            return False
        moved = f"{self._lock_file}.{uuid.uuid4().hex}.stale"
        try:
            os.rename(self._lock_file, moved)
        except FileNotFoundError:  # another waiter removed it first
            return True
        now = os.lstat(moved)
        if (now.st_ino, now.st_mtime_ns) != (st.st_ino, st.st_mtime_ns):  # a new lock: put it back
            try:
                os.link(moved, self._lock_file, follow_symlinks=False)
            except FileExistsError:
                pass
            os.unlink(moved)
            return True
        os.unlink(moved)
        warnings.warn(f"{self._lock_file}: removed a stale lock left by {who}",
                      JournalWarning, stacklevel=4)
        return True


def _last_line_start(f, end: int) -> int:
    """Where the line that ends at byte ``end`` (exclusive) of ``f`` begins."""
    pos = end - 1  # the byte at end - 1 is the line's own newline (or its last byte)
    while pos > 0:
        start = max(0, pos - _READ_BLOCK)
        f.seek(start)
        block = f.read(pos - start)
        cut = block.rfind(b"\n")
        if cut >= 0:
            return start + cut + 1
        pos = start
    return 0


def _complete_length(f, size: int) -> int:
    """Bytes of ``f`` up to the end of its last line that ends in a newline and is JSON."""
    keep = size
    while keep > 0:
        f.seek(keep - 1)
        start = _last_line_start(f, keep)
        f.seek(start)
        line = f.read(keep - start)
        if line.endswith(b"\n"):
            try:
                json.loads(line)
                return keep
            except ValueError:
                pass
        keep = start
    return 0


def repair_journal(path, lock: Optional[JournalFileOpenLock] = None) -> int:
    """Cut a torn tail off the journal file ``path``; the bytes cut (0 if none).

    Under the journal's lock (``lock``, default an :class:`OwnedFileLock`), the
    last lines that do not end in a newline or do not parse as JSON (left by a
    kill in the middle of a write) are moved to ``<path>.torn-<time>`` with a
    :class:`JournalWarning`; every complete record before them is kept.
    """
    path = str(path)
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return 0
    lock = lock or OwnedFileLock(path)
    lock.acquire()
    try:
        with open(path, "rb+") as f:
            size = os.fstat(f.fileno()).st_size
            keep = _complete_length(f, size)
            if keep == size:
                return 0
            f.seek(keep)
            torn = f.read()
            backup = f"{path}.torn-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
            with open(backup, "wb") as out:
                out.write(torn)
                out.flush()
                os.fsync(out.fileno())
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
    finally:
        lock.release()
    warnings.warn(f"{path}: cut a torn last line ({len(torn)} bytes, left by a search killed "
                  f"while writing; kept in {backup}); the {keep} bytes of complete records "
                  f"before it are kept", JournalWarning, stacklevel=3)
    return len(torn)


def _open_journal(path: str):
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    where = Path(path)
    if not where.parent.is_dir():
        raise StorageError(f"storage {path!r}: expected a journal file in an existing "
                           f"directory, but {where.parent} does not exist (create it, or "
                           f"give another path)")
    if where.is_dir():
        raise StorageError(f"storage {path!r}: expected a journal file, but it is a directory")
    lock = OwnedFileLock(path)
    repair_journal(path, lock)
    try:
        return JournalStorage(JournalFileBackend(path, lock_obj=lock))
    except PermissionError as err:
        raise StorageError(f"storage {path!r}: expected a journal file this user can write, "
                           f"but {err.strerror.lower()}") from None


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def with_driver(url: str) -> str:
    """``url`` with an installed PostgreSQL driver.

    ``postgresql://`` means SQLAlchemy's default driver (psycopg2 before
    SQLAlchemy 2.1, psycopg 3 from 2.1); where that one is absent but psycopg 3
    (the ``[postgres]`` extra) is installed, the URL becomes
    ``postgresql+psycopg://``. Any other URL is returned as is.
    """
    if not url.startswith("postgresql://"):
        return url
    from sqlalchemy.engine import make_url

    default = make_url(url).get_dialect().driver
    if default != "psycopg" and not _importable(default) and _importable("psycopg"):
        return "postgresql+psycopg://" + url[len("postgresql://"):]
    return url


def _shown(url: str) -> str:
    """``url`` without its password."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - only for the message; the URL is checked below
        return url.split("@")[-1] if "@" in url else url


def _open_rdb(url: str):
    import sqlalchemy.exc
    from optuna.storages import RDBStorage

    shown = _shown(url)
    url = with_driver(url)
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        db = Path(url[len("sqlite:///"):])
        if not db.parent.is_dir():
            raise StorageError(f"storage {shown!r}: expected a database file in an existing "
                               f"directory, but {db.parent} does not exist (create it, or "
                               f"give another path; sqlite:////abs/path has four slashes)")
    try:
        return RDBStorage(url)
    except ImportError as err:
        driver = getattr(err.__cause__, "name", None) or err.name or str(err)  # optuna wraps it
        raise StorageError(f"storage {shown!r}: needs the database driver {driver!r}, which "
                           f"is not installed (for PostgreSQL: pip install "
                           f"'layout-sweep[postgres]' or pip install 'psycopg[binary]', then "
                           f"postgresql:// works)") from None
    except sqlalchemy.exc.ArgumentError as err:  # NoSuchModuleError: an unknown dialect
        raise StorageError(f"storage {shown!r}: expected an RDB URL SQLAlchemy knows "
                           f"(sqlite:///x.db, postgresql://user@host/db), but "
                           f"{str(err).splitlines()[0]}") from None
    except sqlalchemy.exc.OperationalError as err:
        detail = str(getattr(err, "orig", None) or err).strip().splitlines()
        raise StorageError(f"storage {shown!r}: cannot open the database ("
                           f"{detail[0] if detail else type(err).__name__}); check the path "
                           f"or that the server runs and accepts this user") from None


def open_storage(storage):
    """An optuna storage from a URL, a journal path or a storage object.

    Parameters
    ----------
    storage : None, str, pathlib.Path or optuna.storages.BaseStorage
        ``None`` is in memory; a path ending in ``.log``, ``.jsonl`` or
        ``.journal``, or ``journal:///abs/path``, is a journal file shared by
        local processes (locked with :class:`OwnedFileLock`, repaired with
        :func:`repair_journal`); an RDB URL (``sqlite:///x.db``,
        ``postgresql://...``) is shared across machines, opened as an
        ``optuna.storages.RDBStorage``; a ``BaseStorage`` is used as is.

    Raises
    ------
    StorageError
        A ``ValueError`` for anything else, and for a journal or database that
        cannot be opened (a missing directory, an unreachable server, a missing
        driver).
    """
    from optuna.storages import BaseStorage

    if storage is None or isinstance(storage, BaseStorage):
        return storage
    if isinstance(storage, Path):
        storage = str(storage)
    if not isinstance(storage, str):
        raise StorageError(f"storage must be an optuna storage, an RDB URL or a journal file "
                           f"path, but got {type(storage).__name__}")
    if storage.startswith("journal://"):
        path = storage[len("journal://"):]
        if not path:
            raise StorageError(f"a journal storage URL is journal:///path/to/file, "
                               f"but got {storage!r}")
        return _open_journal(path)
    if storage.endswith(JOURNAL_SUFFIXES) and "://" not in storage:
        return _open_journal(storage)
    if "://" in storage:
        return _open_rdb(storage)
    raise StorageError(f"storage must be an RDB URL (sqlite:///x.db, postgresql://...), "
                       f"journal:///path, or a journal file path ending in .log, .jsonl or "
                       f".journal, but got {storage!r}")
