"""Steps every physics model shares: checking the specs and masking the invalid points.

A model prices every point, possible or not (an impossible split is priced as
some possible stand-in, so no branch is needed), and masks the impossible ones
once, at the end, with :func:`mask_invalid`.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from ..specs import Fleet, Workload

__all__ = ["check_specs", "mask_invalid"]


def check_specs(workload, fleet) -> None:
    """Refuse a ``workload`` or ``fleet`` that is not a solver spec.

    Raises
    ------
    TypeError
        Naming the argument, the converters that make a spec and the type that came.
    """
    if not isinstance(workload, Workload):
        raise TypeError(f"workload must be a solver.specs.Workload (see solver.catalog.workload "
                        f"or solver.from_mlsysim), but got {type(workload).__name__}")
    if not isinstance(fleet, Fleet):
        raise TypeError(f"fleet must be a solver.specs.Fleet (see solver.catalog.fleet "
                        f"or solver.from_mlsysim), but got {type(fleet).__name__}")


def mask_invalid(outputs: Mapping, valid, shape: tuple, names: Iterable[str]) -> dict:
    """The outputs ``names``, broadcast to ``shape``, masked where ``valid`` is False.

    Parameters
    ----------
    outputs : mapping of str -> array_like
        The priced outputs (each on the axes its inputs span), without ``valid``.
    valid : array_like of bool
        False where the split is impossible.
    shape : tuple
        The broadcast shape of the knobs.
    names : iterable of str
        Output names in the order to return them; ``"valid"`` is ``valid`` itself.

    Returns
    -------
    dict of str -> numpy.ndarray
        Read-only views of ``shape``: where ``valid`` is False, every float
        output is NaN and every boolean False. When every point is valid the
        outputs are returned as priced (no pass over them).
    """
    valid = np.asarray(valid)
    all_valid = bool(np.all(valid))
    result = {}
    for name in names:
        if name == "valid":
            result[name] = np.broadcast_to(valid, shape)
            continue
        value = np.asarray(outputs[name])
        if not all_valid:
            value = value & valid if value.dtype == bool else np.where(valid, value, np.nan)
        result[name] = np.broadcast_to(value, shape)
    return result
