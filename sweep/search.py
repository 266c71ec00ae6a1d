"""Layout search: the best layout under a memory limit, in spaces too large to enumerate.

``search(spec)`` turns a spec's axes into an optuna search space (see
:mod:`sweep._space`), asks the sampler for a batch of trials, prices the whole
batch with one ``solver.solve`` call per (workload, fleet) pair, and tells the
study each trial's objective value(s) and constraint values. ``mode="exact"``
instead walks the whole grid in blocks (:func:`sweep.grid.blocks`) keeping a
running top-k (or Pareto set): the true optimum under the same constraints, in
the same :class:`SearchResult` shape.

    >>> from sweep.search import search
    >>> result = search("configs/sweeps/search_llama70b.toml", n_trials=1000, seed=0)
    >>> result.best_params, result.best_value          # doctest: +SKIP
    >>> print(result.summary())                        # doctest: +SKIP

Design choices
--------------
Constraints
    Every trial carries optuna 5 constraint values, set with
    ``Trial.set_constraint`` before ``study.tell`` (``constraints_func`` is
    deprecated in optuna 5); a trial is feasible when all are <= 0. TPE, NSGA-II
    and GP read them from the trial, and ``study.best_trial(s)`` only returns
    feasible trials. The constraints are unitless so that a sampler summing
    violations weighs them alike:

    * ``split``: 0 for a possible split, 1 where TP*PP*EP does not divide the
      fleet (or, with a ``dp_size`` axis, the layout is not whole nodes);
    * ``memory``: ``(memory_footprint - limit) / limit``, the sign of
      ``memory_footprint - limit``;
    * ``accelerators`` (with ``max_accelerators``):
      ``(n_accelerators - max) / max``;
    * one per extra constraint function passed in ``constraints``.

Impossible splits are rejected, not parameterized away
    Whether TP*PP*EP divides the fleet (or DP*TP*PP*EP fills whole nodes) is a
    joint condition on several axes. Drawing TP, PP and EP "among divisors"
    would need each draw to depend on the earlier ones: a conditional,
    trial-dependent search space, which breaks the multivariate TPE's fixed
    joint space, NSGA-II's crossover and the grid sampler, and would no longer
    be the spec's space. So every axis is drawn independently over the spec's
    values and an impossible split is told to the study as infeasible
    (``split`` = 1, ``memory`` = 1: never priced, its memory unknown) with a
    penalty value (``-PENALTY`` when maximizing, ``+PENALTY`` when
    minimizing). Samplers learn to avoid the region; such trials never appear
    in ``best_params``, ``top`` or the Pareto set.

Budget, resume and parallel workers
    ``n_trials`` is the number of priced trials the *study* should hold when
    the call returns, counted across runs and workers (optuna's
    ``MaxTrialsCallback`` convention, not ``optimize``'s per-call count). So a
    killed search resumes by re-running the same call: it adds only the
    missing trials. Several processes sharing a journal file (or machines
    sharing an RDB) each run the same call and together fill the budget;
    before each ask a worker counts finished and running trials, so racing
    workers overshoot it by less than one batch per extra worker.

    Trials asked but never told (a SIGKILL'd worker, an exception in this
    process) stay RUNNING in the storage. Each trial records its owner
    (``host:pid:token``); a later call adopts the RUNNING trials whose owner is
    gone (a dead process on this host, a finished call of this process, or,
    from another host, older than :data:`STALE_AFTER`) and prices them with
    the parameters they were given, so no sampled trial is lost or counted
    twice. A trial killed before all its parameters were written is marked
    FAIL (it was never priced and is not counted).

Local moves
    Optuna's TPE proposes each trial in ~10 ms while ``solver.solve`` prices a
    batch in ~1 ms, and in spaces of many discrete axes TPE alone often stalls
    a few per cent short of the optimum (a coupled move such as TP halved and
    DP doubled is rare under its density model). So by default a quarter of
    each batch (``refine``) goes to untried layouts one or two coordinate
    steps from the best feasible trials, a hill climb restarted whenever the
    sampler finds better; these are ordinary, counted trials (recorded with
    ``study.add_trial``, marked ``user_attrs["search:origin"] = "local"``).
    On the benchmark's 10^6-layout spaces, after 1000 evaluations over 5
    seeds, plain TPE reaches 97.2-100 % of the optimum, TPE with local moves
    the optimum itself in every seed (``benchmarks/bench_search.py``).
    ``refine=0`` is plain TPE.

When to search, when to sweep
    The solver prices ~10^7 layouts/s on an open mesh, so a discrete space of
    10^9 is swept exhaustively in minutes (``mode="exact"``; the 2.6e9-layout
    ``configs/sweeps/search_llama70b.toml`` took 211 s on 2 processes), while
    optuna's TPE spends ~20 s on its first 1000 trials and ~3 min on 3000
    (its cost per trial grows with the history). The search reached 99.96 %
    of that optimum in 1000 evaluations and the optimum in 3000: search for a
    quick answer, for continuous axes, or beyond ~10^10 layouts; sweep when
    the space is discrete and the true optimum matters.

Seeds
    ``seed`` seeds the sampler and the local moves: the same seed, spec and batch size give the
    same trial sequence and the same best layout (in one process, from an
    empty study). A resumed study continues with a freshly seeded sampler, so
    it is not the same sequence as an uninterrupted run. Parallel workers
    should get different seeds (or ``None``), else their random start-up
    trials coincide.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import math
import os
import socket
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import optuna
from optuna.trial import TrialState

import solver
from solver.specs import Fleet, Workload
from solver.units import parse_quantity

from . import grid as grid_
from ._space import SearchSpace, build_space
from .spec import Spec, SpecError, load_spec, powers_of_two

__all__ = [
    "search",
    "SearchResult",
    "resolve_memory_limit",
    "open_storage",
    "DEFAULT_DIRECTIONS",
    "DERIVED",
    "PENALTY",
    "STALE_AFTER",
    "SAMPLERS",
    "DEFAULT_REFINE",
    "ReferenceSpace",
    "reference_optimizer_space",
    "reproduce_reference_optimizer",
]

#: Objective value told for a layout that cannot be priced (impossible split):
#: ``-PENALTY`` when maximizing, ``+PENALTY`` when minimizing.
PENALTY = 1e30

#: A RUNNING trial of another host (or of unknown owner) older than this [s]
#: is taken as abandoned and adopted by the next search call.
STALE_AFTER = 600.0

#: Share of each batch spent on local moves around the best trials (TPE, one objective).
DEFAULT_REFINE = 0.25

#: Names accepted by ``search(sampler=...)``.
SAMPLERS = ("tpe", "nsga2", "random", "grid")

#: Quantities derived from the outputs and knobs, usable as objectives:
#: name -> (units, long name).
DERIVED = {
    "n_accelerators": ("1", "accelerators in the cluster: tp*pp*ep*dp"),
    "memory_headroom": ("B", "memory limit minus the footprint per accelerator"),
}

_MAXIMIZE = ("mfu", "effective_throughput", "scaling_efficiency", "node_mfu", "node_hfu",
             "node_throughput", "memory_headroom")
_NO_DEFAULT = ("dp_size",)
_NOT_OBJECTIVES = ("valid", "feasible", "idle_ranks")

#: Default direction of each objective: what a layout engineer wants of it.
DEFAULT_DIRECTIONS = {
    name: ("maximize" if name in _MAXIMIZE else "minimize")
    for name in (*solver.OUTPUTS, *DERIVED)
    if name not in _NOT_OBJECTIVES and name not in _NO_DEFAULT
}

#: Outputs reported with every layout of ``top`` and ``best_trials``.
_REPORTED = ("mfu", "step_latency_total", "effective_throughput", "memory_footprint",
             "memory_headroom", "n_accelerators")

_OWNER_KEY = "search:owner"
_ORIGIN_KEY = "search:origin"
#: Local moves are drawn around this many of the best feasible trials.
_LOCAL_INCUMBENTS = 8
_SIGNATURE_KEY = "search:signature"
_HOST = socket.gethostname()
_LIVE_TOKENS: set = set()
_GB = 1e9


# --------------------------------------------------------------------------- options


def _objectives(objective, direction, objectives) -> tuple:
    """((name, direction), ...) from the single- or multi-objective arguments."""
    def check(name, dirn):
        if not isinstance(name, str) or (name not in DEFAULT_DIRECTIONS
                                         and name not in _NO_DEFAULT):
            choices = ", ".join(sorted(DEFAULT_DIRECTIONS))
            raise ValueError(f"objective must be a numeric output of solver.solve or a derived "
                             f"quantity ({choices}), but got {name!r}")
        if dirn is None:
            if name not in DEFAULT_DIRECTIONS:
                raise ValueError(f"objective {name!r} has no default direction: pass "
                                 f"direction='maximize' or 'minimize'")
            dirn = DEFAULT_DIRECTIONS[name]
        if dirn not in ("maximize", "minimize"):
            raise ValueError(f"direction of {name!r} must be 'maximize' or 'minimize', "
                             f"but got {dirn!r}")
        return name, dirn

    if objectives is None:
        return (check(objective, direction),)
    if direction is not None:
        raise ValueError("direction applies to a single objective; give each of objectives "
                         "its direction instead ({'mfu': 'maximize', ...})")
    if isinstance(objectives, Mapping):
        items = list(objectives.items())
    elif isinstance(objectives, (list, tuple)):
        items = [(o, None) if isinstance(o, str) else tuple(o) for o in objectives]
    else:
        raise ValueError(f"objectives must be a mapping name -> direction or a list of names, "
                         f"but got {objectives!r}")
    if not items:
        raise ValueError("objectives must name at least one objective, but got none")
    out = tuple(check(name, dirn) for name, dirn in items)
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise ValueError(f"objectives must be distinct, but got {names}")
    return out


def resolve_memory_limit(memory_limit, spec: Spec, fleet: Fleet) -> float:
    """Per-accelerator memory limit [B] for ``fleet``.

    Parameters
    ----------
    memory_limit : None, float or str
        ``None``: the spec's ``constraints.memory_limit``, else the
        accelerator's capacity. A number in (0, 1]: that fraction of the
        capacity. A larger number: bytes. A string: a size such as ``"72 GB"``
        (GB = 1e9 B, GiB = 2**30 B).
    spec : Spec
    fleet : Fleet

    Returns
    -------
    float [B]
    """
    capacity = fleet.node.accelerator.memory_capacity
    if memory_limit is None:
        return float(spec.memory_limit_for(fleet))
    if isinstance(memory_limit, str):
        return float(parse_quantity(memory_limit, "bytes", where="memory_limit"))
    if (isinstance(memory_limit, (bool, np.bool_))
            or not isinstance(memory_limit, (int, float, np.number))
            or not math.isfinite(memory_limit) or memory_limit <= 0):
        raise ValueError(f"memory_limit must be a size such as '72 GB', a number of bytes, or "
                         f"a fraction of the accelerator's memory in (0, 1], but got "
                         f"{memory_limit!r}")
    memory_limit = float(memory_limit)
    return memory_limit * capacity if memory_limit <= 1 else memory_limit


def open_storage(storage):
    """An optuna storage from a URL, a journal path or a storage object.

    ``None`` is in memory; a path ending in ``.log``, ``.jsonl`` or
    ``.journal``, or ``journal:///abs/path``, is a journal file shared by
    local processes; an RDB URL (``sqlite:///x.db``, ``postgresql://...``) is
    shared across machines; a ``BaseStorage`` is used as is.
    """
    from optuna.storages import BaseStorage
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    if storage is None or isinstance(storage, BaseStorage):
        return storage
    if isinstance(storage, Path):
        storage = str(storage)
    if not isinstance(storage, str):
        raise ValueError(f"storage must be an optuna storage, an RDB URL or a journal file path, "
                         f"but got {type(storage).__name__}")
    if storage.startswith("journal://"):
        path = storage[len("journal://"):]
        if not path:
            raise ValueError(f"a journal storage URL is journal:///path/to/file, "
                             f"but got {storage!r}")
        return JournalStorage(JournalFileBackend(path))
    if storage.endswith((".log", ".jsonl", ".journal")) and "://" not in storage:
        return JournalStorage(JournalFileBackend(storage))
    if "://" in storage:
        return storage  # an RDB URL: optuna opens it
    raise ValueError(f"storage must be an RDB URL (sqlite:///x.db, postgresql://...), "
                     f"journal:///path, or a journal file path ending in .log, .jsonl or "
                     f".journal, but got {storage!r}")


def _make_sampler(sampler, seed, space: SearchSpace, batch_size):
    if isinstance(sampler, optuna.samplers.BaseSampler):
        return sampler
    if sampler == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(2, batch_size))
    if sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if sampler == "grid":
        if not space.is_discrete:
            raise ValueError("sampler='grid' needs listed values on every axis, but the spec has "
                             "a continuous range (give it a step or num)")
        return _BatchGridSampler(space.grid(), seed=seed)
    raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)} or an optuna sampler, "
                     f"but got {sampler!r}")


class _BatchGridSampler(optuna.samplers.GridSampler):
    """optuna's GridSampler for ask/tell batches.

    Its ``after_trial`` calls ``study.stop()`` once the grid is exhausted,
    which optuna refuses outside ``study.optimize``; here the budget (the grid
    size) ends the search, so ``after_trial`` does nothing.
    """

    def after_trial(self, study, trial, state, values):
        return None


@contextlib.contextmanager
def _quiet_optuna():
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(level)


# --------------------------------------------------------------------------- pricing


@dataclass(frozen=True)
class _Setup:
    """Everything that turns knob arrays into objective and constraint values."""

    spec: Spec
    objectives: tuple
    limits: Mapping[str, float]
    derive: Optional[Callable] = None
    constraints: Mapping[str, Callable] = field(default_factory=dict)

    @property
    def names(self):
        return tuple(n for n, _ in self.objectives)

    @property
    def signs(self):
        return np.array([1.0 if d == "maximize" else -1.0 for _, d in self.objectives])


@dataclass
class _Priced:
    outputs: dict
    knobs: dict
    values: np.ndarray       # (n_objectives, *shape)
    constraints: dict        # name -> array of shape
    valid: np.ndarray
    feasible: np.ndarray


def _quantity(name, out, knobs, limit):
    if name == "n_accelerators":
        replica = (np.asarray(knobs.get("tp_size", 1)) * np.asarray(knobs.get("pp_size", 1))
                   * np.asarray(knobs.get("ep_size", 1)))
        return out["dp_size"] * replica
    if name == "memory_headroom":
        return limit - out["memory_footprint"]
    return out[name]


def _price(setup: _Setup, workload_label, fleet_label, knobs) -> _Priced:
    """Solve a batch (flat arrays or an open mesh) and score it."""
    spec = setup.spec
    workload, fleet = spec.workloads[workload_label], spec.fleets[fleet_label]
    knobs = {**spec.fixed, **knobs}
    if setup.derive is not None:
        knobs.update(setup.derive(knobs, workload, fleet))
    out = solver.solve(workload, fleet, **knobs)
    shape = out["valid"].shape
    valid = np.asarray(out["valid"])
    limit = setup.limits[fleet_label]
    values = np.stack([np.broadcast_to(np.asarray(_quantity(n, out, knobs, limit), float), shape)
                       for n in setup.names])

    def violated_if_invalid(x):
        return np.where(valid, np.broadcast_to(np.asarray(x, float), shape), 1.0)

    constraints = {
        "split": np.where(valid, 0.0, 1.0),
        "memory": violated_if_invalid((out["memory_footprint"] - limit) / limit),
    }
    if spec.max_accelerators is not None:
        n_acc = _quantity("n_accelerators", out, knobs, limit)
        constraints["accelerators"] = violated_if_invalid(
            (n_acc - spec.max_accelerators) / spec.max_accelerators)
    for name, fn in setup.constraints.items():
        constraints[name] = violated_if_invalid(fn(out, knobs, workload, fleet))
    feasible = valid & np.isfinite(values).all(axis=0)
    for c in constraints.values():
        feasible &= ~(np.nan_to_num(c, nan=1.0) > 0)
    return _Priced(out, knobs, values, constraints, valid, feasible)


def _layout_knobs(setup: _Setup, layout: Mapping[str, Any]) -> dict:
    """Solve keywords of one layout: fixed knobs, axis values, derived knobs (plain values)."""
    spec = setup.spec
    knobs = {**spec.fixed, **{k: v for k, v in layout.items() if k not in ("workload", "fleet")}}
    if setup.derive is not None:
        derived = setup.derive(dict(knobs), spec.workloads[layout["workload"]],
                               spec.fleets[layout["fleet"]])
        knobs.update({k: _plain(v) for k, v in derived.items()})
    return knobs


def _plain(value):
    array = np.asarray(value)
    if array.ndim == 0 and array.dtype.kind in "biufU":
        return array.item()
    return value


def _describe(setup: _Setup, layouts: Sequence[Mapping]) -> list:
    """Full outputs (plain floats) of each layout, priced in one call per (workload, fleet)."""
    described = [None] * len(layouts)
    groups: dict = {}
    for i, layout in enumerate(layouts):
        groups.setdefault((layout["workload"], layout["fleet"]), []).append(i)
    for (w, f), idx in groups.items():
        keys = [k for k in layouts[idx[0]] if k not in ("workload", "fleet")]
        knobs = {k: np.array([layouts[i][k] for i in idx]) for k in keys}
        priced = _price(setup, w, f, knobs)
        limit = setup.limits[f]
        for j, i in enumerate(idx):
            row = {name: _plain(np.asarray(v)[j]) for name, v in priced.outputs.items()}
            row["n_accelerators"] = float(np.broadcast_to(
                _quantity("n_accelerators", priced.outputs, priced.knobs, limit),
                priced.valid.shape)[j])
            row["memory_limit"] = float(limit)
            row["memory_headroom"] = float(limit - row["memory_footprint"])
            row.update({f"constraint:{k}": float(np.asarray(v)[j])
                        for k, v in priced.constraints.items()})
            described[i] = row
    return described


# --------------------------------------------------------------------------- result


@dataclass
class SearchResult:
    """What a search found.

    Attributes
    ----------
    best_params : dict or None
        The best feasible layout as ``solver.solve`` keywords (fixed, searched
        and derived knobs) plus its ``workload`` and ``fleet`` labels;
        ``None`` if no evaluated layout was feasible. For several objectives,
        the Pareto layout best in the first objective.
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
        Up to ``top_k`` distinct feasible layouts, best first: ``params``,
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
    n_feasible : int
        Feasible layouts among them.
    memory_limits : dict
        Fleet label -> per-accelerator memory limit [B].
    mode, sampler : str
    elapsed : float [s]
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
    n_feasible: int
    memory_limits: dict
    mode: str = "sample"
    sampler: str = ""
    space_size: float = math.nan
    elapsed: float = 0.0

    @property
    def is_multi_objective(self) -> bool:
        return len(self.objectives) > 1

    def summary(self) -> str:
        """A few lines: the best layout, its value, where its step time and memory go."""
        names = ", ".join(f"{n} ({d[:3]})" for n, d in self.objectives)
        how = "exhaustive" if self.mode == "exact" else f"{self.sampler}"
        size = ("continuous" if math.isinf(self.space_size) else f"{self.space_size:.3g}")
        lines = [f"search [{how}] for {names}: {self.n_evaluated} layouts evaluated "
                 f"({self.n_new} new) of a space of {size}; {self.n_feasible} feasible"]
        if self.best_params is None:
            lines.append("no feasible layout found (memory limit "
                         + ", ".join(f"{k}: {v / _GB:.1f} GB" for k, v in
                                     self.memory_limits.items()) + ")")
            return "\n".join(lines)
        value = (self.best_value if not self.is_multi_objective
                 else ", ".join(f"{v:.6g}" for v in self.best_value))
        lines.append(f"best: {value if isinstance(value, str) else f'{value:.6g}'}"
                     + (f"  ({len(self.best_trials)} Pareto layouts)"
                        if self.is_multi_objective else ""))
        shown = {k: v for k, v in self.best_params.items() if k not in ("workload", "fleet")}
        lines.append(f"layout: {self.best_params['workload']} on {self.best_params['fleet']}: "
                     + ", ".join(f"{k}={v}" for k, v in shown.items()))
        b = self.breakdown
        straggler = float(self.best_params.get("straggler_factor", 1.0))
        exposed_dp = (b["step_latency_total"] / straggler - b["node_latency"]
                      - b["tp_communication_latency"] - b["ep_communication_latency"]
                      - b["pipeline_bubble_latency"])
        lines.append(
            f"step {b['step_latency_total']:.4g} s: replica {b['node_latency']:.4g} s (compute "
            f"{b['node_latency_compute']:.4g}), exposed DP {exposed_dp:.4g} (of "
            f"{b['dp_communication_latency']:.4g}), TP {b['tp_communication_latency']:.4g}, "
            f"EP {b['ep_communication_latency']:.4g}, bubble "
            f"{b['pipeline_bubble_latency']:.4g}; mfu {b['mfu']:.4f} on "
            f"{b['n_accelerators']:.0f} accelerators")
        lines.append(
            f"memory {b['memory_footprint'] / _GB:.2f} GB of {b['memory_limit'] / _GB:.2f} GB "
            f"limit: weights {b['memory_weights'] / _GB:.2f}, gradients "
            f"{b['memory_gradients'] / _GB:.2f}, optimizer "
            f"{b['memory_optimizer_state'] / _GB:.2f}, "
            f"activations {b['memory_activations'] / _GB:.2f}, buffers "
            f"{b['memory_communication_buffers'] / _GB:.2f}")
        return "\n".join(lines)

    def __repr__(self):
        return (f"SearchResult(best_value={self.best_value!r}, best_params={self.best_params!r}, "
                f"n_evaluated={self.n_evaluated})")


def _entry(setup, layout, values, described, number):
    knobs = _layout_knobs(setup, layout)
    params = {"workload": layout["workload"], "fleet": layout["fleet"], **knobs}
    shown = {k: described[k] for k in _REPORTED}
    shown.update(zip(setup.names, (float(v) for v in values)))
    return {"params": params, "values": shown, "trial": number}


def _finish_result(setup, entries_best_first, pareto, *, study, n_evaluated, n_new, n_feasible,
                   mode, sampler, space_size, top_k, started):
    """entries: [(layout, values, number)] best first; pareto: same for the Pareto set."""
    chosen = entries_best_first[:top_k]
    chosen_ids = {id(item) for item in chosen}
    everyone = chosen + [p for p in pareto if id(p) not in chosen_ids]
    described = _describe(setup, [layout for layout, _, _ in everyone])
    table = {id(item): d for item, d in zip(everyone, described)}
    top = [_entry(setup, lay, vals, table[id(item)], num)
           for item in chosen for lay, vals, num in [item]]
    best_trials = [_entry(setup, lay, vals, table[id(item)], num)
                   for item in pareto for lay, vals, num in [item]]
    if top:
        best = top[0]
        best_params = best["params"]
        values = tuple(best["values"][n] for n in setup.names)
        best_value = values if len(values) > 1 else values[0]
        breakdown = dict(table[id(chosen[0])])
        breakdown.update({f"objective:{n}": v for n, v in zip(setup.names, values)})
    else:
        best_params, best_value, breakdown = None, None, {}
        warnings.warn(f"no feasible layout among the {n_evaluated} evaluated (memory limits "
                      f"{ {k: f'{v / _GB:.2f} GB' for k, v in setup.limits.items()} })",
                      RuntimeWarning, stacklevel=3)
    return SearchResult(best_params=best_params, best_value=best_value,
                        objectives=setup.objectives, study=study, breakdown=breakdown, top=top,
                        best_trials=best_trials, n_evaluated=n_evaluated, n_new=n_new,
                        n_feasible=n_feasible, memory_limits=dict(setup.limits), mode=mode,
                        sampler=sampler, space_size=space_size,
                        elapsed=_now() - started)


def _now():
    return time.perf_counter()


# --------------------------------------------------------------------------- search


def search(spec, *, n_trials: Optional[int] = None, seed: Optional[int] = None,
           memory_limit=None, objective: str = "mfu", direction: Optional[str] = None,
           objectives=None, sampler="tpe", batch_size: int = 16, storage=None,
           study_name: Optional[str] = None, load_if_exists: bool = True, top_k: int = 10,
           mode: str = "sample", progress=None, derive: Optional[Callable] = None,
           constraints: Optional[Mapping[str, Callable]] = None, refine: Optional[float] = None,
           max_points: int = 1 << 18, n_jobs: int = 1) -> SearchResult:
    """Search a spec's layouts for the best objective under a memory limit.

    Parameters
    ----------
    spec : Spec, dict or TOML path
        The space: its axes are searched (listed values, integer ranges,
        ordered choices such as powers of two, continuous float ranges), its
        ``fixed`` knobs held, its constraints applied.
    n_trials : int, optional
        Priced trials the study should hold when the call returns, counted
        across runs and workers (a resumed or parallel call adds only the
        missing ones). Default 256; for ``sampler="grid"`` the grid size.
    seed : int, optional
        Seeds the sampler (same seed, same trial sequence and result).
    memory_limit : None, float or str
        Per-accelerator limit: bytes, a size such as ``"72 GB"``, or a fraction
        (0 < x <= 1) of the accelerator's capacity. ``None``: the spec's
        ``constraints.memory_limit``, else the capacity.
    objective : str
        An output of ``solver.solve`` (``mfu``, ``effective_throughput``,
        ``step_latency_total``, ...) or a derived quantity (``n_accelerators``,
        ``memory_headroom``). Default ``mfu``.
    direction : {"maximize", "minimize"}, optional
        Default: the objective's natural one (:data:`DEFAULT_DIRECTIONS`).
    objectives : mapping or list, optional
        Several objectives (a Pareto search), e.g.
        ``{"mfu": "maximize", "n_accelerators": "minimize"}``; replaces
        ``objective``/``direction``.
    sampler : {"tpe", "nsga2", "random", "grid"} or optuna sampler
        TPE by default; NSGA-II uses ``batch_size`` as its population.
    batch_size : int
        Trials asked, priced in one ``solver.solve`` call, then told. Pricing
        16 layouts takes about a millisecond while optuna's TPE takes ~10 ms
        to propose each, so a batch saves no wall time beyond ~16 and costs
        sample efficiency (the sampler learns only between batches).
    storage : None, str or optuna storage
        In memory by default; a journal file path (``*.log``, ``*.jsonl``,
        ``journal:///path``) for several local processes; an RDB URL for
        several machines (see :func:`open_storage`).
    study_name : str, optional
        Default: the spec's name, the objectives and a hash of the space and
        constraints, so that re-running the same search resumes it.
    load_if_exists : bool
        Continue a study of that name in the storage (its space and
        objectives must match).
    top_k : int
        Distinct feasible layouts to report.
    mode : {"sample", "exact"}
        ``"exact"`` prices every grid point in blocks of at most
        ``max_points``, keeping a running top-k (or Pareto set); ``n_trials``,
        ``sampler``, ``seed`` and ``storage`` are then unused.
    progress : bool, optional
        Show a tqdm progress bar.
    derive : callable, optional
        ``derive(knobs, workload, fleet) -> dict`` of knobs computed from the
        others (arrays in, arrays out), applied before each ``solve`` (e.g. a
        microbatch count tied to the DP degree).
    constraints : mapping of str -> callable, optional
        Extra constraints ``fn(outputs, knobs, workload, fleet) -> array``,
        feasible where <= 0.
    refine : float, optional
        Share of each batch spent on local moves: untried layouts one
        coordinate step from the best feasible trials (the next or previous
        ordered value, another category), priced in the same ``solve`` call and
        recorded as ordinary trials (``user_attrs["search:origin"] ==
        "local"``). The sampler proposes the rest. Default 0.25 with TPE on a
        single objective, else 0 (plain sampler); must be 0 with the grid.
    max_points : int
        Grid points per block in exact mode.
    n_jobs : int
        Processes for exact mode (joblib); 1 runs in this process.

    Returns
    -------
    SearchResult

    Raises
    ------
    ValueError
        For an unknown objective, direction, sampler, mode or storage, a bad
        memory limit, or a stored study whose space differs from this one.
    """
    started = _now()
    spec = load_spec(spec)
    objs = _objectives(objective, direction, objectives)
    limits = {label: resolve_memory_limit(memory_limit, spec, fleet)
              for label, fleet in spec.fleets.items()}
    setup = _Setup(spec=spec, objectives=objs, limits=limits, derive=derive,
                   constraints=dict(constraints or {}))
    if not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a whole number >= 1, but got {top_k!r}")
    if mode == "exact":
        return _exact(setup, top_k=top_k, max_points=max_points, n_jobs=n_jobs,
                      progress=progress, started=started)
    if mode != "sample":
        raise ValueError(f"mode must be 'sample' or 'exact', but got {mode!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number >= 1, but got {batch_size!r}")

    space = build_space(spec)
    if not space.params:
        raise ValueError(f"spec {spec.name!r} has no axis with more than one value: nothing to "
                         f"search (price it with solver.solve)")
    if n_trials is None:
        n_trials = space.size if sampler == "grid" else 256
    if isinstance(n_trials, bool) or not isinstance(n_trials, (int, np.integer)) or n_trials < 1:
        raise ValueError(f"n_trials must be a whole number >= 1, but got {n_trials!r}")
    if sampler == "grid":
        n_trials = min(int(n_trials), int(space.size))
    if refine is None:
        refine = DEFAULT_REFINE if (sampler == "tpe" and len(objs) == 1) else 0.0
    if isinstance(refine, bool) or not isinstance(refine, (int, float)) or not 0 <= refine <= 1:
        raise ValueError(f"refine must be a share of the batch in [0, 1], but got {refine!r}")
    if refine and (sampler == "grid" or len(objs) > 1):
        raise ValueError(f"refine applies to a single objective with a sampler other than the "
                         f"grid, but got refine={refine} with "
                         f"{'several objectives' if len(objs) > 1 else 'the grid'}")

    signature = _signature(setup, space)
    if study_name is None:
        digest = hashlib.sha256(signature.encode()).hexdigest()[:10]
        study_name = f"{spec.name}:{'+'.join(setup.names)}:{digest}"
    sampler_obj = _make_sampler(sampler, seed, space, batch_size)
    sampler_label = sampler if isinstance(sampler, str) else type(sampler).__name__

    with _quiet_optuna(), warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study = optuna.create_study(storage=open_storage(storage), sampler=sampler_obj,
                                    study_name=study_name, load_if_exists=load_if_exists,
                                    directions=[d for _, d in objs])
        stored = study.user_attrs.get(_SIGNATURE_KEY)
        if stored is None:
            study.set_user_attr(_SIGNATURE_KEY, signature)
        elif stored != signature:
            raise ValueError(f"study {study_name!r} in this storage was created for another "
                             f"space or objectives: expected {stored}, but got {signature}")
        n_new = _run(study, space, setup, n_trials=int(n_trials), batch_size=batch_size,
                     refine=float(refine), seed=seed, progress=progress)
        return _study_result(study, space, setup, n_new=n_new, top_k=top_k,
                             sampler=sampler_label, started=started)


def _signature(setup: _Setup, space: SearchSpace) -> str:
    """What a stored study must match to be continued (callables are not compared)."""
    return json.dumps({
        "space": json.loads(space.signature()),
        "fixed": {k: v for k, v in setup.spec.fixed.items()},
        "workloads": sorted(setup.spec.workloads), "fleets": sorted(setup.spec.fleets),
        "objectives": [list(o) for o in setup.objectives],
        "limits": setup.limits, "max_accelerators": setup.spec.max_accelerators,
        "constraints": sorted(setup.constraints),
    }, sort_keys=True, default=str)


class _Owner:
    """This call's identity, written on every trial it asks."""

    def __init__(self):
        self.token = uuid.uuid4().hex[:12]
        self.id = f"{_HOST}:{os.getpid()}:{self.token}"

    def __enter__(self):
        _LIVE_TOKENS.add(self.token)
        return self

    def __exit__(self, *exc):
        _LIVE_TOKENS.discard(self.token)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_stale(trial) -> bool:
    owner = trial.user_attrs.get(_OWNER_KEY)
    if isinstance(owner, str) and owner.count(":") >= 2:
        host, pid, token = owner.rsplit(":", 2)
        if host == _HOST and pid.isdigit():
            if int(pid) == os.getpid():
                return token not in _LIVE_TOKENS
            return not _pid_alive(int(pid))
    start = trial.datetime_start
    return start is None or (datetime.datetime.now() - start).total_seconds() > STALE_AFTER


def _params_key(params: Mapping[str, Any]) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in params.items()))


