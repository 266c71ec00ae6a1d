"""Declared design spaces: one schema for Python dicts and TOML files.

A spec names the workload(s) and fleet(s), the swept axes (solve keyword ->
values), the fixed knob values, constraints and the outputs to keep::

    workload = "Llama3_70B"            # or a list: then "workload" is an axis
    fleet = "Training_1K"              # or a list: then "fleet" is an axis
    physics = "mlsysim"                # optional: or "megatron", or a list: an axis
    outputs = ["mfu", "step_latency_total", "memory_footprint"]   # optional
    catalog = "my_cluster.toml"        # optional: your own workloads and fleets
                                       # (solver.catalog.load_file), relative to the spec
    calibration = "my_profile.toml"    # optional: fitted constants (python -m sweep calibrate)

    [axes]
    tp_size = { powers_of_two = 8 }            # 1, 2, 4, 8
    pp_size = { divisors_of = "layers" }       # divisors of the model's layer count
    microbatch_count = { from = 1, to = 64 }   # whole numbers 1..64 (step 1)
    efficiency = { from = 0.3, to = 0.6, num = 4 }
    precision = ["bf16", "fp8"]
    zero_stage = [0, 1, 2, 3]

    [fixed]
    batch_size = 1024
    overlap_comm = true

    [constraints]
    memory_limit = "72 GB"        # a size, or a fraction of the accelerator's memory (0.9)
    max_accelerators = 512        # or "none"; default: the fleet's size when dp_size sizes it
    min_accelerators = 64         # optional
    require_realizable = true     # default; false ranks layouts no framework can run

Axis values (read by :mod:`sweep.axes`): a list, or a helper table: ``powers_of_two = N`` (1..N),
``divisors_of = "fleet" | "layers" | N``, ``from``/``to`` with ``step`` (default 1
for whole numbers) or ``num`` (evenly spaced; ``log = true`` for geometric); one
form per axis, at most :data:`MAX_AXIS_VALUES` values. A ``from``/``to`` range of
floats with neither ``step`` nor ``num`` is continuous: a search samples it, a
sweep refuses it. Numbers must be finite; whole-number knobs take whole numbers
below 2**53 (``2.0`` is 2, ``2.5`` is refused); booleans are not numbers. Every
name is a ``solver.solve`` keyword, plus ``dp_size`` (the cluster is then sized by
the layout) and ``workload``/``fleet``; with ``physics`` naming other models
(:mod:`solver.physics`), a knob of any of them, passed only to the models that
take it (the rule is in :mod:`sweep.physics`). The memory limit is read by the one
parser, :func:`sweep.limits.parse_memory_limit`: a bare number in (1, 1e6) is
refused (``80`` surely means ``"80 GB"`` or the fraction 0.8, not 80 bytes).

Constraints on the cluster: when ``dp_size`` is an axis or fixed, the layout
sizes the cluster (``tp*pp*ep*dp_size`` accelerators), and ``max_accelerators``
defaults to the fleet's own size (``fleet.total_accelerators``): the user's
cluster bounds the layouts. A spec lifts it explicitly with a larger number
or ``max_accelerators = "none"``. ``min_accelerators`` rules out clusters
smaller than it. ``require_realizable`` (default true) makes ``admissible``
require the ``realizable`` mask (the batch splits into whole microbatches, no
idle ranks; see :func:`solver.physics.mlsysim.realizable`); set it false for
parity studies of the reference's raw layouts (``sweep.run(...,
require_realizable=False)``, ``--no-require-realizable`` on the command line).
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np

import solver
from solver import catalog
from solver.outputs import REGISTRY, outputs_of
from solver.specs import Fleet, Workload

from . import physics as physics_
from ._reader import Reader, SpecError, suggest
from .examples import SPECS_PACKAGE, _builtin_for, builtin_spec, builtin_specs, missing_spec_hint
from .axes import (MAX_AXIS_VALUES, Axis, divisors, knob_of, knob_value, parse_axis,
                   powers_of_two)
from .limits import MemoryLimit, MemoryLimitError, parse_memory_limit

__all__ = [
    "Axis",
    "Spec",
    "SpecError",
    "load_spec",
    "builtin_specs",
    "builtin_spec",
    "SPECS_PACKAGE",
    "powers_of_two",
    "divisors",
    "TOP_KEYS",
    "CONSTRAINT_KEYS",
    "NO_LIMIT",
    "MAX_AXIS_VALUES",
]

TOP_KEYS = ("name", "workload", "fleet", "physics", "axes", "fixed", "constraints", "outputs",
            "catalog", "dtype", "description", "calibration")
CONSTRAINT_KEYS = ("memory_limit", "max_accelerators", "min_accelerators", "require_realizable")
#: ``max_accelerators = "none"``: no bound, not even the fleet's size.
NO_LIMIT = "none"
_DTYPES = ("float64", "float32")


@dataclass(frozen=True)
class Spec:
    """A parsed, checked design space. Build it with :func:`load_spec`.

    ``limit`` is ``constraints.memory_limit`` as parsed by
    :func:`sweep.limits.parse_memory_limit` (None: the accelerator's capacity);
    :meth:`memory_limit_for` resolves it for one fleet. ``max_accelerators`` is
    the explicit bound (None if unset or ``"none"``); :meth:`accelerator_range`
    gives the bounds in force on one fleet (the fleet's size by default when
    ``dp_size`` sizes the cluster, unless ``unbounded_cluster``).
    """

    workloads: Mapping[str, Workload]
    fleets: Mapping[str, Fleet]
    axes: tuple
    fixed: Mapping[str, Any] = field(default_factory=dict)
    outputs: tuple = ()
    limit: Optional[MemoryLimit] = None
    max_accelerators: Optional[int] = None
    dtype: str = "float64"
    name: str = "sweep"
    description: str = ""
    source: str = "<dict>"
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)
    #: The physics models (one, or several: then ``physics`` is an axis).
    physics: tuple = (physics_.DEFAULT_PHYSICS,)
    min_accelerators: Optional[int] = None
    #: ``max_accelerators = "none"``: no default bound from the fleet's size.
    unbounded_cluster: bool = False
    require_realizable: bool = True
    #: A calibration profile (:class:`sweep.calibration.Profile`): its physics and constants.
    calibration: Optional[Any] = None

    @property
    def dims(self) -> tuple:
        """Axis names, in cube order."""
        return tuple(a.name for a in self.axes)

    @property
    def shape(self) -> tuple:
        return tuple(len(a) for a in self.axes)

    @property
    def size(self) -> int:
        return math.prod(self.shape)  # exact: a Python int never wraps

    def axis(self, name: str) -> Axis:
        for a in self.axes:
            if a.name == name:
                return a
        raise KeyError(f"spec {self.name!r} has no axis {name!r}{suggest(name, self.dims)}")

    def workload_spec(self, label=None) -> Workload:
        """The workload labelled ``label`` (the name the spec gave); the only one if None."""
        return _lookup(self.workloads, label, "workload")

    def fleet_spec(self, label=None) -> Fleet:
        """The fleet labelled ``label`` (the name the spec gave); the only one if None."""
        return _lookup(self.fleets, label, "fleet")

    @property
    def memory_limit(self) -> Optional[float]:
        """The memory limit in bytes [B] when given as a size, else None."""
        return None if self.limit is None else self.limit.size

    @property
    def memory_limit_fraction(self) -> Optional[float]:
        """The memory limit as a fraction of the accelerator's memory when so given, else None."""
        return None if self.limit is None else self.limit.fraction

    def memory_limit_for(self, fleet: Fleet) -> float:
        """Per-accelerator memory limit [B] on ``fleet`` (its capacity when none is set)."""
        capacity = fleet.node.accelerator.memory_capacity
        if self.limit is None:
            return capacity
        return self.limit.resolve(capacity)

    def knobs_for(self, physics: str, knobs: Mapping) -> dict:
        """The entries of ``knobs`` model ``physics`` takes (:func:`sweep.physics.knobs_for`)."""
        return physics_.knobs_for(physics, knobs)

    @property
    def sizes_cluster(self) -> bool:
        """Whether the layout sizes the cluster (``dp_size`` is an axis or fixed)."""
        return "dp_size" in self.dims or "dp_size" in self.fixed

    def accelerator_range(self, fleet: Fleet) -> tuple:
        """``(min_accelerators, max_accelerators)`` in force on ``fleet`` (None: no bound).

        The maximum is the spec's ``max_accelerators``; when it is unset and the
        layout sizes the cluster, the fleet's own size (``"none"`` lifts it).
        """
        high = self.max_accelerators
        if high is None and self.sizes_cluster and not self.unbounded_cluster:
            high = fleet.total_accelerators
        return self.min_accelerators, high

    def with_constraints(self, **changes) -> "Spec":
        """This spec with ``[constraints]`` keys changed (a value of None leaves a key as is).

        The keys and values are those of the spec file (``max_accelerators``,
        ``min_accelerators``, ``require_realizable``, ``memory_limit``), checked
        the same way; the spec's JSON (the cube's provenance) says the new values.
        """
        changes = {k: v for k, v in changes.items() if v is not None}
        if not changes:
            return self
        constraints = {**self.raw.get("constraints", {}), **changes}
        fields = _constraints(Reader(self.source), constraints)
        return dataclasses.replace(self, raw={**self.raw, "constraints": constraints}, **fields)

    def to_json(self) -> str:
        """The spec as given (names, not objects), as JSON: provenance for a cube."""
        return json.dumps(_jsonable(self.raw), sort_keys=True)


def _jsonable(value):
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (Workload, Fleet)):
        return value.name
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):  # (an axis given as an array, as parse_axis takes it)
        return [_jsonable(v) for v in value.tolist()]
    return value


