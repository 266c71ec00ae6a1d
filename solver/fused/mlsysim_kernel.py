"""Fused numba kernel of :func:`solver.physics.mlsysim.solve` for flat (1-D) inputs.

A port of :func:`solver.physics.mlsysim.price` (the steps ``split`` ->
``precision_terms`` -> ``replica_step`` -> ``links`` and the communication
terms -> ``pipeline_bubble`` -> ``compose`` -> ``realizable`` ->
``mask_invalid``) to one loop over configurations: every intermediate stays in
registers, so a million configurations cost one pass over the inputs and one
over the outputs instead of the numpy path's hundreds of full-size temporaries.
The body below follows the numpy functions line by line, in the same order of
floating-point operations, so the two are bitwise equal
(``tests/test_fused_mlsysim.py`` holds them so: change a formula there, port it
here).

How the port stays exact:

- ``np.where`` and :func:`solver.replica.pick` become selects; both sides are
  computed as numpy does (no short cut that changes a rounding). A product by
  a boolean stays a product (``x * 0.0`` is not a select when ``x`` is inf).
- Integer arithmetic of the numpy path (``//``, ``%``, products of degrees) is
  done in float64, exact for counts below 2**53, which :mod:`solver.knobs`
  guarantees: :func:`_floordiv` floors the correctly rounded quotient and
  corrects it by one where the rounding crossed an integer. The loop body is
  float only, which LLVM vectorizes (AVX2 has no int64 division or conversion).
- Facts of the workload and fleet (one per call) are folded in Python into
  scalars, passed as one tuple; per-precision facts (bytes, peak, model sizes,
  the single-accelerator memory tier) are 7-tuples indexed by the precision
  code (the order of :data:`solver.knobs.PRECISION_BYTES`).
- No fastmath (it would reassociate and drop NaN rules); ``error_model="numpy"``
  (no division-by-zero checks in the loop).
- The range checks of :mod:`solver.knobs` on the numeric knobs are made here,
  in the same pass (the kernel returns whether every value was accepted); the
  caller re-runs :func:`solver.knobs.normalize` to raise its message otherwise.
  So is the decoding of precision names (their characters, read in the loop).

A knob passed as a scalar is spread to an array before the call, so numba
compiles (and caches on disk) one specialization per pattern of flags (DP
given, transformer) and precision input, not one per pattern of scalars.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .. import collectives as _coll
from .. import knobs as _knobs
from .. import memory as _mem
from .. import replica as _rep
from ..outputs import OUTPUTS
from ..physics import common as _common
from ..physics import mlsysim as _ml
from . import buffers, in_ranges
from .mlsysim_precision import _NAMES, PRECISION_KEYS, _code_at, precision_input
from ._numba import at as _at
from ._numba import ceildiv as _ceildiv
from ._numba import floordiv as _floordiv
from ._numba import cache_is_current, kernel, njit

__all__ = ["KNOB_ORDER", "FLOAT_OUTPUTS", "BOOL_OUTPUTS", "PRECISION_KEYS", "scalars",
           "tables", "run", "precision_input"]

#: Knobs in the order the kernel takes them (``dp_size`` last: 0.0 when the fleet sizes DP).
KNOB_ORDER = ("batch_size", "precision", "efficiency", "tp_size", "pp_size", "ep_size",
              "v_stages", "microbatch_count", "zero_stage", "is_lora",
              "activation_recomputation", "overlap_comm", "overlap_efficiency",
              "congestion_factor", "straggler_factor", "moe_routing_imbalance_factor",
              "gradient_accumulation_steps", "seq_len", "dp_size")

#: Float outputs in the order of the kernel's float output tuple.
FLOAT_OUTPUTS = tuple(name for name, o in OUTPUTS.items() if not o.is_boolean)
#: Bool outputs in the order of the kernel's bool output tuple.
BOOL_OUTPUTS = tuple(name for name, o in OUTPUTS.items() if o.is_boolean)
assert FLOAT_OUTPUTS == (
    "dp_size", "step_latency_total", "scaling_efficiency", "effective_throughput", "mfu",
    "dp_communication_latency", "tp_communication_latency", "ep_communication_latency",
    "communication_latency", "pipeline_bubble_latency", "bubble_fraction", "node_latency",
    "node_latency_compute", "node_latency_memory", "node_latency_overhead", "node_throughput",
    "node_mfu", "node_hfu", "node_energy", "memory_footprint", "memory_weights",
    "memory_gradients", "memory_optimizer_state", "memory_activations",
    "memory_communication_buffers"), "port the kernel's outputs to the registry's order"
assert BOOL_OUTPUTS == ("valid", "idle_ranks", "realizable", "feasible")

_MAX_INTEGER = float(_knobs.MAX_INTEGER)


# ------------------------------------------------------------------ facts folded in Python


def scalars(workload, fleet, *, has_dp: bool) -> tuple:
    """The workload's and fleet's facts the kernel reads, as one tuple of floats (see ``_kernel``)."""
    acc, node = fleet.node.accelerator, fleet.node
    net = _ml.links(fleet)
    transformer = workload.is_transformer
    width = _rep.width(workload)
    layers = float(workload.layers) if transformer else 1.0
    lora_fraction = (_mem.lora_trainable_fraction(workload.parameters, hidden_dim=width,
                                                  layers=workload.layers)
                     if transformer else 1.0)
    host = min(acc.memory_bandwidth, acc.host_link_bandwidth or _rep.FALLBACK_HOST_LINK_BANDWIDTH)
    return tuple(float(x) for x in (
        has_dp, transformer, fleet.total_accelerators, node.accelerators_per_node,
        _rep.forward_flops(workload),
        workload.parameters if transformer else 1.0, layers, width, lora_fraction,
        _rep.layer_count(workload), workload.active_experts_per_token or 1,
        acc.memory_capacity, acc.memory_bandwidth, host, _rep.overhead_time(workload, acc),
        acc.tdp is not None, acc.tdp or 0.0,
        net.intra_bandwidth, net.intra_latency, net.inter_bandwidth, net.inter_latency)
        + _common.split_divisors(workload)) + _CONSTANTS


def tables(workload, acc) -> tuple:
    """Per-precision facts, each a 7-tuple by precision code.

    ``(precision_bytes, peak_flops, weights_total, model_bytes, tier)``: as
    :func:`solver.physics.mlsysim.precision_terms` returns them, and the
    bandwidth of the single-accelerator memory tier of a non-transformer
    (:func:`solver.replica.memory_time`).
    """
    out = ([], [], [], [], [])
    for key in PRECISION_KEYS:
        nbytes = _knobs.PRECISION_BYTES[key]
        weights = _rep.weight_bytes(workload, nbytes)
        tier = acc.memory_bandwidth
        if acc.flash_bandwidth is not None:
            tier = acc.flash_bandwidth
        if acc.sram_capacity is not None and acc.sram_bandwidth is not None:
            tier = acc.sram_bandwidth if weights <= acc.sram_capacity else tier
        for column, value in zip(out, (nbytes, acc.peak_for(key), weights,
                                       _rep.stored_bytes(workload, nbytes), tier)):
            column.append(float(value))
    return tuple(tuple(column) for column in out)


# ------------------------------------------------------------------ numba helpers


@njit(inline="always")
def _ring(message, n, bandwidth, latency):
    # solver.collectives.ring_allreduce_time: 2 (n-1)/n * M / beta + 2 (n-1) * alpha
    return 2.0 * (n - 1.0) / n * message / bandwidth + 2.0 * (n - 1.0) * latency


@njit(inline="always")
def _clip01(x):
    # np.clip(x, 0.0, 1.0), NaN kept
    x = 0.0 if x < 0.0 else x
    return 1.0 if x > 1.0 else x


_H_LAT = float(_coll.HIERARCHICAL_INTRA_NODE_LATENCY)
_LORA_DP = float(_ml.LORA_GRADIENT_FRACTION)
_TP_AR = float(_ml.TP_ALLREDUCES_PER_LAYER)
_ADAM = float(_mem.ADAM_OPTIMIZER_BYTES)
_BUCKET = float(_mem.COMMUNICATION_BUFFER_FRACTION)
_SEL = float(_mem._SELECTIVE_BYTES)
_FULL = float(_mem._FULL_RECOMPUTE_BYTES)
_TRAFFIC = float(_rep._ACTIVATION_TRAFFIC_PER_SAMPLE)
_LORA_FOOT = float(_rep._LORA_FOOTPRINT)
_LORA_EXTRA = float(_rep._LORA_FOOTPRINT - 1)
_IDLE = float(_rep.ENERGY_IDLE_FRACTION)
_DYN = float(_rep.ENERGY_DYNAMIC_FRACTION)


def _bounds(name):
    """``(low, high)`` of a numeric knob as the kernel checks it (both inclusive)."""
    knob = _knobs.KNOBS[name]
    low = -math.inf if knob.low is None else float(knob.low)
    if knob.low_open:
        low = math.nextafter(low, math.inf)
    high = math.inf if knob.high is None else float(knob.high)
    if knob.kind == "int":  # whole counts below 2**53
        high = min(high, _MAX_INTEGER - 1)
    return low, high


_B = {name: _bounds(name) for name in KNOB_ORDER if _knobs.KNOBS[name].kind in ("int", "float")}
(_LO_BATCH, _HI_BATCH), (_LO_EFF, _HI_EFF) = _B["batch_size"], _B["efficiency"]
_LO_DEG, _HI_DEG = _B["tp_size"]
assert all(_B[k] == (_LO_DEG, _HI_DEG) for k in (
    "tp_size", "pp_size", "ep_size", "v_stages", "microbatch_count", "gradient_accumulation_steps",
    "seq_len", "dp_size", "batch_size"))
(_LO_ZERO, _HI_ZERO), (_LO_OVL, _HI_OVL) = _B["zero_stage"], _B["overlap_efficiency"]
_LO_FAC, _HI_FAC = _B["congestion_factor"]
assert _B["straggler_factor"] == _B["moe_routing_imbalance_factor"] == (_LO_FAC, _HI_FAC)


#: Constants of the formulas and the knobs' bounds, appended to :func:`scalars`: passed,
#: not read as globals, so numba's disk cache (keyed on this file) never holds stale ones.
_CONSTANTS = (_H_LAT, _LORA_DP, _TP_AR, _ADAM, _BUCKET, _SEL, _FULL, _TRAFFIC, _LORA_FOOT,
              _LORA_EXTRA, _IDLE, _DYN, _MAX_INTEGER, _LO_BATCH, _HI_BATCH, _LO_EFF, _HI_EFF,
              _LO_DEG, _HI_DEG, _LO_ZERO, _HI_ZERO, _LO_OVL, _HI_OVL, _LO_FAC, _HI_FAC)


@njit(inline="always")
def _pick7(table, code):
    """``table[code]`` for a float code 0..6, as selects (a runtime tuple index keeps the loop scalar)."""
    t0, t1, t2, t3, t4, t5, t6 = table
    v = t0
    v = t1 if code == 1.0 else v
    v = t2 if code == 2.0 else v
    v = t3 if code == 3.0 else v
    v = t4 if code == 4.0 else v
    v = t5 if code == 5.0 else v
    return t6 if code == 6.0 else v


# ------------------------------------------------------------------ the kernel


#: What :func:`_kernel` compiles in besides this file (numba keys its cache on this file
#: only; see solver.fused._numba.cache_is_current: every constant is passed, none read as a
#: global), and their digest, which tests/test_fused_mlsysim.py holds current: update it with
#: every change to them.
COMPILED_FROM = tuple(Path(__file__).with_name(name) for name in ("mlsysim_precision.py", "_numba.py"))
SOURCES_DIGEST = "d4e93a3e33cbc449"


@kernel(cache=cache_is_current(__name__, SOURCES_DIGEST, COMPILED_FROM))
def _kernel(n, flags, k, c, t, names, fo, bo):  # noqa: C901  (one loop body)
    # Compile-time flags: numba types a tuple by its length, so each pattern of
    # flags is its own specialization and LLVM drops the branches not taken
    # instead of computing both sides of a select (see _flags).
    has_dp, transformer = len(flags[0]) > 0, len(flags[1]) > 0
    (_has_dp, _transformer, n_acc, apn, fwd, params, layers, width, lora_fraction, layer_count,
     top_k, mem_cap, mem_bw, offload_bw, overhead, has_tdp, tdp, intra_bw, intra_lat, inter_bw,
     inter_lat, div_heads, div_layers, div_experts, _H_LAT, _LORA_DP, _TP_AR, _ADAM, _BUCKET, _SEL, _FULL, _TRAFFIC, _LORA_FOOT,
     _LORA_EXTRA, _IDLE, _DYN, _MAX_INTEGER, _LO_BATCH, _HI_BATCH, _LO_EFF, _HI_EFF, _LO_DEG,
     _HI_DEG, _LO_ZERO, _HI_ZERO, _LO_OVL, _HI_OVL, _LO_FAC, _HI_FAC) = c
    t_bytes, t_peak, t_weights, t_model, t_tier = t
    (o_dp, o_total, o_scaling, o_eff_tp, o_mfu, o_tdp, o_ttp, o_tep, o_comm, o_tbub, o_bfrac,
     o_lat, o_comp, o_mem, o_over, o_nt, o_nmfu, o_nhfu, o_energy, o_foot, o_w, o_g, o_opt,
     o_act, o_buf) = fo
    b_valid, b_idle, b_real, b_feas = bo
    ok = True
    nan = np.nan
    for i in range(n):
        batch = float(_at(k[0], i))
        code = _code_at(k[1], i, names)
        eff = _at(k[2], i)
        tp = float(_at(k[3], i))
        pp = float(_at(k[4], i))
        ep = float(_at(k[5], i))
        v = float(_at(k[6], i))
        mb = float(_at(k[7], i))
        zero = float(_at(k[8], i))
        lora = _at(k[9], i)
        recomp = _at(k[10], i)
        overlap = _at(k[11], i)
        ovl_eff = _at(k[12], i)
        cong = _at(k[13], i)
        strag = _at(k[14], i)
        moe = _at(k[15], i)
        gas = float(_at(k[16], i))
        seq = float(_at(k[17], i))
        dp_knob = float(_at(k[18], i))
        # The knobs' ranges (solver.knobs), NaN refused: plain comparisons, no calls to inline.
        ok &= ((code >= 0.0) & (batch >= _LO_BATCH) & (batch <= _HI_BATCH)
               & (eff >= _LO_EFF) & (eff <= _HI_EFF) & (tp >= _LO_DEG) & (tp <= _HI_DEG)
               & (pp >= _LO_DEG) & (pp <= _HI_DEG) & (ep >= _LO_DEG) & (ep <= _HI_DEG)
               & (v >= _LO_DEG) & (v <= _HI_DEG) & (mb >= _LO_DEG) & (mb <= _HI_DEG)
               & (zero >= _LO_ZERO) & (zero <= _HI_ZERO)
               & (ovl_eff >= _LO_OVL) & (ovl_eff <= _HI_OVL)
               & (cong >= _LO_FAC) & (cong <= _HI_FAC) & (strag >= _LO_FAC) & (strag <= _HI_FAC)
               & (moe >= _LO_FAC) & (moe <= _HI_FAC) & (gas >= _LO_DEG) & (gas <= _HI_DEG)
               & (seq >= _LO_DEG) & (seq <= _HI_DEG)
               & (((dp_knob >= _LO_DEG) & (dp_knob <= _HI_DEG)) | (not has_dp)))
        pb = _pick7(t_bytes, code)
        peak = _pick7(t_peak, code)
        weights_total = _pick7(t_weights, code)
        model_bytes = _pick7(t_model, code)
        tier = _pick7(t_tier, code)

        # 1. split (mlsysim.split)
        replica_f = tp * pp * ep
        fits = (replica_f * dp_knob < _MAX_INTEGER) if has_dp else (replica_f <= n_acc)
        replica = replica_f if fits else 1.0
        if has_dp:
            prod = replica * dp_knob
            valid = fits & (prod - _floordiv(prod, apn) * apn == 0.0)
            dp = dp_knob
        else:
            # One quotient for both: where the split is impossible the replica is 1 and
            # n_acc // 1 is n_acc.
            quotient = _floordiv(n_acc, replica)
            valid = fits & (n_acc - quotient * replica == 0.0)
            dp = quotient if valid else n_acc
        tp = tp if valid else 1.0
        pp = pp if valid else 1.0
        ep = ep if valid else 1.0
        replica = replica if valid else 1.0
        local_batch = max(1.0, _floordiv(batch, dp))
        idle = batch < dp

        # 3. replica step (mlsysim.replica_step); step_flops, compute_time
        sample_ops = fwd * (seq if transformer else 1.0)
        model_ops = sample_ops * 3.0 * local_batch
        hardware_ops = sample_ops * (3.0 + recomp) * local_batch
        compute = hardware_ops / (peak * eff * replica)
        if transformer:  # replica.sharded_memory
            trainable = lora_fraction if lora else 1.0
            in_flight = 1.0 + (pp > 1.0) * (max(1.0, _floordiv(mb, pp)) - 1.0)
            microbatch = max(1.0, np.ceil(local_batch / (gas * 1.0 * in_flight)))
            # memory.model_state
            params_per_rank = params / replica
            trainable_per_rank = params_per_rank * trainable
            m_weights = params_per_rank * pb
            m_grads = trainable_per_rank * pb
            m_opt = trainable_per_rank * _ADAM
            spread = dp - 1.0
            m_opt = m_opt / (1.0 + (zero >= 1.0) * spread)
            m_grads = m_grads / (1.0 + (zero >= 2.0) * spread)
            m_weights = m_weights / (1.0 + (zero >= 3.0) * spread)
            layers_per_stage = _ceildiv(layers, pp)
            # memory.activation_memory
            bytes_per_token = _SEL - (_SEL - _FULL) * recomp
            tokens = seq * microbatch
            per_layer = bytes_per_token * tokens * width * (pb / 2.0)
            m_act = layers_per_stage * per_layer / tp
            # memory.pipeline_buffer
            buffer = 2.0 * (microbatch * seq) * width * pb
            m_buf = m_grads * _BUCKET + buffer * (pp > 1.0)
            footprint = m_weights + m_grads + m_opt + m_act + m_buf
        else:  # replica.single_accelerator_memory
            shard = weights_total / replica
            adam_total = (weights_total / pb) * _ADAM
            lora_alone = lora & (replica == 1.0)
            m_weights = shard
            m_grads = shard * (not lora_alone)
            m_opt = _LORA_EXTRA * weights_total if lora_alone else adam_total / replica
            m_act = shard * 0.0
            m_buf = m_act
            footprint = (_LORA_FOOT * weights_total if lora_alone
                         else (weights_total * 2.0 + adam_total) / replica)
        feasible = footprint <= mem_cap
        # replica.memory_time
        resident = mem_bw if transformer else (tier if replica == 1.0 else mem_bw)
        bandwidth = resident if feasible else offload_bw
        weight_shard = weights_total / replica
        traffic = weight_shard + weight_shard * _TRAFFIC * local_batch
        t_memory = traffic / bandwidth
        latency = np.maximum(compute, t_memory) + overhead
        replica_peak = peak * replica
        hfu = _clip01(hardware_ops / latency / replica_peak)
        node_mfu = _clip01(model_ops / latency / replica_peak)
        node_throughput = local_batch / latency
        energy = (tdp * (_IDLE + _DYN * hfu) * replica * latency) if has_tdp > 0.0 else latency * 0.0

        # 4. communication (mlsysim.dp_communication, tp_communication, ep_communication)
        gradients = model_bytes / (tp * pp)
        gradients = gradients * _LORA_DP if lora else gradients
        ranks_per_node = max(1.0, _floordiv(apn, replica))
        nodes_spanned = _ceildiv(dp, ranks_per_node)
        one_node = nodes_spanned == 1.0
        ring = _ring(gradients, dp, intra_bw if one_node else inter_bw,
                     intra_lat if one_node else inter_lat)
        g = ranks_per_node
        intra_phase = (g - 1.0) / g * gradients / intra_bw + (g - 1.0) * _H_LAT
        inter_phase = _ring(gradients / g, nodes_spanned, inter_bw, inter_lat)
        hier = intra_phase + inter_phase + intra_phase
        t_dp = ring if (one_node | (ranks_per_node == 1.0)) else hier
        t_dp = t_dp * cong / gas
        activations = local_batch * 1.0 * seq * width * pb
        in_node = tp <= apn
        stage_layers = _ceildiv(layer_count, pp)
        t_tp = _ring(activations, tp, intra_bw if in_node else inter_bw,
                     intra_lat if in_node else inter_lat) * _TP_AR * stage_layers
        t_tp = t_tp * cong
        token_bytes = activations * top_k * moe
        t_ep = ((ep - 1.0) / ep * token_bytes / inter_bw + (ep - 1.0) * inter_lat) * cong

        # 5. bubble (pipeline.bubble_fraction, bubble_time)
        fraction = (pp - 1.0) / (v * 1.0 * mb + pp - 1.0)
        t_bubble = latency * fraction / (1.0 - fraction)

        # 6. compose
        communication = t_dp + t_tp + t_ep
        exposed_dp = t_dp * (1.0 - overlap * ovl_eff)
        total = latency + exposed_dp + t_tp + t_ep + t_bubble
        total = total * np.maximum(strag, 1.0)
        scaling = latency / total

        # 7. realizable (common.realizable)
        per_replica = _floordiv(batch, dp)
        whole_replica = batch - per_replica * dp == 0.0
        per_step = _floordiv(per_replica, gas)
        whole_step = (per_replica - per_step * gas == 0.0) & (per_step >= 1.0)
        whole_micro = per_step - _floordiv(per_step, mb) * mb == 0.0
        # (common.even_splits) 0 where the workload states nothing to split
        heads_ok = (div_heads == 0.0) | (div_heads - _floordiv(div_heads, tp) * tp == 0.0)
        chunks = pp * v if (pp <= div_layers) & (v <= div_layers) else div_layers + 1.0
        interleaved_ok = (pp > 1.0) & (div_layers - _floordiv(div_layers, chunks) * chunks == 0.0)
        layers_ok = (div_layers == 0.0) | ((pp <= div_layers) if v == 1.0 else interleaved_ok)
        experts_ok = (div_experts == 0.0) | (div_experts - _floordiv(div_experts, ep) * ep == 0.0)
        even = heads_ok & layers_ok & experts_ok

        # 8. mask_invalid: NaN (False) where the split is impossible
        o_dp[i] = dp if valid else nan
        o_total[i] = total if valid else nan
        o_scaling[i] = scaling if valid else nan
        o_eff_tp[i] = (dp * node_throughput * scaling) if valid else nan
        o_mfu[i] = (node_mfu * scaling) if valid else nan
        o_tdp[i] = t_dp if valid else nan
        o_ttp[i] = t_tp if valid else nan
        o_tep[i] = t_ep if valid else nan
        o_comm[i] = communication if valid else nan
        o_tbub[i] = t_bubble if valid else nan
        o_bfrac[i] = fraction if valid else nan
        o_lat[i] = latency if valid else nan
        o_comp[i] = compute if valid else nan
        o_mem[i] = t_memory if valid else nan
        o_over[i] = overhead if valid else nan
        o_nt[i] = node_throughput if valid else nan
        o_nmfu[i] = node_mfu if valid else nan
        o_nhfu[i] = hfu if valid else nan
        o_energy[i] = energy if valid else nan
        o_foot[i] = footprint if valid else nan
        o_w[i] = m_weights if valid else nan
        o_g[i] = m_grads if valid else nan
        o_opt[i] = m_opt if valid else nan
        o_act[i] = m_act if valid else nan
        o_buf[i] = m_buf if valid else nan
        b_valid[i] = valid
        b_idle[i] = idle & valid
        b_real[i] = whole_replica & whole_step & whole_micro & even & valid
        b_feas[i] = feasible & valid
    return ok


# ------------------------------------------------------------------ the call


def _flags(*flags):
    """Booleans as tuples whose length is the flag: constants of the kernel's type, not values."""
    return tuple((1,) if flag else () for flag in flags)