def _local_moves(study, space: SearchSpace, setup: _Setup, n: int, rng) -> list:
    """Up to ``n`` untried trial parameters one or two coordinate moves from the best trials.

    The best feasible trial's single moves come first, then its pair moves,
    then the next best trial's: a hill climb that restarts from any better
    layout the batch finds.
    """
    trials = study.get_trials(deepcopy=False)
    seen = {_params_key(t.params) for t in trials}
    feasible = [t for t in trials if t.state == TrialState.COMPLETE and _feasible(t)]
    sign = setup.signs[0]
    feasible.sort(key=lambda t: (-sign * t.value, t.number))
    chosen: list = []
    for incumbent in feasible[:_LOCAL_INCUMBENTS]:
        for pairs in (False, True):  # single moves first, then moves of two parameters
            moves = [m for m in space.neighbors(incumbent.params, pairs=pairs)
                     if _params_key(m) not in seen]
            for i in rng.permutation(len(moves)):
                key = _params_key(moves[i])
                if key not in seen:
                    seen.add(key)
                    chosen.append(moves[i])
                    if len(chosen) == n:
                        return chosen
    return chosen


def _run(study, space: SearchSpace, setup: _Setup, *, n_trials, batch_size, refine, seed,
         progress) -> int:
    """Ask, price and tell batches until the study holds ``n_trials`` trials; new count."""
    counted = (TrialState.COMPLETE, TrialState.RUNNING)
    distributions = space.distributions
    rng = np.random.default_rng(seed)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
        bar = tqdm(total=n_trials, initial=min(done, n_trials), desc=f"search {setup.spec.name}",
                   unit="trial")
    n_new = 0
    with _Owner() as owner:
        try:
            while True:
                n_new += _adopt(study, space, setup, bar)
                room = n_trials - len(study.get_trials(deepcopy=False, states=counted))
                if room <= 0:
                    break
                n_local = min(room, int(round(refine * batch_size)))
                batch = [(None, m) for m in
                         (_local_moves(study, space, setup, n_local, rng) if n_local else [])]
                while len(batch) < batch_size:
                    used = len(study.get_trials(deepcopy=False, states=counted))
                    if used + sum(t is None for t, _ in batch) >= n_trials:
                        break
                    trial = study.ask(distributions)
                    trial.set_user_attr(_OWNER_KEY, owner.id)
                    batch.append((trial, dict(trial.params)))
                if not batch:
                    break
                n_new += _tell(study, space, setup, batch, adopted=False, owner=owner.id)
                if bar is not None:
                    bar.update(len(batch))
        finally:
            if bar is not None:
                bar.close()
    return n_new