def _lookup(entries, label, what):
    if label is None:
        if len(entries) != 1:
            raise SpecError(f"the spec has {len(entries)} {what}s; name one of "
                            f"{', '.join(entries)}")
        return next(iter(entries.values()))
    if label in entries:
        return entries[label]
    raise SpecError(f"the spec has no {what} {label!r}{suggest(label, entries)}")


def _resolve_many(reader, key, given, what, extra):
    """Workload or fleet names (or spec objects) -> {label: spec}, labels as given."""
    items = given if isinstance(given, (list, tuple)) else [given]
    if not items:
        reader.fail(key, f"a {what} name or a list of names", given)
    spec_type = Workload if what == "workload" else Fleet
    out = {}
    for i, item in enumerate(items):
        where = key if len(items) == 1 and not isinstance(given, (list, tuple)) else f"{key}[{i}]"
        if isinstance(item, spec_type):
            label, value = item.name, item
        elif isinstance(item, str):
            label = item
            if item in extra:
                value = extra[item]
            else:
                try:
                    value = getattr(catalog, what)(item)
                except catalog.CatalogError as err:
                    hint = ("" if extra else "; your own entries go in a catalog TOML file "
                            "named by the spec key catalog = \"my_cluster.toml\"")
                    raise SpecError(f"{reader.where(where)}: {err}{hint}") from None
        else:
            reader.fail(where, f"a {what} name (see `python -m sweep catalog`)", item)
        if label in out:
            reader.fail(key, f"distinct {what}s", f"{label!r} twice")
        out[label] = value
    return out


