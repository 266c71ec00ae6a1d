"""The layout of a sweep's cube: dims, coordinates, variables and provenance.

A cube is an :class:`xarray.Dataset` whose dims are the spec's axes, named
exactly like the ``solver.solve`` keywords (plus ``dp_size``, ``workload``,
``fleet`` and ``physics``), whose coordinates are the axis values, and whose data
variables are the spec's outputs (``units``, ``long_name`` and dtype from the
output registry, :data:`solver.outputs.REGISTRY`; an output the physics model
of a slice does not return is NaN there, False for a boolean)
plus these masks and counts:

``valid``
    The split is possible (TP*PP*EP divides the fleet, or whole nodes when
    ``dp_size`` sizes the cluster).
``feasible``
    The training state fits the accelerator's memory.
``within_memory_limit``
    ``memory_footprint <= spec.memory_limit_for(fleet)``.
``n_accelerators``
    Accelerators the layout runs on (:func:`solver.outputs.n_accelerators`, by
    the model's rule). It spans only the dims it depends on: ``tp_size``,
    ``pp_size``, ``ep_size``, ``cp_size``, ``dp_size`` and ``physics`` when
    ``dp_size`` is an axis or fixed (the cluster is sized by the layout), else
    ``fleet`` (or no dim: the fleet's size).
``realizable``
    A framework can run the layout: the per-replica batch of each
    gradient-accumulation step splits into ``microbatch_count`` whole
    microbatches, no idle ranks (:func:`solver.physics.common.realizable`), and
    the model splits evenly: TP divides the heads, an interleaved schedule cuts
    the layers into equal chunks, EP divides the experts
    (:func:`solver.physics.common.even_splits`); the megatron model has its own rules.
``admissible``
    ``valid & within_memory_limit & realizable`` and ``min_accelerators <=
    n_accelerators <= max_accelerators`` (``realizable`` unless the spec says
    ``require_realizable = false``; the bounds of :meth:`Spec.accelerator_range`:
    ``max_accelerators`` is the fleet's size by default when ``dp_size`` sizes
    the cluster).

Every boolean data variable (the masks and boolean outputs) is a CF flag
variable: ``flag_values = [0, 1]`` (int8) and ``flag_meanings = "false true"``;
it is a bool in memory and an ``int8`` in the file (:mod:`sweep.storage.cf`).

The ``dp_size`` output is left out when ``dp_size`` is an axis (its coordinate
gives it). The same layout serves the in-memory cube (:func:`allocate`, :func:`to_dataset`)
and the cube streamed to a netCDF file (:mod:`sweep.storage`), so both give
identical datasets. Attributes follow netCDF's rules: strings and numbers only
(JSON strings for structures, no bools or None). The dataset's attributes give
the provenance: ``package_version``, ``reference`` (the model reproduced),
``physics`` (the model, when the spec names one; else the ``physics``
coordinate), ``physics_models`` (JSON: each model's reference, and for megatron
its fitted ``constants`` and their ``constants_provenance``),
``spec`` (``spec.to_json()``), ``workloads`` and ``fleets`` (their facts, JSON),
``fixed`` (JSON), ``memory_limit`` (bytes per fleet, JSON), ``max_accelerators``
and ``min_accelerators`` when bounded (an int, or JSON per fleet when the
fleets' bounds differ), ``require_realizable`` (0 or 1), and ``date_created``/``history`` (UTC; set ``$SOURCE_DATE_EPOCH`` to fix
them, as the tests do, so that two runs of one spec give identical cubes).
``complete = 1`` says every point is priced: a streamed sweep writes it last
(:mod:`sweep.storage`), and a cube without it is refused where a finished one
is needed (:func:`sweep.open_cube`, :mod:`sweep.analysis`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Optional

import numpy as np
import xarray as xr

import solver
from solver.outputs import OUTPUTS, REGISTRY, n_accelerators

from . import physics as physics_
from .axes import knob_of
from .spec import Spec, SpecError

__all__ = [
    "CubeLayout",
    "Variable",
    "MASKS",
    "FROM_SPEC",
    "layout",
    "allocate",
    "to_dataset",
    "accelerator_counts",
    "accelerators_ok",
    "check_some_valid",
    "bool_outputs",
    "COMPLETE",
    "FLAG_VALUES",
    "FLAG_MEANINGS",
    "flag_attrs",
]

#: The attribute of a finished cube (every point priced): ``complete = 1``.
COMPLETE = "complete"

#: CF flag attributes of every boolean variable (CF-1.8 section 3.5): ``flag_values``
#: is int8, the type of the stored variable (bools are written as int8).
FLAG_VALUES = np.array([0, 1], dtype=np.int8)
FLAG_MEANINGS = "false true"


def flag_attrs() -> dict:
    """``{"flag_values": int8 [0, 1], "flag_meanings": "false true"}`` (a fresh copy)."""
    return {"flag_values": FLAG_VALUES.copy(), "flag_meanings": FLAG_MEANINGS}


#: Boolean masks every cube carries, with their long names.
MASKS = {
    "valid": OUTPUTS["valid"].long_name,
    "feasible": OUTPUTS["feasible"].long_name,
    "within_memory_limit": "memory footprint at most the spec's memory limit",
    "realizable": OUTPUTS["realizable"].long_name,
    "admissible": "valid, within the memory limit and the accelerator bounds, realizable",
}
#: Variables taken from the spec alone (:func:`accelerator_counts`), never priced block by
#: block: set once on the cube, or staged once by a streamed sweep, whatever dims they span.
FROM_SPEC = ("n_accelerators",)
_SPLIT_DIMS = ("tp_size", "pp_size", "ep_size", "cp_size", "dp_size")
#: The knobs validity depends on: the split's, and the expert TP degree (megatron's expert
#: grid must tile the ranks), which sizes nothing.
_VALIDITY_DIMS = _SPLIT_DIMS + ("etp_size",)
_BOOL_OUTPUTS = frozenset(name for name, output in REGISTRY.items() if output.is_boolean)


@dataclass(frozen=True)
class Variable:
    """One variable of a cube: its dims, numpy dtype and attributes."""

    dims: tuple
    dtype: np.dtype
    attrs: Mapping


@dataclass(frozen=True)
class CubeLayout:
    """Everything about a cube but its data.

    ``coords`` maps each dim to its coordinate values (a numpy array) and
    attributes; ``variables`` maps each data variable to a :class:`Variable`;
    ``attrs`` are the dataset's provenance attributes.
    """

    dims: tuple
    shape: tuple
    coords: Mapping
    variables: Mapping
    attrs: Mapping

    def bytes_per_point(self) -> int:
        """Bytes the full-size variables take per point of the cube."""
        return sum(v.dtype.itemsize for v in self.variables.values() if v.dims == self.dims)

    def priced(self) -> tuple:
        """Names of the variables each block of the sweep prices: the full-size ones
        but those of :data:`FROM_SPEC`, which the spec gives whatever dims they span
        (``n_accelerators`` spans every dim where each axis is a split knob)."""
        return tuple(name for name, var in self.variables.items()
                     if var.dims == self.dims and name not in FROM_SPEC)


def bool_outputs(spec: Optional[Spec] = None) -> frozenset:
    """Names of the solver outputs that are boolean (``valid``, ``feasible``, ...).

    Read from the output registry (:data:`solver.outputs.REGISTRY`); they do not
    depend on the spec (the argument is kept for the callers that pass it).
    """
    return _BOOL_OUTPUTS


def _facts(value):
    """A spec object (dataclass) as plain JSON-able data."""
    if dataclasses.is_dataclass(value):
        return {f.name: _facts(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (Mapping, MappingProxyType)):
        return {str(k): _facts(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_facts(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _created() -> str:
    """Creation time, UTC ISO 8601; ``$SOURCE_DATE_EPOCH`` fixes it (reproducible files)."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    when = (datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc) if epoch
            else datetime.datetime.now(datetime.timezone.utc))
    return when.replace(microsecond=0).isoformat()


