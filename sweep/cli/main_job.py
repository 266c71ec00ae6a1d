"""The main job (no command): the default sweep in memory, the best layout per split, why #1 wins.

Scenario axes (:data:`sweep.analysis.SCENARIO_DIMS`: workload, fleet,
sequence length, batch, precision) describe the job, so they are answered per
value: one block per scenario ("seq_len=4096"), each ranking the best layout of
every parallel split (the layout knobs) by MFU, with why #1 beats #2.
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from .. import analysis
from ..analysis import NoAdmissibleError, explain_runner_up, scenario_dims, where_step_goes
from ..analysis.scenarios import described
from ..analysis.ties import EQUIVALENT, parse_equivalent
from ..preflight import ResourceError
from ..spec import builtin_spec, load_spec
from ._common import DEFAULT_SPEC, _SPLIT_DIMS, EXIT_OK, UsageError, _check_output, _progress
from .cubes import _rows, _split_first, _with_dp
from .format import _TABLE_VALUES, _fmt, _human_bytes, _layout_table, _memory_size, _plain

__all__ = ["command"]


def _row(point, names, cube) -> dict:
    """One point of a ``best_along`` result as plain values (ints and bools as such)."""
    row = {}
    for name in names:
        value = _plain(np.asarray(point[name].values))
        dtype = cube[name].dtype
        if dtype == bool:
            value = bool(value)
        elif dtype.kind in "iu":
            value = int(value)
        row[name] = value
    return row


def _best_per_split(cube, k: int, scenario=None) -> list:
    """The best admissible layout of each parallel split (by MFU), best first, at most ``k``.

    ``scenario`` (dim -> value) pins the scenario dims first.
    """
    if scenario:
        cube = cube.sel({d: [v] for d, v in scenario.items()})
    splits = [d for d in tuple(scenario or ()) + _SPLIT_DIMS if d in cube.dims]
    if not any(d in _SPLIT_DIMS for d in splits):
        return _rows(analysis.top_k(cube, objective="mfu", k=k), list(cube.dims), cube.data_vars)
    best = analysis.best_along(cube, splits, objective="mfu")
    flat = best.stack(_split=splits)
    found = np.asarray(flat["found"].values)
    mfu = np.asarray(flat["mfu"].values, dtype=np.float64)
    order = [i for i in np.argsort(-np.where(found, mfu, -np.inf), kind="stable") if found[i]][:k]
    names = list(cube.dims) + [v for v in cube.data_vars if v not in cube.dims]
    return [_row(flat.isel(_split=int(i)), names, cube) for i in order]


def _scenarios(cube) -> list:
    """Each combination of the scenario dims' values (dim -> value), in coordinate order."""
    dims = scenario_dims(cube)
    values = [[_plain(v) for v in cube[d].values] for d in dims]
    return [dict(zip(dims, combo)) for combo in itertools.product(*values)]


def _with_equivalents(cube, row, scenario) -> dict:
    """``row`` showing every value of its knobs that gives the same outputs: ``1|2|4``.

    The best layout of a split may tie with others of the same split (a microbatch
    count that changes nothing with one pipeline stage); those are one layout.
    """
    pinned = {d: [row[d]] for d in (*scenario, *_SPLIT_DIMS) if d in cube.dims and d in row}
    best = analysis.top_k(cube.sel(pinned), objective="mfu", k=1)
    if not best.sizes.get("rank") or EQUIVALENT not in best:
        return row
    return {**row, **parse_equivalent(str(best[EQUIVALENT].values[0]))}


def _block(spec, cube, scenario, rows) -> None:
    """Print one scenario's table of the best layout per split, and why #1 wins."""
    rows = [_with_dp(r, dict(spec.fixed), spec.physics[0]) for r in rows]
    dims = [d for d in _split_first(list(cube.dims), rows[0]) if d not in scenario]
    values = [v for v in _TABLE_VALUES if v in rows[0]]
    units = {v: cube[v].attrs.get("units") for v in values}
    where = (", ".join(f"{d}={_fmt(v)}" for d, v in scenario.items()) + ": ") if scenario else ""
    print()
    print(f"{where}Best layout of each parallel split, by MFU ({len(rows)} shown):")
    shown = [_with_equivalents(cube, row, scenario) for row in rows]
    print(_layout_table(shown, dims, values, units))
    if any(shown[i] != rows[i] for i in range(len(rows))):
        print("a|b: layouts with these values are equal in every output")
    if len(rows) > 1:
        print(explain_runner_up(spec, rows[0], rows[1]))
    else:
        print("Only one split is admissible: there is no runner-up.")
    print(where_step_goes(spec, rows[0]))


