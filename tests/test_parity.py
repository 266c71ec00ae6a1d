"""Parity with mlsysim 0.3.0: seeded random configurations across the whole space.

Every configuration is priced by the reference (one call each) and by
``solver.solve`` (one call per workload and fleet, flat arrays), and every
output is compared at rtol 1e-9. The draw is checked to reach every branch of
the reference (each DP collective, TP over the fabric, offload, the
single-accelerator tiers, idle ranks, fallbacks for missing latencies, ...).
"""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest

from _reference import assert_matches, reference

import solver

from mlsysim.hardware.registry import Hardware  # noqa: E402  (importorskip in _reference)
from mlsysim.models.registry import Models  # noqa: E402
from mlsysim.models.types import TransformerWorkload  # noqa: E402
from mlsysim.systems.registry import Systems  # noqa: E402
from mlsysim.systems.types import Fleet, NetworkFabric, Node  # noqa: E402
from mlsysim.core.units import Q_  # noqa: E402

N_CONFIGS = 5000
SEED = 20261130
PRECISIONS = ["fp32", "tf32", "bf16", "FP16", "fp8", "int8", "int4"]


def _registry(group):
    return {n: getattr(group, n) for n in dir(group) if not n.startswith("_") and n != "list"}


def _custom_fleets():
    """Fleets no catalog holds, built from mlsysim objects, for the rare branches."""
    ndr_2to1 = Systems.Fabrics.InfiniBand_NDR_Oversub2to1
    no_latency = NetworkFabric(name="200G, latency unstated, 4:1", bandwidth=Q_(200, "Gbps"),
                               oversubscription_ratio=4.0)
    return {
        # One accelerator per node: every DP hop crosses an oversubscribed fabric.
        "H100_x1_node": Fleet(name="64 one-GPU nodes", count=64, fabric=ndr_2to1,
                              node=Node(name="1x H100", accelerator=Hardware.Cloud.H100,
                                        accelerators_per_node=1, intra_node_bw=Q_(450, "GB/s"))),
        # One node: the whole DP group rings over the intra-node link.
        "DGX_H100_x1": Fleet(name="one DGX H100", count=1, node=Systems.Nodes.DGX_H100,
                             fabric=Systems.Fabrics.InfiniBand_NDR),
        # MI300X: no NVLink latency (technology default), no host link (PCIe fallback);
        # the fabric states no latency (InfiniBand NDR fallback).
        "MI300X_nolat": Fleet(name="MI300X, fallbacks", count=12, fabric=no_latency,
                              node=Systems.Nodes.Server_8x_MI300X),
        # Four-GPU nodes, 6 of them: odd DP spans and hierarchical rings.
        "A100_x4": Fleet(name="A100 4-GPU", count=6, fabric=Systems.Fabrics.RoCE_100G,
                         node=Node(name="4x A100", accelerator=Hardware.Cloud.A100,
                                   accelerators_per_node=4, intra_node_bw=Q_(300, "GB/s"))),
        # No TDP: zero energy.
        "GC200": Fleet(name="Graphcore", count=8, fabric=Systems.Fabrics.Ethernet_100G,
                       node=Node(name="4x GC200", accelerator=Hardware.Cloud.Graphcore_GC200,
                                 accelerators_per_node=4, intra_node_bw=Q_(320, "GB/s"))),
        # Microcontrollers with SRAM and flash tiers: the single-device roofline tiers.
        "ESP32": Fleet(name="ESP32 pair", count=2, fabric=Systems.Fabrics.Ethernet_10G,
                       node=Node(name="2x ESP32", accelerator=Hardware.Tiny.ESP32_S3,
                                 accelerators_per_node=2, intra_node_bw=Q_(1, "GB/s"))),
        "MCU": Fleet(name="Lockstep MCU", count=3, fabric=Systems.Fabrics.Ethernet_10G,
                     node=Node(name="1x MCU", accelerator=Hardware.Tiny.LockstepSafetyMCU_Reference,
                               accelerators_per_node=1, intra_node_bw=Q_(1, "GB/s"))),
    }


FLEETS = {**_registry(Systems.Clusters), **_custom_fleets()}
WORKLOADS = {}
for _group in ("Language", "Vision", "Recommendation", "StateSpace", "GenerativeVision",
               "Embodied", "Tiny"):
    WORKLOADS.update(_registry(getattr(Models, _group)))
