"""What a search found: :class:`SearchResult`, built from a study or from an exact walk."""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import numpy as np
import optuna
from optuna.trial import TrialState

from solver import outputs as outputs_
from solver.physics import DEFAULT_PHYSICS
from solver.physics.common import caller_stacklevel

from ..pareto import nondominated
from .pricing import REPORTED, _describe, _layout_knobs

__all__ = ["SearchResult"]

_GB = 1e9


def _none_admissible(n_evaluated, limits: dict) -> str:
    """What an empty search says when it did not count what each condition removed."""
    shown = ", ".join(f"{k}: {v}" for k, v in limits.items())
    return (f"no admissible layout among the {n_evaluated} evaluated: none is a valid split that "
            f"fits the memory limit ({shown}) and the accelerator bounds and, where required, is "
            f"realizable (whole microbatches)")


@dataclass
class SearchResult:
    """What a search found.

    Attributes
    ----------
    best_params : dict or None
        The best admissible layout as ``solver.solve`` keywords (fixed,
        searched and derived knobs its physics model takes, and a calibration
        profile's constants where it priced with them) plus its ``workload``
        and ``fleet`` labels, so ``solver.solve(wl, fl, **rest)`` prices it
        again; ``None`` if no evaluated layout was admissible. For several
        objectives, the Pareto layout best in the first objective.
    best_value : float, tuple of float, or None
        Its objective value (a tuple, in ``objectives`` order, for several).
    objectives : tuple of (name, direction)
    study : optuna.Study or None
        The study (``None`` in exact mode).
    breakdown : dict
        Every output of ``solver.solve`` for the best layout as plain floats
        (compute, each communication term, the bubble, the memory breakdown),
        plus ``memory_limit``, ``memory_headroom``, ``n_accelerators``, the
        constraint values (``constraint:memory``, ...) and the objective values
        (``objective:mfu``, ...).
    top : list of dict
        Up to ``k`` distinct admissible layouts, best first: ``params``,
        ``values`` (objectives and key outputs) and ``trial`` (number, or
        ``None`` in exact mode). For several objectives, the Pareto layouts
        sorted by the first objective.
    best_trials : list of dict
        The Pareto set (distinct layouts, same shape as ``top``); for one
        objective, the best layout alone.
    n_evaluated : int
        Layouts priced: the study's finished trials (across runs and
        workers), or every grid point in exact mode.
    n_new : int
        Layouts priced by this call.
    n_admissible : int
        Admissible layouts among them: a possible split, feasible, within the
        memory limit, the accelerator budget and every extra constraint.
        (``n_feasible`` is its deprecated name.)
    memory_limits : dict
        Fleet label -> per-accelerator memory limit [B].
    mode : str
        ``"exact"`` (every layout priced) or ``"sample"``.
    sampler : str
    space_size : float
        Layouts in the space (``inf`` with a continuous axis).
    elapsed : float [s]
    reason : str
        Which mode ran and why, e.g. ``"exhaustive: 1.2e+06 layouts, 1.7 s"``
        or ``"sampled: 3.1e+11 layouts would take 2.4 h (time budget 60 s)"``.
    evidence : sweep.search.subgrid.Evidence or None
        For the sub-grid search: best so far against layouts priced, how many
        restarts agree, why it stopped.
    """

    best_params: Optional[dict]
    best_value: Any
    objectives: tuple
    study: Optional[optuna.Study]
    breakdown: dict
    top: list
    best_trials: list
    n_evaluated: int
    n_new: int
    n_admissible: int
    memory_limits: dict
    mode: str = "sample"
    sampler: str = ""
    space_size: float = math.nan
    elapsed: float = 0.0
    reason: str = ""
    evidence: Any = None
    #: Exhaustive mode: how many points each constraint removed (``total``, ``removed``,
    #: ``relaxed``; :func:`sweep.analysis.explain_empty` reads it).
    empty_counts: Optional[dict] = None
    #: The calibration profile the layouts were priced with, as the summary names it ("" for
    #: none: the shipped constants).
    calibration: str = ""
    #: The calibration's constants among the params of its physics' layouts (the summary's
    #: layout line leaves them out: :meth:`constants_of`), and that physics.
    constants: tuple = ()
    constants_physics: str = ""

    def constants_of(self, params: Mapping) -> tuple:
        """The calibration's constants among ``params`` (a layout of ``top`` or
        ``best_params``): none unless the layout is of the calibration's physics (an
        mlsysim knob may share a constant's name, ``overlap_efficiency``)."""
        return self.constants if params.get("physics", DEFAULT_PHYSICS) == self.constants_physics else ()

    @property
    def is_multi_objective(self) -> bool:
        return len(self.objectives) > 1

    @property
    def pareto(self) -> list:
        """The Pareto set: :attr:`best_trials`."""
        return self.best_trials

    @property
    def best_values(self) -> Optional[tuple]:
        """The best layout's objective values, always a tuple (``None`` if none admissible)."""
        if self.best_value is None:
            return None
        return self.best_value if isinstance(self.best_value, tuple) else (self.best_value,)

    @property
    def n_feasible(self) -> int:
        """Deprecated name of :attr:`n_admissible`."""
        warnings.warn("SearchResult.n_feasible is deprecated: use n_admissible",
                      DeprecationWarning, stacklevel=2)
        return self.n_admissible

    def why_empty(self) -> str:
        """Why no layout is admissible: how many points (exhaustive) or trials (sampled) each
        condition removed and what to relax (:func:`sweep.analysis.explain_empty`), or, where
        nothing was counted, every condition a layout must meet."""
        if self.empty_counts:
            from ..analysis.empty import explain_empty

            text = explain_empty(self.empty_counts, "layout" if self.mode == "exact" else "trial")
        else:
            text = _none_admissible(self.n_evaluated, {k: f"{v / _GB:.1f} GB"
                                                       for k, v in self.memory_limits.items()})
        if self.mode != "exact" and self.n_evaluated < self.space_size:
            # a sample that saw little of the space says nothing yet about relaxing the job
            size = ("a continuous space" if math.isinf(self.space_size)
                    else f"{self.space_size:,.0f}")
            text = (f"A sampled search saw {self.n_evaluated:,} layouts of {size}: "
                    f"more trials (n_trials, --trials; or none, to search for the time budget) "
                    f"or mode='exhaustive' may find admissible layouts before any condition is "
                    f"relaxed. " + text)
        return text

    def summary(self, explain_empty: bool = True) -> str:
        """A few lines: the best layout, its value, where its step time and memory go.

        With no admissible layout, the last line says why (``explain_empty=False``: the
        caller says it itself, as the CLI does on stderr)."""
        names = ", ".join(f"{n} ({d})" for n, d in self.objectives)
        how = "exhaustive" if self.mode == "exact" else f"{self.sampler}"
        size = ("continuous" if math.isinf(self.space_size) else f"{self.space_size:.3g}")
        if self.mode == "exact":
            lines = [f"search [{how}] for {names}: {self.n_evaluated:,} layouts evaluated "
                     f"({self.n_new:,} new) of a space of {size}; {self.n_admissible:,} admissible"]
        else:  # a sample prices a layout again where its trials or sub-grids meet
            recorded = (len(self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
                        if self.study is not None else None)
            lines = [f"search [{how}] for {names}: {self.n_evaluated:,} layout pricings "
                     f"({self.n_new:,} this run; a layout priced again counts again) in a space "
                     f"of {size}; {self.n_admissible:,} admissible"
                     + (f" among the {recorded:,} trials recorded" if recorded is not None else "")]
        if self.reason:
            lines.append(f"mode {self.reason}")
        if self.calibration:
            lines.append(f"priced with the calibration {self.calibration}")
        if self.evidence is not None:
            lines.append(self.evidence.summary())
        if self.best_params is None:
            if explain_empty:
                lines.append(self.why_empty())
            return "\n".join(lines)
        value = (self.best_value if not self.is_multi_objective
                 else ", ".join(f"{v:.6g}" for v in self.best_value))
        lines.append(f"best: {value if isinstance(value, str) else f'{value:.6g}'}"
                     + (f"  ({len(self.best_trials)} Pareto layouts)"
                        if self.is_multi_objective else ""))
        shown = {k: v for k, v in self.best_params.items()
                 if k not in ("workload", "fleet", *self.constants_of(self.best_params))}
        lines.append(f"layout: {self.best_params['workload']} on {self.best_params['fleet']}: "
                     + ", ".join(f"{k}={v}" for k, v in shown.items()))
        lines.extend(self._breakdown_lines())
        return "\n".join(lines)

    def _breakdown_lines(self) -> list:
        b = self.breakdown
        physics = self.best_params.get("physics", "mlsysim")
        exposed_dp = float(outputs_.exposed_dp_time(
            b, float(self.best_params.get("straggler_factor", 1.0)), physics))
        first = (f"step {b['step_latency_total']:.4g} s: compute {b['compute_latency']:.4g} s, "
                 f"exposed DP {exposed_dp:.4g}, TP {b['tp_communication_latency']:.4g}, CP "
                 f"{b['cp_communication_latency']:.4g}, PP {b['pp_communication_latency']:.4g}, "
                 f"EP {b['ep_communication_latency']:.4g}, bubble "
                 f"{b['pipeline_bubble_latency']:.4g}, optimizer {b['optimizer_latency']:.4g}"
                 + (f", offload {b['offload_latency']:.4g}" if b.get('offload_latency') else "")
                 + f"; mfu {b['mfu']:.4f} on {b['n_accelerators']:.0f} accelerators (megatron)"
                 if physics == "megatron" else None)
        return [first or
            f"step {b['step_latency_total']:.4g} s: replica {b['node_latency']:.4g} s (compute "
            f"{b['node_latency_compute']:.4g}), exposed DP {exposed_dp:.4g} (of "
            f"{b['dp_communication_latency']:.4g}), TP {b['tp_communication_latency']:.4g}, "
            f"EP {b['ep_communication_latency']:.4g}, bubble "
            f"{b['pipeline_bubble_latency']:.4g}; mfu {b['mfu']:.4f} on "
            f"{b['n_accelerators']:.0f} accelerators",
            f"memory {b['memory_footprint'] / _GB:.2f} GB of {b['memory_limit'] / _GB:.2f} GB "
            f"limit: weights {b['memory_weights'] / _GB:.2f}, gradients "
            f"{b['memory_gradients'] / _GB:.2f}, optimizer "
            f"{b['memory_optimizer_state'] / _GB:.2f}, "
            f"activations {b['memory_activations'] / _GB:.2f}, buffers "
            f"{b['memory_communication_buffers'] / _GB:.2f}"]

    def __repr__(self):
        return (f"SearchResult(best_value={self.best_value!r}, best_params={self.best_params!r}, "
                f"n_evaluated={self.n_evaluated})")


def front_indices(scores: np.ndarray, tiebreak: np.ndarray) -> np.ndarray:
    """Indices of the non-dominated rows of ``scores`` (larger is better in every column).

    Equal rows count once: the one with the smallest ``tiebreak`` is kept
    (:func:`sweep.pareto.nondominated` keeps them all).
    """
    if len(scores) == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort([tiebreak] + [scores[:, j] for j in reversed(range(scores.shape[1]))])
    s = scores[order]
    first = np.ones(len(s), dtype=bool)
    first[1:] = (s[1:] != s[:-1]).any(axis=1)
    candidates = order[first]
    return candidates[nondominated(-scores[candidates])]


def admissible(trial) -> bool:
    """Whether a finished trial's constraints all hold (a split, fits, within every limit)."""
    cons = trial.constraints
    return bool(cons) and all(v <= 0 for v in cons.values())


def _key(layout):
    return tuple(sorted((k, repr(v)) for k, v in layout.items()))


def study_result(study, space, setup, *, n_new, k, sampler, started, reason="") -> SearchResult:
    """The result of a study: distinct admissible layouts, best first, and the Pareto set."""
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    good = [t for t in complete if admissible(t)]
    distinct: dict = {}
    for t in sorted(good, key=lambda t: t.number):
        layout = space.decode(t.params)
        distinct.setdefault(_key(layout), (layout, tuple(t.values), t.number))
    items = list(distinct.values())
    signs = setup.signs

    def order(item):
        _, vals, number = item
        return (tuple(-s * v for s, v in zip(signs, vals)), number)

    items.sort(key=order)
    if len(setup.objectives) == 1:
        pareto = items[:1]
    else:  # distinct layouts; equal objective vectors count once (lowest trial number)
        scores = np.array([[s * v for s, v in zip(signs, vals)] for _, vals, _ in items])
        keep = set(front_indices(scores.reshape(len(items), len(signs)),
                                 np.array([n for _, _, n in items])).tolist())
        pareto = items = [item for i, item in enumerate(items) if i in keep]
    return finish_result(setup, items, pareto, study=study, n_evaluated=len(complete),
                         n_new=n_new, n_admissible=len(good), mode="sample", sampler=sampler,
                         space_size=space.size, k=k, started=started, reason=reason,
                         empty_counts=None if good else _trial_counts(setup, space, complete))


def _trial_counts(setup, space, trials) -> Optional[dict]:
    """``empty_counts`` of a sampled search's evaluated trials, as the exhaustive search
    counts its grid (what each constraint removed, what relaxing each gives back, why
    layouts are not realizable); None where no trial recorded its constraints."""
    from types import SimpleNamespace

    from ..analysis.empty import merge_evidence, realizable_text
    from .exhaustive import _counts, _realizable
    from .pricing import _groups, _price, _trial_knobs

    trials = [t for t in trials if t.constraints]
    if not trials:
        return None
    names = list(trials[0].constraints)
    values = {n: np.array([t.constraints.get(n, np.nan) for t in trials], float) for n in names}
    shape = (len(trials),)
    # "fits memory" on its own, as the exhaustive search counts it: the trials record the
    # memory limit's constraint only, which holds both
    every = [space.decode(t.params) for t in trials]
    feasible = np.zeros(shape, bool)
    for (w, f), idx in _groups(every).items():
        priced = _price(setup, w, f, _trial_knobs(space, every, idx))
        feasible[idx] = np.broadcast_to(np.asarray(priced.outputs["feasible"], bool), (len(idx),))
    removed, relaxed = _counts(SimpleNamespace(constraints=values,
                                               outputs={"feasible": feasible}), shape)
    counts = {"total": len(trials), "removed": removed, "relaxed": relaxed}
    if not relaxed.get("realizable") or "realizable" not in values:
        return counts
    passes = {n: ~(np.nan_to_num(v, nan=1.0) > 0) for n, v in values.items()}
    blocked = np.logical_and.reduce([~passes["realizable"]] + [
        ok for n, ok in passes.items() if n != "realizable"])
    layouts = [space.decode(t.params) for t, b in zip(trials, blocked) if b]
    evidence = None
    for (w, f), idx in _groups(layouts).items():
        priced = _price(setup, w, f, _trial_knobs(space, layouts, idx))
        evidence = merge_evidence(evidence, _realizable(priced, priced.valid.shape))
    why = realizable_text(evidence)
    if why:
        counts["why"] = {"realizable": why}
    return counts


def _entry(setup, layout, values, described, number):
    knobs = _layout_knobs(setup, layout)
    params = {"workload": layout["workload"], "fleet": layout["fleet"], **knobs}
    shown = {name: described[name] for name in REPORTED}
    shown.update(zip(setup.names, (float(v) for v in values)))
    return {"params": params, "values": shown, "trial": number}


def _calibration_text(setup) -> str:
    """How a summary names the spec's calibration profile ("" for none)."""
    profile = getattr(setup.spec, "calibration", None)
    if profile is None:
        return ""
    runs = f"{profile.runs} run{'' if profile.runs == 1 else 's'}" if profile.runs else "runs"
    return (f"{profile.path or '(a profile)'} ({runs} of {profile.data_source or '?'}, "
            f"{profile.date or 'undated'})")


def finish_result(setup, entries_best_first, pareto, *, study, n_evaluated, n_new, n_admissible,
                  mode, sampler, space_size, k, started, reason="", empty_counts=None) -> SearchResult:
    """entries: [(layout, values, number)] best first; pareto: same for the Pareto set.
    ``empty_counts``: what each condition removed (:attr:`SearchResult.empty_counts`); with
    no admissible layout the warning says it (:meth:`SearchResult.why_empty`)."""
    chosen = entries_best_first[:k]
    chosen_ids = {id(item) for item in chosen}
    everyone = chosen + [p for p in pareto if id(p) not in chosen_ids]
    described = _describe(setup, [layout for layout, _, _ in everyone])
    table = {id(item): d for item, d in zip(everyone, described)}
    top = [_entry(setup, lay, vals, table[id(item)], num)
           for item in chosen for lay, vals, num in [item]]
    best_trials = [_entry(setup, lay, vals, table[id(item)], num)
                   for item in pareto for lay, vals, num in [item]]
    if top:
        best_params = top[0]["params"]
        values = tuple(top[0]["values"][n] for n in setup.names)
        best_value = values if len(values) > 1 else values[0]
        breakdown = dict(table[id(chosen[0])])
        breakdown.update({f"objective:{n}": v for n, v in zip(setup.names, values)})
    else:
        best_params, best_value, breakdown = None, None, {}
    result = SearchResult(best_params=best_params, best_value=best_value,
                          objectives=setup.objectives, study=study, breakdown=breakdown, top=top,
                          best_trials=best_trials, n_evaluated=n_evaluated, n_new=n_new,
                          n_admissible=n_admissible, memory_limits=dict(setup.limits), mode=mode,
                          sampler=sampler, space_size=space_size,
                          elapsed=time.perf_counter() - started, reason=reason,
                          empty_counts=empty_counts, calibration=_calibration_text(setup),
                          constants=tuple(getattr(setup.spec.calibration, "constants", None) or ()),
                          constants_physics=getattr(setup.spec.calibration, "physics", ""))
    if not top:  # the counts' reading where there are counts: which condition to relax
        warnings.warn(result.why_empty(), RuntimeWarning, stacklevel=caller_stacklevel())
    return result
