"""The one vocabulary of outputs: name, units, long name, dtype and the direction of better.

Every room reads this registry: the solver (which outputs it returns), the cube
(``units`` and ``long_name`` attributes, dtypes), search and analysis (which way
is better, what may be an objective), plots and the command line (labels).
Quantities derived from the outputs and the knobs (the accelerator count, the
memory headroom under a limit, the exposed data-parallel time) are defined here
once, as functions.

    >>> from solver.outputs import OUTPUTS, better
    >>> OUTPUTS["mfu"].units, better("mfu"), better("step_latency_total")
    ('1', 'maximize', 'minimize')

Units are CF strings that UDUNITS-2 parses (the netCDF files are checked
with ``cf_units``): ``"s"``, ``"byte"``, ``"J"``, ``"s-1"``, ``"1"`` for
ratios, counts and masks. Read bytes with :func:`is_bytes` (older cubes
say ``"B"``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Optional

import numpy as np

__all__ = [
    "Output",
    "OUTPUTS",
    "REGISTRY",
    "MEGATRON_ONLY",
    "outputs_of",
    "DERIVED",
    "MAXIMIZE",
    "MINIMIZE",
    "better",
    "is_boolean",
    "objective_names",
    "n_accelerators",
    "memory_headroom",
    "exposed_dp_time",
    "BYTE",
    "is_bytes",
]

#: The UDUNITS-2 name of the byte (UDUNITS-2 does not know ``"B"``).
BYTE = "byte"
_BYTE_SPELLINGS = frozenset({BYTE, "bytes", "B"})


def is_bytes(units) -> bool:
    """Whether a ``units`` attribute says bytes (``"byte"``; ``"B"`` in older cubes)."""
    return units in _BYTE_SPELLINGS


#: optuna's words for the direction of an objective.
MAXIMIZE, MINIMIZE = "maximize", "minimize"


@dataclass(frozen=True)
class Output:
    """One output of ``solver.solve`` (or a quantity derived from them).

    Parameters
    ----------
    name : str
    units : str
        CF units (``"1"`` for ratios and counts).
    long_name : str
    dtype : {"float64", "bool"}
    better : {"maximize", "minimize"} or None
        What a layout engineer wants of it; ``None`` for masks and for
        quantities with no direction of better (the data-parallel degree).
    derived : bool
        Computed from outputs and knobs (not returned by ``solve``).
    physics : tuple of str
        The physics models (:data:`solver.physics.PHYSICS`) that return it;
        every model for a derived quantity.
    """

    name: str
    units: str
    long_name: str
    dtype: str = "float64"
    better: Optional[str] = None
    derived: bool = False
    physics: tuple = ("mlsysim",)

    @property
    def is_boolean(self) -> bool:
        return self.dtype == "bool"

    def __getitem__(self, index):
        """Deprecated: ``OUTPUTS[name][0]`` / ``[1]`` (and ``units, long_name = OUTPUTS[name]``).

        ``solver.OUTPUTS`` used to map a name to a ``(units, long_name)`` tuple;
        read ``.units`` and ``.long_name`` instead. Index 0 and 1 still work,
        with a ``DeprecationWarning``; any other index raises ``IndexError``
        (so tuple unpacking into two names keeps working).
        """
        if index not in (0, 1):
            raise IndexError(f"Output index out of range (0 or 1), got {index!r}")
        warnings.warn("indexing an Output (OUTPUTS[name][0] / [1]) is deprecated: use "
                      "OUTPUTS[name].units / .long_name", DeprecationWarning, stacklevel=2)
        return self.units if index == 0 else self.long_name


_BOTH = ("mlsysim", "megatron")


def _o(name, units, long_name, better=None, dtype="float64", derived=False, physics=_BOTH):
    return Output(name, units, long_name, dtype, better, derived, tuple(physics))


_MAX, _MIN = MAXIMIZE, MINIMIZE
_ML, _MG = ("mlsysim",), ("megatron",)

#: Outputs of ``solver.solve(physics="mlsysim")``, in the order it returns them
#: (each entry's ``physics`` says which models return it: the megatron model
#: returns the ones it shares under the same name and meaning).
#: ``node_*`` are the reference's ``node_profile`` fields: they describe one
#: replica (the TP*PP*EP accelerators that hold one copy of the model), not a server.
OUTPUTS: Mapping[str, Output] = MappingProxyType({o.name: o for o in (
    _o("valid", "1", "split is possible: TP*PP*EP (megatron: TP*PP*CP) divides the fleet",
       dtype="bool"),
    _o("dp_size", "1", "data-parallel degree"),
    _o("idle_ranks", "1", "global batch smaller than DP: ranks run one sample", dtype="bool",
       physics=_ML),
    _o("realizable", "1", "a framework can run it: whole microbatches, even splits, no idle "
                          "ranks", dtype="bool"),
    _o("step_latency_total", "s", "training step time", _MIN),
    _o("scaling_efficiency", "1", "replica step time over total step time", _MAX, physics=_ML),
    _o("effective_throughput", "s-1", "fleet throughput in samples per second", _MAX),
    _o("mfu", "1", "fleet model FLOPs utilization", _MAX),
    _o("dp_communication_latency", "s", "exposed data-parallel gradient all-reduce", _MIN),
    _o("tp_communication_latency", "s", "tensor-parallel activation all-reduces", _MIN),
    _o("ep_communication_latency", "s", "expert-parallel all-to-all", _MIN),
    _o("communication_latency", "s", "all communication before overlap", _MIN),
    _o("pipeline_bubble_latency", "s", "pipeline fill and drain", _MIN),
    _o("bubble_fraction", "1", "idle share of a pipelined step", _MIN),
    _o("node_latency", "s", "replica step time", _MIN, physics=_ML),
    _o("node_latency_compute", "s", "replica compute time", _MIN, physics=_ML),
    _o("node_latency_memory", "s", "replica memory-traffic time", _MIN, physics=_ML),
    _o("node_latency_overhead", "s", "dispatch and framework layer taxes", _MIN, physics=_ML),
    _o("node_throughput", "s-1", "replica throughput in samples per second", _MAX, physics=_ML),
    _o("node_mfu", "1", "replica model FLOPs utilization", _MAX, physics=_ML),
    _o("node_hfu", "1", "replica hardware FLOPs utilization", _MAX, physics=_ML),
    _o("node_energy", "J", "replica energy per step", _MIN, physics=_ML),
    _o("memory_footprint", BYTE, "training memory per accelerator", _MIN),
    _o("memory_weights", BYTE, "weights per accelerator (megatron: of the pipeline rank memory_footprint prices)", _MIN),
    _o("memory_gradients", BYTE, "gradients per accelerator (megatron: of the pipeline rank memory_footprint prices)", _MIN),
    _o("memory_optimizer_state", BYTE, "optimizer state per accelerator (megatron: of the pipeline rank memory_footprint prices)", _MIN),
    _o("memory_activations", BYTE, "stored activations per accelerator (megatron: of the pipeline rank memory_footprint prices)", _MIN),
    _o("memory_communication_buffers", BYTE,
       "gradient bucket and pipeline buffers per accelerator"
       " (megatron: of the pipeline rank memory_footprint prices)", _MIN),
    _o("feasible", "1", "training state fits the accelerator's memory", dtype="bool"),
)})

#: Outputs only ``solver.solve(physics="megatron")`` returns (new terms of that model).
MEGATRON_ONLY: Mapping[str, Output] = MappingProxyType({o.name: o for o in (
    _o("microbatch_count", "1", "microbatches per step per data-parallel rank", physics=_MG),
    _o("tokens_per_second_per_accelerator", "s-1", "tokens per second per accelerator", _MAX,
       physics=_MG),
    _o("model_flops_per_accelerator", "s-1",
       "model FLOPs per second per accelerator (Megatron-LM's count)", _MAX, physics=_MG),
    _o("hfu", "1", "hardware FLOPs utilization (recomputation included)", _MAX, physics=_MG),
    _o("compute_latency", "s",
       "busy time of the heaviest stage (GEMMs, attention, memory-bound kernels)", _MIN,
       physics=_MG),
    _o("cp_communication_latency", "s",
       "exposed context-parallel exchange (K/V ring, all-gather, all-to-all or both: "
       "cp_comm_type)",
       _MIN, physics=_MG),
    _o("pp_communication_latency", "s", "exposed pipeline point-to-point sends", _MIN,
       physics=_MG),
    _o("optimizer_latency", "s", "optimizer step", _MIN, physics=_MG),
    _o("launch_latency", "s",
       "host kernel-launch time the paced stage's GPU work does not hide", _MIN, physics=_MG),
    _o("offload_latency", "s",
       "host-link copies of offloaded activations the layers' work does not hide", _MIN,
       physics=_MG),
)})

#: Every output of every physics model: name -> :class:`Output` (mlsysim's first).
REGISTRY: Mapping[str, Output] = MappingProxyType({**OUTPUTS, **MEGATRON_ONLY})


def outputs_of(physics: str = "mlsysim") -> Mapping[str, Output]:
    """The outputs ``solver.solve(physics=physics)`` returns, in the order it returns them.

    ``outputs_of("mlsysim")`` is :data:`OUTPUTS`.

    Raises
    ------
    ValueError
        For an unknown physics model (naming the models and the closest).
    """
    from .physics import model  # the models import this registry

    names = model(physics).OUTPUTS
    return MappingProxyType({name: REGISTRY[name] for name in names})


#: Quantities derived from the outputs and knobs (see the functions below).
DERIVED: Mapping[str, Output] = MappingProxyType({o.name: o for o in (
    _o("n_accelerators", "1", "accelerators in the cluster: tp*pp*ep*dp (megatron: tp*pp*cp*dp)",
       _MIN, derived=True),
    _o("memory_headroom", BYTE, "memory limit minus the footprint per accelerator", _MAX,
       derived=True),
    _o("exposed_dp_time", "s", "data-parallel time overlap does not hide", _MIN, derived=True),
)})


def _entry(name: str) -> Output:
    entry = REGISTRY.get(name) or DERIVED.get(name)
    if entry is None:
        raise KeyError(f"unknown output {name!r}")
    return entry


def better(name: str) -> Optional[str]:
    """``"maximize"``, ``"minimize"`` or ``None`` (no direction of better) for ``name``."""
    return _entry(name).better


def is_boolean(name: str) -> bool:
    """Whether output ``name`` is a boolean mask."""
    return _entry(name).is_boolean


def objective_names() -> tuple:
    """Outputs and derived quantities that may be objectives (those with a direction)."""
    return tuple(n for n, o in {**REGISTRY, **DERIVED}.items() if o.better is not None)


def _per_model(physics, rules: Mapping):
    """``rules[physics]()``; for an array of physics names, each model's where it is named."""
    names = np.asarray("mlsysim" if physics is None else physics)
    if names.ndim == 0:
        name = str(names)
        if name not in rules:
            raise ValueError(f"physics must be one of {', '.join(map(repr, rules))}, but got "
                             f"{name!r}")
        return rules[name]()
    result = None
    for name in np.unique(names):
        value = _per_model(str(name), rules)
        result = value if result is None else np.where(names == name, value, result)
    return result


