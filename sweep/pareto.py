"""The one Pareto implementation: which rows of a score table no other row dominates.

Every column is to be minimized (negate a column to maximize it). A row
dominates another when it is no worse in every column and better in one, so
equal rows never dominate each other: all of them are kept. Search
(:mod:`sweep.search`) and analysis (:func:`sweep.pareto_front`) both use it.

    >>> import numpy as np
    >>> nondominated(np.array([[1.0, 2.0], [2.0, 1.0], [2.0, 2.0], [1.0, 2.0]]))
    array([ True,  True, False,  True])
"""

from __future__ import annotations

import numpy as np

__all__ = ["nondominated"]

#: Rows checked at once against the front so far (n-D kernel).
_BATCH = 1024
#: Front rows compared with a batch at once (n-D kernel): bounds the temporary array.
_FRONT_CHUNK = 2048


def nondominated(scores, *, batch: int = _BATCH) -> np.ndarray:
    """Mask of the rows of ``scores`` that no other row dominates (every column minimized).

    Parameters
    ----------
    scores : array_like, shape (n, m)
        One row per candidate, one column per objective, smaller is better.
        Rows with NaN should be dropped first (NaN compares false).
    batch : int
        Rows checked at once by the kernel for m > 2 (memory, not the answer).

    Returns
    -------
    numpy.ndarray of bool, shape (n,)
        True for the non-dominated rows; equal rows are all kept.

    Notes
    -----
    Two columns: one sort and a running minimum, O(n log n). More: a sweep in
    lexicographic order against the front so far, O(n * front size),
    vectorized by batch.
    """
    values = np.asarray(scores, dtype=float)
    if values.ndim != 2:
        raise ValueError(f"scores must be an (n, m) array, but got shape {values.shape}")
    mask = np.zeros(len(values), dtype=bool)
    if len(values) == 0:
        return mask
    if values.shape[1] == 1:
        mask[values[:, 0] == values[:, 0].min()] = True
        return mask
    keep = _front_2d(values) if values.shape[1] == 2 else _front_nd(values, batch)
    mask[keep] = True
    return mask


def _front_2d(values):
    """Indices of the non-dominated rows of an (n, 2) array (minimize), O(n log n)."""
    n = len(values)
    order = np.lexsort((values[:, 1], values[:, 0]))
    s = values[order]
    new = np.ones(n, dtype=bool)
    new[1:] = (s[1:] != s[:-1]).any(axis=1)
    start = np.maximum.accumulate(np.where(new, np.arange(n), 0))
    # A row is dominated iff an earlier, different row (in this order) has f1 <= its f1.
    before = np.concatenate([[np.inf], np.minimum.accumulate(s[:, 1])[:-1]])[start]
    return np.sort(order[s[:, 1] < before])


def _front_nd(values, batch=_BATCH):
    """Indices of the non-dominated rows of an (n, m) array (minimize).

    Rows are visited in lexicographic order, where no row is dominated by a
    later one, so each batch is checked against the front so far, and its
    survivors against each other.
    """
    order = np.lexsort(values.T[::-1])
    s = values[order]
    new = np.ones(len(values), dtype=bool)
    new[1:] = (s[1:] != s[:-1]).any(axis=1)
    unique, group = s[new], np.cumsum(new) - 1
    on_front = np.zeros(len(unique), dtype=bool)
    front = np.empty((0, values.shape[1]))
    for lo in range(0, len(unique), batch):
        rows = unique[lo:lo + batch]
        keep = np.ones(len(rows), dtype=bool)
        for f_lo in range(0, len(front), _FRONT_CHUNK):
            part = front[f_lo:f_lo + _FRONT_CHUNK]
            keep &= ~(part[None, :, :] <= rows[:, None, :]).all(axis=2).any(axis=1)
        index = np.flatnonzero(keep)
        survivors = rows[index]
        if len(survivors) > 1:  # distinct rows: j <= i everywhere means j dominates i
            within = (survivors[None, :, :] <= survivors[:, None, :]).all(axis=2)
            np.fill_diagonal(within, False)
            index = index[~within.any(axis=1)]
        on_front[lo + index] = True
        front = np.concatenate([front, rows[index]])
    return np.sort(order[on_front[group]])
