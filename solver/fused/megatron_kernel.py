"""Fused numba kernel of :func:`solver.physics.megatron.solve` for flat (1-D) inputs.

A port, step by step, of :mod:`solver.physics.megatron_steps` and
:mod:`solver.physics.megatron_compose` to one loop over configurations: every
intermediate stays in registers, so a million configurations cost one pass
over the inputs and one over the outputs instead of the numpy path's hundreds
of full-size temporaries. Each ``_step`` function below mirrors the numpy
function named in its comment, line for line and in the same order of floating
point operations, so the two are bitwise equal (``tests/test_fused_megatron.py``
holds them so: change a formula there, port it here).

How the port stays exact:

- ``np.where`` becomes a select; both sides are computed as numpy does (no
  short cuts that change a rounding). ``np.maximum`` keeps numpy's NaN rule.
- Integer arithmetic of the numpy path (``%``, ``//`` on counts below 2**53,
  guaranteed by :mod:`solver.knobs`) is done in float64: the correctly rounded
  quotient of two such integers floors to the exact integer quotient, and the
  products stay exact.
- ``np.interp`` of the GEMM size curve is numpy's formula
  ``slope * (x - xp[j]) + fp[j]`` with numpy's precomputed slopes.
- ``np.log`` is libm's ``log`` on x86-64 without AVX-512, and numba calls the same
  libm ``log``. numpy dispatches its own SIMD float64 log on AVX-512 machines; where
  a one-time probe (:func:`libm_is_numpy_log`) finds the two differ, :func:`run`
  takes the logs with ``np.log`` between the kernel's first and last pass instead.
- No fastmath (it would reassociate); ``error_model="numpy"`` (a division by
  zero gives inf/NaN as numpy does, no exception checks in the loop).
- Where numpy computes both sides of an ``np.where``, the kernel computes the side
  it keeps, with the same expression, so the same bits.

The named steps (``_split`` ... ``_memory``, compose in ``_kernel``) are
``inline="always"`` numba functions; the small formula helpers (``_gemm``,
``_two_level``, ...) are plain ``njit`` functions (inlining those too at numba's
level triples the cold compile time, ~20 s -> ~60 s, for no measured gain).
``cache=True``: the compiled kernel is stored next to this file, or in numba's
user cache directory (``~/.cache/numba``, ``NUMBA_CACHE_DIR``) when the package
directory is not writable.

Per-workload, per-fleet and per-constant scalars are computed once in Python
(:func:`workload_scalars`, :func:`fleet_scalars`, :func:`constant_scalars`) and
passed as tuples; per-precision facts are 4-tuples indexed by the precision code.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .. import gemm as _gemm_module
from .. import megatron_memory as _mem
from ..physics import megatron_steps as _steps

__all__ = ["run", "workload_scalars", "fleet_scalars", "constant_scalars", "FLOAT_OUTPUTS",
           "BOOL_OUTPUTS"]

#: Float outputs in the order the kernel writes the rows of its float block.
FLOAT_OUTPUTS = (
    "dp_size", "microbatch_count", "step_latency_total", "effective_throughput",
    "tokens_per_second_per_accelerator", "model_flops_per_accelerator", "mfu", "hfu",
    "compute_latency", "tp_communication_latency", "cp_communication_latency",
    "ep_communication_latency", "pp_communication_latency", "dp_communication_latency",
    "communication_latency", "pipeline_bubble_latency", "bubble_fraction", "optimizer_latency",
    "memory_footprint", "memory_weights", "memory_gradients", "memory_optimizer_state",
    "memory_activations", "memory_communication_buffers")
#: Bool outputs in the order of the rows of the kernel's bool block.
BOOL_OUTPUTS = ("valid", "realizable", "feasible")

_MAX_INTEGER = float(2 ** 53)
_REF_PEAK = float(_steps.GEMM_REFERENCE_PEAK)
_MEM_EFF = float(_gemm_module.MEMORY_EFFICIENCY)
_WB = float(_mem.WEIGHT_BYTES)
_MGB = float(_mem.MAIN_GRAD_BYTES)
_ASB = float(_mem.ADAM_STATE_BYTES)
_SOFTMAX = float(_steps.SOFTMAX_BYTES)
_FLASH_BWD = float(_steps.FLASH_BACKWARD_RATIO)
_CE_BYTES = float(_steps.CROSS_ENTROPY_BYTES)
_OPT_BYTES = float(_steps.OPTIMIZER_BYTES_TOUCHED)
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
def _gemm(flops, calls, peak, plat, k, log_ideal, log_shift, k_overhead):
    """Hardware.gemm -> gemm.gemm_time with a depth term (k_dim given); ``log_ideal`` is
    ``np.log(_ideal(flops, calls, peak))``, taken in the kernel's log pass."""
    f1 = flops / calls
    x = log_ideal - log_shift
    eff = plat * _interp(x)
    eff = eff * (k / (k + k_overhead * peak / _REF_PEAK))
    return calls * f1 / (peak * eff)


@njit(**_PRIM)
def _gemm_nok(flops, calls, peak, plat, log_ideal, log_shift):
    """Hardware.gemm -> gemm.gemm_time without a depth term (k_dim None)."""
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
    """megatron_steps._exposed."""
    return _max(comm - efficiency * window, 0.0)


@njit(**_PRIM)
def _mlp_flops(tok, width, h, gated):
    """The two GEMMs' FLOPs of megatron_steps._mlp_time."""
    fc1 = 2.0 * tok * h * width * (1.0 + gated)
    fc2 = 2.0 * tok * width * h
    return fc1, fc2


