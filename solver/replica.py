"""Formulas of one model-parallel replica's training step: FLOPs, roofline, taxes, memory, energy.

A replica is the TP x PP x EP group of accelerators that holds one copy of the
model and processes ``local_batch`` samples per step. Two paths, as in the
reference:

- the sharded path (transformers, or any workload split over more than one
  accelerator): step FLOPs shared over the replica, the sharded training
  memory model, offload to the host link when the state does not fit;
- the single-accelerator path the reference hands to ``Engine.solve``
  (non-transformers with TP = PP = EP = 1), which also knows the on-chip SRAM
  and flash tiers and prices LoRA as 10 % of the weights.

References
----------
[1] Williams, S., Waterman, A. and Patterson, D. (2009), "Roofline: an
    insightful visual performance model", CACM 52(4).
[2] Chowdhery, A. et al. (2022), "PaLM", Appendix B (MFU and HFU).
[3] Barroso, L. and Hoelzle, U. (2007), "The case for energy-proportional
    computing", IEEE Computer 40(12).
[4] mlsysim 0.3.0: ``_replica_profile`` (engine/solvers/distributed.py),
    ``Engine.solve`` (engine/engine.py), ``Workload.lower`` (models/types.py).
"""

from __future__ import annotations

import numpy as np

from . import memory as mem
from .specs import Accelerator, Workload

__all__ = [
    "FRAMEWORK_LAYER_TAX",
    "FALLBACK_HOST_LINK_BANDWIDTH",
    "ENERGY_IDLE_FRACTION",
    "ENERGY_DYNAMIC_FRACTION",
    "forward_flops",
    "weight_bytes",
    "stored_bytes",
    "layer_count",
    "width",
    "pick",
    "step_flops",
    "compute_time",
    "sharded_memory",
    "single_accelerator_memory",
    "memory_time",
    "overhead_time",
    "roofline_latency",
    "utilization",
    "step_energy",
]

#: Framework launch overhead per layer per pass [s] (0.01 ms); training has 3 passes.
FRAMEWORK_LAYER_TAX = 0.01e-3
#: Host-link bandwidth assumed when an accelerator states none [B/s] (PCIe 5 x16).
FALLBACK_HOST_LINK_BANDWIDTH = 64e9
#: Energy-proportional power model: idle share and dynamic share of TDP.
ENERGY_IDLE_FRACTION = 0.30
ENERGY_DYNAMIC_FRACTION = 0.70
#: Share of the weights read again per sample (the reference's traffic heuristic).
_ACTIVATION_TRAFFIC_PER_SAMPLE = 0.1
#: LoRA footprint on the single-accelerator path, as a multiple of the weights.
_LORA_FOOTPRINT = 1.1


def forward_flops(workload: Workload) -> float:
    """Forward FLOPs per token (transformers) or per sample (others) [FLOP]."""
    w = workload
    if w.kind == "cnn":
        return w.inference_flops
    if w.kind == "generic" and w.parameters is None:
        return w.inference_flops or 0.0
    counted = w.active_parameters if w.kind == "moe" else w.parameters
    flops = w.inference_flops or 2 * counted
    if w.kind == "diffusion":
        flops = flops * w.denoising_steps
    return flops


def stored_bytes(workload: Workload, precision_bytes: float) -> float:
    """Model size at a precision [B]: the stated size at 2 bytes, else parameters x bytes."""
    w = workload
    if w.model_size is not None and precision_bytes == 2:
        return w.model_size
    if w.parameters is not None:
        return w.parameters * precision_bytes
    return w.model_size


def weight_bytes(workload: Workload, precision_bytes: float) -> float:
    """Weight bytes of the lowered graph [B] (a generic workload ignores a stated size)."""
    w = workload
    if w.kind == "generic":
        return w.model_size if w.parameters is None else w.parameters * precision_bytes
    return stored_bytes(w, precision_bytes)


def layer_count(workload: Workload) -> int:
    """Layers as the taxes and TP collectives count them (1 when unknown)."""
    return workload.layers or 1


def width(workload: Workload) -> int:
    """Hidden width of activations (4096 when unknown, the reference's default)."""
    return workload.hidden_dim or 4096


