"""``top``: the best layouts of a cube as a table (layouts equal in every output are one row)."""

from __future__ import annotations

import numpy as np

from solver.outputs import MAXIMIZE

from .. import analysis
from ..analysis import NoAdmissibleError, step_components
from ..analysis._aliases import direction_of
from ..analysis.scenarios import JOB_DIMS, described
from ..analysis.explain import _plain
from ..analysis.ties import EQUIVALENT, TIES, parse_equivalent
from ._common import _GB, EXIT_OK, UsageError
from .cubes import (_check_variable, _check_where, _constraints, _fixed, _open_cube,
                    _parse_select, _rows, _split_first, _with_dp)
from .format import _TABLE_VALUES, _fmt, _layout_table, format_table

__all__ = ["command", "with_equivalents", "breakdown_table"]

#: ``--breakdown``: where a layout's step goes, per physics model: (column, variable).
#: The megatron terms are its own outputs, and the step's rest is ``other``: the fixed
#: per-step overhead and the time the host's kernel launches add where a layer's GPU
#: work is shorter than them (``layer_overhead``). The mlsysim terms are
#: :func:`sweep.analysis.step_components`' (its exposed DP time is the step's rest).
TIME_TERMS = {
    "megatron": (("compute", "compute_latency"), ("TP", "tp_communication_latency"),
                 ("CP", "cp_communication_latency"), ("EP", "ep_communication_latency"),
                 ("PP", "pp_communication_latency"), ("DP exposed", "dp_communication_latency"),
                 ("bubble", "pipeline_bubble_latency"), ("optimizer", "optimizer_latency")),
    "mlsysim": (("compute", "node_latency"), ("TP", "tp_communication_latency"),
                ("EP", "ep_communication_latency"), ("bubble", "pipeline_bubble_latency")),
}
#: The megatron model's host launch time a layer's GPU work does not hide, where the cube
#: keeps it (else it is part of ``other``).
LAUNCH_TERM = ("launch", "launch_latency")
#: The megatron model's stall on activation offloading's host-link copies, where the cube
#: keeps it (a cube from before 2026-12-06 has none: its layouts offload nothing).
OFFLOAD_TERM = ("offload", "offload_latency")
#: step_components' names of the mlsysim terms, as columns.
_MLSYSIM_COLUMNS = {"replica compute": "compute", "TP communication": "TP",
                    "EP communication": "EP", "pipeline bubble": "bubble",
                    "exposed DP communication": "DP exposed"}
#: ``--breakdown`` flags a megatron layout whose ``other`` is at least this share of its step.
LAUNCH_BOUND = 0.05
#: Memory per accelerator, both models: (column, variable).
MEMORY_TERMS = (("weights", "memory_weights"), ("gradients", "memory_gradients"),
                ("optimizer state", "memory_optimizer_state"), ("activations", "memory_activations"),
                ("buffers", "memory_communication_buffers"))


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


def _calibration_name(text) -> str:
    """The calibration profile a cube was priced with, as ``top`` names it ("" for none)."""
    if not text:
        return ""
    import json

    try:
        profile = json.loads(text)
    except ValueError:
        return "(unreadable: see show)"
    return f"{profile.get('path') or '(a profile)'} (see show for its constants)"


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
    try:  # an output of neither physics model of the points selected: all NaN there
        analysis.masks.require_output(cube, objective, getattr(args, "objective_flag",
                                                               "--objective"))
    except KeyError as err:
        cube.close()
        raise UsageError(str(err)) from None
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
    # (before any output: a cube that lacks the terms is refused with nothing printed)
    breakdown = breakdown_table(cube, points, dims) if getattr(args, "breakdown", False) else None
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
    calibration = _calibration_name(cube.attrs.get("calibration"))
    if calibration:
        print(f"priced with the calibration {calibration}")
    if rows:
        units = {v: cube[v].attrs.get("units") for v in values}
        print(_layout_table(rows, dims, values, units))
        ties = [int(t) for t in points[TIES].values] if TIES in points else []
        if any(t > 1 for t in ties):
            print(f"a|b: layouts with these values are equal in every output "
                  f"({sum(ties):,} layouts in {len(ties)} rows; --keep-ties lists each)")
        spans = [d for d in JOB_DIMS if d in cube.dims and cube.sizes[d] > 1]
        if spans:  # (physics and precision warn on their own, where they mislead)
            one = ", ".join(f"{d}={_fmt(cube[d].values[0])}" for d in spans)
            what, over = described(spans)
            print(f"this ranking spans more than one {' and '.join(spans)} ({what}, not a "
                  f"choice between layouts; the main job ranks each on its own): --select "
                  f"{one.replace(', ', ' ')} ranks one "
                  f"{'job' if over == 'jobs' else 'value of each'}")
        if breakdown:
            print()
            print(breakdown)
    cube.close()
    return EXIT_OK


