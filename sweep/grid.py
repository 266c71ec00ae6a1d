"""Cut a spec's grid into blocks of open-mesh knob arrays for ``solver.solve``.

A block is one (workload, fleet, physics) triple and a C-ordered slab of the
remaining axes, at most ``block_points`` points (:data:`solver.blocks.BLOCK_POINTS` by
default, the one default of the solver's chunks, grid blocks, ``sweep.run`` and
the analysis slabs). Its knobs form an open mesh over *all*
the spec's dims (the categorical ``workload``, ``fleet`` and ``physics`` dims have
length 1), so ``solver.solve(block.workload, block.fleet, physics=block.physics,
**block.knobs)`` returns arrays broadcastable to ``block.shape``, ready to be
written at ``block.index`` of the cube. ``block.knobs`` holds only the knobs its
physics model takes (:mod:`sweep.physics`), so its outputs span only those axes.
Each term inside the solver is then computed on the axes it depends on.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np

from solver.blocks import BLOCK_POINTS
from solver.specs import Fleet, Workload

from . import physics as physics_
from .spec import Spec, SpecError, load_spec

__all__ = ["Block", "blocks", "point", "points_per_block", "warn_renamed", "BLOCK_POINTS",
           "DEFAULT_BLOCK_POINTS"]

#: Former name of :data:`solver.blocks.BLOCK_POINTS` here (the same value).
DEFAULT_BLOCK_POINTS = BLOCK_POINTS

_CATEGORICAL = ("workload", "fleet", "physics")


@dataclass(frozen=True)
class Block:
    """One slab of the grid.

    ``index`` has one entry per dim: a slice into the cube. ``shape`` is the
    block's shape over all dims. ``knobs`` maps the keywords of the model
    ``physics`` to arrays broadcastable to ``shape`` (fixed knobs as scalars).
    """

    index: tuple
    shape: tuple
    workload_label: str
    fleet_label: str
    workload: Workload
    fleet: Fleet
    knobs: dict
    physics: str = physics_.DEFAULT_PHYSICS

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def _axis_array(values, ndim, position, lo, hi):
    """A view of ``values[lo:hi]``, long on dim ``position`` and length 1 elsewhere."""
    shape = [1] * ndim
    shape[position] = hi - lo
    return values[lo:hi].reshape(shape)


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    """Warn (:class:`DeprecationWarning`) that ``old`` is now spelled ``new``."""
    warnings.warn(f"{old} is deprecated; use {new}", DeprecationWarning, stacklevel=stacklevel)


def points_per_block(block_points: Optional[int] = None, max_points: Optional[int] = None, *,
                     stacklevel: int = 4) -> int:
    """The points per block asked for: ``block_points``, or the deprecated ``max_points``.

    Parameters
    ----------
    block_points : int, optional
        Points per block; :data:`solver.blocks.BLOCK_POINTS` when None.
    max_points : int, optional
        The former name of ``block_points`` (warns :class:`DeprecationWarning`).

    Raises
    ------
    TypeError
        If both are given.
    ValueError
        If the number is not a whole number >= 1 (named as it was spelled).
    """
    name = "block_points"
    if max_points is not None:
        if block_points is not None:
            raise TypeError("got both block_points= and its deprecated alias max_points=; "
                            "pass block_points= only")
        warn_renamed("max_points=", "block_points=", stacklevel)
        block_points, name = max_points, "max_points"
    if block_points is None:
        return BLOCK_POINTS
    if isinstance(block_points, bool) or not isinstance(block_points, (int, np.integer)) \
            or block_points < 1:
        raise ValueError(f"{name} must be a whole number >= 1, but got {block_points!r}")
    return int(block_points)


def blocks(spec: Spec, block_points: int = BLOCK_POINTS, *,
           max_points: Optional[int] = None) -> Iterator[Block]:
    """Blocks covering the spec's grid once, in C order, of at most ``block_points`` points.

    ``max_points`` is a deprecated alias of ``block_points``.

    Raises
    ------
    SpecError
        If an axis is a continuous range (only a search can use it).
    ValueError
        If ``block_points`` is not a whole number >= 1.
    """
    block_points = points_per_block(None if max_points is not None else block_points,
                                    max_points)
    for axis in spec.axes:
        if axis.is_continuous:
            raise SpecError(f"{spec.source}: axes.{axis.name}: a sweep needs listed values "
                            f"(add step or num to the range); only a search samples a "
                            f"continuous range")
    dims, shape = spec.dims, spec.shape
    ndim = len(dims)
    workload_labels = (spec.axis("workload").values if "workload" in dims
                       else tuple(spec.workloads))
    fleet_labels = spec.axis("fleet").values if "fleet" in dims else tuple(spec.fleets)
    models = tuple(spec.physics)

    # Split from the outside in: a dim whose inner dims already exceed the budget
    # is taken one index at a time; the first dim one of whose slices fits is cut
    # into runs of as many slices as fit, and the dims inside it stay whole.
    numeric = [i for i, d in enumerate(dims) if d not in _CATEGORICAL]
    inner = 1
    inner_sizes = {}
    for i in reversed(numeric):
        inner_sizes[i] = inner
        inner *= shape[i]
    run_dim, run_length = None, None
    for i in numeric:
        if inner_sizes[i] <= block_points:
            run_dim, run_length = i, max(1, block_points // inner_sizes[i])
            break
    single = [i for i in numeric if run_dim is None or i < run_dim]

    def numeric_slabs():
        ranges = []
        for i in numeric:
            if i in single:
                ranges.append([(j, j + 1) for j in range(shape[i])])
            elif i == run_dim:
                ranges.append([(lo, min(lo + run_length, shape[i]))
                               for lo in range(0, shape[i], run_length)])
            else:
                ranges.append([(0, shape[i])])
        if not ranges:
            yield {}
            return
        for combo in np.ndindex(*[len(r) for r in ranges]):
            yield {i: ranges[n][c] for n, (i, c) in enumerate(zip(numeric, combo))}

    # One array per axis; every block's knob is a view of it (no copy per block).
    axis_values = [None if d in _CATEGORICAL else np.asarray(a.values)
                   for d, a in zip(dims, spec.axes)]
    for w_index, w_label in enumerate(workload_labels):
        for f_index, f_label in enumerate(fleet_labels):
            for p_index, model in enumerate(models):
                for slab in numeric_slabs():
                    at = {"workload": w_index, "fleet": f_index, "physics": p_index}
                    index, block_shape, knobs = [], [], dict(spec.fixed)
                    for i, dim in enumerate(dims):
                        if dim in _CATEGORICAL:
                            lo, hi = at[dim], at[dim] + 1
                        else:
                            lo, hi = slab[i]
                            knobs[dim] = _axis_array(axis_values[i], ndim, i, lo, hi)
                        index.append(slice(lo, hi))
                        block_shape.append(hi - lo)
                    yield Block(index=tuple(index), shape=tuple(block_shape),
                                workload_label=w_label, fleet_label=f_label,
                                workload=spec.workloads[w_label], fleet=spec.fleets[f_label],
                                knobs=physics_.knobs_for(model, knobs), physics=model)


def point(spec, coords: dict) -> tuple:
    """``(workload, fleet, knobs)`` for one point of the grid given its coordinates.

    ``spec`` is a :class:`Spec`, a dict or a TOML path (as :func:`load_spec`
    takes); ``coords`` maps dims to values (as in a cube's coordinates); fixed
    knobs are added, so ``solver.solve(workload, fleet, **knobs)`` prices that point.
    When the spec's physics is not the default, or ``physics`` is a dim, the
    knobs carry ``physics`` and only the knobs of that model.
    """
    spec = load_spec(spec)
    coords = dict(coords)
    workload = spec.workload_spec(coords.pop("workload", None))
    fleet = spec.fleet_spec(coords.pop("fleet", None))
    model = coords.pop("physics", None)
    if model is None:
        if len(spec.physics) != 1:
            raise SpecError(f"the spec has {len(spec.physics)} physics models; name one of "
                            f"{', '.join(spec.physics)}")
        model = spec.physics[0]
    knobs = {**spec.fixed, **{k: (v.item() if hasattr(v, "item") else v)
                              for k, v in coords.items()}}
    knobs = physics_.knobs_for(str(model), knobs)
    if str(model) != physics_.DEFAULT_PHYSICS or "physics" in spec.dims:
        knobs["physics"] = str(model)
    return workload, fleet, knobs
