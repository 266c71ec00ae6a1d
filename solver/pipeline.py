"""Pipeline-parallel bubble.

References
----------
[1] Narayanan, D. et al. (2019), "PipeDream: generalized pipeline parallelism
    for DNN training", SOSP.
[2] Narayanan, D. et al. (2021), "Efficient large-scale language model
    training on GPU clusters using Megatron-LM", SC (interleaved 1F1B).
"""

from __future__ import annotations

import numpy as np

__all__ = ["bubble_fraction", "bubble_time"]


def bubble_fraction(pp_size, microbatch_count, v_stages=1):
    """Idle share of a pipelined step.

    Parameters
    ----------
    pp_size : array_like of int [1]
        Physical pipeline stages (p).
    microbatch_count : array_like of int [1]
        Microbatches per step (m).
    v_stages : array_like of int [1]
        Virtual stages per device (v, interleaved schedule).

    Returns
    -------
    numpy.ndarray [1]
        0 when ``pp_size`` is 1.
    """
    p = np.asarray(pp_size)
    # Eq. (1) of [2] with v*m slots: (p-1) / (v*m + p - 1)
    return (p - 1) / (np.asarray(v_stages) * 1.0 * microbatch_count + p - 1)


def bubble_time(busy_time, fraction):
    """Idle time added to a step whose busy time is ``busy_time``.

    Parameters
    ----------
    busy_time : array_like [s]
    fraction : array_like [1]
        :func:`bubble_fraction` of the step.

    Returns
    -------
    numpy.ndarray [s]
        ``busy * b / (1 - b)``, which is ``busy * (p-1) / (v*m)``; exactly 0 without a
        pipeline (b is 0 there).
    """
    return busy_time * fraction / (1 - fraction)