def load_spec(spec, *, source: Optional[str] = None, physics=None) -> Spec:
    """Read and check a spec from a dict, a TOML file path, or a :class:`Spec`.

    ``physics`` (a model name or a list of names) overrides the spec's
    ``physics`` key (the command line's ``--physics``). Where it names some of the
    spec's own models (``megatron`` of ``["mlsysim", "megatron"]``), the axes and fixed
    knobs only the others take are dropped: they went to those models alone, so this is
    the spec's slice of the models named. A relative path that
    does not exist but names a built-in example spec
    (``"default"``, ``"search_llama70b.toml"``, ``"configs/sweeps/default.toml"``)
    reads the copy installed with the package (see :func:`builtin_specs`).

    Raises
    ------
    SpecError
        Naming the file and key, what was expected and what came.
    """
    def parse(raw, where, base):
        if physics is None:
            return _parse(raw, where, base)
        own = raw.get("physics", physics_.DEFAULT_PHYSICS)
        raw = {**raw, "physics": list(physics) if isinstance(physics, tuple) else physics}
        raw = _only_knobs_of(raw, own, raw["physics"])
        return _parse(raw, where, base, physics_note=(
            f"; the physics {physics!r} was asked for in place of the spec's own {own!r} "
            f"(--physics, or physics=): the spec's axes and fixed knobs are knobs of its own "
            f"models, so run it without that, or a spec written for {physics!r}"))

    if isinstance(spec, Spec):
        if physics is None:
            return spec
        own = Path(spec.source).parent if Path(spec.source).exists() else Path.cwd()
        return parse(dict(spec.raw), spec.source, own)
    if isinstance(spec, (str, Path)):
        path = Path(spec)
        builtin = None if path.exists() else _builtin_for(path)
        if builtin is not None:
            raw = catalog.read_toml(builtin, f"configs/sweeps/{builtin.name}", error=SpecError,
                                    what="spec file")
            return parse(raw, source or f"configs/sweeps/{builtin.name}", base=Path.cwd())
        if not path.exists() and missing_spec_hint(path):
            raise SpecError(f"{path}: no such spec file{missing_spec_hint(path)}")
        raw = catalog.read_toml(path, str(path), error=SpecError, what="spec file")
        return parse(raw, source or str(path), base=path.parent)
    if isinstance(spec, Mapping):
        return parse(dict(spec), source or "<dict>", base=Path.cwd())
    raise SpecError(f"a spec is a dict, a TOML path or a Spec, but got {type(spec).__name__}")


