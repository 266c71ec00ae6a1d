"""Questions to a cube: the best layouts, the best per value of a dim, the Pareto front.

Every function works on the points a mask selects: by default ``admissible``
(valid, within the memory limit and ``max_accelerators``; see :mod:`sweep.cube`),
or the boolean variable or DataArray given as ``where``, further narrowed by
``constraints``:

``memory_limit``
    ``"72 GB"``, bytes, or a fraction of the accelerator's memory (<= 1), on
    ``memory_footprint``.
``max_accelerators``
    On ``n_accelerators``.
``<variable>``
    ``(low, high)`` bounds on any data variable (``None`` for an open side),
    e.g. ``{"step_latency_total": (None, 2.0)}``.

The cube is scanned in slabs along its first dim, so a cube opened lazily
from disk (:func:`sweep.open_cube`) is never loaded whole. Results are small
:class:`xarray.Dataset` s: the point's coordinates as variables (named like the
dims, i.e. like the ``solver.solve`` keywords) and every data variable's value.

A cube that says it is not finished (``complete = 0``: an interrupted sweep
opened with ``sweep.open_cube(..., allow_partial=True)``, whose unpriced points
are NaN and never admissible) is refused unless ``allow_partial=True``: an
answer from part of the space is then asked for, not stumbled upon.
"""

from __future__ import annotations

import json
from typing import Mapping, Optional

import numpy as np
import xarray as xr

from solver.units import parse_quantity

from .cube import COMPLETE
from .pareto import nondominated
from .storage import IncompleteCubeError

__all__ = ["top_k", "best_along", "pareto_front", "mask", "SLAB_POINTS",
           "DEFAULT_OBJECTIVES"]

#: Points loaded at a time when scanning a cube.
SLAB_POINTS = 1 << 24
#: Objectives of :func:`pareto_front` by default.
DEFAULT_OBJECTIVES = {"mfu": "max", "n_accelerators": "min", "memory_footprint": "min"}
_SENSES = ("max", "min")


def _check_complete(cube, allow_partial: bool) -> None:
    """Refuse a cube marked unfinished (``complete = 0``) unless ``allow_partial``."""
    if allow_partial or COMPLETE not in cube.attrs:
        return
    flag = cube.attrs[COMPLETE]
    try:
        finished = int(flag) == 1
    except (TypeError, ValueError):
        finished = False
    if not finished:
        raise IncompleteCubeError(
            f"expected a finished cube ({COMPLETE} = 1), but got {COMPLETE} = {flag!r}: an "
            f"unfinished sweep whose unpriced points are left out; finish it "
            f"(sweep.run(spec, path=..., resume=True)) or pass allow_partial=True to ask about "
            f"the points priced so far")


def _require(cube, name, what):
    if name not in cube.data_vars:
        raise KeyError(f"{what} must be a data variable of the cube "
                       f"({', '.join(cube.data_vars)}), but got {name!r}")
    return cube[name]


def _capacities(cube):
    """Accelerator memory [B] per fleet, from the cube's ``fleets`` attribute."""
    try:
        fleets = json.loads(cube.attrs["fleets"])
    except (KeyError, ValueError):
        raise ValueError("memory_limit as a fraction needs the cube's 'fleets' attribute "
                         "(a cube made by sweep.run); give it in bytes or as '72 GB'") from None
    capacity = {k: v["node"]["accelerator"]["memory_capacity"] for k, v in fleets.items()}
    if "fleet" in cube.dims:
        return xr.DataArray([capacity[str(f)] for f in cube["fleet"].values], dims="fleet",
                            coords={"fleet": cube["fleet"].values})
    return next(iter(capacity.values()))


def _memory_limit(cube, value):
    if isinstance(value, str):
        return parse_quantity(value, "bytes", where="constraints.memory_limit")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"constraints.memory_limit must be a size such as '72 GB', bytes, "
                         f"or a fraction of capacity in (0, 1], but got {value!r}")
    return value * _capacities(cube) if value <= 1 else float(value)