def _adopt(study, space, setup, bar) -> int:
    """Price RUNNING trials whose owner is gone; FAIL those missing parameters."""
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    stale = [t for t in running if _is_stale(t)]
    if not stale:
        return 0
    names = {p.name for p in space.params}
    whole = [t for t in stale if names <= set(t.params)]
    for t in stale:
        if not names <= set(t.params):
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError, RuntimeError,
                                     ValueError):
                study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
    n = _tell(study, space, setup, [(t, dict(t.params)) for t in whole], adopted=True)
    if bar is not None:
        bar.update(n)
    return n


def _tell(study, space: SearchSpace, setup: _Setup, batch, *, adopted: bool,
          owner: Optional[str] = None) -> int:
    """Price a batch [(trial, params)] with one solve per (workload, fleet); tell each."""
    if not batch:
        return 0
    layouts = [space.decode(params) for _, params in batch]
    groups: dict = {}
    for i, layout in enumerate(layouts):
        groups.setdefault((layout["workload"], layout["fleet"]), []).append(i)
    values = np.empty((len(setup.objectives), len(batch)))
    constraint_rows: list = [None] * len(batch)
    for (w, f), idx in groups.items():
        knobs = {p.axis: np.array([layouts[i][p.axis] for i in idx])
                 for p in space.params if p.axis not in ("workload", "fleet")}
        knobs.update({k: v for k, v in space.constants.items() if k not in ("workload", "fleet")})
        priced = _price(setup, w, f, knobs)
        vals = np.where(np.isfinite(priced.values) & priced.valid,
                        priced.values, -setup.signs[:, None] * PENALTY)
        values[:, idx] = vals
        for j, i in enumerate(idx):
            constraint_rows[i] = {k: float(np.asarray(c)[j]) for k, c in priced.constraints.items()}
    told = 0
    multi = len(setup.objectives) > 1
    for i, (trial, params) in enumerate(batch):
        value = list(values[:, i]) if multi else float(values[0, i])
        try:
            if trial is None:  # a local move: priced already, recorded as a finished trial
                study.add_trial(optuna.trial.create_trial(
                    params=params, distributions=space.distributions,
                    values=value if multi else None, value=None if multi else value,
                    constraints=constraint_rows[i],
                    user_attrs={_ORIGIN_KEY: "local", _OWNER_KEY: owner}))
            elif adopted:
                if study._storage.get_trial(trial._trial_id).state != TrialState.RUNNING:
                    continue  # another worker adopted it first
                live = optuna.trial.Trial(study, trial._trial_id)
                for key, c in constraint_rows[i].items():
                    if key not in trial.constraints:
                        live.set_constraint(key, c)
                study.tell(trial.number, value, skip_if_finished=True)
            else:
                for key, c in constraint_rows[i].items():
                    trial.set_constraint(key, c)
                study.tell(trial, value)
            told += 1
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
    return told


