"""Utilization objectives across precisions: MFU and HFU do not rank speed there.

Both physics models divide model (or hardware) FLOP/s by the dense peak of the
layout's own precision, FP8's about twice BF16's. Along a precision axis of mixed
widths the higher MFU need not be the faster layout: an FP8 layout 1.35x faster
than its BF16 twin scored 0.29 against 0.43 (megatron physics, Llama 3 70B on H100,
TP 8, PP 4, DP 8). Ranking or searching a utilization objective there still does
what was asked; :func:`warn_across_precisions` says so and names what ranks speed.
"""

from __future__ import annotations

import warnings

import solver.knobs

__all__ = ["PER_PRECISION_PEAK", "UtilizationWarning", "warn_across_precisions",
           "ModelMixWarning", "warn_across_models"]

class UtilizationWarning(UserWarning):
    """A utilization objective ranks layouts of different precisions (filter it by class)."""


#: Objectives measured against the dense peak of each layout's own precision.
PER_PRECISION_PEAK = ("mfu", "hfu", "node_mfu", "node_hfu")


#: Bytes an element by precision name: mlsysim's, and the megatron model's FP4.
_WIDTHS = {**solver.knobs.PRECISION_BYTES, "fp4": 0.5}


def warn_across_precisions(objectives, precisions, *, stacklevel: int = 3) -> bool:
    """Warn (:class:`UtilizationWarning`) when a utilization objective would rank precisions of different
    widths; returns whether it warned. ``precisions``: the values in play (None: one)."""
    names = [name for name in objectives if name in PER_PRECISION_PEAK]
    if not names or precisions is None:
        return False
    values = [str(v) for v in precisions]
    widths = {_WIDTHS.get(v.lower(), v.lower()) for v in values}
    if len(widths) < 2:
        return False
    # the narrowest precision in play, the one whose higher peak can hide a faster layout
    narrow = min(values, key=lambda v: _WIDTHS.get(v.lower(), 2.0))
    warnings.warn(f"objective {names[0]!r} is measured against each precision's own peak, so "
                  f"across the precisions {', '.join(values)} it does not rank speed: a faster "
                  f"{narrow.upper()} layout can have the lower {names[0]}. To rank by speed, make the "
                  f"objective effective_throughput (or step_latency_total), or fix the "
                  f"precision", UtilizationWarning, stacklevel=stacklevel)
    return True


class ModelMixWarning(UserWarning):
    """A ranking or search spans both physics models (filter it by class)."""


def warn_across_models(models, *, stacklevel: int = 3) -> bool:
    """Warn (:class:`ModelMixWarning`) when a ranking spans more than one physics model
    (a ``physics`` axis of several values); returns whether it warned. Each point's
    outputs are one model's prediction, so such a ranking puts the models' predictions
    of the same layout side by side: the best point is whichever model is the more
    optimistic about it, not the best layout."""
    if models is None:
        return False
    values = sorted({str(v) for v in models})
    if len(values) < 2:
        return False
    warnings.warn(f"the ranking spans the physics models {', '.join(values)}: each point is one "
                  f"model's prediction of its layout, so it ranks the models' optimism, not the "
                  f"layouts; rank one model's points (cube.sel(physics={values[0]!r}), a where= "
                  f"mask of one model's; on the command line top --select physics={values[0]}, "
                  f"run and search --physics {values[0]})",
                  ModelMixWarning, stacklevel=stacklevel)
    return True
