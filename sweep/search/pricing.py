"""Pricing a batch of trials: one ``solver.solve`` per (workload, fleet), objectives, constraints.

Objectives are outputs of ``solver.solve`` or quantities derived from them
(:data:`solver.outputs.DERIVED`); their directions come from the registry
(:func:`solver.outputs.better`). Every priced layout carries unitless
constraint values, feasible where <= 0 (see :mod:`sweep.search`).
"""

from __future__ import annotations

import difflib
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from solver import outputs as outputs_
from solver.specs import Fleet

from .. import physics as physics_
from ..limits import parse_memory_limit
from ..spec import Spec

__all__ = ["PENALTY", "DEFAULT_DIRECTIONS", "DERIVED", "REPORTED", "resolve_memory_limit",
           "parse_objectives"]

#: Objective value told for a layout that cannot be priced (impossible split):
#: ``-PENALTY`` when maximizing, ``+PENALTY`` when minimizing.
PENALTY = 1e30

#: Default direction of each objective (the registry's ``better``).
DEFAULT_DIRECTIONS = {name: outputs_.better(name) for name in outputs_.objective_names()}

#: Derived quantities usable as objectives: name -> (units, long name), read from
#: :data:`solver.outputs.DERIVED` (kept for callers that index it this way).
DERIVED = {name: (o.units, o.long_name) for name, o in outputs_.DERIVED.items()}

#: Numeric outputs with no direction of better: objectives only with an explicit direction.
_NO_DEFAULT = tuple(n for n, o in outputs_.OUTPUTS.items() if o.better is None
                    and not o.is_boolean)

#: Outputs reported with every layout of ``top`` and ``best_trials``.
REPORTED = ("mfu", "step_latency_total", "effective_throughput", "memory_footprint",
            "memory_headroom", "n_accelerators")

_DEPRECATED_DIRECTIONS = {"max": "maximize", "min": "minimize"}


def _direction(name, dirn):
    if dirn in _DEPRECATED_DIRECTIONS:
        warnings.warn(f"direction {dirn!r} of {name!r} is deprecated: use "
                      f"{_DEPRECATED_DIRECTIONS[dirn]!r}", DeprecationWarning, stacklevel=4)
        dirn = _DEPRECATED_DIRECTIONS[dirn]
    if dirn is None:
        if name not in DEFAULT_DIRECTIONS:
            raise ValueError(f"objective {name!r} has no default direction: pass "
                             f"direction='maximize' or 'minimize'")
        dirn = DEFAULT_DIRECTIONS[name]
    if dirn not in ("maximize", "minimize"):
        raise ValueError(f"direction of {name!r} must be 'maximize' or 'minimize', "
                         f"but got {dirn!r}")
    return name, dirn


def _check(name, dirn):
    if not isinstance(name, str) or (name not in DEFAULT_DIRECTIONS and name not in _NO_DEFAULT):
        names = sorted(DEFAULT_DIRECTIONS)
        close = [n for n in names if isinstance(name, str) and n.lower() == name.lower()][:1]
        close = close or difflib.get_close_matches(str(name), names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"objective must be a numeric output of solver.solve or a derived "
                         f"quantity ({', '.join(names)}), but got {name!r}{hint}")
    return _direction(name, dirn)


def parse_objectives(objective, direction, objectives) -> tuple:
    """((name, direction), ...) from the single- or multi-objective arguments of ``search``."""
    if objectives is None:
        return (_check(objective, direction),)
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
    out = tuple(_check(name, dirn) for name, dirn in items)
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise ValueError(f"objectives must be distinct, but got {names}")
    return out


def resolve_memory_limit(memory_limit, spec: Spec, fleet: Fleet) -> float:
    """Per-accelerator memory limit [B] for ``fleet``.

    Parameters
    ----------
    memory_limit : None, float, str or sweep.limits.MemoryLimit
        ``None``: the spec's ``constraints.memory_limit``, else the
        accelerator's capacity. Otherwise anything
        :func:`sweep.limits.parse_memory_limit` accepts.
    spec : Spec
    fleet : Fleet

    Returns
    -------
    float [B]

    Raises
    ------
    sweep.limits.MemoryLimitError
        For a limit the parser refuses (a ``ValueError``).
    """
    if memory_limit is None:
        return float(spec.memory_limit_for(fleet))
    limit = parse_memory_limit(memory_limit, where="memory_limit")
    return float(limit.resolve(fleet.node.accelerator.memory_capacity))


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
        """+1 for each maximized objective, -1 for each minimized one."""
        return np.array([1.0 if d == "maximize" else -1.0 for _, d in self.objectives])


@dataclass
class _Priced:
    outputs: dict
    knobs: dict
    values: np.ndarray       # (n_objectives, *shape)
    constraints: dict        # name -> array of shape
    valid: np.ndarray
    feasible: np.ndarray     # admissible: valid, fits, within every constraint
    workload: Any = None     # what was priced (an empty answer asks its rules of them)
    fleet: Any = None


def _quantity(name, out, knobs, limit):
    """An output of ``solve`` or a derived quantity of :mod:`solver.outputs`."""
    if name == "n_accelerators":
        return outputs_.n_accelerators(out, knobs)
    if name == "memory_headroom":
        return outputs_.memory_headroom(out, limit)
    if name == "exposed_dp_time":
        return outputs_.exposed_dp_time(out, knobs.get("straggler_factor", 1.0),
                                        knobs.get("physics"))
    return out[name]


