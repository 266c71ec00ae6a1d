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

    Notes
    -----
    A float output that already spans every axis of ``valid`` and owns its
    memory is masked in place (a fresh full-size array per output costs more
    in page faults than the add itself), so ``outputs`` must hold arrays the
    model computed, never its input arrays; two outputs may share one array
    (adding 0 or NaN twice changes nothing).
    """
    valid = np.asarray(valid)
    # x + 0.0 is x and x + NaN is NaN: one vectorized add per output, about five
    # times cheaper than np.where's masked select on a random mask.
    nan_if_invalid = None if np.all(valid) else np.where(valid, 0.0, np.nan)
    result = {}
    for name in names:
        if name == "valid":
            result[name] = np.broadcast_to(valid, shape)
            continue
        value = np.asarray(outputs[name])
        if nan_if_invalid is None:
            pass
        elif value.dtype == bool:
            value = value & valid
        elif _owned(value) and np.broadcast_shapes(value.shape, nan_if_invalid.shape) == value.shape:
            np.add(value, nan_if_invalid, out=value)  # no new block of memory to fault in
        else:
            value = value + nan_if_invalid
        result[name] = np.broadcast_to(value, shape)
    return result


def _owned(value: np.ndarray) -> bool:
    """Whether ``value`` is a writable array of its own (not a view, not read-only)."""
    return value.base is None and value.flags.writeable and value.ndim > 0
