"""The physics models of a spec: which knobs each takes, and solving with the union of outputs.

A spec names one physics model (``physics = "megatron"``) or several
(``physics = ["mlsysim", "megatron"]``: then ``physics`` is a categorical axis of
the cube, like ``workload`` and ``fleet``). The rule for knobs:

- every axis and fixed knob must be a knob of at least one of the spec's models,
  and its values must be valid for every one of them that takes it;
- a knob is passed only to the models that take it (``micro_batch_size``,
  ``recompute``, ``cp_size``, ``sequence_parallel``, ... only to megatron;
  ``microbatch_count``, ``activation_recomputation``, ``efficiency``, ... only to
  mlsysim), so the other model's outputs are constant along that axis;
- the outputs are the union of the models' outputs (:func:`union_outputs`); an
  output a model does not return is NaN (False for a boolean) in its slice.

    >>> knobs_for("mlsysim", {"tp_size": 2, "cp_size": 2})
    {'tp_size': 2}
"""

from __future__ import annotations

import json
from typing import Mapping

import numpy as np

import solver
from solver import knobs as knobs_
from solver.outputs import REGISTRY, outputs_of
from solver.physics import DEFAULT_PHYSICS, KNOBS, PHYSICS, megatron

__all__ = ["DEFAULT_PHYSICS", "MODELS", "knobs_of", "choices", "choices_text", "canonical", "knobs_for",
           "union_outputs",
           "union_knobs", "check_name", "convert", "solve", "fill_missing", "provenance"]

#: The physics model names (:data:`solver.physics.PHYSICS`).
MODELS = tuple(PHYSICS)

#: Values of the knobs of kind ``"choice"`` (megatron's ``recompute``, ``precision``,
#: ``cp_comm_type``, ``cross_entropy_fusion_impl``, ``main_params_dtype``, ``exp_avg_dtype``
#: and ``exp_avg_sq_dtype``).
_CHOICES = {("megatron", name): values for name, values in megatron.CHOICES.items()}
#: A choice's value as the model names it, where it takes more spellings than its names
#: (megatron's ``recompute_modules``: its modules in any order; a ValueError names a module
#: it does not know).
_CANONICAL = {("megatron", "recompute_modules"): megatron.recompute_module_set}


def check_name(name) -> str:
    """``name`` if it is a physics model, else ``ValueError`` naming the models and the closest."""
    solver.physics.model(name)
    return name


def knobs_of(physics: str) -> Mapping[str, knobs_.Knob]:
    """Knob name -> :class:`solver.knobs.Knob` of the model ``physics``."""
    return KNOBS[check_name(physics)]


def union_knobs(models) -> tuple:
    """Knob names of any of ``models``, first model's first."""
    return tuple(dict.fromkeys(n for m in models for n in knobs_of(m)))


def choices(physics: str, name: str) -> tuple:
    """The values a knob of kind ``"choice"`` takes."""
    return _CHOICES[(physics, name)]


def choices_text(physics: str, name: str) -> str:
    """What a choice knob takes, for a message: "one of 'a', 'b'"; megatron's
    ``recompute_modules`` (127 sets) by its modules, "one or more of ... joined by ','"."""
    if (physics, name) == ("megatron", "recompute_modules"):
        return (f"one or more of {', '.join(map(repr, megatron.steps.RECOMPUTE_MODULES))} "
                f"joined by ',' or '+'")
    return f"one of {', '.join(map(repr, choices(physics, name)))}"


def canonical(physics: str, name: str, value: str) -> str:
    """The choice ``value`` as the model names it (lower case; megatron's ``recompute_modules``
    its modules in the model's order). ValueError where the model names no such value in
    more words than "not one of" (a ``recompute_modules`` module it does not know)."""
    return _CANONICAL.get((physics, name), str.lower)(value)