def pick(mask, a, b):
    """``np.where(mask, a, b)`` for finite ``a`` and ``b``, exactly, as arithmetic.

    One of the two products is exactly 0, so the sum is exactly ``a`` or ``b``;
    unlike ``np.where`` it costs no branch per element, which matters when the
    mask is random (a batch of trials).
    """
    mask = np.asarray(mask)
    return mask * a + ~mask * b


def _host_link(acc: Accelerator) -> float:
    return acc.host_link_bandwidth or FALLBACK_HOST_LINK_BANDWIDTH


def step_flops(workload: Workload, *, seq_len, local_batch, activation_recomputation):
    """Model and hardware FLOPs of one replica's training step.

    Parameters
    ----------
    workload : Workload
    seq_len : array_like of int [1]
        Tokens per sample (transformers; other workloads count samples).
    local_batch : array_like of int [1]
        Samples per replica per step.
    activation_recomputation : array_like of bool
        Full recomputation runs the forward pass a second time.

    Returns
    -------
    tuple of numpy.ndarray [FLOP]
        ``(model_ops, hardware_ops)``: 3x the forward FLOPs (forward and
        backward), and what the silicon runs (4x with recomputation).
    """
    tokens = seq_len if workload.is_transformer else 1
    sample_ops = forward_flops(workload) * np.asarray(tokens, dtype=np.float64)
    model_ops = sample_ops * 3 * local_batch
    hardware_ops = sample_ops * (3.0 + np.asarray(activation_recomputation)) * local_batch
    return model_ops, hardware_ops


def compute_time(hardware_ops, *, peak_flops, efficiency, replica):
    """Compute time of a step whose FLOPs are shared over the replica [s].

    Parameters
    ----------
    hardware_ops : array_like [FLOP]
    peak_flops : array_like [FLOP/s]
        One accelerator's peak at the precision.
    efficiency : array_like [1]
        Achieved share of the peak.
    replica : array_like of int [1]
        Accelerators sharing the step.
    """
    effective_flops = peak_flops * efficiency
    return hardware_ops / (effective_flops * replica)