@njit(**_PRIM)
def _mlp_time(tok, width, calls, h, gated, hbm, peak, plat, log_shift, k_overhead, lg1, lg2):
    """megatron_steps._mlp_time (``lg1``, ``lg2``: the logs of its two GEMMs' ideal durations)."""
    fc1, fc2 = _mlp_flops(tok, width, h, gated)
    act = _mbt(2.0 * tok * width * (3.0 if gated != 0.0 else 2.0), hbm)
    return (_gemm(fc1, calls, peak, plat, h, lg1, log_shift, k_overhead)
            + _gemm(fc2, calls, peak, plat, width, lg2, log_shift, k_overhead) + act)


@njit(**_PRIM)
def _model_flops_one(B, s, l, h, heads, kv_heads, ffn, vocab, gate, ept, shared, d):
    """flops.megatron_model_flops (head_dim given)."""
    q_ratio = heads * d / h
    return 12.0 * B * s * l * (h * h) * (
        (1.0 + kv_heads / heads + s / h) * q_ratio
        + (ffn / h) * ept * gate
        + (shared / h) * gate
        + vocab / (2.0 * l * h))


# ------------------------------------------------------------------ 1. split

@njit(**_INLINE)
def _split(w, n_total, has_dp, batch, s, tp, pp, cp, ep, dpk, v, mbs, spk, tco):
    """megatron_steps.split."""
    layers, heads, kv_heads, experts, moe = w[0], w[2], w[3], w[5], w[6]
    sp = spk and tp > 1.0
    model_parallel = tp * 1.0 * pp * cp
    if has_dp:
        dp = dpk
        valid = model_parallel * dp < _MAX_INTEGER
    else:
        fits = model_parallel <= n_total
        safe = model_parallel if fits else 1.0
        q = np.floor(n_total / safe)
        valid = fits and q * safe == n_total
        dp = q if valid else 1.0
    group = dp * cp
    valid = valid and _divides(group, ep)
    n_acc = model_parallel * dp
    m_exact = batch / (dp * 1.0 * mbs)
    fm = np.floor(m_exact)
    m = _max(fm, 1.0)
    realizable = (valid and m_exact == fm and m_exact >= 1.0
                  and _divides(heads, tp) and (_divides(kv_heads, tp) or _divides(tp, kv_heads))
                  and _divides(layers, pp * v) and (v == 1.0 or pp > 1.0)
                  and (cp == 1.0 or _divides(s, 2.0 * cp))
                  and (_divides(experts, ep) if moe != 0.0 else ep == 1.0)
                  and not (tco and not sp and tp > 1.0))
    return sp, dp, group, valid, n_acc, m_exact, m, realizable


# --------------------------------------------------------------- 2. hardware

@njit(**_INLINE)
def _hardware(f, c, prec):
    """megatron_steps.hardware: the precision code's peaks and plateaus, fitted constants applied."""
    peak_gemm = _pick(f[0], prec)
    peak16 = _pick(f[1], prec)
    low_bits = prec == 2 or prec == 3
    plateau = _pick(f[2], prec) * c[0] * (c[1] if low_bits else 1.0)
    plateau16 = _pick(f[3], prec) * c[0]
    grad_bytes = 2.0 if prec == 1 else 4.0
    return peak_gemm, peak16, plateau, plateau16, grad_bytes


# ------------------------------------------------------------ 3. layer times

#: Rows of the kernel's log scratch: one per GEMM whose size-curve log it takes.
(G_QKV, G_PROJ, G_CORE, G_FC1, G_FC2, G_MOE1, G_MOE2, G_SH1, G_SH2, G_ROUTER, G_HEAD) = range(11)
N_GEMMS = 11


@njit(**_INLINE)
def _local(w, s, tp, cp, mbs):
    """The local sizes at the top of megatron_steps.layer_times."""
    heads, kv_heads, ffn = w[2], w[3], w[8]
    s_local = s / (cp * 1.0)
    tokens = mbs * s_local
    heads_t = heads / (tp * 1.0)
    kv_t = _max(kv_heads / (tp * 1.0), 1.0)
    ffn_t = ffn / tp
    return s_local, tokens, heads_t, kv_t, ffn_t


@njit(**_INLINE)
def _gemm_flops(w, s, tp, cp, ep, mbs, flash):
    """(FLOPs, calls) of every GEMM of layer_times and of the LM head (pipeline), as they compute them.

    Both kernel passes call this, so the durations whose logs the first pass takes are
    the second pass's exactly.
    """
    h, d, experts, gated, top_k, moe_ffn, shared, vocab = w[1], w[4], w[5], w[7], w[9], w[10], w[11], w[13]
    s_local, tokens, heads_t, kv_t, ffn_t = _local(w, s, tp, cp, mbs)
    f_qkv = 2.0 * tokens * h * (heads_t + 2.0 * kv_t) * d
    f_proj = 2.0 * tokens * heads_t * d * h
    f_core = 4.0 * mbs * heads_t * s_local * s * d * (0.5 if flash else 1.0)
    calls_core = mbs * heads_t
    f_fc1, f_fc2 = _mlp_flops(tokens, ffn_t, h, gated)
    calls_moe = experts / (ep * 1.0)
    f_moe1, f_moe2 = _mlp_flops(tokens * top_k, moe_ffn / tp, h, gated)
    f_sh1, f_sh2 = _mlp_flops(tokens, shared * moe_ffn / tp, h, gated)
    f_router = 2.0 * tokens * h * experts
    f_head = 2.0 * tokens * h * (vocab / tp)
    return (f_qkv, f_proj, f_core, calls_core, f_fc1, f_fc2, f_moe1, f_moe2, calls_moe, f_sh1, f_sh2,
            f_router, f_head)


