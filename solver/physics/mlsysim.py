"""mlsysim 0.3.0 ``DistributedModel.solve``, broadcast over arrays, in named steps.

The model is a composition of the formula functions of the topic modules
(:mod:`solver.replica`, :mod:`solver.memory`, :mod:`solver.collectives`,
:mod:`solver.pipeline`), in the order the reference computes them, in the
manner of pvlib's ``ModelChain``:

1. :func:`split` -- the fleet into TP x PP x EP replicas and DP, and its validity;
2. :func:`precision_terms` -- bytes, peak and model size at the precision;
3. :func:`replica_step` -- one replica's step (roofline, memory, energy);
4. :func:`links` and the communication terms :func:`dp_communication`,
   :func:`tp_communication`, :func:`ep_communication`;
5. :func:`pipeline_bubble`;
6. :func:`compose` -- overlap, stragglers and the fleet's outputs;
7. :func:`~solver.physics.common.realizable` -- whether a framework can run
   the layout as stated (not in the reference: it prices any microbatch count);
8. :func:`~solver.physics.common.mask_invalid` -- NaN (False) where the split
   is impossible, once, on every output.

:func:`price` runs the steps on one block of normalized knobs; :func:`solve`
checks the knobs and prices them in blocks. The results equal the
reference's bit for bit in most outputs (rtol 1e-9 in all): the arithmetic
keeps the reference's order where it matters.

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

from typing import NamedTuple

import numpy as np

from .. import blocks, fused
from .. import collectives as coll
from .. import knobs as knobs_
from .. import pipeline
from .. import replica as rep
from ..outputs import OUTPUTS
from ..replica import layer_count, pick, stored_bytes, weight_bytes, width
from ..specs import Accelerator, Fleet, Workload
from .common import check_specs, even_splits, mask_invalid, realizable, split_divisors

__all__ = [
    "solve",
    "price",
    "OUTPUTS",
    "Split",
    "PrecisionTerms",
    "Links",
    "split",
    "precision_terms",
    "replica_step",
    "links",
    "dp_communication",
    "activation_bytes",
    "tp_communication",
    "ep_communication",
    "pipeline_bubble",
    "compose",
    "realizable",
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


def solve(workload: Workload, fleet: Fleet, batch_size=1, precision="fp16", efficiency=0.5,
          tp_size=1, pp_size=1, ep_size=1, v_stages=1, microbatch_count=1,
          topology_override=None, zero_stage=0, is_lora=False, activation_recomputation=False,
          overlap_comm=False, overlap_efficiency=0.85, congestion_factor=1.0,
          straggler_factor=1.0, moe_routing_imbalance_factor=1.0,
          gradient_accumulation_steps=1, seq_len=2048, *, dp_size=None, engine="auto"):
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

    ``engine`` (keyword-only) picks the path; every path returns the same
    outputs, bit for bit:

    - ``"numpy"``: :func:`price`, broadcast numpy, for any shapes (an open
      mesh computes each term on its own axes). Calls of more than
      ``2 * solver.blocks.BLOCK_POINTS`` points are priced in blocks along
      their longest axis (bounded temporaries, same results).
    - ``"fused"``: the numba kernel of :mod:`solver.fused.mlsysim_kernel`, one
      pass over flat inputs (every knob a scalar or a 1-D array of one length);
      ``ValueError`` saying why where it cannot run (numba absent, not flat).
    - ``"auto"`` (default): fused where it can run and the call has at least
      :data:`solver.fused.FUSED_MIN_POINTS` configurations, else numpy.

    Returns
    -------
    dict of str -> numpy.ndarray
        The outputs of :data:`solver.outputs.OUTPUTS` in SI units, each of the
        broadcast shape of the knobs (read-only views where a term spans fewer
        axes). Where ``valid`` is False (TP*PP*EP exceeds or does not divide
        the fleet) every float output is NaN and every boolean False.

    Raises
    ------
    ValueError
        For a value no configuration can have, naming the knob and the value, or
        array knobs whose shapes do not broadcast (naming the knobs and shapes);
        for an unknown ``engine``, or ``engine="fused"`` where it cannot run.
    TypeError
        For a workload or fleet that is not a solver spec, or an unknown keyword.
    """
    values = {
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
    }
    path = fused.resolve_engine(engine, fused.shapes_of(values))
    check_specs(workload, fleet)
    if path == "fused":
        return _solve_fused(workload, fleet, values)
    k = knobs_.normalize(values)
    shape = blocks.broadcast_shape(k)
    # ``price`` is looked up here, at call time (the tests count the blocks through it).
    return blocks.in_blocks(lambda part, block_shape: price(workload, fleet, part, block_shape),
                            k, shape)