def _report(spec, cube, k) -> bool:
    """One block per scenario (a scenario with no admissible layout says why); any found."""
    scenarios = _scenarios(cube) if len(_scenarios(cube)) > 1 else [{}]
    if scenarios != [{}]:
        dims = scenario_dims(cube)
        print(f"\nThe layout knobs are ranked for each scenario ({', '.join(dims)}: "
              f"{described(dims)[0]}, not a choice), {len(scenarios)} blocks:")
    found = False
    for scenario in scenarios:
        rows = _best_per_split(cube, k, scenario)
        if rows:
            found = True
            _block(spec, cube, scenario, rows)
            continue
        if not scenario:  # the one scenario: the exit's message says why, on stderr
            continue
        sub = cube.sel({d: [v] for d, v in scenario.items()})
        where = ", ".join(f"{d}={_fmt(v)}" for d, v in scenario.items())
        print(f"\n{where}: {analysis.explain_empty(analysis.admissible_counts(sub))}")
    return found


#: The spec of ``--physics megatron`` without ``--spec`` (the default spec's knobs are mlsysim's).
MEGATRON_SPEC = "megatron_llama70b"


def _spec_for(args):
    """The spec the main job sweeps: ``--spec``, or the default of the physics model."""
    if getattr(args, "physics", None) == "megatron" and args.spec == str(DEFAULT_SPEC):
        return builtin_spec(MEGATRON_SPEC)
    return args.spec


def command(args) -> int:
    """The main job: sweep in memory, best layout per split and scenario, save the cube.

    Exits with status 3 (after saving) when no layout of any scenario is admissible.
    """
    import sweep

    spec = load_spec(_spec_for(args), physics=args.physics)
    output = None if args.no_save else _check_output(args.output, "-o", inputs=(_spec_for(args),))
    # xarray looks for dask (and other array libraries) on its first array, once a process:
    # 0.3-0.4 s of imports where dask is installed, not pricing; done before the clock starts
    import xarray as xr
    xr.Variable(("x",), np.zeros(1))
    started = time.perf_counter()
    spec = spec.with_constraints(require_realizable=args.require_realizable)
    try:
        cube = sweep.run(spec, n_jobs=args.jobs, progress=_progress(args))
    except ResourceError as err:  # refused before pricing: too big for this machine's memory
        fix = f"`{args.prog} run {args.spec} -o"
        raise UsageError(str(err).replace("`run SPEC -o", fix)) from None
    elapsed = time.perf_counter() - started
    workload = " + ".join(spec.workloads)
    fleets = " + ".join(f"{k} ({f.total_accelerators} x {f.node.accelerator.name})"
                        for k, f in spec.fleets.items())
    admissible = int(cube["admissible"].sum())
    limits = ", ".join(_memory_size(spec.memory_limit_for(f)) for f in spec.fleets.values())
    low, high = zip(*(spec.accelerator_range(f) for f in spec.fleets.values()))
    if set(high) != {None}:
        limits += f", at most {'/'.join(str(h) for h in sorted(set(high) - {None}))} accelerators"
    if set(low) != {None}:
        limits += f", at least {'/'.join(str(v) for v in sorted(set(low) - {None}))} accelerators"
    if spec.require_realizable:
        limits += ", realizable"
    print(f"{spec.name}: {workload} on {fleets}; physics {' + '.join(spec.physics)}")
    print(f"{spec.size:,} layouts priced in {elapsed:.2f} s ({spec.size / elapsed:,.0f} "
          f"layouts/s); {admissible:,} admissible (valid split, memory <= {limits})")
    found = _report(spec, cube, args.top)
    print()
    if args.no_save:
        print("cube not saved (--no-save)")
    else:
        path = sweep.save(cube, output)
        print(f"wrote {path} ({_human_bytes(path.stat().st_size)}); explore it with "
              f"`{args.prog} top {path}`, `show`, `plot`")
    if not found:
        raise NoAdmissibleError(analysis.admissible_counts(cube))
    return EXIT_OK