def mask(cube: xr.Dataset, where=None, constraints: Optional[Mapping] = None) -> xr.DataArray:
    """The boolean mask of the points an analysis considers.

    Parameters
    ----------
    cube : xarray.Dataset
    where : str or xarray.DataArray, optional
        A boolean variable's name or a boolean DataArray; ``admissible`` (or
        ``valid``) by default.
    constraints : mapping, optional
        See the module docstring.
    """
    if where is None:
        where = "admissible" if "admissible" in cube.data_vars else "valid"
    if isinstance(where, str):
        where = _require(cube, where, "where")
    if not isinstance(where, xr.DataArray) or where.dtype != bool:
        raise TypeError(f"where must name a boolean variable or be a boolean DataArray, "
                        f"but got {getattr(where, 'dtype', type(where).__name__)}")
    selected = where
    for key, value in (constraints or {}).items():
        if key == "memory_limit":
            var = _require(cube, "memory_footprint", "memory_limit's variable")
            selected = selected & (var <= _memory_limit(cube, value))
        elif key == "max_accelerators":
            var = _require(cube, "n_accelerators", "max_accelerators's variable")
            selected = selected & (var <= value)
        elif key in cube.data_vars:
            if not (isinstance(value, (tuple, list)) and len(value) == 2):
                raise ValueError(f"constraints.{key} must be (low, high) bounds (None for an "
                                 f"open side), but got {value!r}")
            low, high = value
            if low is not None:
                selected = selected & (cube[key] >= low)
            if high is not None:
                selected = selected & (cube[key] <= high)
        else:
            raise KeyError(f"constraints: expected memory_limit, max_accelerators or a data "
                           f"variable ({', '.join(cube.data_vars)}), but got {key!r}")
    return selected


def _cube_dims(cube) -> tuple:
    """All dims in the order of the cube's widest data variable."""
    widest = max(cube.data_vars.values(), key=lambda v: v.ndim, default=None)
    first = tuple(widest.dims) if widest is not None else ()
    return first + tuple(d for d in cube.dims if d not in first)


def _full(array, sizes, dims):
    """``array`` (DataArray) as a numpy array over ``dims`` (broadcast, maybe a view)."""
    missing = {d: sizes[d] for d in dims if d not in array.dims}
    if missing:
        array = array.expand_dims(missing)
    return np.asarray(array.transpose(*dims).values)


