"""Why an answer is empty: how many points each condition removed, and which to relax.

An analysis with no admissible point says why instead of answering nothing:

    >>> counts = admissible_counts(cube, constraints={"max_accelerators": 512})  # doctest: +SKIP
    >>> print(explain_empty(counts))                                           # doctest: +SKIP
    no admissible layout among 64 points: valid split removed 16, fits memory removed 0,
    accelerator budget (<= 512) removed 48; relax accelerator budget (<= 512): 48 layouts
    pass every other condition

``counts`` is a plain mapping, so that a search (which prices points one by one
rather than holding a cube) can build it too and reuse :func:`explain_empty`:

``total``
    Points considered.
``removed``
    Condition -> points it removed, the conditions applied in order (each counts
    only the points the earlier ones kept), so they sum to ``total`` when nothing
    is left.
``relaxed`` (optional)
    Condition -> points that pass every *other* condition: what dropping (or
    relaxing) that condition alone would give back.
``why`` (optional)
    Condition -> one sentence on why the points only it removes fail it (for
    ``realizable``: how many do not split the global batch into whole
    microbatches, and the batch size that would split the most of them).
"""

from __future__ import annotations

import json
from typing import Mapping, Optional

import numpy as np
import xarray as xr

from solver.physics import common, megatron as megatron_model

__all__ = ["NoAdmissibleError", "admissible_counts", "explain_empty", "conditions", "tally",
           "realizable_evidence", "merge_evidence", "realizable_text", "batch_split_knobs"]

#: Names of the conditions of ``admissible``, as the explanation says them.
VALID, FEASIBLE, LIMIT, BUDGET, REALIZABLE = ("valid split", "fits memory", "within the memory "
                                              "limit", "accelerator budget", "realizable")


class NoAdmissibleError(ValueError):
    """No point passes the conditions asked for; ``counts`` says how many each removed.

    The message is :func:`explain_empty` of ``counts`` (see :mod:`sweep.analysis.empty`).
    """

    def __init__(self, counts: Mapping, what: str = "layout"):
        self.counts = dict(counts)
        super().__init__(explain_empty(counts, what))


def _budget(cube, key: str = "max_accelerators") -> Optional[float]:
    """The spec's ``max_accelerators`` (or ``key``) recorded in the cube, if any."""
    value = cube.attrs.get(key)
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def conditions(cube: xr.Dataset, where=None, constraints: Optional[Mapping] = None) -> dict:
    """The conditions an analysis applies, in order: name -> boolean DataArray.

    ``where`` by default (or ``"admissible"``) is taken apart into the cube's own
    conditions: valid split, fits memory (``feasible``), within the memory limit
    (``within_memory_limit``), the spec's accelerator budget, realizable (when
    the cube has that mask). Any other ``where`` is one condition. Then each of
    ``constraints`` (see :func:`sweep.analysis.mask`) is one more.
    """
    from .masks import mask

    out = {}
    if where is None:
        where = "admissible" if "admissible" in cube.data_vars else "valid"
    if isinstance(where, str) and where == "admissible":
        out.update(_parts_of_admissible(cube))
    else:
        name = where if isinstance(where, str) else "the where mask"
        out[f"where={name}" if isinstance(where, str) else name] = mask(cube, where)
    for key, value in (constraints or {}).items():
        every = xr.DataArray(True)
        label = {"memory_limit": f"memory limit ({_describe_limit(value)})",
                 "max_accelerators": f"{BUDGET} (<= {value})",
                 "min_accelerators": f"the accelerator floor (>= {value})"}.get(
            key, f"{key} in {value!r}")
        out[label] = mask(cube, every, {key: value})
    return out


def _parts_of_admissible(cube) -> dict:
    """``admissible`` taken apart into the cube's named conditions (name -> DataArray).

    A condition ``admissible`` does not imply (``feasible`` when the limit is above
    the capacity) is left out; whatever ``admissible`` holds beyond the named
    ones (a condition added later) is one more, so that the counts stay right.
    """
    admissible = cube["admissible"]
    parts = {name: cube[var] for name, var in ((VALID, "valid"), (FEASIBLE, "feasible"),
                                               (LIMIT, "within_memory_limit"),
                                               (REALIZABLE, "realizable"))
             if var in cube.data_vars}
    budget = _budget(cube)
    if budget is not None and "n_accelerators" in cube.data_vars:
        parts[f"{BUDGET} (<= {budget:g}, the spec's)"] = cube["n_accelerators"] <= budget
    least = _budget(cube, "min_accelerators")
    if least is not None and "n_accelerators" in cube.data_vars:
        parts[f"accelerator minimum (>= {least:g}, the spec's)"] = cube["n_accelerators"] >= least
    parts = {name: c for name, c in parts.items() if not bool((admissible & ~c).any())}
    every = xr.DataArray(True)
    for condition in parts.values():
        every = every & condition
    if bool((every & ~admissible).any()):
        parts["admissible (its other conditions)"] = admissible
    return parts


