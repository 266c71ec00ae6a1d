"""The command line: ``layout-sweep`` (or ``python -m sweep``).

With no command it runs the main job: the built-in default sweep
(``configs/sweeps/default.toml``: Llama-3.1-70B on 1024 H100s, ~1.3 million
layouts) in memory, prints the best layout of each parallel split with one
line on why the runner-up loses, and writes the cube to ``default_cube.nc``.

Commands::

    layout-sweep run SPEC [-o cube.nc] [--jobs N] [--resume] [--max-points N]
    layout-sweep search SPEC [--trials N] [--seed S] [--memory-limit "72 GB"|0.9]
                             [--objective mfu] [--sampler tpe|nsga2|random|grid]
                             [--storage URL|file.log] [--study-name NAME] [--exact] [--top K]
    layout-sweep top CUBE [--by mfu] [-k 10] [--smallest] [--where admissible]
                          [--memory-limit ...] [--max-accelerators N] [--select dim=value ...]
    layout-sweep show CUBE
    layout-sweep catalog [workloads|fleets|accelerators|nodes|fabrics]
    layout-sweep plot CUBE --kind heatmap|line|pareto [--var mfu] [--x DIM] [--y DIM]
                           [--hue DIM] [--reduce max|min|mean] [--select dim=value ...]
                           [--where admissible] [-o file.png]

Errors in what the user gave (a missing file, a spec key, a catalog name, a
variable, a ``--select``) print one line to stderr, naming where, what was
expected and what came, with close matches, and exit with status 2. Success
exits 0; an interrupt exits 130.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np

import solver
from solver import catalog
from solver.units import parse_quantity

from . import analysis, grid
from .cube import MASKS
from .spec import SpecError, builtin_spec, load_spec

__all__ = [
    "main",
    "build_parser",
    "UsageError",
    "DEFAULT_SPEC",
    "DEFAULT_CUBE",
    "format_table",
    "explain_runner_up",
    "step_components",
    "EXIT_OK",
    "EXIT_USAGE",
    "EXIT_INTERRUPTED",
]

#: The main job's sweep.
#: The main job's spec: ``configs/sweeps/default.toml`` as installed with the package.
DEFAULT_SPEC = builtin_spec("default")
#: Where the main job writes its cube (in the current directory).
DEFAULT_CUBE = "default_cube.nc"
EXIT_OK, EXIT_USAGE, EXIT_INTERRUPTED = 0, 2, 130

_PROG = "layout-sweep"
_GB = 1e9
_SPLIT_DIMS = ("tp_size", "pp_size", "ep_size", "dp_size")
_CATALOG_KINDS = ("workloads", "fleets", "accelerators", "nodes", "fabrics")
_PLOT_KINDS = ("heatmap", "line", "pareto")
_SAMPLERS = ("tpe", "nsga2", "random", "grid")
#: Value columns of a layout table: variable -> (header, format).
_COLUMNS = {
    "mfu": ("MFU", "{:.4f}"),
    "step_latency_total": ("step [s]", "{:.3f}"),
    "effective_throughput": ("samples/s", "{:.1f}"),
    "memory_footprint": ("memory [GB]", "{:.1f}"),
    "n_accelerators": ("accelerators", "{:.0f}"),
}
_TABLE_VALUES = ("mfu", "step_latency_total", "memory_footprint", "n_accelerators")


class UsageError(Exception):
    """A mistake in what the user gave: reported in one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (no usage dump), exit status 2."""

    def error(self, message):
        raise UsageError(f"{self.prog}: error: {message} (see {self.prog} --help)")


# ----------------------------------------------------------------------------- helpers


def _suggest(name, choices) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``choices`` (or one it begins), else ``""``."""
    choices = [str(c) for c in choices]
    close = difflib.get_close_matches(str(name), choices, n=1, cutoff=0.5)
    close = close or [c for c in choices if name and c.startswith(str(name))][:1]
    return f"; did you mean {close[0]!r}?" if close else ""


def _one_of(choices, what):
    """An argparse type accepting one of ``choices``, suggesting a close one otherwise."""
    def convert(text):
        if text in choices:
            return text
        raise argparse.ArgumentTypeError(
            f"expected {what} ({', '.join(choices)}), but got {text!r}{_suggest(text, choices)}")
    convert.__name__ = what
    return convert


def _positive_int(text) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, but got {text!r}")
    return value


def _jobs(text) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value == 0 or value < -1:
        raise argparse.ArgumentTypeError(
            f"expected a number of processes >= 1 (or -1 for every core), but got {text!r}")
    return value


def _memory_limit(text):
    """``"72 GB"`` -> bytes; ``"0.9"`` -> a fraction of capacity; ``"7.2e10"`` -> bytes."""
    try:
        value = float(text)
    except ValueError:
        try:
            return parse_quantity(text, "bytes")
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    if not value > 0 or not np.isfinite(value):
        raise argparse.ArgumentTypeError(
            f"expected a size such as '72 GB', bytes, or a fraction of the accelerator's "
            f"memory in (0, 1], but got {text!r}")
    return value


def _check_output(path, flag) -> Path:
    """``path`` as a Path, if its directory exists (else a :class:`UsageError`)."""
    path = Path(path)
    if not path.parent.is_dir():
        raise UsageError(f"{flag}: expected a file in an existing directory, but got {str(path)!r} "
                         f"({path.parent} does not exist)")
    return path


def _progress(args) -> bool:
    return not args.no_progress and sys.stderr.isatty()


