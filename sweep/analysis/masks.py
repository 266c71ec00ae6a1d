"""Which points an analysis considers: a boolean mask narrowed by constraints.

``mask(cube, where, constraints)`` starts from ``where`` (``admissible`` by
default) and narrows it by ``memory_limit`` (through the one memory-limit
parser, :func:`sweep.limits.parse_memory_limit`), ``max_accelerators``, and
``(low, high)`` bounds on any data variable.
"""

from __future__ import annotations

import json
from typing import Mapping, Optional

import xarray as xr

from ..cube import COMPLETE
from ..limits import parse_memory_limit
from ..storage import IncompleteCubeError

__all__ = ["mask"]


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
    """The memory limit [B] (per fleet, for a fraction) that ``value`` names."""
    limit = parse_memory_limit(value, where="constraints.memory_limit")
    if limit.size is not None:
        return limit.size
    return limit.resolve(_capacities(cube))


def mask(cube: xr.Dataset, where=None, constraints: Optional[Mapping] = None) -> xr.DataArray:
    """The boolean mask of the points an analysis considers.

    Parameters
    ----------
    cube : xarray.Dataset
    where : str or xarray.DataArray, optional
        A boolean variable's name or a boolean DataArray; ``admissible`` (or
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
    selected = where
    for key, value in (constraints or {}).items():
        if key == "memory_limit":
            var = _require(cube, "memory_footprint", "memory_limit's variable")
            selected = selected & (var <= _memory_limit(cube, value))
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
