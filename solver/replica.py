"""One model-parallel replica's training step: roofline, taxes, memory, energy.

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
    "replica_step",
    "pick",
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


def replica_step(workload: Workload, acc: Accelerator, *, local_batch, replica, dp_size,
                 tp_size, pp_size, seq_len, precision_bytes, peak_flops, weights_total,
                 efficiency, zero_stage, is_lora, activation_recomputation,
                 microbatch_count, gradient_accumulation_steps):
    """Latency, utilization, memory and energy of one replica's step.

    Parameters
    ----------
    workload : Workload
    acc : Accelerator
    local_batch : array_like of int [1]
        Samples per replica per step.
    replica : array_like of int [1]
        Accelerators in the replica (TP * PP * EP).
    dp_size, tp_size, pp_size, seq_len, microbatch_count, gradient_accumulation_steps : array_like of int
    precision_bytes : array_like [B]
    peak_flops : array_like [FLOP/s]
        The accelerator's peak at the precision.
    weights_total : array_like [B]
        Weight bytes of the whole model at the precision (:func:`weight_bytes`).
    efficiency : array_like [1]
    zero_stage : array_like of int
    is_lora, activation_recomputation : array_like of bool

    Returns
    -------
    dict of numpy.ndarray
        ``latency``, ``latency_compute``, ``latency_memory``, ``latency_overhead`` [s],
        ``throughput`` [samples/s], ``mfu``, ``hfu`` [1], ``energy`` [J],
        ``memory_footprint`` and the ``memory_*`` breakdown [B], ``feasible``.
    """
    tokens = seq_len if workload.is_transformer else 1
    sample_ops = forward_flops(workload) * np.asarray(tokens, dtype=np.float64)
    model_ops = sample_ops * 3 * local_batch
    hardware_ops = sample_ops * (3.0 + np.asarray(activation_recomputation)) * local_batch
    effective_flops = peak_flops * efficiency
    # Step compute shared over the replica.
    compute_time = hardware_ops / (effective_flops * replica)

    # Per-accelerator state.
    if workload.is_transformer:
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
        footprint = weights + gradients + optimizer + activations + buffers
    else:
        # Weights, same-width gradients and Adam state, split over the replica;
        # alone on one accelerator, LoRA is priced at 1.1x the weights.
        shard = weights_total / replica
        adam_total = (weights_total / precision_bytes) * mem.ADAM_OPTIMIZER_BYTES
        lora_alone = np.asarray(is_lora) & (np.asarray(replica) == 1)
        weights = shard
        gradients = shard * ~lora_alone
        optimizer = np.where(lora_alone, (_LORA_FOOTPRINT - 1) * weights_total, adam_total / replica)
        activations = buffers = shard * 0.0  # none modeled (NaN where shard is)
        footprint = np.where(lora_alone, _LORA_FOOTPRINT * weights_total,
                             (weights_total * 2 + adam_total) / replica)
    feasible = footprint <= acc.memory_capacity

    # Memory ceiling: HBM, or the host link when the state spills.
    offload_bandwidth = min(acc.memory_bandwidth, _host_link(acc))
    resident_bandwidth = acc.memory_bandwidth
    if not workload.is_transformer:
        # Engine.solve's tiers, for the points priced on one accelerator.
        tier = np.full(np.shape(weights_total), acc.memory_bandwidth)
        if acc.flash_bandwidth is not None:
            tier[...] = acc.flash_bandwidth
        if acc.sram_capacity is not None and acc.sram_bandwidth is not None:
            tier = np.where(weights_total <= acc.sram_capacity, acc.sram_bandwidth, tier)
        resident_bandwidth = np.where(np.asarray(replica) == 1, tier, acc.memory_bandwidth)
    bandwidth = pick(feasible, resident_bandwidth, offload_bandwidth)
    weight_shard = weights_total / replica
    traffic = weight_shard + weight_shard * _ACTIVATION_TRAFFIC_PER_SAMPLE * local_batch
    memory_time = traffic / bandwidth

    # Eq. (1) of [1] plus fixed taxes: launch dispatch and per-layer framework overhead.
    overhead = acc.dispatch_tax + layer_count(workload) * FRAMEWORK_LAYER_TAX * 3
    latency = np.maximum(compute_time, memory_time) + overhead
    replica_peak = peak_flops * replica
    # App. B of [2]: MFU counts model FLOPs (3x forward), HFU what the silicon ran.
    mfu = np.clip(model_ops / latency / replica_peak, 0.0, 1.0)
    hfu = np.clip(hardware_ops / latency / replica_peak, 0.0, 1.0)
    if acc.tdp is not None:
        # [3]: power = TDP * (idle + dynamic * utilization), for every accelerator.
        energy = acc.tdp * (ENERGY_IDLE_FRACTION + ENERGY_DYNAMIC_FRACTION * hfu) * replica * latency
    else:
        energy = latency * 0.0  # no TDP stated: no energy (NaN where latency is)
    return {
        "latency": latency,
        "latency_compute": compute_time,
        "latency_memory": memory_time,
        "latency_overhead": np.asarray(overhead, dtype=np.float64),
        "throughput": local_batch / latency,
        "mfu": mfu,
        "hfu": hfu,
        "energy": energy,
        "memory_footprint": footprint,
        "memory_weights": weights,
        "memory_gradients": gradients,
        "memory_optimizer_state": optimizer,
        "memory_activations": activations,
        "memory_communication_buffers": buffers,
        "feasible": feasible,
    }
