"""Scenario axes and layout axes: what the job is, and how it is laid out.

Axes that describe the job (:data:`SCENARIO_DIMS`: the physics model, the workload,
the fleet, the sequence length, the global batch, the precision) are not choices a ranking
should make: "the best layout" of a sweep over ``seq_len`` is the best layout
*for each* sequence length. Every other axis is a layout knob, and is ranked.
The main job answers per scenario value (:func:`sweep.analysis.best_along`
over these dims) and ranks the layout knobs within each.
"""

from __future__ import annotations

__all__ = ["SCENARIO_DIMS", "scenario_dims", "layout_dims"]

#: Dims that describe the job rather than its layout, in the order they are shown.
SCENARIO_DIMS = ("physics", "workload", "fleet", "seq_len", "batch_size", "precision")


def scenario_dims(cube) -> tuple:
    """The cube's dims among :data:`SCENARIO_DIMS` (in that order)."""
    return tuple(d for d in SCENARIO_DIMS if d in cube.dims)


def layout_dims(cube) -> tuple:
    """The cube's other dims: the layout knobs a ranking chooses between."""
    return tuple(d for d in cube.dims if d not in SCENARIO_DIMS)
