"""The composition: mlsysim 0.3.0 ``DistributedModel.solve``, broadcast over arrays.

Every numeric and boolean knob may be an array; all broadcast together, and
each term is computed on the axes its inputs span (pass a grid as an open mesh,
like ``np.ix_``). Branches of the reference are ``np.where``; branches on the
workload or fleet (one object per call) are plain ``if``.

References
----------
[1] Shoeybi, M. et al. (2019), "Megatron-LM", arXiv:1909.08053 (4 all-reduces
    per layer per training step under TP).
[2] Fedus, W., Zoph, B. and Shazeer, N. (2022), "Switch Transformers", JMLR
    (expert-parallel all-to-all).
[3] Dean, J. and Barroso, L. (2013), "The tail at scale", CACM (stragglers).
[4] mlsysim 0.3.0, ``DistributedModel.solve`` (engine/solvers/distributed.py).
"""

from __future__ import annotations

import numpy as np

from . import collectives as coll
from . import knobs as knobs_
from . import pipeline
from .replica import layer_count, pick, replica_step, stored_bytes, weight_bytes, width
from .specs import Fleet, Workload

__all__ = [
    "solve",
    "OUTPUTS",
    "NVLINK_CLASS_LATENCY",
    "FALLBACK_FABRIC_LATENCY",
    "TP_ALLREDUCES_PER_LAYER",
    "LORA_GRADIENT_FRACTION",
]

#: Per-hop latency of the NVLink technology class [s], used when the
#: accelerator's own link states none (mlsysim ``Tech.Interconnect.NVLink``).
NVLINK_CLASS_LATENCY = 500e-9
#: Fabric latency used when a fabric states none [s]: InfiniBand NDR's 5 us.
FALLBACK_FABRIC_LATENCY = 5e-6
#: Megatron-LM: 2 all-reduces forward and 2 backward per layer [1].
TP_ALLREDUCES_PER_LAYER = 4
#: Share of the gradients a LoRA step all-reduces across DP.
LORA_GRADIENT_FRACTION = 0.01

#: Points per block when a call is large enough to be cut (bounds the temporaries).
CHUNK_SIZE = 1 << 20

#: Output name -> (units, long name). Units are CF strings, "1" for ratios.
OUTPUTS = {
    "valid": ("1", "split is possible: TP*PP*EP divides the fleet"),
    "dp_size": ("1", "data-parallel degree"),
    "idle_ranks": ("1", "global batch smaller than DP: ranks run one sample"),
    "step_latency_total": ("s", "training step time"),
    "scaling_efficiency": ("1", "replica step time over total step time"),
    "effective_throughput": ("s-1", "fleet throughput in samples per second"),
    "mfu": ("1", "fleet model FLOPs utilization"),
    "dp_communication_latency": ("s", "exposed data-parallel gradient all-reduce"),
    "tp_communication_latency": ("s", "tensor-parallel activation all-reduces"),
    "ep_communication_latency": ("s", "expert-parallel all-to-all"),
    "communication_latency": ("s", "all communication before overlap"),
    "pipeline_bubble_latency": ("s", "pipeline fill and drain"),
    "bubble_fraction": ("1", "idle share of a pipelined step"),
    "node_latency": ("s", "replica step time"),
    "node_latency_compute": ("s", "replica compute time"),
    "node_latency_memory": ("s", "replica memory-traffic time"),
    "node_latency_overhead": ("s", "dispatch and framework layer taxes"),
    "node_throughput": ("s-1", "replica throughput in samples per second"),
    "node_mfu": ("1", "replica model FLOPs utilization"),
    "node_hfu": ("1", "replica hardware FLOPs utilization"),
    "node_energy": ("J", "replica energy per step"),
    "memory_footprint": ("B", "training memory per accelerator"),
    "memory_weights": ("B", "weights per accelerator"),
    "memory_gradients": ("B", "gradients per accelerator"),
    "memory_optimizer_state": ("B", "optimizer state per accelerator"),
    "memory_activations": ("B", "stored activations per accelerator"),
    "memory_communication_buffers": ("B", "gradient bucket and pipeline buffers per accelerator"),
    "feasible": ("1", "training state fits the accelerator's memory"),
}


def _per_precision(precision, fn):
    """``fn(key)`` for a precision name, or spread over an array of them."""
    return fn(precision) if isinstance(precision, str) else precision.lookup(fn)