@njit(**_INLINE)
def _layer_times(w, f, c, s, tp, cp, ep, mbs, sp, rc, flash, peak_gemm, peak16, plateau, plateau16,
                 lg):
    """megatron_steps.layer_times (``lg``: the logs of the GEMMs' ideal durations, by G_* row)."""
    h, d, experts, moe, gated = w[1], w[4], w[5], w[6], w[7]
    top_k, moe_ffn, shared, moe_share = w[9], w[10], w[11], w[12]
    hbm, flash_eff = f[4], f[5]
    log_shift, k_overhead, attn_eff, elem_bytes = c[2], c[3], c[4], c[5]
    s_local, tokens, heads_t, kv_t, ffn_t = _local(w, s, tp, cp, mbs)
    (f_qkv, f_proj, core_flops, calls_core, _f1, _f2, _m1, _m2, local_experts, _s1, _s2, f_router,
     _fh) = _gemm_flops(w, s, tp, cp, ep, mbs, flash)
    norm_split = tp if sp else 1.0
    t_qkv = _gemm(f_qkv, 1.0, peak_gemm, plateau, h, lg[G_QKV], log_shift, k_overhead)
    t_proj = _gemm(f_proj, 1.0, peak_gemm, plateau, heads_t * d, lg[G_PROJ], log_shift, k_overhead)
    # Attention core: fused causal kernel, or the unfused softmax (np.where: a select).
    # The loop is scalar (see _kernel), so only the side np.where keeps is computed.
    if flash:
        t_core_f = core_flops / (peak16 * flash_eff * attn_eff)
    else:
        scores = mbs * heads_t * s_local * s
        t_core_f = (_gemm_nok(core_flops, calls_core, peak16, plateau16, lg[G_CORE], log_shift)
                    + _mbt(_SOFTMAX * scores, hbm))
    t_core_b = t_core_f * (_FLASH_BWD if flash else 2.0)
    t_mlp_dense = _mlp_time(tokens, ffn_t, 1.0, h, gated, hbm, peak_gemm, plateau, log_shift,
                            k_overhead, lg[G_FC1], lg[G_FC2])
    elementwise = _mbt(elem_bytes * tokens * h / norm_split, hbm)
    attn_gemms_f = t_qkv + t_proj
    t_dense_f = attn_gemms_f + t_mlp_dense + elementwise
    if moe != 0.0:
        routed = tokens * top_k
        t_moe = _mlp_time(routed, moe_ffn / tp, local_experts, h, gated, hbm, peak_gemm, plateau,
                          log_shift, k_overhead, lg[G_MOE1], lg[G_MOE2])
        if shared != 0.0:
            t_moe = t_moe + _mlp_time(tokens, shared * moe_ffn / tp, 1.0, h, gated, hbm, peak_gemm,
                                      plateau, log_shift, k_overhead, lg[G_SH1], lg[G_SH2])
        else:
            t_moe = t_moe + 0.0
        t_moe = t_moe + _gemm(f_router, 1.0, peak_gemm, plateau, h, lg[G_ROUTER], log_shift, k_overhead)
        t_moe_f = attn_gemms_f + t_moe + elementwise
    else:
        t_moe_f = 0.0
    layer_f = (1 - moe_share) * t_dense_f + moe_share * t_moe_f
    layer_b = 2.0 * layer_f + t_core_b
    layer_b = layer_b + ((layer_f + t_core_f) if rc == 2 else (t_core_f if rc == 1 else 0.0))
    layer_f = layer_f + t_core_f
    act_bytes = 2.0 * tokens * h
    return s_local, tokens, kv_t, norm_split, act_bytes, t_core_f, t_core_b, layer_f, layer_b


# ---------------------------------------------------------- 4. communication

@njit(**_INLINE)
def _communication(w, f, c, tp, cp, ep, sp, rc, tco, tokens, kv_t, norm_split, act_bytes,
                   t_core_f, t_core_b):
    """megatron_steps.communication."""
    d, moe, top_k, moe_share = w[4], w[6], w[9], w[12]
    domain, up_bw0, out_bw0, up_lat, out_lat = f[6], f[7], f[8], f[9], f[10]
    up_bw, out_bw = up_bw0 * c[7], out_bw0 * c[8]
    call_lat, overlap_eff = c[11], c[9]
    inside = tp <= domain
    tp_bw, tp_lat = (up_bw if inside else out_bw), (up_lat if inside else out_lat)
    t_ar = _coll_ar(act_bytes, tp, tp_bw, tp_lat) + (call_lat if tp > 1.0 else 0.0)
    full = rc == 2
    tp_calls = 4.0 + (2.0 if full else 0.0)
    tp_total = tp_calls * t_ar
    tp_hidden = overlap_eff if (tco and sp) else 0.0
    tp_layer = tp_total * (1.0 - tp_hidden)
    kv_bytes = 2.0 * 2.0 * tokens * kv_t * d
    inside = tp * cp <= domain
    cp_bw, cp_lat = (up_bw if inside else out_bw), (up_lat if inside else out_lat)
    cp_step = kv_bytes / cp_bw + cp_lat + call_lat
    cp_f = (cp - 1.0) * cp_step
    cp_total = 3.0 * cp_f * ((1.0 + 1.0 / 3.0) if full else 1.0)
    cp_layer = (_exposed(cp_f, t_core_f, 1.0) + _exposed(2.0 * cp_f, t_core_b, 1.0)
                + (_exposed(cp_f, t_core_f, 1.0) if full else 0.0))
    if moe != 0.0:
        inside = tp * cp * ep <= domain
        ep_bw, ep_lat = (up_bw if inside else out_bw), (up_lat if inside else out_lat)
        a2a = _coll_1(act_bytes * top_k / norm_split, ep, ep_bw, ep_lat) + (call_lat if ep > 1.0 else 0.0)
        ep_layer = moe_share * (4.0 + (2.0 if full else 0.0)) * a2a
    else:
        ep_layer = 0.0
    return up_bw, out_bw, tp_total, tp_layer, cp_total, cp_layer, ep_layer


