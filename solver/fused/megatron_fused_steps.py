"""The named steps of the fused megatron kernel (``inline="always"`` numba functions).

``_split`` ... ``_memory`` and ``_model_flops`` mirror, line for line, the numpy
functions of :mod:`solver.physics.megatron_steps` and
:mod:`solver.physics.megatron_compose` named in their docstrings; compose is in
:func:`solver.fused.megatron_kernel._kernel`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .megatron_primitives import (_ASB, _CE_BYTES, _VOCAB_DIVISOR, _FLASH_BWD, _FP16, _INLINE, _MAX_INTEGER, _MGB,
    _MTP_BYTES, _OPT_BYTES, _PRIM, _SOFTMAX, _WB, _coll_1, _coll_ar, _divides, _exposed, _exposed_idle, _gemm, _gemm_nok,
    _max, _mbt, _min, _mlp_flops, _mlp_time, _model_flops_one, _pick, _tile_cost, _two_level, _within,
    _a2a_split, _flex, _DEEPEP_NVL)


# ------------------------------------------------------------------ 1. split

@njit(**_INLINE)
def _split(w, f, has_dp, batch, s, tp, pp, cp, ep, etp, dpk, v, mbs, spk, tco, prec, flash,
           ogr, opg, zero, first, last, op2p, rc, mtp, a2a, key_ok, accounted, deepep):
    """megatron_steps.split (``f``: the fleet's row, its size, NVLink domain and the 4-tuple
    of 1.0 where it has the precision; ``first``, ``last``: the set stages' layers, 0.0
    where not set; ``op2p``:
    ``overlap_p2p_comm``; ``a2a``: ``overlap_moe_expert_parallel_comm``; ``key_ok``: its
    rules that read only the step memo's knobs, :func:`_key_rules`; ``accounted``: 0-2,
    ``megatron._account_stages``'s ``pipeline_split``; ``deepep``: ``moe_enable_deepep``)."""
    layers, moe = w[0], w[6]
    n_total, domain, supported = f[11], f[6], f[13]
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
    valid = valid and _divides(tp * group, etp * ep)
    n_acc = model_parallel * dp
    m_exact = batch / (dp * 1.0 * mbs)
    fm = np.floor(m_exact)
    m = _max(np.ceil(m_exact), 1.0)
    if accounted != 0:  # account_for_embedding/loss_in_pipeline_split, decided before [36]
        layers_ok = accounted == 1
    elif first > 0.0 or last > 0.0:  # set first and last stages (megatron_steps.split)
        middle = pp - (1.0 if first > 0.0 else 0.0) - (1.0 if last > 0.0 else 0.0)
        rest = layers - first - last
        n_mid = _stage_layers(w, pp, first, last)[2]
        layers_ok = (pp > 1.0 and rest >= 0.0
                     and ((_divides(rest, middle) and rest >= middle) if middle > 0.0 else rest == 0.0)
                     and (v == 1.0 or (_divides(first, v) and _divides(last, v) and _divides(n_mid, v))))
    else:
        # neither set: Megatron-LM refuses layers that pp (and v) do not divide [13]
        layers_ok = _divides(layers, pp * v) and (v == 1.0 or pp > 1.0)
    realizable = (valid and m_exact == fm and m_exact >= 1.0
                  and key_ok
                  and layers_ok
                  and (v == 1.0 or (_divides(m_exact, pp) and m_exact >= pp))
                  and (v == 1.0 or op2p or pp > 2.0)
                  and (cp == 1.0 or flash)
                  and (ep == 1.0 or prec != _FP16)
                  and (tp == 1.0 or sp or moe == 0.0)
                  and not (tco and not sp)
                  and not (tco and sp and not _within(tp, domain, n_acc <= domain))
                  and not (opg and not ogr and zero >= 1)
                  and not (zero >= 2 and pp > 1.0)
                  and (not a2a or (ep > 1.0 and rc != 2 and (pp == 1.0 or v > 1.0) and mtp <= 1.0))
                  and (not deepep or moe == 0.0 or (etp * ep > 1.0 and domain <= _DEEPEP_NVL))
                  and _pick(supported, prec) != 0.0)
    return sp, dp, group, valid, n_acc, m_exact, m, realizable


@njit(**_INLINE)
def _key_rules(w, s, tp, cp, ep, etp, sp):
    """The rules of megatron_steps.split that read only knobs of the kernel's step memo
    (``sp``: sequence parallelism as :func:`_split` has it). Each is a division, which the
    kernel's vector loop is bound by: the memo computes them once per key."""
    heads, kv_heads, experts, moe = w[2], w[3], w[5], w[6]
    return (_divides(heads, tp) and _divides(kv_heads, tp)
            and (cp == 1.0 or _divides(s, 2.0 * cp))
            and (not sp or _divides(s, tp * cp))
            and (_divides(experts, ep) if moe != 0.0 else ep == 1.0)
            and (moe == 0.0 or _divides(w[10], etp)))


# --------------------------------------------------------------- 2. hardware

@njit(**_INLINE)
def _low_bits(prec):
    """megatron_steps.hardware's ``low_bits``: FP8 or FP4 GEMMs (precision codes 2 and 3)."""
    return prec == 2 or prec == 3


@njit(**_INLINE)
def _hardware(f, c, prec):
    """megatron_steps.hardware: the precision code's peaks and plateaus, fitted constants applied."""
    peak_gemm = _pick(f[0], prec)
    peak16 = _pick(f[1], prec)
    plateau = _pick(f[2], prec) * c[0] * (c[1] if _low_bits(prec) else 1.0)
    plateau16 = _pick(f[3], prec) * c[0]
    grad_bytes = 2.0 if prec == 1 else 4.0
    return peak_gemm, peak16, plateau, plateau16, grad_bytes


# ------------------------------------------------------------ 3. layer times

#: Rows of the kernel's log scratch: one per GEMM whose size-curve log it takes.
#: (A multi-head latent attention's q down projection, or its direct q projection, is G_QKV's.)
(G_QKV, G_PROJ, G_CORE, G_FC1, G_FC2, G_MOE1, G_MOE2, G_SH1, G_SH2, G_ROUTER, G_HEAD,
 G_QUP, G_KVDOWN, G_KVUP, G_EH) = range(15)
N_GEMMS = 15


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
def _gemm_flops(w, s, tp, cp, ep, etp, mbs, flash, sp):
    """(FLOPs, calls) of every GEMM of layer_times and of the LM head (pipeline), as they compute them.

    Both kernel passes call this, so the durations whose logs the first pass takes are
    the second pass's exactly. The last three are a multi-head latent attention's q up,
    kv down and kv up projections (0 for other attention; its q down or direct q
    projection is ``f_qkv``).
    """
    h, d, experts, gated, top_k, moe_ffn, shared, vocab = w[1], w[4], w[5], w[7], w[9], w[10], w[11], w[13]
    mla, q_lora, kv_lora, rope, qk_dim, core_dim = w[25], w[26], w[27], w[28], w[29], w[30]
    s_local, tokens, heads_t, kv_t, ffn_t = _local(w, s, tp, cp, mbs)
    if mla != 0.0:
        down_tok = tokens / (tp if sp else 1.0)
        if q_lora != 0.0:
            f_qkv = 2.0 * down_tok * h * q_lora
            f_qup = 2.0 * tokens * q_lora * heads_t * qk_dim
        else:
            f_qkv = 2.0 * tokens * h * heads_t * qk_dim
            f_qup = 0.0
        f_kvdown = 2.0 * down_tok * h * (kv_lora + rope)
        f_kvup = 2.0 * tokens * kv_lora * heads_t * (qk_dim - rope + d)
    else:
        f_qkv = 2.0 * tokens * h * (heads_t + 2.0 * kv_t) * d
        f_qup = f_kvdown = f_kvup = 0.0
    f_proj = 2.0 * tokens * heads_t * d * h
    f_core = 4.0 * mbs * heads_t * s_local * s * core_dim * (0.5 if flash else 1.0)
    calls_core = mbs * heads_t
    f_fc1, f_fc2 = _mlp_flops(tokens, ffn_t, h, gated)
    calls_moe = experts / (ep * 1.0)
    f_moe1, f_moe2 = _mlp_flops(tokens * top_k * (etp / (tp * 1.0)), moe_ffn / etp, h, gated)
    f_sh1, f_sh2 = _mlp_flops(tokens, shared * moe_ffn / tp, h, gated)
    f_router = 2.0 * (tokens / (tp if sp else 1.0)) * h * experts  # the SP slice [31]
    f_head = 2.0 * tokens * h * _vocab_per_rank(vocab, tp)  # padded [41]
    f_eh = 4.0 * tokens * h * h / tp  # a multi-token prediction module's projection
    return (f_qkv, f_proj, f_core, calls_core, f_fc1, f_fc2, f_moe1, f_moe2, calls_moe, f_sh1, f_sh2,
            f_router, f_head, f_qup, f_kvdown, f_kvup, f_eh)


@njit(**_INLINE)
def _stage_layers(w, pp, first, last):
    """megatron_steps.stage_layers: (uneven, first, middle, last) layers of the stages."""
    set_first, set_last = first > 0.0, last > 0.0
    middle = pp - (1.0 if set_first else 0.0) - (1.0 if set_last else 0.0)
    rest = w[0] - first - last
    n_mid = _max(np.ceil(rest / _max(middle, 1.0)), 0.0) if middle > 0.0 else 0.0
    uneven = (set_first or set_last) and pp > 1.0 and rest >= 0.0 and (middle > 0.0 or rest == 0.0)
    return uneven, first if set_first else n_mid, n_mid, last if set_last else n_mid


@njit(**_INLINE)
def _heavy(w, pp, v, first, last):
    """megatron_steps.heavy_moe_stage: the heaviest stage holds MoE layers only."""
    if not (w[6] != 0.0 and w[21] != 0.0):
        return False
    uneven, n_first, _, _ = _stage_layers(w, pp, first, last)
    if uneven:
        return n_first >= w[21]
    if v > 1.0:
        return pp > 1.0 and (pp - 1.0) * (w[0] / (pp * 1.0 * v)) >= w[21]
    return pp > 1.0 and w[0] - w[21] >= np.ceil(w[0] / (pp * 1.0))


@njit(**_INLINE)
def _layer_times(w, f, c, s, tp, cp, ep, etp, mbs, sp, rc, flash, peak_gemm, peak16, plateau,
                 plateau16, lg, moe_share):
    """megatron_steps.layer_times (``lg``: the logs of the GEMMs' ideal durations, by G_* row;
    ``moe_share``: megatron_steps.heaviest_moe_share)."""
    h, d, moe, gated = w[1], w[4], w[6], w[7]
    top_k, moe_ffn, shared = w[9], w[10], w[11]
    hbm, flash_eff = f[4], f[5]
    log_shift, attn_eff, elem_bytes = c[2], c[4], c[5]
    tile_cost = _tile_cost(c[3], c[0])
    s_local, tokens, heads_t, kv_t, ffn_t = _local(w, s, tp, cp, mbs)
    (f_qkv, f_proj, core_flops, calls_core, _f1, _f2, _m1, _m2, local_experts, _s1, _s2, f_router,
     _fh, f_qup, f_kvdown, f_kvup, f_eh) = _gemm_flops(w, s, tp, cp, ep, etp, mbs, flash, sp)
    norm_split = tp if sp else 1.0
    t_qkv = _gemm(f_qkv, 1.0, peak_gemm, plateau, h, lg[G_QKV], log_shift, tile_cost)
    if w[25] != 0.0:  # multi-head latent attention: its four projections, summed as layer_times does
        q_lora, kv_lora = w[26], w[27]
        if q_lora != 0.0:
            t_qkv = t_qkv + _gemm(f_qup, 1.0, peak_gemm, plateau, q_lora, lg[G_QUP], log_shift,
                                  tile_cost)
        t_qkv = t_qkv + (_gemm(f_kvdown, 1.0, peak_gemm, plateau, h, lg[G_KVDOWN], log_shift,
                               tile_cost)
                         + _gemm(f_kvup, 1.0, peak_gemm, plateau, kv_lora, lg[G_KVUP], log_shift,
                                 tile_cost))
    t_proj = _gemm(f_proj, 1.0, peak_gemm, plateau, heads_t * d, lg[G_PROJ], log_shift, tile_cost)
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
                            tile_cost, lg[G_FC1], lg[G_FC2])
    elementwise = _mbt(elem_bytes * tokens * h / norm_split, hbm)
    attn_gemms_f = t_qkv + t_proj
    if w[25] != 0.0:  # multi-head latent attention's norms, RoPE and concatenations
        attn_gemms_f = attn_gemms_f + _mbt(
            4.0 * (w[26] + w[27]) * (tokens / norm_split) + 4.0 * w[28] * (heads_t + 1.0) * tokens
            + 8.0 * heads_t * w[29] * tokens, hbm)
    t_dense_f = attn_gemms_f + t_mlp_dense + elementwise
    if moe != 0.0:
        routed = tokens * top_k * (etp / (tp * 1.0))
        t_moe = _mlp_time(routed, moe_ffn / etp, local_experts, h, gated, hbm, peak_gemm, plateau,
                          log_shift, tile_cost, lg[G_MOE1], lg[G_MOE2])
        if shared != 0.0:
            t_shared = _mlp_time(tokens, shared * moe_ffn / tp, 1.0, h, gated, hbm, peak_gemm,
                                 plateau, log_shift, tile_cost, lg[G_SH1], lg[G_SH2])
        else:
            t_shared = 0.0
        t_moe = t_moe + t_shared
        t_moe = t_moe + _gemm(f_router, 1.0, peak16, plateau16, h, lg[G_ROUTER], log_shift, tile_cost)
        permutes = ((3.0 * top_k + 2.0) * (tokens / norm_split)
                    + (4.0 * routed if local_experts > 1.0 else 0.0))
        t_moe = t_moe + _mbt(2.0 * permutes * h, hbm)
        t_moe_f = attn_gemms_f + t_moe + elementwise
    else:
        t_moe_f = t_shared = 0.0
    layer_f = (1 - moe_share) * t_dense_f + moe_share * t_moe_f
    t_tp_gemms_f = t_qkv + t_proj + (1 - moe_share) * t_mlp_dense + moe_share * t_shared
    layer_b = 2.0 * layer_f + t_core_b
    layer_b = layer_b + ((layer_f + t_core_f) if rc == 2 else (t_core_f if rc == 1 else 0.0))
    layer_f = layer_f + t_core_f
    act_bytes = 2.0 * tokens * h
    t_mtp = 3.0 * (_gemm(f_eh, 1.0, peak_gemm, plateau, 2.0 * h, lg[G_EH], log_shift, tile_cost)
                   + _mbt(_MTP_BYTES * tokens * h / norm_split, hbm))
    return (s_local, tokens, kv_t, norm_split, act_bytes, t_core_f, t_core_b, layer_f, layer_b, t_mtp,
            t_tp_gemms_f)