def convert(physics: str, name: str, value):
    """``value`` of knob ``name`` checked and converted as model ``physics`` does.

    Raises
    ------
    ValueError
        Naming the knob, what it accepts and the value.
    """
    knob = knobs_of(physics)[name]
    if knob.kind == "choice":
        allowed = choices(physics, name)
        canonical = _CANONICAL.get((physics, name), str.lower)
        for v in np.ravel(np.asarray(value, dtype=object)):
            if not isinstance(v, str) or canonical(v) not in allowed:
                raise ValueError(f"{name} must be {choices_text(physics, name)} "
                                 f"(physics {physics!r}), but got {v!r}")
        return canonical(value) if isinstance(value, str) else value
    return knobs_._CONVERT[knob.kind](knob, value)


def knobs_for(physics: str, knobs: Mapping) -> dict:
    """The entries of ``knobs`` model ``physics`` takes (the rule of this module)."""
    taken = knobs_of(physics)
    return {k: v for k, v in knobs.items() if k in taken}


def union_outputs(models) -> tuple:
    """Output names of any of ``models``, in the first model's order, then the others' new ones."""
    return tuple(dict.fromkeys(n for m in models for n in outputs_of(m)))


def fill_missing(result: Mapping, names, shape=()) -> dict:
    """``result`` with every output of ``names`` it lacks as NaN (False for a boolean)."""
    out = dict(result)
    for name in names:
        if name not in out:
            out[name] = np.full(shape, False if REGISTRY[name].is_boolean else np.nan)
    return out


def calibrated(spec) -> dict:
    """``{physics: constants}`` of the spec's calibration profile (``{}`` without one).

    A calibration's constants go to its own model only; the other models of a
    spec price with their shipped constants.
    """
    profile = getattr(spec, "calibration", None)
    return {} if profile is None else {profile.physics: dict(profile.constants)}


def check_shapes(spec) -> None:
    """:class:`solver.physics.megatron.ShapeWarning` for each workload ``spec`` prices with the
    megatron physics whose shape is not the model it declares, once, attributed to the
    caller: its blocks and trials then call ``solver.solve(..., warn=False)``."""
    if "megatron" in spec.physics:
        for workload in spec.workloads.values():
            megatron.check_shape(workload)


def solve(workload, fleet, physics, knobs: Mapping, names=None, constants=None) -> dict:
    """``solver.solve`` by model ``physics`` with the knobs it takes; outputs ``names`` filled.

    Parameters
    ----------
    workload, fleet : solver specs
    physics : str or array_like of str
        One model, or one per point (broadcasting with the knobs): each point is
        then taken from its own model's solve.
    knobs : mapping
        Knobs of any model (each model gets the ones it takes).
    names : sequence of str, optional
        Outputs to return (missing ones NaN or False); the union of the models
        named by ``physics`` by default.
    constants : mapping, optional
        ``{physics: {constant: value}}`` (a calibration's, :func:`calibrated`).
    """
    labels = np.asarray(physics)
    models = [str(m) for m in np.unique(labels)] if labels.ndim else [str(labels)]
    for m in models:
        check_name(m)
    names = tuple(names) if names is not None else union_outputs(models)
    results = {}
    for m in models:
        result = solver.solve(workload, fleet, physics=m, warn=False,
                              **knobs_for(m, knobs), **(constants or {}).get(m, {}))
        results[m] = fill_missing(result, names, np.shape(result["valid"]))
    if labels.ndim == 0:
        return {n: results[models[0]][n] for n in names}
    out = {}
    for n in names:
        value = results[models[0]][n]
        for m in models[1:]:
            value = np.where(labels == m, results[m][n], value)
        out[n] = np.broadcast_to(value, np.broadcast_shapes(np.shape(value), labels.shape))
    return out


def provenance(physics: str) -> dict:
    """Attributes saying what model ``physics`` is (and its constants, for megatron)."""
    if physics == "mlsysim":
        return {"reference": solver.REFERENCE}
    return {"reference": "solver.physics.megatron (Megatron-Core training step, fitted constants)",
            "constants": json.dumps(megatron.CONSTANTS, sort_keys=True),
            "constants_provenance": json.dumps(megatron.CONSTANTS_PROVENANCE, sort_keys=True)}
