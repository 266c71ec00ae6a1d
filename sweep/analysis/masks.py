"""Which points an analysis considers: a boolean mask narrowed by constraints.

``mask(cube, where, constraints)`` starts from ``where`` (``admissible`` by
default) and narrows it by ``memory_limit`` (through the one memory-limit
parser, :func:`sweep.limits.parse_memory_limit`), ``max_accelerators``, and
``(low, high)`` bounds on any data variable.

A mask given as a DataArray is read by its coordinates, never by position
(:func:`aligned`): ``where=cube.admissible.sel(tp_size=[4, 8])`` selects the
points with tp_size 4 or 8, and the points it does not cover are not selected.
"""

from __future__ import annotations

import difflib
import json
from typing import Mapping, Optional

import numpy as np
import xarray as xr

from solver.outputs import REGISTRY, outputs_of
from solver.physics import PHYSICS

from ..cube import COMPLETE
from ..limits import MemoryLimitError, parse_memory_limit
from ..storage import IncompleteCubeError

__all__ = ["mask", "aligned"]


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


class UnknownVariableError(KeyError):
    """A name that is no data variable of the cube (a KeyError whose message reads as written)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _require(cube, name, what):
    if name not in cube.data_vars:
        names = [str(v) for v in cube.data_vars]
        close = [v for v in names if v.lower() == str(name).lower()][:1]  # MFU for mfu
        close = close or difflib.get_close_matches(str(name), names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UnknownVariableError(f"{what} must be a data variable of the cube "
                                   f"({', '.join(cube.data_vars)}), but got {name!r}{hint}")
    return cube[name]


def models_of(cube) -> Optional[list]:
    """The physics models whose points ``cube`` (or a selection of it) holds, sorted; None
    where the cube does not say (a cube made by hand)."""
    if "physics" in cube.coords:
        return sorted({str(v) for v in np.atleast_1d(cube["physics"].values)})
    if cube.attrs.get("physics"):
        return [str(cube.attrs["physics"])]
    try:
        return sorted(json.loads(cube.attrs["physics_models"]))
    except (KeyError, ValueError, TypeError):
        return None


def require_output(cube, name, what):
    """:func:`_require`, and refuse an output none of the cube's points' physics models
    produce: a cube of both models holds each model's own outputs as NaN over the other's
    points, so ranking one model's points by the other's output selects nothing, and the
    reason would read as if no layout were admissible."""
    var = _require(cube, name, what)
    models = models_of(cube)
    if name not in REGISTRY or not models:
        return var
    try:
        producing = [m for m in models if name in outputs_of(m)]
    except ValueError:  # a model this version does not know: nothing to check against
        return var
    if not producing:
        owners = [m for m in PHYSICS if name in outputs_of(m)]
        raise UnknownVariableError(
            f"{what} {name!r} is an output of the {' and '.join(owners)} model only, but these "
            f"points are priced by {' and '.join(models)} (the cube holds it as NaN there); "
            f"rank by an output of {models[0]} (solver.outputs.outputs_of({models[0]!r}))")
    return var


def _held_fleets(cube, labels):
    """The fleet labels this cube still holds: its ``fleet`` dim's, the one of a ``fleet``
    coordinate left by ``cube.sel(fleet=...)``, or every one of ``labels`` without one."""
    if "fleet" in cube.coords:
        return [str(f) for f in np.atleast_1d(cube["fleet"].values)]
    return list(labels)


def _capacities(cube):
    """Accelerator memory [B] per fleet, from the cube's ``fleets`` attribute (a DataArray
    over ``fleet`` where it is a dim; else the one fleet the cube holds)."""
    try:
        fleets = json.loads(cube.attrs["fleets"])
    except (KeyError, ValueError):
        raise ValueError("memory_limit as a fraction needs the cube's 'fleets' attribute "
                         "(a cube made by sweep.run); give it in bytes or as '72 GB'") from None
    capacity = {k: v["node"]["accelerator"]["memory_capacity"] for k, v in fleets.items()}
    if "fleet" in cube.dims:
        return xr.DataArray([capacity[str(f)] for f in cube["fleet"].values], dims="fleet",
                            coords={"fleet": cube["fleet"].values})
    held = _held_fleets(cube, capacity)
    if len(held) != 1:
        raise ValueError(f"memory_limit as a fraction: the cube's attributes name the fleets "
                         f"{', '.join(held)} but it has no 'fleet' coordinate to tell its points "
                         f"apart; give the limit in bytes or as '72 GB'")
    return capacity[held[0]]


def _memory_limit(cube, value):
    """The memory limit [B] (per fleet, for a fraction) that ``value`` names; a size above an
    accelerator's memory is that memory (with a ``MemoryLimitWarning``, as in a spec and a
    search: a layout must fit the device), where the cube says what its fleets hold."""
    limit = parse_memory_limit(value, where="constraints.memory_limit")
    if limit.size is not None and "fleets" not in cube.attrs:
        return limit.size
    return limit.resolve(_capacities(cube))


def _looser_than_stored(cube, limit):
    """``(label, asked, own)`` of the first fleet the cube holds whose stored limit (its
    spec's, in ``admissible``) is tighter than ``limit``; None where there is none."""
    try:
        stored = json.loads(cube.attrs["memory_limit"])
    except (KeyError, ValueError, TypeError):
        return None
    held = set(_held_fleets(cube, stored))
    for label, own in stored.items():
        if label not in held or own is None:
            continue
        if isinstance(limit, xr.DataArray) and "fleet" in limit.dims:
            if label not in limit.indexes["fleet"]:
                continue
            asked = float(limit.sel(fleet=label))
        else:
            asked = float(limit)
        if asked > float(own) * (1 + 1e-12):
            return label, asked, float(own)
    return None


def _check_not_looser(cube, limit, selected, where) -> None:
    """Refuse a memory limit looser than the one a cube's ``admissible`` already holds when the
    mask is ``admissible`` or lies within it (``cube.admissible & ...``): the layouts between
    the two limits were never admissible, so the answer would quietly be the cube's own
    limit's, not the one asked for. (A mask within ``admissible`` that some valid layout
    between the two limits could have joined.)"""
    looser = _looser_than_stored(cube, limit)
    if looser is None:
        return
    label, asked, own = looser
    if where.name != "admissible":
        if "admissible" not in cube.data_vars or "valid" not in cube.data_vars:
            return
        within = not bool((selected & ~cube["admissible"]).any())
        valid, footprint = cube["valid"], cube["memory_footprint"]
        if "fleet" in cube.dims:  # the looser fleet's own layouts
            valid, footprint = valid.sel(fleet=label), footprint.sel(fleet=label)
        between = bool((valid & (footprint > own) & (footprint <= asked)).any())
        if not (within and between):
            return
    raise MemoryLimitError(
        f"memory_limit {asked / 1e9:.4g} GB is looser than the cube's "
        f"own limit for fleet {label!r} ({own / 1e9:.4g} GB, its spec's, already in "
        f"'admissible'): the layouts between the two were never admissible. Sweep with "
        f"the looser limit (memory_limit in the spec), or ask a mask without it "
        f"(where='valid' or 'feasible'; on the command line --where)")


def aligned(cube: xr.Dataset, where: xr.DataArray) -> xr.DataArray:
    """``where`` on the cube's coordinates: reindexed by label, False where it has no value.

    A dim of ``where`` without coordinates is read by position and must then
    have the cube's length; a dim the cube holds as a scalar coordinate (after
    ``cube.sel(dim=value)``) is selected at that value. A dim the cube lacks is a
    :class:`ValueError`.

    Parameters
    ----------
    cube : xarray.Dataset
    where : xarray.DataArray
        Boolean.

    Returns
    -------
    xarray.DataArray
        Boolean, over the dims of ``where`` that are dims of the cube, with the
        cube's coordinates on each.
    """
    for d in where.dims:
        if d in cube.dims:
            if d not in where.indexes and where.sizes[d] != cube.sizes[d]:
                raise ValueError(f"where: expected its dim {d!r} to have coordinates, or the "
                                 f"cube's {cube.sizes[d]} points, but got {where.sizes[d]} points "
                                 f"without coordinates")
        elif d in cube.coords and cube[d].ndim == 0:
            value = cube[d].values.item()  # (a 0-d array is no key of an index)
            if d in where.indexes and value in where.indexes[d]:
                where = where.sel({d: value}, drop=True)
            else:  # the cube's one value is not covered: nothing selected
                where = xr.zeros_like(where.isel({d: 0}, drop=True))
        else:
            raise ValueError(f"where: expected dims of the cube ({', '.join(cube.dims)}), but "
                             f"the mask has the dim {d!r}")
    indexes = {d: cube.indexes[d] for d in where.dims if d in where.indexes and d in cube.indexes}
    if any(not where.indexes[d].equals(index) for d, index in indexes.items()):
        where = where.reindex(indexes, fill_value=False)
    return where


def mask(cube: xr.Dataset, where=None, constraints: Optional[Mapping] = None) -> xr.DataArray:
    """The boolean mask of the points an analysis considers.

    Parameters
    ----------
    cube : xarray.Dataset
    where : str or xarray.DataArray, optional
        A boolean variable's name or a boolean DataArray (aligned with the
        cube by its coordinates: see :func:`aligned`); ``admissible`` (or
        ``valid``) by default.
    constraints : mapping, optional
        ``memory_limit`` (``"72 GB"``, bytes, or a fraction of the
        accelerator's memory in (0, 1], on ``memory_footprint``),
        ``max_accelerators`` and ``min_accelerators`` (on ``n_accelerators``), or ``(low, high)``
        bounds on any data variable (``None`` for an open side).

    Returns
    -------
    xarray.DataArray
        Boolean.
    """
    if where is None:
        where = "admissible" if "admissible" in cube.data_vars else "valid"
    if isinstance(where, str):
        where = _require(cube, where, "where")
    if not isinstance(where, xr.DataArray) or where.dtype != bool:
        raise TypeError(f"where must name a boolean variable or be a boolean DataArray, "
                        f"but got {getattr(where, 'dtype', type(where).__name__)}")
    selected = aligned(cube, where) if where.ndim else where
    for key, value in (constraints or {}).items():
        if key == "memory_limit":
            var = _require(cube, "memory_footprint", "memory_limit's variable")
            limit = _memory_limit(cube, value)
            _check_not_looser(cube, limit, selected, where)
            selected = selected & (var <= limit)
        elif key in ("max_accelerators", "min_accelerators"):
            var = _require(cube, "n_accelerators", f"{key}'s variable")
            selected = selected & ((var <= value) if key == "max_accelerators" else (var >= value))
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
            raise KeyError(f"constraints: expected memory_limit, max_accelerators, min_accelerators or a data "
                           f"variable ({', '.join(cube.data_vars)}), but got {key!r}")
    return selected