def _only_knobs_of(raw, own, asked):
    """``raw`` without the axes and fixed knobs that only models of ``own`` left out of
    ``asked`` take, nor the outputs only they return, where ``asked`` names some of
    ``own`` (model names or lists of them); else ``raw`` as it is (a knob of no asked
    model is then refused, naming it)."""
    def names(models):
        models = [models] if isinstance(models, str) else models
        if not isinstance(models, (list, tuple)) or not all(m in physics_.MODELS for m in models):
            return None  # not model names: _parse refuses them with its message
        return set(models)

    own_models, asked_models = names(own), names(asked)
    if not own_models or not asked_models or not asked_models < own_models:
        return raw
    kept = set(physics_.union_knobs(sorted(asked_models)))
    dropped = set(physics_.union_knobs(sorted(own_models))) - kept
    raw = dict(raw)
    for key in ("axes", "fixed"):
        if isinstance(raw.get(key), Mapping):
            raw[key] = {name: value for name, value in raw[key].items() if name not in dropped}
    if isinstance(raw.get("outputs"), list):
        gone = (set(physics_.union_outputs(sorted(own_models)))
                - set(physics_.union_outputs(sorted(asked_models))))
        raw["outputs"] = [name for name in raw["outputs"] if name not in gone]
    return raw


def _parse(raw, source, base, physics_note="") -> Spec:
    """The checked :class:`Spec` of the spec table ``raw`` read from ``source``
    (``physics_note``: :attr:`Reader.physics_note`)."""
    reader = Reader(source, physics_note)
    for key in raw:
        if key not in TOP_KEYS:
            reader.unknown(key, TOP_KEYS)
    for key in ("workload", "fleet"):
        if key not in raw:
            reader.fail(key, f"a {key} name (required)", None)
    extra_workloads, extra_fleets = _own_catalog(reader, raw, base)
    workloads = _resolve_many(reader, "workload", raw["workload"], "workload", extra_workloads)
    fleets = _resolve_many(reader, "fleet", raw["fleet"], "fleet", extra_fleets)
    calibration = _calibration(reader, raw, base)
    # A calibration implies its physics; a spec naming others must name it too.
    models = _physics(reader, raw.get("physics", calibration.physics if calibration
                                      else physics_.DEFAULT_PHYSICS))
    if calibration is not None and calibration.physics not in models:
        reader.fail("physics", f"the calibration's physics {calibration.physics!r} among the "
                    f"spec's models", raw.get("physics"))
    _check_transformers(reader, raw["workload"], workloads, models)
    axes = _axes(reader, raw, workloads, fleets, models)
    constraints = _constraints(reader, raw.get("constraints", {}))
    dtype = raw.get("dtype", "float64")
    if dtype not in _DTYPES:
        reader.fail("dtype", " or ".join(_DTYPES), dtype)
    name = raw.get("name", Path(source).stem if source != "<dict>" else "sweep")
    if not isinstance(name, str):
        reader.fail("name", "a string", name)
    description = raw.get("description", "")
    if not isinstance(description, str):
        reader.fail("description", "a string", description)
    spec = Spec(workloads=workloads, fleets=fleets, axes=axes,
                fixed=_fixed(reader, raw.get("fixed", {}), raw.get("axes", {}), models),
                outputs=_outputs(reader, raw.get("outputs"), models), dtype=dtype,
                name=name, description=description, source=source, raw=raw, physics=models,
                calibration=calibration, **constraints)
    _check_reachable_minimum(reader, spec)
    _warn_missing_precisions(spec)
    _warn_shadowed_outputs(spec)
    if calibration is not None:  # fitted on other accelerators than the spec prices: say so
        from .calibration.profile import warn_other_hardware

        warn_other_hardware(calibration, spec)
    return spec


