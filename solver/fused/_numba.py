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

import warnings

import numpy as np
from numba import njit as _njit
from numba import types
from numba.core.compiler import Compiler
from numba.extending import overload

__all__ = ["NoAliasCompiler", "njit", "kernel", "at", "floordiv", "ceildiv"]


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


class NoAliasCompiler(Compiler):
    """numba's compiler with every pointer argument marked ``noalias`` (``restrict``)."""

    def define_pipelines(self):
        self.state.flags.noalias = True
        return super().define_pipelines()


def kernel(fn):
    """``njit`` as the kernels need it: cached, numpy's error model, no fastmath, restrict arguments.

    ``cache=True``: compiled once per pattern of argument types, then read from
    numba's cache (``__pycache__`` beside the module, or a user cache directory
    when the package's folder is not writable). ``error_model="numpy"``: no
    division-by-zero checks in the loop. fastmath stays off: it would
    reassociate sums and drop NaN rules, and the kernels must equal the numpy
    path bit for bit.
    """
    return njit(nogil=True, pipeline_class=NoAliasCompiler)(fn)


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