def _attrs(spec: Spec) -> dict:
    created = _created()
    attrs = {
        "title": f"layout sweep {spec.name!r}",
        "Conventions": "CF-1.8",
        "package": "layout-sweep",
        "package_version": solver.__version__,
        "reference": solver.REFERENCE,
        "spec_name": spec.name,
        "spec_source": str(spec.source),
        "spec": spec.to_json(),
        "description": spec.description,
        "workloads": json.dumps({k: _facts(v) for k, v in spec.workloads.items()}, sort_keys=True),
        "fleets": json.dumps({k: _facts(v) for k, v in spec.fleets.items()}, sort_keys=True),
        "fixed": json.dumps(_facts(dict(spec.fixed)), sort_keys=True),
        "memory_limit": json.dumps({k: spec.memory_limit_for(v) for k, v in spec.fleets.items()},
                                   sort_keys=True),
        "date_created": created,
        "history": (f"{created} sweep.run (layout-sweep {solver.__version__}; "
                    f"python {platform.python_version()}, numpy {np.__version__}, "
                    f"xarray {xr.__version__})"),
    }
    if len(spec.workloads) == 1:
        attrs["workload"] = next(iter(spec.workloads))
    if len(spec.fleets) == 1:
        attrs["fleet"] = next(iter(spec.fleets))
    if len(spec.physics) == 1:
        attrs["physics"] = spec.physics[0]
    models = {m: physics_.provenance(m) for m in spec.physics}
    attrs["physics_models"] = json.dumps(models, sort_keys=True)
    if len(spec.physics) > 1:  # each point is one model's: name both, by the axis' values
        attrs["reference"] = "; ".join(f"physics={m}: {models[m]['reference']}"
                                       for m in spec.physics)
    elif physics_.DEFAULT_PHYSICS not in spec.physics:
        attrs["reference"] = models[spec.physics[0]]["reference"]
    for i, key in enumerate(("min_accelerators", "max_accelerators")):
        bounds = {label: spec.accelerator_range(f)[i] for label, f in spec.fleets.items()}
        if len(set(bounds.values())) == 1:
            if None not in bounds.values():
                attrs[key] = int(next(iter(bounds.values())))
        else:
            attrs[key] = json.dumps(bounds, sort_keys=True)
    attrs["require_realizable"] = int(spec.require_realizable)
    if spec.calibration is not None:  # the profile priced with (JSON: physics, constants, data hash)
        attrs["calibration"] = spec.calibration.to_json()
    attrs[COMPLETE] = 1
    return attrs