def _solve_fused(workload: Workload, fleet: Fleet, values: dict) -> dict:
    """:func:`price` of flat knobs in one pass (:mod:`solver.fused.mlsysim_kernel`)."""
    from ..fused import mlsysim_kernel

    shapes = fused.shapes_of(values)
    n, _ = fused.flat_size(shapes)
    out = mlsysim_kernel.run(workload, fleet, values, n)
    if all(shape == () for shape in shapes.values()):  # scalars in, 0-d out, as numpy returns
        out = {name: value.reshape(()) for name, value in out.items()}
    return out


def price(workload: Workload, fleet: Fleet, k: dict, shape: tuple) -> dict:
    """Every output for one block of normalized knobs ``k`` of broadcast ``shape``.

    The composition of the named steps; see the module docstring.
    """
    acc = fleet.node.accelerator
    s = split(fleet, k)
    tp, pp = s.tp_size, s.pp_size
    p = precision_terms(workload, acc, k["precision"])
    step = replica_step(
        workload, acc, local_batch=s.local_batch, replica=s.replica, dp_size=s.dp_size,
        tp_size=tp, pp_size=pp, seq_len=k["seq_len"], precision_bytes=p.precision_bytes,
        peak_flops=p.peak_flops, weights_total=p.weights_total, efficiency=k["efficiency"],
        zero_stage=k["zero_stage"], is_lora=k["is_lora"],
        activation_recomputation=k["activation_recomputation"],
        microbatch_count=k["microbatch_count"],
        gradient_accumulation_steps=k["gradient_accumulation_steps"])
    net = links(fleet)
    congestion = k["congestion_factor"]
    t_dp = dp_communication(
        fleet, net, model_bytes=p.model_bytes, tp_size=tp, pp_size=pp, is_lora=k["is_lora"],
        replica=s.replica, dp_size=s.dp_size, congestion_factor=congestion,
        gradient_accumulation_steps=k["gradient_accumulation_steps"])
    activations = activation_bytes(workload, local_batch=s.local_batch, seq_len=k["seq_len"],
                                   precision_bytes=p.precision_bytes)
    t_tp = tp_communication(workload, fleet, net, activation_bytes=activations, tp_size=tp,
                            pp_size=pp, congestion_factor=congestion)
    t_ep = ep_communication(
        workload, net, activation_bytes=activations, ep_size=s.ep_size,
        moe_routing_imbalance_factor=k["moe_routing_imbalance_factor"],
        congestion_factor=congestion)
    bubble_fraction, t_bubble = pipeline_bubble(
        step["node_latency"], pp_size=pp, microbatch_count=k["microbatch_count"],
        v_stages=k["v_stages"])
    out = compose(step, s, t_dp=t_dp, t_tp=t_tp, t_ep=t_ep, bubble_fraction=bubble_fraction,
                  t_bubble=t_bubble, overlap_comm=k["overlap_comm"],
                  overlap_efficiency=k["overlap_efficiency"],
                  straggler_factor=k["straggler_factor"])
    out["realizable"] = realizable(
        batch_size=k["batch_size"], dp_size=s.dp_size,
        gradient_accumulation_steps=k["gradient_accumulation_steps"],
        microbatch_count=k["microbatch_count"]) & even_splits(
        split_divisors(workload), tp_size=tp, pp_size=pp, v_stages=k["v_stages"], ep_size=s.ep_size)
    return mask_invalid(out, s.valid, shape, OUTPUTS)


# ------------------------------------------------------------------ 1. the split