def n_accelerators(out: Mapping, knobs: Mapping, physics=None):
    """Accelerators of the cluster [1], by the rule of the physics model.

    ``"mlsysim"``: ``dp_size * tp_size * pp_size * ep_size``. ``"megatron"``:
    ``dp_size * tp_size * pp_size * cp_size`` (expert parallelism is folded into
    DP x CP in Megatron-Core, so it adds no accelerators).

    Parameters
    ----------
    out : mapping
        Outputs of ``solve`` (``dp_size`` is read).
    knobs : mapping
        The knobs (missing ones are 1); ``knobs["physics"]`` names the model
        when ``physics`` is None (an array of names prices each point by its own).
    physics : str or array_like of str, optional
        The model; ``"mlsysim"`` when neither this nor ``knobs`` names one.
    """
    physics = knobs.get("physics") if physics is None else physics

    def size(name):
        return np.asarray(knobs.get(name, 1))

    dp = np.asarray(out["dp_size"])
    return _per_model(physics, {
        "mlsysim": lambda: dp * size("tp_size") * size("pp_size") * size("ep_size"),
        "megatron": lambda: dp * size("tp_size") * size("pp_size") * size("cp_size"),
    })


def memory_headroom(out: Mapping, memory_limit):
    """Memory limit minus the footprint per accelerator [B]."""
    return memory_limit - np.asarray(out["memory_footprint"])


def exposed_dp_time(out: Mapping, straggler_factor=1.0, physics=None):
    """Data-parallel time overlap does not hide [s].

    ``"mlsysim"``: the step is ``straggler * (replica + exposed DP + TP + EP +
    bubble)`` (the straggler factor applies when > 1), so the exposed DP time is
    what remains of the step once the other terms are taken out. ``"megatron"``
    returns it: ``dp_communication_latency``. ``physics`` may be an array of names.
    """
    return _per_model(physics, {
        "mlsysim": lambda: _mlsysim_exposed_dp(out, straggler_factor),
        "megatron": lambda: np.asarray(out["dp_communication_latency"], float),
    })


def _mlsysim_exposed_dp(out, straggler_factor):
    scale = np.maximum(np.asarray(straggler_factor, float), 1.0)
    return (np.asarray(out["step_latency_total"]) / scale - np.asarray(out["node_latency"])
            - np.asarray(out["tp_communication_latency"])
            - np.asarray(out["ep_communication_latency"])
            - np.asarray(out["pipeline_bubble_latency"]))
