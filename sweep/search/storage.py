"""Where a study lives: in memory, a journal file shared by local processes, or an RDB."""

from __future__ import annotations

from pathlib import Path

__all__ = ["open_storage", "JOURNAL_SUFFIXES"]

#: A path ending so names a journal file.
JOURNAL_SUFFIXES = (".log", ".jsonl", ".journal")


def open_storage(storage):
    """An optuna storage from a URL, a journal path or a storage object.

    Parameters
    ----------
    storage : None, str, pathlib.Path or optuna.storages.BaseStorage
        ``None`` is in memory; a path ending in ``.log``, ``.jsonl`` or
        ``.journal``, or ``journal:///abs/path``, is a journal file shared by
        local processes; an RDB URL (``sqlite:///x.db``, ``postgresql://...``)
        is shared across machines (returned as is: optuna opens it); a
        ``BaseStorage`` is used as is.

    Raises
    ------
    ValueError
        For anything else.
    """
    from optuna.storages import BaseStorage
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    if storage is None or isinstance(storage, BaseStorage):
        return storage
    if isinstance(storage, Path):
        storage = str(storage)
    if not isinstance(storage, str):
        raise ValueError(f"storage must be an optuna storage, an RDB URL or a journal file path, "
                         f"but got {type(storage).__name__}")
    if storage.startswith("journal://"):
        path = storage[len("journal://"):]
        if not path:
            raise ValueError(f"a journal storage URL is journal:///path/to/file, "
                             f"but got {storage!r}")
        return JournalStorage(JournalFileBackend(path))
    if storage.endswith(JOURNAL_SUFFIXES) and "://" not in storage:
        return JournalStorage(JournalFileBackend(storage))
    if "://" in storage:
        return storage
    raise ValueError(f"storage must be an RDB URL (sqlite:///x.db, postgresql://...), "
                     f"journal:///path, or a journal file path ending in .log, .jsonl or "
                     f".journal, but got {storage!r}")
