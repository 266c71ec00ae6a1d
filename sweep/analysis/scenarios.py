"""Scenario axes and layout axes: what the job is, and how it is laid out.

Axes that describe the job (:data:`SCENARIO_DIMS`: the physics model, the workload,
the fleet, the sequence length, the global batch, the precision) are not choices a ranking
should make: "the best layout" of a sweep over ``seq_len`` is the best layout
*for each* sequence length. Every other axis is a layout knob, and is ranked.
The main job answers per scenario value (:func:`sweep.analysis.best_along`
over these dims) and ranks the layout knobs within each.
"""

from __future__ import annotations

import warnings

__all__ = ["SCENARIO_DIMS", "ASSUMPTION_DIMS", "JOB_DIMS", "scenario_dims", "layout_dims",
           "described", "JobMixWarning", "warn_across_jobs"]

#: The mlsysim physics' knobs that state what the model assumes of the hardware and the run
#: (an achieved efficiency, a congestion, a straggler, an imbalance), not a layout choice: a
#: ranking over them takes the most optimistic assumption, so they are answered each on its
#: own, as the job's dims are.
ASSUMPTION_DIMS = ("efficiency", "overlap_efficiency", "congestion_factor", "straggler_factor",
                   "moe_routing_imbalance_factor")

#: Dims that describe the job (or what the model assumes) rather than its layout, in the
#: order they are shown.
SCENARIO_DIMS = ("physics", "workload", "fleet", "seq_len", "batch_size",
                 "precision") + ASSUMPTION_DIMS


def scenario_dims(cube) -> tuple:
    """The cube's dims among :data:`SCENARIO_DIMS` (in that order)."""
    return tuple(d for d in SCENARIO_DIMS if d in cube.dims)


def layout_dims(cube) -> tuple:
    """The cube's other dims: the layout knobs a ranking chooses between."""
    return tuple(d for d in cube.dims if d not in SCENARIO_DIMS)


class JobMixWarning(UserWarning):
    """A search spans more than one job (filter it by class)."""


#: Scenario dims whose mix the other warnings leave unsaid (physics and precision warn on
#: their own, where they mislead: :mod:`sweep.analysis.utilization`).
JOB_DIMS = tuple(d for d in SCENARIO_DIMS if d not in ("physics", "precision"))


def described(dims) -> tuple:
    """``(what dims describe, what a best over them is the best over)``, for the warnings:
    the job and jobs, what the model assumes and assumptions, or both."""
    assumed = sum(d in ASSUMPTION_DIMS for d in dims)
    if not assumed:
        return "the job", "jobs"
    if assumed == len(dims):
        return "what the model assumes", "assumptions"
    return "the job and what the model assumes", "jobs and assumptions"


def warn_across_jobs(axes, *, stacklevel: int = 3) -> bool:
    """Warn (:class:`JobMixWarning`) when a search's ``axes`` (:class:`sweep.axes.Axis`)
    span more than one workload, fleet, sequence length or global batch (or a model
    assumption, :data:`ASSUMPTION_DIMS`); returns whether it warned. Its best point is then
    the best over jobs (the megatron model's MFU rises with the sequence length) or the most
    optimistic assumption, not the best layout of one."""
    spans = [a.name for a in axes if a.name in JOB_DIMS
             and (a.values is None or len(set(map(str, a.values))) > 1)]
    if not spans:
        return False
    they = "it describes" if len(spans) == 1 else "they describe"
    what, over = described(spans)
    warnings.warn(f"the search's axes include {' and '.join(spans)} ({they} {what}, not a "
                  f"choice between layouts): its best is the best over {over}; search one "
                  f"job (each value in the spec's [fixed], one search each), as the main job "
                  f"ranks each on its own", JobMixWarning, stacklevel=stacklevel)
    return True
