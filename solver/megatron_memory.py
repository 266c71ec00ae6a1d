"""Per-accelerator memory of Megatron-Core training: model state, activations, buffers.

Arrays in, arrays out. Model state follows Megatron-Core's mixed-precision
layout: 16-bit weights, FP32 main gradients, and Adam's FP32 master weights and
two moments, the last sharded over the data-parallel group by the distributed
optimizer (ZeRO-1), gradients too at stage 2, weights too at stage 3 (FSDP).
Activations follow Korthikanti et al.'s per-layer accounting, generalized to
grouped-query attention and gated MLPs, times the microbatches a 1F1B or
interleaved schedule keeps in flight on each pipeline rank.

References
----------
[1] Korthikanti, V. et al. (2023), "Reducing activation recomputation in large
    transformer models", MLSys, arXiv:2205.05198: Sec. 4.1 (per-layer bytes
    s b h (34 + 5 a s / h)), Table 2 (TP, SP, selective and full recompute),
    Sec. 4.2.3 (interleaved schedule: first stage holds L (1 + (p-1)/(p v)) layers).
[2] Megatron-LM, ``docs/source/api-guide/dist_optimizer.md``: bytes per
    parameter 2 (bf16 weight) + 4 (fp32 grad) + 12 / d (fp32 master, Adam m, v);
    fp16 param and grads: 2 + 2 + 16 / d (the fp32 main gradient with the optimizer).
[3] Rajbhandari, S. et al. (2020), "ZeRO", SC (stages 1-3).
[4] Megatron-LM, ``megatron/core/pipeline_parallel/schedules.py``: warm-up
    microbatches p - r - 1 (1F1B) and 2 (p - r - 1) + (v - 1) p (interleaved).
[5] Megatron-Core ``optimizer/distrib_optimizer.py`` and ``optimizer/optimizer.py``
    (``_copy_model_grads_to_main_grads``): the optimizer step makes the FP32 copy of
    16-bit gradients (``shard_main_param.grad = shard_model_grad.float()``, a new
    tensor; for FP32 main gradients ``.float()`` is the same one), and ``zero_grad``
    (``set_to_none``), called by ``train_step`` before the next forward, drops it: it
    lives after the backward has freed the activations, never beside them.
[6] Transformer Engine, ``transformer_engine/pytorch/module/linear.py`` (``_Linear.forward``,
    TE 1.x as in NeMo 24.07): under FP8 (unless the recipe overrides the weight-gradient
    GEMM's precision) a linear layer saves for its backward the FP8 cast of its input
    (``saved_inputmat = inputmat`` after ``cast_to_fp8``, or its FP8 transpose), one byte
    per element, not the 16-bit input; ``LayerNormLinear`` likewise saves the FP8 norm
    output. The fused attention kernel still keeps its 16-bit output for its own backward.
[7] Megatron-Core ``transformer/moe/token_dispatcher.py`` (``MoEAlltoAllTokenDispatcher``:
    permute, all-to-all over EP, all-gather over the expert TP group, ..., reduce-scatter
    over it, all-to-all back) and ``extensions/transformer_engine.py``
    (``TEGroupedLinear``: built with no TP communication of its own, "explicitly handled
    by MoE token dispatcher"): the routed experts' first GEMM takes, and saves for its
    backward, the gathered tokens.
[8] Megatron-Core ``transformer/transformer_config.py`` (``TransformerConfig``:
    ``hidden_dropout: float = 0.1``, ``attention_dropout: float = 0.1``) and
    ``fusions/fused_bias_dropout.py`` (``_bias_dropout_add_func``: ``dropout(x + bias,
    p=prob)`` then the residual add, after the attention and after the MLP).
[9] PyTorch ``aten/src/ATen/native/Dropout.cpp``: ``dropout`` runs the fused
    ``native_dropout`` (which returns the mask it keeps) only for ``0 < p < 1``;
    ``_dropout_impl`` returns its input unchanged at ``p == 0``: no mask is kept for the
    backward. Megatron-Core's fused bias-dropout-add is compiled by its ``jit_fuser``
    (``megatron/core/jit.py``): ``torch.compile`` from PyTorch 2.2, whose decomposition of
    dropout likewise skips it at ``p = 0`` (and keeps a mask at ``p = 1``); before 2.2,
    ``torch.jit.script``, whose autodiff keeps a mask at any ``p``, 0 included: the model
    follows PyTorch 2.2 and later (NeMo 24.07's stack and since). Recent recipes train
    without dropout:
    Megatron-LM's ``examples/mixtral/train_mixtral_8x7b_distributed.sh`` passes
    ``--attention-dropout 0.0 --hidden-dropout 0.0``.
[10] Megatron-Core ``transformer/transformer_layer.py`` and ``transformer/moe/experts.py``
    (``recompute_modules`` "layernorm" and "moe_act", and ``transformer/multi_latent_attention.py``
    for "mla_up_proj", output-discarding checkpoints:
    ``CheckpointWithoutOutput``, whose output's storage ``discard_output_and_register_recompute``
    frees once the next module has run, restored before its backward; under FP8 the next
    linear layers keep their 16-bit input, ``set_save_original_input``, which is the
    discarded one): see [47] of ``solver.physics.megatron``.
[11] Megatron-Core ``transformer/moe/shared_experts.py`` (``SharedExpertMLP`` under
    ``moe_shared_expert_overlap``: "disable TP related AG/RS communications in the linear
    module", ``linear.parallel_mode = None``; ``pre_forward_comm`` all-gathers the input,
    ``gather_from_sequence_parallel_region``, before ``linear_fc1``, which then keeps that
    whole tensor for its weight gradient as any linear layer without a parallel mode keeps
    its input; under FP8 Transformer Engine keeps its FP8 cast, but its original input
    where ``set_save_original_input`` applies, every recipe but delayed scaling, from
    Transformer Engine 2.6 (FP4 from 2.7; before, the FP8 cast under every recipe, which
    the model does not price)): see [49]
    of ``solver.physics.megatron``.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "WEIGHT_BYTES",
    "MAIN_GRAD_BYTES",
    "ADAM_STATE_BYTES",
    "model_state",
    "state_bytes",
    "layer_activation_bytes",
    "in_flight_layers",
    "logits_bytes",
    "keeps_mask",
]

#: 16-bit weights [B per parameter]. FP8 training keeps them, and the model counts no
#: persistent FP8 copy beside them. Megatron-Core's TE layers can cache each linear
#: weight's FP8 cast and its transpose across microbatches (``is_first_microbatch``,
#: on unless ``disable_parameter_transpose_cache``), 2 B more per linear-layer parameter,
#: but the published FP8 runs that ran would not fit with it: NEMO2407's Llama 3 8B on 8
#: H100s (TP 1) is at 91.4 % of the device's memory without it and would be at about
#: 108 %, its Nemotron-4 340B on 128 (94.0 %) at about 106 %, NEMOLS's Llama 2 7B on 4
#: (90.6 %) at about 106 % (benchmarks/results/fidelity.json, ``memory``; the first two
#: without dropout masks, as their configs train, since 2026-12-05: 92.7 % and 96.3 %
#: with them). Which of the
#: stack's settings made room for them (FP8 parameters, the cache off) is not known.
WEIGHT_BYTES = 2.0
#: FP32 main gradients of Megatron-Core's DDP buffer [B per parameter] [2].
MAIN_GRAD_BYTES = 4.0
#: FP32 master weights + Adam m + v [B per parameter] [2].
ADAM_STATE_BYTES = 12.0


def model_state(parameters, *, shard_group, zero_stage, grad_bytes=MAIN_GRAD_BYTES):
    """Weights, gradients and optimizer state of one accelerator [B].

    Parameters
    ----------
    parameters : array_like [1]
        Parameters held by the rank's model-parallel shard (after TP, PP, EP).
    shard_group : array_like [1]
        Ranks the distributed optimizer shards over (DP x CP).
    zero_stage : array_like of int
        0 none, 1 distributed optimizer (optimizer state sharded), 2 + gradients,
        3 + weights (FSDP).
    grad_bytes : array_like [B per parameter]
        Bytes of the DDP gradient buffer: 4 (FP32 main gradients; BF16 and FP8
        training), 2 (FP16 training, which reduces FP16 gradients [2]); with 2,
        the optimizer also keeps an FP32 copy of the gradients (4 + 16 / d bytes
        per parameter with the distributed optimizer, 20 without [2]).

    Returns
    -------
    tuple of numpy.ndarray [B]
        (weights, gradients, optimizer_state).
    """
    p = np.asarray(parameters, dtype=np.float64)
    weights, gradients, optimizer, _ = state_bytes(shard_group, zero_stage, grad_bytes)
    return weights * p, gradients * p, optimizer * p


def state_bytes(shard_group, zero_stage, grad_bytes=MAIN_GRAD_BYTES, adam_bytes=ADAM_STATE_BYTES,
                copy=None):
    """(weights, gradients, optimizer state, step copies) a parameter [B]: the factors of
    :func:`model_state`, and the FP32 copies the optimizer step holds (in the optimizer
    state), which exist only in the step, once the activations are freed [5], so a footprint
    counts the larger of the two. ``adam_bytes``: the master weights and the two moments a
    parameter (Adam's FP32 12 by default; less under a precision-aware optimizer);
    ``copy``: the step's copies a parameter, by default Adam's FP32 copy of 16-bit gradients
    (4 where ``grad_bytes`` is under 4; 0 for FP32 main gradients, their own copy)."""
    z = np.asarray(zero_stage)
    d = np.asarray(shard_group, dtype=np.float64)
    g = np.asarray(grad_bytes, dtype=np.float64)
    if copy is None:
        copy = np.where(g < MAIN_GRAD_BYTES, MAIN_GRAD_BYTES, 0.0)
    # [2]: 2 + 4 + 12/d bytes per parameter with the distributed optimizer; [3] for 2, 3.
    # (times 1 / d: the fused kernel's loop makes one division, not four)
    per = 1.0 / d
    sharded = np.where(z >= 1, per, 1.0)
    return (WEIGHT_BYTES * np.where(z >= 3, per, 1.0), g * np.where(z >= 2, per, 1.0),
            (adam_bytes + copy) * sharded, copy * sharded)


def layer_activation_bytes(micro_batch, seq_len, hidden, *, heads, kv_heads, ffn_hidden, gated,
                           tp_size, sequence_parallel, recompute_code, flash_attention,
                           moe_top_k=0.0, moe_ffn_hidden=0.0, low_bits=False,
                           attention_bytes=None, latent_bytes=0.0, context_ratio=1.0,
                           routed_gather=1.0, hidden_dropout=0.1, attention_dropout=0.1,
                           discarded_norms=0.0, discarded_act=0.0, discarded_attn=0.0,
                           whole_input=0.0):
    """Bytes one layer stores for the backward pass of one microbatch, on one rank [B].

    Parameters
    ----------
    micro_batch : array_like [1]
        Sequences b.
    seq_len : array_like [1]
        Tokens per sequence on this rank s (divide by CP first).
    hidden, heads, kv_heads, ffn_hidden : array_like [1]
        Model shape (whole, not divided by TP).
    gated : bool
    tp_size : array_like [1]
    sequence_parallel : array_like of bool
    recompute_code : array_like of int
        0 none, 1 selective (attention core), 2 full (layer input only).
    flash_attention : array_like of bool
        A fused attention kernel stores no s x s scores (the scores' term, 5 a s / h, or
        2 a s / h without the attention dropout).
    moe_top_k, moe_ffn_hidden : array_like [1]
        MoE layer: routed experts per token and expert width (0 for a dense layer).
    low_bits : array_like of bool
        FP8 (or FP4) GEMMs: each linear layer keeps its input in one byte [6].
    attention_bytes : array_like [1], optional
        Bytes per token over h of Q, K, V and the output projection's input, before
        the TP split (default ``4 + 4 kv/a``, [1]'s 8 at ``kv = a``, heads ``h/a`` wide).
    latent_bytes : array_like [1]
        Bytes per token over h a multi-head latent attention keeps of its latents,
        replicated over TP unless SP splits them (0 for other attention).
    context_ratio : array_like [1]
        The output projection's input width over h (1 with heads ``h/a`` wide).
    routed_gather : array_like [1]
        The routed copies an expert rank keeps, over ``moe_top_k`` copies of the layer's
        tokens: ``etp / tp``, its expert TP group's SP slices gathered (1 where the experts'
        TP is the layer's).
    hidden_dropout, attention_dropout : array_like [1]
        Dropout probabilities (Megatron-Core's ``hidden_dropout`` and ``attention_dropout``,
        0.1 by default [8]). A dropout keeps a one-byte mask for its backward only where
        ``p > 0``: PyTorch's dropout returns its input at ``p = 0`` [9]. So at
        ``hidden_dropout = 0`` the two masks of the layer's bias-dropout-adds (after the
        attention and after the MLP, ``s b h`` each: 2 of [1]'s 10) are not stored, and at
        ``attention_dropout = 0`` an unfused attention keeps its softmax output alone (2 of
        [1]'s ``5 a s / h``: no mask, no dropped copy). A fused attention keeps no mask
        either way (its RNG state only).
    discarded_norms, discarded_act, discarded_attn : array_like [1]
        What selective recompute's output-discarding modules free [10], bytes per token over
        h: the outputs of the norms that are modules of their own (``layernorm``;
        replicated over TP unless SP splits them), the routed experts' activation output,
        the second GEMM's input (``moe_act``; split by TP as the experts' intermediates), and
        a multi-head latent attention's Q, K and V (``mla_up_proj``; of ``attention_bytes``,
        split by TP with the heads). 0.0 by default.
    whole_input : array_like [1]
        Bytes per token over h a layer keeps whole on every TP rank, beyond the rest: an MoE
        layer's shared-expert input, all-gathered over TP (SP) outside its first GEMM under
        Megatron-Core's ``moe_shared_expert_overlap`` and kept by it for its weight
        gradient [11]. 0.0 by default.

    Returns
    -------
    numpy.ndarray [B]
    """
    b, s, h = micro_batch, np.asarray(seq_len, dtype=np.float64), hidden
    t = np.asarray(tp_size, dtype=np.float64)
    sp = np.asarray(sequence_parallel)
    sbh = b * s * h
    # FP8 [6]: the inputs of QKV and of the first MLP GEMM (the norm outputs; in an MoE
    # layer the router's input stays 16-bit and the routed copies are counted below) and
    # of the second MLP GEMM are kept in one byte, not two. The output projection's input is kept in one byte too,
    # where an unfused attention kept it in two for that GEMM alone; beside a fused
    # attention, which keeps its 16-bit output itself for its backward, the FP8 copy is one
    # byte more. Under selective recompute the fused attention runs inside the checkpoint
    # and keeps nothing of its own (its output is recomputed), so there too one byte, not two.
    # (Taken off the numerators below: no division of its own, the same bits without FP8.)
    low = np.asarray(low_bits)
    moe = np.asarray(moe_top_k) > 0
    fp8_replicated = np.where(low, np.where(moe, 1.0, 2.0), 0.0)
    mlp_width = np.where(moe_top_k > 0, moe_top_k * moe_ffn_hidden, ffn_hidden)
    keeps_output = np.asarray(flash_attention) & (np.asarray(recompute_code) == 0)
    fp8_split = np.where(low, mlp_width / h + np.where(keeps_output, -1.0, 1.0)
                         * context_ratio, 0.0)
    # Table 2 of [1]: s b h (10 + 24/t + 5 a s/(h t)); the 10 (norm inputs, dropout
    # masks, residuals) is replicated on every TP rank unless SP splits it too. Its two
    # one-byte hidden-dropout masks are kept only where the dropout runs [9].
    masks = 2.0 * keeps_mask(hidden_dropout)
    replicated = (8.0 + masks - fp8_replicated + latent_bytes - discarded_norms) / np.where(sp, t, 1.0)
    # The 24/t of [1] is 8/t attention (Q, K, V, context) + 16/t MLP (fc1 out, GELU out),
    # at kv = a and f = 4h; generalized: Q and context 2 + 2, K and V 2 kv/a each,
    # MLP 2 bytes per element of its (2 or 3 matrix) intermediates.
    attention = ((4.0 + 4.0 * kv_heads / heads if attention_bytes is None else attention_bytes)
                 - discarded_attn) / t
    mlp = ((4.0 + 2.0 * np.asarray(gated, dtype=np.float64)) * mlp_width / h - fp8_split
           - discarded_act) / t
    # Routed tokens are permuted copies of the MLP input (2 bytes per element per expert;
    # 1 under FP8). With TP the dispatcher all-gathers them over the expert TP group
    # before the experts' first GEMM, which keeps its input whole on every rank of it [7]:
    # not divided by TP, with or without SP (etp / tp of the layer's tokens: routed_gather).
    mlp = mlp + np.asarray(moe_top_k) * routed_gather * np.where(low, 1.0, 2.0)
    # Sec. 4.1 of [1]: 5 a s / h for the softmax output (2), the dropout mask (1) and
    # its output (2); without the attention dropout [9], the softmax output alone.
    score_bytes = 2.0 + 3.0 * keeps_mask(attention_dropout)
    scores = np.where(np.asarray(flash_attention) | (np.asarray(recompute_code) >= 1), 0.0,
                      score_bytes * heads * s / (h * t))
    per_layer = sbh * (replicated + attention + mlp + scores)
    if np.any(np.asarray(whole_input) != 0):
        per_layer = per_layer + sbh * whole_input
    # Table 2 of [1]: full recomputation keeps the layer input, 2 s b h (/t with SP).
    full = 2.0 * sbh / np.where(sp, t, 1.0)
    return np.where(np.asarray(recompute_code) == 2, full, per_layer)


def recompute_working_bytes(stored, micro_batch, seq_len, hidden, *, recompute_code,
                            discarded_norms=0.0, discarded_act=0.0, discarded_attn=0.0,
                            restored_norms=None, restored_act=None, **shape):
    """Bytes a recomputed layer holds beyond its checkpoint while its backward runs [B]:
    the backward first runs the layer's forward again (the whole layer under full
    recompute, the attention core under selective, the discarded outputs of selective
    recompute's other modules [10]) and keeps what that forward stores for one microbatch,
    beside the stored checkpoints. That is what the layer stores without recompute, less
    ``stored`` (:func:`layer_activation_bytes` of the same arguments at ``recompute_code``);
    0.0 without recompute. ``shape``: the keywords of :func:`layer_activation_bytes` but
    ``recompute_code`` and the discarded bytes. ``restored_norms``, ``restored_act``: what
    the output-discarding recompute restores, where more than it discarded (the 16-bit
    tensor, where under FP8 the layer without it had kept a one-byte copy [10]); by
    default the discarded bytes.

    Korthikanti et al. count the stored bytes only [1]; Megatron-Core's checkpointed
    forward (``tensor_parallel.checkpoint``) allocates the recomputed activations in the
    backward, one layer at a time.
    """
    whole = layer_activation_bytes(micro_batch, seq_len, hidden, recompute_code=0, **shape)
    # (Q, K and V are 16-bit either way: the recompute restores what it discarded)
    none = ((np.asarray(recompute_code) == 0) & (np.asarray(discarded_norms) == 0)
            & (np.asarray(discarded_act) == 0) & (np.asarray(discarded_attn) == 0))
    work = whole - stored
    if restored_norms is not None:
        t = np.asarray(shape["tp_size"], dtype=np.float64)
        sbh = micro_batch * np.asarray(seq_len, dtype=np.float64) * hidden
        work = work + sbh * ((restored_norms - discarded_norms)
                             / np.where(np.asarray(shape["sequence_parallel"]), t, 1.0)
                             + (restored_act - discarded_act) / t)
    return np.where(none, 0.0, work)


def keeps_mask(p):
    """1.0 where a dropout of probability ``p`` keeps a mask for its backward, else 0.0:
    ``p > 0`` [9] (at ``p = 1``, which trains nothing, ``torch.compile``'s fused dropout
    still keeps one)."""
    return (np.asarray(p, dtype=np.float64) > 0.0).astype(np.float64)


def in_flight_layers(layers_per_stage, pp_size, v_stages, microbatches, rank=0):
    """Layer-microbatches whose activations pipeline rank ``rank`` holds at its peak [1] [4].

    Parameters
    ----------
    layers_per_stage : array_like [1]
        Layers of one physical stage (all its virtual chunks).
    pp_size, v_stages, microbatches : array_like [1]
    rank : array_like [1]
        The stage's pipeline rank, 0 the first.

    Returns
    -------
    numpy.ndarray [1]
        ``layers_per_stage * min(p - r, m)`` for 1F1B; for v > 1,
        ``layers_per_stage / v * min(p v + p - 1 - 2 r, m v)`` [4], i.e.
        L (1 + (p-1)/(p v)) on the first stage [1].
    """
    p = np.asarray(pp_size, dtype=np.float64)
    v = np.asarray(v_stages, dtype=np.float64)
    m = np.asarray(microbatches, dtype=np.float64)
    r = np.asarray(rank, dtype=np.float64)
    # [4]: warm-up + 1 microbatches (chunks) in flight on rank r, at most all of them.
    chunks = np.where(v > 1, p * v + p - 1 - 2.0 * r, p - r)
    return layers_per_stage / v * np.minimum(chunks, m * v)


def logits_bytes(micro_batch, seq_len, vocab, *, tp_size):
    """FP32 logits (and their gradient buffer) of one microbatch on the last stage [B]."""
    # 4 bytes per vocabulary entry per token, vocabulary split by TP [1] (Sec. 4.1, output layer).
    return 4.0 * micro_batch * np.asarray(seq_len, dtype=np.float64) * vocab / tp_size


def head_input_bytes(micro_batch, seq_len, hidden, *, norm_split):
    """The 16-bit inputs the final norm and the output layer keep for their backward, one
    microbatch on the last stage [B]: the last layer's output (the norm's input) and the
    norm's output (the output layer's, kept as its sequence-parallel slice and gathered
    again in the backward under SP), 2 bytes an element each, split by TP under SP
    (``norm_split``). FP8 does not reach the output layer."""
    return 4.0 * micro_batch * np.asarray(seq_len, dtype=np.float64) * hidden / norm_split