# --------------------------------------------------------------- 5. pipeline

@njit(**_INLINE)
def _pipeline(w, f, c, tp, pp, cp, v, dp, m, rc, tokens, act_bytes, layer_f, layer_b, tp_layer,
              cp_layer, ep_layer, peak16, plateau16, up_bw, out_bw, f_head, lg_head):
    """megatron_steps.pipeline."""
    layers, h, vocab = w[0], w[1], w[13]
    hbm, domain, up_lat, out_lat = f[4], f[6], f[9], f[10]
    log_shift, k_overhead, layer_overhead, call_lat = c[2], c[3], c[6], c[11]
    layers_stage = np.ceil(layers / (pp * 1.0))
    launches = layer_overhead * (4.0 if rc == 2 else 3.0)
    per_layer = _max(layer_f + layer_b + tp_layer + cp_layer + ep_layer, launches)
    t_layers = layers_stage * per_layer
    vocab_t = vocab / tp
    t_head = 3.0 * _gemm(f_head, 1.0, peak16, plateau16, h, lg_head, log_shift, k_overhead) \
        + _mbt(_CE_BYTES * tokens * vocab_t, hbm)
    stage_max = t_layers + t_head
    stage_mean = t_layers + t_head / pp
    bubble = (pp - 1.0) / (v * 1.0) * stage_mean
    t_pipe = m * stage_max + bubble
    inside = tp * cp * dp * 2.0 <= domain
    pp_bw, pp_lat = (up_bw if inside else out_bw), (up_lat if inside else out_lat)
    t_p2p = act_bytes / tp / pp_bw + pp_lat + call_lat
    t_pp = 2.0 * t_p2p * ((pp * v - 1.0) + (m if v == 1.0 else 0.0)) if pp > 1.0 else 0.0
    return layers_stage, t_head, bubble, t_pipe, t_pp


# ---------------------------------------------------------- 6. data parallel

@njit(**_INLINE)
def _data_parallel(w, f, c, tp, pp, ep, group, zero, m, ogr, opg, grad_bytes, layers_stage,
                   layer_f, layer_b, tp_layer, t_pipe, up_bw, out_bw):
    """megatron_compose.data_parallel (with _stage_params)."""
    moe, dense_scale, expert_scale, emb = w[6], w[14], w[15], w[16]
    hbm, domain, up_lat, out_lat = f[4], f[6], f[9], f[10]
    eta = c[9]
    # _stage_params
    dense_stage_params = dense_scale * layers_stage / tp + emb / tp * (1.0 if pp == 1.0 else 0.0)
    expert_stage_params = expert_scale * layers_stage / (tp * ep * 1.0) if moe != 0.0 else 0.0
    heavy = dense_stage_params + emb / tp * (1.0 if pp > 1.0 else 0.0)
    ranks_up = _max(np.floor(domain / tp), 1.0)
    ranks_up = _min(ranks_up, group)
    expert_group = _max(np.floor(group / ep), 1.0)
    grads_dense = heavy * grad_bytes
    grads_expert = expert_stage_params * grad_bytes
    sharded = zero >= 1
    rpd_g = _min(ranks_up, group)
    rpd_e = _min(ranks_up, expert_group)
    params_bytes = _WB * (heavy + expert_stage_params)
    fsdp = zero == 3
    # Only the branch np.where keeps is computed (the same expressions, so the same bits).
    t_fsdp = exp_fsdp = t_grad = t_gather = exp_grad = exp_gather = 0.0
    if fsdp:
        inside = group <= domain
        fsdp_bw, fsdp_lat = (up_bw if inside else out_bw), (up_lat if inside else out_lat)
        # layer by layer: each layer after the first pays (n-1) ring steps and the call cost
        fsdp_calls = 3.0 * (layers_stage - 1.0) * ((group - 1.0) * fsdp_lat + c[11])
        t_fsdp = m * (2.0 * _coll_1(params_bytes, group, fsdp_bw, fsdp_lat)
                      + _coll_1((heavy + expert_stage_params) * grad_bytes, group, fsdp_bw, fsdp_lat)
                      + fsdp_calls)
        exp_fsdp = _exposed(t_fsdp, t_pipe, eta) if opg else t_fsdp
    else:
        is_ar = not sharded  # zero 0: all-reduce; else reduce-scatter + all-gather
        t_grad = _two_level(is_ar, grads_dense, group, rpd_g, up_bw, up_lat, out_bw, out_lat)
        if moe != 0.0:
            t_grad = t_grad + _two_level(is_ar, grads_expert, expert_group, rpd_e, up_bw, up_lat,
                                         out_bw, out_lat)
        else:
            t_grad = t_grad + 0.0
        if sharded:
            t_gather = _two_level(False, _WB * heavy, group, rpd_g, up_bw, up_lat, out_bw, out_lat)
            if moe != 0.0:
                t_gather = t_gather + _two_level(False, _WB * expert_stage_params, expert_group,
                                                 rpd_e, up_bw, up_lat, out_bw, out_lat)
            else:
                t_gather = t_gather + 0.0
        stage_b = layers_stage * (layer_b + tp_layer / 2)
        stage_f = layers_stage * (layer_f + tp_layer / 2)
        exp_grad = _exposed(t_grad, stage_b, eta) if ogr else t_grad
        exp_gather = _exposed(t_gather, stage_f, eta) if opg else t_gather
    local_params = heavy + expert_stage_params
    t_opt = _mbt(_OPT_BYTES * local_params / (group if sharded else 1.0), hbm)
    t_dp_total = t_fsdp if fsdp else t_grad + t_gather
    t_dp = exp_fsdp if fsdp else exp_grad + exp_gather
    return dense_stage_params, expert_stage_params, expert_group, params_bytes, t_dp_total, t_dp, t_opt


