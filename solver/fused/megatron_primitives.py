"""Constants and scalar formula helpers of the fused megatron kernel (plain ``njit``).

Each mirrors a numpy function of :mod:`solver.gemm`, :mod:`solver.network` or
:mod:`solver.physics.megatron_steps`, in the same order of floating-point
operations (see :mod:`solver.fused.megatron_kernel` for how the port stays exact).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .. import gemm as _gemm_module
from .. import knobs as _knobs
from .. import megatron_memory as _mem
from ..physics import megatron_steps as _steps

_MAX_INTEGER = float(_knobs.MAX_INTEGER)  # megatron_steps.split's bound
_REF_PEAK = float(_steps.GEMM_REFERENCE_PEAK)
_MEM_EFF = float(_gemm_module.MEMORY_EFFICIENCY)
_WB = float(_mem.WEIGHT_BYTES)
_MGB = float(_mem.MAIN_GRAD_BYTES)
_ASB = float(_mem.ADAM_STATE_BYTES)
_SOFTMAX = float(_steps.SOFTMAX_BYTES)
_FLASH_BWD = float(_steps.FLASH_BACKWARD_RATIO)
_CE_BYTES = float(_steps.CROSS_ENTROPY_BYTES)
_OPT_BYTES = float(_steps.OPTIMIZER_BYTES_TOUCHED)
_MTP_BYTES = float(_steps.MTP_ELEMENTWISE_BYTES)
_DEEPEP_NVL = float(_steps.DEEPEP_NVL_PEERS)
_VOCAB_DIVISOR = float(_steps.VOCAB_DIVISOR)
_FP16 = int(_steps._FP16)  # the precision code expert parallelism refuses [15]
# The GEMM size curve (gemm._LOG_KNOTS, GEMM_CURVE_EFFICIENCY) and np.interp's slopes.
_LK = tuple(float(x) for x in _gemm_module._LOG_KNOTS)
_FP = tuple(float(x) for x in _gemm_module.GEMM_CURVE_EFFICIENCY)
_SL = tuple(float((np.float64(_FP[i + 1]) - _FP[i]) / (np.float64(_LK[i + 1]) - _LK[i]))
            for i in range(len(_LK) - 1))
if len(_LK) != 4:  # pragma: no cover - the kernel's interp is written for 4 knots
    raise ImportError("solver.fused.megatron_kernel expects a GEMM size curve of 4 knots")
_LK0, _LK1, _LK2, _LK3 = _LK
_FP0, _FP1, _FP2, _FP3 = _FP
_SL0, _SL1, _SL2 = _SL

#: Every value above, read as a global by the compiled steps (so frozen into numba's cached
#: kernel): part of solver.fused.megatron_kernel.SOURCES_DIGEST.
COMPILED_CONSTANTS = (_MAX_INTEGER, _REF_PEAK, _MEM_EFF, _WB, _MGB, _ASB, _SOFTMAX, _FLASH_BWD,
                      _CE_BYTES, _OPT_BYTES, _FP16, _LK, _FP, _SL, _MTP_BYTES, _VOCAB_DIVISOR,
                      _DEEPEP_NVL)

_INLINE = dict(inline="always", error_model="numpy")
_PRIM = dict(error_model="numpy")


# ---------------------------------------------------------------- primitives

@njit(**_PRIM)
def _max(a, b):
    """np.maximum: the larger, NaN if either is NaN."""
    r = a if a >= b else b
    return a if a != a else r


@njit(**_PRIM)
def _min(a, b):
    """np.minimum: the smaller, NaN if either is NaN."""
    r = a if a <= b else b
    return a if a != a else r


@njit(**_PRIM)
def _divides(a, b):
    """``a % b == 0`` for whole numbers below 2**53 held in floats (b >= 1)."""
    return np.floor(a / b) * b == a


@njit(**_PRIM)
def _a2a_split(m, n, g, up_bw, up_lat, out_bw, out_lat):
    """network.split_all_to_all_time."""
    g = _min(g, n)
    near = (g - 1) / n * m / up_bw
    far = (n - g) / n * m / out_bw
    return _max(near, far) + (n - 1) * (out_lat if g < n else up_lat)


@njit(**_PRIM)
def _miss_all(experts, top_k, excluded):
    """megatron_steps.miss_all."""
    q = 1.0
    for i in range(int(top_k)):
        q = q * _max(experts - excluded - i, 0.0) / (experts - i)
    return q


@njit(**_PRIM)
def _flex(token_bytes, experts, top_k, ep, n, near, up_bw, up_lat, out_bw, out_lat, call_lat):
    """megatron_steps.flex_dispatch_time."""
    near = _min(near, _max(np.floor(_DEEPEP_NVL / (n / ep)), 1.0))
    blocks = experts / ep
    hit_rank = 1.0 - _miss_all(experts, top_k, blocks)
    hit_domain = 1.0 - _miss_all(experts, top_k, _min(near * blocks, experts))
    nvlink = (n - 1.0) * hit_rank * token_bytes / up_bw
    nics = (ep / near - 1.0) * hit_domain * token_bytes / out_bw
    return (_max(nvlink, nics) + (n - 1.0) * (out_lat if near < ep else up_lat)
            + (call_lat if n > 1.0 else 0.0))


@njit(**_PRIM)
def _within(span, domain, whole):
    """megatron_steps.Hardware.within (``whole``: the job fits in one domain)."""
    return span <= domain and (_divides(domain, span) or whole)


@njit(**_PRIM)
def _pick(table, code):
    """``np.array(table)[code]`` for a 4-tuple and a code 0..3, as selects."""
    a, b, c, d = table
    return a if code == 0 else (b if code == 1 else (c if code == 2 else d))


@njit(**_PRIM)
def _interp(x):
    """np.interp(x, gemm._LOG_KNOTS, gemm.GEMM_CURVE_EFFICIENCY) (numpy's formula and slopes)."""
    if x < _LK1:
        r = _FP0 if x == _LK0 else _SL0 * (x - _LK0) + _FP0
        r = _FP0 if x < _LK0 else r
    elif x < _LK2:
        r = _FP1 if x == _LK1 else _SL1 * (x - _LK1) + _FP1
    elif x < _LK3:
        r = _FP2 if x == _LK2 else _SL2 * (x - _LK2) + _FP2
    else:
        r = _FP3
    return x if x != x else r


@njit(**_PRIM)
def _ideal(flops, calls, peak):
    """gemm.gemm_size_efficiency's argument of np.log: the ideal duration of one call [s]."""
    return _max(flops / calls / peak, 1e-30)


@njit(**_PRIM)
def _gemm(flops, calls, peak, plat, k, log_ideal, log_shift, tile_cost):
    """Hardware.gemm -> gemm.gemm_time with a tile term (k_dim given); ``log_ideal`` is
    ``np.log(_ideal(flops, calls, peak))``, taken by the kernel's ``_logs``; ``tile_cost``:
    :func:`_tile_cost`."""
    f1 = flops / calls
    x = log_ideal - log_shift
    eff = plat * _interp(x)
    return calls * f1 / (peak * eff) + calls * (f1 / k * tile_cost)


@njit(**_PRIM)
def _tile_cost(k_overhead, scale):
    """megatron_steps.hardware's ``tile_cost``: the fixed cost per GEMM tile (``scale``: the
    fitted GEMM scale of the accelerator's architecture, the kernel's c[0])."""
    return k_overhead / (_REF_PEAK * scale)


@njit(**_PRIM)
def _gemm_nok(flops, calls, peak, plat, log_ideal, log_shift):
    """Hardware.gemm -> gemm.gemm_time without a tile term (k_dim None)."""
    f1 = flops / calls
    x = log_ideal - log_shift
    eff = plat * _interp(x)
    return calls * f1 / (peak * eff)


@njit(**_PRIM)
def _mbt(nbytes, hbm):
    """gemm.memory_bound_time."""
    return nbytes / (hbm * _MEM_EFF)


@njit(**_PRIM)
def _coll_ar(m, n, bw, lat):
    """network._collective("all_reduce", ...)."""
    return 2.0 * (n - 1) / n * m / bw + 2.0 * (n - 1) * lat


@njit(**_PRIM)
def _coll_1(m, n, bw, lat):
    """network._collective for reduce_scatter, all_gather, all_to_all (factor (n-1)/n)."""
    return (n - 1) / n * m / bw + 1.0 * (n - 1) * lat


@njit(**_PRIM)
def _two_level(is_ar, m, n, rpd, up_bw, up_lat, out_bw, out_lat):
    """network.two_level_time (``is_ar``: all_reduce, else a (n-1)/n collective)."""
    g = _min(rpd, n)
    domains = n / g
    if is_ar:
        return _coll_ar(m, g, up_bw, up_lat) + _coll_ar(m / g, domains, out_bw, out_lat)
    return _coll_1(m, g, up_bw, up_lat) + _coll_1(m / g, domains, out_bw, out_lat)


@njit(**_PRIM)
def _exposed(comm, window, efficiency):
    """megatron_steps._exposed (no idle time: the same bits, 0.0 subtracted exactly)."""
    return _max(comm - efficiency * window, 0.0)


@njit(**_PRIM)
def _exposed_idle(comm, window, efficiency, idle):
    """megatron_steps._exposed with ``idle``."""
    return _max(comm - efficiency * window - idle, 0.0)


@njit(**_PRIM)
def _mlp_flops(tok, width, h, gated):
    """The two GEMMs' FLOPs of megatron_steps._mlp_time."""
    fc1 = 2.0 * tok * h * width * (1.0 + gated)
    fc2 = 2.0 * tok * width * h
    return fc1, fc2


@njit(**_PRIM)
def _mlp_time(tok, width, calls, h, gated, hbm, peak, plat, log_shift, tile_cost, lg1, lg2):
    """megatron_steps._mlp_time (``lg1``, ``lg2``: the logs of its two GEMMs' ideal durations)."""
    fc1, fc2 = _mlp_flops(tok, width, h, gated)
    act = _mbt(2.0 * tok * width * (3.0 if gated != 0.0 else 2.0), hbm)
    return (_gemm(fc1, calls, peak, plat, h, lg1, log_shift, tile_cost)
            + _gemm(fc2, calls, peak, plat, width, lg2, log_shift, tile_cost) + act)


@njit(**_PRIM)
def _model_flops_one(B, s, l, h, heads, kv_heads, ffn, vocab, gate, ept, shared, d, mla, attn_params,
                     core_dim):
    """flops.megatron_model_flops (head_dim given; with ``mla``, its attention_params and
    core_head_dim)."""
    if mla != 0.0:
        attention = attn_params / (2.0 * h * h) + s * heads * core_dim / (h * h)
    else:
        q_ratio = heads * d / h
        attention = (1.0 + kv_heads / heads + s / h) * q_ratio
    return 12.0 * B * s * l * (h * h) * (
        attention
        + (ffn / h) * ept * gate
        + (shared / h) * gate
        + vocab / (2.0 * l * h))