TINY_FLEETS = ("ESP32", "MCU")


def _divisors(n):
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _log_int(rng, low, high):
    return int(round(math.exp(rng.uniform(math.log(low), math.log(high)))))


def _draw(rng):
    """One configuration: fleet, workload and every knob over its range."""
    fleet_key = rng.choice(sorted(FLEETS))
    fleet = FLEETS[fleet_key]
    pool = sorted(WORKLOADS)
    if fleet_key in TINY_FLEETS:  # tiny devices: mostly tiny models, to reach SRAM/flash
        pool = [k for k in pool if WORKLOADS[k].parameters is not None
                and WORKLOADS[k].parameters.m_as("count") < 3e6] if rng.random() < 0.8 else pool
    wl_key = rng.choice(pool)
    model = WORKLOADS[wl_key]
    n = fleet.total_accelerators
    transformer = isinstance(model, TransformerWorkload)
    if not transformer and rng.random() < 0.5:
        tp = pp = ep = 1  # the single-accelerator path
    elif rng.random() < 0.85:
        # An exact split: factor a divisor of the fleet into TP x PP x EP.
        group = int(rng.choice(_divisors(n)[: max(1, len(_divisors(n)) * 3 // 4)]))
        tp = int(rng.choice([d for d in _divisors(group) if d <= 64]))
        rest = group // tp
        ep = int(rng.choice([d for d in _divisors(rest) if d <= 16])) if rng.random() < 0.4 else 1
        pp = rest // ep
    else:  # anything, often impossible
        tp, pp, ep = (int(rng.choice(v)) for v in ([1, 2, 3, 4, 8, 16, 32, 128],
                                                    [1, 2, 3, 5, 8, 16, 64], [1, 2, 4, 8, 12]))
    knobs = dict(
        batch_size=_log_int(rng, 1, 16384),
        precision=str(rng.choice(PRECISIONS)),
        efficiency=float(rng.choice([1.0, rng.uniform(0.01, 1.0)])),
        tp_size=tp, pp_size=pp, ep_size=ep,
        v_stages=int(rng.integers(1, 5)),
        microbatch_count=_log_int(rng, 1, 256),
        zero_stage=int(rng.integers(0, 4)),
        is_lora=bool(rng.random() < 0.25),
        activation_recomputation=bool(rng.random() < 0.5),
        overlap_comm=bool(rng.random() < 0.5),
        overlap_efficiency=float(rng.choice([0.0, 1.0, rng.uniform(0, 1)])),
        congestion_factor=float(rng.choice([1.0, rng.uniform(1, 3)])),
        straggler_factor=float(rng.choice([1.0, rng.uniform(1, 1.6)])),
        moe_routing_imbalance_factor=float(rng.choice([1.0, rng.uniform(1, 2.5)])),
        gradient_accumulation_steps=int(rng.choice([1, 1, 2, 4, 7, 16])),
        seq_len=_log_int(rng, 1, 65536),
    )
    if rng.random() < 0.1:
        knobs["topology_override"] = str(rng.choice(["ring", "tree"]))
    return fleet_key, wl_key, knobs


def _branches(fleet, model, knobs, ours):
    """Which reference branches one configuration takes (for the coverage check)."""
    if not ours["valid"]:
        return {"invalid split"}
    acc = fleet.node.accelerator
    apn = fleet.node.accelerators_per_node
    tp, pp, ep = knobs["tp_size"], knobs["pp_size"], knobs["ep_size"]
    replica, dp = tp * pp * ep, int(ours["dp_size"])
    rpn = max(1, apn // replica)
    spanned = -(-dp // rpn)
    hit = set()
    if dp > 1:
        hit.add("dp ring in node" if spanned == 1 else
                "dp ring across nodes" if rpn == 1 else "dp hierarchical")
    if tp > 1:
        hit.add("tp in node" if tp <= apn else "tp across nodes")
    if ep > 1:
        hit.add("ep all-to-all")
    if pp > 1:
        hit.add("pipeline bubble")
    if ours["idle_ranks"]:
        hit.add("batch below dp")
    if not ours["feasible"]:
        hit.add("offload")
    if not isinstance(model, TransformerWorkload):
        hit.add("single accelerator" if replica == 1 else "non-transformer sharded")
        if replica == 1 and ours["feasible"] and acc.memory.sram_bandwidth is not None:
            hit.add("sram or flash tier")
    if knobs["is_lora"]:
        hit.add("lora")
    if knobs["zero_stage"] == 3:
        hit.add("zero 3")
    if knobs["straggler_factor"] > 1:
        hit.add("straggler")
    if knobs["congestion_factor"] > 1:
        hit.add("congestion")
    if knobs["gradient_accumulation_steps"] > 1:
        hit.add("accumulation")
    if knobs["overlap_comm"]:
        hit.add("overlap")
    if fleet.fabric.latency is None:
        hit.add("fabric latency fallback")
    if acc.nvlink is None or acc.nvlink.latency is None:
        hit.add("nvlink latency fallback")
    if acc.interconnect is None and not ours["feasible"]:
        hit.add("offload host-link fallback")
    if acc.tdp is None:
        hit.add("no tdp")
    return hit


def test_random_configurations_match_reference():
    rng = np.random.default_rng(SEED)
    draws = [_draw(rng) for _ in range(N_CONFIGS)]
    groups = collections.defaultdict(list)
    for i, (fleet_key, wl_key, _) in enumerate(draws):
        groups[fleet_key, wl_key].append(i)

    coverage = collections.Counter()
    seen = collections.Counter()
    worst = 0.0
    for (fleet_key, wl_key), rows in groups.items():
        fleet, model = FLEETS[fleet_key], WORKLOADS[wl_key]
        columns = {name: np.array([draws[i][2].get(name, solver.KNOBS[name].default)
                                   for i in rows])
                   for name in solver.knobs.REFERENCE_KNOBS if name != "topology_override"}
        ours = solver.solve(solver.from_mlsysim(model), solver.from_mlsysim(fleet), **columns)
        for j, i in enumerate(rows):
            knobs = draws[i][2]
            point = {name: value[j].item() for name, value in ours.items()}
            ref = reference(model, fleet, **knobs)
            worst = max(worst, assert_matches(point, ref, where=f"{wl_key} on {fleet_key} {knobs}"))
            coverage.update(_branches(fleet, model, knobs, point))
            seen.update([knobs["precision"].lower(), fleet_key, wl_key])
    print(f"\nparity: {N_CONFIGS} configurations, largest relative error {worst:.3e}")
    print("branches:", dict(sorted(coverage.items())))

    for branch in ("invalid split", "dp ring in node", "dp ring across nodes", "dp hierarchical",
                   "tp in node", "tp across nodes", "ep all-to-all", "pipeline bubble",
                   "batch below dp", "offload", "single accelerator", "non-transformer sharded",
                   "sram or flash tier", "lora", "zero 3", "straggler", "congestion",
                   "accumulation", "overlap", "fabric latency fallback", "nvlink latency fallback",
                   "offload host-link fallback", "no tdp"):
        assert coverage[branch] >= 10, f"the draw reached '{branch}' only {coverage[branch]} times"
    assert all(seen[p.lower()] > 100 for p in PRECISIONS)
    assert sum(seen[f] > 0 for f in FLEETS) >= 8
    assert all(seen[w] > 0 for w in WORKLOADS)


@pytest.mark.parametrize("fleet_key", ["Training_1K", "Research_256"])
def test_reference_optimizer_space_matches(fleet_key):
    """The reference optimizer's own power-of-two layouts, batched in one call."""
    fleet, model = FLEETS[fleet_key], WORKLOADS["Llama3_70B"]
    tp = np.array([1, 2, 4, 8])[:, None]
    pp = np.array([1, 2, 4, 8, 16, 32, 64])[None, :]
    ours = solver.solve(solver.from_mlsysim(model), solver.from_mlsysim(fleet), batch_size=512,
                        tp_size=tp, pp_size=pp, overlap_comm=True)
    for a in range(tp.shape[0]):
        for b in range(pp.shape[1]):
            knobs = dict(batch_size=512, tp_size=int(tp[a, 0]), pp_size=int(pp[0, b]),
                         overlap_comm=True)
            point = {name: value[a, b].item() for name, value in ours.items()}
            assert_matches(point, reference(model, fleet, **knobs), where=str(knobs))