class ShadowedOutputWarning(UserWarning):
    """An axis of the spec is one model's knob and another model's output of the same name
    (``microbatch_count``: mlsysim's knob, megatron's derived count): the cube keeps the
    axis, so the other model's output is not kept, and its layouts' coordinate there is
    not theirs."""


def _warn_shadowed_outputs(spec) -> None:
    """:class:`ShadowedOutputWarning` for each axis that a model of the spec takes as a knob
    and another outputs: the cube has one variable of a name, the axis's."""
    if len(spec.physics) < 2:
        return
    for name in spec.dims:
        taking = [m for m in spec.physics if name in physics_.knobs_of(m)]
        giving = [m for m in spec.physics if m not in taking and name in outputs_of(m)]
        if taking and giving:
            warnings.warn(
                f"{spec.source}: axis {name!r} is a knob of {', '.join(taking)} and an output "
                f"of {', '.join(giving)}, which the cube cannot keep beside the axis: "
                f"{', '.join(giving)}'s layouts carry the axis's values there, not their own "
                f"{name} (price {', '.join(giving)} alone, or solver.solve a layout, to read it)",
                ShadowedOutputWarning, stacklevel=4)


class PrecisionWarning(UserWarning):
    """The mlsysim physics prices a precision the accelerator has no peak for (FP8 on an
    A100): as mlsysim 0.3.0 does, at its headline peak with that precision's bytes,
    realizable. The megatron physics refuses such layouts (``realizable`` False)."""


#: Precisions every accelerator computes in (the mlsysim names).
_NATIVE_PRECISIONS = ("fp32", "fp16", "bf16")


def _warn_missing_precisions(spec) -> None:
    """:class:`PrecisionWarning` where the mlsysim physics would price a precision the
    accelerator of a fleet has no peak for: mlsysim 0.3.0 (and so this model, exact to it)
    prices it at the accelerator's headline peak, so its layouts rank as if they ran."""
    if "mlsysim" not in spec.physics:
        return
    if "precision" in spec.dims:
        names = [str(v).lower() for v in spec.axis("precision").values or ()]
    else:
        names = [str(spec.fixed.get("precision", "fp16")).lower()]
    for label, fleet in spec.fleets.items():
        acc = fleet.node.accelerator
        missing = [p for p in dict.fromkeys(names)
                   if p not in _NATIVE_PRECISIONS and p not in (acc.precision_flops or {})]
        if missing:
            warnings.warn(
                f"{spec.source}: the mlsysim physics prices {', '.join(missing)} on fleet "
                f"{label!r}, whose {acc.name} states no {'/'.join(missing)} peak, at its headline "
                f"peak ({acc.peak_flops / 1e12:,.0f} TFLOP/s) with {'/'.join(missing)}'s bytes, as "
                f"mlsysim 0.3.0 does, and calls those layouts realizable: they rank as if the "
                f"accelerator ran them (the megatron physics refuses them)", PrecisionWarning,
                stacklevel=4)