# ---------------------------------------------------------- 4. communication

@njit(**_INLINE)
def _communication(w, f, c, tp, cp, ep, etp, sp, rc, tco, tokens, kv_t, norm_split, act_bytes,
                   t_core_f, t_core_b, low_bits, whole, single, moe_share, t_tp_gemms_f, deepep):
    """megatron_steps.communication (``whole``: the job fits in one NVLink domain;
    ``single``: one EP group spans the job; ``deepep``: ``moe_enable_deepep``)."""
    d, moe, top_k, shared = w[4], w[6], w[9], w[11]
    domain, up_bw0, out_bw0, up_lat, out_lat = f[6], f[7], f[8], f[9], f[10]
    up_bw, out_bw = up_bw0 * c[7], out_bw0 * c[8]
    call_lat, overlap_eff = c[11], c[9]
    inside = _within(tp, domain, whole)
    tp_bw, tp_lat = (up_bw if inside else out_bw), (up_lat if inside else out_lat)
    t_ar = (_coll_1(act_bytes, tp, tp_bw, tp_lat) + _coll_1(act_bytes / 2.0, tp, tp_bw, tp_lat)
            if (low_bits and sp) else _coll_ar(act_bytes, tp, tp_bw, tp_lat)) \
        + ((call_lat * (2.0 if sp else 1.0)) if tp > 1.0 else 0.0)
    full = rc == 2
    mlp_pairs = ((1.0 - moe_share) + moe_share * (1.0 if shared != 0.0 else 0.0)) if moe != 0.0 else 1.0
    tp_calls = (w[31] + mlp_pairs) * (2.0 + (1.0 if full else 0.0))
    tp_total = tp_calls * t_ar
    if w[25] != 0.0 and sp:  # multi-head latent attention's four collectives a direction
        t_lat = _coll_ar(0.0, tp, tp_bw, tp_lat) + (2.0 * call_lat if tp > 1.0 else 0.0)
        tp_total = tp_total + ((2.0 - w[31]) * (2.0 + (1.0 if full else 0.0))) * t_lat
    again_f = 2.0 if full else 1.0
    tp_f = tp_total / (1.0 + again_f)
    tp_b = tp_total - tp_f
    tp_hidden = overlap_eff if (tco and sp and w[25] == 0.0) else 0.0
    tp_layer_f = tp_f - tp_hidden * _min(tp_f, t_tp_gemms_f)
    tp_layer = tp_layer_f + (tp_b - tp_hidden * _min(tp_b, (1.0 + again_f) * t_tp_gemms_f))
    kv_bytes = 2.0 * 2.0 * tokens * kv_t * w[30]
    inside = _within(tp * cp, domain, whole)
    cp_bw, cp_lat = (up_bw if inside else out_bw), (up_lat if inside else out_lat)
    cp_step = kv_bytes / cp_bw + cp_lat + call_lat
    cp_f = (cp - 1.0) * cp_step
    again = rc >= 1  # a recomputed core (selective or full) runs its ring again
    cp_total = (4.0 if again else 3.0) * cp_f
    ring_f = (cp - 1.0) * _exposed(cp_step, t_core_f / cp, 1.0)
    cp_layer_f = ring_f
    cp_layer_b = (cp - 1.0) * _exposed(2.0 * cp_step, t_core_b / cp, 1.0) + (ring_f if again else 0.0)
    cp_layer = cp_layer_f + cp_layer_b
    if moe != 0.0:
        span = etp * ep
        near = ep if _within(span, domain, whole) else _min(_max(
            float(math.gcd(int(domain), int(span)) // int(etp)), 1.0), ep)
        if single and not _within(span, domain, whole) and int(domain) % int(etp) == 0:
            tail = int(span) % int(domain)  # (a memo miss: its divisions cost nothing)
            near = _max(near, float((tail if tail != 0 else int(domain)) // int(etp)))
        a2a = _a2a_split(act_bytes * top_k / norm_split, ep, near, up_bw, up_lat, out_bw, out_lat) \
            + (call_lat if ep > 1.0 else 0.0)
        routed_bytes = act_bytes * top_k * (etp / (tp * 1.0))
        inside = _within(etp, domain, whole)
        etp_bw, etp_lat = (up_bw if inside else out_bw), (up_lat if inside else out_lat)
        dispatch_tp = (_coll_1(routed_bytes, etp, etp_bw, etp_lat)
                       + _coll_1(routed_bytes, etp, etp_bw, etp_lat)
                       + (2.0 * call_lat if etp > 1.0 else 0.0))
        if deepep:  # the flex dispatcher (megatron_steps.flex_dispatch_time)
            moe_f = 2.0 * _flex(act_bytes / norm_split, w[5], top_k, ep, etp * ep, near, up_bw, up_lat,
                                out_bw, out_lat, call_lat)
        else:
            moe_f = 2.0 * a2a + dispatch_tp
        ep_layer = moe_share * (2.0 + (1.0 if full else 0.0)) * moe_f
        ep_layer_f = moe_share * moe_f
        ep_layer_b = moe_share * (1.0 + (1.0 if full else 0.0)) * moe_f
    else:
        ep_layer = ep_layer_f = ep_layer_b = 0.0
    return (up_bw, out_bw, tp_total, tp_layer, cp_total, cp_layer, ep_layer, cp_layer_f, cp_layer_b,
            ep_layer_f, ep_layer_b, tp_layer_f)


# --------------------------------------------------------------- 5. pipeline

@njit(**_INLINE)
def _p2p_split(tp, sp, scatter_gather):
    """megatron_steps.p2p_split: the TP split of a pipeline send."""
    return tp if (sp or scatter_gather) else 1.0


@njit(**_INLINE)
def _p2p_steady_sends(v, m, overlap):
    """megatron_steps.p2p_steady_sends."""
    return m if v == 1.0 else (0.0 if overlap else m * v)


@njit(**_INLINE)
def _vocab_per_rank(vocab, tp):
    """megatron_steps.vocab_per_rank: a TP rank's vocabulary entries, padded [41]."""
    return np.ceil(vocab / (_VOCAB_DIVISOR * tp)) * _VOCAB_DIVISOR


@njit(**_INLINE)
def _head(w, f, c, tp, tokens, peak16, plateau16, lg_head):
    """megatron_steps.pipeline's LM head time (forward and backward GEMMs, cross entropy)."""
    h, vocab = w[1], w[13]
    hbm = f[4]
    log_shift = c[2]
    vocab_t = _vocab_per_rank(vocab, tp)  # padded [41]
    f_head = 2.0 * tokens * h * vocab_t  # as _gemm_flops computes it
    return 3.0 * _gemm(f_head, 1.0, peak16, plateau16, h, lg_head, log_shift,
                       _tile_cost(c[3], c[0])) \
        + _mbt(_CE_BYTES * tokens * vocab_t, hbm)


@njit(**_INLINE)
def _pipeline(w, f, c, tp, pp, cp, v, dp, m, rc, act_bytes, layer_f, layer_b, tp_phases,
              cp_layer_f, cp_layer_b, ep_layer_f, ep_layer_b, up_bw, out_bw, t_head, sends,
              p2p_steady, p2p_gather, n_acc, mtp, t_mtp_module, stages, paired):
    """megatron_steps.pipeline (``t_head`` from :func:`_head`; ``sends``: a p2p send's bytes,
    ``act_bytes`` over its TP split (:func:`_p2p_split`), and the all-gather of a split
    send on arrival with its call, :func:`_p2p_gather_call`;
    ``p2p_steady``: :func:`_p2p_steady_sends`;
    ``p2p_gather``: 1.0 where the split slices are all-gathered over TP on arrival (no
    SP), else 0.0; ``tp_phases``: TP's exposed time forward and backward;
    ``stages``: the first and the last stage's layers; ``paired``: the
    share the combined 1F1B schedule pairs, :func:`_combined_1f1b_paired`). (One tuple for
    the stages: a call of more than 30 arguments compiles to one with ``*args``, which
    numba does not inline.)"""
    first, last = stages
    layers = w[0]
    domain, up_lat, out_lat = f[6], f[9], f[10]
    layer_overhead, call_lat = c[6], c[11]
    uneven, n_first, n_mid, n_last = _stage_layers(w, pp, first, last)
    layers_stage = _max(_max(n_first, n_mid), n_last) if uneven else np.ceil(layers / (pp * 1.0))
    tp_layer_f, tp_layer_b = tp_phases
    own_f = layer_f + tp_layer_f + cp_layer_f
    own_b = layer_b + tp_layer_b + cp_layer_b
    gpu_f, gpu_b = own_f + ep_layer_f, own_b + ep_layer_b
    floor_b = layer_overhead * (2.0 + (1.0 if rc == 2 else 0.0))
    window_f = _max(gpu_f, layer_overhead)
    window_b = _max(gpu_b, floor_b)
    # combined 1F1B (megatron_steps.pipeline)
    eta = c[9]
    hide = _min(ep_layer_f, eta * own_b) + _min(ep_layer_b, eta * own_f)
    pair = _max(gpu_f + gpu_b - hide, layer_overhead + floor_b)
    alone = window_f + window_b
    saved = alone - pair
    a2a_hidden = paired * saved
    a2a_launch = paired * _min(saved, (window_f - gpu_f) + (window_b - gpu_b))
    per_layer = alone - a2a_hidden
    t_layers = layers_stage * per_layer
    t_mtp = mtp * (per_layer + t_head + t_mtp_module)
    stage_max = t_layers + (t_head + t_mtp)
    t_mtp_alone = mtp * (alone + t_head + t_mtp_module)  # (the bubble's: unpaired)
    bubble = (pp - 1.0) / (v * 1.0) * (layers_stage * alone)
    t_last = n_last * per_layer + (t_head + t_mtp)
    t_other = _max(n_first, n_mid) * per_layer
    last_paced = 1.0 if (not uneven or t_last >= t_other) else 0.0
    paced_layers = (n_last if t_last >= t_other else _max(n_first, n_mid)) if uneven else layers_stage
    slack = 0.0
    if uneven:
        stage_max = _max(t_other, t_last)
        # the priced stage's wait for the paced one (megatron_steps.pipeline)
        slack = stage_max - (t_last if n_last >= _max(n_first, n_mid) else t_other)
        # the other stages' times: the fill and the drain (megatron_steps.pipeline)
        a_first, a_mid = n_first * alone, n_mid * alone
        a_last = n_last * alone + (t_head + t_mtp_alone)
        a_max = _max(_max(a_first, a_mid), a_last)
        bubble = (a_first + (pp - 2.0) * a_mid + a_last - a_max) / (v * 1.0)
    t_pipe = m * stage_max + bubble
    whole = n_acc <= domain
    stride = tp * cp * dp
    q = domain / stride  # stages per domain
    cross = 0.0 if whole else (1.0 if q <= 1.0 else _min(
        1.0, (1.0 if np.floor(q) == q else 2.0) * stride * (1.0 / domain)))
    send, gather_call = sends
    t_in = send * (1.0 / up_bw) + up_lat + call_lat
    t_out = send * (1.0 / out_bw) + out_lat + call_lat
    t_ramp = cross * t_out + (1.0 - cross) * t_in
    t_slow = t_out if cross > 0.0 else t_in
    # legacy scatter/gather: all-gathered over TP on arrival [26]; p2p_gather is 0 or 1,
    # a factor and not a branch, so that the layout loop stays branch-free here
    gather = p2p_gather * gather_call
    t_pp = 2.0 * ((t_ramp + gather) * (pp * v - 1.0) + (t_slow + gather) * p2p_steady) \
        if pp > 1.0 else 0.0
    return (layers_stage, paced_layers, last_paced, bubble, t_pipe, t_pp, window_f, window_b, q, slack,
            a2a_hidden, a2a_launch)


@njit(**_INLINE)
def _p2p_gather_call(f, c, tp, act_bytes, whole):
    """megatron_steps.pipeline's all-gather of a split send over TP on arrival and its
    call (``whole``: the job fits in one NVLink domain): knobs of the step memo only."""
    domain, up_lat, out_lat = f[6], f[9], f[10]
    up_bw, out_bw = f[7] * c[7], f[8] * c[8]  # as _communication computes them
    tp_in = _within(tp, domain, whole)
    return _coll_1(act_bytes, tp, up_bw if tp_in else out_bw, up_lat if tp_in else out_lat) + c[11]


@njit(**_INLINE)
def _combined_1f1b_paired(pp, v, m, on):
    """megatron_steps.combined_1f1b_paired."""
    mv = m * v
    warm = 2.0 * (pp - 1.0) + (v - 1.0) * pp + 1.0 if pp > 1.0 else 1.0
    return _max(mv - warm, 0.0) / mv if on else 0.0


# ---------------------------------------------------------- 6. data parallel

@njit(**_INLINE)
def _dp_tp_terms(w, f, tp, ep, etp):
    """The terms of megatron_compose.data_parallel that read only knobs of the kernel's
    step memo, each a division: the embedding matrices of an unpipelined model's stage
    and one embedding matrix a TP rank holds, the vocabulary padded (megatron_compose.
    _stage_params), the ranks a domain holds
    of TP and of expert groups (as :func:`_data_parallel` had them, the same bits), and
    the reciprocals of the DP and expert-DP peers' strides (megatron_compose.straddled_peers)."""
    domain = f[6]
    emb_t = _vocab_per_rank(w[13], tp) * w[1]
    return (emb_t * w[44], emb_t, _max(np.floor(domain / tp), 1.0),
            _max(np.floor(domain / (etp * ep)), 1.0), 1.0 / tp, 1.0 / (etp * ep))


@njit(**_INLINE)
def _straddled(domain, inv_domain, span, inv_stride, divides, n_acc):
    """megatron_compose.straddled_peers, with selects only and no division (the loop stays
    vectorized and its divisions as many): ``divides``: the stride divides the domain;
    ``inv_domain``: 1 / domain (f[14]); ``inv_stride``: 1 / stride (the step memo's); the
    remainder from a rounded quotient, corrected to be exact."""
    t = span - np.floor(span * inv_domain) * domain
    t = t + domain if t < 0.0 else t
    t = t - domain if t >= domain else t
    d2 = float(int(domain) & -int(domain))  # loop invariant
    whole2 = np.floor(span * (1.0 / d2)) * d2 == span  # exact: d2 a power of two
    fewest = (t if t != 0.0 else domain) if span == n_acc else (d2 if whole2 else 1.0)
    return _max(fewest * inv_stride, 1.0) if divides else 1.0


@njit(**_PRIM)
def _fsdp_collectives(params, n, rpd, grad_bytes, flat, fsdp_bw, fsdp_lat, up_bw, up_lat, out_bw,
                      out_lat):
    """One FSDP group's gather and reduce-scatter of ``params`` over ``n`` ranks, ``rpd`` of
    them in a domain, and their latency steps: a flat ring at ``fsdp_bw`` where ``flat``
    (own_nic, or inside one domain), else megatron_compose's two_level (a time a byte and
    the latency steps, one division for every byte count)."""
    if flat:
        return (_coll_1(_WB * params, n, fsdp_bw, fsdp_lat),
                _coll_1(params * grad_bytes, n, fsdp_bw, fsdp_lat), (n - 1.0) * fsdp_lat)
    g = _min(rpd, n)
    d = n / g
    per_byte = (g - 1.0) / g / up_bw + (d - 1.0) / d / (g * out_bw)
    steps = (g - 1.0) * up_lat + (d - 1.0) * out_lat
    return _WB * params * per_byte + steps, params * grad_bytes * per_byte + steps, steps


@njit(**_PRIM)
def _fsdp_traffic(w, c, heavy_stage, heavy, expert_stage_params, expert_group, group, rpd_g, rpd_e,
                  grad_bytes, layers_stage, m, up_bw, up_lat, out_bw, out_lat, inside, own_nic):
    """:func:`_data_parallel`'s FSDP gathers and reduce-scatters of a step (megatron_compose's
    t_fsdp_gather and t_fsdp_rs), a function of its own: inlined, the branch slowed the
    kernel's loop for every layout (about 5 %, an interleaved A/B, 2026-12-06)."""
    moe = w[6]
    fsdp_bw, fsdp_lat = (up_bw if inside else out_bw), (up_lat if inside else out_lat)
    # layer by layer: each layer after the first pays the collective's latency steps
    # (a flat ring's n - 1, else the two-level's) and the call cost
    flat = own_nic or inside
    t_g, t_rs, steps_lat = _fsdp_collectives(heavy, group, rpd_g, grad_bytes, flat, fsdp_bw, fsdp_lat,
                                             up_bw, up_lat, out_bw, out_lat)
    fsdp_call = (layers_stage - 1.0) * (steps_lat + c[11]) if group > 1.0 else 0.0
    t_fsdp_gather = m * (2.0 * t_g + 2.0 * fsdp_call)
    t_fsdp_rs = m * (t_rs + fsdp_call)
    if moe != 0.0:  # the experts over the expert DP group
        moe_share = 1.0 if heavy_stage else w[12]  # (Layer.moe_share, as _memo_row has it)
        t_g, t_rs, steps_lat_e = _fsdp_collectives(expert_stage_params, expert_group, rpd_e, grad_bytes,
                                                   flat, fsdp_bw, fsdp_lat, up_bw, up_lat, out_bw,
                                                   out_lat)
        fsdp_call_e = (layers_stage * moe_share - 1.0) * (steps_lat_e + c[11]) \
            if expert_group > 1.0 else 0.0
        t_fsdp_gather = t_fsdp_gather + m * (2.0 * t_g + 2.0 * fsdp_call_e)
        t_fsdp_rs = t_fsdp_rs + m * (t_rs + fsdp_call_e)
    return t_fsdp_gather, t_fsdp_rs


@njit(**_INLINE)
def _data_parallel(w, f, c, tp, pp, v, heavy_stage, ep, etp, group, zero, m, ogr, opg, grad_bytes,
                   layers_stage, window_f, window_b_alone, t_pipe, up_bw, out_bw, n_acc, q, mtp, slack,
                   a2a_hidden, tp_terms, own_nic):
    """megatron_compose.data_parallel (with _stage_params; ``q``: the domain over tp x group,
    the stages per domain :func:`_pipeline` has; ``heavy_stage``: :func:`_heavy`; ``slack``:
    the priced stage's wait a microbatch, :func:`_pipeline`'s; ``a2a_hidden``: what the
    combined 1F1B schedule takes off a paired backward's window, :func:`_pipeline`'s;
    ``tp_terms``: :func:`_dp_tp_terms`; ``own_nic``: the ``fsdp_own_nic`` knob)."""
    window_b = window_b_alone - a2a_hidden
    moe = w[6]
    dense_scale, expert_scale = (w[35], w[36]) if heavy_stage else (w[14], w[15])
    hbm, domain, up_lat, out_lat = f[4], f[6], f[9], f[10]
    eta = c[9]
    # _stage_params
    layers_mtp = layers_stage + mtp
    head_tp, emb_tp, ranks_up, ranks_up_expert, inv_tp, inv_e = tp_terms
    dup = w[43] if heavy_stage else w[41]
    dense_stage_params = ((dense_scale - dup) * layers_mtp + mtp * w[40]) / tp + dup * layers_mtp \
        + head_tp * (1.0 if pp == 1.0 else 0.0)
    expert_stage_params = expert_scale * layers_mtp / (etp * ep * 1.0) if moe != 0.0 else 0.0
    heavy = dense_stage_params + emb_tp * ((1.0 if pp > 1.0 else 0.0) * (1.0 + (1.0 if mtp > 0.0 else 0.0)))
    # Hardware.within(tp * group): tp * group <= domain and it divides the domain (or the
    # job fits in one), from q = domain / (tp * group) without a division of its own; or the
    # span covers whole domains (a multiple of the domain: rounded, then checked exactly,
    # f[14] = 1 / domain) whose width the peers' stride divides (ranks_up is floor(domain /
    # stride), so a product checks it). Else the fewest peers a domain holds of a group that
    # straddles domains (megatron_compose.straddled_peers).
    inside = q >= 1.0 and (np.floor(q) == q or n_acc <= domain)
    span = tp * group
    covers = np.floor(span * f[14] + 0.5) * domain == span
    divides, divides_e = ranks_up * tp == domain, ranks_up_expert * (etp * ep) == domain
    ranks_up = _min(ranks_up, group) if inside or (covers and divides) \
        else _straddled(domain, f[14], span, inv_tp, divides, n_acc)
    ranks_up_expert = ranks_up_expert if inside or (covers and divides_e) \
        else _straddled(domain, f[14], span, inv_e, divides_e, n_acc)
    expert_group = _max(np.floor(tp * group / (etp * ep)), 1.0)
    grads_dense = heavy * grad_bytes
    grads_expert = expert_stage_params * grad_bytes
    sharded = zero >= 1
    rpd_g = _min(ranks_up, group)
    rpd_e = _min(ranks_up_expert, expert_group)
    params_bytes = _WB * (heavy + expert_stage_params)
    fsdp = zero == 3
    # Only the branch np.where keeps is computed (the same expressions, so the same bits).
    t_fsdp = exp_fsdp = t_grad = t_gather = exp_grad = exp_gather = 0.0
    if fsdp:
        t_fsdp_gather, t_fsdp_rs = _fsdp_traffic(w, c, heavy_stage, heavy, expert_stage_params,
                                                 expert_group, group, rpd_g, rpd_e, grad_bytes,
                                                 layers_stage, m, up_bw, up_lat, out_bw, out_lat,
                                                 inside, own_nic)
        t_fsdp = t_fsdp_gather + t_fsdp_rs
        # blocking gathers; only the reduce-scatter hides behind the backward [29]
        idle = m * slack
        if opg:
            exp_fsdp = _exposed_idle(t_fsdp, t_pipe - idle, eta, idle)
        elif ogr:
            exp_fsdp = t_fsdp_gather + _exposed_idle(t_fsdp_rs, m * layers_stage * window_b, eta, idle)
        else:
            exp_fsdp = t_fsdp_gather + t_fsdp_rs
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
        stage_b = layers_stage * (window_b if zero == 2 else window_b_alone)
        stage_f = layers_stage * window_f
        chunk = 1.0 / v  # the one model chunk's share left exposed under interleaving
        per_microbatch = m if zero == 2 else 1.0
        # ZeRO-2's per-microbatch reduce-scatter alone hides in the wait (megatron_compose)
        idle_grad = slack if zero == 2 else 0.0
        exp_grad = per_microbatch * ((_exposed_idle(t_grad, stage_b, eta, idle_grad) * chunk) if ogr
                                     else t_grad)
        t_grad = per_microbatch * t_grad
        exp_gather = (_exposed(t_gather, stage_f, eta) * chunk) if opg else t_gather
    local_params = heavy / (group if sharded else 1.0) + (
        expert_stage_params / (expert_group if sharded else 1.0) if moe != 0.0 else 0.0)
    t_opt = _mbt(_OPT_BYTES * local_params, hbm)
    t_dp_total = t_fsdp if fsdp else t_grad + t_gather
    t_dp = exp_fsdp if fsdp else exp_grad + exp_gather
    return heavy, expert_stage_params, expert_group, params_bytes, t_dp_total, t_dp, t_opt


# ----------------------------------------------------------------- 7. memory

@njit(**_PRIM)
def _activation_bytes(mbs, s, h, heads, attention0, mlp_scale, top_k, t, sp, rc, flash,
                      low_bits, width_over_h, latent, context_ratio, gather, hidden_masks, score_masks):
    """megatron_memory.layer_activation_bytes (``attention0``: its ``attention_bytes``,
    ``mlp_scale`` = (4 + 2 gated) * mlp_width: the workload-only parts, computed in Python;
    ``hidden_masks``, ``score_masks``: whether each dropout keeps its masks)."""
    sbh = mbs * s * h
    spt = t if sp else 1.0
    fp8_replicated = (1.0 if top_k > 0 else 2.0) if low_bits else 0.0
    # a fused attention keeps its 16-bit output unless selective recompute reruns it
    fp8_split = (width_over_h + (-1.0 if (flash and rc == 0) else 1.0) * context_ratio) if low_bits else 0.0
    replicated = (8.0 + (2.0 if hidden_masks else 0.0) - fp8_replicated + latent) / spt
    attention = attention0 / t
    mlp = (mlp_scale / h - fp8_split) / t
    mlp = mlp + top_k * gather * (1.0 if low_bits else 2.0)
    scores = 0.0 if (flash or rc >= 1) else (5.0 if score_masks else 2.0) * heads * s / (h * t)
    per_layer = sbh * (replicated + attention + mlp + scores)
    full = 2.0 * sbh / spt
    return full if rc == 2 else per_layer


@njit(**_PRIM)
def _state_bytes(group, zero, grad_bytes):
    """megatron_memory.state_bytes."""
    copy = _MGB if grad_bytes < _MGB else 0.0
    per = 1.0 / group
    sharded = per if zero >= 1 else 1.0
    return (_WB * (per if zero >= 3 else 1.0), grad_bytes * (per if zero >= 2 else 1.0),
            (_ASB + copy) * sharded, copy * sharded)


# _rank_layers and _rank: compiled once and inlined by LLVM (_PRIM), not copied into each
# call by numba (inline="always"): copied into the five calls of each of the kernel's three
# block loops, the first call (compiling) took 147 s, against 84 s this way and 55 s at
# 041b881; copied, the loop with no stage set ran 1.06-1.08x faster, this way about as fast
# as 041b881 (1M layouts, 1 thread, 5 interleaved rounds, 2026-12-05, unsaved)
@njit(**_PRIM)
def _rank_layers(w, r, nf, nm, nl, held, last_rank, v, mixed):
    """megatron_steps.pipeline_ranks, one rank: (rank, layers, dense layers, first, last)."""
    is_first, is_last = r == 0.0, r == last_rank
    n = nf if is_first else (nl if is_last else nm)
    if w[6] == 0.0:
        dense_n = n
    elif not mixed:
        dense_n = 0.0 * n
    else:
        start = 0.0 if is_first else (held - nl if is_last else nf + (r - 1.0) * nm)
        c, period = n / v, held / v
        left = w[21] - start / v
        jf = _min(_max(np.floor((left - c) / period) + 1.0, 0.0), v)
        dense_n = c * jf + (_min(_max(left - jf * period, 0.0), c) if jf < v else 0.0)
    return r, n, dense_n, 1.0 if is_first else 0.0, 1.0 if is_last else 0.0


@njit(**_PRIM)
def _rank(moe, pp, v, rank, n, dense_n, first, last, dense_l, moe_l, expert_l, head, one_stage, emb,
          act_dense, act_moe, tail, inv_v, mv, buffers, state, state_e, sc, sce, mtp_all, mtp_l, best,
          extra):
    """One rank of megatron_compose.memory's loop: (params, experts, activations, footprint),
    or ``best``'s where its footprint is not larger (``extra``: 1.0 where combined 1F1B
    pairs, and the recompute working sets, dense and MoE). Without experts (``moe`` 0.0, a constant
    in :func:`~.megatron_kernel._price_block_dense_even`) the terms that are 0.0 are left out, the
    same bits: numpy adds exact zeros."""
    paired, work_dense, work_moe, mask = extra
    mtp = mtp_all * last
    copies = one_stage if pp == 1.0 else first + last * head
    chunks = pp * v + pp - 1 - 2.0 * rank if v > 1.0 else pp - rank
    if moe != 0.0:
        moe_n = n - dense_n
        params = dense_n * dense_l + moe_n * moe_l + mtp * mtp_l + emb * copies
        experts = (moe_n + mtp) * expert_l
        one = _max(act_moe if moe_n > 0.0 else 0.0, act_dense if dense_n > 0.0 else 0.0)
        work = _max(work_moe if moe_n > 0.0 else 0.0, work_dense if dense_n > 0.0 else 0.0)
        act = (dense_n * act_dense + moe_n * act_moe + first * mask) * (inv_v * _min(chunks, mv)) \
            + paired * one + _max(work, last * tail)
        foot = params * state + experts * state_e + _max(act + buffers - (params * sc + experts * sce), 0.0)
    else:
        params = dense_n * dense_l + mtp * mtp_l + emb * copies
        experts = 0.0
        one = _max(0.0, act_dense if dense_n > 0.0 else 0.0)
        work = _max(0.0, work_dense if dense_n > 0.0 else 0.0)
        act = (dense_n * act_dense + first * mask) * (inv_v * _min(chunks, mv)) + paired * one \
            + _max(work, last * tail)
        foot = params * state + _max(act + buffers - params * sc, 0.0)
    return (params, experts, act, foot) if foot > best[3] else best


@njit(**_INLINE)
def _memory_terms(w, s_local, tp, etp, ep, mbs, sp, rc, flash, prec, hidden_masks, score_masks):
    """The terms of megatron_compose.memory that read only knobs of the kernel's step memo
    (and the dropouts' masks, which its key holds): a layer's activations, dense and MoE,
    the logits' bytes over TP, ``1 / tp`` and an expert's parameters per rank. They hold
    most of its divisions, which the kernel's vector loop is bound by: the memo computes
    them once per key. (:func:`_memory`, the same expressions, the same bits.)"""
    h, heads, moe, top_k, vocab = w[1], w[2], w[6], w[9], w[13]
    attention0, mlp_dense, mlp_moe = w[17], w[18], w[19]
    low_bits = _low_bits(prec)
    latent = w[39] if low_bits else w[32]  # multi-head latent attention's, by precision
    act_dense = _activation_bytes(mbs, s_local, h, heads, attention0, mlp_dense, 0.0, tp, sp, rc, flash,
                                  low_bits, w[23], latent, w[33], 1.0, hidden_masks, score_masks)
    act_moe = act_dense
    if moe != 0.0:
        act_moe = _activation_bytes(mbs, s_local, h, heads, attention0, mlp_moe, top_k, tp, sp, rc, flash,
                                    low_bits, w[24], latent, w[33], etp / (tp * 1.0), hidden_masks,
                                    score_masks)
    # a recomputed layer's working set (megatron_memory.recompute_working_bytes)
    work_dense, work_moe = 0.0, 0.0
    if rc != 0:
        work_dense = _activation_bytes(mbs, s_local, h, heads, attention0, mlp_dense, 0.0, tp, sp, 0,
                                       flash, low_bits, w[23], latent, w[33], 1.0, hidden_masks,
                                       score_masks) - act_dense
        work_moe = work_dense
        if moe != 0.0:
            work_moe = _activation_bytes(mbs, s_local, h, heads, attention0, mlp_moe, top_k, tp, sp, 0,
                                         flash, low_bits, w[24], latent, w[33], etp / (tp * 1.0),
                                         hidden_masks, score_masks) - act_moe
    # (memory's logits and the head's inputs, before its "* (1 + mtp)")
    logits_tp = 4.0 * mbs * s_local * _vocab_per_rank(vocab, tp) \
        + 4.0 * mbs * s_local * h / (tp if sp else 1.0)
    expert_l = w[36] / (etp * ep * 1.0) if moe != 0.0 else 0.0
    return act_dense, act_moe, logits_tp, 1.0 / tp, expert_l, work_dense, work_moe


@njit(**_INLINE)
def _memory(w, pp, v, m, group, zero, grad_bytes, act_bytes, layers_stage, expert_group,
            params_bytes, heavy, expert_stage_params, send2, mtp, first, last, extra, terms):
    """megatron_compose.memory (with megatron_steps.pipeline_ranks). ``terms``:
    :func:`_memory_terms`; ``send2``: ``2.0 * act_bytes`` over
    the TP split of a p2p send (:func:`_p2p_split`); ``heavy``, ``expert_stage_params``:
    :func:`_data_parallel`'s."""
    moe, emb_params = w[6], w[16]
    act_dense, act_moe, logits_tp, per_tp, expert_l, work_dense, work_moe, emb, mask = terms
    ranks_extra = (extra, work_dense, work_moe, mask)
    shards = group > 1.0 or expert_group > 1.0  # (a group of one rank: no bucket, no gathers)
    bucket = grad_bytes * _min(_max(4e7, 1e6 * group), params_bytes / _WB) if zero >= 2 and shards else 0.0
    gathered = (heavy if group > 1.0 else 0.0) + (expert_stage_params if expert_group > 1.0 else 0.0)
    buffers = (bucket + send2 * (1.0 if pp > 1.0 else 0.0)
               + (1.0 if zero == 3 else 0.0) * 2.0 * _WB * (gathered / layers_stage))
    sw, sg, so, sc = _state_bytes(group, zero, grad_bytes)
    swe, sge, soe, sce = 0.0, 0.0, 0.0, 0.0
    if moe != 0.0:
        swe, sge, soe, sce = _state_bytes(expert_group, zero, grad_bytes)
    state, state_e = sw + sg + so, swe + sge + soe
    # (the rank-independent terms computed once here: LLVM does not hoist them out of the
    # ranks itself, and the loop over configurations ran 1.08x slower for it, unsaved)
    dense_l = (w[38] - w[42]) * per_tp + w[42]
    moe_l = (w[35] - w[43]) * per_tp + w[43]
    mtp_l = (moe_l if moe != 0.0 else dense_l) + w[40] * per_tp
    one_stage = w[22] / emb_params if emb_params != 0.0 else 1.0
    logits = logits_tp * (1 + mtp)
    tail = act_moe * mtp + logits
    inv_v, mv = 1.0 / v, m * v
    head = 1.0 + (1.0 if mtp > 0.0 else 0.0)
    # megatron_steps.pipeline_ranks: ranks 0, 1, (the first MoE layer's and the next), the
    # last; each written out (a loop inside the loop over configurations stops LLVM
    # vectorizing it), its first and last flags as pipeline_ranks compares them
    uneven, n_first, n_mid, n_last = _stage_layers(w, pp, first, last)
    n_even = np.ceil(w[0] / pp)
    nf, nm, nl = (n_first, n_mid, n_last) if uneven else (n_even, n_even, n_even)
    mixed = moe != 0.0 and w[21] != 0.0
    held = nf + (pp - 2.0) * nm + nl
    last_rank = pp - 1.0
    # rank 0
    r, n, dn, fr, la = _rank_layers(w, 0.0 * pp, nf, nm, nl, held, last_rank, v, mixed)
    best = _rank(moe, pp, v, r, n, dn, fr, la, dense_l, moe_l, expert_l, head, one_stage, emb,
                 act_dense, act_moe, tail, inv_v, mv, buffers, state, state_e, sc, sce, mtp, mtp_l,
                 (0.0, 0.0, 0.0, -np.inf), ranks_extra)
    # rank 1 (rank 0 of one stage, the last of two). Behind a first stage that is not set,
    # without leading dense layers, it holds what rank 0 holds but the embedding, with
    # fewer microbatches in flight: never a larger footprint, so the same bits without it.
    # In a block with no stage set (first a constant 0.0: megatron_kernel._price_block_even)
    # of a workload without experts LLVM drops it.
    if first > 0.0 or mixed:
        r, n, dn, fr, la = _rank_layers(w, _min(1.0, last_rank), nf, nm, nl, held, last_rank, v, mixed)
        best = _rank(moe, pp, v, r, n, dn, fr, la, dense_l, moe_l, expert_l, head, one_stage, emb,
                     act_dense, act_moe, tail, inv_v, mv, buffers, state, state_e, sc, sce, mtp, mtp_l,
                     best, ranks_extra)
    if mixed:  # the rank whose first chunk holds the first MoE layer, and the next
        r_moe = 0.0 if w[21] * v < nf else 1.0 + np.floor((w[21] * v - nf) / _max(nm, 1.0))
        r, n, dn, fr, la = _rank_layers(w, _min(r_moe, last_rank), nf, nm, nl, held, last_rank, v, mixed)
        best = _rank(moe, pp, v, r, n, dn, fr, la, dense_l, moe_l, expert_l, head, one_stage, emb,
                     act_dense, act_moe, tail, inv_v, mv, buffers, state, state_e, sc, sce, mtp, mtp_l,
                     best, ranks_extra)
        r, n, dn, fr, la = _rank_layers(w, _min(r_moe + 1.0, last_rank), nf, nm, nl, held, last_rank, v,
                                        mixed)
        best = _rank(moe, pp, v, r, n, dn, fr, la, dense_l, moe_l, expert_l, head, one_stage, emb,
                     act_dense, act_moe, tail, inv_v, mv, buffers, state, state_e, sc, sce, mtp, mtp_l,
                     best, ranks_extra)
    # the last rank
    r, n, dn, fr, la = _rank_layers(w, last_rank, nf, nm, nl, held, last_rank, v, mixed)
    best = _rank(moe, pp, v, r, n, dn, fr, la, dense_l, moe_l, expert_l, head, one_stage, emb,
                 act_dense, act_moe, tail, inv_v, mv, buffers, state, state_e, sc, sce, mtp, mtp_l,
                 best, ranks_extra)
    params, experts, activations, footprint = best
    if moe != 0.0:
        return (params * sw + experts * swe, params * sg + experts * sge, params * so + experts * soe,
                activations, buffers, footprint)
    return params * sw, params * sg, params * so, activations, buffers, footprint


# ---------------------------------------------------------------- 8. compose

@njit(**_INLINE)
def _mtp_flops_per_sequence(w, s):
    """megatron_compose.mtp_flops_per_sequence."""
    h, heads, kv_heads, d, moe, ffn, top_k = w[1], w[2], w[3], w[4], w[6], w[8], w[9]
    moe_ffn, shared, vocab, gate = w[10], w[11], w[13], w[20]
    mla, attn_params, core_dim = w[25], w[34], w[30]
    width, per_token = (moe_ffn, top_k) if moe != 0.0 else (ffn, 1.0)
    one = _model_flops_one(1.0, s, 1.0, h, heads, kv_heads, width, vocab, gate, per_token,
                           shared * moe_ffn, d, mla, attn_params, core_dim)
    return one + 6.0 * s * (3.0 * h + 2.0 * h * h)


@njit(**_INLINE)
def _model_flops(w, batch, s):
    """megatron_compose._model_flops."""
    layers, h, heads, kv_heads, d, moe, ffn, top_k = w[0], w[1], w[2], w[3], w[4], w[6], w[8], w[9]
    moe_ffn, shared, vocab, gate, dense_layers = w[10], w[11], w[13], w[20], w[21]
    mla, attn_params, core_dim = w[25], w[34], w[30]
    if moe != 0.0:
        mf = _model_flops_one(batch, s, layers, h, heads, kv_heads, moe_ffn, vocab, gate, top_k,
                              shared * moe_ffn, d, mla, attn_params, core_dim)
        if dense_layers != 0.0:
            mf = mf + _model_flops_one(batch, s, dense_layers, h, heads, kv_heads, ffn, 0.0, gate, 1.0,
                                       0.0, d, mla, attn_params, core_dim) \
                - _model_flops_one(batch, s, dense_layers, h, heads, kv_heads, moe_ffn, 0.0, gate,
                                   top_k, shared * moe_ffn, d, mla, attn_params, core_dim)
    else:
        mf = _model_flops_one(batch, s, layers, h, heads, kv_heads, ffn, vocab, gate, 1.0,
                              shared * moe_ffn, d, mla, attn_params, core_dim)
    return mf
