"""Fused numba kernels for flat (1-D) inputs; the numpy paths stay the reference and the fallback.

A physics model's numpy path computes every term on the axes it spans, which is
what makes open-mesh grids fast; a flat batch of random configurations spans
one axis everywhere, and there numpy streams hundreds of full-size temporaries
through memory. A fused kernel prices the same configurations in one loop,
every intermediate in registers: one pass over the inputs, one over the outputs.

The kernels import numba, so import them lazily and check :data:`NUMBA` first
(numba is an optional dependency: ``pip install "layout-sweep[fast]"``).
:func:`resolve_engine` is the one rule by which a model's ``solve(...,
engine=...)`` picks its path.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

__all__ = ["NUMBA", "ENGINES", "FUSED_MIN_POINTS", "THREAD_MIN_POINTS", "PIECES_PER_THREAD",
           "shapes_of", "flat_size", "resolve_engine", "threads", "in_ranges"]

#: numba is importable (the fused kernels can run).
NUMBA = importlib.util.find_spec("numba") is not None

#: Values of ``solve(..., engine=...)``.
ENGINES = ("auto", "numpy", "fused")

#: ``engine="auto"`` takes a fused kernel from this many configurations on: below it
#: the numpy path costs well under a millisecond and the kernel's call overhead
#: (unboxing some 50 arguments, allocating the outputs) is as large.
FUSED_MIN_POINTS = 4096


#: Knobs that are not arrays of configurations (a name or None, whatever the call).
_NOT_ARRAYS = frozenset({"topology_override"})


def shapes_of(values: dict):
    """Knob name -> shape of its value; None if numpy cannot shape one (a ragged list).

    The numpy path then refuses the value with a message naming the knob.
    """
    try:
        return {name: np.shape(value) for name, value in values.items()
                if name not in _NOT_ARRAYS}
    except (ValueError, TypeError):
        return None


def flat_size(shapes: dict):
    """``(n, None)`` when every shape is ``()`` or ``(n,)`` for one ``n``, else ``(None, why)``.

    Parameters
    ----------
    shapes : dict of str -> tuple
        Knob name -> ``np.shape`` of its value.
    """
    n = None
    for name, shape in shapes.items():
        if shape == ():
            continue
        if len(shape) != 1:
            return None, (f"it prices flat inputs (every knob a scalar or a 1-D array of one "
                          f"length), but {name} has shape {shape}")
        if n is None:
            n = shape[0]
        elif shape[0] != n:
            return None, (f"it prices flat inputs of one length, but the knobs have lengths "
                          f"{n} and {shape[0]} ({name})")
    return (1 if n is None else n), None


def resolve_engine(engine, shapes: dict, *, min_points: int = FUSED_MIN_POINTS):
    """The path a ``solve`` call takes: ``"fused"`` or ``"numpy"``.

    Parameters
    ----------
    engine : {"auto", "numpy", "fused"}
        ``"numpy"``: always the numpy path. ``"fused"``: the kernel, or a
        ``ValueError`` saying why it cannot price the call. ``"auto"``: the
        kernel when numba is importable, every knob is a scalar or a 1-D array
        of one length, and there are at least ``min_points`` configurations;
        else numpy.
    shapes : dict of str -> tuple, or None
        Knob name -> shape (:func:`shapes_of` the values the caller passed);
        None takes the numpy path, which refuses what could not be shaped.
    min_points : int
        The smallest call ``"auto"`` fuses.

    Raises
    ------
    ValueError
        For an unknown ``engine``, or ``engine="fused"`` on a call the kernel
        cannot price (numba absent, inputs not flat), naming the reason.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(map(repr, ENGINES))}, "
                         f"but got {engine!r}")
    if engine == "numpy" or shapes is None:
        return "numpy"
    why = None
    if not NUMBA:
        why = 'numba is not installed (pip install "layout-sweep[fast]" or pip install numba)'
    else:
        n, why = flat_size(shapes)
        if why is None and engine == "auto" and n < min_points:
            return "numpy"
    if why is None:
        return "fused"
    if engine == "fused":
        raise ValueError(f"engine='fused' cannot price this call: {why} (engine='numpy' or "
                         f"'auto' can)")
    return "numpy"


#: A fused call is spread over threads only from this many configurations per thread on
#: (a thread's start-up and the pool's hand-off cost some tens of microseconds).
THREAD_MIN_POINTS = 1 << 16
#: A threaded call is cut into up to this many ranges a thread, which the threads take as
#: they finish one (:func:`in_ranges`).
PIECES_PER_THREAD = 4
#: Environment variable that sets the threads of a fused call (default: the usable cores).
THREADS_ENV = "LAYOUT_SWEEP_THREADS"

def renew_after_fork(namespace: dict, name: str) -> None:
    """Give ``namespace[name]`` a new lock in every forked child.

    A child forked while another thread held the lock would inherit it held, and
    wait for it for ever: nothing in the child will let it go.
    """
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=lambda: namespace.__setitem__(name, threading.Lock()))


_POOL = None
_POOL_LOCK = threading.Lock()
renew_after_fork(globals(), "_POOL_LOCK")


def threads() -> int:
    """Threads a fused call may use: ``$LAYOUT_SWEEP_THREADS``, else the cores this process may run on.

    Raises
    ------
    ValueError
        For a ``$LAYOUT_SWEEP_THREADS`` that is not a positive integer.
    """
    raw = os.environ.get(THREADS_ENV)
    if raw is not None and raw.strip():
        try:
            value = int(raw)
        except ValueError:
            value = 0
        if value < 1:
            raise ValueError(f"${THREADS_ENV} must be a positive integer, but got {raw!r}")
        return value
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def in_ranges(fn, n: int) -> list:
    """``[fn(lo, hi), ...]`` over consecutive ranges covering ``0:n``, in threads where worth it.

    The kernels release the GIL (``nogil=True``) and each configuration is priced
    on its own, so a range's results are the same bits whichever thread prices it.
    Calls below :data:`THREAD_MIN_POINTS` per thread run in the caller's thread.

    Threaded, the call is cut into up to :data:`PIECES_PER_THREAD` ranges a thread (each
    of :data:`THREAD_MIN_POINTS` or more), and each thread takes the next range as it
    finishes one: a thread whose core is slowed (another process, a VM's neighbour) prices
    fewer, instead of the call waiting on its half. The results are in range order.
    """
    count = min(threads(), max(1, n // THREAD_MIN_POINTS))
    if count <= 1:
        return [fn(0, n)]
    pieces = min(count * PIECES_PER_THREAD, max(count, n // THREAD_MIN_POINTS))
    edges = [n * i // pieces for i in range(pieces + 1)]
    global _POOL
    with _POOL_LOCK:
        # A forked child inherits the pool object but not its threads: a new pool there.
        if _POOL is None or _POOL[0] != os.getpid() or _POOL[1]._max_workers < count:
            _POOL = (os.getpid(), ThreadPoolExecutor(max_workers=count, thread_name_prefix="fused"))
        pool = _POOL[1]
    results = [None] * pieces
    order, lock = itertools.count(), threading.Lock()  # each range is taken once

    def take():
        while True:
            with lock:
                j = next(order)
            if j >= pieces:
                return
            results[j] = fn(edges[j], edges[j + 1])

    futures = [pool.submit(take) for _ in range(count)]
    for future in futures:
        future.result()  # (raises what a range raised)
    return results
