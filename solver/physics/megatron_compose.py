"""Steps 6-8 of :func:`solver.physics.megatron.solve`: data parallel, memory, outputs.

Continues :mod:`solver.physics.megatron_steps` (steps 1-5, whose results these
take). The bracketed references ``[n]`` are those of :mod:`solver.physics.megatron`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import flops as fl
from .. import gemm
from .. import megatron_memory as mem
from .. import network as net
from . import megatron_steps as steps
from .megatron_steps import (OPTIMIZER_BYTES_TOUCHED, Communication, Hardware, Layer, Pipeline,
                             Split, _exposed, heavy_moe_stage, pipeline_ranks)


# ---------------------------------------------------------- 6. data parallel

@dataclass(frozen=True)
class DataParallel:
    """Parameters of the heaviest stage, DP communication and the optimizer step."""
    #: the heaviest stage's dense parameters a rank, its embedding matrices included
    heavy_params: object
    expert_stage_params: object
    expert_group: object
    params_bytes: object
    t_dp_total: object
    t_dp: object
    t_opt: object
    #: the precision-aware optimizer's state, step copies and step bytes (:func:`optimizer`;
    #: None where it runs nowhere), which memory reads too
    opt: object = None


def _stage_params(w, sp: Split, layers_stage):
    """(dense, expert, heavy) parameters per rank of the heaviest stage (heavy: + LM head on the last)."""
    tp, pp = sp.tp, sp.pp
    # per layer: the model's mix, or MoE layers only on a stage of them (heavy_moe_stage)
    dense_scale = (w.dense_layer_params * w.dense_layers / w.layers
                   + w.moe_layer_nonexpert * w.moe_layers / w.layers)
    dup_scale = w.dense_dup * w.dense_layers / w.layers + w.moe_dup * w.moe_layers / w.layers
    expert_scale = w.expert_params * w.experts * w.moe_layers / w.layers
    heavy = heavy_moe_stage(w, pp, sp.v, sp.first, sp.last)
    if heavy is not False:
        dense_scale = np.where(heavy, float(w.moe_layer_nonexpert), dense_scale)
        dup_scale = np.where(heavy, float(w.moe_dup), dup_scale)
        expert_scale = np.where(heavy, float(w.expert_params * w.experts), expert_scale)
    # (the norms', the router's and a multi-head latent attention's duplicated weights
    # whole on every TP rank: megatron._Shape.dense_dup, moe_dup)
    # Multi-token prediction modules [34], on the last stage, priced on this one: a layer
    # each (of this stage's kind), its projection and norms, and with a pipeline the
    # embedding's copy the last stage builds for them.
    mtp = sp.mtp
    layers_mtp = layers_stage + mtp
    # (an embedding matrix a TP rank holds, its vocabulary padded [41])
    emb_t = steps.vocab_per_rank(w, tp) * float(w.hidden)
    dense_stage_params = ((dense_scale - dup_scale) * layers_mtp + mtp * w.mtp_module_params) / tp \
        + dup_scale * layers_mtp + emb_t * w.embedding_copies * (pp == 1)
    expert_stage_params = expert_scale * layers_mtp / (sp.etp * sp.ep * 1.0) if w.moe else 0.0
    # + LM head on last (and the MTP modules' embedding copy)
    heavy_params = dense_stage_params + emb_t * ((pp > 1) * (1.0 + (mtp > 0)))
    return dense_stage_params, expert_stage_params, heavy_params


def straddled_peers(domain, span, stride, world):
    """The fewest peers a domain holds of a group that straddles domain edges unevenly.

    A group's ranks lie ``stride`` apart over ``span`` consecutive ranks, and the groups
    tile the job (``world`` ranks) with period ``span`` [6]; the domains tile it with
    period ``domain``. Where the stride divides the domain, a domain holds the group's
    ranks in its overlap with the span, over the stride. With one group (``span ==
    world``) the fewest are in its last, partial domain: ``span mod domain`` ranks (128
    ranks on NVL72 racks of 72: 56). With more, the group bases run through multiples of
    ``gcd(span, domain)`` modulo the domain, so some group may hold as few in a domain at
    an edge; this prices the largest power of two dividing the domain where it divides
    the span too (8 on racks of 72: as in domains of 8), else one, a bound no larger than
    that gcd (the fused kernel's loop stays vectorized: no gcd, no remainder of its own).
    Where the stride does not divide the domain, the peers a domain holds differ from
    rank to rank: one (an upper bound on the time). This replaced one peer a domain for
    every straddling group, which priced 128 GPUs of two NVL72 racks slower than the same
    GPUs in eight-GPU domains (an audit of 2026-12-06; tests/test_megatron_placement.py).
    """
    span = np.asarray(span)
    domain2 = int(domain) & -int(domain)  # the largest power of two dividing the domain
    tail = np.mod(span, domain)
    fewest = np.where(span == np.asarray(world), np.where(tail == 0, domain, tail),
                      np.where(np.mod(span, domain2) == 0, domain2, 1))
    # (times the stride's reciprocal, as the fused kernel has it from its step memo)
    return np.where(np.mod(domain, stride) == 0, np.maximum(fewest * (1.0 / stride), 1.0), 1.0)


def _gathered_bytes(w, k, sp: Split, heavy_params, expert_stage_params):
    """Bytes a rank's parameter all-gathers move, dense and expert: 16 bits a parameter, but
    with ``fp8_param_gather`` under FP8 one byte for every parameter of the transformer
    layers (their linear layers' weights: Transformer Engine builds them as FP8 tensors,
    ``fp8_model_init``, and the distributed optimizer gathers those [43]); the embedding and
    output matrices stay 16-bit (the norms' and the router's weights, well under 0.1 % of
    a layer's, are counted at one byte too). Under ``fp8_recipe="mxfp8"`` the gathers move
    16 bits still: Megatron-Core gathers the BF16 parameters and casts them to MXFP8 on the
    copy out of the buffer ("The parameters are cast from bf16 to MXFP8 during copy", with
    ``reuse_grad_buf_for_mxfp8_param_ag``, as Megatron-Bridge's MXFP8 recipes set it) [43]."""
    dense, expert = mem.WEIGHT_BYTES * heavy_params, mem.WEIGHT_BYTES * expert_stage_params
    fp8_params = np.asarray(k.get("fp8_param_gather", False))
    if not np.any(fp8_params):
        return dense, expert
    on = (fp8_params & (np.asarray(sp.prec) == steps.PRECISIONS.index("fp8"))
          & (np.asarray(k.get("fp8_recipe", 0)) != steps.FP8_RECIPES.index("mxfp8")))
    # the embedding matrices the heaviest stage holds (_stage_params' last two terms)
    emb = steps.vocab_per_rank(w, sp.tp) * float(w.hidden) * (
        w.embedding_copies * (sp.pp == 1) + (sp.pp > 1) * (1.0 + (sp.mtp > 0)))
    return (np.where(on, heavy_params + emb, dense),
            np.where(on, expert_stage_params * 1.0, expert))


@dataclass(frozen=True)
class Optimizer:
    """Adam under Megatron-Core's precision-aware optimizer [45], a parameter: ``state``,
    its master weights and two moments [B] (sharded as the distributed optimizer shards
    them); ``copy``, the FP32 copies the step holds beside them for its length [B]
    (megatron_memory.state_bytes); ``step``, its bytes through HBM."""
    state: object
    copy: object
    step: object


def optimizer(k, sp: Split, hw: Hardware):
    """:class:`Optimizer` of the knobs ``k``; None where the precision-aware optimizer runs
    nowhere (:func:`.megatron_steps.precision_aware`): there Adam keeps FP32 master weights
    and moments (megatron_memory.ADAM_STATE_BYTES), copies 16-bit gradients to FP32, and
    its step moves OPTIMIZER_BYTES_TOUCHED a parameter.

    With it [45], Transformer Engine's FusedAdam holds the master weights
    (``master_weights``, ``master_weight_dtype=main_params_dtype``) and reads the gradient
    buffer as it is (``use_decoupled_grad``: no FP32 copy of 16-bit gradients), except FP32
    master weights under an FP8 recipe other than delayed scaling (``fp8_recipe``:
    Megatron-Core's ``use_precision_aware_optimizer_no_fp8_or_ds_fp8`` holds for no FP8 or
    delayed scaling, its default; under the current-scaling, block and MXFP8 recipes of
    NVIDIA's 2025-26 recipes Megatron-Core keeps its own FP32 master copy and its copy of
    16-bit gradients). FP32 master weights of BF16 parameters (BF16 and FP4 training, FP8
    training without FP8 parameters) are kept as their 16-bit remainders
    (``store_param_remainders``, Megatron-Core's default: 2 bytes, the other 16 the BF16
    weight's); of FP8 parameters (``fp8_param_gather``) whole. The moments are
    ``exp_avg_dtype`` and ``exp_avg_sq_dtype`` wide.

    The step: its kernel reads the gradient (the buffer's width, or the FP32 copy), reads and
    writes the master weight (FP32: 8 bytes, and the 16-bit weight written, 2; as remainders
    with the BF16 weight: 8) and the moments (FP32: 8 each). A state kept narrower runs
    through FP32 copies of it first, TE's ``get_unscaled_state`` and ``_apply_scale``: FP16
    read and widened (2 + 4), unscaled (4 + 4), the kernel's 8, its range (4), rescaled (4 +
    4) and narrowed back (4 + 2), 40 bytes; FP8 read and widened (1 + 4), the kernel's 8,
    its range (4), quantized back (4 + 1), 22; BF16 widened (2 + 4), the kernel's 8, narrowed
    back (4 + 2), 20, but both moments BF16 are updated in place by the kernel
    (``fuse_unscale``), 4 each. Those FP32 copies of every state of a parameter group are
    held at once until the step ends (``del unscaled_lists``): 4 bytes a state a parameter
    (the group taken as the rank's whole shard) in ``copy``, as Megatron-Core's own copy of
    16-bit gradients is. With every state FP32: 30 bytes and Adam's 12, as without it.
    """
    on = steps.precision_aware(k)
    if not np.any(on):
        return None
    prec = np.asarray(sp.prec)
    main = np.asarray(k.get("main_params_dtype", 0))
    fp16_main = main == steps.MAIN_PARAMS_DTYPES.index("fp16")
    fp8 = prec == steps.PRECISIONS.index("fp8")
    te_master = on & (fp16_main | ~fp8 | steps.delayed_scaling(k))
    # (FP8 parameters, fp8_param_gather's, keep whole FP32 master weights: remainders are of
    # BF16 parameters only [45])
    fp8_params = fp8 & np.asarray(k.get("fp8_param_gather", False)) & (np.asarray(k["zero_stage"]) >= 1)
    remainders = (te_master & ~fp16_main & (prec != steps.PRECISIONS.index("fp16")) & ~fp8_params
                  & np.asarray(k.get("store_param_remainders", True)))
    master = np.where(remainders, 2.0, np.asarray(steps.MAIN_PARAMS_BYTES)[main])
    avg = np.asarray(k.get("exp_avg_dtype", 0))
    avg_sq = np.asarray(k.get("exp_avg_sq_dtype", 0))
    moment_bytes = np.asarray(steps.MOMENT_BYTES)
    moments = moment_bytes[avg] + moment_bytes[avg_sq]
    bf16 = steps.MOMENT_DTYPES.index("bf16")
    fused = (avg == bf16) & (avg_sq == bf16)
    through = np.asarray(steps.MOMENT_STEP_BYTES)
    moment_step = np.where(fused, 8.0, through[avg] + through[avg_sq])
    master_step = np.where(remainders, 8.0, np.where(fp16_main, through[1], 8.0)
                           + mem.WEIGHT_BYTES)
    grad_read = np.where(te_master, hw.grad_bytes, mem.MAIN_GRAD_BYTES)
    unfused = ((te_master & fp16_main).astype(np.float64)
               + np.where(fused, 0.0, (avg != 0) * 1.0 + (avg_sq != 0) * 1.0))
    # (Adam's copy of 16-bit gradients where Megatron-Core holds the master weights, and
    # where the optimizer does not run)
    grad_copy = np.where(~te_master & (np.asarray(hw.grad_bytes) < mem.MAIN_GRAD_BYTES),
                         mem.MAIN_GRAD_BYTES, 0.0)
    return Optimizer(state=np.where(on, master + moments, mem.ADAM_STATE_BYTES),
                     copy=grad_copy + 4.0 * np.where(on, unfused, 0.0),
                     step=np.where(on, grad_read + master_step + moment_step,
                                   OPTIMIZER_BYTES_TOUCHED))


def data_parallel(w, k, c, sp: Split, hw: Hardware, ly: Layer, cm: Communication,
                  pl: Pipeline) -> DataParallel:
    """Bucketed gradient reduction and parameter gathers [7], FSDP [9], Adam at HBM bandwidth."""
    group, zero, m, grad_bytes = sp.group, sp.zero, sp.m, hw.grad_bytes
    layers_stage = pl.layers_stage
    dense_stage_params, expert_stage_params, heavy_params = _stage_params(w, sp, layers_stage)
    # Data-parallel peers (with CP's) are tp ranks apart [6]: domain / tp of them share a
    # domain. Expert data-parallel peers are etp ep apart in the expert grid [6], so fewer
    # of them do (none but itself where the EP group fills the domain). Both groups span
    # tp x group ranks. Every group shares the domains evenly where that span lies inside
    # one (Hardware.within) or covers whole ones whose width the peers' stride divides.
    # Otherwise groups straddle a boundary unevenly (DP 8 over TP 8 in an NVL72 rack of
    # 72: the second stage's groups have 1 peer in one rack and 7 in the next) and the
    # slowest paces the step: the domain with the fewest peers carries the cross-domain
    # traffic on its NICs alone, priced as if every domain held that few
    # (straddled_peers).
    span = sp.tp * group
    inside = hw.within(span, sp.n_acc)
    covers = np.mod(span, hw.domain) == 0
    ranks_up = np.where(inside | (covers & (np.mod(hw.domain, sp.tp) == 0)),
                        np.minimum(np.clip(hw.domain // sp.tp, 1, None), group),
                        straddled_peers(hw.domain, span, sp.tp, sp.n_acc))
    ranks_up_expert = np.where(inside | (covers & (np.mod(hw.domain, sp.etp * sp.ep) == 0)),
                               np.clip(hw.domain // (sp.etp * sp.ep), 1, None),
                               straddled_peers(hw.domain, span, sp.etp * sp.ep, sp.n_acc))

    def dp_coll(kind, nbytes, n, up=ranks_up):
        return net.two_level_time(kind, nbytes, n, np.minimum(up, n),
                                  scale_up_bandwidth=hw.up_bw, scale_up_latency=hw.up_lat,
                                  scale_out_bandwidth=hw.out_bw, scale_out_latency=hw.out_lat)

    expert_group = np.maximum((sp.tp * group) // (sp.etp * sp.ep), 1)
    grads_dense = heavy_params * grad_bytes
    grads_expert = expert_stage_params * grad_bytes
    sharded = zero >= 1
    t_grad = np.where(
        sharded, dp_coll("reduce_scatter", grads_dense, group) + (
            dp_coll("reduce_scatter", grads_expert, expert_group, ranks_up_expert) if w.moe else 0.0),
        dp_coll("all_reduce", grads_dense, group) + (
            dp_coll("all_reduce", grads_expert, expert_group, ranks_up_expert) if w.moe else 0.0))
    params_bytes = mem.WEIGHT_BYTES * (heavy_params + expert_stage_params)
    gather_dense, gather_expert = _gathered_bytes(w, k, sp, heavy_params, expert_stage_params)
    t_gather = np.where(sharded, dp_coll("all_gather", gather_dense, group)
                        + (dp_coll("all_gather", gather_expert,
                                   expert_group, ranks_up_expert) if w.moe else 0.0), 0.0)
    # Last microbatch's backward hides the bucketed gradient reduction; the first forward
    # hides the parameter all-gather [7]. With interleaved stages each model chunk's are
    # launched on their own [17]: a chunk's gradients as its last backward ends, which
    # leaves the rest of the cooldown (the other chunks' last backwards) to hide all but
    # the last chunk's; a chunk's parameters before its first forward, all but the first
    # chunk's behind the forwards before it. The exposed share is the one chunk's, 1/v
    # (its bytes over its own layers' backward, or forward).
    # (Under the combined 1F1B schedule [35] a paired backward's window is what is left
    # of it once the paired forward's all-to-alls hide in it, megatron_steps.pipeline; the
    # last backward of each chunk, in which ZeRO 0 and 1 reduce, runs unpaired and keeps
    # its whole window. 0.0 off.)
    window_b = pl.window_b - pl.a2a_hidden
    stage_b = layers_stage * np.where(zero == 2, window_b, pl.window_b)
    stage_f = layers_stage * pl.window_f
    eta = c["overlap_efficiency"]
    chunk = 1.0 / sp.v
    # ZeRO-2 keeps only its shard of the gradients, so it reduce-scatters them after every
    # microbatch's backward, each behind that backward [24]; the other stages once.
    per_microbatch = np.where(zero == 2, m, 1.0)
    # With set stages the priced stage also waits, every microbatch, for the paced one
    # (pl.slack): ZeRO-2's reduce-scatter of each microbatch's gradients runs then beside no
    # compute, the whole wait. Not the reduction of the other stages, launched in the last
    # microbatch's backward [7], after which the priced stage may wait for nothing (the
    # first stage, when it holds the most layers); nor the parameter gather (one wait hides
    # one of them, and the gather runs with the step's first forwards).
    idle_grad = np.where(zero == 2, pl.slack, 0.0)
    exp_grad = per_microbatch * np.where(k["overlap_grad_reduce"],
                                         _exposed(t_grad, stage_b, eta, idle_grad) * chunk, t_grad)
    t_grad = per_microbatch * t_grad
    exp_gather = np.where(k["overlap_param_gather"], _exposed(t_gather, stage_f, eta) * chunk,
                          t_gather)
    # FSDP [9]: gather forward and backward, reduce-scatter gradients, every microbatch,
    # prefetched behind the whole compute under overlap_param_gather (else [29], below).
    # Each is one NCCL collective over the whole DP group (FSDP shards over all DP ranks,
    # not per node), whose rings NCCL spreads over the domain's NICs [38]: its bytes cross
    # the fabric at the rate of the two-level collective the other stages pay (dp_coll).
    # DeepSpeed's ZeRO-3 of 2021 (NAR21 Table 2) gathered at one NIC's rate, one flat ring
    # per rank over its own NIC (fsdp_own_nic). Either way, they run layer by layer (one
    # gather forward, one backward, one reduce-scatter per layer [9]), so each of the
    # stage's layers pays the collective's latency steps [8] (a flat ring's n - 1, the
    # two-level's g - 1 inside and n/g - 1 across) and the per-call cost.
    # (its ranks are tp apart [6]: the group spans tp x its size, inside a domain or not)
    fsdp_bw, fsdp_lat = hw.link(inside)
    flat = inside | k["fsdp_own_nic"]  # (inside one domain the two are one collective)

    def two_level(n, up):
        """dp_coll's two-level collective as a time a byte and its latency steps (the
        same sum, written so that one division serves every byte count)."""
        g = np.minimum(up, n)
        d = n / g
        return ((g - 1.0) / g / hw.up_bw + (d - 1.0) / d / (g * hw.out_bw),
                (g - 1.0) * hw.up_lat + (d - 1.0) * hw.out_lat)

    def fsdp_coll(kind, nbytes, n, per_byte, steps):
        ring = (net.all_gather_time if kind == "all_gather" else net.reduce_scatter_time)(
            nbytes, n, bus_bandwidth=fsdp_bw, latency=fsdp_lat)
        return np.where(flat, ring, nbytes * per_byte + steps)

    per_byte, two_lat = two_level(group, ranks_up)
    # (one rank gathers nothing: no call at all, as for the other stages' collectives)
    steps_lat = np.where(flat, (group - 1.0) * fsdp_lat, two_lat)
    fsdp_call = (layers_stage - 1.0) * (steps_lat + c["collective_latency"]) * (group > 1)
    t_fsdp_gather = m * (2.0 * fsdp_coll("all_gather", gather_dense, group,
                                         per_byte, two_lat)
                         + 2.0 * fsdp_call)
    t_fsdp_rs = m * (fsdp_coll("reduce_scatter", heavy_params * grad_bytes, group, per_byte, two_lat)
                     + fsdp_call)
    if w.moe:
        # The expert parameters are sharded, gathered and reduced over the expert
        # data-parallel group (Megatron-Core's expert DP group [6]), not the dense one: none
        # where it is one rank (ETP x EP spans every rank of the stage); one call a MoE layer
        # of the stage (its share of them, ly.moe_share).
        per_byte_e, two_lat_e = two_level(expert_group, ranks_up_expert)
        steps_lat_e = np.where(flat, (expert_group - 1.0) * fsdp_lat, two_lat_e)
        fsdp_call_e = (layers_stage * ly.moe_share - 1.0) * (steps_lat_e
                                                             + c["collective_latency"]) * (expert_group > 1)
        t_fsdp_gather = t_fsdp_gather + m * (2.0 * fsdp_coll(
            "all_gather", gather_expert, expert_group, per_byte_e, two_lat_e)
            + 2.0 * fsdp_call_e)
        t_fsdp_rs = t_fsdp_rs + m * (fsdp_coll(
            "reduce_scatter", expert_stage_params * grad_bytes, expert_group, per_byte_e, two_lat_e)
            + fsdp_call_e)
    t_fsdp = t_fsdp_gather + t_fsdp_rs
    # Gathers not overlapped (overlap_param_gather off) are blocking: they wait in line
    # before the layer that needs them, and only the reduce-scatter, issued as the
    # backward produces the gradients, hides behind the backward [29].
    # (with set stages, the priced stage's waits for the paced one (pl.slack) hide it whole)
    idle = m * pl.slack
    exp_fsdp = np.where(k["overlap_param_gather"], _exposed(t_fsdp, pl.t_pipe - idle, eta, idle),
                        t_fsdp_gather + np.where(
                            k["overlap_grad_reduce"],
                            _exposed(t_fsdp_rs, m * layers_stage * window_b, eta, idle),
                            t_fsdp_rs))
    fsdp = zero == 3
    # Optimizer: Adam over the local (sharded) parameters at HBM bandwidth; the expert
    # parameters are sharded over the expert data-parallel group.
    local_params = (heavy_params / np.where(sharded, group, 1)
                    + expert_stage_params / np.where(sharded, expert_group, 1))
    opt = optimizer(k, sp, hw)
    t_opt = gemm.memory_bound_time(
        (OPTIMIZER_BYTES_TOUCHED if opt is None else opt.step) * local_params, hw.hbm)
    return DataParallel(heavy_params=heavy_params, expert_stage_params=expert_stage_params,
                        expert_group=expert_group, params_bytes=params_bytes,
                        t_dp_total=np.where(fsdp, t_fsdp, t_grad + t_gather),
                        t_dp=np.where(fsdp, exp_fsdp, exp_grad + exp_gather), t_opt=t_opt,
                        opt=opt)


# ----------------------------------------------------------------- 7. memory

@dataclass(frozen=True)
class Memory:
    """Training memory per accelerator of the pipeline rank that holds the most [byte]."""
    weights: object
    grads: object
    optim: object
    activations: object
    buffers: object
    footprint: object
    #: bytes of one microbatch's activations the priced rank offloads to the host (and
    #: reloads) under cpu_offloading_num_layers [51]; 0.0 without it
    offloaded: object = 0.0


def memory(w, k, sp: Split, hw: Hardware, ly: Layer, pl: Pipeline, dpr: DataParallel) -> Memory:
    """Model state, stored activations and buffers (:mod:`solver.megatron_memory`) of each
    pipeline rank that can hold the most (:func:`~.megatron_steps.pipeline_ranks`); the
    largest footprint counts."""
    tp, pp, zero, group, mbs = sp.tp, sp.pp, sp.zero, sp.group, sp.mbs
    s_local, h, layers_stage = ly.s_local, ly.h, pl.layers_stage
    flash = k["flash_attention"]
    drop = dict(hidden_dropout=k["hidden_dropout"], attention_dropout=k["attention_dropout"])
    latent = np.where(hw.low_bits, w.latent_act_fp8, w.latent_act)
    moe = dict(moe_top_k=w.top_k, routed_gather=sp.etp / (tp * 1.0),
               moe_ffn_hidden=w.moe_ffn + w.shared * w.moe_ffn / max(w.top_k, 1))
    dense_extra = {}
    if sp.modules:
        # Selective recompute's output-discarding modules [47]: "mla_up_proj" frees a
        # multi-head latent attention's Q, K and V (2 bytes a head at the query-key width
        # twice and the value width; the core's output, the output projection's input,
        # stays), every layer's; "layernorm" frees the
        # outputs of the norms that are modules of their own, a multi-head latent
        # attention's input norm (its down projections' input: 1 byte under FP8, as they
        # keep it) and an MoE layer's pre-MLP norm (the router's and the experts' input,
        # 16-bit); "moe_act" the routed experts' activation output (the second GEMM's input,
        # 1 byte under FP8). Under FP8 the linear layers then keep the 16-bit input the
        # recompute discards [10] of megatron_memory, so nothing of it stays.
        # The working set of their backward holds the 16-bit tensors the recompute restores
        # (under FP8 more than the one-byte copy the layer kept without it).
        width = np.where(hw.low_bits, 1.0, 2.0)
        attn_norm = np.where(sp.norms, float(w.mla), 0.0)
        routed_act = np.where(sp.moe_act, w.top_k * w.moe_ffn / h, 0.0)
        moe_norms = attn_norm * width + np.where(sp.norms, 2.0, 0.0)
        qkv = np.where(sp.up_proj, float(w.mla) * 2.0 * w.heads * (2.0 * w.qk_dim + w.head_dim)
                       / h, 0.0)
        dense_extra = dict(discarded_norms=attn_norm * width, restored_norms=2.0 * attn_norm,
                           discarded_act=0.0, restored_act=0.0, discarded_attn=qkv)
        moe = {**moe, "discarded_norms": moe_norms, "discarded_act": width * routed_act,
               "discarded_attn": qkv,
               "restored_norms": 2.0 * attn_norm + np.where(sp.norms, 2.0, 0.0),
               "restored_act": 2.0 * routed_act}
        if sp.checkpoints:
            # Its checkpointed modules [47] keep their input and free what runs inside them,
            # which their backward holds again as it was (restored = discarded): "mlp" a
            # dense layer's MLP, its first GEMM's input (the norm fused into it: its
            # output, 1 byte under FP8, as the GEMM kept it), its intermediates (the
            # second GEMM's input 1 byte under FP8); "shared_experts" the shared experts'
            # intermediates; "moe" everything an MoE layer keeps past its input (the norm's
            # output, the router's and the shared experts' input): the routed copies, the
            # routed and shared experts' intermediates ("moe_act"'s among them).
            keep = lambda width_h: (4.0 + 2.0 * w.gated) * width_h - np.where(  # noqa: E731
                hw.low_bits, width_h, 0.0)
            mlp_in = np.where(sp.dense_mlp, width, 0.0)
            mlp_mid = np.where(sp.dense_mlp, keep(w.ffn / h), 0.0)
            dense_extra["discarded_norms"] = dense_extra["discarded_norms"] + mlp_in
            dense_extra["restored_norms"] = dense_extra["restored_norms"] + mlp_in
            dense_extra["discarded_act"] = dense_extra["discarded_act"] + mlp_mid
            dense_extra["restored_act"] = dense_extra["restored_act"] + mlp_mid
            if w.moe:
                shared = keep(w.shared * w.moe_ffn / h)
                # the routed copies (not split by TP: times tp, as discarded_act is over it)
                copies = tp * w.top_k * (sp.etp / (tp * 1.0)) * width
                whole = keep((w.top_k * w.moe_ffn + w.shared * w.moe_ffn) / h) + copies
                extra = np.where(sp.moe_layer, whole, np.where(sp.shared_mlp, shared, 0.0))
                # ("moe" frees the experts' activation too: "moe_act" frees nothing more;
                # its restored 16-bit tensor under FP8 is not counted beside the layer's)
                moe["discarded_act"] = np.where(sp.moe_layer, 0.0, moe["discarded_act"]) + extra
                moe["restored_act"] = np.where(sp.moe_layer, 0.0, moe["restored_act"]) + extra
    if w.moe and np.any(sp.se_overlap):
        # moe_shared_expert_overlap [49]: the shared experts all-gather their input over TP
        # (SP) themselves, and their first GEMM, with no parallel mode, keeps it whole for its
        # weight gradient [11] of megatron_memory: 2 bytes a token of h (its FP8 cast, 1,
        # under delayed scaling; the original input under the other recipes and FP4), on
        # every TP rank; at tp 1 nothing is gathered. "moe" frees it with the rest of the
        # layer (times tp, as discarded_act is over it).
        moe["whole_input"] = np.where(sp.se_overlap & sp.sp,
                                      np.where(steps.delayed_scaling(k), 1.0, 2.0), 0.0)
        if sp.checkpoints:
            inside = np.where(sp.moe_layer, tp * moe["whole_input"], 0.0)
            moe["discarded_act"] = moe["discarded_act"] + inside
            moe["restored_act"] = moe["restored_act"] + inside

    def kinds(rc):
        """(stored, working set) of a dense layer, then of an MoE layer (the dense layer's
        again where the model has no experts), at the recompute code ``rc``."""
        shape = dict(heads=w.heads, kv_heads=w.kv_heads, ffn_hidden=w.ffn, gated=w.gated,
                     tp_size=tp, sequence_parallel=sp.sp, recompute_code=rc,
                     flash_attention=flash, low_bits=hw.low_bits, attention_bytes=w.attn_act,
                     latent_bytes=latent, context_ratio=w.context_ratio, **drop)
        out = []
        for extra in (dense_extra, moe) if w.moe else (dense_extra,):
            kw = {**shape, **extra}
            restored = {name: kw.pop(name) for name in ("restored_norms", "restored_act")
                        if name in kw}
            act = mem.layer_activation_bytes(mbs, s_local, h, **kw)
            out += [act, mem.recompute_working_bytes(act, mbs, s_local, h, **kw, **restored)]
        return tuple(out) if w.moe else tuple(out) * 2

    # A recomputed layer's working set [5]: its backward first runs its forward again (the
    # whole layer under full recompute, the attention core under selective) and holds
    # what that forward stores, one layer of one microbatch, beside the checkpoints:
    # what the layer would store without recompute, less what it stores with it (0.0
    # without recompute). On the last rank it never coexists with the logits and the
    # MTP layers' activations, freed by the output layer's backward before the last
    # layer's; the larger counts.
    act_dense, work_dense, act_moe, work_moe = kinds(sp.rc)
    # A partial recompute (recompute_num_layers [40]): the layers it leaves alone store
    # what they would without recompute, and hold no working set (Split.plain's codes).
    plain = kinds(sp.plain().rc) if sp.partial else None
    # Megatron DDP's buckets are views into the gradient buffer [23]: a bucket of its own
    # (size [7]) only where the gradients are sharded and one is gathered to reduce it;
    # no larger than the rank's gradients (the buckets partition them [23]), which the
    # size's 1e6 per rank of the group outgrows at a large DP x CP. (Megatron's default
    # bucket_size, max(4e7, 1e6 x the data-parallel size), Megatron-FSDP's too: so the
    # footprint grows with DP where it binds.) ZeRO-3 gathers two
    # layers' weights ahead: the dense ones where its group shards them, the experts where
    # the expert DP group does. A group of one rank (no DP or CP, and no expert DP) shards
    # nothing and gathers nothing: no bucket, no gather buffers.
    shards = (group > 1) | (dpr.expert_group > 1)
    bucket = np.where((zero >= 2) & shards, hw.grad_bytes * np.minimum(
        np.maximum(4e7, 1e6 * group), dpr.params_bytes / mem.WEIGHT_BYTES), 0.0)
    gathered = np.where(group > 1, dpr.heavy_params, 0.0) + np.where(
        dpr.expert_group > 1, dpr.expert_stage_params, 0.0)
    buffers = (bucket + 2.0 * ly.act_bytes / sp.p2p_split * (pp > 1)
               + (zero == 3) * 2.0 * mem.WEIGHT_BYTES * (gathered / layers_stage))
    if np.any(np.asarray(sp.cpc) != 0):  # cp_comm_type's all-gathered K and V [42]
        buffers = buffers + steps.cp_collective_memory(w, sp, ly)
    # Bytes a parameter: weights, gradients, optimizer state, and the optimizer's FP32 copy
    # of 16-bit gradients (in the optimizer state), which is never held beside the
    # activations and buffers (megatron_memory [5]): the larger of them counts.
    # (a precision-aware optimizer's state and the step's FP32 copies [45]: optimizer)
    adam = () if dpr.opt is None else (dpr.opt.state, dpr.opt.copy)
    sw, sg, so, sc = mem.state_bytes(group, zero, hw.grad_bytes, *adam)
    swe = sge = soe = sce = 0.0
    if w.moe:
        swe, sge, soe, sce = mem.state_bytes(dpr.expert_group, zero, hw.grad_bytes, *adam)
    state, state_e = sw + sg + so, swe + sge + soe
    # A rank's weights a layer: dense, MoE's but its experts, its experts (over ETP x EP);
    # the norms', the router's and MLA's duplicated weights whole on every TP rank
    # (megatron._Shape.dense_dup, moe_dup). A multi-token prediction module
    # [34]: a layer of the last one's kind, its projection and norms. An embedding matrix.
    # (times 1 / tp: the fused kernel's loop makes one division, not five)
    per_tp = 1.0 / tp
    dense_l = (w.dense_layer_params - w.dense_dup) * per_tp + w.dense_dup
    moe_l = (w.moe_layer_nonexpert - w.moe_dup) * per_tp + w.moe_dup
    expert_l = w.expert_params * w.experts / (sp.etp * sp.ep * 1.0) if w.moe else 0.0
    mtp_l = (moe_l if w.moe else dense_l) + w.mtp_module_params * per_tp
    vocab_t = steps.vocab_per_rank(w, tp)  # padded [41]
    emb = vocab_t * float(w.hidden)
    # One stage holds both embedding matrices where untied [22] (its MTP modules share them).
    # (a workload without a shape has no embedding apart: 1.0, any factor of its 0.0)
    one_stage = w.single_stage_embedding / w.embedding_params if w.embedding_params else 1.0
    # The last rank: the logits of its one microbatch in flight and each MTP module's [1] [34],
    # and the final norm's and the output layer's inputs beside each.
    held_logits = mem.logits_bytes(mbs, s_local, vocab_t, tp_size=1.0)
    if np.any(sp.ce_te):  # TE's fused cross-entropy: the 16-bit logits, their gradient in place [44]
        held_logits = np.where(sp.ce_te, 0.5 * held_logits, held_logits)
    logits = (held_logits
              + mem.head_input_bytes(mbs, s_local, h, norm_split=ly.norm_split)) * (1 + sp.mtp)
    best = None
    # The first rank's embedding dropout keeps its mask, a byte an element of the embedding's
    # output (its SP slice), for each microbatch in flight, where hidden_dropout > 0.
    mask = np.where(np.asarray(k["hidden_dropout"]) > 0.0, ly.act_bytes / 2.0 / ly.norm_split, 0.0)
    ranks = pipeline_ranks(w, sp) if plain is None else pipeline_ranks(w, sp, recompute=True)
    offload = np.asarray(k.get("cpu_offloading_num_layers", 0))
    offloads = bool(np.any(offload > 0))
    for rank, n, dense_n, first, last, *again in ranks:
        moe_n, mtp = n - dense_n, sp.mtp * last
        # the input embedding on the first rank, the output layer on the last (and a copy
        # of the embedding for the MTP modules [34])
        copies = np.where(pp == 1, one_stage, first + last * (1.0 + (mtp > 0)))
        params = dense_n * dense_l + moe_n * moe_l + mtp * mtp_l + emb * copies
        experts = (moe_n + mtp) * expert_l
        # Combined 1F1B [35]: a paired step's forward builds a layer of one microbatch
        # while its backward frees one of another: one layer more than 1F1B at the peak.
        one = np.maximum(np.where(moe_n > 0, act_moe, 0.0), np.where(dense_n > 0, act_dense, 0.0))
        offloaded = 0.0
        if plain is None:
            per_mb = dense_n * act_dense + moe_n * act_moe + first * mask
            work = np.maximum(np.where(moe_n > 0, work_moe, 0.0),
                              np.where(dense_n > 0, work_dense, 0.0))
            if offloads:
                # Activation offloading [51] (Megatron-Core's cpu_offloading, one pipeline
                # stage, no recompute): the first cpu_offloading_num_layers layers'
                # activations go to the host as the forward leaves each (Transformer
                # Engine's offload context, on its own streams) and come back before its
                # backward: the rank holds the rest ("(num_layers - num_offloaded_layers) *
                # T" at its peak; never the last layer). The dense layers come first. Their
                # whole stored activations are taken as offloaded, as Transformer Engine
                # 2.10 and later moves every tensor saved in the layer (its first offload
                # code, NVTE_CPU_OFFLOAD_V1, moved only its own modules' and kept the rest,
                # the dropout masks and the SwiGLU input among them, and one layer more at
                # the peak: not priced). Beside recompute, which Megatron-Core refuses with
                # it, nothing is offloaded.
                n_off = np.where(np.asarray(sp.rc) == 0,
                                 np.minimum(offload, np.maximum(n - 1, 0)), 0)
                off_dense = np.minimum(n_off, dense_n)
                offloaded = off_dense * act_dense + (n_off - off_dense) * act_moe
                per_mb = per_mb - offloaded
        else:
            # the rank's recomputed layers [40], the dense ones first in each chunk
            r_dense = again[0]
            r_moe = steps.recomputed(sp, n) - r_dense
            act_d0, work_d0, act_m0, work_m0 = plain
            per_mb = (r_dense * act_dense + (dense_n - r_dense) * act_d0
                      + r_moe * act_moe + (moe_n - r_moe) * act_m0 + first * mask)
            # A chunk's plain layers are its last: their backward runs first and frees that
            # microbatch's activations of them before the first recomputed forward takes its
            # working set (the smaller kind's where the rank holds both).
            c = n / sp.v
            plain_c = c - np.minimum(np.where(np.asarray(sp.rnl) > 0, sp.rnl, c), c)
            freed = plain_c * np.where((moe_n > 0) & (dense_n > 0), np.minimum(act_d0, act_m0),
                                       np.where(moe_n > 0, act_m0, act_d0))
            work = np.maximum(
                np.maximum(np.where(r_moe > 0, work_moe, 0.0),
                           np.where(r_dense > 0, work_dense, 0.0)) - freed,
                np.maximum(np.where(moe_n - r_moe > 0, work_m0, 0.0),
                           np.where(dense_n - r_dense > 0, work_d0, 0.0)))
            # the block method leaves MTP modules plain [40]
            mtp_act = np.where((np.asarray(sp.rc) == 2) & (np.asarray(sp.rnl) > 0), act_m0, act_moe)
        if sp.grouped:
            # The uniform method [40]: each chunk's layers in checkpoints of rgroup, each
            # keeping its first layer's input, the full recompute's act_*; a checkpoint's
            # backward runs its layers' forward again and holds what they store without
            # recompute, all of them, beside the checkpoints (the heavier kind's, each,
            # where the rank holds both). (Where rgroup does not divide the chunk, the
            # layout is not realizable: priced as its last checkpoint shorter.)
            g = np.asarray(sp.rgroup) * 1.0
            c = n / sp.v
            span = np.minimum(g, c)
            whole = np.maximum(np.where(moe_n > 0, work_moe + act_moe, 0.0),
                               np.where(dense_n > 0, work_dense + act_dense, 0.0))
            per_mb = np.where(g > 1, sp.v * np.ceil(c / g) * act_moe + first * mask, per_mb)
            work = np.where(g > 1, span * whole - act_moe, work)
        stored = per_mb * mem.in_flight_layers(1.0, pp, sp.v, sp.m, rank) \
            + (sp.a2a_paired > 0.0) * one
        act = stored + np.maximum(work, last * ((act_moe if plain is None else mtp_act) * sp.mtp
                                                + logits))
        # (written as a max, not "+ act + buffers - min(copy, act + buffers)": the same
        # in reals, and in floats the larger act never gives the smaller footprint, so the
        # fused kernel may leave out a rank that cannot hold more; where the copy
        # outweighs them the min form returned act + buffers - (act + buffers) with
        # rounding, a tie broken either way)
        foot = params * state + experts * state_e + np.maximum(
            act + buffers - (params * sc + experts * sce), 0.0)
        # (the offloaded bytes ride along only where some layout offloads: no full-size
        # selection of zeros on every call)
        this = (params, experts, act, foot) + ((offloaded,) if offloads else ())
        best = this if best is None else tuple(
            np.where(foot > best[3], a, b) for a, b in zip(this, best))
    params, experts, activations, footprint = best[:4]
    offloaded = best[4] if offloads else 0.0
    return Memory(weights=params * sw + experts * swe, grads=params * sg + experts * sge,
                  optim=params * so + experts * soe, activations=activations,
                  buffers=buffers, footprint=footprint, offloaded=offloaded)


# ---------------------------------------------------------------- 8. compose

def mtp_flops_per_sequence(w, s, h, d):
    """Megatron-LM's model FLOPs of one multi-token prediction module, one sequence [34]: a
    layer of the last layer's kind with one more logits, and 6 (3h + 2h^2) a token."""
    mla = dict(attention_params=w.attn_params, core_head_dim=w.core_dim) if w.mla else {}
    ffn, per_token = (w.moe_ffn, w.top_k) if w.moe else (w.ffn, 1.0)
    one = fl.megatron_model_flops(
        1.0, s, 1.0, h, heads=w.heads, kv_heads=w.kv_heads, ffn_hidden=ffn, vocab=w.vocab,
        gated=w.gated, experts_per_token=per_token, shared_ffn_hidden=w.shared * w.moe_ffn,
        head_dim=d, **mla)
    return one + 6.0 * s * (3.0 * h + 2.0 * h * h)


def _model_flops(w, batch, s, h, d, mtp=0):
    """Megatron-LM's model FLOPs of a step (MoE layers and dense layers counted apart; the
    multi-token prediction modules [34])."""
    return _model_flops_layers(w, batch, s, h, d) + mtp * batch * mtp_flops_per_sequence(w, s, h, d)


def _model_flops_layers(w, batch, s, h, d):
    """Megatron-LM's model FLOPs of a step's layers and head (MoE and dense layers apart)."""
    mla = dict(attention_params=w.attn_params, core_head_dim=w.core_dim) if w.mla else {}
    model_flops = fl.megatron_model_flops(
        batch, s, w.layers, h, heads=w.heads, kv_heads=w.kv_heads,
        ffn_hidden=np.where(w.moe, w.moe_ffn, w.ffn) if w.moe else w.ffn, vocab=w.vocab,
        gated=w.gated, experts_per_token=w.top_k if w.moe else 1.0,
        shared_ffn_hidden=w.shared * w.moe_ffn, head_dim=d, **mla)
    if w.moe and w.dense_layers:
        model_flops = model_flops + fl.megatron_model_flops(
            batch, s, w.dense_layers, h, heads=w.heads, kv_heads=w.kv_heads, ffn_hidden=w.ffn,
            vocab=0.0, gated=w.gated, head_dim=d, **mla) - fl.megatron_model_flops(
            batch, s, w.dense_layers, h, heads=w.heads, kv_heads=w.kv_heads, ffn_hidden=w.moe_ffn,
            vocab=0.0, gated=w.gated, experts_per_token=w.top_k,
            shared_ffn_hidden=w.shared * w.moe_ffn, head_dim=d, **mla)
    return model_flops


def _mask(out, valid, realizable, shape, order):
    """``out`` broadcast to ``shape``, NaN (float) or False (bool) where not ``valid``."""
    all_valid = bool(np.all(valid))
    nan = None if all_valid else np.where(valid, 0.0, np.nan)
    result = {"valid": np.broadcast_to(valid, shape), "realizable": np.broadcast_to(realizable, shape)}
    for name, value in out.items():
        value = np.asarray(value)
        if value.dtype == bool:
            value = value if all_valid else value & valid
        else:
            value = value.astype(np.float64, copy=False)
            if nan is not None:
                value = value + nan
        result[name] = np.broadcast_to(value, shape)
    return {name: result[name] for name in order}


def compose(w, c, sp: Split, hw: Hardware, ly: Layer, cm: Communication, pl: Pipeline,
            dpr: DataParallel, mm: Memory, shape, order):
    """Step time, throughput, utilization and the breakdowns, named as in ``order``."""
    batch, s, m, rc, n_acc = sp.batch, sp.s, sp.m, sp.rc, sp.n_acc
    h = ly.h
    total = pl.t_pipe + pl.t_pp + dpr.t_dp + dpr.t_opt + c["step_overhead"]
    t_offload = 0.0
    if np.any(np.asarray(mm.offloaded) > 0):
        # Activation offloading [51]: each microbatch's offloaded bytes cross the host link
        # (its one-way rate) to the host during the forward and back during the backward,
        # on streams of their own beside the layers' work: what a phase's copies outlast of
        # the stage's layers' time in that phase stalls it (Transformer Engine spreads the
        # layers' offloads over the forward, one group's due as the next's layers end: for
        # like layers, the sum of each group's excess is this one). Optimistic: at the
        # link's nominal rate (a PCIe Gen5 host-to-device copy measures some 15 % less), and
        # over all L layers (Transformer Engine's later schedule, one copy after another
        # on one stream, leaves about L - 2).
        copy = mm.offloaded / hw.host_bw
        layers = pl.layers_stage
        t_offload = m * (np.maximum(copy - layers * pl.window_f, 0.0)
                         + np.maximum(copy - layers * pl.window_b, 0.0))
        total = total + t_offload
    mtp = sp.mtp
    model_flops = _model_flops(w, batch, s, h, ly.d, mtp)
    per_acc = model_flops / (total * n_acc)
    # Hardware FLOPs: the recomputed forward too. Full recompute reruns every layer's
    # forward (a third of its FLOPs), not the output layer's (6 B s h V each, the main
    # one's and each MTP module's: Narayanan 2021 eq. 3's 96 B s l h^2 (1 + s/6h + V/16lh)
    # against 72 B s l h^2 (1 + s/6h + V/12lh)); selective, each layer's attention core,
    # QK^T and PV forward, 4 s heads core_dim FLOPs a token (Korthikanti 2022).
    # (one division: the fused kernel's loop is bound by them)
    head = 6.0 * batch * s * h * w.vocab * (1.0 + mtp)
    per_flop = 1.0 / model_flops
    full_share = 1.0
    if sp.partial:  # the share of the layers (MTP modules with them) recomputed [40]
        # (MTP modules are recomputed under full recompute alone, not the block method's)
        full_share = (steps.recomputed_total(w, sp) + mtp * (np.asarray(sp.rnl) == 0)) / (w.layers + mtp)
    recompute_extra = np.where(rc == 2, full_share * (model_flops - head) * per_flop * (1.0 / 3.0), np.where(
        rc == 1, 4.0 * s * w.heads * w.core_dim * (w.layers + mtp) * (batch * s) * per_flop, 0.0))
    if w.mla and np.any(sp.up_proj):
        # "mla_up_proj" [47]: a multi-head latent attention's up projections again, every
        # layer's (MTP's too), 2 FLOPs a weight a token (queries from h without a latent)
        up = 2.0 * w.heads * ((w.q_lora or h) * w.qk_dim + w.kv_lora * (w.qk_dim - w.rope + w.head_dim))
        recompute_extra = recompute_extra + np.where(
            sp.up_proj, up * (w.layers + mtp) * (batch * s) * per_flop, 0.0)
    if sp.checkpoints:
        # "mlp", "moe", "shared_experts" [47]: the checkpointed MLPs' forward again, 2 FLOPs a
        # weight a token (Megatron-LM's count: the router's not in it): every dense layer's
        # MLP, every MoE layer's routed (top-k) and shared experts or its shared experts
        # alone, twice where "moe" reruns the shared experts' own checkpoint; an MTP
        # module's layer as the last layer's kind [34]
        per_weight = 2.0 * (2.0 + w.gated) * h * (batch * s) * per_flop
        moe_layers = (w.moe_layers + mtp) if w.moe else 0
        dense_layers = w.dense_layers + (0 if w.moe else mtp)
        shared = w.shared * w.moe_ffn if w.moe else 0.0
        routed = w.top_k * w.moe_ffn if w.moe else 0.0
        recompute_extra = recompute_extra + per_weight * (
            np.where(sp.dense_mlp, dense_layers * w.ffn, 0.0)
            + moe_layers * (np.where(sp.moe_layer, routed + shared, 0.0)
                            + np.where(sp.shared_mlp, shared, 0.0)))
    # layer-microbatches of the stage that paces the pipeline, MTP's with them on the last
    last = pl.last_paced
    ms = m * (pl.paced_layers + mtp * last)
    mfu = per_acc / hw.peak_gemm
    # a layer's terms: ly's and cm's, or under a partial recompute the paced stage's mean
    lt = pl.paced or dict({name: getattr(ly, name) for name in steps._PACED_LAYER},
                          **{name: getattr(cm, name) for name in steps._PACED_COMM},
                          **{name: getattr(pl, name) for name in steps._PACED_PHASES})
    out = {
        "dp_size": sp.dp * 1.0,
        "microbatch_count": sp.m_exact,
        "step_latency_total": total,
        "effective_throughput": batch / total,
        "tokens_per_second_per_accelerator": batch * 1.0 * s / (total * n_acc),
        "model_flops_per_accelerator": per_acc,
        "mfu": mfu,
        "hfu": mfu * (1.0 + recompute_extra),
        "compute_latency": ms * (lt["layer_f"] + lt["layer_b"])
        + m * last * (pl.t_head + mtp * (pl.t_head + ly.t_mtp)),
        "tp_communication_latency": ms * lt["tp_layer"],
        "cp_communication_latency": ms * lt["cp_layer"],
        "ep_communication_latency": ms * lt["ep_layer"]
        - ms * np.minimum(lt["a2a_hidden"] - lt["a2a_launch"], lt["ep_layer"]),
        "pp_communication_latency": pl.t_pp,
        "dp_communication_latency": dpr.t_dp,
        "communication_latency": ms * (lt["tp_total"] + lt["cp_total"] + lt["ep_layer"])
        + pl.t_pp + dpr.t_dp_total,
        "pipeline_bubble_latency": pl.bubble,
        "bubble_fraction": pl.bubble / pl.t_pipe,
        "optimizer_latency": dpr.t_opt,
        # the host's launches a phase's GPU work does not hide (megatron_steps.pipeline's
        # windows over the same sums): with the terms above, the pipelined step's rest
        "launch_latency": ms * ((lt["window_f"] - (lt["layer_f"] + lt["tp_layer_f"]
                                                   + lt["cp_layer_f"] + lt["ep_layer_f"]))
                                + (lt["window_b"] - (lt["layer_b"] + lt["tp_layer_b"]
                                                     + lt["cp_layer_b"] + lt["ep_layer_b"])))
        - ms * lt["a2a_launch"],
        "memory_footprint": mm.footprint,
        "memory_weights": mm.weights,
        "memory_gradients": mm.grads,
        "memory_optimizer_state": mm.optim,
        "memory_activations": mm.activations,
        "memory_communication_buffers": mm.buffers,
        "offload_latency": t_offload,
    }
    if pl.paced is not None:
        # a stage of both kinds of layer: each kind's own launch time, in proportion (the
        # sums above, of means, can round below zero where neither kind has any)
        mixed = (lt["share"] > 0.0) & (lt["share"] < 1.0)
        out["launch_latency"] = np.where(mixed, ms * lt["launch"], out["launch_latency"])
    out["feasible"] = mm.footprint <= hw.memory_capacity
    return _mask(out, sp.valid, sp.realizable, shape, order)
