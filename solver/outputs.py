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
    """

    name: str
    units: str
    long_name: str
    dtype: str = "float64"
    better: Optional[str] = None
    derived: bool = False

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


def _o(name, units, long_name, better=None, dtype="float64", derived=False):
    return Output(name, units, long_name, dtype, better, derived)


_MAX, _MIN = MAXIMIZE, MINIMIZE

#: Outputs of ``solver.solve(physics="mlsysim")``, in the order it returns them.
#: ``node_*`` are the reference's ``node_profile`` fields: they describe one
#: replica (the TP*PP*EP accelerators that hold one copy of the model), not a server.
OUTPUTS: Mapping[str, Output] = MappingProxyType({o.name: o for o in (
    _o("valid", "1", "split is possible: TP*PP*EP divides the fleet", dtype="bool"),
    _o("dp_size", "1", "data-parallel degree"),
    _o("idle_ranks", "1", "global batch smaller than DP: ranks run one sample", dtype="bool"),
    _o("realizable", "1", "a framework can run it: whole microbatches, no idle ranks",
       dtype="bool"),
    _o("step_latency_total", "s", "training step time", _MIN),
    _o("scaling_efficiency", "1", "replica step time over total step time", _MAX),
    _o("effective_throughput", "s-1", "fleet throughput in samples per second", _MAX),
    _o("mfu", "1", "fleet model FLOPs utilization", _MAX),
    _o("dp_communication_latency", "s", "exposed data-parallel gradient all-reduce", _MIN),
    _o("tp_communication_latency", "s", "tensor-parallel activation all-reduces", _MIN),
    _o("ep_communication_latency", "s", "expert-parallel all-to-all", _MIN),
    _o("communication_latency", "s", "all communication before overlap", _MIN),
    _o("pipeline_bubble_latency", "s", "pipeline fill and drain", _MIN),
    _o("bubble_fraction", "1", "idle share of a pipelined step", _MIN),
    _o("node_latency", "s", "replica step time", _MIN),
    _o("node_latency_compute", "s", "replica compute time", _MIN),
    _o("node_latency_memory", "s", "replica memory-traffic time", _MIN),
    _o("node_latency_overhead", "s", "dispatch and framework layer taxes", _MIN),
    _o("node_throughput", "s-1", "replica throughput in samples per second", _MAX),
    _o("node_mfu", "1", "replica model FLOPs utilization", _MAX),
    _o("node_hfu", "1", "replica hardware FLOPs utilization", _MAX),
    _o("node_energy", "J", "replica energy per step", _MIN),
    _o("memory_footprint", BYTE, "training memory per accelerator", _MIN),
    _o("memory_weights", BYTE, "weights per accelerator", _MIN),
    _o("memory_gradients", BYTE, "gradients per accelerator", _MIN),
    _o("memory_optimizer_state", BYTE, "optimizer state per accelerator", _MIN),
    _o("memory_activations", BYTE, "stored activations per accelerator", _MIN),
    _o("memory_communication_buffers", BYTE,
       "gradient bucket and pipeline buffers per accelerator", _MIN),
    _o("feasible", "1", "training state fits the accelerator's memory", dtype="bool"),
)})

#: Quantities derived from the outputs and knobs (see the functions below).
DERIVED: Mapping[str, Output] = MappingProxyType({o.name: o for o in (
    _o("n_accelerators", "1", "accelerators in the cluster: tp*pp*ep*dp", _MIN, derived=True),
    _o("memory_headroom", BYTE, "memory limit minus the footprint per accelerator", _MAX,
       derived=True),
    _o("exposed_dp_time", "s", "data-parallel time overlap does not hide", _MIN, derived=True),
)})


def _entry(name: str) -> Output:
    entry = OUTPUTS.get(name) or DERIVED.get(name)
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
    return tuple(n for n, o in {**OUTPUTS, **DERIVED}.items() if o.better is not None)


def n_accelerators(out: Mapping, knobs: Mapping):
    """Accelerators of the cluster: ``dp_size * tp_size * pp_size * ep_size`` [1]."""
    replica = (np.asarray(knobs.get("tp_size", 1)) * np.asarray(knobs.get("pp_size", 1))
               * np.asarray(knobs.get("ep_size", 1)))
    return np.asarray(out["dp_size"]) * replica


def memory_headroom(out: Mapping, memory_limit):
    """Memory limit minus the footprint per accelerator [B]."""
    return memory_limit - np.asarray(out["memory_footprint"])


def exposed_dp_time(out: Mapping, straggler_factor=1.0):
    """Data-parallel time overlap does not hide [s].

    The step is ``straggler * (replica + exposed DP + TP + EP + bubble)`` (the
    straggler factor applies when > 1), so the exposed DP time is what remains
    of the step once the other terms are taken out.
    """
    scale = np.maximum(np.asarray(straggler_factor, float), 1.0)
    return (np.asarray(out["step_latency_total"]) / scale - np.asarray(out["node_latency"])
            - np.asarray(out["tp_communication_latency"])
            - np.asarray(out["ep_communication_latency"])
            - np.asarray(out["pipeline_bubble_latency"]))