def _feasible(trial) -> bool:
    cons = trial.constraints
    return bool(cons) and all(v <= 0 for v in cons.values())


def _key(layout):
    return tuple(sorted((k, repr(v)) for k, v in layout.items()))


def _study_result(study, space, setup, *, n_new, top_k, sampler, started) -> SearchResult:
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    feasible = [t for t in complete if _feasible(t)]
    distinct: dict = {}
    for t in sorted(feasible, key=lambda t: t.number):
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
        keep = set(_pareto_indices(scores, np.array([n for _, _, n in items])).tolist())
        pareto = items = [item for i, item in enumerate(items) if i in keep]
    return _finish_result(setup, items, pareto, study=study, n_evaluated=len(complete),
                          n_new=n_new, n_feasible=len(feasible), mode="sample", sampler=sampler,
                          space_size=space.size, top_k=top_k, started=started)


def _pareto_indices(scores: np.ndarray, tiebreak: np.ndarray) -> np.ndarray:
    """Indices of the non-dominated rows of ``scores`` (larger is better in every column).

    Equal rows count once: the one with the smallest ``tiebreak`` is kept.
    """
    if len(scores) == 0:
        return np.zeros(0, dtype=np.int64)
    keys = [tiebreak] + [-scores[:, j] for j in reversed(range(scores.shape[1]))]
    remaining = np.lexsort(keys)
    keep = []
    while remaining.size:
        first = remaining[0]
        keep.append(first)
        dominated = np.all(scores[remaining] <= scores[first], axis=1)
        remaining = remaining[~dominated]
    return np.asarray(keep, dtype=np.int64)


