"""The named steps of :func:`solver.physics.megatron.solve`, like pvlib's ModelChain.

Each step takes the workload's shape, the knobs ``k`` and constants ``c`` (dicts
of arrays) and the earlier steps' results (small frozen dataclasses), and
returns its own; ``solver.physics.megatron._solve`` chains them. Steps 1-5 are
here, 6-8 in :mod:`solver.physics.megatron_compose`:

1. :func:`split` -- ranks, validity, microbatches, realizable;
2. :func:`hardware` -- per-precision peaks and plateaus, bandwidths, latencies;
3. :func:`layer_times` -- one layer's compute for one microbatch on one rank;
4. :func:`communication` -- TP, CP and EP terms per layer;
5. :func:`pipeline` -- heaviest stage, launch floor, bubble, p2p sends;
6. :func:`.megatron_compose.data_parallel` -- gradient reduction, parameter gathers, optimizer;
7. :func:`.megatron_compose.memory` -- each pipeline rank's memory (:func:`pipeline_ranks`);
8. :func:`.megatron_compose.compose` -- the outputs, NaN where the split is invalid.

The bracketed references ``[n]`` are those of :mod:`solver.physics.megatron`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .. import flops as fl
from .. import gemm
from .. import knobs as knobs_
from .. import network as net
from .common import even_splits

#: Recompute modes, coded 0, 1, 2.
RECOMPUTE = ("none", "selective", "full")
#: Megatron-Core's ``recompute_method`` under full recompute, coded 0, 1 [40].
RECOMPUTE_METHODS = ("block", "uniform")
#: The modules of Megatron-Core's ``recompute_modules`` (under ``recompute="selective"``) [47],
#: in the order their sets are named: every one it has.
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                     "shared_experts")
#: The values of the ``recompute_modules`` knob: every non-empty set of RECOMPUTE_MODULES,
#: named by its modules in that order joined by ","; code c is the set of bit mask c + 1
#: (bit i: RECOMPUTE_MODULES[i]), so 0, the default, is "core_attn" alone (and the sets of
#: the first four modules keep the codes 0-14 they had before the last three were priced).
RECOMPUTE_MODULE_SETS = tuple(
    ",".join(m for i, m in enumerate(RECOMPUTE_MODULES) if (mask >> i) & 1)
    for mask in range(1, 2 ** len(RECOMPUTE_MODULES)))


def recompute_module_set(value):
    """The ``recompute_modules`` value naming the same modules as ``value`` (a string of module
    names joined by "," or "+", spaces and order free): one of RECOMPUTE_MODULE_SETS. ValueError
    for a module Megatron-Core does not have."""
    names = [part.strip().lower() for part in str(value).replace("+", ",").split(",")]
    names = [n for n in names if n]
    unknown = [n for n in names if n not in RECOMPUTE_MODULES]
    if unknown or not names:
        which = f" ({', '.join(map(repr, unknown))} unknown)" if unknown else ""
        raise ValueError(f"recompute_modules must name one or more of "
                         f"{', '.join(map(repr, RECOMPUTE_MODULES))} joined by ',' or '+', "
                         f"but got {value!r}{which}")
    return ",".join(m for m in RECOMPUTE_MODULES if m in names)


def names_module(k, module):
    """Where ``recompute_modules`` names ``module``, under any ``recompute`` (Megatron-Core
    checks some pairings of the list whatever the granularity)."""
    mask = np.asarray(k.get("recompute_modules", 0)) + 1
    return (mask >> RECOMPUTE_MODULES.index(module)) & 1 == 1


def recompute_flags(k):
    """``(core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts)``: where
    ``recompute="selective"`` recomputes each (``recompute_modules`` [47]; the attention
    core alone by default)."""
    selective = np.asarray(k["recompute"]) == 1
    return tuple(selective & names_module(k, module) for module in RECOMPUTE_MODULES)


#: Megatron-Core's ``fp8_recipe`` under ``precision="fp8"`` (Transformer Engine's
#: ``DelayedScaling``, ``Float8CurrentScaling``, ``Float8BlockScaling``,
#: ``MXFP8BlockScaling``), coded 0..3, "delayed" Megatron-Core's default [48].
FP8_RECIPES = ("delayed", "tensorwise", "blockwise", "mxfp8")
_DELAYED = FP8_RECIPES.index("delayed")
#: The architectures (the catalog's ``architecture``) whose tensor cores run each recipe's
#: GEMMs, Transformer Engine's support matrix [48]: FP8 per tensor (delayed and current
#: scaling) from Ada and Hopper on, FP8 block scaling on Hopper and Blackwell, MXFP8 on
#: Blackwell (data center) alone. (Per-tensor FP8 is the precision rule's: an FP8 peak.)
FP8_RECIPE_ARCHITECTURES = {"blockwise": ("hopper", "blackwell"), "mxfp8": ("blackwell",)}


def delayed_scaling(k):
    """Where FP8 GEMMs run under delayed scaling: ``precision="fp8"`` with ``fp8_recipe``
    "delayed" (the default) [48]."""
    return (np.asarray(k["precision"]) == _FP8) & (np.asarray(k.get("fp8_recipe", 0)) == _DELAYED)


def fp8_recipe_runs(fleet, k):
    """Where the accelerator runs ``fp8_recipe``'s GEMMs (always outside ``precision="fp8"``)
    [48]: a recipe of blocks on the architectures of :data:`FP8_RECIPE_ARCHITECTURES` (an
    accelerator that states none is taken to lack them)."""
    arch = (fleet.node.accelerator.architecture or "").lower()
    runs = np.array([arch in FP8_RECIPE_ARCHITECTURES.get(r, (arch,)) for r in FP8_RECIPES])
    return (np.asarray(k["precision"]) != _FP8) | runs[np.asarray(k.get("fp8_recipe", 0))]


#: Context-parallel communication kinds (Megatron-Core's ``cp_comm_type``), coded 0..3 [42].
CP_COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")
_CP_ALL_GATHER, _CP_A2A, _CP_HIER = (CP_COMM_TYPES.index(kind) for kind in CP_COMM_TYPES[1:])
#: Precisions of the GEMMs (weights stay 16-bit), coded 0..3.
PRECISIONS = ("bf16", "fp16", "fp8", "fp4")
_FP16, _FP8 = PRECISIONS.index("fp16"), PRECISIONS.index("fp8")

#: Network latency per algorithm step [s], NVLink and scale-out [8] (a fabric's
#: own stated latency is used for scale-out when it states one).
SCALE_UP_STEP_LATENCY = 1e-6
SCALE_OUT_STEP_LATENCY = 2e-6
#: Dense peak [FLOP/s] the GEMM curves' constants refer to (Calculon's A100, [8] of gemm).
GEMM_REFERENCE_PEAK = 312e12
#: Plateau share of peak for a large GEMM when the accelerator states none: the median
#: of the NVIDIA rows of the measured matmul plateaus the catalog cites (MAMF, the
#: header of configs/catalog/megatron.toml: A100 SXM 86.9 %, GH200 83.8 %, A100 PCIe
#: 81.1 %, H100 SXM 80.3 %, B300 78.6 %, B200 77.6 %, GB200 72.9 %); the fitted
#: ``gemm_scale`` multiplies it. (Calculon's 0.95 until 2026-12-04.)
DEFAULT_GEMM_PLATEAU = 0.8033
#: Adam step: FP32 grad read, master/m/v read+write, 16-bit weight write [B per parameter].
OPTIMIZER_BYTES_TOUCHED = 30.0
#: Unfused attention: bytes through HBM per score element, forward (scores, mask,
#: softmax, dropout: write + read of each 2-byte tensor, 1-byte mask) [2].
SOFTMAX_BYTES = 11.0
#: FlashAttention-2 backward / forward FLOPs [5].
FLASH_BACKWARD_RATIO = 2.5
#: Share of the 16-bit dense peak a fused causal attention kernel achieves when the
#: accelerator states none (``gemm_efficiency["flash_attention"]`` in the catalog):
#: FlashAttention-2 forward, causal, head dim 128, 4k-16k tokens on H100 SXM5,
#: 319-335 TFLOP/s of 989 [10]; the backward is taken at the same rate.
DEFAULT_FLASH_ATTENTION_EFFICIENCY = 0.33
#: Bytes through HBM per FP32 logit element of the vocabulary-parallel cross-entropy,
#: forward and backward [11]: cast of the 16-bit logits to FP32 (2 + 4), max (4),
#: subtract the max (4 + 4), exp (4 + 4), sum (4), divide into the softmax kept for
#: the backward (4 + 4); backward: scale the softmax by the loss gradient (4 + 4) and
#: cast to 16 bits for the logits GEMM's backward (4 + 2).
CROSS_ENTROPY_BYTES = 52.0
#: Bytes through HBM per 16-bit logit element of Transformer Engine's fused cross-entropy
#: (``cross_entropy_fusion_impl="te"``) [44]: forward, its online-softmax pass reads the
#: logits (2) and its loss pass reads them again and writes the gradient into them in
#: place (2 + 2); backward, the gradient scaled by the loss gradient in place (2 + 2).
TE_CROSS_ENTROPY_BYTES = 10.0
#: Knob codes of ``cross_entropy_fusion_impl`` (Megatron-Core's) [44].
CROSS_ENTROPY_IMPLS = ("native", "te")


def te_cross_entropy(k):
    """Where Transformer Engine's fused cross-entropy runs: ``cross_entropy_loss_fusion``
    with ``cross_entropy_fusion_impl`` "te" (codes) [44]."""
    return np.asarray(k.get("cross_entropy_loss_fusion", False)) & (
        np.asarray(k.get("cross_entropy_fusion_impl", 0)) == CROSS_ENTROPY_IMPLS.index("te"))
#: ``main_params_dtype`` and ``exp_avg_dtype`` / ``exp_avg_sq_dtype`` of Megatron-Core's
#: precision-aware optimizer (its ``--main-params-dtype``, ``--exp-avg-dtype`` and
#: ``--exp-avg-sq-dtype`` choices), coded by index, and their bytes an element [45]. An
#: FP8 moment is a byte with one FP32 scale a tensor (not counted).
MAIN_PARAMS_DTYPES = ("fp32", "fp16")
MOMENT_DTYPES = ("fp32", "fp16", "bf16", "fp8")
MAIN_PARAMS_BYTES = (4.0, 2.0)
MOMENT_BYTES = (4.0, 2.0, 2.0, 1.0)
#: Bytes through HBM a state element in the optimizer step, by MOMENT_DTYPES code (FP16 also
#: the master weights'): FP32 the kernel's read and write; the narrower through TE's FP32
#: copies (megatron_compose.optimizer) [45].
MOMENT_STEP_BYTES = (8.0, 40.0, 20.0, 22.0)


def precision_aware(k):
    """Where Megatron-Core's precision-aware optimizer runs: ``use_precision_aware_optimizer``
    beside the distributed optimizer or FSDP (``zero_stage >= 1``). Megatron-Core refuses
    it without them [45]; such a layout is priced as without it (and not realizable)."""
    return np.asarray(k.get("use_precision_aware_optimizer", False)) & (
        np.asarray(k["zero_stage"]) >= 1)
#: Megatron pads the vocabulary to a multiple of this times the TP size
#: (``make_vocab_size_divisible_by``'s default) [41].
VOCAB_DIVISOR = 128.0


def vocab_per_rank(w, tp):
    """The vocabulary entries a TP rank holds, padded as Megatron pads the vocabulary to a
    multiple of :data:`VOCAB_DIVISOR` x TP [41] (0.0 for a workload with no shape)."""
    return np.ceil(w.vocab / (VOCAB_DIVISOR * tp)) * VOCAB_DIVISOR
#: A multi-token prediction module's memory-bound work, bytes per token over h, forward
#: [34]: three RMSNorms (embedding, hidden state, output: 2 + 2 each) and the
#: concatenation of the two normed inputs (2h read, 2h written, 2 bytes).
MTP_ELEMENTWISE_BYTES = 20.0


def _peak(acc, key):
    pf = acc.precision_flops
    if key in ("bf16", "fp16"):
        for k in (key, "fp16" if key == "bf16" else "bf16", "fp16_dense"):
            if k in pf:
                return pf[k]
        return acc.peak_flops
    return pf.get(key, _peak(acc, "bf16") if key == "fp8" else _peak(acc, "fp8"))


def supports(acc, key):
    """Whether the accelerator runs GEMMs in precision ``key`` [21]: 16 bits everywhere, FP8
    and FP4 where the catalog states their peak (FP8 from Hopper/Ada on, FP4 on Blackwell)."""
    return key in ("bf16", "fp16") or key in acc.precision_flops


def architecture_gemm_scale(acc, c):
    """The fitted multiplier on the GEMM plateau of ``acc``'s architecture.

    Fitted, the H100 runs of benchmarks/data/ reach a smaller share of the H100's measured
    matmul plateau than the A100 runs of the A100's: with one ``gemm_scale`` for both, most
    runs of each H100 source left out of the fit were predicted fast (README, Fidelity).
    ``hopper_gemm_scale`` applies from Hopper on: to the catalog's ``architecture =
    "hopper"`` (H100, H200) and ``"blackwell"`` (B200, B300, GB200, GB300), which runs the
    same software stack as the H100 runs and reaches less of its rated peak still (its own
    measured plateau, the catalog's, says by how much). No Blackwell run is in the data:
    carrying Hopper's factor over is an extrapolation, one that keeps a Blackwell GPU's
    GEMMs faster than a Hopper's by exactly their measured matmul ratio. Ampere and the
    architectures the catalog does not name get 1."""
    return c["hopper_gemm_scale"] if acc.architecture in ("hopper", "blackwell") else 1.0


def _plateau(acc, key, c=None):
    """The large-GEMM plateau of ``acc`` in precision ``key``: the catalog's measured one
    (its ``bf16`` where it states none for ``key``; :data:`DEFAULT_GEMM_PLATEAU` where it
    states none at all), or the constant ``gemm_plateau`` of ``c`` for every GPU and
    precision when that is set (> 0: calibration profiles fitted before the catalog stated
    measured plateaus carry 0.95, the one they were fitted under)."""
    uniform = 0.0 if c is None else float(c["gemm_plateau"])
    if uniform > 0.0:
        return uniform
    ge = acc.gemm_efficiency
    return ge.get(key, ge.get("bf16", DEFAULT_GEMM_PLATEAU))


def _exposed(comm, window, efficiency, idle=0.0):
    """Communication left after hiding it behind ``efficiency * window`` of compute and
    ``idle`` time with no compute beside it [s]."""
    return np.maximum(comm - efficiency * window - idle, 0.0)


# ------------------------------------------------------------------ 1. split

@dataclass(frozen=True)
class Split:
    """The knobs as arrays and the rank split they give."""
    tp: object
    pp: object
    cp: object
    ep: object
    #: the expert tensor-parallel degree (tp where the knob is not given)
    etp: object
    v: object
    mbs: object
    batch: object
    s: object
    sp: object
    rc: object
    zero: object
    prec: object
    dp: object
    group: object
    valid: object
    n_acc: object
    m_exact: object
    m: object
    realizable: object
    p2p_split: object
    p2p_steady: object
    #: multi-token prediction modules on the last stage [34]
    mtp: object
    #: layers of the first and the last pipeline stage where set, else 0 [13]
    first: object
    last: object
    #: the share of the first rank's microbatches (chunks) the combined 1F1B schedule
    #: pairs (overlap_moe_expert_parallel_comm [35]; 0.0 without it): combined_1f1b_paired
    a2a_paired: object = 0.0
    #: recompute_num_layers: under full recompute, each chunk's recomputed layers (0: all),
    #: the block method's [40] (0 under the uniform method, which recomputes every layer)
    rnl: object = 0
    #: the layers of one checkpoint under full recompute: recompute_num_layers under the
    #: uniform method (recompute_method "uniform"), 1 under the block method [40]
    rgroup: object = 1
    #: cp_comm_type's code (CP_COMM_TYPES; 0, the K/V ring, by default) [42]
    cpc: object = 0
    #: cp_a2a_size: the all-to-all group of hierarchical CP ("a2a+p2p"; 0: not set) [42]
    cpa: object = 0
    #: where Transformer Engine's fused cross-entropy runs (cross_entropy_loss_fusion with
    #: cross_entropy_fusion_impl "te") [44]
    ce_te: object = False
    #: where selective recompute discards and recomputes the routed experts' activation
    #: (recompute_modules "moe_act") and the norms that run apart from a linear layer
    #: ("layernorm") [47]; rc is the attention core's ("core_attn"): 1 only where it is in
    moe_act: object = False
    norms: object = False
    #: where it discards and recomputes a multi-head latent attention's up projections
    #: ("mla_up_proj") [47]
    up_proj: object = False
    #: where it checkpoints (keeps the input of, and runs again before its backward) a dense
    #: layer's MLP ("mlp"), an MoE layer whole (router, dispatch, experts, combine: "moe"),
    #: an MoE layer's shared experts ("shared_experts") [47]
    dense_mlp: object = False
    moe_layer: object = False
    shared_mlp: object = False
    #: where an MoE layer's shared experts run on a stream of their own beside the
    #: dispatcher (moe_shared_expert_overlap, on a model with shared experts) [49]
    se_overlap: object = False

    @property
    def modules(self):
        """Whether any configuration recomputes a module other than the attention core."""
        return bool(np.any(self.moe_act) or np.any(self.norms) or np.any(self.up_proj)
                    or self.checkpoints)

    @property
    def checkpoints(self):
        """Whether any configuration checkpoints a dense layer's MLP, an MoE layer or its
        shared experts ("mlp", "moe", "shared_experts")."""
        return bool(np.any(self.dense_mlp) or np.any(self.moe_layer) or np.any(self.shared_mlp))

    @property
    def grouped(self):
        """Whether any configuration checkpoints more than one layer at once (:attr:`rgroup`)."""
        return bool(np.any(np.asarray(self.rgroup) > 1))

    @property
    def partial(self):
        """Whether any configuration recomputes only some of its layers (:func:`recomputed`)."""
        return bool(np.any((np.asarray(self.rc) == 2) & (np.asarray(self.rnl) > 0)))

    def plain(self):
        """The split with the layers a partial recompute leaves alone: full recompute's
        code (2) made none (0), the other modes as they are (:func:`recomputed`)."""
        return replace(self, rc=np.where(np.asarray(self.rc) == 2, 0, self.rc))


def recomputed(sp: Split, n):
    """Layers of a stage of ``n`` whose forward is recomputed in full: ``n`` under
    ``recompute="full"`` (none under the other modes), but with ``recompute_num_layers``
    (``rnl``) set the first ``rnl`` of each of its ``v`` chunks of ``n / v`` [40]. The
    stage's other layers are :meth:`Split.plain`'s."""
    v = np.asarray(sp.v) * 1.0
    part = np.where(np.asarray(sp.rnl) > 0, v * np.minimum(sp.rnl, n / v), n)
    return np.where(np.asarray(sp.rc) == 2, part, 0.0)


def recomputed_total(w, sp: Split):
    """The model's layers :func:`recomputed` over its stages (:func:`stage_layers`, or
    ``ceil(layers / pp)`` each where none is set), at most its layers; all of them under
    full recompute without ``recompute_num_layers``, whether or not the stages split."""
    pp = np.asarray(sp.pp) * 1.0
    nf, nm, nl = held_layers(w, pp, sp.first, sp.last)
    some = np.where(pp > 1, recomputed(sp, nf) + (pp - 2.0) * recomputed(sp, nm)
                    + recomputed(sp, nl), recomputed(sp, float(w.layers)))
    rc2 = np.asarray(sp.rc) == 2
    return np.where(rc2 & (np.asarray(sp.rnl) > 0), np.minimum(some, w.layers),
                    np.where(rc2, float(w.layers), 0.0))


#: What each condition of :func:`realizable_conditions` asks, by name (the ``realizable``
#: output holds where the split is valid and every one holds).
REALIZABLE_CONDITIONS = {
    "whole_microbatches": "the global batch splits into whole microbatches, one or more, on "
                          "each data-parallel rank (batch_size divisible by dp_size * "
                          "micro_batch_size)",
    "heads_and_experts": "tp_size divides the attention heads and ep_size the experts (1 on a "
                         "dense model)",
    "layers": "the layers split into pp_size * v_stages equal chunks, or as the first and last "
              "stages' layers are set (the rest evenly over the stages between, every stage's "
              "by v_stages; Megatron-LM refuses other splits) [13], or, with "
              "account_for_embedding/loss_in_pipeline_split, the layers plus one for each "
              "into pp_size equal stages of two or more, each by v_stages, and no stage's "
              "layers set [36]",
    "kv_heads": "tp_size divides the KV heads [16]",
    "interleaved_microbatches": "an interleaved schedule's microbatches come in groups of "
                                "pp_size [17]",
    "interleaved_p2p": "an interleaved schedule without overlap_p2p_comm runs on more than two "
                       "stages (two would batch several sends and receives between the same "
                       "two ranks) [27]",
    "cp_sequence": "seq_len divides by 2 * cp_size",
    "cp_flash": "context parallelism runs with flash attention [18]",
    "sp_sequence": "under sequence parallelism seq_len divides by tp_size * cp_size [19]",
    "cp_a2a_heads": "cp_comm_type='a2a' (Ulysses) needs cp_size to divide each TP rank's "
                    "attention heads and its KV heads [42]",
    "cp_hierarchy": "cp_comm_type='a2a+p2p' needs cp_a2a_size set, dividing cp_size and each "
                    "TP rank's attention heads and KV heads [42]",
    "cp_comm_mla": "a multi-head latent attention runs context parallelism with cp_comm_type "
                   "'p2p', or 'a2a+p2p' with a ring (cp_a2a_size below cp_size), only [42]",
    "ep_precision": "expert parallelism does not run in fp16 [15]",
    "expert_width": "etp_size divides an expert's width [6]",
    "moe_tp_needs_sp": "an MoE model with tp_size > 1 needs sequence_parallel [20]",
    "tp_comm_overlap_needs_sp": "tp_comm_overlap needs sequence_parallel (and tp_size > 1) [15]",
    "tp_comm_overlap_domain": "tp_comm_overlap needs every TP group inside one NVLink domain "
                              "(Transformer Engine's userbuffers) [37]",
    "param_gather_needs_grad_reduce": "overlap_param_gather needs overlap_grad_reduce under the "
                                      "distributed optimizer",
    "no_sharding_with_pipeline": "ZeRO-2/3 (FSDP) runs without a pipeline [30]",
    "recompute_layers": "recompute_num_layers is set only under recompute='full' (Megatron-Core "
                        "refuses it beside selective recompute) [40]",
    "recompute_method": "recompute_method 'uniform' is refused under selective recompute and "
                        "beside overlap_moe_expert_parallel_comm [40]",
    "recompute_uniform": "recompute_method 'uniform' with recompute_num_layers > 1 (under full "
                         "recompute) needs it to divide every pipeline chunk's layers, and no "
                         "MTP layer [40]",
    "a2a_overlap": "overlap_moe_expert_parallel_comm needs ep_size > 1, no full recompute and "
                   "no 'moe' in recompute_modules (whatever recompute is), an interleaved "
                   "schedule (v_stages > 1) where pp_size > 1, and at most one MTP layer "
                   "[35] [47]",
    "shared_expert_overlap": "moe_shared_expert_overlap is refused beside "
                             "overlap_moe_expert_parallel_comm and, on a model with shared "
                             "experts, beside 'shared_experts' in recompute_modules under "
                             "recompute='selective' [49]",
    "deepep_group": "the flex dispatcher (moe_enable_deepep) of an MoE model needs etp_size x "
                    "ep_size > 1 [39]",
    "hybridep_layout": "the flex dispatcher's HybridEP backend (moe_flex_dispatcher_backend "
                       "'hybridep') needs its group (etp_size x ep_size ranks) split evenly "
                       "over the NVLink domains it spans (inside one that its groups tile, or "
                       "whole ones), at most 72 and an even number of them a domain, its "
                       "local experts (experts / ep_size) times those ranks divisible by 4, "
                       "and a hidden size divisible by 512 [50]",
    "cpu_offloading": "cpu_offloading_num_layers (activations offloaded to the host) needs "
                      "pp_size 1, recompute='none', fewer than the model's layers, and the "
                      "accelerator's host link in the catalog (host_link_bandwidth) [51]",
    "flex_architecture": "the flex dispatcher (moe_enable_deepep) runs on NVIDIA Ampere, "
                         "Hopper and Blackwell GPUs (the catalog's architecture) [39] [50]",
    "deepep_domain": "DeepEP runs on NVLink domains of at most 8 GPUs (not GB200/GB300 NVL72 "
                     "racks, whose flex dispatcher is HybridEP) [39]",
    "moe_router_groups": "moe_router_group_topk (group-limited routing) of an MoE model needs "
                         "moe_router_num_groups set, dividing the experts and no smaller than "
                         "moe_router_group_topk, moe_router_group_topk dividing top-k, and "
                         "each group holding top-k / moe_router_group_topk experts or more [46]",
    "fp8_recipe": "under precision='fp8', fp8_recipe 'mxfp8' needs a Blackwell accelerator "
                  "and 'blockwise' a Hopper or Blackwell one [48]",
    "recompute_mla_up_proj": "recompute_modules 'mla_up_proj' (under recompute='selective') "
                             "needs multi-head latent attention [47]",
    "recompute_fp8_recipe": "recompute_modules 'moe_act' and 'layernorm' under precision='fp8' "
                            "need an fp8_recipe other than 'delayed' [47]",
    "fp8_param_gather": "fp8_param_gather needs precision='fp8' and the distributed optimizer "
                        "or FSDP (zero_stage >= 1) [43]",
    "precision_aware_optimizer": "use_precision_aware_optimizer needs the distributed "
                                 "optimizer or FSDP (zero_stage >= 1) [45]",
    "optimizer_dtypes": "main_params_dtype, exp_avg_dtype and exp_avg_sq_dtype other than "
                        "'fp32' need use_precision_aware_optimizer [45]",
    "precision": "the accelerator has the precision [21]",
}


def _uniform(k):
    """Where ``recompute_method`` is "uniform" [40]."""
    return np.asarray(k.get("recompute_method", 0)) == RECOMPUTE_METHODS.index("uniform")


def _uniform_groups_hold(w, k):
    """Where the uniform method's checkpoints of ``recompute_num_layers`` layers (more than
    one, under full recompute) fit Megatron-Core [40]: the number divides the layers of every
    pipeline chunk (``_checkpointed_forward`` checkpoints ``layers[i : i + n]`` for ``i`` in
    steps of ``n`` and indexes past the chunk's last layer otherwise), and no multi-token
    prediction layer (whose checkpoint asserts one layer)."""
    n = np.asarray(k.get("recompute_num_layers", 0))
    grouped = _uniform(k) & (np.asarray(k["recompute"]) == 2) & (n > 1)
    if not np.any(grouped):
        return np.ones(np.shape(grouped), dtype=bool)
    pp, v = np.asarray(k["pp_size"]), np.asarray(k["v_stages"])
    nf, nm, nl = held_layers(w, pp, k["num_layers_in_first_pipeline_stage"],
                             k["num_layers_in_last_pipeline_stage"])
    safe = np.maximum(n, 1)

    def divides(layers):
        chunk = layers / np.maximum(v, 1)
        return (chunk == np.floor(chunk)) & (np.mod(chunk, safe) == 0)
    fits = divides(nf) & ((pp <= 2) | divides(nm)) & ((pp == 1) | divides(nl))
    return ~grouped | (fits & (np.asarray(k["mtp_num_layers"]) == 0))


def realizable_conditions(w, fleet, k, m_exact, n_acc) -> dict:
    """Each condition of ``realizable`` (:data:`REALIZABLE_CONDITIONS`): name -> where it
    holds, for the knobs ``k`` and the microbatches ``m_exact`` and ranks ``n_acc`` of
    :func:`split`."""
    tp, pp, cp, ep = k["tp_size"], k["pp_size"], k["cp_size"], k["ep_size"]
    etp = k.get("etp_size", tp)
    v, s, prec = k["v_stages"], k["seq_len"], k["precision"]
    sp = k["sequence_parallel"] & (tp > 1)
    first, last = k["num_layers_in_first_pipeline_stage"], k["num_layers_in_last_pipeline_stage"]
    n_mid = stage_layers(w, pp, first, last)[2]
    middle = pp - (first > 0) - (last > 0)
    rest = w.layers - first - last
    # Set first and last stages [13]: a pipeline, the rest of the layers split evenly over
    # the stages between, a layer or more each (none left where there are none), each
    # stage's layers divisible by v_stages when interleaved.
    modules = dict(zip(RECOMPUTE_MODULES, recompute_flags(k)))  # [47]
    layers_set = ((pp > 1) & (rest >= 0)
                  & np.where(middle > 0, (rest % np.maximum(middle, 1) == 0) & (rest >= middle),
                             rest == 0)
                  & ((v == 1) | ((first % v == 0) & (last % v == 0) & (n_mid % v == 0))))
    return {
        "whole_microbatches": (m_exact == np.floor(m_exact)) & (m_exact >= 1),
        # heads and experts (EP 1 on a dense model) split evenly
        "heads_and_experts": even_splits((w.heads, 0, w.experts if w.moe else 1),
                                         tp_size=tp, pp_size=pp, v_stages=v, ep_size=ep),
        # layers into pp * v equal chunks, or the first and last stages' as set:
        # Megatron-LM's validate_args refuses layers pp does not divide unless they are set [13]
        # or, with account_for_embedding/loss_in_pipeline_split, Megatron-Core's rule for
        # them, decided where they became set stages (megatron._account_stages) [36]
        "layers": _accounted(k.get("pipeline_split", 0),
                             np.where((first > 0) | (last > 0), layers_set,
                                      _even_chunks(w.layers, pp, v))),
        "kv_heads": w.kv_heads % tp == 0,  # [16]
        # the interleaved schedule runs microbatches in groups of pp [17]
        "interleaved_microbatches": (v == 1) | ((m_exact % pp == 0) & (m_exact >= pp)),
        # Megatron-LM's validate_args: "When interleaved schedule is used and p2p
        # communication overlap is disabled, pipeline-model-parallel size should be
        # greater than 2" [27]
        "interleaved_p2p": (v == 1) | k["overlap_p2p_comm"] | (pp > 2),
        "cp_sequence": (cp == 1) | (s % (2 * cp) == 0),
        "cp_flash": (cp == 1) | k["flash_attention"],  # [18]
        "sp_sequence": ~sp | (s % (tp * cp) == 0),  # [19]
        # "The number of attention heads needs to be divisible by CP size!", of the query
        # heads and KV groups a TP rank holds [42]
        "cp_a2a_heads": (cp == 1) | (k.get("cp_comm_type", 0) != _CP_A2A) | (
            (w.heads % (tp * cp) == 0) & (w.kv_heads % (tp * cp) == 0)),
        # "--hierarchical-context-parallel-sizes must be set when a2a+p2p is used", its
        # product the CP size; TE's all-to-all over the first group asserts as above [42]
        "cp_hierarchy": (cp == 1) | (k.get("cp_comm_type", 0) != _CP_HIER) | _hierarchy(
            w, tp, cp, k.get("cp_a2a_size", 0)),
        # "MLA CP currently only support KV P2P!": the kinds with a ring, where TE's check
        # follows its fallback of a2a+p2p with one all-to-all group of all the CP ranks to
        # a2a [42]
        "cp_comm_mla": (cp == 1) | (k.get("cp_comm_type", 0) == 0) | (
            (k.get("cp_comm_type", 0) == _CP_HIER) & (k.get("cp_a2a_size", 0) < cp)) | (not w.mla),
        "ep_precision": (ep == 1) | (prec != _FP16),  # [15]
        # an expert's width splits evenly over its TP ranks [6]
        "expert_width": (not w.moe) | (w.moe_ffn % etp == 0),
        "moe_tp_needs_sp": (tp == 1) | sp | (not w.moe),  # [20]
        "tp_comm_overlap_needs_sp": ~(k["tp_comm_overlap"] & ~sp),  # [15]: tp 1 turns SP off
        # userbuffers reach the ranks of one NVLink domain only [37]
        "tp_comm_overlap_domain": ~(k["tp_comm_overlap"] & sp) | groups_within(
            fleet.node.scale_up_domain or fleet.node.accelerators_per_node, tp, n_acc),
        "param_gather_needs_grad_reduce": ~(k["overlap_param_gather"] & ~k["overlap_grad_reduce"]
                                            & (k["zero_stage"] >= 1)),
        # sharded gradients or parameters (ZeRO-2/3, FSDP) with a pipeline [30]
        "no_sharding_with_pipeline": ~((k["zero_stage"] >= 2) & (pp > 1)),
        "recompute_layers": (k.get("recompute_num_layers", 0) == 0) | (k["recompute"] == 2),  # [40]
        # Megatron-LM: "recompute method is not yet supported for selective recomputing
        # granularity"; "disable recomputation method when enabling
        # overlap_moe_expert_parallel_comm" [40]
        "recompute_method": ~_uniform(k) | ((k["recompute"] != 1)
                                            & ~k["overlap_moe_expert_parallel_comm"]),
        # its checkpoints of n layers index past a chunk's last layer unless n divides it,
        # and "recompute_num_layers must be 1 for MTP recompute" [40]
        "recompute_uniform": _uniform_groups_hold(w, k),
        # Megatron-Core's TransformerConfig refuses the combined 1F1B schedule otherwise [35]
        "a2a_overlap": ~k["overlap_moe_expert_parallel_comm"] | (
            (ep > 1) & (k["recompute"] != 2) & ((pp == 1) | (v > 1)) & (k["mtp_num_layers"] <= 1)
            & ~names_module(k, "moe")),
        # "disable moe_shared_expert_overlap when enabling overlap_moe_expert_parallel_comm"
        # (whatever the model); where the model has shared experts, "shared_experts
        # recompute cannot work with --moe-shared-expert-overlap" [49]
        "shared_expert_overlap": ~np.asarray(k.get("moe_shared_expert_overlap", False)) | (
            ~k["overlap_moe_expert_parallel_comm"]
            & ~(bool(w.moe and w.shared) & modules["shared_experts"])),
        # "Flex token dispatcher requires TPxEP > 1" (its TP the expert grid's) [39]
        "deepep_group": ~k["moe_enable_deepep"] | (not w.moe) | (etp * ep > 1),
        # DeepEP reaches 8 NVLink peers; Megatron-Bridge refuses it on GB200/GB300 [39]
        "deepep_domain": ~k["moe_enable_deepep"] | (not w.moe) | hybridep(k) | (
            (fleet.node.scale_up_domain or fleet.node.accelerators_per_node) <= DEEPEP_NVL_PEERS),
        # HybridEP's buffer and kernels (hybrid_ep_buffer.py, csrc/hybrid_ep/config.cuh) [50]
        "hybridep_layout": ~hybridep(k) | (not w.moe) | _hybridep_groups_hold(w, fleet, k, n_acc),
        # "Currently there is no support for Pipeline parallelism with CPU offloading", "CPU
        # offloading does not work when activation recomputation is enabled", "CPU
        # offloading can be done only for layers less than {num_layers}" [51]
        "cpu_offloading": (np.asarray(k.get("cpu_offloading_num_layers", 0)) == 0) | (
            (pp == 1) & (k["recompute"] == 0)
            & (np.asarray(k.get("cpu_offloading_num_layers", 0)) < w.layers)
            & (fleet.node.accelerator.host_link_bandwidth is not None)),
        # Megatron-Bridge's validate_flex_dispatcher_backend [39] [50]
        "flex_architecture": ~k["moe_enable_deepep"] | (not w.moe) | flex_runs_on(fleet),
        # Megatron-Core's TransformerConfig: "moe_router_num_groups must be specified", the
        # experts divisible by it, moe_router_group_topk no larger; Transformer Engine's
        # fused router: "topk must be divisible by group_topk" (the unfused one ranks groups
        # by their top topk // group_topk scores); and a group at least that wide, or its
        # top-(topk // group_topk) fails [46]
        "moe_router_groups": _groups_hold(w, k.get("moe_router_num_groups", 0),
                                          k.get("moe_router_group_topk", 0)),
        # "--fp8-param-gather only supported with distributed optimizer, torch fsdp2, megatron
        # fsdp, or inference mode"; FP8 parameters need FP8 GEMMs [43]
        # Transformer Engine's support matrix: MXFP8 on Blackwell, FP8 blocks on Hopper and
        # Blackwell [48]
        "fp8_recipe": fp8_recipe_runs(fleet, k),
        # "mla_up_proj in recompute_modules is only supported with multi_latent_attention" [47]
        "recompute_mla_up_proj": w.mla | ~modules["mla_up_proj"],
        # "Delayed scaling does not support moe_act and layernorm recompute for fp8" [47]
        "recompute_fp8_recipe": ~(delayed_scaling(k) & (modules["moe_act"] | modules["layernorm"])),
        "fp8_param_gather": ~np.asarray(k.get("fp8_param_gather", False)) | (
            (prec == _FP8) & (k["zero_stage"] >= 1)),
        # "--use-precision-aware-optimizer only supported with distributed optimizer" [45]
        "precision_aware_optimizer": ~np.asarray(k.get("use_precision_aware_optimizer", False))
        | (k["zero_stage"] >= 1),
        # "main_params_dtype can only be fp32 when not using precision-aware optimizer", and
        # so exp_avg_dtype and exp_avg_sq_dtype [45]
        "optimizer_dtypes": np.asarray(k.get("use_precision_aware_optimizer", False)) | (
            (np.asarray(k.get("main_params_dtype", 0)) == 0)
            & (np.asarray(k.get("exp_avg_dtype", 0)) == 0)
            & (np.asarray(k.get("exp_avg_sq_dtype", 0)) == 0)),
        "precision": np.array([supports(fleet.node.accelerator, p) for p in PRECISIONS])[prec],
    }


def split(w, fleet, k) -> Split:
    """TP x CP x DP x PP ranks (EP folded into DP x CP [6]) and microbatches."""
    tp, pp, cp, ep = k["tp_size"], k["pp_size"], k["cp_size"], k["ep_size"]
    etp = k.get("etp_size", tp)
    v, mbs, batch, s = k["v_stages"], k["micro_batch_size"], k["batch_size"], k["seq_len"]
    sp = k["sequence_parallel"] & (tp > 1)
    model_parallel = tp * 1.0 * pp * cp
    if "dp_size" in k:
        dp = k["dp_size"]
        valid = model_parallel * dp < knobs_.MAX_INTEGER
    else:
        n_total = fleet.total_accelerators
        fits = model_parallel <= n_total
        safe = np.where(fits, model_parallel, 1.0)
        valid = fits & (n_total % safe == 0)
        dp = np.where(valid, n_total // safe, 1).astype(np.int64)
    group = dp * cp  # gradient / optimizer-shard group [6]
    # the expert grid etp x ep x edp x pp tiles the same ranks [6]: etp ep divides tp cp dp
    # (at etp = tp, ep divides the group)
    valid = valid & ((tp * group) % (etp * ep) == 0)
    n_acc = model_parallel * dp
    m_exact = batch / (dp * 1.0 * mbs)
    # A batch that does not split into whole microbatches runs its last one partly
    # filled, in a whole microbatch's time (and is not realizable): pricing floor(m)
    # microbatches for the whole batch's FLOPs gave an MFU above 1.
    m = np.maximum(np.ceil(m_exact), 1.0)
    prec = k["precision"]
    first, last = k["num_layers_in_first_pipeline_stage"], k["num_layers_in_last_pipeline_stage"]
    rc, moe_act, norms, up_proj = k["recompute"], False, False, False
    dense_mlp = moe_layer = shared_mlp = False
    if np.any(np.asarray(k.get("recompute_modules", 0)) != 0):  # [47]
        core, moe_act, norms, up_proj, dense_mlp, moe_layer, shared_mlp = recompute_flags(k)
        rc = np.where((np.asarray(rc) == 1) & ~core, 0, rc)
    realizable = valid
    for holds in realizable_conditions(w, fleet, k, m_exact, n_acc).values():
        realizable = realizable & holds
    # recompute_method [40]: the block method recomputes recompute_num_layers layers of each
    # chunk, one checkpoint each; the uniform one every layer, in checkpoints of that many
    rnl, rgroup = k.get("recompute_num_layers", 0), 1
    uniform = _uniform(k)
    if np.any(uniform):
        rnl = np.where(uniform, 0, rnl)
        rgroup = np.where(uniform & (np.asarray(k["recompute"]) == 2),
                          np.maximum(k.get("recompute_num_layers", 0), 1), 1)
    return Split(tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, v=v, mbs=mbs, batch=batch, s=s, sp=sp,
                 rc=rc, zero=k["zero_stage"], prec=prec, dp=dp, group=group,
                 valid=valid, n_acc=n_acc, m_exact=m_exact, m=m, realizable=realizable,
                 p2p_split=p2p_split(tp, sp, k["scatter_gather_tensors_in_pipeline"]),
                 p2p_steady=p2p_steady_sends(v, m, k["overlap_p2p_comm"]),
                 mtp=k["mtp_num_layers"], first=first, last=last,
                 a2a_paired=combined_1f1b_paired(pp, v, m, k["overlap_moe_expert_parallel_comm"]),
                 rnl=rnl, rgroup=rgroup, cpc=k.get("cp_comm_type", 0),
                 cpa=k.get("cp_a2a_size", 0),
                 ce_te=te_cross_entropy(k), moe_act=moe_act, norms=norms,
                 up_proj=up_proj, dense_mlp=dense_mlp, moe_layer=moe_layer,
                 shared_mlp=shared_mlp, se_overlap=shared_expert_overlap(w, k))


def shared_expert_overlap(w, k):
    """Where an MoE layer's shared experts run beside the dispatcher on a stream of their
    own: ``moe_shared_expert_overlap`` on a model with shared experts (Megatron-Core reads
    it only where ``moe_shared_expert_intermediate_size`` is set) [49]."""
    on = np.asarray(k.get("moe_shared_expert_overlap", False))
    return on & bool(w.moe and w.shared)


def _groups_split(experts, top_k, groups, group_topk):
    """Where ``group_topk`` of ``groups`` split as the rule asks [46]: the groups set, dividing
    the experts and no fewer than the chosen ones, which divide top-k, each group holding
    top-k / ``group_topk`` experts or more."""
    g, n = np.asarray(group_topk), np.asarray(groups)
    safe_n, safe_g = np.maximum(n, 1), np.maximum(g, 1)
    return ((n >= 1) & (experts % safe_n == 0) & (g <= n) & (top_k % safe_g == 0)
            & (g * (experts // safe_n) >= top_k))


def _groups_hold(w, groups, group_topk):
    """Where group-limited routing [46] is off (``group_topk`` 0, or a dense model) or its
    groups split as the rule asks (:func:`_groups_split`)."""
    if not w.moe:
        return np.ones(np.broadcast_shapes(np.shape(groups), np.shape(group_topk)), dtype=bool)
    return (np.asarray(group_topk) == 0) | _groups_split(w.experts, w.top_k, groups, group_topk)


def _hierarchy(w, tp, cp, a2a):
    """Where hierarchical CP's all-to-all group of ``a2a`` ranks is set and splits the CP
    group and each TP rank's heads and KV heads [42]."""
    size = np.maximum(a2a, 1)  # (no division by 0 where it is not set)
    return ((a2a >= 1) & (cp % size == 0) & (w.heads % (tp * size) == 0)
            & (w.kv_heads % (tp * size) == 0))


def combined_1f1b_paired(pp, v, m, on):
    """The share of the first pipeline rank's microbatches (chunks, interleaved) whose
    forward and backward the combined 1F1B schedule runs beside another's [35], where
    ``on``; else 0.0. Without a pipeline all but one of the ``m`` (the first forward and the
    last backward run alone); interleaved, all but the warm-up of 2 (p - 1) + (v - 1) p
    chunks and the one more the schedule runs (its cool-down as many), of ``m v``."""
    mv = m * v
    warm = np.where(pp > 1, 2.0 * (pp - 1) + (v - 1) * pp + 1.0, 1.0)
    return np.where(on, np.maximum(mv - warm, 0.0) / mv, 0.0)


def p2p_split(tp, sp, scatter_gather):
    """The factor a pipeline send (activations or their gradients) is split by over TP.

    Each TP rank sends to its peer in the next stage. Under sequence parallelism its
    activations are already its ``1/tp`` slice of the sequence (Megatron-Core
    ``schedules.get_tensor_shapes`` [26]); without it every rank holds, and sends, the
    whole tensor, unless legacy Megatron-LM's ``--scatter-gather-tensors-in-pipeline``
    sends ``1/tp`` of it and all-gathers it over NVLink on arrival [1] (Sec. 4.1) [26].
    """
    return np.where(sp | scatter_gather, tp, 1)


def p2p_steady_sends(v, m, overlap):
    """Pipeline exchanges a rank waits on in the steady state, each a send forward and one
    backward: one per microbatch in 1F1B (``send_forward_recv_backward`` and
    ``send_backward_recv_forward`` block, Megatron-Core ``schedules`` [27]); one per
    microbatch and model chunk in the interleaved schedule without ``overlap_p2p_comm``
    (its ``send_forward_backward_recv_forward_backward`` blocks; the interleaved
    schedule's communication grows by ``v``, [1] Sec. 2.2.2), none with it (sent
    asynchronously while the next chunk computes [27]).
    """
    return np.where(v == 1, m, np.where(overlap, 0.0, m * v))


# --------------------------------------------------------------- 2. hardware

@dataclass(frozen=True)
class Hardware:
    """Hardware facts by precision code (tiny tables spread by the codes), fitted constants applied."""
    peak_gemm: object
    peak16: object
    plateau: object
    plateau16: object
    grad_bytes: object
    hbm: float
    shift: object
    tile_cost: object
    flash_eff: float
    domain: int
    up_bw: object
    out_bw: object
    up_lat: float
    out_lat: float
    call_lat: object
    memory_capacity: float
    low_bits: object
    #: the host link's one-way rate per accelerator (the catalog's host_link_bandwidth; inf
    #: where it states none: activation offloading is then not realizable) [51]
    host_bw: float = float("inf")

    def gemm(self, flops, calls=1.0, peak=None, plat=None, k=None):
        """Time of ``calls`` GEMMs of ``flops`` in all, at ``peak`` (default: the GEMM precision's)."""
        # k: the GEMM's reduction dimension on this rank (its tiles' fixed cost, gemm [2]);
        # the backward's data- and weight-gradient GEMMs are priced at the forward's.
        peak = self.peak_gemm if peak is None else peak
        plat = self.plateau if plat is None else plat
        return gemm.gemm_time(flops / calls, peak, plateau=plat, size_shift=self.shift, calls=calls,
                              k_dim=k, tile_cost=self.tile_cost)

    def link(self, inside):
        """(bandwidth, latency) of a group inside the NVLink domain where ``inside``, else scale-out."""
        return np.where(inside, self.up_bw, self.out_bw), np.where(inside, self.up_lat, self.out_lat)

    def within(self, span, world):
        """Where every group spanning ``span`` consecutive ranks lies inside one NVLink domain.

        Megatron-Core lays ranks out in order, with no knowledge of the domains [6]: a
        group of TP ranks spans ``tp``, a CP group ``tp cp``, an EP group ``etp ep`` (the
        expert grid's own order, its TP ``etp_size``), a pipeline the whole job
        (``world``); the groups tile the job with that period and the domains tile it
        with period ``domain``. All groups are inside where the span divides the domain,
        or where the whole job fits in one; otherwise some group straddles a boundary (a
        group of 16, 32 or 64 in an NVL72 rack of 72: ranks 64-127 are 8 in one rack and
        56 in the next) and the slowest group paces the step, so the group is priced on
        the scale-out fabric. Power-of-two groups always divide a domain of 8.
        """
        return groups_within(self.domain, span, world)


def groups_within(domain, span, world):
    """:meth:`Hardware.within` for an NVLink domain of ``domain`` accelerators."""
    span = np.asarray(span, dtype=np.float64)
    return (span <= domain) & ((np.mod(domain, span) == 0) | (np.asarray(world) <= domain))


def hardware(fleet, c, prec, grad_bf16=False) -> Hardware:
    """Peaks and GEMM plateaus per precision code ``prec``; HBM and network rates.
    ``grad_bf16``: the ``grad_reduce_in_bf16`` knob (16-bit gradients, as FP16 has)."""
    node, fabric = fleet.node, fleet.fabric
    acc = node.accelerator
    gemm_key = np.array(PRECISIONS)
    peak_gemm = np.array([_peak(acc, p) for p in PRECISIONS])[prec]
    peak16 = np.array([_peak(acc, "fp16" if p == "fp16" else "bf16") for p in PRECISIONS])[prec]
    low_bits = np.array([p in ("fp8", "fp4") for p in PRECISIONS])[prec]
    scale = c["gemm_scale"] * architecture_gemm_scale(acc, c)
    plateau = (np.array([_plateau(acc, p, c) for p in gemm_key])[prec] * scale
               * np.where(low_bits, c["fp8_gemm_scale"], 1.0))
    plateau16 = np.array([_plateau(acc, "fp16" if p == "fp16" else "bf16", c)
                          for p in PRECISIONS])[prec] * scale
    return Hardware(
        peak_gemm=peak_gemm, peak16=peak16, plateau=plateau, plateau16=plateau16,
        # FP32 reduce for BF16 and FP8 [7], unless grad_reduce_in_bf16 [25]; FP16's are FP16
        grad_bytes=np.where((prec == PRECISIONS.index("fp16")) | np.asarray(grad_bf16), 2.0, 4.0),
        hbm=acc.memory_bandwidth, shift=c["gemm_size_shift"],
        # The fixed cost per tile is a time, gemm_k_overhead columns of K at the A100's
        # 312 TFLOP/s (the size curve's knots' rate) times the architecture's fitted GEMM
        # scale: the same for every precision and every GPU of the architecture
        # (gemm.gemm_tile_time). Not over the GPU's measured plateau share, which made a
        # GPU of the higher peak but the lower share pay longer tiles (GB200 slower than
        # B200 at FP4, an audit of 2026-12-06); the fit is as good either way
        # (benchmarks/results/fidelity.md, README).
        tile_cost=c["gemm_k_overhead"] / (GEMM_REFERENCE_PEAK * scale),
        flash_eff=acc.gemm_efficiency.get("flash_attention", DEFAULT_FLASH_ATTENTION_EFFICIENCY),
        domain=node.scale_up_domain or node.accelerators_per_node,
        up_bw=(node.scale_up_bus_bandwidth or node.intra_node_bandwidth) * c["scale_up_efficiency"],
        out_bw=(node.nic_bandwidth or fabric.bandwidth / fabric.oversubscription) * c["scale_out_efficiency"],
        up_lat=SCALE_UP_STEP_LATENCY,
        out_lat=fabric.latency if fabric.latency is not None else SCALE_OUT_STEP_LATENCY,
        call_lat=c["collective_latency"], memory_capacity=acc.memory_capacity, low_bits=low_bits,
        host_bw=acc.host_link_bandwidth or float("inf"))


# ------------------------------------------------------------ 3. layer times

@dataclass(frozen=True)
class Layer:
    """One layer, one microbatch, one rank: local sizes and compute times [s]."""
    h: float
    d: float
    s_local: object
    tokens: object
    kv_t: object
    norm_split: object
    act_bytes: object
    moe_share: float
    t_core_f: object
    t_core_b: object
    layer_f: object
    layer_b: object
    #: a multi-token prediction module's projection and norms, forward and backward [34]
    t_mtp: object
    #: the forward GEMMs of the TP-communicating layers (QKV, output projection, the dense
    #: or shared-expert MLP), which tp_comm_overlap hides TP traffic behind [37]
    t_tp_gemms_f: object = 0.0
    #: those that selective recompute's "mlp", "moe" and "shared_experts" run again in the
    #: backward (the dense or shared-expert MLP's) [47]
    t_tp_gemms_again: object = 0.0
    #: an MoE layer's shared experts, forward: the first GEMM with the activation, and the
    #: second GEMM (what runs beside the dispatch and the combine under
    #: moe_shared_expert_overlap [49]; 0.0 without it)
    t_shared_fc1: object = 0.0
    t_shared_fc2: object = 0.0


def _accounted(state, rule):
    """The ``layers`` rule ``rule`` where ``account_for_embedding/loss_in_pipeline_split`` do
    not apply (``state`` 0), held where Megatron-Core's rule for them holds (1), broken where
    it does not (2): :func:`solver.physics.megatron._account_stages`."""
    if np.ndim(state) == 0 and state == 0:
        return rule
    return np.where(state == 1, True, np.where(state == 2, False, rule))


def _even_chunks(layers, pp, v):
    """Whether ``layers`` split into ``pp * v`` equal chunks (and an interleaved schedule has a
    pipeline): Megatron-LM's rule where neither the first nor the last stage is set [13]."""
    pp, v = np.asarray(pp, dtype=np.int64), np.asarray(v, dtype=np.int64)
    chunks = np.where((pp <= layers) & (v <= layers), pp * v, layers + 1)  # no int64 overflow
    return (layers % chunks == 0) & ((v == 1) | (pp > 1))


def stage_layers(w, pp, first, last):
    """(uneven, first, middle, last): the layers of the first, of a middle and of the last
    pipeline stage where ``num_layers_in_first/last_pipeline_stage`` set them [13]
    (``first``, ``last`` > 0; 0 is Megatron-Core's None, the other stages' share), the rest
    split over the stages between, rounded up where it does not split evenly (not
    realizable). ``uneven``: either is set, there is a pipeline, and the set stages leave
    layers for the stages between, none where there are none; elsewhere (not realizable
    either) the layouts are priced as if neither were set, the even split's heaviest stage,
    so that no step is shorter than its share of the model's work."""
    first, last = np.asarray(first) * 1.0, np.asarray(last) * 1.0
    set_first, set_last = first > 0, last > 0
    middle = pp - set_first * 1.0 - set_last * 1.0
    rest = w.layers - first - last
    uneven = (set_first | set_last) & (np.asarray(pp) > 1) & (rest >= 0) & ((middle > 0) | (rest == 0))
    n_mid = np.where(middle > 0, np.maximum(np.ceil(rest / np.maximum(middle, 1.0)), 0.0), 0.0)
    return uneven, np.where(set_first, first, n_mid), n_mid, np.where(set_last, last, n_mid)


def held_layers(w, pp, first, last):
    """The layers the first, a middle and the last stage hold: :func:`stage_layers`' where
    the stages are set, else ``ceil(layers / pp)`` each (the even split's heaviest)."""
    uneven, n_first, n_mid, n_last = stage_layers(w, pp, first, last)
    n_even = np.ceil(w.layers / pp)
    return tuple(np.where(uneven, n, n_even) for n in (n_first, n_mid, n_last))


def pipeline_ranks(w, sp, recompute=False):
    """(rank, layers, dense layers, first, last) of the pipeline ranks whose memory can be
    the largest, as arrays (first and last: 1.0 on the first and the last rank); with
    ``recompute``, a sixth: the rank's dense layers that recompute their forward (of its
    :func:`recomputed` layers, the first of each chunk [40]).

    Every rank holds its stage's layers (:func:`stage_layers`; ``ceil(layers / pp)`` each
    where neither stage is set), each of its ``v`` chunks ``layers / v`` of them, chunk
    ``j`` of rank ``r`` after the ``j`` whole rounds of all ranks' chunks and rank ``r``'s
    predecessors' chunk ``j`` [13]. Ranks of one kind hold the same weights and, the later
    the rank, fewer microbatches in flight (megatron_memory.in_flight_layers), so the
    largest footprint is on the first rank of a kind: rank 0 (the input embedding), rank 1
    (the first of the middle stages, which can hold more layers than a set first stage),
    the last rank (the output layer, its logits and the multi-token prediction modules),
    and in a model whose leading layers are dense the rank whose first chunk holds the
    first MoE layer and the rank after it (MoE layers only; at a large EP a dense layer
    holds more weights a rank than an MoE layer, at a small one fewer). A model whose dense
    layers fill more than the first round of chunks (none in the catalog) can have a rank
    between these hold more; its memory is then a lower bound.
    """
    pp, v = np.asarray(sp.pp) * 1.0, np.asarray(sp.v) * 1.0
    nf, nm, nl = held_layers(w, pp, sp.first, sp.last)
    held = nf + (pp - 2.0) * nm + nl  # the layers the stages hold (the model's where realizable)
    last_rank = pp - 1.0
    d_layers = float(w.dense_layers)
    mixed = bool(w.moe and w.dense_layers)
    ranks = [0.0 * pp]
    if mixed or np.any(np.asarray(sp.first) > 0):
        # Behind a first stage that is not set rank 1 holds rank 0's layers without the
        # embedding, fewer microbatches in flight: never the larger footprint (the
        # footprint's max form is monotone in floats too), so left out where none is set
        # (bench_megatron's grid, which sets none, ran 1.06x faster without it, unsaved).
        ranks.append(np.minimum(1.0, last_rank))
    if mixed:
        # the rank whose first chunk holds the first MoE layer: its chunk starts at or before it
        r_moe = np.where(d_layers * v < nf, 0.0,
                         1.0 + np.floor((d_layers * v - nf) / np.maximum(nm, 1.0)))
        ranks += [np.minimum(r_moe, last_rank), np.minimum(r_moe + 1.0, last_rank)]
    ranks.append(last_rank)
    for r in ranks:
        is_first, is_last = r == 0.0, r == last_rank
        n = np.where(is_first, nf, np.where(is_last, nl, nm))
        if not w.moe:
            dense_n = n
            again = recomputed(sp, n) if recompute else None
        elif not mixed:
            dense_n = 0.0 * n
            again = dense_n if recompute else None
        else:
            # Dense layers of its v chunks: chunk j starts at (j held + start) / v, a chunk
            # holds n / v; the first jf chunks are dense throughout, the next in part.
            start = np.where(is_first, 0.0, np.where(is_last, held - nl, nf + (r - 1.0) * nm))
            c, period = n / v, held / v
            left = d_layers - start / v
            jf = np.clip(np.floor((left - c) / period) + 1.0, 0.0, v)
            part = np.where(jf < v, np.clip(left - jf * period, 0.0, c), 0.0)
            dense_n = c * jf + part
            again = None
            if recompute:
                # a chunk's recomputed layers are its first [40], its dense ones where it has both
                some = jf * np.minimum(sp.rnl, c) + np.minimum(sp.rnl, part)
                again = np.where(np.asarray(sp.rc) == 2,
                                 np.where(np.asarray(sp.rnl) > 0, some, dense_n), 0.0)
        if recompute:
            yield r, n, dense_n, is_first * 1.0, is_last * 1.0, again
        else:
            yield r, n, dense_n, is_first * 1.0, is_last * 1.0


def heavy_moe_stage(w, pp, v=1, first=0, last=0):
    """Where the heaviest pipeline stage is all MoE layers (a model with leading dense layers).

    Megatron-Core gives each stage consecutive layers [13], so the leading dense layers sit
    on the first stage(s) and, once the MoE layers fill a stage (``ceil(layers / pp)`` of
    them), some stage holds MoE layers only: it paces the pipeline (an MoE layer does the
    dense one's attention, its experts' work and the token exchanges) and holds the most
    expert weights. Without a pipeline the one stage holds the model's mix. Interleaved
    (``v`` chunks of ``layers / (pp v)`` a device, device ``r`` holding chunks ``r, r + pp,
    ...``), the last device's first chunk starts at layer ``(pp - 1) layers / (pp v)``: it
    holds MoE layers only where that is past the dense ones.
    """
    if not (w.moe and w.dense_layers):
        return False
    pp, v = np.asarray(pp), np.asarray(v)
    even = (pp > 1) & np.where(v > 1, (pp - 1) * (w.layers / (pp * 1.0 * v)) >= w.dense_layers,
                               w.moe_layers >= np.ceil(w.layers / (pp * 1.0)))
    # With the first and last stages set [13]: where the first holds every dense layer, the
    # stages after it hold MoE layers only, and the stage of the most layers is priced so
    # (the first too where it has the most: an upper bound, an MoE layer the heavier).
    uneven, n_first, _, _ = stage_layers(w, pp, first, last)
    return np.where(uneven, n_first >= w.dense_layers, even)


def heaviest_moe_share(w, pp, v=1, first=0, last=0):
    """The MoE layers' share of the heaviest stage's layers (see :func:`heavy_moe_stage`);
    the model's own share where no stage is all MoE (the dense layers fill all stages but
    one, or more: a mix there, priced at the model's)."""
    share = w.moe_layers / w.layers
    if not (w.moe and w.dense_layers):
        return share
    return np.where(heavy_moe_stage(w, pp, v, first, last), 1.0, share)


def _mlp_time(w, hw: Hardware, tok, width, calls=1.0):
    t_fc1, t_fc2, t_act = _mlp_parts(w, hw, tok, width, calls)
    return t_fc1 + t_fc2 + t_act


def _mlp_parts(w, hw: Hardware, tok, width, calls=1.0):
    """An MLP's first GEMM, second GEMM and activation (memory-bound) [s]."""
    h = float(w.hidden)
    fc1 = 2.0 * tok * h * width * (1.0 + w.gated)
    fc2 = 2.0 * tok * width * h
    act = gemm.memory_bound_time(2.0 * tok * width * (3.0 if w.gated else 2.0), hw.hbm)
    return hw.gemm(fc1, calls, k=h), hw.gemm(fc2, calls, k=width), act


def layer_times(w, k, c, sp: Split, hw: Hardware) -> Layer:
    """GEMMs on the efficiency curve, attention core, memory-bound kernels; forward and backward."""
    tp, ep, etp, mbs, s, rc = sp.tp, sp.ep, sp.etp, sp.mbs, sp.s, sp.rc
    g, hbm = hw.gemm, hw.hbm
    h, d = float(w.hidden), w.head_dim
    s_local = s / (sp.cp * 1.0)
    tokens = mbs * s_local
    heads_t = w.heads / (tp * 1.0)
    kv_t = np.maximum(w.kv_heads / (tp * 1.0), 1.0)
    ffn_t = w.ffn / tp
    norm_split = np.where(sp.sp, tp, 1)  # SP splits norms, dropout and residuals by TP [2]
    if w.mla:
        # Multi-head latent attention [33]: the down projections run whole on each TP rank's
        # tokens (its SP slice; every token without SP), the up projections split the heads.
        down_tok = tokens / norm_split
        if w.q_lora:
            q_up = g(2.0 * tokens * w.q_lora * heads_t * w.qk_dim, k=w.q_lora)
            t_qkv = g(2.0 * down_tok * h * w.q_lora, k=h) + q_up
        else:  # (queries projected from h directly, inside the up projections' checkpoint)
            t_qkv = q_up = g(2.0 * tokens * h * heads_t * w.qk_dim, k=h)
        kv_up = g(2.0 * tokens * w.kv_lora * heads_t * (w.qk_dim - w.rope + d), k=w.kv_lora)
        t_qkv = t_qkv + (g(2.0 * down_tok * h * (w.kv_lora + w.rope), k=h) + kv_up)
        # Its memory-bound work besides the layer's [33], 16 bits read and written: the
        # latents' RMSNorms (q_layernorm, kv_layernorm) on the down projections' tokens,
        # RoPE on the positional query (each head) and key (one, gathered over the
        # sequence), and the concatenations of the query's and the key's parts.
        t_latent = gemm.memory_bound_time(
            4.0 * (w.q_lora + w.kv_lora) * down_tok + 4.0 * w.rope * (heads_t + 1.0) * tokens
            + 8.0 * heads_t * w.qk_dim * tokens, hbm)
        # What "mla_up_proj" recomputes [47]: the up projections and the memory-bound work
        # around them (the latents' norms, fused into the up projections, RoPE and the
        # concatenations: t_latent).
        t_up = q_up + kv_up + t_latent
    else:
        t_qkv = g(fl.qkv_flops(tokens, h, heads=heads_t, kv_heads=kv_t, head_dim=d), k=h)
        t_latent = t_up = 0.0
    t_proj = g(fl.attention_output_flops(tokens, h, heads=heads_t, head_dim=d), k=heads_t * d)
    flash = k["flash_attention"]
    # Attention core: a fused causal kernel skips masked blocks [5] at its own efficiency;
    # an unfused softmax computes the whole s x s and streams it through HBM. (MLA's
    # QK^T at its key width and PV at its value width: their mean, ``core_dim``.)
    core_flops = fl.attention_core_flops(mbs, s_local, s, heads=heads_t, head_dim=w.core_dim,
                                         causal_fraction=np.where(flash, 0.5, 1.0))
    scores = mbs * heads_t * s_local * s
    t_core_f = np.where(
        flash, core_flops / (hw.peak16 * hw.flash_eff * c["attention_efficiency"]),
        g(core_flops, calls=mbs * heads_t, peak=hw.peak16, plat=hw.plateau16)
        + gemm.memory_bound_time(SOFTMAX_BYTES * scores, hbm))
    t_core_b = t_core_f * np.where(flash, FLASH_BACKWARD_RATIO, 2.0)

    t_mlp_dense = _mlp_time(w, hw, tokens, ffn_t)
    elementwise = gemm.memory_bound_time(c["elementwise_bytes"] * tokens * h / norm_split, hbm)
    attn_gemms_f = t_qkv + t_proj + t_latent
    t_dense_f = attn_gemms_f + t_mlp_dense + elementwise
    if w.moe:
        local_experts = w.experts / (ep * 1.0)
        # The routed copies an expert rank computes: its expert TP group's (etp ranks, each
        # with its SP slice of tokens / tp; every token at tp 1) gathered [31], k x tokens
        # at etp = tp; the experts split their width over etp [6].
        routed = tokens * w.top_k * (etp / (tp * 1.0))
        # The dispatcher's token permutes [32], 16 bits at HBM bandwidth, in elements of h:
        # the permute gathers k copies of the rank's tokens (its SP slice) and writes them (2k),
        # the unpermute reads them back and scatter-adds them into zeroed tokens (k + 2),
        # and with more than one local expert the received copies (gathered over the
        # expert TP group) are sorted by expert after dispatch and back before combine (2 x 2).
        permutes = ((3.0 * w.top_k + 2.0) * (tokens / norm_split)
                    + np.where(local_experts > 1.0, 4.0 * routed, 0.0))
        t_shared = _mlp_time(w, hw, tokens, w.shared * w.moe_ffn / tp) if w.shared else 0.0
        t_moe = (_mlp_time(w, hw, routed, w.moe_ffn / etp, calls=local_experts)
                 + t_shared
                 # the router: on the rank's SP slice of the tokens, in 16 bits (a plain
                 # matmul, not a TE layer: FP8 does not reach it) [31]
                 + g(fl.router_flops(tokens / norm_split, h, w.experts), k=h, peak=hw.peak16,
                     plat=hw.plateau16)
                 + gemm.memory_bound_time(2.0 * permutes * h, hbm))
        t_moe_f = attn_gemms_f + t_moe + elementwise
    else:
        t_moe_f = t_moe = t_shared = 0.0
    moe_share = heaviest_moe_share(w, sp.pp, sp.v, sp.first, sp.last)
    layer_f = (1 - moe_share) * t_dense_f + moe_share * t_moe_f  # GEMMs + memory-bound + overhead
    t_tp_gemms_f = t_qkv + t_proj + (1 - moe_share) * t_mlp_dense + moe_share * t_shared
    # Backward: 2x the forward GEMMs and memory-bound kernels [3]; recompute adds
    # the forward (full) or the attention core (selective) again.
    layer_b = 2.0 * layer_f + t_core_b
    layer_b = layer_b + np.where(rc == 2, layer_f + t_core_f, np.where(rc == 1, t_core_f, 0.0))
    t_tp_gemms_again = 0.0
    if sp.modules:
        # Selective recompute's output-discarding modules [47], run again before their
        # backward: the RMSNorms that are modules of their own (an MoE layer's pre-MLP norm,
        # feeding the router and the experts; a multi-head latent attention's input norm,
        # feeding its two down projections; the others are fused into the next linear layer
        # and are not recomputed), 16 bits read and written on the rank's tokens (its SP
        # slice); the routed experts' activation, as its forward (_mlp_time); a multi-head
        # latent attention's up projections (t_up, every layer's).
        t_norm = gemm.memory_bound_time(4.0 * tokens * h / norm_split, hbm)
        up = np.where(sp.up_proj, t_up, 0.0)
        again_dense = np.where(sp.norms, float(w.mla) * t_norm, 0.0) + up
        again_moe = np.where(sp.norms, (1.0 + w.mla) * t_norm, 0.0) + up
        if w.moe:
            t_act = gemm.memory_bound_time(
                2.0 * routed * (w.moe_ffn / etp) * (3.0 if w.gated else 2.0), hbm)
            again_moe = again_moe + np.where(sp.moe_act, t_act, 0.0)
        # Its checkpointed modules [47] run their forward again before their backward: "mlp"
        # a dense layer's MLP (an MoE layer's is left alone), "moe" an MoE layer's whole
        # forward (shared experts, router, permutes, experts: t_moe; its dispatch and
        # combine with communication), "shared_experts" the shared experts' MLP. Nested as
        # Megatron-Core nests them, each runs its own: the shared experts' checkpoint inside
        # the MoE layer's reruns them twice, the experts' activation too under "moe_act".
        again_dense = again_dense + np.where(sp.dense_mlp, t_mlp_dense, 0.0)
        again_moe = (again_moe + np.where(sp.moe_layer, t_moe, 0.0)
                     + np.where(sp.shared_mlp, t_shared, 0.0))
        layer_b = layer_b + (1 - moe_share) * again_dense + moe_share * again_moe
        if sp.checkpoints:
            t_tp_gemms_again = ((1 - moe_share) * np.where(sp.dense_mlp, t_mlp_dense, 0.0)
                                + moe_share * t_shared * (
                                    np.asarray(sp.moe_layer, dtype=np.float64)
                                    + np.asarray(sp.shared_mlp, dtype=np.float64)))
    layer_f = layer_f + t_core_f
    t_shared_fc1 = t_shared_fc2 = 0.0
    if w.moe and w.shared and np.any(sp.se_overlap):
        # (the shared experts' two halves, for moe_shared_expert_overlap [49])
        fc1, t_shared_fc2, act = _mlp_parts(w, hw, tokens, w.shared * w.moe_ffn / tp)
        t_shared_fc1 = fc1 + act
    # A multi-token prediction module besides its layer and the head [34]: the projection of
    # the 2h-wide concatenation to h (column-parallel over TP, its input gathered under SP),
    # and memory-bound, 16 bits read and written, its three norms and the concatenation;
    # forward and backward (2x) [3].
    t_mtp = 3.0 * (g(4.0 * tokens * h * h / tp, k=2.0 * h)
                   + gemm.memory_bound_time(MTP_ELEMENTWISE_BYTES * tokens * h / norm_split, hbm))
    return Layer(h=h, d=d, s_local=s_local, tokens=tokens, kv_t=kv_t, norm_split=norm_split,
                 act_bytes=2.0 * tokens * h, moe_share=moe_share, t_core_f=t_core_f,
                 t_core_b=t_core_b, layer_f=layer_f, layer_b=layer_b, t_mtp=t_mtp,
                 t_tp_gemms_f=t_tp_gemms_f, t_tp_gemms_again=t_tp_gemms_again,
                 t_shared_fc1=t_shared_fc1, t_shared_fc2=t_shared_fc2)


# ---------------------------------------------------------- 4. communication

@dataclass(frozen=True)
class Communication:
    """Per-layer TP, CP and EP communication: in all, and exposed [s]."""
    tp_total: object
    tp_layer: object
    #: TP's exposed time in the forward and in the backward (a full recompute's in it)
    tp_layer_f: object
    tp_layer_b: object
    cp_total: object
    cp_layer: object
    ep_layer: object
    #: the exposed CP and EP time of the forward and of the backward (recomputation in it)
    cp_layer_f: object
    cp_layer_b: object
    ep_layer_f: object
    ep_layer_b: object


def miss_all(experts, top_k, excluded):
    """C(E - m, k) / C(E, k): the chance that none of a token's ``k`` distinct experts, drawn
    uniformly from ``E``, is among ``m`` given ones (0.0 where ``E - m < k``)."""
    q = np.ones(np.shape(excluded))
    for i in range(int(top_k)):
        q = q * np.maximum(experts - excluded - i, 0.0) / (experts - i)
    return q


def _choose(n, r):
    """C(n, r) of arrays (0.0 where r < 0 or r > n, n a whole number)."""
    r = np.asarray(r)
    out = np.ones(np.broadcast_shapes(np.shape(n), r.shape))
    for i in range(int(np.max(r, initial=0))):
        out = out * np.where(i < r, (n - i) / (i + 1.0), 1.0)
    return np.where(r < 0, 0.0, out)


def routed_miss(experts, top_k, unit, groups=0, group_topk=0):
    """The chance that none of a token's ``k`` experts is among ``unit`` consecutive ones
    (an EP rank's block, or a domain's). Routing uniform over the experts (:func:`miss_all`),
    or group-limited [46] where ``group_topk`` is set: the experts in ``groups`` equal
    blocks, a token's ``g = group_topk`` of them drawn uniformly and ``k / g`` of its experts
    in each, drawn uniformly there (Megatron-Core ranks a group by the sum of its top ``k /
    g`` scores, so a chosen group supplies that many of the token's experts, near enough: a
    simulation of the router, scores drawn alike, agrees within 0.012,
    tests/test_megatron_group_routing.py). A unit of ``c`` whole groups is missed where none
    of them is drawn, ``C(G - c, g) / C(G, g)``; a unit inside a group where that group is
    not drawn, or is and its ``k / g`` experts miss the unit. Every group chosen masks
    none: uniform routing; one expert a chosen group (``k = g``) is near it (a group scored
    by its best alone), and priced so. Where units and groups do not nest (neither size
    divides the other), or the groups are not a realizable split (the ``moe_router_groups``
    rule), as uniform routing too (the router's concentration not counted)."""
    uniform = miss_all(experts, top_k, unit)
    g = np.asarray(group_topk)
    if not np.any(g > 0):
        return uniform
    n_groups = np.maximum(np.asarray(groups), 1)
    size = experts / n_groups
    g1 = np.maximum(g, 1)
    per = top_k / g1  # a chosen group's experts
    # (every group chosen masks none: the router's plain top-k, uniform routing; and with
    # one expert a chosen group, a group scored by its best alone, the router's choice is
    # near the plain top-k too: priced as uniform, tests/test_megatron_group_routing.py)
    ok = (g > 0) & _groups_split(experts, top_k, groups, g) & (g < n_groups) & (per >= 2)
    whole = ok & (np.mod(unit, size) == 0)
    inside = ok & ~whole & (np.mod(size, unit) == 0)
    c = np.where(whole, unit / size, 0.0)
    gw = np.where(whole, g, 0)
    p_whole = _choose(n_groups - c, gw) / _choose(n_groups, gw)
    q = np.ones(np.shape(inside))
    for i in range(int(np.max(np.where(inside, per, 0.0), initial=0.0))):
        q = q * np.where(inside & (i < per),
                         np.maximum(size - unit - i, 0.0) / np.where(size - i > 0, size - i, 1.0),
                         1.0)
    p_drawn = g / n_groups
    return np.where(whole, p_whole, np.where(inside, 1.0 - p_drawn + p_drawn * q, uniform))


#: The NVLink peers DeepEP's normal kernels reach (``NUM_MAX_NVL_PEERS``): a larger NVLink
#: domain (an NVL72 rack) is used as domains of 8 joined over RDMA [39].
DEEPEP_NVL_PEERS = 8.0
#: The flex dispatcher's backends (Megatron-Core's ``moe_flex_dispatcher_backend``), coded
#: 0, 1: DeepEP [39] and NVIDIA's HybridEP [50].
FLEX_BACKENDS = ("deepep", "hybridep")
_DEEPEP, _HYBRIDEP = FLEX_BACKENDS.index("deepep"), FLEX_BACKENDS.index("hybridep")
#: The architectures (the catalog's ``architecture``) the flex dispatcher's backends run on:
#: NVIDIA's Ampere, Hopper and Blackwell (Megatron-Bridge: DeepEP on compute capability 8
#: and 9 and B200/B300, HybridEP on 8, 9 and 10) [39] [50].
FLEX_ARCHITECTURES = ("ampere", "hopper", "blackwell")
#: The ranks of one NVLink domain HybridEP reaches ("Now we support up to 72(GB200) ranks
#: per node", a node its NVLink domain) [50]: a whole NVL72 rack.
HYBRIDEP_NVL_PEERS = 72.0


def flex_runs_on(fleet):
    """Whether the flex dispatcher's backends run on the fleet's accelerator: an NVIDIA
    architecture of :data:`FLEX_ARCHITECTURES` (the catalog's ``architecture``; one that
    states none is taken to lack it) [39] [50]."""
    return (fleet.node.accelerator.architecture or "").lower() in FLEX_ARCHITECTURES


def hybridep(k):
    """Where the flex dispatcher runs HybridEP (``moe_flex_dispatcher_backend="hybridep"``
    beside ``moe_enable_deepep``) [50]."""
    return (np.asarray(k.get("moe_flex_dispatcher_backend", _DEEPEP)) == _HYBRIDEP) & np.asarray(
        k["moe_enable_deepep"])


def _hybridep_groups_hold(w, fleet, k, n_acc):
    """Where HybridEP's layout checks hold [50]: the flex group (etp x ep ranks) splits
    evenly over the NVLink domains it spans ("The number of ranks ... should be divisible
    by the number of ranks per NVLink domain"): inside one domain that its groups tile
    (Hardware.within's rule), or over whole domains; at most 72 of its ranks in a domain
    (``MAX_NUM_OF_RANKS_PER_NODE``), an even number of them, their count times the rank's
    experts (``num_local_experts``, experts / ep) divisible by 4
    (``(num_of_experts_per_rank * num_of_ranks_per_node) % 4 == 0``), and a hidden size
    divisible by 512 (all three ``config.cuh``'s ``is_valid``, which DeepEP's Python buffer
    asserts as it is built, at the first dispatch)."""
    domain = float(fleet.node.scale_up_domain or fleet.node.accelerators_per_node)
    ep = np.asarray(k["ep_size"], dtype=np.float64)
    span = np.asarray(k.get("etp_size", k["tp_size"]), dtype=np.float64) * ep
    per_domain = np.minimum(span, domain)
    even = groups_within(domain, span, n_acc) | (np.mod(span, domain) == 0)
    return even & (per_domain <= HYBRIDEP_NVL_PEERS) & (np.mod(per_domain, 2) == 0) & (
        np.mod(w.experts / ep * per_domain, 4) == 0) & (w.hidden % 512 == 0)


def flex_dispatch_time(token_bytes, experts, top_k, ep, n, near, hw, call_lat, groups=0,
                       group_topk=0, reach=DEEPEP_NVL_PEERS):
    """One dispatch (or combine) of the flex dispatcher over ``n`` = etp x ep ranks, DeepEP
    [39] or HybridEP [50] (``reach``: the NVLink ranks the backend reaches,
    :data:`DEEPEP_NVL_PEERS` or :data:`HYBRIDEP_NVL_PEERS`), ``token_bytes`` the rank's
    tokens, ``near`` the EP peers (expert blocks of ``E / ep``) in the slowest rank's
    domain, at most ``reach`` ranks'. Each
    rank holding one of a token's experts gets it once over NVLink (``(n - 1)`` ranks,
    each hit with ``1 - miss_all(E / ep)``; a remote one forwarded there), each other
    domain holding one once over the NICs (``ep / near - 1`` domains, each hit with
    ``1 - miss_all(near E / ep)``), at once: the slower, plus the all-to-all's latency
    steps and one launch. Its NIC copies are never more than the all-to-all's (a union
    bound); its NVLink copies can be (they carry the forwarded ones), so where NVLink is
    not much faster than the NICs it can take the longer. Group-limited routing
    (``groups``, ``group_topk`` [46]) draws the misses of :func:`routed_miss`."""
    near = np.minimum(near, np.maximum(np.floor(reach / (n / ep)), 1.0))
    blocks = experts / ep
    hit_rank = 1.0 - routed_miss(experts, top_k, blocks, groups, group_topk)
    hit_domain = 1.0 - routed_miss(experts, top_k, np.minimum(near * blocks, experts), groups,
                                   group_topk)
    nvlink = (n - 1.0) * hit_rank * token_bytes / hw.up_bw
    nics = (ep / near - 1.0) * hit_domain * token_bytes / hw.out_bw
    return (np.maximum(nvlink, nics) + (n - 1.0) * np.where(near < ep, hw.out_lat, hw.up_lat)
            + call_lat * (n > 1))


def communication(w, k, c, sp: Split, hw: Hardware, ly: Layer) -> Communication:
    """TP all-reduces [3] [2], the CP K/V ring [4] and the EP all-to-all of one layer."""
    tp, cp, ep, etp, rc = sp.tp, sp.cp, sp.ep, sp.etp, sp.rc
    call_lat = hw.call_lat
    # TP: 2 all-reduces forward, 2 backward per layer [3] (RS + AG under SP [2], same bus
    # bytes), 2 more when the forward is recomputed in full; over NVLink in the domain.
    # An MoE layer has the attention's pair and, for its MLP, the shared experts' pair
    # (a TP MLP of their own) if it has shared experts; its routed experts' TP traffic is
    # the dispatcher's, priced with EP below [31].
    tp_bw, tp_lat = hw.link(hw.within(tp, sp.n_acc))
    t_ar = net.allreduce_time(ly.act_bytes, tp, bus_bandwidth=tp_bw, latency=tp_lat)
    # Under FP8 with SP the all-gathers move FP8, one byte an element [28]: a reduce-scatter
    # of the 16-bit bytes and an all-gather of half of them.
    t_rs_ag8 = (net.reduce_scatter_time(ly.act_bytes, tp, bus_bandwidth=tp_bw, latency=tp_lat)
                + net.all_gather_time(ly.act_bytes / 2.0, tp, bus_bandwidth=tp_bw, latency=tp_lat))
    # (Under SP a pair's all-reduce is a reduce-scatter and an all-gather: two launches.)
    launches = call_lat * (tp > 1) * (1.0 + sp.sp)
    t_ar16 = t_ar + launches  # (16 bits either way: moe_shared_expert_overlap's pair, below)
    t_ar = np.where(np.asarray(hw.low_bits) & sp.sp, t_rs_ag8, t_ar) + launches
    mlp_pairs = (1.0 - ly.moe_share) + ly.moe_share * (1.0 if w.shared else 0.0) if w.moe else 1.0
    # (A multi-head latent attention's pair moves its latents where the others move h on
    # one of its two collectives: ``attn_pair`` of a pair's bytes [33].)
    tp_calls = (w.attn_pair + mlp_pairs) * (2.0 + (rc == 2))
    tp_total = tp_calls * t_ar
    if w.mla:
        # Under SP a multi-head latent attention makes four collectives a direction where
        # GQA makes two [33]: all-gathers of the query latent, of the key/value latent
        # (inside the up projections) and of the positional key, and the output's
        # reduce-scatter. ``attn_pair`` above scales a pair's bytes, and with them its
        # latency; the rest of two pairs' latency (ring steps and launches) is added here.
        t_lat = (net.allreduce_time(0.0, tp, bus_bandwidth=tp_bw, latency=tp_lat)
                 + 2.0 * call_lat * (tp > 1))
        tp_total = tp_total + sp.sp * ((2.0 - w.attn_pair) * (2.0 + (rc == 2))) * t_lat
    # The forward's share of the traffic, one of 2 (3 with a full recompute, whose
    # forward runs in the backward phase). tp_comm_overlap hides overlap_efficiency of
    # each phase's traffic, but only behind the GEMMs its chunks run beside [37]: the
    # TP-communicating layers' forward GEMMs, in the backward their gradients' (2x) and a
    # full recompute's forward. (None for multi-head latent attention, whose projections
    # turn the overlap off [33].)
    again_f = 1.0 + (rc == 2)
    tp_f = tp_total / (1.0 + again_f)
    tp_b = tp_total - tp_f
    if w.mla and np.any(sp.up_proj):
        # "mla_up_proj" [47] runs the up projections again in the backward, and under SP
        # their all-gathers of the query latent, the key/value latent and the positional
        # key (three collectives, the latents' share of a pair's bytes, as attn_pair counts
        # them); without SP they take replicated inputs and move nothing.
        latents = (w.q_lora + w.kv_lora + w.rope) / (2.0 * float(w.hidden))
        up_tp = np.where(sp.up_proj & sp.sp, latents * t_ar + (1.5 - latents) * t_lat, 0.0)
        tp_total, tp_b = tp_total + up_tp, tp_b + up_tp
    hide_b = (1.0 + again_f) * ly.t_tp_gemms_f
    if sp.checkpoints:
        # "mlp", "moe" and "shared_experts" [47] run the checkpointed MLPs' forward again in
        # the backward, and with it their TP pair (a dense layer's MLP's, an MoE layer's
        # shared experts'; the routed experts' TP traffic is the dispatcher's, below),
        # beside their GEMMs again (ly.t_tp_gemms_again), which tp_comm_overlap hides it
        # behind.
        pairs_again = (1.0 - ly.moe_share) * np.asarray(sp.dense_mlp, dtype=np.float64)
        if w.moe and w.shared:
            pairs_again = pairs_again + ly.moe_share * (
                np.asarray(sp.moe_layer, dtype=np.float64)
                + np.asarray(sp.shared_mlp, dtype=np.float64))
        tp_total, tp_b = tp_total + pairs_again * t_ar, tp_b + pairs_again * t_ar
        hide_b = hide_b + ly.t_tp_gemms_again
    tp_hidden = np.where(k["tp_comm_overlap"] & sp.sp & (not w.mla), c["overlap_efficiency"], 0.0)
    tp_layer_f = tp_f - tp_hidden * np.minimum(tp_f, ly.t_tp_gemms_f)
    tp_layer = tp_layer_f + (tp_b - tp_hidden * np.minimum(tp_b, hide_b))
    if w.moe and w.shared and np.any(sp.se_overlap):
        # moe_shared_expert_overlap [49]: the shared experts' linear layers lose their
        # parallel mode and their userbuffers; their pair, an all-gather of the 16-bit input
        # and a reduce-scatter of the output (each's backward the other), runs on the
        # shared experts' stream, outside tp_comm_overlap: neither hidden by it nor a GEMM
        # it hides the rest behind. Priced exposed (its own stream lets it run beside the
        # dispatcher's work, not counted: an upper bound). A forward, the backward (a full
        # recompute's forward too), and the forward "moe" runs again.
        t_shared = ly.t_shared_fc1 + ly.t_shared_fc2
        again_pairs = (np.asarray(sp.moe_layer, dtype=np.float64)
                       + np.asarray(sp.shared_mlp, dtype=np.float64))
        calls_b = again_f + again_pairs
        rest_f = tp_f - ly.moe_share * t_ar
        rest_b = tp_b - ly.moe_share * calls_b * t_ar
        window_f = ly.t_tp_gemms_f - ly.moe_share * t_shared
        window_b = hide_b - ly.moe_share * (1.0 + calls_b) * t_shared
        se_f = rest_f - tp_hidden * np.minimum(rest_f, window_f) + ly.moe_share * t_ar16
        se_b = rest_b - tp_hidden * np.minimum(rest_b, window_b) + ly.moe_share * calls_b * t_ar16
        tp_total = np.where(sp.se_overlap, tp_total + ly.moe_share * (1.0 + calls_b)
                            * (t_ar16 - t_ar), tp_total)
        tp_layer_f = np.where(sp.se_overlap, se_f, tp_layer_f)
        tp_layer = np.where(sp.se_overlap, se_f + se_b, tp_layer)
    tp_layer_b = tp_layer - tp_layer_f
    # CP: cp-1 ring steps of the local K and V, forward; K, V and their gradients backward
    # (3x in all), each step's send beside that step's share of the attention core, one
    # cp-th (load-balanced chunks), the last step's core with no send beside it [4] [37];
    # a recomputed core (selective or full) runs its ring again.
    again = rc >= 1
    cp_total, cp_layer_f, cp_layer_b = _kv_ring(w, sp, hw, ly, cp, again)
    if np.any((np.asarray(sp.cpc) != 0) & (np.asarray(cp) > 1)):
        cp_total, cp_layer_f, cp_layer_b = _cp_collectives(
            w, sp, hw, ly, again, (cp_total, cp_layer_f, cp_layer_b))
    cp_layer = cp_layer_f + cp_layer_b
    # EP: dispatch + combine forward and backward per MoE layer, top-k copies of each token
    # (the rank's sequence slice under SP), over the EP group (ranks tp apart in the expert
    # grid, spanning tp ep [6]). With TP, the dispatcher then all-gathers the routed tokens
    # over the (expert) TP group and reduce-scatters the experts' output back [31]: k
    # copies of the layer's activations, 16 bits, not hidden by tp_comm_overlap (the
    # routed experts' GEMMs are not TP-communicating layers).
    # A group that is not inside one domain sends over the NICs to its peers in other
    # domains and over NVLink to the rest, at once; the slowest rank, the one with the
    # fewest peers beside it (gcd(domain, span) ranks of a span straddling a domain's edge:
    # 8 of 64 in a rack of 72; a domain's worth of a span of whole domains), paces it.
    # One group over the whole job (no PP, no expert DP) has its fewest in its last,
    # partial domain, where the stride divides the domain (megatron_compose.straddled_peers'
    # rule): 56 of EP 128 on two racks of 72, where the gcd bound priced 8.
    if w.moe:
        # (the expert grid's order is etp-ep-edp-pp [6]: EP peers etp apart, spanning etp ep,
        # the expert TP group etp consecutive ranks)
        span = etp * ep
        near = np.clip(np.gcd(hw.domain, span) // etp, 1, ep)
        tail = np.mod(span, hw.domain)
        near = np.where((span == sp.n_acc) & (np.mod(hw.domain, etp) == 0),
                        np.maximum(near, np.where(tail == 0, hw.domain, tail) // etp), near)
        near = np.where(hw.within(span, sp.n_acc), ep, near)
        a2a = net.split_all_to_all_time(
            ly.act_bytes * w.top_k / ly.norm_split, ep, near, scale_up_bandwidth=hw.up_bw,
            scale_up_latency=hw.up_lat, scale_out_bandwidth=hw.out_bw,
            scale_out_latency=hw.out_lat) + call_lat * (ep > 1)
        # The flex dispatcher with DeepEP (moe_enable_deepep) [39]: one exchange over the
        # expert TP x EP group, each token sent once to each rank that holds one of its
        # experts (over NVLink, a remote domain's copies forwarded there) and once to each
        # other domain that does (over the NICs), not once per routed copy; no TP gather
        # after it. Routing uniform over the experts: a token misses m of E experts with
        # probability C(E - m, k) / C(E, k) (miss_all); group-limited, routed_miss.
        # HybridEP [50]: the same exchange, its NVLink reach the whole domain (an NVL72
        # rack), where DeepEP's is 8 ranks.
        hybrid = hybridep(k)
        reach = (np.where(hybrid, HYBRIDEP_NVL_PEERS, DEEPEP_NVL_PEERS) if np.any(hybrid)
                 else DEEPEP_NVL_PEERS)
        flex = flex_dispatch_time(ly.act_bytes / ly.norm_split, w.experts, w.top_k, ep,
                                  etp * ep, near, hw, call_lat,
                                  k.get("moe_router_num_groups", 0),
                                  k.get("moe_router_group_topk", 0), reach)
        routed_bytes = ly.act_bytes * w.top_k * (etp / (tp * 1.0))
        etp_bw, etp_lat = hw.link(hw.within(etp, sp.n_acc))
        dispatch_tp = (net.all_gather_time(routed_bytes, etp, bus_bandwidth=etp_bw, latency=etp_lat)
                       + net.reduce_scatter_time(routed_bytes, etp, bus_bandwidth=etp_bw,
                                                 latency=etp_lat) + 2.0 * call_lat * (etp > 1))
        moe_f = np.where(k["moe_enable_deepep"], 2.0 * flex, 2.0 * a2a + dispatch_tp)
        # (a forward run again in the backward: a full recompute's, or "moe"'s [47])
        again_ep = (rc == 2) | np.asarray(sp.moe_layer)
        ep_layer = ly.moe_share * (2.0 + again_ep) * moe_f
        ep_layer_f = ly.moe_share * moe_f
        ep_layer_b = ly.moe_share * (1.0 + again_ep) * moe_f
        if w.shared and np.any(sp.se_overlap):
            # moe_shared_expert_overlap [49]: the shared experts run on a stream of their
            # own, their first GEMM (with the activation) beside the dispatch (the
            # all-to-all, and the expert TP group's all-gather after it), their second
            # beside the combine's all-to-all; in the backward, each GEMM's two (the input's
            # and the weights' gradients) beside that exchange's backward, which runs the
            # expert TP collectives the other way round: the combine's all-to-all then the
            # all-gather (its reduce-scatter's backward) beside the second GEMM's, the
            # dispatch's all-to-all alone (its all-gather's backward, a reduce-scatter,
            # runs before it) beside the first's. Each hides up to overlap_efficiency of the
            # exchange it runs beside (the kernels share the SMs). The flex dispatcher's
            # dispatch and combine alike (its token_dispatch and combine run the same calls
            # in Megatron-Core since it lets the two meet [49]).
            gather = (net.all_gather_time(routed_bytes, etp, bus_bandwidth=etp_bw,
                                          latency=etp_lat) + call_lat * (etp > 1))
            deepep = k["moe_enable_deepep"]
            with_gather = np.where(deepep, flex, a2a + gather)
            alone = np.where(deepep, flex, a2a)
            eta = c["overlap_efficiency"]
            fc1, fc2 = ly.t_shared_fc1, ly.t_shared_fc2
            save_f = eta * (np.minimum(with_gather, fc1) + np.minimum(alone, fc2))
            save_b = eta * (np.minimum(alone, 2.0 * fc1) + np.minimum(with_gather, 2.0 * fc2))
            se_f = ly.moe_share * (moe_f - save_f)
            se_b = ly.moe_share * ((1.0 + again_ep) * moe_f - save_b - again_ep * save_f)
            ep_layer_f = np.where(sp.se_overlap, se_f, ep_layer_f)
            ep_layer_b = np.where(sp.se_overlap, se_b, ep_layer_b)
            ep_layer = np.where(sp.se_overlap, se_f + se_b, ep_layer)
    else:
        ep_layer = ep_layer_f = ep_layer_b = np.zeros(())
    return Communication(tp_total=tp_total, tp_layer=tp_layer, tp_layer_f=tp_layer_f,
                         tp_layer_b=tp_layer_b, cp_total=cp_total,
                         cp_layer=cp_layer, ep_layer=ep_layer, cp_layer_f=cp_layer_f,
                         cp_layer_b=cp_layer_b, ep_layer_f=ep_layer_f, ep_layer_b=ep_layer_b)


def _kv_ring(w, sp: Split, hw: Hardware, ly: Layer, n, again):
    """(total, forward, backward) of the K/V ring over ``n`` ranks of the CP group [4] [42]:
    ``n - 1`` sends of the rank's K and V forward, of K, V and their gradients backward
    (3x in all), each beside that step's share of the attention core, one ``n``-th
    (load-balanced chunks); a recomputed core runs its ring again. Over NVLink where the
    CP group (spanning ``tp cp``) lies in a domain, else the fabric."""
    kv_bytes = 2.0 * 2.0 * ly.tokens * ly.kv_t * w.core_dim
    cp_bw, cp_lat = hw.link(hw.within(sp.tp * sp.cp, sp.n_acc))
    step = net.p2p_time(kv_bytes, bandwidth=cp_bw, latency=cp_lat) + hw.call_lat
    total = (3.0 + again) * ((n - 1) * step)
    ring_f = (n - 1) * _exposed(step, ly.t_core_f / n, 1.0)
    return total, ring_f, (n - 1) * _exposed(2.0 * step, ly.t_core_b / n, 1.0) + again * ring_f


def cp_peers_near(hw: Hardware, sp: Split, size=None):
    """The ranks of a CP group (``tp`` apart, spanning ``tp cp`` [6]; of ``size`` of them,
    consecutive, where given: hierarchical CP's all-to-all group) in the sender's NVLink
    domain: all of them where the groups lie inside domains (:meth:`Hardware.within`), a
    domain's worth where they cover whole domains the stride divides, else the fewest a
    straddling group holds (:func:`.megatron_compose.straddled_peers`), as the DP groups'."""
    from .megatron_compose import straddled_peers  # (that module imports this one)
    tp = sp.tp
    cp = sp.cp if size is None else size
    span = tp * cp
    whole = (np.mod(span, hw.domain) == 0) & (np.mod(hw.domain, tp) == 0)
    near = np.where(hw.within(span, sp.n_acc) | whole, np.clip(hw.domain // tp, 1, None),
                    straddled_peers(hw.domain, span, tp, sp.n_acc))
    return np.minimum(near, cp)


def cp_collective_memory(w, sp: Split, ly: Layer):
    """Bytes a layer's CP exchange holds beyond the ring's (0 for ``p2p``, whose buffers are
    not counted) [42]: under ``all_gather`` the backward's K and V gathered whole again
    (``k_ag``, ``v_ag``, held to its end), the two chunks' gradients against their key
    ranges (``dk_per_step``: on CP rank 0 the second chunk's spans the sequence) and the
    full-length dK and dV they add into before the reduce-scatter, 16 bits: ``3 cp`` times
    the rank's K and V on the rank that holds the most (the reorder's copy of dK and dV
    before the reduce-scatter is not counted); under ``a2a`` nothing more (the heads' slice
    of the whole sequence the attention keeps is as large as the sequence's slice of every
    head)."""
    kv_bytes = 2.0 * 2.0 * ly.tokens * ly.kv_t * w.core_dim
    return np.where((np.asarray(sp.cpc) == _CP_ALL_GATHER) & (sp.cp > 1), 3.0 * sp.cp * kv_bytes, 0.0)


def _cp_collectives(w, sp: Split, hw: Hardware, ly: Layer, again, ring):
    """(cp_total, cp_layer_f, cp_layer_b) of a layer where ``cp_comm_type`` is not the ring
    (``ring``: the ring's three, kept where it is) [42]. The first two do not overlap the
    attention:
    - ``all_gather`` (Transformer Engine's ``AttnFuncWithCPAndKVAllGather``, "KV all-gather
      between CP ranks is exposed", as Llama 3 runs it): forward, K and V gathered whole
      over the CP group, two all-gathers; backward, gathered again (the forward keeps only
      the local ones) and their gradients reduce-scattered, four collectives;
    - ``a2a`` (``AttnFuncWithCPAndQKVOA2A``, Ulysses-style): forward, all-to-alls of Q, K
      and V from the sequence's slice to the heads' slice, the attention on the whole
      sequence, the output's all-to-all back (four); backward, the output and its gradient
      (the saved output is the one after the exchange), then dQ, dK and dV (five);
    - ``a2a+p2p`` (hierarchical CP, ``AttnFuncWithCPAndKVP2P`` with two groups): the
      all-to-alls of ``a2a`` over the first ``cp_a2a_size`` consecutive CP ranks, then the
      K/V ring (:func:`_kv_ring`) over the ``cp / cp_a2a_size`` groups, its K and V as large
      as the rank's (the group's tokens, its heads' share), overlapped as the ring is.
    16 bits each, over the CP group's links (in the domain, across it for the peers
    outside, :func:`cp_peers_near`); a recomputed core (selective or full) runs the
    forward's again, as the ring does."""
    cp = np.asarray(sp.cp) * 1.0
    call_lat = hw.call_lat
    near = cp_peers_near(hw, sp)
    links = dict(scale_up_bandwidth=hw.up_bw, scale_up_latency=hw.up_lat,
                 scale_out_bandwidth=hw.out_bw, scale_out_latency=hw.out_lat)
    # a head of this rank's tokens, 16 bits (the core's width: QK^T's and PV's mean)
    head = 2.0 * ly.tokens * w.core_dim

    def gathered(kind):  # K or V, the whole sequence's (cp of the rank's) [42]
        return net.two_level_time(kind, cp * ly.kv_t * head, cp, near, **links) + call_lat

    def a2a(heads, n=cp, n_near=near):  # (a group of one: no call)
        return net.split_all_to_all_time(heads * head, n, n_near, **links) + call_lat * (n > 1)

    heads_t = w.heads / (sp.tp * 1.0)
    ag_f = 2.0 * gathered("all_gather")
    ag_b = ag_f + 2.0 * gathered("reduce_scatter")
    a2a_f = 2.0 * a2a(heads_t) + 2.0 * a2a(ly.kv_t)
    a2a_b = 3.0 * a2a(heads_t) + 2.0 * a2a(ly.kv_t)
    cpc = np.asarray(sp.cpc)
    f = np.where(cpc == _CP_A2A, a2a_f, ag_f)
    b = np.where(cpc == _CP_A2A, a2a_b, ag_b) + again * f
    total = f + b
    if np.any(cpc == _CP_HIER):
        # (a group of one: TE's plain ring, no all-to-all; the whole CP group: plain a2a)
        a = np.clip(np.asarray(sp.cpa) * 1.0, 1.0, cp)
        near_a = cp_peers_near(hw, sp, a)
        in_f = 2.0 * a2a(heads_t, a, near_a) + 2.0 * a2a(ly.kv_t, a, near_a)
        in_b = 3.0 * a2a(heads_t, a, near_a) + 2.0 * a2a(ly.kv_t, a, near_a) + again * in_f
        r_total, r_f, r_b = _kv_ring(w, sp, hw, ly, cp / a, again)
        hier = cpc == _CP_HIER
        f, b = np.where(hier, in_f + r_f, f), np.where(hier, in_b + r_b, b)
        total = np.where(hier, in_f + in_b + r_total, total)
    use = (cpc != 0) & (cp > 1)
    ring_total, ring_f, ring_b = ring
    return (np.where(use, total, ring_total), np.where(use, f, ring_f), np.where(use, b, ring_b))


# --------------------------------------------------------------- 5. pipeline

@dataclass(frozen=True)
class Pipeline:
    """The heaviest stage, the bubble and the p2p sends [s]."""
    #: layers of the stage with the most (its memory and DP traffic are priced)
    layers_stage: object
    #: layers of the stage that paces the pipeline, and 1.0 where that is the last (the
    #: LM head's and MTP's): they differ from layers_stage and 1.0 only with set stages [13]
    paced_layers: object
    last_paced: object
    t_head: object
    #: per microbatch, the paced stage's cycle beyond the priced stage's own work (0.0
    #: unless stages are set [13]): time that stage waits, free to hide the DP traffic it
    #: sends every microbatch (ZeRO-2's, FSDP's: megatron_compose.data_parallel)
    slack: object
    #: per layer and microbatch, the time the combined 1F1B schedule saves [35] (0.0
    #: without overlap_moe_expert_parallel_comm), and of it the host's launch time
    a2a_hidden: object
    a2a_launch: object
    bubble: object
    t_pipe: object
    t_pp: object
    window_f: object
    window_b: object
    #: with a partial recompute (Split.partial), a layer's terms averaged over the paced
    #: stage's layer-microbatches (recomputed and plain, :func:`recomputed`), by name, for
    #: megatron_compose.compose; None without one (the recomputed layers' terms then hold
    #: for every layer, and window_f ... a2a_launch above are the priced stage's averages)
    paced: object = None


#: A layer's terms compose reads, averaged over the paced stage under a partial recompute.
_PACED_LAYER = ("layer_f", "layer_b")
_PACED_COMM = ("tp_total", "tp_layer", "tp_layer_f", "tp_layer_b", "cp_total", "cp_layer",
               "cp_layer_f", "cp_layer_b", "ep_layer", "ep_layer_f", "ep_layer_b")
_PACED_PHASES = ("window_f", "window_b", "a2a_hidden", "a2a_launch")


def _phases(c, rc, ly: Layer, cm: Communication, paired):
    """A layer's two phases under the launch floor and the combined 1F1B pairing (see
    :func:`pipeline`): window_f, window_b, alone, per_layer, a2a_hidden, a2a_launch, launch."""
    # (own_*: a phase's work but its EP all-to-alls; gpu_*: all of its GPU time)
    own_f = ly.layer_f + cm.tp_layer_f + cm.cp_layer_f
    own_b = ly.layer_b + cm.tp_layer_b + cm.cp_layer_b
    gpu_f, gpu_b = own_f + cm.ep_layer_f, own_b + cm.ep_layer_b
    floor_b = c["layer_overhead"] * (2.0 + (rc == 2))
    window_f = np.maximum(gpu_f, c["layer_overhead"])
    window_b = np.maximum(gpu_b, floor_b)
    eta = c["overlap_efficiency"]
    hide = np.minimum(cm.ep_layer_f, eta * own_b) + np.minimum(cm.ep_layer_b, eta * own_f)
    pair = np.maximum(gpu_f + gpu_b - hide, c["layer_overhead"] + floor_b)
    alone = window_f + window_b
    saved = alone - pair
    a2a_hidden = paired * saved
    a2a_launch = paired * np.minimum(saved, (window_f - gpu_f) + (window_b - gpu_b))
    # (launch: the host time its GPU work does not hide, compose's launch_latency a layer)
    launch = (window_f - gpu_f) + (window_b - gpu_b) - a2a_launch
    return dict(window_f=window_f, window_b=window_b, alone=alone, per_layer=alone - a2a_hidden,
                a2a_hidden=a2a_hidden, a2a_launch=a2a_launch, launch=launch)


def pipeline(w, c, sp: Split, hw: Hardware, ly: Layer, cm: Communication, plain=None) -> Pipeline:
    """Heaviest stage (with the LM head [11]) times microbatches, plus the bubble [1] and p2p.

    ``plain``: under a partial recompute (:attr:`Split.partial`), the ``(Layer,
    Communication)`` of :meth:`Split.plain`, the layers it leaves alone (``ly`` and ``cm``
    then the recomputed layers'); a stage of ``n`` layers runs :func:`recomputed` of them
    as ``ly``'s and the rest as ``plain``'s."""
    tp, pp, v, m = sp.tp, sp.pp, sp.v, sp.m
    uneven, n_first, n_mid, n_last = stage_layers(w, pp, sp.first, sp.last)
    layers_stage = np.where(uneven, np.maximum(np.maximum(n_first, n_mid), n_last),
                            np.ceil(w.layers / (pp * 1.0)))
    # The host launches kernels asynchronously [12]: each phase of a layer takes the
    # longer of its GPU time (compute and the communication left exposed) and the host's
    # time to issue its kernels, one
    # unit of `layer_overhead` forward, two backward, one more for a forward recomputed
    # in full. Small microbatches of small models are launch-bound, and then a bigger
    # microbatch costs nothing extra. The two phases are also the windows that hide the
    # data-parallel traffic (megatron_compose.data_parallel): work added under a phase's
    # floor (selective recompute) or taken out of it (tp_comm_overlap) changes neither
    # (tests/test_megatron_solve.py holds the step monotone in the recompute mode, the
    # overlaps and every fitted constant on random layouts).
    # (:func:`_phases`)
    # Combined 1F1B [35] (overlap_moe_expert_parallel_comm): in the steady state a layer's
    # forward for one microbatch runs beside the backward of a layer of another (layer i
    # beside layer L - 1 - i), the forward's EP all-to-alls hidden behind the backward's
    # work and the backward's behind the forward's, each up to overlap_efficiency of that
    # phase's work on its own streams (its compute and the TP and CP waits inside it; the
    # kernels share the SMs; an upper bound: Megatron hides each all-to-all behind one
    # submodule, the dispatch behind the MLP, the combine behind the attention): the pair
    # takes its GPU work less what hides, or the host's two floors, whichever is longer.
    # ``paired`` (combined_1f1b_paired) are the first rank's microbatches past its
    # warm-up; the rest run alone, as the cool-down does, and so do the fill and drain:
    # the bubble below takes the layers' time alone. Where a phase is launch-bound, its
    # idle host time merges into the pair's: that part of the saving (``a2a_launch``, at
    # most the phases' own launch excess) is launch time, the rest all-to-all. Off,
    # ``paired`` is 0.0 and the same bits.
    ph = _phases(c, sp.rc, ly, cm, sp.a2a_paired)
    per_layer, alone = ph["per_layer"], ph["alone"]
    if plain is None:
        def mix(n, name):  # a stage of n layers, each the same
            return n * ph[name]
    else:
        # A partial recompute [40]: a stage's recomputed layers at ly's terms, the rest at
        # plain's (the two times differ only by the recomputed forward, its collectives
        # and its launches; each phase keeps its own floor).
        ph0 = _phases(c, sp.plain().rc, plain[0], plain[1], sp.a2a_paired)

        def mix(n, name):
            r = recomputed(sp, n)
            return r * ph[name] + (n - r) * ph0[name]
    t_layers = mix(layers_stage, "per_layer")
    vocab_t = vocab_per_rank(w, tp)  # padded [41]
    head_tokens = ly.tokens
    # LM head: the logits GEMM forward and backward in 16 bits (outside FP8 [11]) and the
    # FP32 vocabulary-parallel cross-entropy at HBM bandwidth [11] (Megatron-Core's unfused
    # one; its "native" fusion is priced alike [44]), or Transformer Engine's fused one on
    # the 16-bit logits [44].
    ce_bytes = CROSS_ENTROPY_BYTES
    if np.any(sp.ce_te):
        ce_bytes = np.where(sp.ce_te, TE_CROSS_ENTROPY_BYTES, CROSS_ENTROPY_BYTES)
    t_head = 3.0 * hw.gemm(fl.logits_flops(head_tokens, ly.h, vocab_t), peak=hw.peak16,
                           plat=hw.plateau16, k=ly.h) \
        + gemm.memory_bound_time(ce_bytes * head_tokens * vocab_t, hw.hbm)
    # Multi-token prediction [34]: each module a layer (priced as this stage's), its
    # projection and norms, and the output head again, every microbatch, on the last stage.
    # (Megatron-Core's block method does not recompute MTP modules [40]: with
    # recompute_num_layers set they run plain)
    mtp_layer, mtp_alone = per_layer, alone
    if plain is not None:
        block = (np.asarray(sp.rc) == 2) & (np.asarray(sp.rnl) > 0)
        mtp_layer = np.where(block, ph0["per_layer"], per_layer)
        mtp_alone = np.where(block, ph0["alone"], alone)
    t_mtp = sp.mtp * (mtp_layer + t_head + ly.t_mtp)
    stage_max = t_layers + (t_head + t_mtp)
    t_mtp_alone = sp.mtp * (mtp_alone + t_head + ly.t_mtp)  # (the bubble's: unpaired [35])
    # The fill and the drain: a 1F1B pipeline of stages of times t_s runs its first
    # microbatch forward through every stage and its last backward back, and the m in
    # between at the slowest stage's pace: m max t + (sum t - max t), of which the second
    # term is the bubble [1] (eq. (1): (p - 1) t where the stages are equal), over v with
    # interleaving [1] (Sec. 2.2). Its stages run unpaired [35]. Evenly split, every stage
    # holds the heaviest one's layers and the last the head and MTP besides, which it
    # paces (an upper bound where the layers do not split evenly).
    bubble = (pp - 1) / (v * 1.0) * mix(layers_stage, "alone")
    # Set first and last stages [13]: the slowest of the first, a middle stage and the last
    # (with the head and MTP) paces the pipeline, and the others' times make the bubble.
    t_last = mix(n_last, "per_layer") + (t_head + t_mtp)
    # (a stage's time grows with its layers, recomputed or not: the larger count's)
    t_other = mix(np.maximum(n_first, n_mid), "per_layer")
    last_paced = np.where(uneven, t_last >= t_other, True) * 1.0
    paced_layers = np.where(uneven, np.where(t_last >= t_other, n_last, np.maximum(n_first, n_mid)),
                            layers_stage)
    stage_max = np.where(uneven, np.maximum(t_other, t_last), stage_max)
    # The stage the DP traffic is priced on (the most layers; the last where it ties) is
    # paced by the slowest stage: every microbatch it waits for the rest of that stage's
    # cycle, time in which its per-microbatch DP traffic runs beside no compute of its
    # own. Counted as hiding (megatron_compose.data_parallel), it keeps the step monotone
    # in the work a layer adds: without it, selective recompute lengthened the priced
    # stage's backward, and so hid more of its traffic, by more than it lengthened the
    # step paced by a last stage of one layer and the head (layouts the seeded
    # monotonicity test drew, 2026-12-05).
    own = np.where(n_last >= np.maximum(n_first, n_mid), t_last, t_other)
    slack = np.where(uneven, stage_max - own, 0.0)
    # (with neither set n_mid is 0 at pp 2, a stage that is not there; its 0.0 changes no max)
    a_first, a_mid = mix(n_first, "alone"), mix(n_mid, "alone")
    a_last = mix(n_last, "alone") + (t_head + t_mtp_alone)
    a_max = np.maximum(np.maximum(a_first, a_mid), a_last)
    bubble = np.where(uneven, (a_first + (pp - 2.0) * a_mid + a_last - a_max) / (v * 1.0), bubble)
    t_pipe = m * stage_max + bubble
    # p2p: microbatch activations, split by TP under SP or scatter/gather (p2p_split); the
    # first and last send cross all p v - 1 chunk boundaries, and the steady state waits
    # on p2p_steady more.
    # Stages are tp cp dp ranks apart [6], a stride S; in a job larger than one domain,
    # the boundaries of stages in two domains cross the fabric: all of them where S is a
    # domain or more, else a share S / domain of the (cyclic) chain's boundaries (twice
    # that where S does not divide the domain, when both neighbours of an edge are split by
    # it). The first and last sends cross the chain's boundaries in turn, each at its own
    # link; the steady state's exchanges are in lockstep, paced by the slowest.
    stride = tp * sp.cp * sp.dp
    q = hw.domain / stride  # stages per domain (a whole number where S divides it)
    cross = np.where(sp.n_acc <= hw.domain, 0.0, np.where(q <= 1.0, 1.0, np.minimum(
        1.0, np.where(np.floor(q) == q, 1.0, 2.0) * stride * (1.0 / hw.domain))))
    # (times the links' reciprocal bandwidths: the fused kernel's loop divides by neither)
    send = ly.act_bytes / sp.p2p_split
    t_in = send * (1.0 / hw.up_bw) + hw.up_lat + hw.call_lat
    t_out = send * (1.0 / hw.out_bw) + hw.out_lat + hw.call_lat
    t_ramp = cross * t_out + (1.0 - cross) * t_in
    t_slow = np.where(cross > 0.0, t_out, t_in)
    # Split without SP (legacy scatter/gather), the receiver all-gathers the tp slices over
    # TP before the stage can use them, on the critical path [26].
    tp_bw, tp_lat = hw.link(hw.within(tp, sp.n_acc))
    gather = np.where(~np.asarray(sp.sp) & (sp.p2p_split > 1), net.all_gather_time(
        ly.act_bytes, tp, bus_bandwidth=tp_bw, latency=tp_lat) + hw.call_lat, 0.0)
    t_pp = np.where(pp > 1, 2.0 * ((t_ramp + gather) * (pp * v - 1)
                                   + (t_slow + gather) * sp.p2p_steady), 0.0)
    paced = None
    windows = {name: ph[name] for name in _PACED_PHASES}
    if plain is not None:
        # the priced stage's average layer (data_parallel's windows), and the paced stage's
        # over its layer-microbatches, its MTP modules' too (recomputed only under
        # recompute="full" without recompute_num_layers [40])
        r = recomputed(sp, layers_stage)
        # (a stage all of one kind takes that kind's terms as they are: the same bits as a
        # call without a partial recompute, where the mean would round)
        windows = {name: np.where(r == layers_stage, ph[name], np.where(
            r == 0, ph0[name], mix(layers_stage, name) / layers_stage)) for name in _PACED_PHASES}
        n_paced = paced_layers + sp.mtp * last_paced
        share = (recomputed(sp, paced_layers)
                 + sp.mtp * last_paced * ((sp.rc == 2) & (np.asarray(sp.rnl) == 0))) / n_paced
        both = ((ly, plain[0], _PACED_LAYER), (cm, plain[1], _PACED_COMM))
        paced = {name: share * getattr(a, name) + (1.0 - share) * getattr(b, name)
                 for a, b, names in both for name in names}
        paced.update({name: share * ph[name] + (1.0 - share) * ph0[name]
                      for name in _PACED_PHASES + ("launch",)}, share=share)
    return Pipeline(layers_stage=layers_stage, paced_layers=paced_layers, last_paced=last_paced,
                    t_head=t_head, slack=slack, a2a_hidden=windows["a2a_hidden"],
                    a2a_launch=windows["a2a_launch"], bubble=bubble, t_pipe=t_pipe, t_pp=t_pp,
                    window_f=windows["window_f"], window_b=windows["window_b"], paced=paced)
