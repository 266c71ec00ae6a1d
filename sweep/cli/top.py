"""``top``: the best layouts of a cube as a table (layouts equal in every output are one row)."""

from __future__ import annotations

import numpy as np

from solver.outputs import MAXIMIZE

from .. import analysis
from ..analysis import NoAdmissibleError
from ..analysis._aliases import direction_of
from ..analysis.ties import EQUIVALENT, TIES, parse_equivalent
from ._common import _GB, EXIT_OK
from .cubes import (_check_variable, _check_where, _constraints, _fixed, _open_cube,
                    _parse_select, _rows, _split_first, _with_dp)
from .format import _TABLE_VALUES, _fmt, _layout_table

__all__ = ["command", "with_equivalents"]


def with_equivalents(rows, points) -> list:
    """Rows whose knobs have equivalent values show them all: ``microbatch_count = 1|2|4``."""
    if EQUIVALENT not in points:
        return rows
    out = []
    for row, text in zip(rows, points[EQUIVALENT].values):
        out.append({**row, **parse_equivalent(text)})
    return out


def _empty(cube, where, constraints, select, source) -> NoAdmissibleError:
    """The error for an empty ranking: the counts per condition, and the pinned dims."""
    counts = analysis.admissible_counts(cube, where, constraints)
    error = NoAdmissibleError(counts)
    pinned = ", ".join(f"{d}={_fmt(v)}" for d, v in select.items())
    error.args = (f"top {source}" + (f" (with {pinned})" if pinned else "") + f": {error}",)
    return error


def command(args) -> int:
    """``top``: the best layouts of a cube as a table; status 3 when none is admissible."""
    cube = _open_cube(args.cube, args.allow_partial)
    objective = _check_variable(cube, args.objective,
                                getattr(args, "objective_flag", "--objective"))
    direction = direction_of(objective, args.direction)
    where = _check_where(cube, args.where)
    select = _parse_select(cube, args.select)
    if select:
        # by position: a list of one boolean would be read as a mask of the dim
        cube = cube.isel({d: [int(np.flatnonzero(cube[d].values == v)[0])]
                          for d, v in select.items()})
    constraints = _constraints(args)
    count = int(analysis.mask(cube, where, constraints).sum())
    if not count:
        error = _empty(cube, where, constraints, select, args.cube)
        cube.close()
        raise error
    collapse = not getattr(args, "keep_ties", False)
    points = analysis.top_k(cube, objective, k=args.k, where=where, direction=direction,
                            constraints=constraints, allow_partial=args.allow_partial,
                            collapse_ties=collapse)
    dims = list(cube.dims)
    values = [objective] + [v for v in _TABLE_VALUES if v != objective and v in cube.data_vars]
    rows = [_with_dp(r, _fixed(cube), cube.attrs.get("physics"))
            for r in _rows(points, dims, values)]
    rows = with_equivalents(rows, points)
    if rows:
        dims = _split_first(dims, rows[0])
    narrowed = [f"{d}={_fmt(v)}" for d, v in select.items()] + \
        [f"{'n_accelerators >=' if k == 'min_accelerators' else k + ' <='} "
         f"{_constraint_text(k, v)}" for k, v in constraints.items()]
    print(f"top {len(rows)} of {count:,} {where} layouts by {objective} "
          f"({'largest' if direction == MAXIMIZE else 'smallest'} first)"
          + (f", {', '.join(narrowed)}" if narrowed else "") + f": {args.cube}")
    if rows:
        units = {v: cube[v].attrs.get("units") for v in values}
        print(_layout_table(rows, dims, values, units))
        ties = [int(t) for t in points[TIES].values] if TIES in points else []
        if any(t > 1 for t in ties):
            print(f"a|b: layouts with these values are equal in every output "
                  f"({sum(ties):,} layouts in {len(ties)} rows; --keep-ties lists each)")
    cube.close()
    return EXIT_OK


def _constraint_text(key, value) -> str:
    if key == "memory_limit":
        if value.fraction is not None:
            return f"{value.fraction:g} of capacity"
        return f"{value.size / _GB:g} GB"
    return _fmt(value)