# --------------------------------------------------------------------------- exact mode


@dataclass
class _Reduced:
    scores: np.ndarray      # (n, n_objectives), larger is better
    index: np.ndarray       # flat grid index (C order over spec.shape)
    n_valid: int = 0
    n_feasible: int = 0
    n_points: int = 0


def _top(scores, index, k):
    """The k best rows of a single-objective score (ties: lowest grid index first)."""
    s = scores[:, 0]
    if len(s) > k:
        threshold = np.partition(s, len(s) - k)[len(s) - k]
        keep = s >= threshold
        s, index, scores = s[keep], index[keep], scores[keep]
    order = np.lexsort((index, -s))[:k]
    return scores[order], index[order]


def _reduce_block(setup: _Setup, block, k: int) -> _Reduced:
    """Price one block; keep its k best feasible points (or its Pareto set)."""
    spec = setup.spec
    n_obj = len(setup.objectives)
    priced = _price(setup, block.workload_label, block.fleet_label, block.knobs)
    shape = block.shape
    local = np.flatnonzero(np.broadcast_to(priced.feasible, shape))
    n_feasible = len(local)
    scores = (np.broadcast_to(priced.values, (n_obj, *shape)).reshape(n_obj, -1)[:, local].T
              * setup.signs)
    # Reduce on block-local indices (their C order is the grid's within a block), then
    # convert only the survivors to grid indices.
    if n_obj == 1:
        scores, local = _top(scores, local, k)
    else:
        keep = _pareto_indices(scores, local)
        scores, local = scores[keep], local[keep]
    starts = [s.start for s in block.index]
    coords = np.unravel_index(local, shape)
    index = np.asarray(np.ravel_multi_index(tuple(c + s for c, s in zip(coords, starts)),
                                            spec.shape), dtype=np.int64)
    return _Reduced(scores, index, n_valid=int(np.broadcast_to(priced.valid, shape).sum()),
                    n_feasible=n_feasible,
                    n_points=int(np.prod(shape)))


