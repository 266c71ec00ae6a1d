"""Ties collapsed: layouts whose outputs are all equal are one row, listing the knobs' values.

A ranking padded with layouts that differ only in knobs that change nothing
(``microbatch_count`` or ``v_stages`` when ``pp_size`` is 1, ...) tells the
user nothing new in its second to tenth rows. :func:`collapse` keeps one row
per set of equal outputs (the first in rank order) and says which knobs could
take which other values there: ``equivalent = "microbatch_count=1|2|4|8"``.

Outputs are equal when every data variable of the cube (outputs, masks,
``n_accelerators``) agrees to 12 significant digits; only what the cube holds
can be compared.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import xarray as xr

__all__ = ["collapse", "collapse_rows", "EQUIVALENT", "TIES", "parse_equivalent"]

#: The variable of a collapsed ranking listing the equivalent knob values.
EQUIVALENT = "equivalent"
#: The variable counting the layouts one row stands for.
TIES = "ties"


def _key(value):
    """A hashable value equal for outputs equal to 12 significant digits (NaN equals NaN)."""
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.12g}"
    return value.item() if hasattr(value, "item") else value


def _text(value) -> str:
    from .explain import _fmt

    return _fmt(value)


def collapse(points: xr.Dataset, dims: Sequence[str], outputs: Sequence[str],
             order: dict) -> xr.Dataset:
    """One row per set of equal ``outputs``, with :data:`EQUIVALENT` and :data:`TIES`.

    Parameters
    ----------
    points : xarray.Dataset
        A ranking along one dim (``rank``): the dims' values as variables and
        the outputs' values.
    dims : sequence of str
        The cube's dims (the knobs whose values may differ within a group).
    outputs : sequence of str
        The variables compared.
    order : dict
        Dim -> its coordinate values in the cube's order (equivalent values are
        listed in that order).

    Returns
    -------
    xarray.Dataset
        The first row of each group, in rank order (``rank`` renumbered from
        1), plus ``equivalent`` (str: ``"dim=a|b; dim2=c|d"``, empty when the
        row stands for one layout) and ``ties`` (layouts in the row).
    """
    along = next(iter(points.dims), "rank")
    n = points.sizes.get(along, 0)
    columns = {name: np.asarray(points[name].values) for name in outputs if name in points}
    groups: dict = {}
    for i in range(n):
        key = tuple(_key(columns[name][i]) for name in columns)
        groups.setdefault(key, []).append(i)
    firsts = [members[0] for members in groups.values()]
    texts, counts = [], []
    values = {d: np.asarray(points[d].values) for d in dims if d in points}
    for members in groups.values():
        parts = []
        for d, column in values.items():
            seen = {_text(column[i]) for i in members}
            if len(seen) > 1:
                listed = [_text(v) for v in order[d] if _text(v) in seen]
                parts.append(f"{d}={'|'.join(listed)}")
        texts.append("; ".join(parts))
        counts.append(len(members))
    result = points.isel({along: np.asarray(firsts, dtype=np.int64)})
    result[EQUIVALENT] = xr.Variable((along,), np.asarray(texts, dtype=str),
                                     {"long_name": "other values of knobs giving the same "
                                                   "outputs (dim=a|b; ...)"})
    result[TIES] = xr.Variable((along,), np.asarray(counts, dtype=np.int64),
                               {"long_name": "layouts with these outputs", "units": "1"})
    if along in result.coords:
        result = result.assign_coords({along: np.arange(1, len(firsts) + 1)})
    return result


def parse_equivalent(text: str) -> dict:
    """``"microbatch_count=1|2; v_stages=1|2"`` -> ``{"microbatch_count": "1|2", ...}``."""
    out = {}
    for part in str(text).split(";"):
        dim, sep, listed = part.strip().partition("=")
        if sep:
            out[dim] = listed
    return out


def _sorted_texts(values) -> list:
    """Distinct values as text, numbers in numeric order, others in order of appearance."""
    distinct = list(dict.fromkeys(values))
    try:
        distinct.sort(key=float)
    except (TypeError, ValueError):
        pass
    return [_text(v) for v in distinct]


def collapse_rows(rows: Sequence[dict], dims: Sequence[str], values: Sequence[str]) -> list:
    """Rows (dicts) equal in every one of ``values`` as one row, like :func:`collapse`.

    For rankings held as rows rather than a dataset (a search's top layouts).
    The first row of each group is kept, in order; each of ``dims`` that differs
    within the group shows every value: ``"1|2|4"``; ``ties`` counts the rows.
    """
    groups: dict = {}
    for row in rows:
        key = tuple(_key(row.get(v)) for v in values)
        groups.setdefault(key, []).append(row)
    out = []
    for members in groups.values():
        first = dict(members[0])
        for d in dims:
            seen = [m[d] for m in members if d in m]
            if len({_text(v) for v in seen}) > 1:
                first[d] = "|".join(_sorted_texts(seen))
        first[TIES] = len(members)
        out.append(first)
    return out