# ----------------------------------------------------------------- 7. memory

@njit(**_PRIM)
def _model_state(p, group, zero):
    """megatron_memory.model_state."""
    weights = _WB * p / (group if zero >= 3 else 1.0)
    grads = _MGB * p / (group if zero >= 2 else 1.0)
    optim = _ASB * p / (group if zero >= 1 else 1.0)
    return weights, grads, optim


@njit(**_PRIM)
def _activation_bytes(mbs, s, h, heads, attention0, mlp_scale, top_k, t, sp, rc, flash):
    """megatron_memory.layer_activation_bytes (``attention0`` = 4 + 4 kv / a, ``mlp_scale`` =
    (4 + 2 gated) * mlp_width: the workload-only parts, computed in Python)."""
    sbh = mbs * s * h
    spt = t if sp else 1.0
    replicated = 10.0 / spt
    attention = attention0 / t
    mlp = mlp_scale / h / t
    mlp = mlp + 2.0 * top_k / spt
    scores = 0.0 if (flash or rc >= 1) else 5.0 * heads * s / (h * t)
    per_layer = sbh * (replicated + attention + mlp + scores)
    full = 2.0 * sbh / spt
    return full if rc == 2 else per_layer


@njit(**_INLINE)
def _memory(w, tp, pp, v, m, mbs, group, zero, sp, rc, flash, grad_bytes, s_local, act_bytes,
            layers_stage, dense_stage_params, expert_stage_params, expert_group, params_bytes):
    """megatron_compose.memory."""
    h, heads, moe, top_k, moe_share, vocab, emb = w[1], w[2], w[6], w[9], w[12], w[13], w[16]
    attention0, mlp_dense, mlp_moe = w[17], w[18], w[19]
    weights, grads, optim = _model_state(dense_stage_params + emb / tp * (1.0 if pp > 1.0 else 0.0),
                                         group, zero)
    if moe != 0.0:
        we, ge, oe = _model_state(expert_stage_params, expert_group, zero)
        weights, grads, optim = weights + we, grads + ge, optim + oe
    act_dense = _activation_bytes(mbs, s_local, h, heads, attention0, mlp_dense, 0.0, tp, sp, rc, flash)
    if moe != 0.0:
        act_moe = _activation_bytes(mbs, s_local, h, heads, attention0, mlp_moe, top_k, tp, sp, rc, flash)
        act_layer = (1 - moe_share) * act_dense + moe_share * act_moe
    else:
        act_layer = act_dense
    # megatron_memory.in_flight_layers
    chunks = pp * v + pp - 1 if v > 1.0 else pp
    in_flight = layers_stage / v * _min(chunks, m * v)
    logits = 4.0 * mbs * s_local * vocab / tp if pp == 1.0 else 0.0
    activations = act_layer * in_flight + logits
    bucket = grad_bytes * _max(4e7, 1e6 * group)
    buffers = (bucket + 2.0 * act_bytes / tp * (1.0 if pp > 1.0 else 0.0)
               + (2.0 if zero == 3 else 0.0) * _WB * (params_bytes / _WB / layers_stage))
    footprint = weights + grads + optim + activations + buffers
    return weights, grads, optim, activations, buffers, footprint


# ---------------------------------------------------------------- 8. compose

@njit(**_INLINE)
def _model_flops(w, batch, s):
    """megatron_compose._model_flops."""
    layers, h, heads, kv_heads, d, moe, ffn, top_k = w[0], w[1], w[2], w[3], w[4], w[6], w[8], w[9]
    moe_ffn, shared, vocab, gate, dense_layers = w[10], w[11], w[13], w[20], w[21]
    if moe != 0.0:
        mf = _model_flops_one(batch, s, layers, h, heads, kv_heads, moe_ffn, vocab, gate, top_k,
                              shared * moe_ffn, d)
        if dense_layers != 0.0:
            mf = mf + _model_flops_one(batch, s, dense_layers, h, heads, kv_heads, ffn, 0.0, gate, 1.0,
                                       0.0, d) \
                - _model_flops_one(batch, s, dense_layers, h, heads, kv_heads, moe_ffn, 0.0, gate,
                                   top_k, shared * moe_ffn, d)
    else:
        mf = _model_flops_one(batch, s, layers, h, heads, kv_heads, ffn, vocab, gate, 1.0,
                              shared * moe_ffn, d)
    return mf


_MEMO = 256
_HASH = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing of the bits into 8 bits
_SHIFT = np.uint64(56)
_EMPTY = np.uint64(0xFFFFFFFFFFFFFFFF)

#: Configurations per block: the log scratch (N_GEMMS x BLOCK floats) stays in L1/L2.
BLOCK = 512