def _plain(value):
    """A numpy scalar (or 0-d array) as a plain Python value."""
    return value.item() if hasattr(value, "item") else value


def _fmt(value) -> str:
    value = _plain(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *,
                 left: Sequence[int] = ()) -> str:
    """Rows of strings as aligned columns under their headers.

    Parameters
    ----------
    headers : sequence of str
    rows : sequence of sequences of str
    left : sequence of int
        Columns aligned left (the others are aligned right).

    Returns
    -------
    str
        The header line, a rule, and one line per row.
    """
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells):
        return "  ".join(c.ljust(w) if i in left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths])]
                     + [line(r) for r in rows])


def _value_column(name, units=None):
    if name in _COLUMNS:
        return _COLUMNS[name]
    if units == "B":
        return f"{name} [GB]", "{:.3g}"
    return (f"{name} [{units}]" if units and units != "1" else name), "{:.4g}"


def _format_value(name, value, units=None) -> str:
    value = _plain(value)
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    scale = _GB if name == "memory_footprint" or units == "B" else 1.0
    return _value_column(name, units)[1].format(value / scale)


def _layout_table(rows: Sequence[Mapping], dims: Sequence[str], values: Sequence[str],
                  units: Optional[Mapping] = None, *, first: str = "#") -> str:
    """A table of layouts: dims that vary as columns, the others in one line above.

    ``rows`` map dims and value names to values; ``values`` are the value columns.
    """
    units = dict(units or {})
    varying = [d for d in dims if len({_fmt(r[d]) for r in rows}) > 1]
    constant = [d for d in dims if d not in varying]
    lines = []
    if constant and rows:
        lead = "same in every row" if len(rows) > 1 else "layout"
        lines.append(f"{lead}: " + ", ".join(f"{d}={_fmt(rows[0][d])}" for d in constant))
    headers = [first] + varying + [_value_column(v, units.get(v))[0] for v in values]
    cells = [[str(i)] + [_fmt(r[d]) for d in varying]
             + [_format_value(v, r.get(v), units.get(v)) for v in values]
             for i, r in enumerate(rows, 1)]
    lines.append(format_table(headers, cells))
    return "\n".join(lines)