def _slabs(cube, dims, where, slab_points):
    """``(offset, slab, where_slab)`` along the first of ``dims``."""
    if not dims:
        yield 0, cube, where
        return
    d0 = dims[0]
    inner = int(np.prod([cube.sizes[d] for d in dims[1:]], dtype=np.int64))
    step = max(1, slab_points // max(1, inner))
    for lo in range(0, cube.sizes[d0], step):
        index = {d0: slice(lo, lo + step)}
        sub_where = (where.isel({d0: index[d0]}) if isinstance(where, xr.DataArray)
                     and d0 in where.dims else where)
        yield lo * inner, cube.isel(index), sub_where


def _candidates(cube, names, signs, where, constraints, slab_points):
    """Objective values (to minimize) and flat indices of the selected, non-NaN points.

    Yields one ``(values (n, len(names)), flat (n,))`` pair per slab.
    """
    dims = _cube_dims(cube)
    for name in names:
        _require(cube, name, "objective")
    for offset, sub, sub_where in _slabs(cube, dims, where, slab_points):
        sizes = sub.sizes
        selected = _full(mask(sub, sub_where, constraints), sizes, dims).ravel()
        flat = np.flatnonzero(selected)
        columns = []
        for name, sign in zip(names, signs):
            values = _full(sub[name], sizes, dims).ravel()[flat].astype(np.float64)
            columns.append(values if sign > 0 else -values)
        values = np.stack(columns, axis=1) if columns else np.empty((len(flat), 0))
        finite = ~np.isnan(values).any(axis=1)
        yield values[finite], flat[finite] + offset


def _take(cube, dims, index, out_dims, keep_coords=()):
    """Every data variable (and each dim's coordinate) at integer positions.

    ``index`` maps each of ``dims`` to an integer array of one shape, over
    ``out_dims``. Dims in ``keep_coords`` stay coordinates (they are ``out_dims``);
    the others become variables named like the dim.
    """
    shape = np.shape(next(iter(index.values()))) if index else ()
    data_vars = {}
    for d in dims:
        if d in keep_coords:
            continue
        coord = cube[d]
        data_vars[d] = xr.Variable(out_dims, np.asarray(coord.values)[index[d]], coord.attrs)
    count = int(np.prod(shape, dtype=np.int64))
    for name, var in cube.data_vars.items():
        idx = tuple(index[d] for d in var.dims)
        if var.variable._in_memory:
            values = np.asarray(var.values)[idx] if idx else np.broadcast_to(var.values, shape)
        else:  # lazily opened: read the points one by one, never the bounding box
            flat_idx = [np.ravel(i) for i in idx]
            values = np.array([var.variable[tuple(int(i[j]) for i in flat_idx)].values
                               for j in range(count)], dtype=var.dtype).reshape(shape)
        data_vars[name] = xr.Variable(out_dims, np.array(values), var.attrs)
    coords = {d: cube[d].variable for d in keep_coords}
    return xr.Dataset(data_vars, coords=coords, attrs=dict(cube.attrs))


def _points(cube, flat, point_dim):
    dims = _cube_dims(cube)
    shape = tuple(cube.sizes[d] for d in dims)
    positions = np.unravel_index(np.asarray(flat, dtype=np.int64), shape) if dims else ()
    return _take(cube, dims, dict(zip(dims, positions)), (point_dim,))


def _sign(largest):
    return -1.0 if largest else 1.0


def top_k(cube: xr.Dataset, by: str = "mfu", k: int = 10, where=None, largest: bool = True,
          constraints: Optional[Mapping] = None, *, slab_points: int = SLAB_POINTS,
          allow_partial: bool = False) -> xr.Dataset:
    """The ``k`` best points of ``cube`` by one variable.

    Parameters
    ----------
    cube : xarray.Dataset
    by : str
        The data variable to rank by.
    k : int
        How many points (fewer if fewer are selected).
    where, constraints
        Which points count (see :func:`mask`); ``admissible`` by default.
    largest : bool
        Rank the largest values first (False: the smallest).
    allow_partial : bool
        Accept a cube that is not finished (``complete = 0``).

    Returns
    -------
    xarray.Dataset
        Along dim ``rank`` (1 = best): each dim's coordinate as a variable and
        every data variable's value. Ties go to the earlier point (C order).
    """
    _check_complete(cube, allow_partial)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a whole number >= 1, but got {k!r}")
    _require(cube, by, "by")
    best_values, best_flat = np.empty(0), np.empty(0, dtype=np.int64)
    for values, flat in _candidates(cube, [by], [_sign(largest)], where, constraints,
                                    slab_points):
        values = np.concatenate([best_values, values[:, 0]])
        flat = np.concatenate([best_flat, flat])
        if len(values) > k:
            # Keep every point tied with the k-th value, then break ties by position.
            kth = np.partition(values, k - 1)[k - 1]
            keep = values <= kth
            values, flat = values[keep], flat[keep]
        order = np.lexsort((flat, values))[:k]
        best_values, best_flat = values[order], flat[order]
    result = _points(cube, best_flat, "rank")
    return result.assign_coords(rank=np.arange(1, len(best_flat) + 1))


def best_along(cube: xr.Dataset, dims, by: str = "mfu", where=None, largest: bool = True,
               constraints: Optional[Mapping] = None, *,
               slab_points: int = SLAB_POINTS, allow_partial: bool = False) -> xr.Dataset:
    """The best point for each value of ``dims``, the other dims reduced by argmax.

    Parameters
    ----------
    cube : xarray.Dataset
    dims : str or sequence of str
        The dims to keep (e.g. ``"seq_len"``).
    by : str
        The data variable to maximize (``largest=False``: minimize).
    where, constraints
        Which points count (see :func:`mask`); ``admissible`` by default.
    allow_partial : bool
        Accept a cube that is not finished (``complete = 0``).

    Returns
    -------
    xarray.Dataset
        Over ``dims``: the best point's other coordinates as variables, every
        data variable's value there, and ``found`` (False where no point of
        that slice is selected; the other variables are then masked: NaN).
    """
    _check_complete(cube, allow_partial)
    dims = (dims,) if isinstance(dims, str) else tuple(dims)
    all_dims = _cube_dims(cube)
    for d in dims:
        if d not in all_dims:
            raise KeyError(f"dims must be dims of the cube ({', '.join(all_dims)}), "
                           f"but got {d!r}")
    _require(cube, by, "by")
    others = tuple(d for d in all_dims if d not in dims)
    order = dims + others
    group_shape = tuple(cube.sizes[d] for d in dims)
    groups = int(np.prod(group_shape, dtype=np.int64))
    best = np.full(groups, np.inf)
    best_at = np.zeros((groups, len(others)), dtype=np.int64)
    found = np.zeros(groups, dtype=bool)
    sign = _sign(largest)

    if others:
        d0 = others[0]
        inner = int(np.prod([cube.sizes[d] for d in others[1:]], dtype=np.int64)) * groups
        step = max(1, slab_points // max(1, inner))
        ranges = [(lo, min(lo + step, cube.sizes[d0])) for lo in range(0, cube.sizes[d0], step)]
    else:
        ranges = [(0, 0)]
    for lo, hi in ranges:
        sub = cube.isel({others[0]: slice(lo, hi)}) if others else cube
        sub_where = (where.isel({others[0]: slice(lo, hi)})
                     if others and isinstance(where, xr.DataArray) and others[0] in where.dims
                     else where)
        selected = _full(mask(sub, sub_where, constraints), sub.sizes, order).reshape(groups, -1)
        score = sign * _full(sub[by], sub.sizes, order).reshape(groups, -1).astype(np.float64)
        score = np.where(selected & ~np.isnan(score), score, np.inf)
        at = np.argmin(score, axis=1)
        slab_best = score[np.arange(groups), at]
        better = slab_best < best
        best[better] = slab_best[better]
        found |= better
        if others:
            local = np.unravel_index(at[better], tuple(sub.sizes[d] for d in others))
            best_at[better] = np.stack(local, axis=1) + np.array([lo] + [0] * (len(others) - 1))

    index = {d: i.reshape(group_shape) for d, i in zip(
        dims, np.unravel_index(np.arange(groups), group_shape))}
    index.update({d: best_at[:, n].reshape(group_shape) for n, d in enumerate(others)})
    result = _take(cube, all_dims, index, dims, keep_coords=dims)
    found = found.reshape(group_shape)
    if not found.all():
        result = result.where(xr.DataArray(found, dims=dims))
    result["found"] = xr.Variable(dims, found, {"long_name": "some point of the slice is selected"})
    return result


def _front(values):
    """Indices of the non-dominated rows of ``values`` (minimize), by :mod:`sweep.pareto`."""
    return np.flatnonzero(nondominated(values))


def pareto_front(cube: xr.Dataset, objectives: Optional[Mapping] = None, where=None,
                 constraints: Optional[Mapping] = None, *,
                 slab_points: int = SLAB_POINTS, allow_partial: bool = False) -> xr.Dataset:
    """The Pareto-optimal points of ``cube`` over 2 or 3 (or more) objectives.

    Parameters
    ----------
    cube : xarray.Dataset
    objectives : mapping of str -> "max" or "min"
        Data variables and their senses; by default :data:`DEFAULT_OBJECTIVES`
        (``mfu`` up, ``n_accelerators`` and ``memory_footprint`` down).
    where, constraints
        Which points count (see :func:`mask`); ``admissible`` by default.
    allow_partial : bool
        Accept a cube that is not finished (``complete = 0``).

    Returns
    -------
    xarray.Dataset
        Along dim ``point``, sorted by the first objective (best first): every
        point no other selected point dominates (at least as good in every
        objective, better in one). Points with equal objectives are all kept.
        Each dim's coordinate is a variable; every data variable's value.

    Notes
    -----
    Two objectives: one sort and a running minimum, O(n log n). More: a sweep
    in lexicographic order against the front so far, O(n * front size). Each
    slab's own front is found first, so only its members meet the others.
    """
    _check_complete(cube, allow_partial)
    objectives = dict(DEFAULT_OBJECTIVES if objectives is None else objectives)
    if len(objectives) < 2:
        raise ValueError(f"objectives must name at least 2 variables, but got {objectives!r}")
    for name, sense in objectives.items():
        if sense not in _SENSES:
            raise ValueError(f"objectives[{name!r}] must be 'max' or 'min', but got {sense!r}")
    names = list(objectives)
    signs = [-1.0 if objectives[n] == "max" else 1.0 for n in names]
    all_values, all_flat = [], []
    for values, flat in _candidates(cube, names, signs, where, constraints, slab_points):
        keep = _front(values)
        all_values.append(values[keep])
        all_flat.append(flat[keep])
    values = np.concatenate(all_values) if all_values else np.empty((0, len(names)))
    flat = np.concatenate(all_flat) if all_flat else np.empty(0, dtype=np.int64)
    keep = _front(values)
    values, flat = values[keep], flat[keep]
    order = np.lexsort((flat,) + tuple(values[:, i] for i in reversed(range(len(names)))))
    return _points(cube, flat[order], "point")