@njit(error_model="numpy", cache=True, nogil=True)
def _kernel(w, f, c, has_dp, batch_a, s_a, tp_a, pp_a, cp_a, ep_a, dp_a, v_a, mbs_a, spk_a, rc_a,
            zero_a, prec_a, tco_a, ogr_a, opg_a, flash_a, fo, bo, lo, hi, ext, mode):
    """Steps 1-8 of megatron._solve for every configuration, outputs into ``fo``/``bo``.

    Per block of BLOCK configurations, three passes: (a) the ideal duration of every
    GEMM; (b) their logs (libm, only the GEMMs the workload has, memoized on the exact
    bits of the argument); (c) everything else, one scalar iteration per configuration.

    Pass (c) stays scalar on purpose: it is bound by its ~130 IEEE divisions per
    configuration, which must stay divisions to keep the numpy path's bits. LLVM does
    vectorize it when forced (``-force-vector-width=4``, raised runtime alias-check
    thresholds, every helper inlined), still bitwise equal, but the if-converted body
    then computes both sides of every select and was no faster on this AVX2 machine,
    at ten times the compile time; the scalar loop computes only the side np.where keeps.

    Configurations ``lo:hi``. ``mode`` 0: the three passes, logs from libm; 1: pass (a)
    only, into ``ext`` (rows G_*, columns ``i - lo``); 2: pass (c) only, its logs read from
    ``ext`` (where numpy's log is not libm's, :func:`run` takes them with ``np.log``).
    """
    n = batch_a.shape[0]
    layers, h, moe, shared = w[0], w[1], w[6], w[11]
    n_total, capacity = f[11], f[12]
    step_overhead = c[10]
    nan = np.nan
    lg = np.empty((N_GEMMS, BLOCK)) if mode == 0 else ext
    bits = lg.view(np.uint64)
    # memo of the logs: key = the argument's bits (an all-ones NaN pattern, whose log is NaN
    # too, marks an empty slot)
    memo_key = np.full((N_GEMMS, _MEMO), _EMPTY, dtype=np.uint64)
    memo_log = np.full((N_GEMMS, _MEMO), np.nan)
    for start in range(lo, hi, BLOCK):
        stop = min(start + BLOCK, hi)
        base = start if mode == 0 else lo
        # (a) the GEMMs' ideal durations (gemm.gemm_size_efficiency before its np.log)
        for i in range(start, stop if mode != 2 else start):
            j = i - base
            s, tp, cp, ep = float(s_a[i]), float(tp_a[i]), float(cp_a[i]), float(ep_a[i])
            mbs, flash, prec = float(mbs_a[i]), flash_a[i], prec_a[i]
            peak_gemm, peak16, plateau, plateau16, grad_bytes = _hardware(f, c, prec)
            (f_qkv, f_proj, f_core, calls_core, f_fc1, f_fc2, f_moe1, f_moe2, calls_moe, f_sh1, f_sh2,
             f_router, f_head) = _gemm_flops(w, s, tp, cp, ep, mbs, flash)
            lg[G_QKV, j] = _ideal(f_qkv, 1.0, peak_gemm)
            lg[G_PROJ, j] = _ideal(f_proj, 1.0, peak_gemm)
            lg[G_CORE, j] = _ideal(f_core, calls_core, peak16)
            lg[G_FC1, j] = _ideal(f_fc1, 1.0, peak_gemm)
            lg[G_FC2, j] = _ideal(f_fc2, 1.0, peak_gemm)
            lg[G_MOE1, j] = _ideal(f_moe1, calls_moe, peak_gemm)
            lg[G_MOE2, j] = _ideal(f_moe2, calls_moe, peak_gemm)
            lg[G_SH1, j] = _ideal(f_sh1, 1.0, peak_gemm)
            lg[G_SH2, j] = _ideal(f_sh2, 1.0, peak_gemm)
            lg[G_ROUTER, j] = _ideal(f_router, 1.0, peak_gemm)
            lg[G_HEAD, j] = _ideal(f_head, 1.0, peak16)
        # (b) np.log of those the numpy path uses (libm's log, as numpy's loop calls it),
        # memoized on the exact bits of its argument: a draw has few distinct GEMMs
        for g in range(N_GEMMS if mode == 0 else 0):
            if (G_MOE1 <= g <= G_ROUTER and moe == 0.0) or ((g == G_SH1 or g == G_SH2) and shared == 0.0):
                continue
            for j in range(stop - start):
                if g == G_CORE and flash_a[start + j]:
                    continue  # the unfused attention core's GEMM only where it runs
                key = bits[g, j]
                slot = (key * _HASH) >> _SHIFT
                if memo_key[g, slot] == key:
                    lg[g, j] = memo_log[g, slot]
                else:
                    y = math.log(lg[g, j])
                    memo_key[g, slot] = key
                    memo_log[g, slot] = y
                    lg[g, j] = y
        # (c) the steps
        for i in range(start, stop if mode != 1 else start):
            j = i - base
            batch, s = float(batch_a[i]), float(s_a[i])
            tp, pp, cp, ep = float(tp_a[i]), float(pp_a[i]), float(cp_a[i]), float(ep_a[i])
            v, mbs = float(v_a[i]), float(mbs_a[i])
            rc, zero, prec = rc_a[i], zero_a[i], prec_a[i]
            spk, tco, ogr, opg, flash = spk_a[i], tco_a[i], ogr_a[i], opg_a[i], flash_a[i]
            lgs = (lg[0, j], lg[1, j], lg[2, j], lg[3, j], lg[4, j], lg[5, j], lg[6, j], lg[7, j],
                   lg[8, j], lg[9, j], lg[10, j])
            # 1. split
            sp, dp, group, valid, n_acc, m_exact, m, realizable = _split(
                w, n_total, has_dp, batch, s, tp, pp, cp, ep, float(dp_a[i]), v, mbs, spk, tco)
            # 2. hardware
            peak_gemm, peak16, plateau, plateau16, grad_bytes = _hardware(f, c, prec)
            # 3. layer times
            s_local, tokens, kv_t, norm_split, act_bytes, t_core_f, t_core_b, layer_f, layer_b = \
                _layer_times(w, f, c, s, tp, cp, ep, mbs, sp, rc, flash, peak_gemm, peak16, plateau,
                             plateau16, lgs)
            # 4. communication
            up_bw, out_bw, tp_total, tp_layer, cp_total, cp_layer, ep_layer = _communication(
                w, f, c, tp, cp, ep, sp, rc, tco, tokens, kv_t, norm_split, act_bytes, t_core_f,
                t_core_b)
            # 5. pipeline
            f_head = 2.0 * tokens * h * (w[13] / tp)  # as _gemm_flops computes it
            layers_stage, t_head, bubble, t_pipe, t_pp = _pipeline(
                w, f, c, tp, pp, cp, v, dp, m, rc, tokens, act_bytes, layer_f, layer_b, tp_layer,
                cp_layer, ep_layer, peak16, plateau16, up_bw, out_bw, f_head, lgs[G_HEAD])
            # 6. data parallel
            (dense_stage_params, expert_stage_params, expert_group, params_bytes, t_dp_total, t_dp,
             t_opt) = _data_parallel(w, f, c, tp, pp, ep, group, zero, m, ogr, opg, grad_bytes,
                                     layers_stage, layer_f, layer_b, tp_layer, t_pipe, up_bw, out_bw)
            # 7. memory
            weights, grads, optim, activations, buffers, footprint = _memory(
                w, tp, pp, v, m, mbs, group, zero, sp, rc, flash, grad_bytes, s_local, act_bytes,
                layers_stage, dense_stage_params, expert_stage_params, expert_group, params_bytes)
            # 8. compose (megatron_compose.compose and _mask)
            total = t_pipe + t_pp + t_dp + t_opt + step_overhead
            model_flops = _model_flops(w, batch, s)
            per_acc = model_flops / (total * n_acc)
            selective = 4.0 * s * h * layers / (model_flops / (batch * s))
            recompute_extra = 1.0 / 3.0 if rc == 2 else (selective if rc == 1 else 0.0)
            mfu = per_acc / peak_gemm
            ms = m * layers_stage
            x = 0.0 if valid else nan
            fo[0][i] = dp * 1.0 + x
            fo[1][i] = m_exact + x
            fo[2][i] = total + x
            fo[3][i] = batch / total + x
            fo[4][i] = batch * 1.0 * s / (total * n_acc) + x
            fo[5][i] = per_acc + x
            fo[6][i] = mfu + x
            fo[7][i] = mfu * (1.0 + recompute_extra) + x
            fo[8][i] = ms * (layer_f + layer_b) + m * t_head + x
            fo[9][i] = ms * tp_layer + x
            fo[10][i] = ms * cp_layer + x
            fo[11][i] = ms * ep_layer + x
            fo[12][i] = t_pp + x
            fo[13][i] = t_dp + x
            fo[14][i] = ms * (tp_total + cp_total + ep_layer) + t_pp + t_dp_total + x
            fo[15][i] = bubble + x
            fo[16][i] = bubble / t_pipe + x
            fo[17][i] = t_opt + x
            fo[18][i] = footprint + x
            fo[19][i] = weights + x
            fo[20][i] = grads + x
            fo[21][i] = optim + x
            fo[22][i] = activations + x
            fo[23][i] = buffers + x
            bo[0][i] = valid
            bo[1][i] = realizable
            bo[2][i] = valid and footprint <= capacity


