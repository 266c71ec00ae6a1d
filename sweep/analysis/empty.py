"""Why an answer is empty: how many points each condition removed, and which to relax.

An analysis with no admissible point says why instead of answering nothing:

    >>> counts = admissible_counts(cube, constraints={"max_accelerators": 512})  # doctest: +SKIP
    >>> print(explain_empty(counts))                                           # doctest: +SKIP
    no admissible layout among 64 points: valid split removed 16, fits memory removed 0,
    accelerator budget (<= 512) removed 48; relax accelerator budget (<= 512): 48 layouts
    pass every other condition

``counts`` is a plain mapping, so that a search (which prices points one by one
rather than holding a cube) can build it too and reuse :func:`explain_empty`:

``total``
    Points considered.
``removed``
    Condition -> points it removed, the conditions applied in order (each counts
    only the points the earlier ones kept), so they sum to ``total`` when nothing
    is left.
``relaxed`` (optional)
    Condition -> points that pass every *other* condition: what dropping (or
    relaxing) that condition alone would give back.
"""

from __future__ import annotations

from typing import Mapping, Optional

import numpy as np
import xarray as xr

__all__ = ["NoAdmissibleError", "admissible_counts", "explain_empty", "conditions"]

#: Names of the conditions of ``admissible``, as the explanation says them.
VALID, FEASIBLE, LIMIT, BUDGET, REALIZABLE = ("valid split", "fits memory", "within the memory "
                                              "limit", "accelerator budget", "realizable")


class NoAdmissibleError(ValueError):
    """No point passes the conditions asked for; ``counts`` says how many each removed.

    The message is :func:`explain_empty` of ``counts`` (see :mod:`sweep.analysis.empty`).
    """

    def __init__(self, counts: Mapping, what: str = "layout"):
        self.counts = dict(counts)
        super().__init__(explain_empty(counts, what))


def _budget(cube) -> Optional[float]:
    """The spec's ``max_accelerators`` recorded in the cube, if any."""
    value = cube.attrs.get("max_accelerators")
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def conditions(cube: xr.Dataset, where=None, constraints: Optional[Mapping] = None) -> dict:
    """The conditions an analysis applies, in order: name -> boolean DataArray.

    ``where`` by default (or ``"admissible"``) is taken apart into the cube's own
    conditions: valid split, fits memory (``feasible``), within the memory limit
    (``within_memory_limit``), the spec's accelerator budget, realizable (when
    the cube has that mask). Any other ``where`` is one condition. Then each of
    ``constraints`` (see :func:`sweep.analysis.mask`) is one more.
    """
    from .masks import mask

    out = {}
    if where is None:
        where = "admissible" if "admissible" in cube.data_vars else "valid"
    if isinstance(where, str) and where == "admissible":
        out.update(_parts_of_admissible(cube))
    else:
        name = where if isinstance(where, str) else "the where mask"
        out[f"where={name}" if isinstance(where, str) else name] = mask(cube, where)
    for key, value in (constraints or {}).items():
        every = xr.DataArray(True)
        label = {"memory_limit": f"memory limit ({_describe_limit(value)})",
                 "max_accelerators": f"{BUDGET} (<= {value})"}.get(key, f"{key} in {value!r}")
        out[label] = mask(cube, every, {key: value})
    return out


def _parts_of_admissible(cube) -> dict:
    """``admissible`` taken apart into the cube's named conditions (name -> DataArray).

    A condition ``admissible`` does not imply (``feasible`` when the limit is above
    the capacity) is left out; whatever ``admissible`` holds beyond the named
    ones (a condition added later) is one more, so that the counts stay right.
    """
    admissible = cube["admissible"]
    parts = {name: cube[var] for name, var in ((VALID, "valid"), (FEASIBLE, "feasible"),
                                               (LIMIT, "within_memory_limit"),
                                               (REALIZABLE, "realizable"))
             if var in cube.data_vars}
    budget = _budget(cube)
    if budget is not None and "n_accelerators" in cube.data_vars:
        parts[f"{BUDGET} (<= {budget:g}, the spec's)"] = cube["n_accelerators"] <= budget
    parts = {name: c for name, c in parts.items() if not bool((admissible & ~c).any())}
    every = xr.DataArray(True)
    for condition in parts.values():
        every = every & condition
    if bool((every & ~admissible).any()):
        parts["admissible (its other conditions)"] = admissible
    return parts


def _describe_limit(value) -> str:
    from ..limits import parse_memory_limit

    try:
        return parse_memory_limit(value, where="").describe()
    except ValueError:
        return repr(value)


def _count(array, sizes) -> int:
    """True points of ``array`` over a cube of ``sizes`` (dims it lacks broadcast)."""
    missing = int(np.prod([n for d, n in sizes.items() if d not in array.dims], dtype=np.int64))
    return int(array.sum()) * missing


def admissible_counts(cube: xr.Dataset, where=None, constraints: Optional[Mapping] = None) -> dict:
    """How many points each condition removes, and what relaxing each gives back.

    Parameters
    ----------
    cube : xarray.Dataset
    where, constraints
        As for :func:`sweep.analysis.mask`.

    Returns
    -------
    dict
        ``total``, ``removed`` and ``relaxed``, as described in
        :mod:`sweep.analysis.empty`; plus ``admissible`` (points left).
    """
    sizes = dict(cube.sizes)
    total = int(np.prod(list(sizes.values()), dtype=np.int64))
    named = conditions(cube, where, constraints)
    removed, relaxed = {}, {}
    kept = xr.DataArray(True)
    for name, condition in named.items():
        before = _count(kept, sizes) if kept.ndim else total
        kept = kept & condition
        removed[name] = before - _count(kept, sizes)
    for name in named:
        others = xr.DataArray(True)
        for other, condition in named.items():
            if other != name:
                others = others & condition
        relaxed[name] = _count(others, sizes) if others.ndim else total
    return {"total": total, "removed": removed, "relaxed": relaxed,
            "admissible": _count(kept, sizes) if kept.ndim else total}


def explain_empty(counts: Mapping, what: str = "layout") -> str:
    """One paragraph: no admissible ``what``, how many points each condition removed, what to relax.

    Parameters
    ----------
    counts : mapping
        ``total``, ``removed`` and optionally ``relaxed`` (see
        :mod:`sweep.analysis.empty`).
    what : str
        What the points are (``"layout"``, ``"trial"``).

    Returns
    -------
    str
    """
    total = int(counts.get("total", 0))
    removed = {k: int(v) for k, v in dict(counts.get("removed", {})).items()}
    if total == 0:
        return f"no admissible {what}: there are no points to consider (an empty selection)"
    shown = [f"{name} removed {n:,}" for name, n in removed.items()]
    text = f"no admissible {what} among {total:,} points: " + (", ".join(shown) or "none removed")
    relaxed = {k: int(v) for k, v in dict(counts.get("relaxed", {})).items() if int(v) > 0}
    # The split and the accelerator's memory are physics, not a limit: widen the axes instead.
    choices = {k: v for k, v in relaxed.items() if k not in (VALID, FEASIBLE)}
    if choices:
        best = max(choices, key=lambda k: choices[k])
        n = choices[best]
        verb = f"{what}s pass" if n != 1 else f"{what} passes"
        text += f"; relax {best}: {n:,} {verb} every other condition"
    elif relaxed or removed:
        text += ("; no limit relaxed alone gives a point: widen the axes (splits, ZeRO stages, "
                 "recomputation) or relax two or more")
    return text
