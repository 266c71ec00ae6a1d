"""How many points are priced (or read) at a time: one name, one default, everywhere.

``block_points`` is the keyword, ``--block-points`` the flag; the solver's chunks
of a large call, a sweep's grid blocks and the analysis slabs of a cube all use
:data:`BLOCK_POINTS` unless told otherwise. It bounds the temporaries of one
block (about 4 KB a point inside ``solve``) while keeping numpy's per-call
overhead small.

A physics model prices a call in blocks with :func:`in_blocks`: the knobs are
cut along their longest broadcast axis, each block is priced alone and the
outputs are assembled into arrays of the full shape.
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional

import numpy as np

from .knobs import Precisions

__all__ = ["BLOCK_POINTS", "broadcast_shape", "in_blocks"]

#: Points per block by default (2**18: about 1 GB of temporaries at most in ``solve``).
BLOCK_POINTS = 1 << 18


def broadcast_shape(knobs: Mapping) -> tuple:
    """The shape all the (normalized) knobs broadcast to.

    Raises
    ------
    ValueError
        Naming the array knobs and their shapes when they do not broadcast.
    """
    try:
        return np.broadcast_shapes(*(np.shape(v) for v in knobs.values()))
    except ValueError:
        shapes = {name: np.shape(v) for name, v in knobs.items() if np.shape(v)}
        raise ValueError(
            "the array knobs must broadcast together (each axis of equal length or 1), but got "
            + ", ".join(f"{name} of shape {shape}" for name, shape in shapes.items())) from None


def in_blocks(price: Callable[[dict, tuple], dict], knobs: Mapping, shape: tuple,
              block_points: Optional[int] = None) -> dict:
    """``price(knobs, shape)``, in blocks along the longest axis when the call is large.

    Parameters
    ----------
    price : callable
        ``price(knobs, shape) -> dict of name -> array of that shape``.
    knobs : dict
        Normalized knobs (numpy arrays, or :class:`~solver.knobs.Precisions`).
    shape : tuple
        Their broadcast shape (:func:`broadcast_shape`).
    block_points : int, optional
        Points per block; default :data:`BLOCK_POINTS`. A call of at most twice
        this many points is priced in one piece.

    Returns
    -------
    dict of str -> numpy.ndarray
        What ``price`` returns, for the whole ``shape``: one call's arrays as
        they are, or writable arrays assembled from the blocks.
    """
    block_points = BLOCK_POINTS if block_points is None else block_points
    size = int(np.prod(shape))
    axis = int(np.argmax(shape)) if shape else 0
    if size <= 2 * block_points or shape[axis] < 2:
        return price(dict(knobs), shape)
    n_blocks = min(shape[axis], -(-size // block_points))
    bounds = np.linspace(0, shape[axis], n_blocks + 1).astype(int)
    result = {}
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        part = {name: _rows(value, axis, len(shape), lo, hi) for name, value in knobs.items()}
        block_shape = shape[:axis] + (hi - lo,) + shape[axis + 1:]
        for name, value in price(part, block_shape).items():
            if name not in result:
                result[name] = np.empty(shape, dtype=value.dtype)
            result[name][(slice(None),) * axis + (slice(lo, hi),)] = value
    return result


def _rows(value, axis, ndim, lo, hi):
    """Rows ``lo:hi`` of a knob along broadcast axis ``axis`` (unchanged if it is not long there)."""
    shape = np.shape(value)
    own = axis - (ndim - len(shape))
    if own < 0 or shape[own] == 1:
        return value
    index = (slice(None),) * own + (slice(lo, hi),)
    if isinstance(value, Precisions):
        return Precisions(value.keys, value.codes[index])
    return value[index]
