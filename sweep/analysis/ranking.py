"""Ranking a cube's points: the best ``k``, the best per value of a dim, the Pareto front.

The cube is scanned in blocks of ``block_points`` points along its first dim
(:data:`solver.blocks.BLOCK_POINTS` by default), so a cube opened lazily from
disk is never loaded whole. See :mod:`sweep.analysis` for what the results hold.
"""

from __future__ import annotations

import json
import warnings
from typing import Mapping, Optional

import numpy as np
import xarray as xr

from solver.blocks import BLOCK_POINTS
from solver.outputs import MAXIMIZE, better, objective_names

from .._reader import suggest
from ..pareto import nondominated
from ._aliases import OLD_DIRECTIONS, checked_direction, direction_of, renamed
from .empty import admissible_counts, conditions, explain_empty, tally
from .masks import _check_complete, aligned, mask, require_output
from .scenarios import JOB_DIMS, JobMixWarning, described
from .ties import collapse
from .utilization import warn_across_models, warn_across_precisions

__all__ = ["top_k", "best_along", "pareto_front", "DEFAULT_OBJECTIVES", "BLOCK_POINTS"]

#: Objectives of :func:`pareto_front` by default, with the registry's directions.
DEFAULT_OBJECTIVES = {name: better(name) for name in ("mfu", "n_accelerators",
                                                        "memory_footprint")}


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
        require_output(cube, name, "objective")
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


def _read_slab(variable, key):
    """One read of a (lazily opened) variable: ``variable[key]`` as a numpy array."""
    return np.asarray(variable[key].values)