def _describe_limit(value) -> str:
    from ..limits import parse_memory_limit

    try:
        return parse_memory_limit(value, where="").describe()
    except ValueError:
        return repr(value)


def _count(array, sizes) -> int:
    """True points of ``array`` over a cube of ``sizes`` (dims it lacks broadcast)."""
    missing = int(np.prod([n for d, n in sizes.items() if d not in array.dims], dtype=np.int64))
    return int(array.sum()) * missing


def admissible_counts(cube: xr.Dataset, where=None, constraints: Optional[Mapping] = None) -> dict:
    """How many points each condition removes, and what relaxing each gives back.

    Parameters
    ----------
    cube : xarray.Dataset
    where, constraints
        As for :func:`sweep.analysis.mask`.

    Returns
    -------
    dict
        ``total``, ``removed`` and ``relaxed``, as described in
        :mod:`sweep.analysis.empty`; plus ``admissible`` (points left).
    """
    sizes = dict(cube.sizes)
    total = int(np.prod(list(sizes.values()), dtype=np.int64))
    named = conditions(cube, where, constraints)
    removed, relaxed, left = tally(named, lambda kept: _count(kept, sizes), total)
    out = {"total": total, "removed": removed, "relaxed": relaxed, "admissible": left}
    if REALIZABLE in named and relaxed[REALIZABLE] and not out["admissible"]:
        others = xr.DataArray(True)
        for other, condition in named.items():
            if other != REALIZABLE:
                others = others & condition
        why = _realizable_why(cube, others & ~named[REALIZABLE], sizes)
        if why:
            out["why"] = {REALIZABLE: why}
    return out


def tally(named: Mapping, count, every):
    """``removed``, ``relaxed`` and the points left of the conditions ``named`` (name ->
    mask, applied in order; see :mod:`sweep.analysis.empty`): ``count(mask)`` counts the
    points a mask keeps (a number, or one per slice), ``every`` those before any."""
    removed, relaxed = {}, {}
    kept, left = None, every
    for name, condition in named.items():
        kept = condition if kept is None else kept & condition
        after = count(kept)
        removed[name], left = left - after, after
    for name in named:
        others = None
        for other, condition in named.items():
            if other != name:
                others = condition if others is None else others & condition
        relaxed[name] = every if others is None else count(others)
    return removed, relaxed, left


def explain_empty(counts: Mapping, what: str = "layout") -> str:
    """One paragraph: no admissible ``what``, how many points each condition removed, what to relax.

    Parameters
    ----------
    counts : mapping
        ``total``, ``removed`` and optionally ``relaxed`` (see
        :mod:`sweep.analysis.empty`).
    what : str
        What the points are (``"layout"``, ``"trial"``).

    Returns
    -------
    str
    """
    total = int(counts.get("total", 0))
    removed = {k: int(v) for k, v in dict(counts.get("removed", {})).items()}
    if total == 0:
        return f"no admissible {what}: there are no points to consider (an empty selection)"
    shown = [f"{name} removed {n:,}" for name, n in removed.items()]
    text = f"no admissible {what} among {total:,} points: " + (", ".join(shown) or "none removed")
    relaxed = {k: int(v) for k, v in dict(counts.get("relaxed", {})).items() if int(v) > 0}
    # The split and the accelerator's memory are physics, not a limit: widen the axes instead.
    choices = {k: v for k, v in relaxed.items() if k not in (VALID, FEASIBLE)}
    if choices:
        best = max(choices, key=lambda k: choices[k])
        n = choices[best]
        verb = f"{what}s pass" if n != 1 else f"{what} passes"
        text += f"; relax {best}: {n:,} {verb} every other condition"
    elif relaxed or removed:
        text += ("; no limit relaxed alone gives a point: widen the axes (splits, ZeRO stages, "
                 "recomputation) or relax two or more")
    for name, why in dict(counts.get("why", {})).items():
        text += f". {name[:1].upper()}{name[1:]}: {why}"
    return text