def _merge(acc: _Reduced, scores, index, k, n_obj) -> _Reduced:
    scores = np.concatenate([acc.scores, scores])
    index = np.concatenate([acc.index, index])
    if n_obj == 1:
        acc.scores, acc.index = _top(scores, index, k)
    else:
        keep = _pareto_indices(scores, index)
        acc.scores, acc.index = scores[keep], index[keep]
    return acc


def _exact(setup: _Setup, *, top_k, max_points, n_jobs, progress, started) -> SearchResult:
    spec = setup.spec
    blocks = grid_.blocks(spec, max_points)
    n_obj = len(setup.objectives)
    total = _Reduced(np.zeros((0, n_obj)), np.zeros(0, dtype=np.int64))
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=spec.size, desc=f"exact {spec.name}", unit="layout", unit_scale=True)
    if n_jobs == 1:
        parts = (_reduce_block(setup, b, top_k) for b in blocks)
    else:
        from joblib import Parallel, delayed

        parts = Parallel(n_jobs=n_jobs, return_as="generator_unordered")(
            delayed(_reduce_block)(setup, b, top_k) for b in blocks)
    for part in parts:
        total = _merge(total, part.scores, part.index, top_k, n_obj)
        total.n_valid += part.n_valid
        total.n_feasible += part.n_feasible
        total.n_points += part.n_points
        if bar is not None:
            bar.update(part.n_points)
    if bar is not None:
        bar.close()
    order = np.lexsort([total.index] + [-total.scores[:, j] for j in reversed(range(n_obj))])
    items = []
    for i in order:
        coords = np.unravel_index(int(total.index[i]), spec.shape)
        layout = {"workload": next(iter(spec.workloads)) if len(spec.workloads) == 1 else None,
                  "fleet": next(iter(spec.fleets)) if len(spec.fleets) == 1 else None}
        for axis, c in zip(spec.axes, coords):
            layout[axis.name] = axis.values[int(c)]
        items.append((layout, tuple(total.scores[i] * setup.signs), None))
    pareto = items[:1] if n_obj == 1 else items
    return _finish_result(setup, items, pareto, study=None, n_evaluated=total.n_points,
                          n_new=total.n_points, n_feasible=total.n_feasible, mode="exact",
                          sampler="exhaustive", space_size=spec.size, top_k=top_k,
                          started=started)