class Split(NamedTuple):
    """The fleet split into replicas and data-parallel ranks (arrays of int, bool).

    Where the split is impossible, the degrees are finite stand-ins (a replica
    of one accelerator), so pricing it raises no warning; it is masked at the end.
    """

    #: Degrees as priced: the knobs, or 1 where the split is impossible.
    tp_size: np.ndarray
    pp_size: np.ndarray
    ep_size: np.ndarray
    #: Accelerators per replica, TP*PP*EP (1 where the split is impossible).
    replica: np.ndarray
    #: Data-parallel degree.
    dp_size: np.ndarray
    #: The split is possible.
    valid: np.ndarray
    #: Samples per replica per step, at least 1.
    local_batch: np.ndarray
    #: The global batch is smaller than DP: ranks run one sample.
    idle_ranks: np.ndarray


def split(fleet: Fleet, k: dict) -> Split:
    """Split the fleet into TP x PP x EP replicas and DP; the split must be exact.

    Without a ``dp_size`` knob the fleet is fixed and DP is derived (TP*PP*EP
    must divide the fleet); with one, the cluster is TP*PP*EP*DP accelerators,
    which must be whole nodes. Impossible splits are priced as replicas of one
    accelerator (finite stand-ins: TP = PP = EP = 1) and masked at the end.
    """
    tp, pp, ep = k["tp_size"], k["pp_size"], k["ep_size"]
    # Products of degrees are taken in float64 first (exact below 2**53, never
    # wrapping); the int64 product is used only where it is known to fit.
    replica_f = tp * 1.0 * pp * ep
    if "dp_size" in k:  # the cluster is sized by the layout: whole nodes only
        dp = k["dp_size"]
        fits = replica_f * dp < knobs_.MAX_INTEGER
    else:
        n_accelerators = fleet.total_accelerators
        fits = replica_f <= n_accelerators
    replica = 1 + fits * (tp * pp * ep - 1)  # unfit: priced as 1
    if "dp_size" in k:
        valid = fits & ((replica * dp) % fleet.node.accelerators_per_node == 0)
    else:
        valid = fits & (n_accelerators % replica == 0)
    if not np.all(valid):  # impossible splits: price a replica of one accelerator
        tp, pp, ep, replica = (1 + valid * (d - 1) for d in (tp, pp, ep, replica))
    if "dp_size" not in k:
        dp = n_accelerators // replica
    local_batch = np.maximum(1, k["batch_size"] // dp)
    return Split(tp, pp, ep, replica, dp, valid, local_batch, k["batch_size"] < dp)


# ------------------------------------------------------------------ 2. precision


class PrecisionTerms(NamedTuple):
    """What the precision sets (floats, or arrays over a precision axis)."""

    #: Bytes per element [B].
    precision_bytes: object
    #: One accelerator's peak at the precision [FLOP/s].
    peak_flops: object
    #: Weight bytes of the lowered graph, whole model [B].
    weights_total: object
    #: Model size the DP all-reduce moves, whole model [B].
    model_bytes: object


def _per_precision(precision, fn):
    """``fn(key)`` for a precision name, or spread over an array of them."""
    return fn(precision) if isinstance(precision, str) else precision.lookup(fn)


def precision_terms(workload: Workload, acc: Accelerator, precision) -> PrecisionTerms:
    """Bytes, peak FLOP/s and model sizes at ``precision`` (a name or :class:`~solver.knobs.Precisions`)."""
    nbytes = knobs_.PRECISION_BYTES
    return PrecisionTerms(
        _per_precision(precision, nbytes.__getitem__),
        _per_precision(precision, acc.peak_for),
        _per_precision(precision, lambda p: weight_bytes(workload, nbytes[p])),
        _per_precision(precision, lambda p: stored_bytes(workload, nbytes[p])))


# ------------------------------------------------------------------ 3. the replica step


def replica_step(workload: Workload, acc: Accelerator, *, local_batch, replica, dp_size,
                 tp_size, pp_size, seq_len, precision_bytes, peak_flops, weights_total,
                 efficiency, zero_stage, is_lora, activation_recomputation,
                 microbatch_count, gradient_accumulation_steps):
    """Latency, utilization, memory and energy of one replica's step (``_replica_profile``).

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
        Weight bytes of the whole model at the precision (:func:`~solver.replica.weight_bytes`).
    efficiency : array_like [1]
    zero_stage : array_like of int
    is_lora, activation_recomputation : array_like of bool

    Returns
    -------
    dict of numpy.ndarray
        Under their output names: ``node_latency``, ``node_latency_compute``,
        ``node_latency_memory``, ``node_latency_overhead`` [s], ``node_throughput``
        [samples/s], ``node_mfu``, ``node_hfu`` [1], ``node_energy`` [J],
        ``memory_footprint`` and the ``memory_*`` breakdown [B], ``feasible``.
    """
    model_ops, hardware_ops = rep.step_flops(
        workload, seq_len=seq_len, local_batch=local_batch,
        activation_recomputation=activation_recomputation)
    compute = rep.compute_time(hardware_ops, peak_flops=peak_flops, efficiency=efficiency,
                               replica=replica)
    if workload.is_transformer:
        memory = rep.sharded_memory(
            workload, local_batch=local_batch, replica=replica, dp_size=dp_size,
            tp_size=tp_size, pp_size=pp_size, seq_len=seq_len, precision_bytes=precision_bytes,
            zero_stage=zero_stage, is_lora=is_lora,
            activation_recomputation=activation_recomputation, microbatch_count=microbatch_count,
            gradient_accumulation_steps=gradient_accumulation_steps)
    else:
        memory = rep.single_accelerator_memory(weights_total=weights_total,
                                               precision_bytes=precision_bytes,
                                               replica=replica, is_lora=is_lora)
    feasible = memory["memory_footprint"] <= acc.memory_capacity
    t_memory = rep.memory_time(workload, acc, weights_total=weights_total, replica=replica,
                               local_batch=local_batch, feasible=feasible)
    overhead = rep.overhead_time(workload, acc)
    latency = rep.roofline_latency(compute, t_memory, overhead)
    replica_peak = peak_flops * replica
    hfu = rep.utilization(hardware_ops, latency, replica_peak)
    return {
        "node_latency": latency,
        "node_latency_compute": compute,
        "node_latency_memory": t_memory,
        "node_latency_overhead": np.asarray(overhead, dtype=np.float64),
        "node_throughput": local_batch / latency,
        "node_mfu": rep.utilization(model_ops, latency, replica_peak),
        "node_hfu": hfu,
        "node_energy": rep.step_energy(acc, hfu=hfu, replica=replica, latency=latency),
        **memory,
        "feasible": feasible,
    }


# ------------------------------------------------------------------ 4. communication


class Links(NamedTuple):
    """Bandwidths [B/s] and per-hop latencies [s] inside a node and across the fabric."""

    intra_bandwidth: float
    intra_latency: float
    inter_bandwidth: float
    inter_latency: float


def links(fleet: Fleet) -> Links:
    """The fleet's links, with the reference's fallbacks for unstated latencies.

    The fabric's bandwidth is divided by its oversubscription.
    """
    acc, fabric = fleet.node.accelerator, fleet.fabric
    return Links(
        fleet.node.intra_node_bandwidth,
        acc.nvlink_latency if acc.nvlink_latency is not None else NVLINK_CLASS_LATENCY,
        fabric.bandwidth / fabric.oversubscription,
        fabric.latency if fabric.latency is not None else FALLBACK_FABRIC_LATENCY)


def dp_communication(fleet: Fleet, net: Links, *, model_bytes, tp_size, pp_size, is_lora,
                     replica, dp_size, congestion_factor, gradient_accumulation_steps):
    """Data-parallel gradient all-reduce per step [s], before overlap.

    Each rank all-reduces the gradients of its TP x PP shard (1 % of them under
    LoRA). The group's ranks sit in different replicas:
    ``accelerators_per_node // replica`` of them share a node. One node: a ring
    over the intra-node link; one rank per node: a ring over the fabric; else
    hierarchical. DP = 1 costs 0. Congestion scales it; gradient accumulation
    spreads it over the accumulation steps.
    """
    gradients = model_bytes / (tp_size * pp_size)
    gradients = np.where(is_lora, gradients * LORA_GRADIENT_FRACTION, gradients)
    ranks_per_node = np.maximum(1, fleet.node.accelerators_per_node // replica)
    nodes_spanned = -(-dp_size // ranks_per_node)
    one_node = nodes_spanned == 1
    ring = coll.ring_allreduce_time(
        gradients, dp_size, bandwidth=pick(one_node, net.intra_bandwidth, net.inter_bandwidth),
        latency=pick(one_node, net.intra_latency, net.inter_latency))
    t_dp = np.where(
        one_node | (ranks_per_node == 1),
        ring,
        coll.hierarchical_allreduce_time(
            gradients, nodes_spanned, ranks_per_node, intra_node_bandwidth=net.intra_bandwidth,
            inter_node_bandwidth=net.inter_bandwidth, inter_node_latency=net.inter_latency))
    return t_dp * congestion_factor / gradient_accumulation_steps


def activation_bytes(workload: Workload, *, local_batch, seq_len, precision_bytes):
    """Activations of one replica's step at one layer boundary [B]: ``b * s * h * bytes``."""
    return local_batch * 1.0 * seq_len * width(workload) * precision_bytes


def tp_communication(workload: Workload, fleet: Fleet, net: Links, *, activation_bytes, tp_size,
                     pp_size, congestion_factor):
    """Tensor-parallel activation all-reduces per step [s].

    4 ring all-reduces of the activations per layer of the stage [1], over the
    intra-node link when the TP group fits in a node, else over the fabric.
    TP = 1 costs 0.
    """
    in_node = tp_size <= fleet.node.accelerators_per_node
    stage_layers = -(-layer_count(workload) // pp_size)
    t_tp = coll.ring_allreduce_time(
        activation_bytes, tp_size, bandwidth=pick(in_node, net.intra_bandwidth, net.inter_bandwidth),
        latency=pick(in_node, net.intra_latency, net.inter_latency)
    ) * TP_ALLREDUCES_PER_LAYER * stage_layers
    return t_tp * congestion_factor


def ep_communication(workload: Workload, net: Links, *, activation_bytes, ep_size,
                     moe_routing_imbalance_factor, congestion_factor):
    """Expert-parallel all-to-all of the routed tokens over the fabric per step [s] [2].

    Each token goes to its top-k experts; routing imbalance scales the bytes.
    EP = 1 costs 0.
    """
    top_k = workload.active_experts_per_token or 1
    token_bytes = activation_bytes * top_k * moe_routing_imbalance_factor
    t_ep = coll.all_to_all_time(token_bytes, ep_size, bandwidth=net.inter_bandwidth,
                                latency=net.inter_latency)
    return t_ep * congestion_factor


# ------------------------------------------------------------------ 5. the bubble


def pipeline_bubble(busy_time, *, pp_size, microbatch_count, v_stages):
    """Pipeline fill and drain: ``(bubble_fraction [1], bubble time [s])`` of a step."""
    fraction = pipeline.bubble_fraction(pp_size, microbatch_count, v_stages)
    return fraction, pipeline.bubble_time(busy_time, fraction)


# ------------------------------------------------------------------ 6. the outputs


def compose(step: dict, s: Split, *, t_dp, t_tp, t_ep, bubble_fraction, t_bubble,
            overlap_comm, overlap_efficiency, straggler_factor) -> dict:
    """The fleet's outputs from the replica step and the communication terms.

    Overlap hides a share of the DP term; the slowest worker gates the step [3]
    (the reference ignores straggler factors <= 1).

    Returns
    -------
    dict of numpy.ndarray
        Every output but ``valid``, unmasked, each on the axes its inputs span.
    """
    latency = step["node_latency"]
    communication = t_dp + t_tp + t_ep
    # x * 1.0 is x, so no branch is needed where overlap is off.
    exposed_dp = t_dp * (1 - overlap_comm * overlap_efficiency)
    total = latency + exposed_dp + t_tp + t_ep + t_bubble
    total = total * np.maximum(straggler_factor, 1.0)
    scaling = latency / total
    return {
        "dp_size": s.dp_size.astype(np.float64),
        "idle_ranks": s.idle_ranks,
        "step_latency_total": total,
        "scaling_efficiency": scaling,
        "effective_throughput": s.dp_size * step["node_throughput"] * scaling,
        "mfu": step["node_mfu"] * scaling,
        "dp_communication_latency": t_dp,
        "tp_communication_latency": t_tp,
        "ep_communication_latency": t_ep,
        "communication_latency": communication,
        "pipeline_bubble_latency": t_bubble,
        "bubble_fraction": bubble_fraction,
        **step,
    }