def _knob(cube, name, default):
    """A knob of the cube as a DataArray (its axis) or a number (fixed, else the default);
    None where it is neither a number nor an axis."""
    if name in cube.coords:
        return cube[name]
    try:
        value = json.loads(cube.attrs.get("fixed") or "{}").get(name, default)
    except (TypeError, ValueError):
        value = default
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _realizable_why(cube, blocked, sizes) -> Optional[str]:
    """Why the points only ``realizable`` removes (``blocked``) are not realizable, from the
    cube (:func:`realizable_evidence` of its arrays); None where it lacks what that needs."""
    if "dp_size" not in cube.variables or ("physics" in cube.dims and cube.sizes["physics"] > 1):
        return None  # (a physics axis: each model's rule on its own slice, not said here)
    # one model's slice of a physics axis (a coordinate of one value, or a dim of length one)
    sliced = ("physics" in cube.coords and cube["physics"].size == 1
              and str(np.asarray(cube["physics"].values).ravel()[0]) == "megatron")
    megatron = cube.attrs.get("physics") == "megatron" or sliced
    factors = [_knob(cube, n, default) for n, default in batch_split_knobs(megatron).items()]
    batch = _knob(cube, "batch_size", 1 if megatron else None)
    if batch is None or any(f is None for f in factors):
        return None
    divisor = cube["dp_size"]
    for f in factors:
        divisor = divisor * f
    dims = set(blocked.dims) | set(divisor.dims) | set(getattr(batch, "dims", ()))
    if int(np.prod([sizes[d] for d in dims], dtype=np.int64)) > WHY_MAX_POINTS:
        return None  # (a streamed cube: the arrays would not fit in memory)
    arrays = xr.broadcast(blocked, cube["dp_size"], divisor,
                          batch if isinstance(batch, xr.DataArray) else xr.DataArray(batch))
    each = _count(xr.DataArray(True), {d: n for d, n in sizes.items() if d not in arrays[0].dims})
    evidence = realizable_evidence(*(a.values for a in arrays), megatron=megatron, each=each,
                                   scalar_batch=not isinstance(batch, xr.DataArray))
    if megatron:
        rules = _megatron_rules(cube, blocked)
        if rules is not None:
            evidence["rules"] = {name: n * each for name, n in rules.items()}
    return realizable_text(evidence)


#: Most points :func:`megatron_rules` asks the rules of (the first ones, in order).
RULES_MAX_POINTS = 1 << 18


def megatron_rules(workload, fleet, knobs: Mapping, blocked) -> Optional[dict]:
    """Rule -> how many of the points ``blocked`` (a boolean array) break it, from
    :func:`solver.physics.megatron.why_unrealizable` on their knobs (``knobs``: names ->
    scalars or arrays broadcasting with ``blocked``; those not the megatron model's are
    left out). A layout may break several rules. Asked of at most
    :data:`RULES_MAX_POINTS` points; None where it cannot say (the empty answer then lists
    the rules)."""
    blocked = np.asarray(blocked, bool)
    where = np.flatnonzero(blocked)[:RULES_MAX_POINTS]
    if not where.size:
        return None
    try:
        picked = {}
        for name, value in knobs.items():
            if name not in megatron_model.KNOBS:
                continue
            value = np.asarray(value)
            picked[name] = (np.broadcast_to(value, blocked.shape).reshape(-1)[where]
                            if value.ndim else value.item())
        broken = megatron_model.why_unrealizable(workload, fleet, check_shape=False, **picked)
        return {rule: int(np.count_nonzero(where_)) for rule, where_ in broken.items()}
    except Exception:  # noqa: BLE001 (a diagnostic: where it cannot say, the rules are listed)
        return None


