"""Time of GEMMs and of memory-bound kernels on one accelerator.

A GEMM of ``F`` FLOPs runs at ``peak * plateau * curve(F / peak)``: large GEMMs
reach a plateau share of the dense peak, small ones fall off (tile
quantization, wave quantization, launch latency). The fall-off is a table on
the GEMM's *ideal duration* ``F / peak`` (so a faster accelerator needs larger
GEMMs to saturate), interpolated in log space. Memory-bound kernels (norms,
activations, dropout, softmax, the optimizer) move bytes at HBM bandwidth.

References
----------
[1] Calculon (Isaev, M. et al. (2023), "Calculon: a methodology and tool for
    high-level co-design of systems and large language models", SC23),
    ``systems/a100_80g.json``: matrix efficiency by GEMM size (>= 128 GFLOP:
    0.95, >= 16: 0.9, >= 1: 0.6, smaller: 0.1) at 312 TFLOP/s; memory
    efficiency by transfer size (>= 100 MB: 0.9, >= 10 MB: 0.75, >= 1 MB: 0.6).
[2] NVIDIA, "Matrix multiplication background user's guide" (Deep Learning
    Performance documentation): tile and wave quantization of small GEMMs;
    arithmetic intensity grows with every dimension, so a GEMM with a short
    reduction dimension K is less efficient than one of the same FLOPs with a
    long one.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "GEMM_CURVE_SECONDS",
    "GEMM_CURVE_EFFICIENCY",
    "MEMORY_EFFICIENCY",
    "gemm_size_efficiency",
    "gemm_tile_time",
    "gemm_time",
    "memory_bound_time",
]

#: Knots of the GEMM size curve: ideal durations [s] = Calculon's A100 GFLOP
#: thresholds [1] over its 312 TFLOP/s (1, 16, 128 GFLOP), with a floor knot at 5 MFLOP.
#: The floor knot is placed so that time never falls as work grows: between two knots
#: the efficiency is ``a + b log(x)``, and the time ``x / eff`` rises with ``x`` only
#: where ``eff >= b``. With the floor at 10 MFLOP the first segment's slope (0.114) was
#: above the floor's efficiency (0.105): a GEMM just above it took up to 0.3 % longer
#: than a slightly larger one, and a higher peak made it slower (an audit, 2026-12-05).
#: At 5 MFLOP the slope is 0.0995 (tests/test_megatron_solve.py checks the time falls
#: with the peak).
GEMM_CURVE_SECONDS = np.array([0.005e9, 1e9, 16e9, 128e9]) / 312e12
#: Relative efficiency at those knots [1], normalized to the 128-GFLOP plateau (0.95).
GEMM_CURVE_EFFICIENCY = np.array([0.1, 0.6, 0.9, 0.95]) / 0.95
#: Share of HBM bandwidth achieved by large streaming kernels [1] (>= 100 MB: 0.9).
MEMORY_EFFICIENCY = 0.9

_LOG_KNOTS = np.log(GEMM_CURVE_SECONDS)


def gemm_size_efficiency(flops, peak_flops, *, size_shift=1.0):
    """Relative efficiency of a GEMM of ``flops`` FLOPs on a ``peak_flops`` device [1].

    Parameters
    ----------
    flops : array_like [FLOP]
        Work of one GEMM call.
    peak_flops : array_like [FLOP/s]
        Dense peak at the GEMM's precision.
    size_shift : array_like [1]
        Multiplies the knots' durations (a fitted constant: > 1 means GEMMs
        must be larger than Calculon says to saturate).

    Returns
    -------
    numpy.ndarray [1]
        In (0, 1]; 1 on the plateau. Interpolated linearly in log duration,
        constant beyond the end knots.
    """
    ideal = np.maximum(np.asarray(flops, dtype=np.float64) / peak_flops, 1e-30)
    x = np.log(ideal) - np.log(size_shift)
    return np.interp(x, _LOG_KNOTS, GEMM_CURVE_EFFICIENCY)


def gemm_tile_time(flops, k_dim, tile_cost):
    """Fixed cost of a GEMM's output tiles [s] [2].

    Each output tile streams ``K`` columns of A and rows of B through the tensor
    cores, then pays a fixed cost (pipeline fill, epilogue, writing the tile). A GEMM
    of ``F`` FLOPs has ``F / (2 K)`` output elements, so its tiles' fixed costs add up
    to ``F / K`` times a cost per output element pair, ``tile_cost``. It is a time paid
    beside the main loop: the size curve's fall-off does not stretch it, and a faster
    main loop (a higher peak, FP8) does not lengthen it. (Before 2026-12-05 it was an
    efficiency ``K / (K + K0)`` multiplying the size curve's, which counted it again
    in the curve's fall-off: a small GEMM of short ``K``, an MoE expert's, took longer
    at a higher peak, and FP8 priced slower than BF16.)

    Parameters
    ----------
    flops : array_like [FLOP]
        Work of one call.
    k_dim : array_like [1]
        Reduction dimension of the GEMM on this rank.
    tile_cost : array_like [s column / FLOP]
        The fixed cost per tile in columns of ``K``, over the rate a column streams at:
        ``K0 / rate`` (0 = none).

    Returns
    -------
    numpy.ndarray [s]
    """
    return flops / np.asarray(k_dim, dtype=np.float64) * tile_cost


def gemm_time(flops, peak_flops, *, plateau, size_shift=1.0, calls=1.0, k_dim=None, tile_cost=0.0):
    """Time of ``calls`` GEMMs of ``flops`` FLOPs each [s]: the main loop on the
    efficiency curve plus, where ``k_dim`` is given, the tiles' fixed cost.

    Parameters
    ----------
    flops : array_like [FLOP]
        Work of one call.
    peak_flops : array_like [FLOP/s]
    plateau : array_like [1]
        Achieved share of peak on large GEMMs (the accelerator's
        ``gemm_efficiency`` times the fitted scale).
    size_shift : array_like [1]
        See :func:`gemm_size_efficiency`.
    calls : array_like [1]
    k_dim, tile_cost : array_like, optional
        Reduction dimension and fixed cost per tile, see :func:`gemm_tile_time`
        (no tile term when ``k_dim`` is None).

    Returns
    -------
    numpy.ndarray [s]
    """
    eff = plateau * gemm_size_efficiency(flops, peak_flops, size_shift=size_shift)
    main = calls * flops / (peak_flops * eff)
    if k_dim is None:
        return main
    return main + calls * gemm_tile_time(flops, k_dim, tile_cost)


def memory_bound_time(bytes_moved, memory_bandwidth, *, efficiency=MEMORY_EFFICIENCY):
    """Time of kernels that stream ``bytes_moved`` bytes through HBM [s].

    Parameters
    ----------
    bytes_moved : array_like [B]
        Bytes read plus written.
    memory_bandwidth : array_like [B/s]
    efficiency : array_like [1]
        Share of the bandwidth achieved [1].
    """
    return np.asarray(bytes_moved) / (memory_bandwidth * efficiency)
