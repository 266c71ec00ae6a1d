"""numba pieces the fused kernels share: the no-alias compiler, scalar-or-array access, exact integer division.

Imports numba: import it only where :data:`solver.fused.NUMBA` is True.

Why ``noalias``: a kernel reads some 20 knob arrays and writes some 30 output
arrays. numba does not tell LLVM they are distinct, so LLVM's loop vectorizer
must guard a vector loop with a runtime check per pair of pointers that may
overlap; past its threshold (8 pairs) it gives up and the loop stays scalar,
three to four times slower. :class:`NoAliasCompiler` sets numba's ``noalias``
flag (the one its parallel loops use), which marks every pointer argument
``noalias``, C's ``restrict``. That holds for the kernels' calls: every output
is a fresh array, written only through its own argument, and inputs are only
read (two knobs may share one array: reads of shared memory are allowed).
"""

from __future__ import annotations

import contextlib
import hashlib
import warnings
from pathlib import Path

import numpy as np
from numba import njit as _njit
from numba import types
from numba.core.compiler import Compiler
from numba.extending import overload

__all__ = ["NoAliasCompiler", "njit", "kernel", "at", "floordiv", "ceildiv", "sources_digest",
           "cache_is_current", "forced_vector_width"]


def njit(**options):
    """``numba.njit(cache=True, error_model="numpy", **options)``, caching where it can.

    numba caches beside the module (``__pycache__``) or, where the package's
    folder is not writable (a system site-packages), in the user's cache
    directory (``$NUMBA_CACHE_DIR``, else ``~/.cache/numba``). Where neither
    is writable it refuses ``cache=True``; the kernels then compile in each
    process (seconds), with a warning, instead of failing to import.
    """
    options = {"cache": True, "error_model": "numpy", **options}

    def decorate(fn):
        try:
            return _njit(**options)(fn)
        except RuntimeError as err:  # "cannot cache function ...: no locator available"
            warnings.warn(f"numba cannot cache {fn.__name__} ({err}): it compiles in every "
                          f"process; set NUMBA_CACHE_DIR to a writable folder", RuntimeWarning,
                          stacklevel=2)
            return _njit(**{**options, "cache": False})(fn)

    return decorate


def sources_digest(files, values=()):
    """16 hex digits of the sha256 of ``files`` (their bytes, in order, CRLF read as LF, as
    a Windows checkout writes them) and ``repr(values)``; None where a file cannot be read
    (a package run from a zip, where numba cannot cache either)."""
    digest = hashlib.sha256()
    for path in files:
        try:
            data = Path(path).read_bytes()
        except OSError:
            return None
        digest.update(data.replace(b"\r\n", b"\n"))
    digest.update(repr(tuple(values)).encode())
    return digest.hexdigest()[:16]


def cache_is_current(module: str, recorded: str, files, values=()) -> bool:
    """Whether a kernel may read numba's disk cache: its other sources match ``recorded``.

    numba keys a cached kernel on the content of the kernel's own file only. Code it
    compiles in from other files (inlined steps, overloads) and module constants it
    reads as globals are frozen into the cached machine code, so after a change there
    the cache would hand back the old kernel, silently different from the numpy path
    (an upgrade leaves numba's files in ``__pycache__``). Each kernel module records
    the digest of those sources (:func:`sources_digest`) as ``SOURCES_DIGEST``: a
    change to them then changes the module's own file, which numba does notice.
    When the recorded digest is stale (the sources changed and it was not updated;
    the module's test fails too), the kernel compiles in this process instead, with
    a warning.
    """
    actual = sources_digest(files, values)
    if actual == recorded:
        return True
    if actual is None:  # the sources are not files: nothing to cache from, nothing to say
        return False
    warnings.warn(f"{module}: the sources its kernel compiles in changed since its SOURCES_DIGEST "
                  f"was recorded ({recorded} -> {actual}); the kernel compiles in this process "
                  f"instead of reading numba's disk cache, which may hold the old code (set "
                  f"SOURCES_DIGEST = {actual!r} in {module})", RuntimeWarning, stacklevel=2)
    return False


class NoAliasCompiler(Compiler):
    """numba's compiler with every pointer argument marked ``noalias`` (``restrict``)."""

    def define_pipelines(self):
        self.state.flags.noalias = True
        return super().define_pipelines()


def kernel(fn=None, *, cache=True):
    """``njit`` as the kernels need it: cached, numpy's error model, no fastmath, restrict arguments.

    ``cache=True``: compiled once per pattern of argument types, then read from
    numba's cache (``__pycache__`` beside the module, or a user cache directory
    when the package's folder is not writable). ``error_model="numpy"``: no
    division-by-zero checks in the loop. fastmath stays off: it would
    reassociate sums and drop NaN rules, and the kernels must equal the numpy
    path bit for bit. ``cache=False`` (see :func:`cache_is_current`): compiled in
    each process.
    """
    decorate = njit(nogil=True, pipeline_class=NoAliasCompiler, cache=cache)
    return decorate if fn is None else decorate(fn)


@contextlib.contextmanager
def forced_vector_width(width: int):
    """Compile inside this block with LLVM's loop vectorizer forced to ``width`` lanes.

    LLVM's cost model can refuse a loop that pays when vectorized (it priced the
    megatron kernel's block loop as not beneficial; forced to 4 lanes the kernel ran
    1.3-1.4x faster, see :func:`solver.fused.megatron_kernel._compile`). Forcing changes no result:
    each lane computes what the scalar loop would, without fastmath, and loops that
    cannot be vectorized legally stay scalar. The option (``-force-vector-width``) is
    process-wide, so the block holds numba's compiler lock, which every numba
    compilation takes: no other function compiles while it is set, and it is set back
    to 0 (LLVM's cost model decides) on the way out. Code loaded from numba's cache
    is not recompiled, so the block costs nothing then.
    """
    import llvmlite.binding as llvm
    from numba.core.compiler_lock import global_compiler_lock

    with global_compiler_lock:
        try:
            llvm.set_option("", f"-force-vector-width={int(width)}")
        except Exception:  # an LLVM without the option: LLVM's cost model decides, same results
            yield
            return
        try:
            yield
        finally:
            llvm.set_option("", "-force-vector-width=0")


def at(x, i):  # pragma: no cover - the overload below replaces it inside numba
    """``x[i]`` for an array, ``x`` for a scalar."""
    return x[i] if np.ndim(x) else x


@overload(at, inline="always")
def _at_overload(x, i):
    if isinstance(x, types.Array):
        return lambda x, i: x[i]
    return lambda x, i: x


@njit(inline="always")
def floordiv(a, b):
    """``a // b`` for whole floats ``0 <= a``, ``1 <= b``, both below 2**53, exactly.

    The quotient ``a / b`` is correctly rounded, so its floor is off by at most
    one; the remainder says which way (it is exact when the floor is right or
    one too small, and negative, if rounded, when the floor is one too big).
    Float only: AVX2 has no vector int64 division, and this vectorizes.
    """
    q = np.floor(a / b)
    r = a - q * b
    return q - (r < 0.0) + (r >= b)


@njit(inline="always")
def ceildiv(a, b):
    """``-(-a // b)`` for whole floats as in :func:`floordiv`."""
    q = floordiv(a, b)
    return q + (a - q * b > 0.0)
