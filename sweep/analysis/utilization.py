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

__all__ = ["PER_PRECISION_PEAK", "UtilizationWarning", "warn_across_precisions"]

class UtilizationWarning(UserWarning):
    """A utilization objective ranks layouts of different precisions (filter it by class)."""


#: Objectives measured against the dense peak of each layout's own precision.
PER_PRECISION_PEAK = ("mfu", "hfu", "node_mfu", "node_hfu")


def warn_across_precisions(objectives, precisions, *, stacklevel: int = 3) -> bool:
    """Warn (:class:`UtilizationWarning`) when a utilization objective would rank precisions of different
    widths; returns whether it warned. ``precisions``: the values in play (None: one)."""
    names = [name for name in objectives if name in PER_PRECISION_PEAK]
    if not names or precisions is None:
        return False
    values = [str(v) for v in precisions]
    widths = {solver.knobs.PRECISION_BYTES.get(v.lower(), v.lower()) for v in values}
    if len(widths) < 2:
        return False
    warnings.warn(f"objective {names[0]!r} is measured against each precision's own peak, so "
                  f"across the precisions {', '.join(values)} it does not rank speed: a faster "
                  f"FP8 layout can have the lower {names[0]}. To rank by speed, make the "
                  f"objective effective_throughput (or step_latency_total), or fix the "
                  f"precision", UtilizationWarning, stacklevel=stacklevel)
    return True