def _megatron_rules(cube, blocked) -> Optional[dict]:
    """:func:`megatron_rules` of the points ``blocked`` (a boolean DataArray over some of the
    cube's dims): their knobs the cube's coordinates and fixed knobs, their workload and
    fleet from the built-in catalog by name; None where the cube does not say them all
    (another catalog's names, a megatron knob along a dim ``blocked`` lacks)."""
    import solver

    names = list(blocked.dims)
    if any(d not in names and d in megatron_model.KNOBS for d in cube.dims):
        return None
    mask = np.asarray(blocked.values, bool)
    # (the blocked points' coordinates only, at most RULES_MAX_POINTS: not a grid of the cube)
    where = np.flatnonzero(mask)[:RULES_MAX_POINTS]
    if not where.size:
        return None
    index = np.unravel_index(where, mask.shape)
    try:
        fixed = json.loads(cube.attrs.get("fixed") or "{}")
        point = {d: np.asarray(cube[d].values)[i] for d, i in zip(names, index)}
        labels = {}
        for key in ("workload", "fleet"):
            if key in point:
                labels[key] = point.pop(key).astype(str)
            elif key in cube.coords:  # a coordinate of one value, not in blocked's dims
                labels[key] = np.full(where.size, str(np.asarray(cube[key].values).ravel()[0]))
            else:
                labels[key] = np.full(where.size, str(cube.attrs[key]))
        knobs = {**fixed, **point}
        counts = {}
        for wl_name, fl_name in dict.fromkeys(zip(labels["workload"].tolist(),
                                                  labels["fleet"].tolist())):
            take = (labels["workload"] == wl_name) & (labels["fleet"] == fl_name)
            rules = megatron_rules(solver.catalog.workload(wl_name), solver.catalog.fleet(fl_name),
                                   knobs, take)
            if rules is None:
                return None
            for rule, n in rules.items():
                counts[rule] = counts.get(rule, 0) + n
        return counts
    except Exception:  # noqa: BLE001 (as megatron_rules)
        return None


def batch_split_knobs(megatron: bool) -> dict:
    """The knobs that times ``dp_size`` must divide the global batch (name -> default):
    ``micro_batch_size`` in the megatron physics, ``gradient_accumulation_steps`` and
    ``microbatch_count`` in mlsysim's (:func:`solver.physics.common.realizable`)."""
    if megatron:
        from solver.physics import megatron as model

        return {"micro_batch_size": model.DEFAULTS["micro_batch_size"]}
    from solver.knobs import KNOBS

    return {n: KNOBS[n].default for n in ("gradient_accumulation_steps", "microbatch_count")}


#: Largest cube (points on the dims the batch split spans) whose realizable evidence
#: :func:`admissible_counts` gathers: four arrays of it are held in memory at once.
WHY_MAX_POINTS = 1 << 25
#: Most distinct divisors :func:`realizable_evidence` keeps for the batch-size suggestion.
MAX_DIVISORS = 4096


def realizable_evidence(blocked, dp, divisor, batch, *, megatron: bool, each: int = 1,
                        scalar_batch: bool = True) -> dict:
    """What :func:`realizable_text` needs to say why layouts are not realizable.

    The global batch must split into whole microbatches: ``divisor`` (``dp_size`` times
    ``micro_batch_size`` in the megatron physics, times ``gradient_accumulation_steps``
    times ``microbatch_count`` in mlsysim's, :func:`solver.physics.common.realizable`)
    must divide ``batch_size``. The megatron model's other rules are divisibility ones
    (:func:`solver.physics.megatron_steps.split`).

    Parameters
    ----------
    blocked : array of bool
        The points only ``realizable`` removes.
    dp, divisor, batch : arrays broadcasting with ``blocked``
    megatron : bool
        Which physics priced them.
    each : int
        Points each array element stands for (dims the arrays lack).
    scalar_batch : bool
        One batch size for every point (a batch-size suggestion makes sense).

    Returns
    -------
    dict
        JSON-ready; merge blocks' with :func:`merge_evidence`.
    """
    blocked, dp, divisor, batch = np.broadcast_arrays(np.asarray(blocked, bool), dp, divisor, batch)
    with np.errstate(invalid="ignore"):
        whole = blocked & (divisor >= 1)
        fails = whole & (np.asarray(batch, np.float64) % np.where(whole, divisor, 1.0) != 0)
    values, counts = np.unique(divisor[fails].astype(np.int64), return_counts=True)
    dps = np.unique(dp[fails].astype(np.int64))
    return {"megatron": bool(megatron), "blocked": int(blocked.sum()) * each,
            "fails": int(fails.sum()) * each, "dp": [int(d) for d in dps[:6]],
            "batch": (int(batch.flat[0]) if scalar_batch and batch.size else None),
            "divisors": ({str(int(v)): int(c) * each for v, c in zip(values, counts)}
                         if values.size <= MAX_DIVISORS else None)}