# ------------------------------------------------------------ Python side

def workload_scalars(w):
    """The kernel's per-workload tuple from a ``megatron._Shape`` (same expressions as the steps)."""
    moe = bool(w.moe)
    # megatron_memory.layer_activation_bytes: the workload-only factors, as it evaluates them.
    attention0 = 4.0 + 4.0 * w.kv_heads / w.heads
    gated = float(np.asarray(w.gated, dtype=np.float64))
    mlp_dense = (4.0 + 2.0 * gated) * float(w.ffn)
    moe_ffn_hidden = w.moe_ffn + w.shared * w.moe_ffn / max(w.top_k, 1)
    mlp_moe_width = w.top_k * moe_ffn_hidden if w.top_k > 0 else moe_ffn_hidden
    mlp_moe = (4.0 + 2.0 * gated) * float(mlp_moe_width)
    # megatron_compose._stage_params: the workload-only parts.
    dense_scale = (w.dense_layer_params * w.dense_layers / w.layers
                   + w.moe_layer_nonexpert * w.moe_layers / w.layers)
    expert_scale = (w.expert_params * w.experts * w.moe_layers / w.layers) if moe else 0.0
    return tuple(float(x) for x in (
        w.layers, float(w.hidden), w.heads, w.kv_heads, w.head_dim, w.experts, moe, gated,
        w.ffn, w.top_k, w.moe_ffn, w.shared, w.moe_layers / w.layers, w.vocab,
        dense_scale, expert_scale, w.embedding_params, attention0, mlp_dense, mlp_moe,
        1.5 if w.gated else 1.0, w.dense_layers if moe else 0.0))


def fleet_scalars(fleet, total_accelerators=None):
    """The kernel's per-fleet tuple: per-precision tables (4-tuples) and rates (megatron_steps.hardware)."""
    node, fabric = fleet.node, fleet.fabric
    acc = node.accelerator
    P = _steps.PRECISIONS
    peak_gemm = tuple(float(_steps._peak(acc, p)) for p in P)
    peak16 = tuple(float(_steps._peak(acc, "fp16" if p == "fp16" else "bf16")) for p in P)
    plateau = tuple(float(_steps._plateau(acc, p)) for p in P)
    plateau16 = tuple(float(_steps._plateau(acc, "fp16" if p == "fp16" else "bf16")) for p in P)
    return (peak_gemm, peak16, plateau, plateau16,
            float(acc.memory_bandwidth),
            float(acc.gemm_efficiency.get("flash_attention", _steps.DEFAULT_FLASH_ATTENTION_EFFICIENCY)),
            float(node.scale_up_domain or node.accelerators_per_node),
            float(node.scale_up_bus_bandwidth or node.intra_node_bandwidth),
            float(node.nic_bandwidth or fabric.bandwidth / fabric.oversubscription),
            float(_steps.SCALE_UP_STEP_LATENCY),
            float(fabric.latency if fabric.latency is not None else _steps.SCALE_OUT_STEP_LATENCY),
            float(fleet.total_accelerators), float(acc.memory_capacity))