def _coordinate(axis, models) -> tuple:
    if axis.kind in ("workload", "fleet", "physics", "precision", "topology", "choice"):
        values = np.array([str(v) for v in axis.values])
        named = {"workload": "workload", "fleet": "fleet", "physics": "physics model"}
        # (a named choice of a physics model: its knob's description where it states one)
        why = knob_of(None, axis.name, models).why if axis.kind == "choice" else None
        return values, {"long_name": named.get(axis.kind, why or axis.name)}
    dtype = {"int": np.int64, "float": np.float64, "bool": bool}[axis.kind]
    why = knob_of(None, axis.name, models).why
    # Every numeric or boolean coordinate is unitless ("1"; CF 3.1 wants units on
    # a coordinate variable, and a boolean knob's values are 0 and 1).
    attrs = {"long_name": why or axis.name.replace("_", " "), "units": "1"}
    return np.array(axis.values, dtype=dtype), attrs


def _accelerator_dims(spec: Spec) -> tuple:
    if "dp_size" in spec.dims or "dp_size" in spec.fixed:
        return tuple(d for d in spec.dims if d in _SPLIT_DIMS or d == "physics")
    return ("fleet",) if "fleet" in spec.dims else ()


def _long_name(name: str, models) -> str:
    """The output's description by the spec's models: each model's own (the megatron model
    describes its terms otherwise: exposed collectives, against the GEMM precision's peak),
    one for all where they agree, each named where they differ."""
    own = {}
    for model in models:
        entry = solver.physics.model(model).OUTPUTS.get(name)
        if entry is not None:
            own[model] = entry.long_name if hasattr(entry, "long_name") else entry[1]
    if not own:
        return REGISTRY[name].long_name
    if len(set(own.values())) == 1:
        return next(iter(own.values()))
    return "; ".join(f"{model}: {text}" for model, text in own.items())


