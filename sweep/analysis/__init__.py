"""Questions to a cube: the best layouts, the best per value of a dim, the Pareto front, why #1 wins.

Every ranking works on the points a mask selects: by default ``admissible``
(valid, feasible, within the memory limit and ``max_accelerators``; see
:mod:`sweep.cube`), or the boolean variable or DataArray given as ``where``,
further narrowed by ``constraints``:

``memory_limit``
    ``"72 GB"``, bytes, or a fraction of the accelerator's memory (<= 1), on
    ``memory_footprint`` (read by :func:`sweep.limits.parse_memory_limit`).
``max_accelerators``
    On ``n_accelerators``.
``<variable>``
    ``(low, high)`` bounds on any data variable (``None`` for an open side),
    e.g. ``{"step_latency_total": (None, 2.0)}``.

The ranked variable is the ``objective``; its ``direction`` (``"maximize"``
or ``"minimize"``) defaults to the output registry's (:mod:`solver.outputs`).
The cube is scanned in blocks of ``block_points`` along its first dim, so a
cube opened lazily from disk (:func:`sweep.open_cube`) is never loaded whole.
Results are small :class:`xarray.Dataset` s: the point's coordinates as
variables (named like the dims, i.e. like the ``solver.solve`` keywords) and
every data variable's value.

A cube that says it is not finished (``complete = 0``: an interrupted sweep
opened with ``sweep.open_cube(..., allow_partial=True)``, whose unpriced points
are NaN and never admissible) is refused unless ``allow_partial=True``: an
answer from part of the space is then asked for, not stumbled upon.

A DataArray ``where`` is read by its coordinates (:func:`aligned`), never by
position. :func:`top_k` collapses layouts equal in every output into one row
(``equivalent`` lists the knobs' other values). An answer with no selected
point carries ``attrs["why_empty"]``: how many points each condition removed
and which to relax (:func:`admissible_counts`, :func:`explain_empty`, reused by
the search; :class:`NoAdmissibleError` carries the counts where an empty
answer cannot be given, as in a plot).

Modules: :mod:`~sweep.analysis.masks` (which points count),
:mod:`~sweep.analysis.ranking` (top-k, best per slice, Pareto front),
:mod:`~sweep.analysis.ties` (equal outputs as one row),
:mod:`~sweep.analysis.empty` (why an answer is empty),
:mod:`~sweep.analysis.scenarios` (scenario axes against layout knobs),
:mod:`~sweep.analysis.explain` (step-time components, why #1 wins).
"""

from __future__ import annotations

import warnings

from .empty import NoAdmissibleError, admissible_counts, explain_empty
from .explain import explain_runner_up, step_components, where_step_goes
from .masks import aligned, mask
from .ranking import BLOCK_POINTS, DEFAULT_OBJECTIVES, best_along, pareto_front, top_k
from .scenarios import SCENARIO_DIMS, JobMixWarning, layout_dims, scenario_dims
from .utilization import ModelMixWarning, UtilizationWarning

__all__ = ["top_k", "best_along", "pareto_front", "mask", "aligned", "explain_runner_up",
           "where_step_goes",
           "step_components", "BLOCK_POINTS", "DEFAULT_OBJECTIVES", "NoAdmissibleError",
           "admissible_counts", "explain_empty", "SCENARIO_DIMS", "scenario_dims",
           "layout_dims", "UtilizationWarning", "ModelMixWarning", "JobMixWarning"]


def __getattr__(name):
    if name == "SLAB_POINTS":  # deprecated: one default for every block of points
        warnings.warn("sweep.analysis.SLAB_POINTS is deprecated; use "
                      "solver.blocks.BLOCK_POINTS", DeprecationWarning, stacklevel=2)
        return BLOCK_POINTS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