def _price(setup: _Setup, workload_label, fleet_label, knobs) -> _Priced:
    """Solve a batch (flat arrays or an open mesh) and score it."""
    spec = setup.spec
    workload, fleet = spec.workloads[workload_label], spec.fleets[fleet_label]
    knobs = {"physics": spec.physics[0], **spec.fixed, **knobs}  # or the physics axis' values
    if setup.derive is not None:
        knobs.update(setup.derive(knobs, workload, fleet))
    out = physics_.solve(workload, fleet, knobs["physics"], knobs,
                         constants=physics_.calibrated(spec))
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
    low, high = spec.accelerator_range(fleet)
    if high is not None or low is not None:
        n_acc = outputs_.n_accelerators(out, knobs)
    if high is not None:
        constraints["accelerators"] = violated_if_invalid((n_acc - high) / high)
    if low is not None:
        constraints["min_accelerators"] = violated_if_invalid((low - n_acc) / low)
    if spec.require_realizable:  # a framework can run it: whole microbatches, no idle ranks
        constraints["realizable"] = np.where(
            valid & np.broadcast_to(np.asarray(out["realizable"], bool), shape), 0.0, 1.0)
    for name, fn in setup.constraints.items():
        constraints[name] = violated_if_invalid(fn(out, knobs, workload, fleet))
    feasible = valid & np.isfinite(values).all(axis=0)
    for c in constraints.values():
        feasible &= ~(np.nan_to_num(c, nan=1.0) > 0)
    return _Priced(out, knobs, values, constraints, valid, feasible, workload, fleet)


def _groups(layouts: Sequence[Mapping]) -> dict:
    """(workload, fleet) -> indices of the layouts priced by one solve."""
    groups: dict = {}
    for i, layout in enumerate(layouts):
        groups.setdefault((layout["workload"], layout["fleet"]), []).append(i)
    return groups


def price_trials(setup: _Setup, space, batch_params: Sequence[Mapping]):
    """Objective values and constraint rows of trial parameters, one solve per (workload, fleet).

    Parameters
    ----------
    setup : _Setup
    space : sweep.search.space.SearchSpace
    batch_params : sequence of dict
        Trial parameters (optuna's names and draws).

    Returns
    -------
    values : numpy.ndarray, shape (n_objectives, n)
        Impossible splits and non-finite values get the penalty (:data:`PENALTY`).
    constraints : list of dict
        name -> value per trial (feasible where all are <= 0).
    """
    layouts = [space.decode(params) for params in batch_params]
    values = np.empty((len(setup.objectives), len(layouts)))
    rows: list = [None] * len(layouts)
    for (w, f), idx in _groups(layouts).items():
        priced = _price(setup, w, f, _trial_knobs(space, layouts, idx))
        values[:, idx] = np.where(np.isfinite(priced.values) & priced.valid,
                                  priced.values, -setup.signs[:, None] * PENALTY)
        for j, i in enumerate(idx):
            rows[i] = {k: float(np.asarray(c)[j]) for k, c in priced.constraints.items()}
    return values, rows


def _trial_knobs(space, layouts: Sequence[Mapping], idx) -> dict:
    """Knob arrays of the decoded trial layouts ``layouts[idx]`` (one workload and fleet),
    with the space's constants."""
    knobs = {p.axis: np.array([layouts[i][p.axis] for i in idx])
             for p in space.params if p.axis not in ("workload", "fleet")}
    knobs.update({k: v for k, v in space.constants.items() if k not in ("workload", "fleet")})
    return knobs


def _layout_knobs(setup: _Setup, layout: Mapping[str, Any]) -> dict:
    """Solve keywords of one layout: fixed knobs, axis values, derived knobs (plain values),
    only those its physics model takes (a physics axis spans knobs of both), and the
    constants of the spec's calibration where it prices with them: ``solver.solve(wl, fl,
    **knobs)`` prices the layout as the search did."""
    spec = setup.spec
    physics = layout.get("physics", spec.physics[0])
    named = {} if physics == physics_.DEFAULT_PHYSICS else {"physics": physics}
    knobs = {**named, **spec.fixed,
             **{k: v for k, v in layout.items() if k not in ("workload", "fleet")}}
    if setup.derive is not None:
        derived = setup.derive(dict(knobs), spec.workloads[layout["workload"]],
                               spec.fleets[layout["fleet"]])
        knobs.update({k: _plain(v) for k, v in derived.items()})
    knobs = {k: v for k, v in knobs.items()
             if k == "physics" or k in physics_.knobs_of(physics)}
    knobs.update(physics_.calibrated(spec).get(physics, {}))
    return knobs


def _plain(value):
    array = np.asarray(value)
    if array.ndim == 0 and array.dtype.kind in "biufU":
        return array.item()
    return value


def _describe(setup: _Setup, layouts: Sequence[Mapping]) -> list:
    """Full outputs (plain floats) of each layout, priced in one call per (workload, fleet)."""
    described = [None] * len(layouts)
    for (w, f), idx in _groups(layouts).items():
        keys = [k for k in layouts[idx[0]] if k not in ("workload", "fleet")]
        knobs = {k: np.array([layouts[i][k] for i in idx]) for k in keys}
        priced = _price(setup, w, f, knobs)
        limit = setup.limits[f]
        n_acc = np.broadcast_to(outputs_.n_accelerators(priced.outputs, priced.knobs),
                                priced.valid.shape)
        for j, i in enumerate(idx):
            row = {name: _plain(np.asarray(v)[j]) for name, v in priced.outputs.items()}
            row["n_accelerators"] = float(n_acc[j])
            row["memory_limit"] = float(limit)
            row["memory_headroom"] = float(outputs_.memory_headroom(row, limit))
            row.update({f"constraint:{k}": float(np.asarray(v)[j])
                        for k, v in priced.constraints.items()})
            described[i] = row
    return described
