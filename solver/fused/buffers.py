"""Output arrays of the fused kernels, kept for the next call once the caller has dropped them.

A fused call of a million configurations writes some 200 MB of output arrays.
Fresh, they cost more than the kernel itself on this project's 2-core VM: the
OS faults each 4 KiB page in and zeroes it on first write, and glibc hands
blocks this large back to the OS when they are freed, so every call pays again
(``benchmarks/results/fused.md``, the "fresh output arrays" rows). Calls that
price batch after batch of one size (a Monte-Carlo loop, a search's batches, a
calibration's fits) need not.

So the fused paths take their outputs from :func:`empty`, which keeps a
reference to each array it hands out and hands it out again once nothing else
refers to it. "Nothing else" is read from the reference count: a caller's
array, any numpy view of it (a view holds its base), an xarray object wrapping
either, and a memoryview or other buffer exported from it all count, so an
array a caller can still reach is never handed out twice (``tests/test_fused_buffers.py``).
What the count cannot see is a raw address kept without a Python reference
(``array.ctypes.data`` stored as an integer) or a weak reference. Reused arrays
are written in full by the kernels, like the fresh ``np.empty`` arrays they
replace.

The memory kept is bounded: at most ``$LAYOUT_SWEEP_BUFFER_CACHE`` MiB (default
:data:`DEFAULT_CACHE_MIB`, two sets of outputs of a million configurations) of
arrays are kept, in use or not, and the unused ones are released first when a
new array would pass the bound. ``LAYOUT_SWEEP_BUFFER_CACHE=0`` turns the cache
off; :func:`release` drops every unused array now.
"""

from __future__ import annotations

import os
import sys
import threading

import numpy as np

from . import renew_after_fork

__all__ = ["CACHE_ENV", "DEFAULT_CACHE_MIB", "empty", "release", "cache_limit", "kept_bytes"]

#: Environment variable: the most memory [MiB] kept for reuse (0 turns the cache off).
CACHE_ENV = "LAYOUT_SWEEP_BUFFER_CACHE"
#: Default of :data:`CACHE_ENV` [MiB]: two sets of outputs of a million configurations.
DEFAULT_CACHE_MIB = 512
#: Arrays smaller than this [bytes] are never kept: glibc serves them again from its heap
#: without new page faults, and a cache of many small arrays would cost a longer search.
MIN_BYTES = 1 << 18

_LOCK = threading.Lock()
renew_after_fork(globals(), "_LOCK")
_KEPT: list = []  # arrays handed out, in the order they were made


def _count(array) -> int:
    return sys.getrefcount(array)


def _probe(hold: bool) -> int:
    """:func:`_count` of a kept array, read as the functions below read it, held by a caller or not."""
    kept = [np.empty(1)]
    callers = list(kept) if hold else []  # a caller's reference, or none
    for a in kept:
        return _count(a) + 0 * len(callers)


# The count of an array nobody but this module refers to (the list, the loop variable,
# the calls' arguments), measured rather than assumed: interpreters differ in which
# references they count. If a caller's reference did not show, the cache stays off.
_UNUSED_REFCOUNT = _probe(False)
_COUNTS_CALLERS = _probe(True) > _UNUSED_REFCOUNT


def cache_limit() -> int:
    """Bytes :func:`empty` may keep for reuse: ``$LAYOUT_SWEEP_BUFFER_CACHE`` MiB, default 512.

    Raises
    ------
    ValueError
        For a value that is not a number of MiB >= 0.
    """
    raw = os.environ.get(CACHE_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_CACHE_MIB << 20
    try:
        mib = float(raw)
    except ValueError:
        mib = -1.0
    if not mib >= 0:  # also refuses nan
        raise ValueError(f"${CACHE_ENV} must be a number of MiB >= 0 (0 turns the cache of "
                         f"output arrays off), but got {raw!r}")
    return int(mib * (1 << 20))


def kept_bytes() -> tuple:
    """``(bytes kept, bytes of those nobody else refers to)``."""
    with _LOCK:
        total = sum(a.nbytes for a in _KEPT)
        free = 0
        for a in _KEPT:
            if _count(a) <= _UNUSED_REFCOUNT:
                free += a.nbytes
        return total, free


def release() -> int:
    """Drop every kept array nobody else refers to; returns the bytes released."""
    with _LOCK:
        return _release(0)


def _release(keep_at_most: int) -> int:
    """Drop unused arrays, oldest first, until the kept bytes are <= ``keep_at_most``."""
    total = sum(a.nbytes for a in _KEPT)
    released = 0
    i = 0
    while i < len(_KEPT) and total > keep_at_most:
        a = _KEPT[i]
        if _count(a) <= _UNUSED_REFCOUNT:
            del _KEPT[i]
            total -= a.nbytes
            released += a.nbytes
        else:
            i += 1
        del a
    return released


def empty(n: int, dtype) -> np.ndarray:
    """A C-contiguous array of ``n`` items of ``dtype``, its contents undefined (like ``np.empty``).

    A kept array of that size and dtype that nobody else refers to is handed out
    again; else a new one is made and kept, if the cache has room for it and it is
    of at least :data:`MIN_BYTES`.
    """
    dtype = np.dtype(dtype)
    if n * dtype.itemsize < MIN_BYTES:
        return np.empty(n, dtype=dtype)
    limit = cache_limit() if _COUNTS_CALLERS else 0
    if limit <= 0:
        with _LOCK:
            if _KEPT:
                _release(0)
        return np.empty(n, dtype=dtype)
    with _LOCK:
        for a in _KEPT:
            if a.shape[0] == n and a.dtype == dtype and _count(a) <= _UNUSED_REFCOUNT:
                return a  # the returned reference counts before the lock is let go
        a = None  # the loop's last array is not in use by this call
        new = np.empty(n, dtype=dtype)
        total = sum(a.nbytes for a in _KEPT)
        if total + new.nbytes > limit:
            total -= _release(limit - new.nbytes)
        if total + new.nbytes <= limit:
            _KEPT.append(new)
        return new
