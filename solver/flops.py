"""Floating-point operations of a transformer, GEMM by GEMM.

Arrays in, arrays out. Counts are per layer and per *forward* pass of the
tokens given (a multiply-add is 2 FLOPs); the backward pass costs twice the
forward GEMMs (gradient w.r.t. inputs and w.r.t. weights). Every function
takes the local shape after a split: pass ``tokens = micro_batch * seq_len /
cp_size`` and widths divided by ``tp_size`` to get the work of one rank.

References
----------
[1] Narayanan, D. et al. (2021), "Efficient large-scale language model training
    on GPU clusters using Megatron-LM", SC21, arXiv:2104.04473 (Sec. 5.1, eq. 3).
[2] Korthikanti, V. et al. (2023), "Reducing activation recomputation in large
    transformer models", MLSys, arXiv:2205.05198 (Sec. 6, model and hardware FLOPs).
[3] Megatron-LM, ``megatron/training/training.py``,
    ``num_floating_point_operations`` (the count behind its printed TFLOP/s).
[4] Kaplan, J. et al. (2020), "Scaling laws for neural language models",
    arXiv:2001.08361 (C = 6 N tokens).
[5] Dao, T. (2023), "FlashAttention-2", arXiv:2307.08691 (causal blocks skipped).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "qkv_flops",
    "attention_output_flops",
    "attention_core_flops",
    "mlp_flops",
    "router_flops",
    "logits_flops",
    "dense_layer_flops",
    "six_n_flops",
    "narayanan_eq3_flops",
    "korthikanti_flops",
    "megatron_model_flops",
]


def qkv_flops(tokens, hidden, *, heads, kv_heads, head_dim):
    """Forward FLOPs of the fused Q, K, V projection.

    Parameters
    ----------
    tokens : array_like [1]
        Tokens the rank processes (micro_batch * seq_len / cp).
    hidden : array_like [1]
        Model width h (input of the projection).
    heads, kv_heads : array_like [1]
        Query heads and key/value heads *on this rank* (divide by TP first).
    head_dim : array_like [1]

    Returns
    -------
    numpy.ndarray [FLOP]
    """
    # Q: h -> heads*d; K and V: h -> kv_heads*d each (GQA); 2 FLOPs per MAC.
    return 2.0 * tokens * hidden * (np.asarray(heads) + 2.0 * kv_heads) * head_dim


def attention_output_flops(tokens, hidden, *, heads, head_dim):
    """Forward FLOPs of the attention output projection (heads*d -> h) [FLOP]."""
    return 2.0 * tokens * np.asarray(heads) * head_dim * hidden


def attention_core_flops(micro_batch, query_len, key_len, *, heads, head_dim, causal_fraction=1.0):
    """Forward FLOPs of Q K^T and of the attention-weighted sum of V.

    Parameters
    ----------
    micro_batch : array_like [1]
        Sequences in the microbatch.
    query_len, key_len : array_like [1]
        Query positions on this rank (s / cp) and keys they attend to (s).
    heads, head_dim : array_like [1]
        Heads on this rank and their width.
    causal_fraction : array_like [1]
        Share of the score matrix computed: 1 for a dense (masked) softmax as
        Megatron counts it [3], 1/2 for a causal kernel that skips masked
        blocks [5].

    Returns
    -------
    numpy.ndarray [FLOP]
    """
    # Two batched GEMMs, each 2 * b * heads * s_q * s_k * d.
    return 4.0 * micro_batch * heads * np.asarray(query_len) * key_len * head_dim * causal_fraction


def mlp_flops(tokens, hidden, ffn_hidden, *, gated):
    """Forward FLOPs of one MLP (or one expert): 2 matrices, or 3 when gated (SwiGLU).

    Parameters
    ----------
    tokens : array_like [1]
    hidden : array_like [1]
    ffn_hidden : array_like [1]
        Width of the MLP on this rank (divide by TP first).
    gated : array_like of bool

    Returns
    -------
    numpy.ndarray [FLOP]
    """
    matrices = 2.0 + np.asarray(gated, dtype=np.float64)
    return 2.0 * matrices * tokens * hidden * ffn_hidden


def router_flops(tokens, hidden, experts):
    """Forward FLOPs of the MoE router (h -> experts logits) [FLOP]."""
    return 2.0 * tokens * hidden * np.asarray(experts)


def logits_flops(tokens, hidden, vocab):
    """Forward FLOPs of the LM head (h -> vocabulary; ``vocab`` on this rank) [FLOP]."""
    return 2.0 * tokens * hidden * np.asarray(vocab)


def dense_layer_flops(tokens, seq_len, hidden, *, heads, kv_heads, head_dim, ffn_hidden,
                      gated, micro_batch=None, causal_fraction=1.0):
    """Forward FLOPs of one dense transformer layer on ``tokens`` tokens [FLOP].

    ``micro_batch`` defaults to ``tokens / seq_len`` (whole sequences).
    """
    b = tokens / seq_len if micro_batch is None else micro_batch
    return (qkv_flops(tokens, hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
            + attention_core_flops(b, seq_len, seq_len, heads=heads, head_dim=head_dim,
                                   causal_fraction=causal_fraction)
            + attention_output_flops(tokens, hidden, heads=heads, head_dim=head_dim)
            + mlp_flops(tokens, hidden, ffn_hidden, gated=gated))


def six_n_flops(parameters, tokens):
    """Training FLOPs of the 6 N D rule, for a model without a stated shape [FLOP].

    Parameters
    ----------
    parameters : array_like [1]
        (Active) parameters N.
    tokens : array_like [1]
        Tokens trained D.
    """
    # Eq. (2.1) of [4]: C = 6 N D (forward 2 N D, backward 4 N D).
    return 6.0 * np.asarray(parameters) * tokens


def narayanan_eq3_flops(batch, seq_len, layers, hidden, vocab):
    """FLOPs of one iteration as Narayanan et al. count them, recompute forward included [FLOP].

    GPT with a 4h GELU MLP and full activation recomputation (4 forward passes'
    worth of work: 1 forward, 2 backward, 1 recompute).
    """
    B, s, l, h, V = (np.asarray(x, dtype=np.float64) for x in (batch, seq_len, layers, hidden, vocab))
    # Eq. (3) of [1]: F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))
    return 96.0 * B * s * l * h ** 2 * (1.0 + s / (6.0 * h) + V / (16.0 * l * h))


def korthikanti_flops(batch, seq_len, layers, hidden, vocab, *, recompute="none"):
    """Model or hardware FLOPs of one iteration as Korthikanti et al. count them [FLOP].

    ``recompute="none"`` gives the model FLOPs (72 B s l h^2 (1 + s/6h + V/12lh)),
    ``"selective"`` adds the recomputed attention core, ``"full"`` the whole
    recomputed forward (eq. 3 of Narayanan et al., 96 B s l h^2 ...).
    """
    B, s, l, h, V = (np.asarray(x, dtype=np.float64) for x in (batch, seq_len, layers, hidden, vocab))
    # Sec. 6 of [2]: model FLOPs = 72 B s l h^2 (1 + s/(6h) + V/(12 l h))
    model = 72.0 * B * s * l * h ** 2 * (1.0 + s / (6.0 * h) + V / (12.0 * l * h))
    if recompute == "none":
        return model
    if recompute == "selective":
        # Sec. 6 of [2]: + the recomputed Q K^T and attention over V, 4 B s^2 h per layer.
        return model + 4.0 * B * s ** 2 * h * l
    if recompute == "full":
        # Eq. (3) of [1] (the LM head is not recomputed: V/(16lh) with 96).
        return narayanan_eq3_flops(batch, seq_len, layers, hidden, vocab)
    raise ValueError(f"recompute must be 'none', 'selective' or 'full', but got {recompute!r}")


def megatron_model_flops(batch, seq_len, layers, hidden, *, heads, kv_heads, ffn_hidden, vocab,
                         gated=False, experts_per_token=1, shared_ffn_hidden=0, head_dim=None,
                         attention_params=None, core_head_dim=None):
    """Model FLOPs of one iteration as Megatron-LM prints them (dense attention, no recompute) [FLOP].

    Parameters
    ----------
    batch, seq_len, layers, hidden : array_like [1]
    heads, kv_heads : array_like [1]
    ffn_hidden : array_like [1]
        MLP width (of one routed expert for MoE).
    vocab : array_like [1]
    gated : bool
    experts_per_token : array_like [1]
        Routed experts per token (1 for a dense model).
    shared_ffn_hidden : array_like [1]
        Total width of shared experts (0 if none).
    head_dim : array_like [1], optional
        Default hidden / heads.
    attention_params, core_head_dim : array_like [1], optional
        Multi-head latent attention: the weights of a layer's attention projections
        (down and up, their norms, the output) and the mean of its core's key and value
        widths. Its projections then count 6 FLOPs per weight and token, and its core the
        whole ``s x s`` as the other attention's does here (Megatron-LM's count of MLA [3]
        halves it for the causal mask, as its later versions do for every attention).
    """
    B, s, l, h = (np.asarray(x, dtype=np.float64) for x in (batch, seq_len, layers, hidden))
    d = h / heads if head_dim is None else np.asarray(head_dim, dtype=np.float64)
    q_ratio = heads * d / h
    gate = 1.5 if gated else 1.0
    # [3]: 12 B s l h^2 * [ (1 + g/a + s/h) * q_ratio + (f/h) * k * gate + V/(2 l h) ], times
    # 3 * 2 * 2 = 12 for forward + backward, 2 FLOPs per MAC and 2 GEMMs each in attention.
    if attention_params is None:
        attention = (1.0 + kv_heads / heads + s / h) * q_ratio
    else:
        attention = attention_params / (2.0 * h * h) + s * heads * core_head_dim / (h * h)
    return 12.0 * B * s * l * h ** 2 * (
        attention
        + (ffn_hidden / h) * experts_per_token * gate
        + (shared_ffn_hidden / h) * gate
        + vocab / (2.0 * l * h))
