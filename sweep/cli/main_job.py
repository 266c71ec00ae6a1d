"""The main job (no command): the default sweep in memory, the best layout per split, why #1 wins."""

from __future__ import annotations

import time

import numpy as np

from .. import analysis
from ..analysis import explain_runner_up
from ..spec import load_spec
from ._common import _GB, _SPLIT_DIMS, EXIT_OK, _check_output, _progress
from .cubes import _rows, _split_first, _with_dp
from .format import _TABLE_VALUES, _human_bytes, _layout_table, _plain

__all__ = ["command"]


def _best_per_split(cube, k: int) -> list:
    """The best admissible layout of each parallel split (by MFU), best first, at most ``k``."""
    from ..analysis import best_along

    splits = [d for d in ("workload", "fleet") + _SPLIT_DIMS if d in cube.dims]
    if not splits:
        return _rows(analysis.top_k(cube, objective="mfu", k=k), list(cube.dims), cube.data_vars)
    best = best_along(cube, splits, objective="mfu")
    flat = best.stack(_split=splits)
    found = np.asarray(flat["found"].values)
    mfu = np.asarray(flat["mfu"].values, dtype=np.float64)
    order = [i for i in np.argsort(-np.where(found, mfu, -np.inf), kind="stable") if found[i]][:k]
    names = list(cube.dims) + [v for v in cube.data_vars if v not in cube.dims]
    rows = []
    for i in order:
        point = flat.isel(_split=int(i))
        row = {}
        for name in names:
            value = _plain(np.asarray(point[name].values))
            dtype = cube[name].dtype
            if dtype == bool:
                value = bool(value)
            elif dtype.kind in "iu":
                value = int(value)
            row[name] = value
        rows.append(row)
    return rows


def command(args) -> int:
    """The main job: sweep in memory, best layout per split, why #2 loses, save the cube."""
    import sweep

    spec = load_spec(args.spec)
    output = None if args.no_save else _check_output(args.output, "-o")
    started = time.perf_counter()
    spec = spec.with_constraints(require_realizable=args.require_realizable)
    cube = sweep.run(spec, n_jobs=args.jobs, progress=_progress(args))
    elapsed = time.perf_counter() - started
    workload = " + ".join(spec.workloads)
    fleets = " + ".join(f"{k} ({f.total_accelerators} x {f.node.accelerator.name})"
                        for k, f in spec.fleets.items())
    admissible = int(cube["admissible"].sum())
    limits = ", ".join(f"{spec.memory_limit_for(f) / _GB:.0f} GB" for f in spec.fleets.values())
    low, high = zip(*(spec.accelerator_range(f) for f in spec.fleets.values()))
    if set(high) != {None}:
        limits += f", at most {'/'.join(str(h) for h in sorted(set(high) - {None}))} accelerators"
    if set(low) != {None}:
        limits += f", at least {'/'.join(str(v) for v in sorted(set(low) - {None}))} accelerators"
    if spec.require_realizable:
        limits += ", realizable"
    print(f"{spec.name}: {workload} on {fleets}")
    print(f"{spec.size:,} layouts priced in {elapsed:.2f} s ({spec.size / elapsed:,.0f} "
          f"layouts/s); {admissible:,} admissible (valid split, memory <= {limits})")
    rows = _best_per_split(cube, args.top)
    if not rows:
        print("no admissible layout: raise the memory limit or widen the axes")
    else:
        rows = [_with_dp(r, dict(spec.fixed)) for r in rows]
        dims = _split_first(list(cube.dims), rows[0])
        values = [v for v in _TABLE_VALUES if v in rows[0]]
        units = {v: cube[v].attrs.get("units") for v in values}
        print()
        print(f"Best layout of each parallel split, by MFU ({len(rows)} shown):")
        print(_layout_table(rows, dims, values, units))
        print()
        if len(rows) > 1:
            print(explain_runner_up(spec, rows[0], rows[1]))
        else:
            print("Only one split is admissible: there is no runner-up.")
    if args.no_save:
        print("cube not saved (--no-save)")
        return EXIT_OK
    path = sweep.save(cube, output)
    print(f"wrote {path} ({_human_bytes(path.stat().st_size)}); explore it with "
          f"`{args.prog} top {path}`, `show`, `plot`")
    return EXIT_OK
