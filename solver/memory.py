"""Per-accelerator training memory: model state, ZeRO sharding, activations, buffers.

References
----------
[1] Rajbhandari, S. et al. (2020), "ZeRO: memory optimizations toward training
    trillion parameter models", SC.
[2] Korthikanti, V. et al. (2023), "Reducing activation recomputation in large
    transformer models", MLSys.
[3] Shoeybi, M. et al. (2019), "Megatron-LM", arXiv:1909.08053.
[4] mlsysim 0.3.0, ``TrainingMemoryModel`` (engine/solvers/training.py) and
    ``calc_activation_memory`` (physics/memory.py), reproduced term by term.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "ADAM_OPTIMIZER_BYTES",
    "COMMUNICATION_BUFFER_FRACTION",
    "LORA_RANK",
    "model_state",
    "activation_memory",
    "pipeline_buffer",
    "lora_trainable_fraction",
    "stored_microbatch",
]

#: Adam's FP32 master weights and two moments [B per trainable parameter].
ADAM_OPTIMIZER_BYTES = 12.0
#: Gradient bucket the DP all-reduce drains from, as a share of the gradients.
COMMUNICATION_BUFFER_FRACTION = 0.05
#: LoRA rank used to size the trainable fraction.
LORA_RANK = 16
#: Korthikanti et al. bytes per token per hidden unit per layer at FP16 [B]:
#: selective recomputation keeps 34, full recomputation keeps the layer input (2).
_SELECTIVE_BYTES = 34
_FULL_RECOMPUTE_BYTES = 2


def lora_trainable_fraction(parameters, *, hidden_dim, layers, rank=LORA_RANK):
    """Share of parameters a LoRA adapter trains (Q, K, V, O of every layer).

    Parameters
    ----------
    parameters : float [1]
    hidden_dim, layers : int
    rank : int

    Returns
    -------
    float [1]
        ``min(2 * rank * hidden_dim * 4 * layers / parameters, 1)``.
    """
    return min(2 * rank * hidden_dim * 4 * layers / parameters, 1.0)


def model_state(parameters, *, precision_bytes, model_parallel, dp_size, zero_stage,
                trainable_fraction=1.0):
    """Weights, gradients and optimizer state held by one accelerator.

    Parameters
    ----------
    parameters : float [1]
        Total parameters of the model.
    precision_bytes : array_like [B]
        Bytes per weight and per gradient element.
    model_parallel : array_like of int [1]
        TP * PP * EP: the shards the state is split into first.
    dp_size : array_like of int [1]
        Data-parallel ranks ZeRO shards over.
    zero_stage : array_like of int
        0-3; stage k shards optimizer state (>=1), gradients (>=2), weights (>=3).
    trainable_fraction : array_like [1]

    Returns
    -------
    tuple of numpy.ndarray [B]
        (weights, gradients, optimizer_state).
    """
    params_per_rank = parameters / np.asarray(model_parallel)
    trainable_per_rank = params_per_rank * trainable_fraction
    weights = params_per_rank * precision_bytes
    gradients = trainable_per_rank * precision_bytes
    optimizer = trainable_per_rank * ADAM_OPTIMIZER_BYTES
    zero_stage = np.asarray(zero_stage)
    # Sec. 5 of [1]: P_os (stage 1), P_os+g (stage 2), P_os+g+p (stage 3). The
    # divisor is dp_size where the stage shards the term, else exactly 1.
    spread = np.asarray(dp_size) - 1
    optimizer = optimizer / (1 + (zero_stage >= 1) * spread)
    gradients = gradients / (1 + (zero_stage >= 2) * spread)
    weights = weights / (1 + (zero_stage >= 3) * spread)
    return weights, gradients, optimizer


def stored_microbatch(local_batch, accumulation_divisor):
    """Samples whose activations one rank holds at once: ``max(1, ceil(b / k))``.

    Parameters
    ----------
    local_batch : array_like of int [1]
        Samples per data-parallel rank per step.
    accumulation_divisor : array_like of int [1]
        Gradient-accumulation steps times the 1F1B in-flight divisor.

    Returns
    -------
    numpy.ndarray [1]
        Whole numbers (as float64: exact below 2**53, as the knobs are).
    """
    return np.maximum(1.0, np.ceil(np.asarray(local_batch) / accumulation_divisor))


def activation_memory(layers, seq_len, microbatch, hidden_dim, *, precision_bytes,
                      full_recomputation, tp_size):
    """Stored activations of one pipeline stage.

    Parameters
    ----------
    layers : array_like of int [1]
        Layers of the stage.
    seq_len : array_like of int [1]
    microbatch : array_like of int [1]
        Samples held at once.
    hidden_dim : int [1]
    precision_bytes : array_like [B]
    full_recomputation : array_like of bool
        True keeps only layer inputs; False is selective recomputation.
    tp_size : array_like of int [1]
        With sequence parallelism every stored activation is split over TP.

    Returns
    -------
    numpy.ndarray [B]
    """
    bytes_per_token = _SELECTIVE_BYTES - (_SELECTIVE_BYTES - _FULL_RECOMPUTE_BYTES) * np.asarray(
        full_recomputation, dtype=np.int64)
    tokens = np.asarray(seq_len, dtype=np.float64) * microbatch
    # Sec. 4.1 of [2]: s*b*h*34 (selective) or s*b*h*2 (full), FP16 constants
    # scaled by precision_bytes / 2.
    per_layer = bytes_per_token * tokens * hidden_dim * (np.asarray(precision_bytes) / 2)
    stage = layers * per_layer
    # Table 2 of [2]: sequence parallelism divides every stored activation by t
    # (t = 1 divides by 1).
    return stage / tp_size


def pipeline_buffer(seq_len, microbatch, hidden_dim, *, precision_bytes, pp_size):
    """Send and receive buffers at a pipeline stage boundary.

    Parameters
    ----------
    seq_len, microbatch : array_like of int [1]
    hidden_dim : int [1]
    precision_bytes : array_like [B]
    pp_size : array_like of int [1]

    Returns
    -------
    numpy.ndarray [B]
        ``2 * b * s * h * bytes`` with a pipeline, else 0.
    """
    buffer = 2 * (np.asarray(microbatch, dtype=np.float64) * seq_len) * hidden_dim * precision_bytes
    return buffer * (np.asarray(pp_size) > 1)