def _check_transformers(reader, given, workloads, models) -> None:
    """Refuse a workload the megatron physics cannot price where the spec prices with it:
    it prices transformers only (kind ``"transformer"`` or ``"moe"``), and a CNN or an SSM
    would otherwise fail the sweep with the solver's traceback."""
    if "megatron" not in models:
        return
    many = isinstance(given, (list, tuple))
    for i, (label, workload) in enumerate(workloads.items()):
        if not workload.is_transformer:
            where = f"workload[{i}]" if many else "workload"
            which = ("physics = \"megatron\"" if len(models) == 1
                     else f"physics = {list(models)}".replace("'", '"'))
            raise SpecError(
                f"{reader.where(where)}: expected a transformer (kind 'transformer' or 'moe') "
                f"under {which}, but got {label!r}, of kind {workload.kind!r}: the megatron "
                f"physics prices transformers only; price it with physics = \"mlsysim\"")


def _check_reachable_minimum(reader, spec) -> None:
    """Refuse a ``min_accelerators`` no layout of a fleet can reach: above the fleet's size
    where the fleet sizes the cluster (no ``dp_size``), or above its own maximum (the
    fleet's size when ``dp_size`` sizes it): every layout would be left out."""
    least = spec.min_accelerators
    if least is None:
        return
    for label, fleet in spec.fleets.items():
        _, high = spec.accelerator_range(fleet)
        if not spec.sizes_cluster:
            high = fleet.total_accelerators
            how = (f"the {high:,} accelerators fleet {label!r} has (the layouts take the "
                   f"fleet's size; make dp_size an axis to size the cluster)")
        else:
            how = f"the {high:,} accelerators at most of fleet {label!r} (max_accelerators)"
        if high is not None and least > high:
            reader.fail("constraints.min_accelerators", f"at most {how}", least)


def _physics(reader, given) -> tuple:
    """``physics``: one model name or a list of distinct names (an axis when several)."""
    items = list(given) if isinstance(given, (list, tuple)) else [given]
    if not items:
        reader.fail("physics", "a physics model name or a list of names", given)
    for i, item in enumerate(items):
        where = "physics" if not isinstance(given, (list, tuple)) else f"physics[{i}]"
        try:
            physics_.check_name(item)
        except ValueError as err:
            raise SpecError(f"{reader.where(where)}: {err}") from None
    if len(set(items)) != len(items):
        reader.fail("physics", "distinct physics models", given)
    return tuple(items)


def _own_catalog(reader, raw, base) -> tuple:
    """``(workloads, fleets)`` of the spec's own catalog file (``catalog = "..."``), if any."""
    if "catalog" not in raw:
        return {}, {}
    if not isinstance(raw["catalog"], str) or not raw["catalog"]:
        reader.fail("catalog", "the path of a catalog TOML file (a string)", raw["catalog"])
    path = Path(raw["catalog"])
    path = path if path.is_absolute() else base / path
    try:
        loaded = catalog.load_file(path)
    except catalog.CatalogError as err:
        raise SpecError(f"{reader.where('catalog')}: {err}") from None
    return loaded.get("workloads", {}), loaded.get("fleets", {})


def _calibration(reader, raw, base):
    """The profile of ``calibration = "my_cluster.toml"`` (relative to the spec), or None."""
    if "calibration" not in raw:
        return None
    from .calibration import ProfileError, load_profile

    given = raw["calibration"]
    if not isinstance(given, str) or not given:
        reader.fail("calibration", "the path of a calibration profile (TOML, from "
                    "`python -m sweep calibrate`)", given)
    path = Path(given) if Path(given).is_absolute() else base / given
    try:
        return load_profile(path)
    except ProfileError as err:
        raise SpecError(f"{reader.where('calibration')}: {err}") from None


def _axes(reader, raw, workloads, fleets, models) -> tuple:
    """The ``workload``/``fleet``/``physics`` axes (when several are listed), then ``[axes]``'s."""
    axes_raw = raw.get("axes", {})
    if not isinstance(axes_raw, Mapping):
        reader.fail("axes", "a table of knob = values", axes_raw)
    axes = []
    for key, values, specs_ in (("workload", raw["workload"], workloads),
                                ("fleet", raw["fleet"], fleets)):
        if isinstance(values, (list, tuple)) and len(specs_) > 1:
            axes.append(Axis(name=key, kind=key, values=tuple(specs_)))
    if len(models) > 1:
        axes.append(Axis(name="physics", kind="physics", values=models))
    axes += [parse_axis(reader, name, given, workloads, fleets, models)
             for name, given in axes_raw.items()]
    return tuple(axes)