# --------------------------------------------------------------------------- reference optimizer


#: The reference's pre-screen keeps a layout when weights, same-width gradients
#: and Adam state fit in this share of the accelerator's memory.
REFERENCE_PRESCREEN_FRACTION = 0.9
#: Adam optimizer bytes per parameter in the reference's pre-screen
#: (``mlsysim.engine.calibration.TRAINING_OPTIMIZER_BYTES_ADAM``).
REFERENCE_ADAM_BYTES = 12.0
#: The reference sweeps TP and PP over 2**i for i in range(10).
REFERENCE_MAX_DEGREE = 2 ** 9


@dataclass(frozen=True)
class _ReferenceMicrobatches:
    """mlsysim's rule: ``max(1, batch // dp)`` microbatches when pipelined, else 1."""

    batch_size: int

    def __call__(self, knobs, workload, fleet):
        replica = (np.asarray(knobs.get("tp_size", 1)) * np.asarray(knobs.get("pp_size", 1))
                   * np.asarray(knobs.get("ep_size", 1)))
        dp = np.maximum(1, fleet.total_accelerators // replica)
        pp = np.asarray(knobs.get("pp_size", 1))
        return {"microbatch_count": np.where(pp > 1, np.maximum(1, self.batch_size // dp), 1)}


@dataclass(frozen=True)
class _ReferencePrescreen:
    """(weights + gradients + Adam state) / (TP*PP) against 90 % of capacity, as a constraint."""

    def __call__(self, outputs, knobs, workload, fleet):
        from solver.replica import stored_bytes

        model_parallel = np.asarray(knobs.get("tp_size", 1)) * np.asarray(knobs.get("pp_size", 1))
        weights = stored_bytes(workload, 2.0) / model_parallel
        if workload.parameters is not None:
            optimizer = workload.parameters * REFERENCE_ADAM_BYTES / model_parallel
        else:
            optimizer = weights * 6.0
        budget = fleet.node.accelerator.memory_capacity * REFERENCE_PRESCREEN_FRACTION
        return (weights + weights + optimizer - budget) / budget


@dataclass(frozen=True)
class ReferenceSpace:
    """mlsysim 0.3.0 ``ParallelismOptimizer.solve``'s space, as a spec plus its two rules.

    ``spec`` sweeps power-of-two TP and PP with the reference's fixed knobs;
    ``derive`` ties the microbatch count to DP as the reference does;
    ``constraints`` holds its memory pre-screen; the objective is
    ``scaling_efficiency`` (the reference ranks by ``scaling_efficiency *
    efficiency`` with ``efficiency`` fixed, the same order).
    """

    spec: Spec
    derive: Callable
    constraints: Mapping[str, Callable]
    efficiency: float
    objective: str = "scaling_efficiency"

    def search(self, **kwargs) -> SearchResult:
        """``search`` over this space (exact mode unless told otherwise)."""
        kwargs.setdefault("mode", "exact")
        kwargs.setdefault("top_k", 5)
        return search(self.spec, objective=self.objective, derive=self.derive,
                      constraints=self.constraints, memory_limit=1.0, **kwargs)


def _as_spec_object(obj, what):
    if isinstance(obj, (Workload, Fleet, str)):
        return obj
    return solver.from_mlsysim(obj)


def reference_optimizer_space(workload, fleet, batch_size: int, *, precision: str = "fp16",
                              efficiency: float = 0.5, max_tp: Optional[int] = None,
                              max_pp: Optional[int] = None, overlap_comm: bool = True,
                              seq_len: int = 2048,
                              activation_recomputation: bool = False) -> ReferenceSpace:
    """The space mlsysim 0.3.0 ``ParallelismOptimizer.solve`` searches, in our terms.

    TP over powers of two up to the node size (``max_tp``), PP over powers of
    two up to the cluster size (``max_pp``), both below 2**10 as the reference
    loops; EP = 1; ``microbatch_count = max(1, batch_size // dp)`` when PP > 1,
    else 1; ``overlap_comm`` True by default; layouts whose weights, gradients
    and Adam state (divided by TP*PP) exceed 90 % of the accelerator's memory
    are screened out, and those whose full training state does not fit are
    dropped (the memory limit is the capacity).

    Parameters
    ----------
    workload, fleet
        Catalog names, ``solver`` specs, or mlsysim objects.
    batch_size, precision, efficiency, max_tp, max_pp
        As the reference's keywords.
    overlap_comm, seq_len, activation_recomputation
        As the reference's keywords.

    Returns
    -------
    ReferenceSpace
    """
    workload = _as_spec_object(workload, "workload")
    fleet = _as_spec_object(fleet, "fleet")
    fleet_spec = fleet if isinstance(fleet, Fleet) else solver.catalog.fleet(fleet)
    n_gpus = fleet_spec.total_accelerators
    limit_tp = max_tp or fleet_spec.node.accelerators_per_node
    limit_pp = max_pp or n_gpus
    raw = {
        "name": "reference_parallelism_optimizer",
        "workload": workload, "fleet": fleet,
        "axes": {"tp_size": powers_of_two(min(limit_tp, REFERENCE_MAX_DEGREE)),
                 "pp_size": powers_of_two(min(limit_pp, REFERENCE_MAX_DEGREE))},
        "fixed": {"batch_size": int(batch_size), "precision": precision,
                  "efficiency": float(efficiency), "overlap_comm": bool(overlap_comm),
                  "seq_len": int(seq_len), "ep_size": 1,
                  "activation_recomputation": bool(activation_recomputation)},
    }
    return ReferenceSpace(spec=load_spec(raw), derive=_ReferenceMicrobatches(int(batch_size)),
                          constraints={"prescreen": _ReferencePrescreen()},
                          efficiency=float(efficiency))


def reproduce_reference_optimizer(workload, fleet, batch_size: int, **kwargs) -> dict:
    """mlsysim 0.3.0 ``ParallelismOptimizer.solve``'s answer, computed with our solver.

    Prices the whole :func:`reference_optimizer_space` exactly and ranks by
    ``scaling_efficiency * efficiency`` (ties: the reference's loop order, TP
    then PP ascending).

    Returns
    -------
    dict
        ``best_config`` ({"tp", "pp", "dp"}), ``best_mfu`` (the reference's
        objective), ``best_throughput`` [samples/s], ``best_step_time`` [s],
        ``top_candidates`` (5, as the reference lists them), ``total_searched``
        (feasible candidates) and ``result`` (the :class:`SearchResult`).
    """
    space = reference_optimizer_space(workload, fleet, batch_size, **kwargs)
    result = space.search(top_k=5)
    if result.best_params is None:
        raise ValueError("No valid parallelism configuration: no TP x PP x DP split of this "
                         "cluster fits its training state in accelerator memory")

    def candidate(entry):
        p = entry["params"]
        fleet_spec = space.spec.fleets[p["fleet"]]
        dp = fleet_spec.total_accelerators // (p["tp_size"] * p["pp_size"])
        return {"config": {"tp": p["tp_size"], "pp": p["pp_size"], "dp": dp},
                "mfu": entry["values"]["scaling_efficiency"] * space.efficiency,
                "throughput": entry["values"]["effective_throughput"],
                "step_time": entry["values"]["step_latency_total"]}

    top = [candidate(e) for e in result.top]
    best = top[0]
    return {"best_config": best["config"], "best_mfu": best["mfu"],
            "best_throughput": best["throughput"], "best_step_time": best["step_time"],
            "top_candidates": top, "total_searched": result.n_feasible, "result": result}