def _terms_of(row, fixed, physics) -> dict:
    """One row's step terms [s] and memory parts [byte], or the variables it lacks."""
    model = str(row.get("physics", physics) or "mlsysim")
    missing = [n for n in [v for _, v in TIME_TERMS[model]] + ["step_latency_total"] if n not in row]
    if missing:
        return {"missing": missing}
    step = float(row["step_latency_total"])
    if model == "mlsysim":  # the terms sum to the step, the straggler factor applied
        straggler = _plain(row.get("straggler_factor", fixed.get("straggler_factor", 1.0)))
        terms = {_MLSYSIM_COLUMNS[k]: v for k, v in step_components(row, straggler).items()}
    else:
        terms = {label: float(row[name]) for label, name in TIME_TERMS[model]}
        if LAUNCH_TERM[1] in row:  # (a cube from before 2026-12-05 leaves it in "other")
            terms[LAUNCH_TERM[0]] = float(row[LAUNCH_TERM[1]])
        if OFFLOAD_TERM[1] in row and float(row[OFFLOAD_TERM[1]]) != 0.0:
            terms[OFFLOAD_TERM[0]] = float(row[OFFLOAD_TERM[1]])
        terms["other"] = step - sum(terms.values())
    memory = {label: float(row[name]) for label, name in MEMORY_TERMS if name in row}
    if memory and "memory_footprint" in row:
        memory["footprint"] = float(row["memory_footprint"])
    return {"model": model, "step": step, "terms": terms, "memory": memory}


def breakdown_table(cube, points, dims) -> str:
    """``top --breakdown``: each listed layout's step time by term (share of its step) and
    its memory by part [GB], from the cube's own variables.

    Raises :class:`UsageError` naming the variables the cube does not keep (a spec's
    ``outputs`` that leaves them out).
    """
    physics = cube.attrs.get("physics")
    fixed = _fixed(cube)
    names = set()
    for model in TIME_TERMS:
        names.update(v for _, v in TIME_TERMS[model])
    names.update(v for _, v in MEMORY_TERMS)
    names.update((LAUNCH_TERM[1], OFFLOAD_TERM[1], "memory_footprint"))
    rows = _rows(points, dims, sorted(names | {"step_latency_total", "straggler_factor"}))
    parts = [_terms_of(row, fixed, physics) for row in rows]
    missing = sorted({n for p in parts for n in p.get("missing", ())})
    if missing:
        raise UsageError(f"--breakdown: this cube does not keep {', '.join(missing)} (its spec's "
                         f"`outputs` leaves them out): add them to `outputs`, or drop `outputs` "
                         f"to keep every output, and run the sweep again")
    labels = []
    for p in parts:
        labels += [k for k in p["terms"] if k not in labels]
    memory = [label for label in [k for k, _ in MEMORY_TERMS] + ["footprint"]
              if any(label in p["memory"] for p in parts)]
    headers = ["#", "step [s]"] + [f"{k} %" for k in labels] + [f"{k} [GB]" for k in memory]
    cells = []
    for i, p in enumerate(parts, 1):
        step = p["step"]
        cells.append([str(i), f"{step:.3f}"]
                     + [(f"{100 * p['terms'][k] / step:.1f}" if k in p["terms"] and step > 0 else "-")
                        for k in labels]
                     + [(f"{p['memory'][k] / _GB:.1f}" if k in p["memory"] else "-") for k in memory])
    models = {p["model"] for p in parts}
    notes = []
    if "megatron" in models:
        notes.append("launch: the time the host's kernel launches add where a layer's GPU work "
                     "is shorter (layer_overhead); other: the fixed per-step overhead"
                     if any(LAUNCH_TERM[0] in p["terms"] for p in parts) else
                     "other: the fixed per-step overhead, and the time the host's kernel launches "
                     "add where a layer's GPU work is shorter (layer_overhead)")
        bound = [str(i) for i, p in enumerate(parts, 1)
                 if p["model"] == "megatron"
                 and p["terms"]["other"] + p["terms"].get(LAUNCH_TERM[0], 0.0)
                 >= LAUNCH_BOUND * p["step"]]
        if bound:
            notes.append(f"#{', #'.join(bound)}: {LAUNCH_BOUND:.0%} or more of the step is launch "
                         f"and other, "
                         f"so its time rests on layer_overhead and step_overhead, which only "
                         f"vTrain's single-node A100 runs identify (README, Fidelity): calibrate "
                         f"them on a few runs of your own (`python -m sweep calibrate`)")
    if "mlsysim" in models:
        notes.append("DP exposed (mlsysim): what the other terms leave of the step")
    over = [str(i) for i, p in enumerate(parts, 1) if "footprint" in p["memory"]
            and sum(v for k, v in p["memory"].items() if k != "footprint")
            > p["memory"]["footprint"] * (1 + 1e-9)]
    if over:
        notes.append(f"#{', #'.join(over)}: the parts add up to more than the footprint: the "
                     f"optimizer state holds the step's FP32 copy of 16-bit gradients, which is "
                     f"never held beside the activations and buffers (the footprint counts the "
                     f"larger)")
    if not memory:
        notes.append(f"memory by part: this cube does not keep it (its spec's `outputs` leaves out "
                     f"{', '.join(name for _, name in MEMORY_TERMS)}; add them to `outputs`, or "
                     f"drop `outputs` to keep every output)")
    title = "where each step goes (share of step_latency_total, %)" + (
        " and memory per accelerator:" if memory else ":")
    return "\n".join([title, format_table(headers, cells)] + notes)


def _constraint_text(key, value) -> str:
    if key == "memory_limit":
        if value.fraction is not None:
            return f"{value.fraction:g} of capacity"
        return f"{value.size / _GB:g} GB"
    return _fmt(value)