def layout(spec: Spec) -> CubeLayout:
    """The dims, coordinates, variables and attributes of ``spec``'s cube."""
    dims, shape = spec.dims, spec.shape
    coords = {axis.name: _coordinate(axis, spec.physics) for axis in spec.axes}
    float_dtype = np.dtype(spec.dtype)
    variables = {}
    for name in spec.outputs:
        if name in dims:  # the dp_size output when dp_size is an axis: the coordinate says it
            continue
        output = REGISTRY[name]
        dtype = np.dtype(bool) if output.is_boolean else float_dtype
        variables[name] = Variable(dims, dtype, {"units": output.units,
                                                 "long_name": _long_name(name, spec.physics)})
    for name, long_name in MASKS.items():
        variables[name] = Variable(dims, np.dtype(bool), {"long_name": long_name})
    variables["n_accelerators"] = Variable(
        _accelerator_dims(spec), np.dtype(np.int64),
        {"units": "1", "long_name": "accelerators the layout runs on"})
    return CubeLayout(dims=dims, shape=shape, coords=coords, variables=variables,
                      attrs=_attrs(spec))


def _split_mesh(spec: Spec, dims: tuple, names: tuple = _SPLIT_DIMS) -> dict:
    """Open mesh over ``dims`` of the split knobs ``names`` (axis values, else fixed or 1).

    With ``physics`` among ``dims``, ``mesh["physics"]`` holds the model names.
    """
    mesh = {}
    if "physics" in dims:
        shape = [1] * len(dims)
        shape[dims.index("physics")] = len(spec.physics)
        mesh["physics"] = np.array(spec.physics).reshape(shape)
    for name in names:
        if name in dims:
            values = np.asarray(spec.axis(name).values, dtype=np.int64)
            shape = [1] * len(dims)
            shape[dims.index(name)] = len(values)
            mesh[name] = values.reshape(shape)
        elif name in spec.fixed:
            mesh[name] = np.int64(spec.fixed[name])
    return mesh


def accelerator_counts(spec: Spec) -> np.ndarray:
    """``n_accelerators`` over its own dims (see :func:`layout`) [1]."""
    dims = _accelerator_dims(spec)
    if "dp_size" in spec.dims or "dp_size" in spec.fixed:
        mesh = _split_mesh(spec, dims)
        mesh.setdefault("physics", spec.physics[0])
        count = n_accelerators({"dp_size": mesh.get("dp_size", np.int64(1))}, mesh)
        return np.broadcast_to(count, tuple(len(spec.axis(d)) for d in dims)).astype(np.int64)
    if dims:
        return np.array([spec.fleets[label].total_accelerators for label in spec.axis("fleet").values],
                        dtype=np.int64)
    return np.array(next(iter(spec.fleets.values())).total_accelerators, dtype=np.int64)