def solve(workload: Workload, fleet: Fleet, batch_size=1, precision="fp16", efficiency=0.5,
          tp_size=1, pp_size=1, ep_size=1, v_stages=1, microbatch_count=1,
          topology_override=None, zero_stage=0, is_lora=False, activation_recomputation=False,
          overlap_comm=False, overlap_efficiency=0.85, congestion_factor=1.0,
          straggler_factor=1.0, moe_routing_imbalance_factor=1.0,
          gradient_accumulation_steps=1, seq_len=2048, *, dp_size=None):
    """Distributed training step of ``workload`` on ``fleet``, for every configuration at once.

    Keyword names and defaults are those of mlsysim 0.3.0
    ``DistributedModel.solve``. Numeric and boolean knobs may be arrays; all
    broadcast together. ``precision`` is a name (``fp32``, ``tf32``, ``bf16``,
    ``fp16``, ``fp8``, ``int8``, ``int4``; any case) or an array of names.
    ``topology_override`` is accepted, as by the reference, and changes nothing.

    ``dp_size`` (keyword-only, not in the reference) sizes the cluster instead
    of the fleet's node count: the fleet then has ``tp*pp*ep*dp_size``
    accelerators of its node type, which must be whole nodes (else the point
    is not valid). The result equals the reference on a fleet of that size.

    Returns
    -------
    dict of str -> numpy.ndarray
        The outputs of :data:`OUTPUTS` in SI units, each of the broadcast shape
        of the knobs (read-only views where a term spans fewer axes). Where
        ``valid`` is False (TP*PP*EP exceeds or does not divide the fleet)
        every float output is NaN and every boolean False.

    Raises
    ------
    ValueError
        For a value no configuration can have, naming the knob and the value, or
        array knobs whose shapes do not broadcast (naming the knobs and shapes).
    """
    k = knobs_.normalize({
        "batch_size": batch_size, "precision": precision, "efficiency": efficiency,
        "tp_size": tp_size, "pp_size": pp_size, "ep_size": ep_size, "v_stages": v_stages,
        "microbatch_count": microbatch_count, "topology_override": topology_override,
        "zero_stage": zero_stage, "is_lora": is_lora,
        "activation_recomputation": activation_recomputation, "overlap_comm": overlap_comm,
        "overlap_efficiency": overlap_efficiency, "congestion_factor": congestion_factor,
        "straggler_factor": straggler_factor,
        "moe_routing_imbalance_factor": moe_routing_imbalance_factor,
        "gradient_accumulation_steps": gradient_accumulation_steps, "seq_len": seq_len,
        **({} if dp_size is None else {"dp_size": dp_size}),
    })
    if not isinstance(workload, Workload):
        raise TypeError(f"workload must be a solver.specs.Workload (see solver.catalog.workload "
                        f"or solver.from_mlsysim), but got {type(workload).__name__}")
    if not isinstance(fleet, Fleet):
        raise TypeError(f"fleet must be a solver.specs.Fleet (see solver.catalog.fleet "
                        f"or solver.from_mlsysim), but got {type(fleet).__name__}")
    try:
        shape = np.broadcast_shapes(*(np.shape(v) for v in k.values()))
    except ValueError:
        shapes = {name: np.shape(v) for name, v in k.items() if np.shape(v)}
        raise ValueError(
            "the array knobs must broadcast together (each axis of equal length or 1), but got "
            + ", ".join(f"{name} of shape {shape}" for name, shape in shapes.items())) from None
    size = int(np.prod(shape))
    axis = int(np.argmax(shape)) if shape else 0
    if size <= 2 * CHUNK_SIZE or shape[axis] < 2:
        return _solve(workload, fleet, k, shape)
    # Large inputs: blocks along the longest axis, so temporaries stay bounded.
    n_blocks = min(shape[axis], -(-size // CHUNK_SIZE))
    bounds = np.linspace(0, shape[axis], n_blocks + 1).astype(int)
    result = {}
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        part = {name: _block(value, axis, len(shape), lo, hi) for name, value in k.items()}
        block_shape = shape[:axis] + (hi - lo,) + shape[axis + 1:]
        for name, value in _solve(workload, fleet, part, block_shape).items():
            if name not in result:
                result[name] = np.empty(shape, dtype=value.dtype)
            result[name][(slice(None),) * axis + (slice(lo, hi),)] = value
    return result


def _block(value, axis, ndim, lo, hi):
    """Rows ``lo:hi`` of a knob along broadcast axis ``axis`` (unchanged if it is not long there)."""
    shape = np.shape(value)
    own = axis - (ndim - len(shape))
    if own < 0 or shape[own] == 1:
        return value
    index = (slice(None),) * own + (slice(lo, hi),)
    if isinstance(value, knobs_.Precisions):
        return knobs_.Precisions(value.keys, value.codes[index])
    return value[index]


def _solve(workload, fleet, k, shape):
    node, fabric = fleet.node, fleet.fabric
    acc = node.accelerator
    tp, pp, ep = k["tp_size"], k["pp_size"], k["ep_size"]
    seq_len, lora = k["seq_len"], k["is_lora"]

    # 1. Split the fleet into TP x PP x EP replicas and DP; the split must be exact.
    # Products of degrees are taken in float64 first (exact below 2**53, never
    # wrapping); the int64 product is used only where it is known to fit.
    replica_f = tp * 1.0 * pp * ep
    if "dp_size" in k:  # the cluster is sized by the layout: whole nodes only
        dp = k["dp_size"]
        fits = replica_f * dp < knobs_.MAX_INTEGER
    else:
        n_accelerators = fleet.total_accelerators
        fits = replica_f <= n_accelerators
    replica = 1 + fits * (tp * pp * ep - 1)  # unfit: priced as 1, reported NaN below
    if "dp_size" in k:
        valid = fits & ((replica * dp) % node.accelerators_per_node == 0)
    else:
        valid = fits & (n_accelerators % replica == 0)
        replica = 1 + valid * (replica - 1)
        dp = n_accelerators // replica
    local_batch = np.maximum(1, k["batch_size"] // dp)
    idle_ranks = k["batch_size"] < dp

    precision = k["precision"]
    precision_bytes = _per_precision(precision, knobs_.PRECISION_BYTES.__getitem__)
    peak_flops = _per_precision(precision, acc.peak_for)
    weights_total = _per_precision(
        precision, lambda p: weight_bytes(workload, knobs_.PRECISION_BYTES[p]))
    model_bytes = _per_precision(
        precision, lambda p: stored_bytes(workload, knobs_.PRECISION_BYTES[p]))
    all_valid = bool(np.all(valid))
    if not all_valid:
        # Invalid splits are reported as NaN. Every priced term derives from these
        # four small arrays (precision x split axes), so NaN placed here reaches
        # every full-size output without a pass over it; the few outputs that do
        # not derive from them are masked explicitly below.
        nan_if_invalid = np.where(valid, 0.0, np.nan)
        precision_bytes = precision_bytes + nan_if_invalid
        peak_flops = peak_flops + nan_if_invalid
        weights_total = weights_total + nan_if_invalid
        model_bytes = model_bytes + nan_if_invalid

    # 2. One replica's step.
    step = replica_step(
        workload, acc, local_batch=local_batch, replica=replica, dp_size=dp,
        tp_size=tp, pp_size=pp, seq_len=seq_len, precision_bytes=precision_bytes,
        peak_flops=peak_flops, weights_total=weights_total, efficiency=k["efficiency"],
        zero_stage=k["zero_stage"], is_lora=lora,
        activation_recomputation=k["activation_recomputation"],
        microbatch_count=k["microbatch_count"],
        gradient_accumulation_steps=k["gradient_accumulation_steps"])
    latency = step["latency"]

    # 3. Communication.
    intra_bw = node.intra_node_bandwidth
    intra_lat = acc.nvlink_latency if acc.nvlink_latency is not None else NVLINK_CLASS_LATENCY
    inter_bw = fabric.bandwidth / fabric.oversubscription
    inter_lat = fabric.latency if fabric.latency is not None else FALLBACK_FABRIC_LATENCY

    # DP: each rank all-reduces the gradients of its TP x PP shard.
    gradients = model_bytes / (tp * pp)
    gradients = np.where(lora, gradients * LORA_GRADIENT_FRACTION, gradients)
    # The group's ranks sit in different replicas: accelerators_per_node // replica
    # of them share a node. One node: a ring over the intra-node link; one rank
    # per node: a ring over the fabric; else hierarchical. (dp = 1 costs 0.)
    ranks_per_node = np.maximum(1, node.accelerators_per_node // replica)
    nodes_spanned = -(-dp // ranks_per_node)
    one_node = nodes_spanned == 1
    ring = coll.ring_allreduce_time(gradients, dp, bandwidth=pick(one_node, intra_bw, inter_bw),
                                    latency=pick(one_node, intra_lat, inter_lat))
    t_dp = np.where(
        one_node | (ranks_per_node == 1),
        ring,
        coll.hierarchical_allreduce_time(
            gradients, nodes_spanned, ranks_per_node, intra_node_bandwidth=intra_bw,
            inter_node_bandwidth=inter_bw, inter_node_latency=inter_lat))

    # TP: 4 all-reduces of the stage's activations per layer [1], over NVLink
    # when the group fits in a node, else over the fabric.
    activation_bytes = local_batch * 1.0 * seq_len * width(workload) * precision_bytes
    in_node = tp <= node.accelerators_per_node
    stage_layers = -(-layer_count(workload) // pp)
    t_tp = coll.ring_allreduce_time(
        activation_bytes, tp, bandwidth=pick(in_node, intra_bw, inter_bw),
        latency=pick(in_node, intra_lat, inter_lat)) * TP_ALLREDUCES_PER_LAYER * stage_layers

    # EP: routed tokens all-to-all over the fabric [2] (ep = 1 costs 0).
    top_k = workload.active_experts_per_token or 1
    token_bytes = activation_bytes * top_k * k["moe_routing_imbalance_factor"]
    t_ep = coll.all_to_all_time(token_bytes, ep, bandwidth=inter_bw, latency=inter_lat)

    # 4. Pipeline bubble.
    bubble_fraction = pipeline.bubble_fraction(pp, k["microbatch_count"], k["v_stages"])
    t_bubble = pipeline.bubble_time(latency, bubble_fraction)

    # 5. Congestion, gradient accumulation, overlap, stragglers.
    congestion = k["congestion_factor"]
    t_dp = t_dp * congestion / k["gradient_accumulation_steps"]
    t_tp = t_tp * congestion
    t_ep = t_ep * congestion
    communication = t_dp + t_tp + t_ep
    # Overlap hides a share of the DP term (x * 1.0 is x, so no branch is needed).
    exposed_dp = t_dp * (1 - k["overlap_comm"] * k["overlap_efficiency"])
    total = latency + exposed_dp + t_tp + t_ep + t_bubble
    # [3]: the slowest worker gates the step; the reference ignores factors <= 1.
    total = total * np.maximum(k["straggler_factor"], 1.0)
    scaling = latency / total

    out = {
        "dp_size": dp.astype(np.float64),
        "idle_ranks": idle_ranks,
        "step_latency_total": total,
        "scaling_efficiency": scaling,
        "effective_throughput": dp * step["throughput"] * scaling,
        "mfu": step["mfu"] * scaling,
        "dp_communication_latency": t_dp,
        "tp_communication_latency": t_tp,
        "ep_communication_latency": t_ep,
        "communication_latency": communication,
        "pipeline_bubble_latency": t_bubble,
        "bubble_fraction": bubble_fraction,
        "node_latency": latency,
        "node_latency_compute": step["latency_compute"],
        "node_latency_memory": step["latency_memory"],
        "node_latency_overhead": step["latency_overhead"],
        "node_throughput": step["throughput"],
        "node_mfu": step["mfu"],
        "node_hfu": step["hfu"],
        "node_energy": step["energy"],
    }
    out.update({name: step[name] for name in step if name.startswith("memory_")})
    out["feasible"] = step["feasible"]
    result = {"valid": np.broadcast_to(valid, shape)}
    for name, value in out.items():
        value = np.asarray(value)
        if not all_valid and name in _NOT_PRICED:
            value = (value & valid) if value.dtype == bool else value + nan_if_invalid
        result[name] = np.broadcast_to(value, shape)
    return result


#: Outputs that do not derive from the precision-dependent terms (Adam state is
#: 12 B per parameter at any precision), so an invalid split must be masked in
#: them explicitly (they span few axes: cheap).
_NOT_PRICED = ("dp_size", "idle_ranks", "bubble_fraction", "node_latency_overhead",
               "memory_optimizer_state")