def sharded_memory(workload: Workload, *, local_batch, replica, dp_size, tp_size, pp_size,
                   seq_len, precision_bytes, zero_stage, is_lora, activation_recomputation,
                   microbatch_count, gradient_accumulation_steps):
    """Training memory of one accelerator of a sharded transformer replica [B].

    The reference's ``TrainingMemoryModel`` as ``_replica_profile`` calls it: the
    model state split over the replica and ZeRO-sharded over DP, the 1F1B
    activations of the first stage, the gradient bucket and pipeline buffers.

    Returns
    -------
    dict of numpy.ndarray [B]
        ``memory_footprint`` and its parts ``memory_weights``, ``memory_gradients``,
        ``memory_optimizer_state``, ``memory_activations``,
        ``memory_communication_buffers``.
    """
    trainable = 1.0
    if np.any(is_lora):
        fraction = mem.lora_trainable_fraction(
            workload.parameters, hidden_dim=width(workload), layers=workload.layers)
        trainable = np.where(is_lora, fraction, 1.0)
    # 1F1B: the first stage holds up to pp_size microbatches in flight.
    in_flight = 1 + (pp_size > 1) * (np.maximum(1, microbatch_count // pp_size) - 1)
    microbatch = mem.stored_microbatch(local_batch, gradient_accumulation_steps * 1.0 * in_flight)
    weights, gradients, optimizer = mem.model_state(
        workload.parameters, precision_bytes=precision_bytes, model_parallel=replica,
        dp_size=dp_size, zero_stage=zero_stage, trainable_fraction=trainable)
    layers_per_stage = -(-workload.layers // pp_size)
    activations = mem.activation_memory(
        layers_per_stage, seq_len, microbatch, width(workload),
        precision_bytes=precision_bytes, full_recomputation=activation_recomputation,
        tp_size=tp_size)
    buffers = gradients * mem.COMMUNICATION_BUFFER_FRACTION + mem.pipeline_buffer(
        seq_len, microbatch, width(workload), precision_bytes=precision_bytes, pp_size=pp_size)
    return _breakdown(weights, gradients, optimizer, activations, buffers,
                      weights + gradients + optimizer + activations + buffers)


def single_accelerator_memory(*, weights_total, precision_bytes, replica, is_lora):
    """Training memory of one accelerator on the reference's ``Engine.solve`` path [B].

    Weights, same-width gradients and Adam state, split over the replica;
    alone on one accelerator, LoRA is priced at 1.1x the weights. No
    activations or buffers are modeled.

    Parameters
    ----------
    weights_total : array_like [B]
        Weight bytes of the whole model (:func:`weight_bytes`).
    precision_bytes : array_like [B]
    replica : array_like of int [1]
    is_lora : array_like of bool

    Returns
    -------
    dict of numpy.ndarray [B]
        As :func:`sharded_memory`.
    """
    shard = weights_total / replica
    adam_total = (weights_total / precision_bytes) * mem.ADAM_OPTIMIZER_BYTES
    lora_alone = np.asarray(is_lora) & (np.asarray(replica) == 1)
    gradients = shard * ~lora_alone
    optimizer = np.where(lora_alone, (_LORA_FOOTPRINT - 1) * weights_total, adam_total / replica)
    none = shard * 0.0  # none modeled (zeros of the shard's shape)
    footprint = np.where(lora_alone, _LORA_FOOTPRINT * weights_total,
                         (weights_total * 2 + adam_total) / replica)
    return _breakdown(shard, gradients, optimizer, none, none, footprint)


def _breakdown(weights, gradients, optimizer, activations, buffers, footprint):
    return {"memory_footprint": footprint, "memory_weights": weights,
            "memory_gradients": gradients, "memory_optimizer_state": optimizer,
            "memory_activations": activations, "memory_communication_buffers": buffers}


def memory_time(workload: Workload, acc: Accelerator, *, weights_total, replica, local_batch,
                feasible):
    """Memory-traffic time of one replica's step [s].

    The weight shard is read once, and again a tenth per sample (the reference's
    traffic heuristic), from HBM, or over the host link when the state does not
    fit (offload). Points priced on one accelerator of a non-transformer use
    ``Engine.solve``'s tiers (on-chip SRAM when the weights fit it, else flash
    when stated, else HBM).

    Parameters
    ----------
    workload : Workload
    acc : Accelerator
    weights_total : array_like [B]
    replica, local_batch : array_like of int [1]
    feasible : array_like of bool
        The training state fits the accelerator.
    """
    offload_bandwidth = min(acc.memory_bandwidth, _host_link(acc))
    resident_bandwidth = acc.memory_bandwidth
    if not workload.is_transformer:
        tier = np.full(np.shape(weights_total), acc.memory_bandwidth)
        if acc.flash_bandwidth is not None:
            tier[...] = acc.flash_bandwidth
        if acc.sram_capacity is not None and acc.sram_bandwidth is not None:
            tier = np.where(weights_total <= acc.sram_capacity, acc.sram_bandwidth, tier)
        resident_bandwidth = np.where(np.asarray(replica) == 1, tier, acc.memory_bandwidth)
    bandwidth = pick(feasible, resident_bandwidth, offload_bandwidth)
    weight_shard = weights_total / replica
    traffic = weight_shard + weight_shard * _ACTIVATION_TRAFFIC_PER_SAMPLE * local_batch
    return traffic / bandwidth


def overhead_time(workload: Workload, acc: Accelerator) -> float:
    """Fixed taxes of a step [s]: launch dispatch and per-layer framework overhead (3 passes)."""
    return acc.dispatch_tax + layer_count(workload) * FRAMEWORK_LAYER_TAX * 3


def roofline_latency(compute, memory, overhead):
    """Eq. (1) of [1] plus fixed taxes: ``max(compute, memory) + overhead`` [s]."""
    return np.maximum(compute, memory) + overhead


def utilization(ops, latency, peak_flops):
    """Share of ``peak_flops`` that ``ops`` in ``latency`` reach, clipped to [0, 1] [1].

    App. B of [2]: MFU counts model FLOPs (3x forward), HFU what the silicon ran.
    """
    return np.clip(ops / latency / peak_flops, 0.0, 1.0)


def step_energy(acc: Accelerator, *, hfu, replica, latency):
    """Energy of one replica's step [J]; zeros when the accelerator states no TDP.

    [3]: power = TDP * (idle + dynamic * utilization), for every accelerator.
    """
    if acc.tdp is None:
        return latency * 0.0  # zeros of the latency's shape
    return acc.tdp * (ENERGY_IDLE_FRACTION + ENERGY_DYNAMIC_FRACTION * hfu) * replica * latency