#: Constant names in the order of the kernel's constant tuple (``gemm_size_shift`` as its log).
CONSTANT_ORDER = ("gemm_scale", "fp8_gemm_scale", "gemm_size_shift", "gemm_k_overhead",
                  "attention_efficiency", "elementwise_bytes", "layer_overhead",
                  "scale_up_efficiency", "scale_out_efficiency", "overlap_efficiency",
                  "step_overhead", "collective_latency")


def constant_scalars(c):
    """The kernel's constant tuple from scalar constants (``np.log`` of the size shift, as gemm takes it)."""
    out = []
    for name in CONSTANT_ORDER:
        value = np.float64(c[name])
        out.append(float(np.log(value)) if name == "gemm_size_shift" else float(value))
    return tuple(out)


def run(w, f, c, n, has_dp, batch, s, tp, pp, cp, ep, dp, v, mbs, spk, rc, zero, prec, tco, ogr,
        opg, flash):
    """Price ``n`` configurations: the knobs as 1-D arrays of length ``n`` (int64 / bool).

    Returns
    -------
    (tuple of len(FLOAT_OUTPUTS) float64 arrays, tuple of 3 bool arrays), each of length n
    """
    # One array per output, not rows of one block: LLVM can check separate arrays for
    # overlap at run time (rows of one 2-D array are a stride apart it cannot bound), and
    # glibc serves n-sized blocks again from its heap after the first call frees some,
    # where one big block would be a fresh mmap, page-faulted in on every call.
    fo = tuple(np.empty(n, dtype=np.float64) for _ in FLOAT_OUTPUTS)
    bo = tuple(np.empty(n, dtype=np.bool_) for _ in BOOL_OUTPUTS)
    args = (w, f, c, has_dp, batch, s, tp, pp, cp, ep, dp, v, mbs, spk, rc, zero, prec, tco, ogr,
            opg, flash, fo, bo)
    if libm_is_numpy_log():
        _kernel(*args, 0, n, np.empty((1, 1)), 0)
        return fo, bo
    # numpy's float64 log is its own SIMD code here (AVX-512): take the logs with it, in
    # chunks, between the kernel's first and last pass, so they are the numpy path's.
    rows = [g for g in range(N_GEMMS)
            if not ((G_MOE1 <= g <= G_ROUTER and not w[6]) or (g in (G_SH1, G_SH2) and not w[11]))]
    ext = np.empty((N_GEMMS, min(n, _NUMPY_LOG_CHUNK)))
    for lo in range(0, n, _NUMPY_LOG_CHUNK):
        hi = min(lo + _NUMPY_LOG_CHUNK, n)
        _kernel(*args, lo, hi, ext, 1)
        for g in rows:
            np.log(ext[g, :hi - lo], out=ext[g, :hi - lo])
        _kernel(*args, lo, hi, ext, 2)
    return fo, bo


_NUMPY_LOG_CHUNK = 1 << 16
_LIBM_IS_NUMPY_LOG = None


@njit(cache=True, nogil=True, error_model="numpy")
def _libm_log(x):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = math.log(x[i])
    return out


def libm_is_numpy_log():
    """Whether numpy's float64 ``np.log`` is libm's ``log`` here (what the kernel calls),
    probed once on 100,000 arguments over the GEMM curve's range and beyond."""
    global _LIBM_IS_NUMPY_LOG
    if _LIBM_IS_NUMPY_LOG is None:
        rng = np.random.default_rng(0)
        x = np.concatenate([np.exp(rng.uniform(-70.0, 10.0, 99_000)),
                            np.geomspace(1e-30, 1e3, 1000)])
        _LIBM_IS_NUMPY_LOG = bool(np.array_equal(np.log(x), _libm_log(x)))
    return _LIBM_IS_NUMPY_LOG


# ------------------------------------------------------- input normalization

@njit(cache=True, nogil=True)
def _match_rows(chars, table):
    """Index of the row of ``table`` equal to each row of ``chars``, -1 if none (branch-free)."""
    n, width = chars.shape
    codes = np.empty(n, dtype=np.int64)
    for i in range(n):
        code = -1
        for t in range(table.shape[0]):
            diff = np.uint32(0)
            for j in range(width):
                diff |= chars[i, j] ^ table[t, j]
            code = t if diff == 0 else code
        codes[i] = code
    return codes


def factorize_choices(array, choices):
    """Codes into ``choices`` of a 1-D unicode array, in one pass; None if any value is not
    exactly one of ``choices`` (the caller's slow path then lowers case or raises)."""
    if array.dtype.kind != "U" or array.ndim != 1:
        return None
    width = array.dtype.itemsize // 4
    chars = np.ascontiguousarray(array).view(np.uint32).reshape(array.shape[0], width)
    # A choice longer than the array's strings gets a row no character equals (above U+10FFFF).
    table = np.full((len(choices), width), 0xFFFFFFFF, dtype=np.uint32)
    for t, choice in enumerate(choices):
        if len(choice) <= width:
            table[t] = 0
            table[t, :len(choice)] = np.frombuffer(choice.encode("utf-32-le"), dtype=np.uint32)
    codes = _match_rows(chars, table)
    if codes.size and codes.min() < 0:
        return None
    return codes


@njit(cache=True, nogil=True)
def _min_max(values):
    lo = values[0]
    hi = values[0]
    for i in range(1, values.shape[0]):
        x = values[i]
        lo = x if x < lo else lo
        hi = x if x > hi else hi
    return lo, hi


def int_in_bounds(array, low, high, limit):
    """A 1-D int64 array whose values lie in [low, high] and below ``limit`` in magnitude
    (one pass); False sends the caller to the checking converter, which says what is wrong."""
    if array.dtype != np.int64 or array.ndim != 1 or array.size == 0:
        return False
    lo, hi = _min_max(array)
    return (-limit < lo and hi < limit and (low is None or lo >= low)
            and (high is None or hi <= high))