def merge_evidence(a: Optional[dict], b: Optional[dict]) -> Optional[dict]:
    """Two blocks' :func:`realizable_evidence` as one; blocks of the two physics models (a
    physics axis) merge into ``{"mixed": True}``, of which nothing is said."""
    if a is None or b is None:
        return a or b
    if a.get("mixed") or b.get("mixed") or a["megatron"] != b["megatron"]:
        return {"mixed": True}
    divisors = None
    if a["divisors"] is not None and b["divisors"] is not None:
        divisors = dict(a["divisors"])
        for v, c in b["divisors"].items():
            divisors[v] = divisors.get(v, 0) + c
        divisors = divisors if len(divisors) <= MAX_DIVISORS else None
    merged = {"megatron": a["megatron"], "blocked": a["blocked"] + b["blocked"],
              "fails": a["fails"] + b["fails"], "dp": sorted(set(a["dp"]) | set(b["dp"]))[:6],
              "batch": a["batch"] if a["batch"] == b["batch"] else None, "divisors": divisors}
    if "rules" in a and "rules" in b:  # (a block that could not say them: none said)
        merged["rules"] = {k: a["rules"].get(k, 0) + b["rules"].get(k, 0)
                           for k in dict.fromkeys([*a["rules"], *b["rules"]])}
    return merged


def realizable_text(evidence: Optional[dict]) -> Optional[str]:
    """One sentence from :func:`realizable_evidence`: how many of the layouts only realizable
    removes do not split the global batch into whole microbatches, their ``dp_size`` values,
    the batch size from half to twice the given one that splits the most of them, and how
    many fail the model's other rules. None where no layout is blocked."""
    if not evidence or evidence.get("mixed") or not evidence["blocked"]:
        return None
    n_blocked, n_fail = evidence["blocked"], evidence["fails"]
    megatron, batch = evidence["megatron"], evidence["batch"]
    # the megatron model's other rules its layouts break, counted where the cube said them
    broken = {k: v for k, v in (evidence.get("rules") or {}).items()
              if v and k not in ("whole_microbatches", "valid")} if megatron else {}
    parts = []
    if n_fail:
        split = ("dp_size x micro_batch_size" if megatron
                 else "dp_size x gradient_accumulation_steps x microbatch_count")
        dps = evidence["dp"]
        shown = ", ".join(f"{d:,}" for d in dps[:5]) + (", ..." if len(dps) > 5 else "")
        what = f"batch_size ({batch:,})" if batch is not None else "batch_size"
        parts.append(f"{n_fail:,} of the {n_blocked:,} layouts it alone removes do not split "
                     f"{what} into whole microbatches ({split} must divide it; dp_size "
                     f"there: {shown})")
        best = (_best_batch(evidence["divisors"], batch)
                if batch is not None and evidence["divisors"] else None)
        # (no batch size helps where another rule blocks every layout)
        if best is not None and max(broken.values(), default=0) < n_blocked:
            parts.append(f"batch_size {best[0]:,} would split {best[1]:,} of them into whole "
                         f"microbatches")
    rest = n_blocked - n_fail
    if broken:
        from solver.physics.megatron_steps import REALIZABLE_CONDITIONS

        order = sorted(broken, key=lambda k: -broken[k])
        parts.append("the megatron model's rules they break (a layout may break several): "
                     + "; ".join(f"{name}, by {broken[name]:,}: "
                                 f"{REALIZABLE_CONDITIONS.get(name, name)}" for name in order))
    elif rest:
        rules = (f"the megatron model's rules: {megatron_model.REALIZABLE_RULES}" if megatron
                 else f"the even splits of solver.physics.common.even_splits: "
                      f"{common.EVEN_SPLIT_RULES}")
        parts.append(f"{rest:,} fail {rules}")
    return "; ".join(parts)


def _best_batch(divisors: Mapping, batch: int):
    """(batch size from ``batch // 2`` to ``2 * batch`` that divides the most points,
    how many), the nearest to ``batch`` among ties; None where none divides any.
    ``divisors``: divisor (a string, as JSON keeps it) -> points."""
    if not divisors or batch < 1:
        return None
    values = np.array([int(v) for v in divisors], dtype=np.int64)
    weight = np.array(list(divisors.values()), dtype=np.int64)
    lo, hi = max(1, batch // 2), 2 * batch
    if hi - lo > 1 << 16:
        return None
    candidates = np.arange(lo, hi + 1, dtype=np.int64)
    score = ((candidates[:, None] % values[None, :]) == 0) @ weight
    if score.max() == 0:
        return None
    top = np.flatnonzero(score == score.max())
    pick = top[np.argmin(np.abs(candidates[top] - batch))]
    return int(candidates[pick]), int(score[pick])