def _gather(variable, idx, shape, block_points):
    """``variable``'s values at integer positions ``idx`` (one array per dim), over ``shape``.

    A lazily opened variable is read in slabs of about ``block_points`` points
    along its first dim (at least one index of it), only the slabs that hold a
    wanted point and each once: as many reads as slabs at most, whatever the
    number of points (the scans of :func:`_slabs` read the same slabs).
    """
    flat = [np.ravel(np.broadcast_to(i, shape)).astype(np.int64) for i in idx]
    first, n0 = flat[0], variable.shape[0]
    inner = int(np.prod(variable.shape[1:], dtype=np.int64))
    step = max(1, block_points // max(1, inner))
    out = np.empty(len(first), dtype=variable.dtype)
    slab_of = first // step
    order = np.argsort(slab_of, kind="stable")
    for group in np.split(order, np.flatnonzero(np.diff(slab_of[order])) + 1):
        if not len(group):
            continue
        lo = int(slab_of[group[0]]) * step
        slab = _read_slab(variable, (slice(lo, min(lo + step, n0)),))
        out[group] = slab[(first[group] - lo,) + tuple(i[group] for i in flat[1:])]
    return out.reshape(shape)


def _take(cube, dims, index, out_dims, keep_coords=(), block_points=BLOCK_POINTS):
    """Every data variable (and each dim's coordinate) at integer positions.

    ``index`` maps each of ``dims`` to an integer array of one shape, over
    ``out_dims``. Dims in ``keep_coords`` stay coordinates (they are ``out_dims``);
    the others become variables named like the dim. Lazily opened variables are
    read in slabs of ``block_points`` points (see :func:`_gather`).
    """
    shape = np.shape(next(iter(index.values()))) if index else ()
    data_vars = {}
    for d in dims:
        if d in keep_coords:
            continue
        coord = cube[d]
        data_vars[d] = xr.Variable(out_dims, np.asarray(coord.values)[index[d]], coord.attrs)
    for name, var in cube.data_vars.items():
        idx = tuple(index[d] for d in var.dims)
        if not idx:
            values = np.broadcast_to(np.asarray(var.values), shape)
        elif var.variable._in_memory:
            values = np.asarray(var.values)[idx]
        else:  # lazily opened: a slab at a time, never a point at a time
            values = _gather(var.variable, idx, shape, block_points)
        data_vars[name] = xr.Variable(out_dims, np.array(values), var.attrs)
    coords = {d: cube[d].variable for d in keep_coords}
    return xr.Dataset(data_vars, coords=coords, attrs=dict(cube.attrs))


def _points(cube, flat, point_dim, block_points=BLOCK_POINTS):
    dims = _cube_dims(cube)
    shape = tuple(cube.sizes[d] for d in dims)
    positions = np.unravel_index(np.asarray(flat, dtype=np.int64), shape) if dims else ()
    return _take(cube, dims, dict(zip(dims, positions)), (point_dim,), block_points=block_points)


def _aligned_where(cube, where):
    """A DataArray ``where`` aligned with the cube by label (:func:`aligned`), before slicing.

    The blocks slice ``where`` by position like the cube, so it must be on the
    cube's coordinates first; names and ``None`` pass through.
    """
    if isinstance(where, xr.DataArray) and where.dtype == bool:
        return aligned(cube, where)
    return where


def _warn_models(cube, where, *, stacklevel: int = 4) -> None:
    """:func:`warn_across_models` for the physics models a ranking's points span (those
    ``where``, a boolean DataArray over them, keeps any point of)."""
    if "physics" not in cube.dims:
        return
    models = cube["physics"].values
    if isinstance(where, xr.DataArray) and "physics" in where.dims:
        keep = where.any(dim=[d for d in where.dims if d != "physics"])
        models = keep["physics"].values[np.asarray(keep.values, dtype=bool)]
    warn_across_models(models, stacklevel=stacklevel)


def warn_reduced(cube, reduced, where=None, *, stacklevel: int = 3, what: str = "reduction") -> None:
    """Warn where a reduction over the dims ``reduced`` (a best per cell, a plot's cell)
    takes its best across physics models (:class:`ModelMixWarning`, as :func:`_warn_models`
    reads ``where``) or across jobs (:class:`JobMixWarning`: more than one workload, fleet,
    sequence length or global batch), as :func:`top_k` and ``top`` do for a ranking."""
    if "physics" in reduced:
        _warn_models(cube, where, stacklevel=stacklevel + 1)
    jobs = [d for d in reduced if d in JOB_DIMS and d in cube.dims and cube.sizes[d] > 1]
    if jobs:
        first = {d: cube[d].values[0].item() for d in jobs}
        each = "each value is the best" if what == "reduction" else "its best is the best"
        kind, over = described(jobs)
        warnings.warn(f"the {what} spans {' and '.join(jobs)} ({kind}, not a choice "
                      f"between layouts): {each} over {over}; keep "
                      f"{'it' if len(jobs) == 1 else 'them'} (dims=) or select one "
                      f"(cube.sel({', '.join(f'{d}={v!r}' for d, v in first.items())}); on the "
                      f"command line --select {' '.join(f'{d}={v}' for d, v in first.items())})",
                      JobMixWarning, stacklevel=stacklevel)


def _warn_ranking(cube, objectives, where) -> None:
    """The warnings of a ranking over all the cube's points (:func:`top_k`,
    :func:`pareto_front`; stack levels for their caller): a utilization objective across
    precisions, points of more than one physics model (those ``where`` keeps) or job."""
    if "precision" in cube.dims:
        warn_across_precisions(objectives, cube["precision"].values, stacklevel=4)
    _warn_models(cube, where, stacklevel=5)
    warn_reduced(cube, [d for d in _cube_dims(cube) if d != "physics"], stacklevel=4,
                 what="ranking")


def _sign(direction):
    return -1.0 if direction == MAXIMIZE else 1.0


def _block_points(block_points, slab_points) -> int:
    """``block_points``, or its deprecated spelling ``slab_points`` (warned)."""
    return renamed("block_points", block_points, "slab_points", slab_points, BLOCK_POINTS,
                   stacklevel=4)


def _objective(objective, by) -> tuple:
    """``(name, keyword)``: the ranked variable and the keyword that named it."""
    name = renamed("objective", objective, "by", by, "mfu", stacklevel=4)
    return name, ("objective" if by is None else "by")


def top_k(cube: xr.Dataset, objective: str = "mfu", k: int = 10, where=None,
          direction: Optional[str] = None, constraints: Optional[Mapping] = None, *,
          block_points: int = BLOCK_POINTS, allow_partial: bool = False,
          collapse_ties: bool = True, by: Optional[str] = None,
          largest: Optional[bool] = None, slab_points: Optional[int] = None) -> xr.Dataset:
    """The ``k`` best points of ``cube`` by one variable, ties in every output collapsed.

    Parameters
    ----------
    cube : xarray.Dataset
    objective : str
        The data variable to rank by.
    k : int
        How many points (fewer if fewer are selected).
    where, constraints
        Which points count (see :func:`mask`); ``admissible`` by default.
    direction : {"maximize", "minimize"}, optional
        Best first: the largest values (``"maximize"``) or the smallest. By
        default the objective's direction of better in the output registry
        (:func:`solver.outputs.better`), ``"maximize"`` for other variables.
    block_points : int
        Points scanned at a time.
    allow_partial : bool
        Accept a cube that is not finished (``complete = 0``).
    collapse_ties : bool
        Layouts equal in every data variable are one row (the first in C
        order), whose ``equivalent`` lists the other values of the knobs that
        differ (``"microbatch_count=1|2|4|8"``) and ``ties`` counts them
        (:mod:`sweep.analysis.ties`). False lists every layout.
    by, largest, slab_points
        Deprecated spellings of ``objective``, ``direction`` (True:
        ``"maximize"``) and ``block_points``.

    Returns
    -------
    xarray.Dataset
        Along dim ``rank`` (1 = best): each dim's coordinate as a variable and
        every data variable's value (plus ``equivalent`` and ``ties`` when
        ``collapse_ties``). Ties in the objective go to the earlier point (C
        order). With no selected point, ``rank`` is empty and the attribute
        ``why_empty`` says how many points each condition removed and which to
        relax (``empty_counts``: the counts as JSON, see
        :mod:`sweep.analysis.empty`).
    """
    _check_complete(cube, allow_partial)
    where = _aligned_where(cube, where)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a whole number >= 1, but got {k!r}")
    objective, keyword = _objective(objective, by)
    direction = direction_of(objective, direction, largest)
    block_points = _block_points(block_points, slab_points)
    require_output(cube, objective, keyword)
    if cube[objective].dtype == bool:  # a mask ranks nothing (the command line refuses it too)
        raise ValueError(f"{keyword} must be a numeric variable, but got the boolean mask "
                         f"{objective!r} (pass it as where= to select points)")
    _warn_ranking(cube, [objective], where)
    sign = _sign(direction)
    if not collapse_ties:
        best_values, best_flat = _best_flat(cube, objective, sign, k, where, constraints,
                                            block_points)
        result = _points(cube, best_flat, "rank", block_points)
        result = result.assign_coords(rank=np.arange(1, len(best_flat) + 1))
    else:
        result = _distinct(cube, objective, sign, k, where, constraints, block_points)
    if result.sizes.get("rank", 0) == 0:
        result.attrs.update(_why_empty(cube, where, constraints))
    return result


def _best_flat(cube, objective, sign, k, where, constraints, block_points) -> tuple:
    """``(values, flat)`` of the ``k`` best points (values signed to minimize), best first."""
    best_values, best_flat = np.empty(0), np.empty(0, dtype=np.int64)
    for values, flat in _candidates(cube, [objective], [sign], where, constraints,
                                    block_points):
        values = np.concatenate([best_values, values[:, 0]])
        flat = np.concatenate([best_flat, flat])
        if len(values) > k:
            # Keep every point tied with the k-th value, then break ties by position.
            kth = np.partition(values, k - 1)[k - 1]
            keep = values <= kth
            values, flat = values[keep], flat[keep]
        order = np.lexsort((flat, values))[:k]
        best_values, best_flat = values[order], flat[order]
    return best_values, best_flat


def _distinct(cube, objective, sign, k, where, constraints, block_points) -> xr.Dataset:
    """The ``k`` best rows of distinct outputs (:func:`sweep.analysis.ties.collapse`).

    The best ``8 k`` points are fetched, then 4 times more while fewer than
    ``k`` groups are known whole: a group is whole when its objective is
    strictly better than the last point fetched (equal outputs have equal
    objectives), or when every selected point was fetched.
    """
    dims = _cube_dims(cube)
    outputs = list(cube.data_vars)
    order = {d: np.asarray(cube[d].values) for d in dims}
    fetch = 8 * k
    while True:
        values, flat = _best_flat(cube, objective, sign, fetch, where, constraints, block_points)
        exhausted = len(flat) < fetch
        if not exhausted:  # drop the points tied with the last one: their group may go on
            whole = values < values[-1]
            values, flat = values[whole], flat[whole]
        points = _points(cube, flat, "rank", block_points).assign_coords(rank=np.arange(1, len(flat) + 1))
        result = collapse(points, dims, outputs, order)
        if exhausted or result.sizes["rank"] >= k:
            return result.isel(rank=slice(0, k))
        fetch *= 4


def _why_empty(cube, where, constraints) -> dict:
    """Attributes of an empty answer: ``why_empty`` (text) and ``empty_counts`` (JSON)."""
    counts = admissible_counts(cube, where, constraints)
    return {"why_empty": explain_empty(counts), "empty_counts": json.dumps(counts)}


def best_along(cube: xr.Dataset, dims, objective: str = "mfu", where=None,
               direction: Optional[str] = None, constraints: Optional[Mapping] = None, *,
               block_points: int = BLOCK_POINTS, allow_partial: bool = False,
               by: Optional[str] = None, largest: Optional[bool] = None,
               slab_points: Optional[int] = None) -> xr.Dataset:
    """The best point for each value of ``dims``, the other dims reduced by argmax.

    Parameters
    ----------
    cube : xarray.Dataset
    dims : str or sequence of str
        The dims to keep (e.g. ``"seq_len"``).
    objective : str
        The data variable to optimize.
    where, constraints
        Which points count (see :func:`mask`); ``admissible`` by default.
    direction : {"maximize", "minimize"}, optional
        By default the objective's direction of better (see :func:`top_k`).
    block_points : int
        Points scanned at a time.
    allow_partial : bool
        Accept a cube that is not finished (``complete = 0``).
    by, largest, slab_points
        Deprecated spellings of ``objective``, ``direction`` and ``block_points``.

    Returns
    -------
    xarray.Dataset
        Over ``dims``: the best point's other coordinates as variables, every
        data variable's value there, and ``found`` (False where no point of
        that slice is selected; the other variables are then masked: NaN).
        Where some slice has none, ``why_not_found`` says for each such slice
        how many of its points each condition removed and which to relax
        (:func:`sweep.analysis.explain_empty`; "" where found). With no
        selected point at all, the attribute ``why_empty`` says why for the
        whole cube (see :func:`top_k`).
    """
    _check_complete(cube, allow_partial)
    where = _aligned_where(cube, where)
    objective, keyword = _objective(objective, by)
    direction = direction_of(objective, direction, largest)
    block_points = _block_points(block_points, slab_points)
    dims = (dims,) if isinstance(dims, str) else tuple(dims)
    all_dims = _cube_dims(cube)
    for d in dims:
        if d not in all_dims:
            raise KeyError(f"dims must be dims of the cube ({', '.join(all_dims)}), "
                           f"but got {d!r}")
    require_output(cube, objective, keyword)
    others = tuple(d for d in all_dims if d not in dims)
    warn_reduced(cube, others, where)
    if "precision" in others:
        warn_across_precisions([objective], cube["precision"].values)
    order = dims + others
    group_shape = tuple(cube.sizes[d] for d in dims)
    groups = int(np.prod(group_shape, dtype=np.int64))
    best = np.full(groups, np.inf)
    best_at = np.zeros((groups, len(others)), dtype=np.int64)
    found = np.zeros(groups, dtype=bool)
    sign = _sign(direction)

    if others:
        d0 = others[0]
        inner = int(np.prod([cube.sizes[d] for d in others[1:]], dtype=np.int64)) * groups
        step = max(1, block_points // max(1, inner))
        ranges = [(lo, min(lo + step, cube.sizes[d0])) for lo in range(0, cube.sizes[d0], step)]
    else:
        ranges = [(0, 0)]

    def blocks():
        """``(sub, sub_where)`` of each block of ``ranges``, along the first of ``others``."""
        for lo, hi in ranges:
            yield ((cube.isel({others[0]: slice(lo, hi)}) if others else cube),
                   (where.isel({others[0]: slice(lo, hi)})
                    if others and isinstance(where, xr.DataArray) and others[0] in where.dims
                    else where))

    for (lo, hi), (sub, sub_where) in zip(ranges, blocks()):
        selected = _full(mask(sub, sub_where, constraints), sub.sizes, order).reshape(groups, -1)
        score = sign * _full(sub[objective], sub.sizes, order).reshape(groups, -1).astype(np.float64)
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
    result = _take(cube, all_dims, index, dims, keep_coords=dims, block_points=block_points)
    found = found.reshape(group_shape)
    if not found.all():
        result = result.where(xr.DataArray(found, dims=dims))
    result["found"] = xr.Variable(dims, found, {"long_name": "some point of the slice is selected"})
    if not found.all():
        result["why_not_found"] = xr.Variable(dims, _why_slices(cube, where, constraints, blocks,
                                                                order, found), {
            "long_name": "why no point of the slice is selected (empty where one is)"})
    if not found.any():
        result.attrs.update(_why_empty(cube, where, constraints))
    return result


def _why_slices(cube, where, constraints, blocks, order, found) -> np.ndarray:
    """:func:`explain_empty` of each slice of :func:`best_along` with no selected point
    ("" where one is): how many of its points each condition removed and which to relax.

    One more scan of the cube in the same ``blocks`` (a lazily opened cube is read slab by
    slab again, not slice by slice), counting each condition of :func:`conditions` per
    slice: the counts :func:`admissible_counts` gives the slice, without its sentence on
    the realizable rules (ask it of ``cube.sel(...)`` for that).
    """
    groups = found.size
    total = np.zeros(groups, dtype=np.int64)
    removed, relaxed = {}, {}
    for sub, sub_where in blocks():
        named = {name: _full(c, sub.sizes, order).reshape(groups, -1)
                 for name, c in conditions(sub, sub_where, constraints).items()}
        each = int(np.prod([sub.sizes[d] for d in order], dtype=np.int64)) // groups
        total += each
        block_removed, block_relaxed, _ = tally(named, lambda kept: kept.sum(axis=1),
                                                np.full(groups, each, dtype=np.int64))
        for name in named:
            removed[name] = removed.get(name, 0) + block_removed[name]
            relaxed[name] = relaxed.get(name, 0) + block_relaxed[name]
    why = np.full(groups, "", dtype=object)
    for g in np.flatnonzero(~found.ravel()):
        why[g] = explain_empty({"total": int(total[g]),
                                "removed": {k: int(v[g]) for k, v in removed.items()},
                                "relaxed": {k: int(v[g]) for k, v in relaxed.items()}})
    return why.reshape(found.shape).astype(str)


def _objectives(objectives) -> dict:
    """``objectives`` (default :data:`DEFAULT_OBJECTIVES`) with optuna's direction words; a
    list of names takes each output's own direction of better."""
    if isinstance(objectives, (list, tuple)):
        names = list(objectives)
        for name in names:
            if not isinstance(name, str):
                raise ValueError(f"objectives: expected output names or a dict of name -> "
                                 f"'maximize' / 'minimize', but got {objectives!r}")
        undirected = [n for n in names if n not in objective_names()]
        if undirected:
            raise ValueError(
                f"objectives: {undirected[0]!r} is no output with a direction of better; give a dict "
                f"such as {{{undirected[0]!r}: 'maximize', ...}} (outputs with one: "
                f"{', '.join(objective_names())}){suggest(undirected[0], objective_names())}")
        objectives = {name: better(name) for name in names}
    objectives = dict(DEFAULT_OBJECTIVES if objectives is None else objectives)
    if len(objectives) < 2:
        raise ValueError(f"objectives must name at least 2 variables, but got {objectives!r}")
    old_words = any(isinstance(v, str) and v in OLD_DIRECTIONS for v in objectives.values())
    checked = {}
    for name, value in objectives.items():
        checked[name] = checked_direction(value, f"objectives[{name!r}]", old_words=old_words,
                                          stacklevel=4)
    return checked


def _front(values):
    """Indices of the non-dominated rows of ``values`` (minimize), by :mod:`sweep.pareto`."""
    return np.flatnonzero(nondominated(values))


def pareto_front(cube: xr.Dataset, objectives: Optional[Mapping] = None, where=None,
                 constraints: Optional[Mapping] = None, *,
                 block_points: int = BLOCK_POINTS, allow_partial: bool = False,
                 slab_points: Optional[int] = None) -> xr.Dataset:
    """The Pareto-optimal points of ``cube`` over 2 or 3 (or more) objectives.

    Parameters
    ----------
    cube : xarray.Dataset
    objectives : mapping of str -> "maximize" or "minimize", or a list of output names
        Data variables and their directions (a list: each output's own direction of
        better, e.g. ``["mfu", "memory_footprint"]``); by default :data:`DEFAULT_OBJECTIVES`
        (``mfu`` maximized, ``n_accelerators`` and ``memory_footprint``
        minimized). ``"max"`` and ``"min"`` are deprecated spellings.
    where, constraints
        Which points count (see :func:`mask`); ``admissible`` by default.
    block_points : int
        Points scanned at a time.
    allow_partial : bool
        Accept a cube that is not finished (``complete = 0``).
    slab_points
        Deprecated spelling of ``block_points``.

    Returns
    -------
    xarray.Dataset
        Along dim ``point``, sorted by the first objective (best first): every
        point no other selected point dominates (at least as good in every
        objective, better in one). Points with equal objectives are all kept.
        Each dim's coordinate is a variable; every data variable's value.
        With no selected point, ``why_empty`` says why (see :func:`top_k`).

    Notes
    -----
    Two objectives: one sort and a running minimum, O(n log n). More: a sweep
    in lexicographic order against the front so far, O(n * front size). Each
    slab's own front is found first, so only its members meet the others.
    """
    _check_complete(cube, allow_partial)
    where = _aligned_where(cube, where)
    slab_points = _block_points(block_points, slab_points)
    objectives = _objectives(objectives)
    names = list(objectives)
    _warn_ranking(cube, names, where)
    signs = [_sign(objectives[n]) for n in names]
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
    result = _points(cube, flat[order], "point", slab_points)
    if not len(flat):
        result.attrs.update(_why_empty(cube, where, constraints))
    return result