def accelerators_ok(spec: Spec) -> Optional[np.ndarray]:
    """Where ``n_accelerators`` is within :meth:`Spec.accelerator_range`, or None (no bound).

    Broadcastable to the cube (length 1 on the dims it does not span; it spans
    ``n_accelerators``'s dims, and ``fleet`` when the fleets' bounds differ).
    """
    bounds = {label: spec.accelerator_range(f) for label, f in spec.fleets.items()}
    if all(b == (None, None) for b in bounds.values()):
        return None
    dims = _accelerator_dims(spec)
    counts = accelerator_counts(spec)
    shape = [len(spec.axis(d)) if d in dims else 1 for d in spec.dims]
    counts = counts.reshape(shape)
    if len(set(bounds.values())) > 1 and "fleet" in spec.dims:
        low, high = (np.array([b[i] or 0 for b in (bounds[f] for f in spec.axis("fleet").values)],
                              dtype=np.float64) for i in (0, 1))
        high[[bounds[f][1] is None for f in spec.axis("fleet").values]] = np.inf
        fleet_shape = [len(spec.axis("fleet")) if d == "fleet" else 1 for d in spec.dims]
        low, high = low.reshape(fleet_shape), high.reshape(fleet_shape)
    else:
        low, high = next(iter(bounds.values()))
        low, high = (0 if low is None else low), (np.inf if high is None else high)
    return (counts >= low) & (counts <= high)


def check_some_valid(spec: Spec) -> None:
    """Raise :class:`SpecError` if no point of the space is a valid split.

    Validity depends only on the ``tp_size``, ``pp_size``, ``ep_size``,
    ``cp_size``, ``dp_size`` and ``etp_size`` values and the fleet, so this prices that
    small mesh alone, with each of the spec's physics models.
    """
    dims = tuple(d for d in spec.dims if d in _VALIDITY_DIMS)
    mesh = _split_mesh(spec, dims, _VALIDITY_DIMS)
    for label, fleet in spec.fleets.items():
        workload = next(iter(spec.workloads.values()))
        constants = physics_.calibrated(spec)
        for model in spec.physics:
            if solver.solve(workload, fleet, physics=model, warn=False,
                            **physics_.knobs_for(model, mesh),
                            **constants.get(model, {}))["valid"].any():
                return
    names = [n for n in _SPLIT_DIMS if n in mesh or n not in ("dp_size", "cp_size")]
    product = np.prod(np.broadcast_arrays(*[mesh.get(n, np.int64(1)) for n in names]), axis=0)
    products = sorted({int(p) for p in np.ravel(product)})
    shown = ", ".join(map(str, products[:12])) + (", ..." if len(products) > 12 else "")
    label = " * ".join(names)
    if "dp_size" in mesh:
        need = (f"{label} to be whole nodes of "
                + ", ".join(f"{f.node.accelerators_per_node} ({k})" for k, f in spec.fleets.items()))
    else:
        need = (f"{label} to divide the fleet's accelerators: "
                + ", ".join(f"{f.total_accelerators} ({k})" for k, f in spec.fleets.items()))
    if "etp_size" in mesh:
        need += " (and etp_size * ep_size to divide tp_size * cp_size * dp_size)"
    raise SpecError(f"{spec.source}: no point of the space is a valid split: expected {need}, "
                    f"but the axes give {label} in {{{shown}}}")


def allocate(cube_layout: CubeLayout) -> dict:
    """Uninitialized numpy arrays for every variable the blocks price (:meth:`CubeLayout.priced`)."""
    return {name: np.empty(cube_layout.shape, dtype=cube_layout.variables[name].dtype)
            for name in cube_layout.priced()}


def to_dataset(cube_layout: CubeLayout, arrays: Mapping) -> xr.Dataset:
    """The cube as an :class:`xarray.Dataset`, from arrays named like the layout's variables.

    Boolean data variables get CF's flag attributes (:func:`flag_attrs`).
    """
    def attrs_of(dtype, attrs):
        return {**attrs, **flag_attrs()} if dtype == bool else dict(attrs)

    coords = {dim: xr.Variable((dim,), values, dict(attrs))
              for dim, (values, attrs) in cube_layout.coords.items()}
    data_vars = {name: xr.Variable(var.dims, arrays[name], attrs_of(var.dtype, var.attrs))
                 for name, var in cube_layout.variables.items()}
    return xr.Dataset(data_vars, coords=coords, attrs=dict(cube_layout.attrs))
