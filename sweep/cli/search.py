"""``search``: optuna (or exhaustive) search of a spec; the summary and the top layouts."""

from __future__ import annotations

import importlib
import sys
import warnings

from solver.outputs import DERIVED, REGISTRY, objective_names

from ..analysis.ties import TIES, collapse_rows
from ..limits import MemoryLimitWarning
from ..spec import load_spec
from ._common import EXIT_EMPTY, EXIT_OK, UsageError, _progress, _suggest
from .format import _TABLE_VALUES, _layout_table

__all__ = ["command"]


#: Layouts fetched per row asked for with -k (ties collapse into one row).
FETCH_FACTOR = 8


def _distinct_rows(rows, dims, values, objective, k, fetched) -> list:
    """The first ``k`` rows of distinct outputs, each group whole.

    Layouts tied with the last one fetched may have more equals beyond it, so
    their group is left out unless the search returned fewer layouts than asked
    (then every admissible layout is there).
    """
    if len(rows) >= fetched and rows:
        last = rows[-1].get(objective)
        rows = [r for r in rows if r.get(objective) != last] or rows
    return collapse_rows(rows, dims, values)[:k]


def _search_rows(result) -> tuple:
    """``(rows, names)`` of a :class:`SearchResult`'s top layouts, for :func:`_layout_table`."""
    rows, dims = [], []
    for entry in result.top:
        # (a calibration's constants are the profile's, not the layout's: the summary names it)
        params = {k: v for k, v in entry["params"].items()
                  if v is not None and k not in result.constants_of(entry["params"])}
        rows.append({**params, **entry["values"]})
        dims += [k for k in params if k not in dims]
    return rows, dims


def _units(name) -> str:
    entry = REGISTRY.get(name) or DERIVED.get(name)
    return entry.units if entry else ""


def _memory_limit(limit):
    """A parsed ``--memory-limit`` as ``search`` takes it: a fraction, or a size in bytes."""
    if limit is None or limit.fraction is not None:
        return None if limit is None else limit.fraction
    return f"{limit.size!r} B"


def _search_options(search, args) -> dict:
    """The keywords of ``search(spec, ...)`` from the command line's arguments."""
    options = dict(n_trials=args.trials, seed=args.seed, memory_limit=_memory_limit(
        args.memory_limit), objective=args.objective, sampler=args.sampler,
        storage=args.storage, study_name=args.study_name, progress=_progress(args),
        n_jobs=args.jobs)
    # Ask for more than -k layouts: ties (layouts equal in every output) collapse into one
    # row, and a group is shown only when it is known whole (see _distinct_rows).
    options["k"] = FETCH_FACTOR * args.k
    if args.exact and args.mode not in (None, "exhaustive"):
        raise UsageError(f"--exact is --mode exhaustive, but got --mode {args.mode} with it")
    options["mode"] = "exhaustive" if args.exact else (args.mode or "auto")
    if args.time_budget is not None:
        options["time_budget"] = args.time_budget
    if args.direction is not None:
        options["direction"] = args.direction
    if args.batch_size:
        options["batch_size"] = args.batch_size
    if args.calibration:
        options["calibration"] = args.calibration
    return options


def command(args) -> int:
    """``search``: optuna (or exhaustive) search; the summary and the top layouts."""
    # The module, not sweep.search (the package exports the function under that name).
    search_mod = importlib.import_module("sweep.search")

    if args.objective not in objective_names():
        choices = sorted(objective_names())
        raise UsageError(f"--objective: expected an output of solver.solve or a derived "
                         f"quantity ({', '.join(choices)}), but got {args.objective!r}"
                         f"{_suggest(args.objective, choices)}")
    spec = load_spec(args.spec, physics=args.physics).with_constraints(
        min_accelerators=args.min_accelerators, require_realizable=args.require_realizable)
    try:  # an output of the other physics model than the spec's: refused before any work
        search_mod.check_objectives_of_models(spec, [(args.objective, None)])
    except ValueError as err:
        raise UsageError(f"--objective: {err}") from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "no feasible layout": the summary says
        # (but a limit above the accelerator's memory is said, as top says it: a RuntimeWarning
        # too, which the line above had silenced)
        warnings.simplefilter("default", MemoryLimitWarning)
        try:
            result = search_mod.search(spec, **_search_options(search_mod.search, args))
        except search_mod.StorageError as err:  # --storage, or a stored study of another space
            raise UsageError(f"search: {err}") from None
    print(result.summary(explain_empty=False))
    if not result.n_admissible:
        why = result.why_empty() + ("" if result.empty_counts else ": relax the memory limit "
                                    "or the accelerator bounds, or widen the axes")
        print(why, file=sys.stderr)
        return EXIT_EMPTY
    if result.top:
        rows, dims = _search_rows(result)
        rows = _distinct_rows(rows, dims, [k for k in rows[0] if k not in dims],
                              args.objective, args.k, FETCH_FACTOR * args.k)
        values = [args.objective] + [v for v in _TABLE_VALUES if v != args.objective]
        values = [v for v in values if v in rows[0]]
        units = {v: _units(v) for v in values}
        print()
        print(f"top {len(rows)} distinct layouts by {args.objective}:")
        print(_layout_table(rows, dims, values, units))
        if any(r[TIES] > 1 for r in rows):
            print("a|b: layouts with these values are equal in every output shown")
    return EXIT_OK