def _with_dp(row: dict, fixed: Mapping) -> dict:
    """Add the derived ``dp_size`` (accelerators / (TP*PP*EP)) to a row that lacks it."""
    if "dp_size" in row or "n_accelerators" not in row:
        return row
    model_parallel = 1
    for name in ("tp_size", "pp_size", "ep_size"):
        model_parallel *= int(_plain(row.get(name, fixed.get(name, 1))))
    count = _plain(row["n_accelerators"])
    if isinstance(count, float) and not np.isfinite(count):
        return row
    return {"dp_size": int(count) // model_parallel, **row}


def _split_first(dims: Sequence[str], row: Mapping) -> list:
    """Table column order: workload and fleet, the split (with a derived dp_size), the rest."""
    labels = [d for d in dims if d in ("workload", "fleet")]
    split = [d for d in _SPLIT_DIMS if d in dims or (d == "dp_size" and d in row)]
    return labels + split + [d for d in dims if d not in labels and d not in split]


def _fixed(cube) -> dict:
    try:
        return json.loads(cube.attrs.get("fixed", "{}"))
    except ValueError:
        return {}


def _human_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _seconds(value: float) -> str:
    """A duration with its sign: ``+12 ms``, ``-1.23 s``."""
    sign = "+" if value >= 0 else "-"
    value = abs(value)
    if value >= 1:
        return f"{sign}{value:.2f} s"
    if value >= 1e-3:
        return f"{sign}{value * 1e3:.3g} ms"
    return f"{sign}{value * 1e6:.3g} us"


# ----------------------------------------------------------------------------- cubes


def _open_cube(path, allow_partial: bool = False):
    """A finished cube file opened lazily; anything else is a :class:`UsageError`.

    With ``allow_partial`` an unfinished sweep's cube (or its staged blocks) opens too.
    """
    from . import storage

    path = Path(path)
    incomplete = getattr(storage, "IncompleteCubeError", ())
    try:
        cube = storage.open_cube(path, allow_partial=allow_partial)
    except FileNotFoundError as err:
        raise UsageError(f"{path}: expected a cube file (written by `{_PROG} run`), "
                         f"but {err}") from None
    except incomplete as err:
        if path.is_file():
            _check_foreign(path)
        raise UsageError(f"{path}: expected a finished cube, but {_one_line(err)}; or pass "
                         f"--allow-partial to look at the points priced so far") from None
    except (OSError, ValueError) as err:
        raise UsageError(_unreadable(path, err)) from None
    _check_masks(path, cube)
    return cube


def _unreadable(path, err) -> str:
    detail = str(err).splitlines()[0] if str(err) else type(err).__name__
    return (f"{path}: expected a cube (a netCDF file written by `{_PROG} run`), but it "
            f"cannot be read as netCDF ({detail})")


def _check_foreign(path) -> None:
    """Raise :class:`UsageError` if the netCDF file at ``path`` is not a cube at all."""
    import xarray as xr

    from .storage import ENGINE

    try:
        dataset = xr.open_dataset(path, engine=ENGINE)
    except (OSError, ValueError) as err:
        raise UsageError(_unreadable(path, err)) from None
    _check_masks(path, dataset)
    dataset.close()


def _check_masks(path, dataset) -> None:
    missing = [m for m in MASKS if m not in dataset.data_vars]
    if missing:
        names = ", ".join(dataset.data_vars) or "none"
        dataset.close()
        raise UsageError(f"{path}: expected a cube written by {_PROG} (with the masks "
                         f"{', '.join(MASKS)}), but it has the variables: {names}")


def _check_variable(cube, name, what, *, numeric=True) -> str:
    choices = [n for n, v in cube.data_vars.items() if not numeric or v.dtype != bool]
    if name not in choices:
        kind = "a numeric variable" if numeric else "a variable"
        raise UsageError(f"{what}: expected {kind} of the cube ({', '.join(choices)}), "
                         f"but got {name!r}{_suggest(name, choices)}")
    return name


def _check_where(cube, name) -> str:
    choices = [n for n, v in cube.data_vars.items() if v.dtype == bool]
    if name not in choices:
        raise UsageError(f"--where: expected a boolean variable of the cube "
                         f"({', '.join(choices)}), but got {name!r}{_suggest(name, choices)}")
    return name


def _check_dim(cube, name, what) -> str:
    dims = list(cube.dims)
    if name not in dims:
        raise UsageError(f"{what}: expected a dim of the cube ({', '.join(dims)}), "
                         f"but got {name!r}{_suggest(name, dims)}")
    return name


_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def _coordinate_value(cube, dim, text):
    """The coordinate value of ``dim`` that ``text`` names (numbers compared as numbers)."""
    values = np.asarray(cube[dim].values)
    shown = ", ".join(_fmt(v) for v in values)
    expected = f"--select {dim}: expected one of {shown}, but got {text!r}"
    kind = values.dtype.kind
    if kind == "b":
        lowered = text.strip().lower()
        if lowered not in _TRUE + _FALSE:
            raise UsageError(expected)
        wanted = lowered in _TRUE
        match = np.flatnonzero(values == wanted)
    elif kind in "iuf":
        try:
            number = float(text)
        except ValueError:
            raise UsageError(expected) from None
        match = np.flatnonzero(np.isclose(values.astype(np.float64), number, rtol=1e-9, atol=0))
    else:
        match = np.flatnonzero(values.astype(str) == text)
        if not len(match):
            raise UsageError(expected + _suggest(text, values.astype(str)))
    if not len(match):
        raise UsageError(expected)
    return _plain(values[match[0]])


def _parse_select(cube, items: Optional[Sequence[str]]) -> dict:
    """``["tp_size=4", ...]`` -> ``{"tp_size": 4, ...}``, each checked against the cube."""
    out = {}
    for item in items or ():
        dim, sep, text = item.partition("=")
        dim = dim.strip()
        if not sep or not dim or not text.strip():
            raise UsageError(f"--select: expected dim=value such as tp_size=4, but got {item!r}")
        _check_dim(cube, dim, "--select")
        if dim in out:
            raise UsageError(f"--select: expected each dim once, but got {dim!r} twice")
        out[dim] = _coordinate_value(cube, dim, text.strip())
    return out


def _constraints(args) -> dict:
    out = {}
    if getattr(args, "memory_limit", None) is not None:
        out["memory_limit"] = args.memory_limit
    if getattr(args, "max_accelerators", None) is not None:
        out["max_accelerators"] = args.max_accelerators
    return out


def _rows(points, dims, values) -> list:
    """Result datasets of top_k / pareto_front (dim ``rank`` or ``point``) as dicts."""
    along = next(iter(points.dims), None)
    n = points.sizes[along] if along else 0
    names = [d for d in dims if d in points] + [v for v in values if v in points]
    data = {name: np.asarray(points[name].values) for name in names}
    return [{name: _plain(data[name][i]) for name in names} for i in range(n)]


# ----------------------------------------------------------------------------- explain


def step_components(out: Mapping, straggler_factor: float = 1.0) -> dict:
    """Where one layout's step time goes [s]: the terms that sum to ``step_latency_total``.

    Parameters
    ----------
    out : mapping
        ``solver.solve`` outputs for one layout (scalars).
    straggler_factor : float
        The layout's knob (the reference scales the whole step by it when > 1).

    Returns
    -------
    dict
        ``replica compute`` (the replica's roofline step), ``exposed DP
        communication`` (the share overlap does not hide), ``TP communication``,
        ``EP communication`` and ``pipeline bubble``, each scaled by the
        straggler factor, so that they sum to the step time.
    """
    scale = max(float(straggler_factor), 1.0)
    node = float(out["node_latency"])
    tp = float(out["tp_communication_latency"])
    ep = float(out["ep_communication_latency"])
    bubble = float(out["pipeline_bubble_latency"])
    exposed_dp = float(out["step_latency_total"]) / scale - node - tp - ep - bubble
    return {"replica compute": node * scale, "exposed DP communication": exposed_dp * scale,
            "TP communication": tp * scale, "EP communication": ep * scale,
            "pipeline bubble": bubble * scale}


def _price(spec, coords: Mapping) -> dict:
    workload, fleet, knobs = grid.point(spec, coords)
    out = solver.solve(workload, fleet, **knobs)
    values = {name: float(np.asarray(v)) for name, v in out.items() if np.asarray(v).dtype != bool}
    values["components"] = step_components(out, knobs.get("straggler_factor", 1.0))
    values["n_accelerators"] = round(values["dp_size"] * math.prod(
        int(knobs.get(name, 1)) for name in ("tp_size", "pp_size", "ep_size")))
    return values


def explain_runner_up(spec, winner: Mapping, runner_up: Mapping) -> str:
    """One line: why ``runner_up`` has a lower MFU than ``winner``, term by term.

    Both layouts (dim -> value, as in the cube) are priced again with
    ``solver.solve`` (float64) and their step-time components compared
    (see :func:`step_components`).

    Parameters
    ----------
    spec : Spec
        The sweep the layouts come from (for the fixed knobs).
    winner, runner_up : mapping
        Coordinates of the two layouts (every dim of ``spec``).

    Returns
    -------
    str
    """
    first = _price(spec, {d: winner[d] for d in spec.dims})
    second = _price(spec, {d: runner_up[d] for d in spec.dims})
    changed = [f"{d} {_fmt(winner[d])}->{_fmt(runner_up[d])}" for d in spec.dims
               if _fmt(winner[d]) != _fmt(runner_up[d])]
    loss = (first["mfu"] - second["mfu"]) / first["mfu"] * 100
    step = second["step_latency_total"] - first["step_latency_total"]
    diffs = {k: second["components"][k] - first["components"][k] for k in first["components"]}
    biggest = max((abs(v) for v in diffs.values()), default=0.0)
    shown = sorted((kv for kv in diffs.items()
                    if abs(kv[1]) > max(1e-7, 0.02 * biggest)), key=lambda kv: -abs(kv[1]))[:4]
    terms = ", ".join(f"{_seconds(v)} {k}" for k, v in shown) or "no step-time term differs"
    relative = step / first["step_latency_total"] * 100
    what = "longer" if step >= 0 else "shorter"
    count = (f" on {second['n_accelerators']} accelerators instead of {first['n_accelerators']}"
             if second["n_accelerators"] != first["n_accelerators"] else "")
    return (f"Why #1 wins: #2 ({', '.join(changed) or 'same layout'}) has {loss:.1f}% lower "
            f"MFU{count}; its step is {abs(relative):.1f}% {what} ({_seconds(step)}): {terms}.")


# ----------------------------------------------------------------------------- main job


def _best_per_split(cube, k: int) -> list:
    """The best admissible layout of each parallel split (by MFU), best first, at most ``k``."""
    from . import best_along

    splits = [d for d in ("workload", "fleet") + _SPLIT_DIMS if d in cube.dims]
    if not splits:
        return _rows(analysis.top_k(cube, by="mfu", k=k), list(cube.dims), cube.data_vars)
    best = best_along(cube, splits, by="mfu")
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


def _run_main(args) -> int:
    """The main job: sweep in memory, best layout per split, why #2 loses, save the cube."""
    import sweep

    spec = load_spec(args.spec)
    output = None if args.no_save else _check_output(args.output, "-o")
    started = time.perf_counter()
    cube = sweep.run(spec, n_jobs=args.jobs, progress=_progress(args))
    elapsed = time.perf_counter() - started
    workload = " + ".join(spec.workloads)
    fleets = " + ".join(f"{k} ({f.total_accelerators} x {f.node.accelerator.name})"
                        for k, f in spec.fleets.items())
    admissible = int(cube["admissible"].sum())
    limits = ", ".join(f"{spec.memory_limit_for(f) / _GB:.0f} GB" for f in spec.fleets.values())
    if spec.max_accelerators is not None:
        limits += f", at most {spec.max_accelerators} accelerators"
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


# ----------------------------------------------------------------------------- commands


def _cmd_run(args) -> int:
    """``run``: stream a spec's sweep into a cube file and summarize it."""
    import sweep

    spec = load_spec(args.spec)
    path = _check_output(args.output or f"{spec.name}.nc", "-o")
    before = path.stat().st_mtime_ns if path.exists() else None
    started = time.perf_counter()
    try:
        blocks = {"max_points": args.max_points} if args.max_points else {}
        cube = sweep.run(spec, n_jobs=args.jobs, path=path, progress=_progress(args),
                         resume=args.resume, **blocks)
    except KeyboardInterrupt:
        print(f"{args.prog}: interrupted; the sweep so far is in {path}.partial: continue it "
              f"with `{args.prog} run {args.spec} -o {path} --resume`", file=sys.stderr)
        return EXIT_INTERRUPTED
    except FileExistsError as err:  # staged blocks of an earlier run, and no --resume
        raise UsageError(f"{err} (on the command line: add --resume)") from None
    elapsed = time.perf_counter() - started
    shape = " x ".join(f"{d} {n}" for d, n in zip(spec.dims, spec.shape))
    admissible = int(cube["admissible"].sum())
    print(f"{spec.name}: {spec.size:,} layouts ({shape})")
    if args.resume and before is not None and path.stat().st_mtime_ns == before:
        print(f"{path} already holds this finished sweep; {admissible:,} admissible")
        cube.close()
        return EXIT_OK
    print(f"priced in {elapsed:.2f} s ({spec.size / max(elapsed, 1e-9):,.0f} layouts/s); "
          f"{admissible:,} admissible")
    print(f"wrote {path} ({_human_bytes(path.stat().st_size)})")
    cube.close()
    return EXIT_OK


def _search_rows(result) -> tuple:
    """``(rows, names)`` of a :class:`SearchResult`'s top layouts, for :func:`_layout_table`."""
    rows = []
    for entry in result.top:
        params = {k: v for k, v in entry["params"].items() if v is not None}
        rows.append({**params, **entry["values"]})
    dims = []
    for entry in result.top:
        dims += [k for k, v in entry["params"].items() if v is not None and k not in dims]
    return rows, dims


def _cmd_search(args) -> int:
    """``search``: optuna (or exhaustive) search; the summary and the top layouts."""
    import importlib

    # The module, not sweep.search (the package exports the function under that name).
    search_mod = importlib.import_module("sweep.search")

    if args.objective not in search_mod.DEFAULT_DIRECTIONS:
        choices = sorted(search_mod.DEFAULT_DIRECTIONS)
        raise UsageError(f"--objective: expected an output of solver.solve or a derived "
                         f"quantity ({', '.join(choices)}), but got {args.objective!r}"
                         f"{_suggest(args.objective, choices)}")
    spec = load_spec(args.spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "no feasible layout": the summary says
        try:
            result = search_mod.search(
                spec, n_trials=args.trials, seed=args.seed, memory_limit=args.memory_limit,
                objective=args.objective, sampler=args.sampler, storage=args.storage,
                study_name=args.study_name, top_k=args.top,
                mode="exact" if args.exact else "sample", progress=_progress(args),
                n_jobs=args.jobs, **({"batch_size": args.batch_size} if args.batch_size else {}))
        except ValueError as err:  # documented: bad sampler, storage, or a stored study's space
            if isinstance(err, SpecError):
                raise
            raise UsageError(f"search: {err}") from None
    print(result.summary())
    if result.top:
        rows, dims = _search_rows(result)
        values = [args.objective] + [v for v in _TABLE_VALUES if v != args.objective]
        values = [v for v in values if v in rows[0]]
        units = {v: solver.OUTPUTS.get(v, search_mod.DERIVED.get(v, ("",)))[0] for v in values}
        print()
        print(f"top {len(rows)} distinct layouts by {args.objective}:")
        print(_layout_table(rows, dims, values, units))
    return EXIT_OK


def _cmd_top(args) -> int:
    """``top``: the best layouts of a cube as a table."""
    cube = _open_cube(args.cube, args.allow_partial)
    _check_variable(cube, args.by, "--by")
    where = _check_where(cube, args.where)
    select = _parse_select(cube, args.select)
    if select:
        cube = cube.sel({d: [v] for d, v in select.items()})
    constraints = _constraints(args)
    count = int(analysis.mask(cube, where, constraints).sum())
    points = analysis.top_k(cube, by=args.by, k=args.k, where=where, largest=not args.smallest,
                            constraints=constraints, allow_partial=args.allow_partial)
    dims = list(cube.dims)
    values = [args.by] + [v for v in _TABLE_VALUES if v != args.by and v in cube.data_vars]
    rows = [_with_dp(r, _fixed(cube)) for r in _rows(points, dims, values)]
    if rows:
        dims = _split_first(dims, rows[0])
    narrowed = [f"{d}={_fmt(v)}" for d, v in select.items()] + \
        [f"{k} <= {_constraint_text(k, v)}" for k, v in constraints.items()]
    print(f"top {len(rows)} of {count:,} {where} layouts by {args.by} "
          f"({'smallest' if args.smallest else 'largest'} first)"
          + (f", {', '.join(narrowed)}" if narrowed else "") + f": {args.cube}")
    if rows:
        units = {v: cube[v].attrs.get("units") for v in values}
        print(_layout_table(rows, dims, values, units))
    cube.close()
    return EXIT_OK


def _constraint_text(key, value) -> str:
    if key == "memory_limit":
        return f"{value:g} of capacity" if value <= 1 else f"{value / _GB:g} GB"
    return _fmt(value)


def _show_facts(attrs) -> list:
    lines = []
    try:
        workloads = json.loads(attrs.get("workloads", "{}"))
        fleets = json.loads(attrs.get("fleets", "{}"))
    except ValueError:
        return lines
    for key, w in workloads.items():
        params = w.get("parameters")
        lines.append(f"  workload {key}: {w.get('kind')}"
                     + (f", {_count(params)} parameters" if params else "")
                     + (f", {w['layers']} layers" if w.get("layers") else ""))
    for key, f in fleets.items():
        node = f["node"]
        lines.append(f"  fleet {key}: {f['count']} x {node['accelerators_per_node']} "
                     f"{node['accelerator']['name']} "
                     f"({node['accelerator']['memory_capacity'] / _GB:.0f} GB) on "
                     f"{f['fabric']['name']} ({f['fabric']['bandwidth'] / _GB:.0f} GB/s)")
    return lines


def _cmd_show(args) -> int:
    """``show``: dims, variables, masks (with counts) and provenance of a cube."""
    cube = _open_cube(args.cube, args.allow_partial)
    attrs = cube.attrs
    path = Path(args.cube)
    size = int(np.prod([cube.sizes[d] for d in cube.dims], dtype=np.int64))
    print(f"{path} ({_human_bytes(path.stat().st_size)}): {attrs.get('title', 'a cube')}")
    if attrs.get("description"):
        print(f"  {attrs['description']}")
    print(*_show_facts(attrs), sep="\n")
    print(f"\ndims ({len(cube.dims)}; {size:,} points):")
    print(format_table(["dim", "size", "values"],
                       [[d, str(cube.sizes[d]), _values_text(cube[d].values)] for d in cube.dims],
                       left=(0, 2)))
    print("\nvariables:")
    every = set(cube.dims)
    rows = [[n, v.attrs.get("units", ""),
             "all" if set(v.dims) == every else ", ".join(v.dims) or "-",
             v.attrs.get("long_name", "")]
            for n, v in cube.data_vars.items() if n not in MASKS]
    print(format_table(["name", "units", "dims", "long name"], rows, left=(0, 1, 2, 3)))
    print("\nmasks:")
    rows = []
    for name in MASKS:
        count = int(cube[name].sum())
        rows.append([name, f"{count:,}", f"{100 * count / max(size, 1):.1f}%",
                     cube[name].attrs.get("long_name", "")])
    print(format_table(["mask", "points", "share", "meaning"], rows, left=(0, 3)))
    print("\nprovenance:")
    for key in ("reference", "package", "package_version", "spec_name", "spec_source",
                "date_created", "history", "memory_limit", "max_accelerators"):
        if key in attrs:
            print(f"  {key}: {attrs[key]}")
    if "fixed" in attrs:
        print(f"  fixed: {attrs['fixed']}")
    if "spec" in attrs:
        print("  spec:")
        try:
            text = _pretty_json(json.loads(attrs["spec"]))
        except ValueError:
            text = str(attrs["spec"])
        print("\n".join("    " + line for line in text.splitlines()))
    cube.close()
    return EXIT_OK


def _pretty_json(value, indent: int = 0) -> str:
    """JSON with one key per line, but short lists and tables of plain values inline."""
    inline = json.dumps(value)
    if not isinstance(value, (dict, list)):
        return inline
    members = value.values() if isinstance(value, dict) else value
    if all(not isinstance(v, (dict, list)) for v in members) and len(inline) + indent <= 100:
        return inline
    pad = " " * (indent + 2)
    if isinstance(value, dict):
        items = [f"{pad}{json.dumps(k)}: {_pretty_json(v, indent + 2)}"
                 for k, v in sorted(value.items())]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [f"{pad}{_pretty_json(v, indent + 2)}" for v in value]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


def _values_text(values, limit: int = 10) -> str:
    shown = [_fmt(v) for v in values]
    if len(shown) > limit:
        shown = shown[:limit - 3] + ["..."] + shown[-2:]
    return ", ".join(shown)


def _catalog_table(kind: str, entries=None) -> str:
    """The table of one catalog kind: the built-in entries, or ``entries`` (key -> spec)."""
    if entries is None:
        get = getattr(catalog, kind[:-1])
        entries = {name: get(name) for name in catalog.names(kind)}
    entries = sorted(entries.items())
    if kind == "workloads":
        headers = ["workload", "kind", "parameters", "layers", "hidden", "heads", "experts"]
        rows = [[k, w.kind, _count(w.parameters),
                 _opt(w.layers), _opt(w.hidden_dim), _opt(w.heads), _opt(w.experts)]
                for k, w in entries]
        return format_table(headers, rows, left=(0, 1))
    if kind == "fleets":
        headers = ["fleet", "nodes", "per node", "accelerators", "accelerator", "fabric",
                   "fabric [GB/s]"]
        rows = [[k, str(f.count), str(f.node.accelerators_per_node), str(f.total_accelerators),
                 f.node.accelerator.name, f.fabric.name, f"{f.fabric.bandwidth / _GB:.3g}"]
                for k, f in entries]
        return format_table(headers, rows, left=(0, 4, 5))
    if kind == "accelerators":
        headers = ["accelerator", "name", "peak [TFLOP/s]", "memory [GB]", "bandwidth [TB/s]",
                   "TDP [W]"]
        rows = [[k, a.name, f"{a.peak_flops / 1e12:.4g}", f"{a.memory_capacity / _GB:.4g}",
                 f"{a.memory_bandwidth / 1e12:.3g}", f"{a.tdp:.0f}" if a.tdp else "-"]
                for k, a in entries]
        return format_table(headers, rows, left=(0, 1))
    if kind == "nodes":
        headers = ["node", "accelerator", "per node", "intra-node [GB/s]"]
        rows = [[k, n.accelerator.name, str(n.accelerators_per_node),
                 f"{n.intra_node_bandwidth / _GB:.4g}"] for k, n in entries]
        return format_table(headers, rows, left=(0, 1))
    headers = ["fabric", "bandwidth [GB/s]", "latency [us]", "oversubscription"]
    rows = [[k, f"{f.bandwidth / _GB:.4g}", f"{f.latency * 1e6:.3g}" if f.latency else "-",
             f"{f.oversubscription:g}"] for k, f in entries]
    return format_table(headers, rows, left=(0,))


def _count(value) -> str:
    """A parameter count: ``70.6 B``, ``83 M``."""
    if not value:
        return "-"
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f}"


def _opt(value) -> str:
    return "-" if value is None else str(value)


def _cmd_catalog(args) -> int:
    """``catalog``: tables of the built-in catalog's entries, or of a user's catalog file."""
    if args.kind is not None and args.kind not in _CATALOG_KINDS:
        if not args.kind.endswith(".toml") and not Path(args.kind).is_file():
            raise UsageError(f"catalog: expected a catalog kind ({', '.join(_CATALOG_KINDS)}) "
                             f"or a catalog TOML file, but got {args.kind!r}"
                             f"{_suggest(args.kind, _CATALOG_KINDS)}")
        loaded = catalog.load_file(args.kind)
        shown = [kind for kind in _CATALOG_KINDS if loaded.get(kind)]
        if not shown:
            raise UsageError(f"{args.kind}: expected [workloads.NAME], [fleets.NAME], ... "
                             f"tables, but the file has no entries")
        for n, kind in enumerate(shown):
            if n:
                print()
            print(f"{kind} in {args.kind} ({len(loaded[kind])}):")
            print(_catalog_table(kind, loaded[kind]))
        return EXIT_OK
    kinds = _CATALOG_KINDS if args.kind is None else (args.kind,)
    for n, kind in enumerate(kinds):
        if n:
            print()
        print(f"{kind} ({len(catalog.names(kind))}):")
        print(_catalog_table(kind))
    return EXIT_OK


def _plot_defaults(args) -> tuple:
    if args.kind == "pareto":
        return args.x or "memory_footprint", args.y or "mfu"
    return args.x or "tp_size", args.y or "pp_size"


def _cmd_plot(args) -> int:
    """``plot``: a heatmap, line or Pareto plot of a cube, written as a PNG."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("plot: expected matplotlib to be installed (pip install "
                         "'layout-sweep[plot]'), but it is not")
    from . import plot

    cube = _open_cube(args.cube, args.allow_partial)
    where = _check_where(cube, args.where)
    select = _parse_select(cube, args.select)
    constraints = _constraints(args)
    x, y = _plot_defaults(args)
    if args.kind == "pareto":
        _check_variable(cube, x, "--x (a pareto plot's x is a variable)")
        _check_variable(cube, y, "--y (a pareto plot's y is a variable)")
        if x == y:
            raise UsageError(f"--x and --y: expected two different variables, but got {x!r} twice")
    else:
        _check_variable(cube, args.var, "--var")
        dims = [x] + ([y] if args.kind == "heatmap" else []) + ([args.hue] if args.hue else [])
        flags = ["--x", "--y" if args.kind == "heatmap" else "--hue", "--hue"]
        for dim, flag in zip(dims, flags):
            _check_dim(cube, dim, flag)
            if dim in select:
                raise UsageError(f"--select {dim}: expected a dim that is not plotted, but "
                                 f"{dim!r} is {flag}")
        if len(set(dims)) != len(dims):
            raise UsageError(f"--x, --y, --hue: expected different dims, but got {dims}")
    if args.kind == "heatmap":
        figure = plot.heatmap(cube, args.var, x, y, reduce=args.reduce, where=where,
                              select=select, constraints=constraints)
    elif args.kind == "line":
        figure = plot.line(cube, args.var, x, hue=args.hue, reduce=args.reduce, where=where,
                           select=select, constraints=constraints)
    else:
        figure = plot.pareto(cube, x, y, where=where, select=select, constraints=constraints)
    name = args.var if args.kind != "pareto" else f"{y}_vs_{x}"
    output = _check_output(args.output or f"{Path(args.cube).stem}_{args.kind}_{name}.png", "-o")
    figure.savefig(output, dpi=args.dpi)
    cube.close()
    print(f"wrote {output} ({_human_bytes(output.stat().st_size)})")
    return EXIT_OK


# ----------------------------------------------------------------------------- parser


def _add_progress(parser):
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (one is shown on a terminal)")


def _add_narrowing(parser):
    parser.add_argument("--where", default="admissible", metavar="MASK",
                        help="boolean variable selecting the points (default: admissible)")
    parser.add_argument("--memory-limit", type=_memory_limit, metavar="LIMIT",
                        help="per-accelerator memory limit: '72 GB', bytes, or a fraction of "
                             "the accelerator's memory (0.9)")
    parser.add_argument("--max-accelerators", type=_positive_int, metavar="N",
                        help="at most N accelerators")
    parser.add_argument("--select", nargs="+", metavar="DIM=VALUE",
                        help="pin dims to one value each (tp_size=4 zero_stage=1)")
    _add_allow_partial(parser)


def _add_allow_partial(parser):
    parser.add_argument("--allow-partial", action="store_true",
                        help="read an unfinished sweep's cube: the points priced so far")


def _version() -> str:
    """The installed distribution's version, from its metadata."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("layout-sweep")
    except PackageNotFoundError:  # a source checkout on sys.path, not installed
        return f"{solver.__version__} (not installed)"


def build_parser(prog: str = _PROG) -> argparse.ArgumentParser:
    """The argument parser of ``layout-sweep`` (the main job's options and the commands)."""
    parser = _Parser(
        prog=prog, description="Price millions of distributed-training layouts: sweeps into "
        "labeled cubes,\nsearches, tables and plots. With no command, runs the default sweep "
        "(configs/sweeps/default.toml)\nin memory, prints the best layouts and writes the cube.",
        epilog=f"examples:\n  {prog} run configs/sweeps/cluster_size.toml -o cluster.nc\n"
        f"  {prog} top cluster.nc --by mfu -k 5 --select zero_stage=1\n"
        f"  {prog} plot cluster.nc --kind heatmap --x tp_size --y dp_size -o mfu.png\n"
        f"  {prog} search configs/sweeps/search_llama70b.toml --trials 500 --seed 0\n"
        f"  {prog} COMMAND --help",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}",
                        help="print the installed package's version and exit")
    parser.add_argument("--spec", dest="main_spec", default=str(DEFAULT_SPEC), metavar="SPEC",
                        help="main job: a spec other than the built-in default")
    parser.add_argument("-o", "--output", dest="main_output", default=DEFAULT_CUBE, metavar="CUBE",
                        help=f"main job: where to write the cube (default: {DEFAULT_CUBE})")
    parser.add_argument("--no-save", action="store_true", help="main job: do not write the cube")
    parser.add_argument("-k", "--top", dest="main_top", type=_positive_int, default=10, metavar="K",
                        help="main job: splits shown (default: 10)")
    parser.add_argument("--jobs", dest="main_jobs", type=_jobs, default=1, metavar="N",
                        help="main job: worker processes (default: 1)")
    parser.add_argument("--no-progress", dest="main_no_progress", action="store_true",
                        help="main job: no progress bar")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    run = commands.add_parser("run", help="price every layout of a spec into a cube file",
                              description="Price every layout of a spec, streamed into a "
                              "netCDF cube file.")
    run.add_argument("spec", metavar="SPEC", help="a sweep spec (TOML)")
    run.add_argument("-o", "--output", help="the cube file (default: <spec name>.nc)")
    run.add_argument("--jobs", type=_jobs, default=1, help="worker processes (-1: every core)")
    run.add_argument("--resume", action="store_true",
                     help="continue an interrupted sweep from <output>.partial")
    run.add_argument("--max-points", type=_positive_int, default=None,
                     help="points per block (bounds memory)")
    _add_progress(run)

    search = commands.add_parser("search", help="search a spec's layouts with optuna",
                                 description="Search a spec's layouts for the best objective "
                                 "under a memory limit (optuna), or exhaustively (--exact).")
    search.add_argument("spec", metavar="SPEC", help="a spec (TOML)")
    search.add_argument("--trials", type=_positive_int, help="trials the study should hold "
                        "(default: 256)")
    search.add_argument("--seed", type=int, help="seeds the sampler")
    search.add_argument("--memory-limit", type=_memory_limit, metavar="LIMIT",
                        help="'72 GB', bytes, or a fraction of the accelerator's memory (0.9); "
                             "default: the spec's")
    search.add_argument("--objective", default="mfu", help="output to optimize (default: mfu)")
    search.add_argument("--sampler", default="tpe", type=_one_of(_SAMPLERS, "a sampler"))
    search.add_argument("--storage", help="optuna storage: an RDB URL or a journal file "
                        "(*.log) to resume or share a study")
    search.add_argument("--study-name", help="study name (default: from the spec and space)")
    search.add_argument("--exact", action="store_true",
                        help="price every layout instead of sampling (the true optimum)")
    search.add_argument("--top", type=_positive_int, default=10, help="layouts listed")
    search.add_argument("--batch-size", type=_positive_int, help="trials priced per batch")
    search.add_argument("--jobs", type=_jobs, default=1, help="processes for --exact")
    _add_progress(search)

    top = commands.add_parser("top", help="the best layouts of a cube",
                              description="The best layouts of a cube by one variable.")
    top.add_argument("cube", metavar="CUBE", help="a cube file (netCDF)")
    top.add_argument("--by", default="mfu", help="variable to rank by (default: mfu)")
    top.add_argument("-k", type=_positive_int, default=10, help="layouts listed (default: 10)")
    top.add_argument("--smallest", action="store_true", help="smallest values first")
    _add_narrowing(top)

    show = commands.add_parser("show", help="dims, variables, masks and provenance of a cube",
                               description="Dims, variables, masks and provenance of a cube.")
    show.add_argument("cube", metavar="CUBE", help="a cube file (netCDF)")
    _add_allow_partial(show)

    cat = commands.add_parser("catalog", help="workloads, fleets and hardware known by name",
                              description="The built-in catalog, with key facts.")
    cat.add_argument("kind", nargs="?", metavar="KIND|FILE",
                     help=f"one of {', '.join(_CATALOG_KINDS)} (default: all), or a catalog "
                          f"TOML file of your own to list its entries")

    plt = commands.add_parser("plot", help="heatmap, line or Pareto plot of a cube (PNG)",
                              description="Plot a cube: a heatmap of a variable over two dims "
                              "or a line along one (the other dims reduced over the selected "
                              "points, or pinned with --select), or a Pareto scatter of two "
                              "variables.")
    plt.add_argument("cube", metavar="CUBE", help="a cube file (netCDF)")
    plt.add_argument("--kind", default="heatmap", type=_one_of(_PLOT_KINDS, "a plot kind"))
    plt.add_argument("--var", default="mfu", help="variable plotted (heatmap, line)")
    plt.add_argument("--x", help="dim on x (default tp_size); pareto: a variable "
                     "(default memory_footprint)")
    plt.add_argument("--y", help="dim on y (default pp_size); pareto: a variable (default mfu)")
    plt.add_argument("--hue", help="line: one line per value of this dim")
    plt.add_argument("--reduce", default="max", type=_one_of(("max", "min", "mean"),
                                                             "a reduction"),
                     help="how the dims not plotted are reduced (default: max)")
    plt.add_argument("-o", "--output", help="PNG file (default: <cube>_<kind>_<var>.png)")
    plt.add_argument("--dpi", type=_positive_int, default=120)
    _add_narrowing(plt)
    return parser


_COMMANDS = {"run": _cmd_run, "search": _cmd_search, "top": _cmd_top, "show": _cmd_show,
             "catalog": _cmd_catalog, "plot": _cmd_plot}


def _dispatch(args) -> int:
    if args.command is None:
        args.output, args.top, args.jobs = args.main_output, args.main_top, args.main_jobs
        args.no_progress, args.spec = args.main_no_progress, args.main_spec
        return _run_main(args)
    return _COMMANDS[args.command](args)


def _one_line(message: str) -> str:
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())


def main(argv: Optional[Sequence[str]] = None, *, prog: str = _PROG) -> int:
    """Run the command line; return the exit status.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments (default: ``sys.argv[1:]``).
    prog : str
        The program's name in messages.

    Returns
    -------
    int
        0 on success, 2 for a user error (one line on stderr), 130 when interrupted.
    """
    parser = build_parser(prog)
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as done:  # --help, --version
            return int(done.code or 0)
        args.prog = prog
        return _dispatch(args)
    except (UsageError, SpecError, catalog.CatalogError) as err:
        message = _one_line(err)
        if not message.startswith(prog):
            message = f"{prog}: error: {message}"
        print(message, file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `layout-sweep catalog | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