def run(workload, fleet, values: dict, n: int) -> dict:
    """Every output of :data:`solver.outputs.OUTPUTS` for flat knobs ``values`` of length ``n``.

    Parameters
    ----------
    workload, fleet : solver specs (checked by the caller)
    values : dict
        Knob name -> value as the caller passed it (scalars or 1-D arrays of
        length ``n``); missing knobs take their defaults.
    n : int

    Raises
    ------
    ValueError
        As :func:`solver.knobs.normalize` raises for a value no configuration can have.
    """
    has_dp = values.get("dp_size") is not None
    code = precision_input(values.get("precision", _knobs.KNOBS["precision"].default))
    rest = {name: value for name, value in values.items() if name != "precision"}
    if not has_dp:
        rest.pop("dp_size", None)
    k = _knobs.normalize(rest, check_bounds=False)
    if code is None:  # the general path: checks and factorizes (or raises)
        code = precision_input(_knobs.normalize({"precision": values["precision"]})["precision"])
    args = []
    for name in KNOB_ORDER:
        if name == "precision":
            value = code
        elif name == "dp_size" and not has_dp:
            value = 0.0
        else:
            value = k[name] if name in k else _knobs.normalize(
                {name: _knobs.KNOBS[name].default})[name]
        if np.ndim(value) == 0 and (name != "dp_size" or has_dp):
            # A scalar knob is spread to an array (one pass of n bytes, ~1 ms per million)
            # rather than compiled into a specialization of its own: one kernel per
            # pattern of flags and precision input, whatever knobs a caller fixes.
            # The array comes from buffers (one an earlier call dropped: no page faults).
            spread = buffers.empty(n, np.int8 if name == "precision" else np.asarray(value).dtype)
            spread.fill(value)
            value = spread
        args.append(value)
    fo = tuple(buffers.empty(n, np.float64) for _ in FLOAT_OUTPUTS)
    bo = tuple(buffers.empty(n, np.bool_) for _ in BOOL_OUTPUTS)
    flags, consts = _flags(has_dp, workload.is_transformer), scalars(workload, fleet, has_dp=has_dp)
    table = tables(workload, fleet.node.accelerator)

    def part(lo, hi):
        # Views of the inputs and outputs: contiguous, so the same compiled kernel. An
        # input holds len // n items a configuration (4 for a precision's characters).
        cut = tuple(a[lo * (len(a) // n):hi * (len(a) // n)] if np.ndim(a) else a for a in args)
        return _kernel(hi - lo, flags, cut, consts, table, _NAMES,
                       tuple(a[lo:hi] for a in fo), tuple(a[lo:hi] for a in bo))

    ok = all(in_ranges(part, n))
    if not ok:
        _knobs.normalize(values)  # raises, naming the knob and the value
        raise AssertionError("the fused kernel refused a knob value solver.knobs accepts")
    out = dict(zip(FLOAT_OUTPUTS, fo))
    out.update(zip(BOOL_OUTPUTS, bo))
    return {name: out[name] for name in OUTPUTS}