def _fixed(reader, fixed_raw, axes_raw, models) -> dict:
    """``[fixed]``: knob -> checked value (a knob may not be fixed and swept)."""
    if not isinstance(fixed_raw, Mapping):
        reader.fail("fixed", "a table of knob = value", fixed_raw)
    fixed = {}
    for name, value in fixed_raw.items():
        if name == "physics":
            reader.fail("fixed.physics", "physics at the top of the spec (physics = "
                                         "\"megatron\")", value)
        knob_of(reader, name, models, where="fixed")
        if name in axes_raw:
            reader.fail(f"fixed.{name}", "a knob that is not also an axis", value)
        fixed[name] = knob_value(reader, f"fixed.{name}", name, value, models=models)
    return fixed


def _outputs(reader, outputs, models) -> tuple:
    """``outputs``: distinct names of the models' outputs (all of them by default)."""
    known = physics_.union_outputs(models)
    if outputs is None:
        return known
    if not isinstance(outputs, (list, tuple)) or not outputs:
        reader.fail("outputs", "a non-empty list of output names", outputs)
    for name in outputs:
        if not isinstance(name, str):
            reader.fail("outputs", "a list of output names (strings)", outputs)
        if name not in known:
            if name in REGISTRY:
                reader.fail("outputs", f"outputs of the physics {', '.join(models)}",
                            f"{name!r}, an output of {', '.join(REGISTRY[name].physics)} only")
            reader.unknown(name, list(known), where="outputs")
    if len(set(outputs)) != len(outputs):
        twice = sorted({n for n in outputs if outputs.count(n) > 1})
        reader.fail("outputs", "distinct output names", f"{', '.join(twice)} more than once")
    return tuple(outputs)


def _constraints(reader, constraints) -> dict:
    """The :class:`Spec` fields of ``[constraints]``: ``limit``, ``max_accelerators``, ...

    The memory limit goes through the one parser, :func:`sweep.limits.parse_memory_limit`
    (its errors become :class:`SpecError` naming the file and key).
    """
    if not isinstance(constraints, Mapping):
        reader.fail("constraints", "a table", constraints)
    for key in constraints:
        if key not in CONSTRAINT_KEYS:
            reader.unknown(key, CONSTRAINT_KEYS, where="constraints")
    limit = None
    if "memory_limit" in constraints:
        try:
            limit = parse_memory_limit(constraints["memory_limit"],
                                       where=reader.where("constraints.memory_limit"))
        except MemoryLimitError as err:
            raise SpecError(str(err)) from None
    max_acc = constraints.get("max_accelerators")
    unbounded = isinstance(max_acc, str) and max_acc.strip().lower() == NO_LIMIT
    if unbounded:
        max_acc = None
    else:
        _count(reader, "max_accelerators", max_acc, f' or "{NO_LIMIT}"')
    min_acc = constraints.get("min_accelerators")
    _count(reader, "min_accelerators", min_acc)
    if min_acc is not None and max_acc is not None and min_acc > max_acc:
        reader.fail("constraints.min_accelerators",
                    f"at most max_accelerators ({max_acc})", min_acc)
    realizable = constraints.get("require_realizable", True)
    if not isinstance(realizable, bool):
        reader.fail("constraints.require_realizable", "true or false", realizable)
    return {"limit": limit, "max_accelerators": max_acc, "min_accelerators": min_acc,
            "unbounded_cluster": unbounded, "require_realizable": realizable}


def _count(reader, key, value, alternative="") -> None:
    """Refuse an accelerator count that is not a whole number in [1, 2**53)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not 1 <= value < solver.knobs.MAX_INTEGER):
        reader.fail(f"constraints.{key}", f"a whole number from 1 to 2**53 - 1{alternative}",
                    value)
