"""The reference optimizer's space: mlsysim 0.3.0 ``ParallelismOptimizer.solve`` in our terms.

:func:`reference_optimizer_space` states that optimizer's space as a spec plus
its two rules (a microbatch count tied to DP, a memory pre-screen);
:func:`reproduce_reference_optimizer` prices it exactly and answers in the
reference's shape (``tests/test_search.py`` checks it against mlsysim).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional

import numpy as np

import solver
from solver.specs import Fleet, Workload

from ..spec import Spec, load_spec, powers_of_two
from .result import SearchResult

__all__ = ["ReferenceSpace", "reference_optimizer_space", "reproduce_reference_optimizer",
           "REFERENCE_PRESCREEN_FRACTION", "REFERENCE_ADAM_BYTES", "REFERENCE_MAX_DEGREE"]

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
        from . import search  # the package's function (it imports this module)

        kwargs.setdefault("mode", "exact")
        if "top_k" not in kwargs:
            kwargs.setdefault("k", 5)
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
    else 1; ``overlap_comm`` True by default; realizable not required (the
    reference ranks splits no framework runs); layouts whose weights, gradients
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
        # the reference's own candidates: it ranks splits no framework runs (more stages
        # than layers, TP not dividing the heads), so the parity study keeps them
        "constraints": {"require_realizable": False},
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
        (admissible candidates) and ``result`` (the :class:`SearchResult`).
    """
    space = reference_optimizer_space(workload, fleet, batch_size, **kwargs)
    result = space.search(k=5)
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
            "top_candidates": top, "total_searched": result.n_admissible, "result": result}
