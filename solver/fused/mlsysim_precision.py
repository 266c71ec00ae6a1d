"""The precision knob as the fused mlsysim kernel reads it: names matched on their characters.

A 1-D array of names of at most 4 characters is passed to the kernel as the flat
int32 view of its characters and decoded inside the loop (:func:`precision_input`),
so the names cost no pass of their own.
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import overload

from .. import knobs as _knobs
from ._numba import njit

__all__ = ["PRECISION_KEYS", "precision_input"]

#: Precision names in code order (the numpy path's).
PRECISION_KEYS = tuple(_knobs.PRECISION_BYTES)


def _name_key(chars):
    """A name's key: its 4 character codes (0-padded) in base 128 (exact in float64)."""
    key = 0.0
    for ch in chars.ljust(4, "\0"):
        key = key * 128.0 + ord(ch)
    return key


#: The keys of the precision names, by code.
_NAMES = tuple(_name_key(name) for name in PRECISION_KEYS)


@njit(inline="always")
def _lower(ch):
    """``str.lower`` of one character code that is ASCII (A-Z -> a-z), as a float."""
    return ch + 32.0 if (ch >= 65.0) & (ch <= 90.0) else ch


def _code_at(p, i, names):  # pragma: no cover - the overload below replaces it inside numba
    """The precision code of configuration ``i`` as a float (-1.0: not a known name)."""


@overload(_code_at, inline="always")
def _code_at_overload(p, i, names):
    if isinstance(p, types.Array) and p.dtype == types.int32:  # 4n characters of <U4 names
        def decode(p, i, names):
            # Float arithmetic throughout, which keeps the loop vectorized.
            j = 4 * i  # one flat array: a 2-D index keeps the loop scalar
            c0, c1, c2, c3 = p[j] * 1.0, p[j + 1] * 1.0, p[j + 2] * 1.0, p[j + 3] * 1.0
            ascii_ = (c0 < 128.0) & (c1 < 128.0) & (c2 < 128.0) & (c3 < 128.0)
            key = ((_lower(c0) * 128.0 + _lower(c1)) * 128.0 + _lower(c2)) * 128.0 + _lower(c3)
            n0, n1, n2, n3, n4, n5, n6 = names
            code = -1.0
            code = 0.0 if key == n0 else code
            code = 1.0 if key == n1 else code
            code = 2.0 if key == n2 else code
            code = 3.0 if key == n3 else code
            code = 4.0 if key == n4 else code
            code = 5.0 if key == n5 else code
            code = 6.0 if key == n6 else code
            return code if ascii_ else -1.0
        return decode
    if isinstance(p, types.Array):  # codes
        return lambda p, i, names: p[i] * 1.0
    return lambda p, i, names: p * 1.0


def precision_input(value):
    """The precision knob as the kernel reads it, fast; None where the general path must take it.

    A name gives its code; a :class:`~solver.knobs.Precisions` its codes
    remapped to :data:`PRECISION_KEYS`; a 1-D array of names of at most 4
    characters the flat int32 view (4 a name) of its characters (decoded in the
    kernel, no pass of its own); the key of a string is its characters in
    base 128, A-Z lowered as ``str.lower`` lowers them, and only all-ASCII
    strings are matched (any other goes the general path), so a string matches
    exactly when ``str.lower()`` gives the name. Anything else (unknown or long names, object
    arrays) gives None: :func:`solver.knobs.normalize` then checks it and
    names what is wrong.
    """
    if isinstance(value, (str, np.str_)):
        key = str(value).lower()
        return PRECISION_KEYS.index(key) if key in PRECISION_KEYS else None
    if isinstance(value, _knobs.Precisions):
        remap = np.array([PRECISION_KEYS.index(key) for key in value.keys], dtype=np.int8)
        return remap[value.codes]
    if not isinstance(value, np.ndarray) or value.dtype.kind != "U" or value.ndim != 1:
        return None
    if not value.size or value.dtype.itemsize > 16:
        return None
    words = np.ascontiguousarray(value, dtype="<U4")  # a copy only for shorter names
    return words.view(np.int32)
