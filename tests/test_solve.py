"""solver.solve: hand values, analytic limits, invalid splits, broadcasting, shapes, precision.

Parity with mlsysim lives in test_parity.py; here every expected number is
derived by hand from the formulas (solver/*.py docstrings) on round
hand-built specs, or is an identity / limit that must hold whatever the model.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import solver
from solver import catalog
from solver.blocks import BLOCK_POINTS
from solver.specs import Accelerator, Fabric, Fleet, Node, Workload

RTOL = 1e-12
BOOL_OUTPUTS = ("valid", "feasible", "idle_ranks", "realizable")
FLOAT_OUTPUTS = tuple(name for name in solver.OUTPUTS if name not in BOOL_OUTPUTS)

# ------------------------------------------------------------------ hand-built specs
# Round numbers so every term can be worked out on paper.
ACC = Accelerator(name="round", peak_flops=1e15, memory_capacity=80e9, memory_bandwidth=2e12,
                  host_link_bandwidth=50e9, nvlink_latency=1e-6, tdp=500.0, dispatch_tax=1e-5)
NODE8 = Node(name="8x round", accelerator=ACC, accelerators_per_node=8, intra_node_bandwidth=4e11)
NODE1 = Node(name="1x round", accelerator=ACC, accelerators_per_node=1, intra_node_bandwidth=4e11)
FABRIC = Fabric(name="50 GB/s", bandwidth=5e10, latency=5e-6)
ONE = Fleet(name="one accelerator", node=NODE1, count=1, fabric=FABRIC)
ONE_NODE = Fleet(name="one node", node=NODE8, count=1, fabric=FABRIC)
FOUR_NODES = Fleet(name="four nodes", node=NODE8, count=4, fabric=FABRIC)
# 1e9 parameters, 2e9 forward FLOPs per token, 10 layers, width 1024.
DENSE = Workload(name="dense 1B", kind="transformer", parameters=1e9, inference_flops=2e9,
                 layers=10, hidden_dim=1024)
# 8e9 parameters, 2e9 active, 8 experts, top-2.
SPARSE = Workload(name="moe 8B", kind="moe", parameters=8e9, active_parameters=2e9, experts=8,
                  active_experts_per_token=2, layers=10, hidden_dim=1024)


def _wl(name):
    return catalog.workload(name)


def _fl(name):
    return catalog.fleet(name)


def assert_outputs_equal(a, b, names=None):
    """Every output identical (NaN equal to NaN), shapes and dtypes included."""
    for name in names or solver.OUTPUTS:
        x, y = np.asarray(a[name]), np.asarray(b[name])
        assert x.shape == y.shape, name
        assert x.dtype == y.dtype, name
        if x.dtype == bool:
            assert np.array_equal(x, y), name
        else:
            assert np.array_equal(x, y, equal_nan=True), (name, x, y)


def open_mesh(*axes):
    """Each axis long on its own dimension, length 1 elsewhere (np.ix_ that keeps bools/strings)."""
    n = len(axes)
    return [np.asarray(a).reshape([-1 if i == j else 1 for j in range(n)]) for i, a in enumerate(axes)]


def flat(*arrays):
    """The points of broadcast arrays, as flat 1-D arrays (row-major)."""
    return [np.ravel(a) for a in np.broadcast_arrays(*arrays)]


# ------------------------------------------------------------------ hand values


def test_single_accelerator_hand_values():
    # batch 8, seq 1024, FP16, efficiency 0.5 on one accelerator (replica 1, dp 1):
    #   hardware FLOPs = 2e9 * 1024 * 3 * 8 = 4.9152e13; / (1e15 * 0.5) = 0.098304 s
    #   traffic = 2e9 * (1 + 0.1 * 8) = 3.6e9 B; / 2e12 = 1.8e-3 s
    #   overhead = 1e-5 + 10 * 1e-5 * 3 = 3.1e-4 s
    out = solver.solve(DENSE, ONE, batch_size=8, seq_len=1024)
    latency = 0.098304 + 3.1e-4
    assert out["valid"] and out["feasible"] and not out["idle_ranks"]
    assert out["dp_size"] == 1.0
    assert out["node_latency_compute"] == pytest.approx(0.098304, rel=RTOL)
    assert out["node_latency_memory"] == pytest.approx(1.8e-3, rel=RTOL)
    assert out["node_latency_overhead"] == pytest.approx(3.1e-4, rel=RTOL)
    assert out["node_latency"] == pytest.approx(latency, rel=RTOL)
    assert out["step_latency_total"] == pytest.approx(latency, rel=RTOL)
    assert out["node_throughput"] == pytest.approx(8 / latency, rel=RTOL)
    assert out["effective_throughput"] == pytest.approx(8 / latency, rel=RTOL)
    # MFU = HFU (no recomputation) = 4.9152e13 / latency / 1e15
    util = 4.9152e13 / latency / 1e15
    assert out["node_mfu"] == pytest.approx(util, rel=RTOL)
    assert out["node_hfu"] == pytest.approx(util, rel=RTOL)
    assert out["mfu"] == pytest.approx(util, rel=RTOL)
    # energy = 500 W * (0.3 + 0.7 * HFU) * 1 accelerator * latency
    assert out["node_energy"] == pytest.approx(500 * (0.3 + 0.7 * util) * latency, rel=RTOL)
    # memory: weights 2e9, gradients 2e9, Adam 12e9, activations 10 * 34 * 1024 * 8 * 1024 * 1,
    # bucket 5% of gradients, no pipeline buffer.
    act = 10 * 34 * 1024 * 8 * 1024
    assert out["memory_weights"] == pytest.approx(2e9, rel=RTOL)
    assert out["memory_gradients"] == pytest.approx(2e9, rel=RTOL)
    assert out["memory_optimizer_state"] == pytest.approx(12e9, rel=RTOL)
    assert out["memory_activations"] == pytest.approx(act, rel=RTOL)
    assert out["memory_communication_buffers"] == pytest.approx(1e8, rel=RTOL)
    assert out["memory_footprint"] == pytest.approx(16.1e9 + act, rel=RTOL)


def test_hfu_counts_recomputation():
    # Full recomputation: 4 passes instead of 3; activations keep 2 B, not 34 B.
    out = solver.solve(DENSE, ONE, batch_size=8, seq_len=1024, activation_recomputation=True)
    compute = 2e9 * 1024 * 4 * 8 / 5e14
    latency = compute + 3.1e-4
    assert out["node_latency_compute"] == pytest.approx(compute, rel=RTOL)
    assert out["node_hfu"] == pytest.approx(2e9 * 1024 * 4 * 8 / latency / 1e15, rel=RTOL)
    assert out["node_mfu"] == pytest.approx(2e9 * 1024 * 3 * 8 / latency / 1e15, rel=RTOL)
    assert out["memory_activations"] == pytest.approx(10 * 2 * 1024 * 8 * 1024, rel=RTOL)
    # power follows the hardware utilization: 500 W * (0.3 + 0.7 * HFU) * latency
    hfu = 2e9 * 1024 * 4 * 8 / latency / 1e15
    assert out["node_energy"] == pytest.approx(500 * (0.3 + 0.7 * hfu) * latency, rel=RTOL)


def test_dp_ring_inside_one_node_hand_value():
    # 8 ranks of one node, FP16 gradients 2e9 B: 2 * 7/8 * 2e9 / 4e11 + 2 * 7 * 1 us.
    out = solver.solve(DENSE, ONE_NODE, batch_size=32, seq_len=1024)
    assert out["dp_size"] == 8
    assert out["dp_communication_latency"] == pytest.approx(8.75e-3 + 14e-6, rel=RTOL)


def test_dp_hierarchical_hand_value():
    # 32 accelerators, TP 2: dp 16, 4 DP ranks per node, 4 nodes. Gradients 2e9 / 2 = 1e9 B.
    #   intra phase: 3/4 * 1e9 / 4e11 + 3 * 500 ns = 1.8765e-3
    #   inter phase: ring(2.5e8, 4 nodes, 5e10, 5 us) = 1.5 * 5e-3 + 6 * 5e-6 = 7.53e-3
    out = solver.solve(DENSE, FOUR_NODES, batch_size=32, seq_len=1024, tp_size=2)
    assert out["dp_size"] == 16
    assert out["dp_communication_latency"] == pytest.approx(2 * 1.8765e-3 + 7.53e-3, rel=RTOL)


def test_dp_ring_over_fabric_hand_value():
    # TP 8 fills a node: one DP rank per node, a flat ring of 4 over the fabric.
    # Gradients 2e9 / 8 = 2.5e8 B: 2 * 3/4 * 2.5e8 / 5e10 + 2 * 3 * 5 us = 7.53e-3.
    out = solver.solve(DENSE, FOUR_NODES, batch_size=32, seq_len=1024, tp_size=8)
    assert out["dp_size"] == 4
    assert out["dp_communication_latency"] == pytest.approx(7.53e-3, rel=RTOL)


def test_dp_catalog_hand_value():
    # Llama-3 70B on 1024 H100 over IB HDR (25 GB/s, 7 us), TP 8 x PP 8: dp 16, one rank
    # per node. Gradients 70.6e9 * 2 / 64 = 2.20625e9 B:
    # 2 * 15/16 * 2.20625e9 / 25e9 + 2 * 15 * 7e-6 = 0.16546875 + 2.1e-4.
    out = solver.solve(_wl("Llama3_70B"), _fl("Training_1K"), batch_size=1024, tp_size=8, pp_size=8)
    assert out["dp_size"] == 16
    assert out["dp_communication_latency"] == pytest.approx(0.16546875 + 2.1e-4, rel=RTOL)


def test_tp_hand_value():
    # TP 2 inside a node, local batch 32/16 = 2: activations 2 * 1024 * 1024 * 2 B = 4,194,304 B.
    # ring(n=2) = 4194304 / 4e11 + 2 * 1 us = 1.248576e-5 s; x 4 all-reduces x 10 layers.
    out = solver.solve(DENSE, FOUR_NODES, batch_size=32, seq_len=1024, tp_size=2)
    assert out["tp_communication_latency"] == pytest.approx(1.248576e-5 * 40, rel=RTOL)


def test_tp_over_fabric_when_group_exceeds_node():
    # TP 16 spans two nodes: the ring runs over the fabric (5e10, 5 us). Local batch 32/2 = 16:
    # activations 16 * 1024 * 1024 * 2 = 33,554,432 B; 2 * 15/16 * 33554432 / 5e10 + 30 * 5 us.
    out = solver.solve(DENSE, FOUR_NODES, batch_size=32, seq_len=1024, tp_size=16)
    one = 2 * 15 / 16 * 33_554_432 / 5e10 + 30 * 5e-6
    assert out["tp_communication_latency"] == pytest.approx(one * 40, rel=RTOL)


def test_tp_group_filling_a_node_stays_on_nvlink():
    # TP 8 = the node: NVLink (4e11, 1 us). dp 4, local batch 8: 8 * 1024 * 1024 * 2 = 16,777,216 B;
    # 2 * 7/8 * 16777216 / 4e11 + 14 * 1 us = 8.740032e-5 s; x 4 x 10 layers.
    out = solver.solve(DENSE, FOUR_NODES, batch_size=32, seq_len=1024, tp_size=8)
    assert out["tp_communication_latency"] == pytest.approx(8.740032e-5 * 40, rel=RTOL)


def test_tp_counts_the_layers_of_the_first_stage():
    # 10 layers over PP 4: the fullest stage holds ceil(10/4) = 3. TP 2, dp 4, local batch 8:
    # 16,777,216 B over 2 ranks: 16777216 / 4e11 + 2 us = 4.394304e-5 s; x 4 x 3.
    out = solver.solve(DENSE, FOUR_NODES, batch_size=32, seq_len=1024, tp_size=2, pp_size=4)
    assert out["tp_communication_latency"] == pytest.approx(4.394304e-5 * 12, rel=RTOL)


def test_lora_all_reduces_one_percent_of_the_gradients():
    # 8 ranks in one node, 1% of 2e9 B: 2 * 7/8 * 2e7 / 4e11 + 14 * 1 us = 1.015e-4 s.
    out = solver.solve(DENSE, ONE_NODE, batch_size=32, seq_len=1024, is_lora=np.array([False, True]))
    np.testing.assert_allclose(out["dp_communication_latency"], [8.764e-3, 1.015e-4], rtol=RTOL)


@pytest.mark.parametrize("imbalance", [1.0, 1.5])
def test_ep_hand_value(imbalance):
    # EP 4 on 32 accelerators: dp 8, local batch 32/8 = 4, top-2 routing.
    # tokens bytes 4 * 1024 * 1024 * 2 B * 2 = 16,777,216 (x imbalance);
    # all-to-all over the fabric: 3/4 * bytes / 5e10 + 3 * 5 us.
    out = solver.solve(SPARSE, FOUR_NODES, batch_size=32, seq_len=1024, ep_size=4,
                       moe_routing_imbalance_factor=imbalance)
    expected = 0.75 * 16_777_216 * imbalance / 5e10 + 15e-6
    assert out["ep_communication_latency"] == pytest.approx(expected, rel=RTOL)


def test_bubble_hand_value():
    # PP 2, 4 microbatches, v 1: fraction 1/5, bubble = latency * 1/4.
    out = solver.solve(DENSE, ONE_NODE, batch_size=32, seq_len=1024, pp_size=2, microbatch_count=4)
    assert out["bubble_fraction"] == pytest.approx(0.2, rel=RTOL)
    assert out["pipeline_bubble_latency"] == pytest.approx(out["node_latency"] / 4, rel=RTOL)
    out = solver.solve(DENSE, ONE_NODE, batch_size=32, seq_len=1024, pp_size=4, microbatch_count=4,
                       v_stages=2)
    # (4-1) / (2*4 + 3) = 3/11; bubble = latency * 3/8
    assert out["bubble_fraction"] == pytest.approx(3 / 11, rel=RTOL)
    assert out["pipeline_bubble_latency"] == pytest.approx(out["node_latency"] * 3 / 8, rel=RTOL)


# ------------------------------------------------------------------ analytic limits


@pytest.mark.parametrize("workload", [DENSE, SPARSE, _wl("ResNet50"), _wl("Mamba_130M")],
                         ids=lambda w: w.name)
def test_one_accelerator_has_no_communication(workload):
    out = solver.solve(workload, ONE, batch_size=np.array([1, 8, 64]), precision="bf16",
                       zero_stage=np.array([[0], [3]]), overlap_comm=True, congestion_factor=3.0)
    for name in ("dp_communication_latency", "tp_communication_latency", "ep_communication_latency",
                 "communication_latency", "pipeline_bubble_latency", "bubble_fraction"):
        np.testing.assert_array_equal(out[name], 0.0)
    np.testing.assert_array_equal(out["scaling_efficiency"], 1.0)
    np.testing.assert_array_equal(out["dp_size"], 1.0)
    np.testing.assert_array_equal(out["step_latency_total"], out["node_latency"])
    np.testing.assert_array_equal(out["effective_throughput"], out["node_throughput"])
    np.testing.assert_array_equal(out["mfu"], out["node_mfu"])


def test_one_accelerator_throughput_is_batch_over_latency():
    batch = np.array([1, 8, 64])
    out = solver.solve(DENSE, ONE, batch_size=batch, seq_len=1024)
    np.testing.assert_allclose(out["node_throughput"] * out["node_latency"], batch, rtol=RTOL)


def test_pp_one_has_no_bubble():
    out = solver.solve(_wl("Llama3_70B"), _fl("Training_1K"), batch_size=1024, tp_size=8,
                       pp_size=1, microbatch_count=np.array([1, 4, 32]).reshape(3, 1),
                       v_stages=np.array([1, 2, 4]))
    assert out["bubble_fraction"].shape == (3, 3)
    np.testing.assert_array_equal(out["bubble_fraction"], 0.0)
    np.testing.assert_array_equal(out["pipeline_bubble_latency"], 0.0)
    # and with a pipeline there is one
    out = solver.solve(_wl("Llama3_70B"), _fl("Training_1K"), batch_size=1024, tp_size=8, pp_size=4,
                       microbatch_count=8)
    assert out["pipeline_bubble_latency"] > 0
    assert out["bubble_fraction"] == pytest.approx(3 / 11, rel=RTOL)


@pytest.mark.parametrize("fleet, tp, pp, ep", [
    ("Lab_64_H100", 8, 8, 1),
    ("Lab_64_H100", 64, 1, 1),
    ("Training_1K", 8, 128, 1),
])
def test_dp_one_has_no_dp_communication(fleet, tp, pp, ep):
    out = solver.solve(_wl("Llama3_70B"), _fl(fleet), batch_size=64, tp_size=tp, pp_size=pp,
                       ep_size=ep, zero_stage=np.array([0, 1, 2, 3]), congestion_factor=2.0)
    np.testing.assert_array_equal(out["dp_size"], 1.0)
    np.testing.assert_array_equal(out["dp_communication_latency"], 0.0)
    # ZeRO shards over dp: with dp = 1 every stage holds the same state.
    for name in ("memory_weights", "memory_gradients", "memory_optimizer_state", "memory_footprint"):
        np.testing.assert_array_equal(out[name], out[name][0])


def test_dp_one_sparse_ep_fills_fleet():
    out = solver.solve(SPARSE, ONE_NODE, batch_size=8, seq_len=1024, ep_size=8)
    assert out["dp_size"] == 1.0
    assert out["dp_communication_latency"] == 0.0
    assert out["ep_communication_latency"] > 0.0


GRID = dict(batch_size=1024, tp_size=np.array([1, 2, 4, 8]).reshape(4, 1),
            pp_size=np.array([1, 2, 4]), microbatch_count=8)


def test_overlap_efficiency_one_hides_all_dp():
    wl, fl = _wl("Llama3_70B"), _fl("Training_1K")
    base = solver.solve(wl, fl, **GRID)
    hidden = solver.solve(wl, fl, overlap_comm=True, overlap_efficiency=1.0, **GRID)
    assert np.all(base["dp_communication_latency"] > 0)
    expected = (hidden["node_latency"] + hidden["tp_communication_latency"]
                + hidden["ep_communication_latency"] + hidden["pipeline_bubble_latency"])
    np.testing.assert_allclose(hidden["step_latency_total"], expected, rtol=RTOL)
    np.testing.assert_allclose(hidden["step_latency_total"],
                               base["step_latency_total"] - base["dp_communication_latency"], rtol=1e-9)
    # the DP term is still reported (it is hidden, not removed)
    np.testing.assert_array_equal(hidden["dp_communication_latency"], base["dp_communication_latency"])
    np.testing.assert_array_equal(hidden["communication_latency"], base["communication_latency"])


def test_overlap_partial_and_off():
    wl, fl = _wl("Llama3_70B"), _fl("Training_1K")
    base = solver.solve(wl, fl, **GRID)
    off = solver.solve(wl, fl, overlap_comm=False, overlap_efficiency=1.0, **GRID)
    assert_outputs_equal(base, off)
    none = solver.solve(wl, fl, overlap_comm=True, overlap_efficiency=0.0, **GRID)
    np.testing.assert_allclose(none["step_latency_total"], base["step_latency_total"], rtol=RTOL)
    part = solver.solve(wl, fl, overlap_comm=True, overlap_efficiency=0.85, **GRID)
    np.testing.assert_allclose(part["step_latency_total"],
                               base["step_latency_total"] - 0.85 * base["dp_communication_latency"],
                               rtol=1e-9)


@pytest.mark.parametrize("factor", [1.0, 1.1, 2.0, 3.7])
def test_straggler_multiplies_step_time(factor):
    wl, fl = _wl("Mixtral_8x7B"), _fl("Training_1K")
    knobs = dict(batch_size=512, tp_size=np.array([1, 2, 8]).reshape(3, 1), ep_size=np.array([1, 4, 8]),
                 pp_size=2, microbatch_count=4, overlap_comm=True)
    base = solver.solve(wl, fl, **knobs)
    slow = solver.solve(wl, fl, straggler_factor=factor, **knobs)
    np.testing.assert_allclose(slow["step_latency_total"], factor * base["step_latency_total"], rtol=1e-15)
    np.testing.assert_allclose(slow["scaling_efficiency"], base["scaling_efficiency"] / factor, rtol=1e-14)
    np.testing.assert_allclose(slow["effective_throughput"], base["effective_throughput"] / factor,
                               rtol=1e-14)
    changed = {"step_latency_total", "scaling_efficiency", "effective_throughput", "mfu"}
    assert_outputs_equal(base, slow, [n for n in solver.OUTPUTS if n not in changed])


@pytest.mark.parametrize("factor", [1.0, 1.25, 4.0])
def test_congestion_multiplies_each_comm_term(factor):
    wl, fl = _wl("Mixtral_8x7B"), _fl("Training_1K")
    knobs = dict(batch_size=512, tp_size=2, pp_size=2, ep_size=4, gradient_accumulation_steps=2)
    base = solver.solve(wl, fl, **knobs)
    hot = solver.solve(wl, fl, congestion_factor=factor, **knobs)
    terms = ("dp_communication_latency", "tp_communication_latency", "ep_communication_latency")
    for name in terms:
        assert base[name] > 0, name
        assert hot[name] == pytest.approx(factor * base[name], rel=1e-15), name
    assert hot["communication_latency"] == pytest.approx(factor * base["communication_latency"], rel=1e-14)
    extra = (factor - 1) * sum(base[name] for name in terms)
    assert hot["step_latency_total"] == pytest.approx(base["step_latency_total"] + extra, rel=1e-12)
    for name in ("node_latency", "pipeline_bubble_latency", "memory_footprint"):
        assert hot[name] == base[name]


@pytest.mark.parametrize("steps", [2, 4, 16])
def test_gradient_accumulation_divides_dp_term(steps):
    wl, fl = _wl("Llama3_70B"), _fl("Training_1K")
    base = solver.solve(wl, fl, **GRID)
    acc = solver.solve(wl, fl, gradient_accumulation_steps=steps, **GRID)
    np.testing.assert_allclose(acc["dp_communication_latency"] * steps, base["dp_communication_latency"],
                               rtol=1e-15)
    for name in ("tp_communication_latency", "ep_communication_latency", "node_latency"):
        np.testing.assert_array_equal(acc[name], base[name])


def test_halving_efficiency_doubles_compute_time():
    wl, fl = _wl("Llama3_70B"), _fl("Training_1K")
    full = solver.solve(wl, fl, efficiency=0.5, **GRID)
    half = solver.solve(wl, fl, efficiency=0.25, **GRID)
    np.testing.assert_allclose(half["node_latency_compute"], 2 * full["node_latency_compute"], rtol=1e-15)
    np.testing.assert_array_equal(half["node_latency_memory"], full["node_latency_memory"])
    # where compute bound (some small-TP points spill to the host link and are not),
    # the step minus its fixed taxes doubles as well
    bound = full["node_latency_compute"] > full["node_latency_memory"]
    assert bound.sum() >= 2 and not bound.all()
    np.testing.assert_allclose((half["node_latency"] - half["node_latency_overhead"])[bound],
                               2 * (full["node_latency"] - full["node_latency_overhead"])[bound],
                               rtol=1e-12)
    # by hand on the round accelerator: 0.098304 s at 0.5 -> 0.196608 s at 0.25
    one = solver.solve(DENSE, ONE, batch_size=8, seq_len=1024, efficiency=0.25)
    assert one["node_latency"] == pytest.approx(0.196608 + 3.1e-4, rel=RTOL)


def test_efficiency_one_gives_peak_compute_time():
    # efficiency 1: 2e9 * 1024 * 3 * 8 / 1e15 = 0.049152 s
    out = solver.solve(DENSE, ONE, batch_size=8, seq_len=1024, efficiency=1.0)
    assert out["node_latency_compute"] == pytest.approx(0.049152, rel=RTOL)


MIXED = dict(batch_size=np.array([64, 1024]).reshape(2, 1, 1, 1),
             tp_size=np.array([1, 2, 8]).reshape(1, 3, 1, 1),
             zero_stage=np.array([0, 1, 2, 3]).reshape(1, 1, 4, 1),
             is_lora=np.array([False, True]).reshape(1, 1, 1, 2),
             pp_size=2, microbatch_count=4, overlap_comm=True, straggler_factor=1.2,
             congestion_factor=1.3)


@pytest.mark.parametrize("workload", ["Llama3_70B", "Mixtral_8x7B", "GPT2", "ResNet50",
                                      "Mamba_130M", "StableDiffusion_v1_5", "DLRM"])
def test_identities(workload):
    wl, fl = _wl(workload), _fl("Lab_64_H100")
    out = solver.solve(wl, fl, **MIXED)
    # the memory breakdown sums to the footprint
    parts = sum(out[n] for n in ("memory_weights", "memory_gradients", "memory_optimizer_state",
                                 "memory_activations", "memory_communication_buffers"))
    np.testing.assert_allclose(parts, out["memory_footprint"], rtol=1e-12)
    np.testing.assert_array_equal(out["feasible"], out["memory_footprint"] <= 80 * 2**30)
    np.testing.assert_allclose(out["mfu"], out["node_mfu"] * out["scaling_efficiency"], rtol=1e-14)
    np.testing.assert_allclose(out["effective_throughput"],
                               out["dp_size"] * out["node_throughput"] * out["scaling_efficiency"],
                               rtol=1e-14)
    np.testing.assert_allclose(out["scaling_efficiency"], out["node_latency"] / out["step_latency_total"],
                               rtol=1e-14)
    np.testing.assert_allclose(out["communication_latency"],
                               out["dp_communication_latency"] + out["tp_communication_latency"]
                               + out["ep_communication_latency"], rtol=1e-14)
    np.testing.assert_allclose(out["dp_size"], 64 / np.array([1, 2, 8]).reshape(1, 3, 1, 1) / 2
                               + np.zeros(out["dp_size"].shape), rtol=0)
    assert np.all(out["scaling_efficiency"] > 0) and np.all(out["scaling_efficiency"] <= 1)
    assert np.all((out["node_mfu"] >= 0) & (out["node_mfu"] <= out["node_hfu"]) & (out["node_hfu"] <= 1))


# ------------------------------------------------------------------ invalid splits


@pytest.mark.parametrize("knobs", [
    dict(tp_size=3),
    dict(tp_size=8, pp_size=3),
    dict(ep_size=5),
    dict(tp_size=8, pp_size=16, ep_size=16),   # 2048 > 1024
    dict(tp_size=2048),
    dict(pp_size=1536),                          # 1536 > 1024
])
def test_invalid_split_is_nan_not_raised(knobs):
    out = solver.solve(_wl("Llama3_70B"), _fl("Training_1K"), batch_size=1024, **knobs)
    assert set(out) == set(solver.OUTPUTS)
    assert out["valid"].dtype == bool and not out["valid"]
    for name in BOOL_OUTPUTS:
        assert out[name].dtype == bool and out[name].shape == () and not out[name], name
    for name in FLOAT_OUTPUTS:
        assert out[name].dtype == np.float64, name
        assert out[name].shape == () and np.isnan(out[name]), name


@pytest.mark.parametrize("tp", [3, 5, 64])
def test_invalid_split_bools_are_false_even_where_priced_true(tp):
    # A small model on 32 accelerators with a batch of 8: any valid split with dp > 8 is
    # feasible and has idle ranks, so False here must come from the split, not the pricing.
    valid = solver.solve(DENSE, FOUR_NODES, batch_size=8, seq_len=1024, tp_size=np.array([1, 2]))
    assert valid["feasible"].all() and valid["idle_ranks"].all()
    out = solver.solve(DENSE, FOUR_NODES, batch_size=8, seq_len=1024, tp_size=np.array([1, tp, 2]))
    np.testing.assert_array_equal(out["valid"], [True, False, True])
    np.testing.assert_array_equal(out["feasible"], [True, False, True])
    np.testing.assert_array_equal(out["idle_ranks"], [True, False, True])
    for name in FLOAT_OUTPUTS:
        np.testing.assert_array_equal(np.isnan(out[name]), [False, True, False], err_msg=name)


def test_invalid_points_in_an_array_are_nan_only_there():
    wl, fl = _wl("Llama3_70B"), _fl("Training_1K")
    tp = np.array([1, 2, 3, 4, 5, 6, 7, 8, 16, 2048])
    valid = np.array([1024 % t == 0 for t in tp])   # by hand: 3, 5, 6, 7 and 2048 do not fit
    np.testing.assert_array_equal(valid, [1, 1, 0, 1, 0, 0, 0, 1, 1, 0])
    out = solver.solve(wl, fl, batch_size=2048, tp_size=tp, pp_size=np.array([[1], [2]]))
    assert out["valid"].shape == (2, 10)
    np.testing.assert_array_equal(out["valid"], np.broadcast_to(valid, (2, 10)))
    for name in FLOAT_OUTPUTS:
        np.testing.assert_array_equal(np.isnan(out[name]), np.broadcast_to(~valid, (2, 10)), err_msg=name)
    for name in ("feasible", "idle_ranks"):
        assert not out[name][:, ~valid].any()
    # the valid points are priced as if solved alone
    for i, pp in enumerate((1, 2)):
        for j in np.flatnonzero(valid):
            alone = solver.solve(wl, fl, batch_size=2048, tp_size=int(tp[j]), pp_size=pp)
            assert_outputs_equal({n: out[n][i, j] for n in out}, alone)



def test_masking_leaves_the_input_arrays_alone():
    # The invalid mask is applied in place to the priced outputs: never to the knobs.
    wl, fl = _wl("Mixtral_8x7B"), _fl("Training_1K")
    rng = np.random.default_rng(5)
    knobs = dict(tp_size=rng.choice([1, 2, 3, 8], 500), ep_size=rng.choice([1, 5, 8], 500),
                 efficiency=rng.uniform(0.2, 1.0, 500), overlap_efficiency=rng.uniform(0, 1, 500),
                 congestion_factor=rng.uniform(1, 2, 500), batch_size=rng.integers(1, 4096, 500))
    before = {k: v.copy() for k, v in knobs.items()}
    out = solver.solve(wl, fl, **knobs)
    assert out["valid"].any() and not out["valid"].all()
    for name, value in knobs.items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)


# ------------------------------------------------------------------ physics dispatch


def test_physics_default_is_mlsysim():
    wl, fl = _wl("Llama3_70B"), _fl("Training_1K")
    knobs = dict(batch_size=1024, tp_size=np.array([1, 3, 8]), pp_size=4, microbatch_count=8)
    assert_outputs_equal(solver.solve(wl, fl, **knobs),
                         solver.solve(wl, fl, physics="mlsysim", **knobs))
    assert_outputs_equal(solver.solve(wl, fl, **knobs), solver.physics.mlsysim.solve(wl, fl, **knobs))
    assert solver.physics.model("mlsysim") is solver.physics.mlsysim
    assert set(solver.physics.mlsysim.OUTPUTS) == set(solver.OUTPUTS)


@pytest.mark.parametrize("name, closest", [("mlsysm", "mlsysim"), ("MLSYSIM", "mlsysim"),
                                           ("", "mlsysim"), (None, "mlsysim")])
def test_unknown_physics_is_value_error_naming_choices_and_closest(name, closest):
    with pytest.raises(ValueError, match=rf"physics must be one of 'megatron', 'mlsysim'.*closest is '{closest}'"):
        solver.solve(_wl("Llama3_70B"), _fl("Training_1K"), physics=name)


def test_output_tuple_view_is_deprecated():
    entry = solver.OUTPUTS["mfu"]
    with pytest.warns(DeprecationWarning, match="units"):
        units, long_name = entry
    assert (units, long_name) == (entry.units, entry.long_name)
    with pytest.warns(DeprecationWarning):
        assert solver.OUTPUTS["valid"][1] == solver.OUTPUTS["valid"].long_name
    with pytest.raises(IndexError):
        entry[2]


# ------------------------------------------------------------------ broadcasting


MESH_AXES = dict(
    tp_size=np.array([1, 2, 3, 8]),
    pp_size=np.array([1, 4]),
    precision=np.array(["fp16", "BF16", "fp8", "fp32"]),
    zero_stage=np.array([0, 3]),
    is_lora=np.array([False, True]),
    overlap_comm=np.array([True, False]),
    batch_size=np.array([8, 1024]),
    activation_recomputation=np.array([False, True]),
)


@pytest.mark.parametrize("workload, fleet", [
    ("Llama3_70B", "Training_1K"), ("Mixtral_8x7B", "Lab_64_H100"), ("ResNet50", "Research_256"),
])
def test_open_mesh_equals_flat(workload, fleet):
    wl, fl = _wl(workload), _fl(fleet)
    names = list(MESH_AXES)
    mesh = open_mesh(*MESH_AXES.values())
    fixed = dict(microbatch_count=8, ep_size=1, overlap_efficiency=0.7, seq_len=4096)
    grid = solver.solve(wl, fl, **dict(zip(names, mesh)), **fixed)
    shape = tuple(len(v) for v in MESH_AXES.values())
    assert grid["valid"].shape == shape
    points = solver.solve(wl, fl, **dict(zip(names, flat(*mesh))), **fixed)
    assert points["valid"].shape == (int(np.prod(shape)),)
    assert_outputs_equal(grid, {n: v.reshape(shape) for n, v in points.items()})
    # the grid has invalid points (tp 3) and valid ones
    assert grid["valid"].any() and not grid["valid"].all()


def test_open_mesh_equals_point_by_point():
    wl, fl = _wl("Llama3_8B"), _fl("Lab_64_H100")
    axes = dict(tp_size=[1, 4], precision=np.array(["fp16", "fp8"]), is_lora=[False, True],
                zero_stage=[1, 2], congestion_factor=[1.0, 2.5])
    mesh = open_mesh(*axes.values())
    grid = solver.solve(wl, fl, batch_size=256, pp_size=2, microbatch_count=4, **dict(zip(axes, mesh)))
    for index in np.ndindex(grid["valid"].shape):
        point = {name: np.asarray(values)[i].item() for (name, values), i in zip(axes.items(), index)}
        alone = solver.solve(wl, fl, batch_size=256, pp_size=2, microbatch_count=4, **point)
        assert_outputs_equal({n: v[index] for n, v in grid.items()}, alone)


KNOB_VALUES = dict(
    batch_size=[1, 7, 64, 1000, 4096],
    precision=["fp32", "tf32", "bf16", "FP16", "fp8", "int8", "int4"],
    efficiency=[0.1, 0.35, 0.5, 1.0],
    tp_size=[1, 2, 3, 4, 8, 16],
    pp_size=[1, 2, 4, 5],
    ep_size=[1, 2, 8],
    v_stages=[1, 2, 3],
    microbatch_count=[1, 3, 8, 32],
    zero_stage=[0, 1, 2, 3],
    is_lora=[False, True],
    activation_recomputation=[False, True],
    overlap_comm=[False, True],
    overlap_efficiency=[0.0, 0.5, 1.0],
    congestion_factor=[1.0, 1.7],
    straggler_factor=[1.0, 1.3],
    moe_routing_imbalance_factor=[1.0, 2.0],
    gradient_accumulation_steps=[1, 2, 8],
    seq_len=[128, 2048, 8192],
)
PROPERTY_CASES = [
    (_wl("Llama3_70B"), _fl("Training_1K")),
    (_wl("Mixtral_8x7B"), _fl("Lab_64_H100")),
    (_wl("ResNet50"), _fl("Research_256")),
    (_wl("Mamba_130M"), FOUR_NODES),
    (SPARSE, FOUR_NODES),
    (DENSE, ONE),
]


@st.composite
def meshes(draw):
    names = draw(st.lists(st.sampled_from(sorted(KNOB_VALUES)), min_size=2, max_size=6, unique=True))
    axes = {}
    for name in names:
        values = draw(st.lists(st.sampled_from(KNOB_VALUES[name]), min_size=1, max_size=3))
        axes[name] = np.array(values)
    scalars = {}
    for name in draw(st.lists(st.sampled_from(sorted(set(KNOB_VALUES) - set(names))), max_size=3,
                              unique=True)):
        scalars[name] = draw(st.sampled_from(KNOB_VALUES[name]))
    lead = draw(st.integers(0, 1))  # an extra leading length-1 dimension on some knobs
    return axes, scalars, lead


@settings(max_examples=60, deadline=None)
@given(case=st.sampled_from(range(len(PROPERTY_CASES))), mesh=meshes())
def test_random_meshes_equal_flat(case, mesh):
    wl, fl = PROPERTY_CASES[case]
    axes, scalars, lead = mesh
    arrays = open_mesh(*axes.values())
    if lead:
        arrays = [a[np.newaxis] if i % 2 else a for i, a in enumerate(arrays)]
    grid = solver.solve(wl, fl, **dict(zip(axes, arrays)), **scalars)
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    for name in solver.OUTPUTS:
        assert grid[name].shape == shape
    points = solver.solve(wl, fl, **dict(zip(axes, flat(*arrays))), **scalars)
    assert_outputs_equal(grid, {n: v.reshape(shape) for n, v in points.items()})


def _random_points(n, seed):
    rng = np.random.default_rng(seed)
    return {name: rng.choice(np.array(values), size=n) for name, values in KNOB_VALUES.items()
            if name not in ("efficiency",)}


@pytest.fixture
def small_chunks(monkeypatch):
    """Shrink BLOCK_POINTS so the blocked path runs on small inputs; count the blocks solved."""
    import solver.blocks
    import solver.physics.mlsysim as model
    calls = []
    inner = model.price

    def counting(*args, **kwargs):
        calls.append(args[-1])  # the block's shape
        return inner(*args, **kwargs)

    monkeypatch.setattr(model, "price", counting)

    def set_size(size):
        monkeypatch.setattr(solver.blocks, "BLOCK_POINTS", size)
        calls.clear()
        return calls
    return set_size


@pytest.mark.parametrize("chunk", [100, 997, 4096])
def test_large_flat_input_equals_small_slices(small_chunks, chunk):
    n = 2 * chunk + 4321
    wl, fl = _wl("Mixtral_8x7B"), _fl("Training_1K")
    points = _random_points(n, seed=chunk)
    calls = small_chunks(chunk)
    big = solver.solve(wl, fl, efficiency=0.4, engine="numpy", **points)  # blocks: numpy path
    assert len(calls) >= 3 and sum(c[0] for c in calls) == n     # it was cut into blocks
    assert big["valid"].shape == (n,)
    assert big["valid"].any() and not big["valid"].all()
    step = 1234                                                     # slices unrelated to the blocks
    for lo in range(0, n, step):
        part = solver.solve(wl, fl, efficiency=0.4, **{k: v[lo:lo + step] for k, v in points.items()})
        assert_outputs_equal({k: v[lo:lo + step] for k, v in big.items()}, part)


def test_large_mesh_equals_small_slices(small_chunks):
    # The longest axis is the last one and only batch_size is long there; the other knobs
    # are open-mesh axes of lower rank (so solve must slice only the knobs long on that axis).
    wl, fl = _wl("Llama3_70B"), _fl("Training_1K")
    batch = np.arange(1, 400) * 4
    knobs = dict(tp_size=np.array([1, 2, 3, 8]).reshape(4, 1, 1),
                 precision=np.array(["fp8", "bf16"]).reshape(2, 1),
                 zero_stage=np.array([[0], [3]]),
                 is_lora=np.array([False, True, False]).reshape(3, 1, 1, 1),
                 batch_size=batch, pp_size=4, microbatch_count=8)
    shape = (3, 4, 2, len(batch))
    calls = small_chunks(1000)
    big = solver.solve(wl, fl, **knobs)
    assert len(calls) > 1 and all(c[:3] == shape[:3] for c in calls)
    assert big["valid"].shape == shape
    for lo in range(0, len(batch), 70):
        part = solver.solve(wl, fl, **{**knobs, "batch_size": batch[lo:lo + 70]})
        assert_outputs_equal({k: v[..., lo:lo + 70] for k, v in big.items()}, part)
    # and along a short axis, through precision: each slice alone
    for i, p in enumerate(["fp8", "bf16"]):
        part = solver.solve(wl, fl, **{**knobs, "precision": p, "zero_stage": np.array([0, 3])[i]})
        assert_outputs_equal({k: v[:, :, i:i + 1] for k, v in big.items()}, part)


def test_blocks_along_a_middle_axis(small_chunks):
    # longest axis in the middle, precision (codes) long on it
    wl, fl = _wl("Mixtral_8x7B"), _fl("Lab_64_H100")
    names = np.array(["fp16", "fp8", "bf16", "int8", "fp32"] * 40)
    knobs = dict(tp_size=np.array([1, 2, 8]).reshape(3, 1, 1), precision=names.reshape(200, 1),
                 ep_size=np.array([1, 4, 8, 3]), batch_size=512)
    calls = small_chunks(300)
    big = solver.solve(wl, fl, **knobs)
    assert len(calls) > 1 and big["valid"].shape == (3, 200, 4)
    for i in (0, 1, 57, 199):
        part = solver.solve(wl, fl, **{**knobs, "precision": names[i]})
        assert_outputs_equal({k: v[:, i] for k, v in big.items()}, {k: v[:, 0] for k, v in part.items()})


def test_real_chunk_size_input_equals_slices():
    # Over 2 * BLOCK_POINTS points at the real block size (two varying knobs keep it cheap).
    wl, fl = _wl("Llama3_8B"), _fl("Training_1K")
    n = 2 * BLOCK_POINTS + 77
    rng = np.random.default_rng(3)
    tp = rng.choice(np.array([1, 2, 3, 8]), size=n)
    batch = rng.integers(1, 5000, size=n)
    big = solver.solve(wl, fl, tp_size=tp, batch_size=batch)
    assert big["step_latency_total"].shape == (n,)
    for lo in (0, BLOCK_POINTS - 50, n - 500):
        part = solver.solve(wl, fl, tp_size=tp[lo:lo + 500], batch_size=batch[lo:lo + 500])
        assert_outputs_equal({k: v[lo:lo + 500] for k, v in big.items()}, part)


# ------------------------------------------------------------------ shapes and dtypes


def test_scalars_give_zero_d_arrays():
    out = solver.solve(_wl("Llama3_70B"), _fl("Training_1K"), batch_size=1024, tp_size=8)
    assert set(out) == set(solver.OUTPUTS)
    for name, value in out.items():
        assert isinstance(value, np.ndarray), name
        assert value.shape == (), name
        assert value.dtype == (bool if name in BOOL_OUTPUTS else np.float64), name


def test_output_shapes_are_the_broadcast_shape():
    out = solver.solve(_wl("Mixtral_8x7B"), _fl("Training_1K"),
                       batch_size=np.array([256, 1024]).reshape(2, 1, 1),
                       tp_size=np.array([1, 2, 4]).reshape(1, 3, 1),
                       ep_size=np.array([1, 8, 3, 4, 2]),
                       is_lora=np.array([[False], [True], [False]]),
                       precision=np.array(["fp16", "fp8", "bf16", "int8", "fp32"]))
    for name, value in out.items():
        assert value.shape == (2, 3, 5), name
        assert value.dtype == (bool if name in BOOL_OUTPUTS else np.float64), name


def test_lists_are_accepted_like_arrays():
    wl, fl = _wl("Llama3_70B"), _fl("Training_1K")
    a = solver.solve(wl, fl, batch_size=1024, tp_size=[1, 2, 4, 8], precision=["fp16", "fp8", "bf16", "fp16"])
    b = solver.solve(wl, fl, batch_size=1024, tp_size=np.array([1, 2, 4, 8]),
                     precision=np.array(["fp16", "fp8", "bf16", "fp16"]))
    assert_outputs_equal(a, b)


# ------------------------------------------------------------------ precision


@pytest.mark.parametrize("upper, lower", [("FP16", "fp16"), ("Bf16", "bf16"), ("INT4", "int4"),
                                          ("TF32", "tf32")])
def test_precision_case_insensitive(upper, lower):
    wl, fl = _wl("Llama3_70B"), _fl("Training_1K")
    knobs = dict(batch_size=1024, tp_size=np.array([1, 8]), pp_size=4, microbatch_count=8)
    assert_outputs_equal(solver.solve(wl, fl, precision=upper, **knobs),
                         solver.solve(wl, fl, precision=lower, **knobs))


@pytest.mark.parametrize("workload", ["Llama3_70B", "Mixtral_8x7B", "ResNet50", "DLRM"])
def test_mixed_precision_array_equals_each_alone(workload):
    wl, fl = _wl(workload), _fl("Lab_64_H100")
    names = ["fp32", "tf32", "bf16", "FP16", "fp8", "int8", "int4", "fp16"]
    precision = np.array(names).reshape(-1, 1)
    knobs = dict(batch_size=256, tp_size=np.array([1, 2, 8]), zero_stage=1)
    mixed = solver.solve(wl, fl, precision=precision, **knobs)
    assert mixed["valid"].shape == (8, 3)
    for i, p in enumerate(names):
        assert_outputs_equal({k: v[i] for k, v in mixed.items()}, solver.solve(wl, fl, precision=p, **knobs))


def test_precision_bytes_scale_weights():
    # Dense 1e9 params on one accelerator: weights 4, 2, 1, 0.5 bytes per parameter.
    out = solver.solve(DENSE, ONE, precision=np.array(["fp32", "bf16", "fp8", "int4"]))
    np.testing.assert_allclose(out["memory_weights"], [4e9, 2e9, 1e9, 5e8], rtol=RTOL)
    np.testing.assert_allclose(out["memory_optimizer_state"], 12e9, rtol=RTOL)


# ------------------------------------------------------------------ idle ranks


def test_idle_ranks_exactly_where_batch_below_dp():
    wl, fl = _wl("Llama3_8B"), _fl("Lab_64_H100")
    batch = np.array([1, 7, 8, 9, 31, 32, 33, 63, 64, 65, 1000]).reshape(-1, 1)
    tp = np.array([1, 2, 8, 64])
    dp = 64 // tp  # 64, 32, 8, 1
    out = solver.solve(wl, fl, batch_size=batch, tp_size=tp)
    np.testing.assert_array_equal(out["dp_size"], np.broadcast_to(dp, out["dp_size"].shape))
    np.testing.assert_array_equal(out["idle_ranks"], batch < dp)
    assert out["idle_ranks"].any() and not out["idle_ranks"].all()
    # an idle rank still runs one sample: local batch max(1, batch // dp)
    local = np.maximum(1, batch // dp)
    np.testing.assert_allclose(out["node_throughput"] * out["node_latency"], local, rtol=1e-12)


# ------------------------------------------------------------------ realizable


def test_realizable_where_the_batch_splits_into_whole_microbatches():
    # 32 accelerators at TP 8: DP 4. By hand, samples per replica per accumulation step
    # (batch / 4 / gas) and whether they split into microbatch_count whole microbatches:
    cases = [  # batch, gas, microbatches -> realizable
        (32, 2, 4, True),     # 32/4/2 = 4 samples: 4 microbatches of 1
        (32, 2, 8, False),    # 8 microbatches of half a sample
        (32, 16, 1, False),   # 8 samples per replica cannot make 16 accumulation steps
        (2, 1, 1, False),     # batch 2 < DP 4: idle ranks
        (36, 1, 3, True),     # 9 samples: 3 microbatches of 3
        (36, 1, 2, False),    # 9 samples: 2 microbatches of 4.5
        (34, 1, 1, False),    # 34 samples do not split over 4 replicas
        (1024, 1, 256, True),  # 256 samples per replica: 256 microbatches of 1
    ]
    batch, gas, micro, expected = (np.array(c) for c in zip(*cases))
    out = solver.solve(DENSE, FOUR_NODES, batch_size=batch, tp_size=8,
                       gradient_accumulation_steps=gas, microbatch_count=micro)
    np.testing.assert_array_equal(out["dp_size"], 4.0)
    np.testing.assert_array_equal(out["realizable"], expected.astype(bool))
    assert out["realizable"].dtype == bool


def test_realizable_follows_dp_size_and_is_false_where_invalid():
    # The case: DP 128 with a batch of 1024 holds 8 samples per replica; 256
    # microbatches would be 1/32 of a sample each. With dp_size sizing the cluster.
    wl, fl = _wl("Llama3_70B"), _fl("Training_1K")
    out = solver.solve(wl, fl, batch_size=1024, tp_size=8, pp_size=8, dp_size=np.array([128, 3]),
                       microbatch_count=np.array([[8], [256]]))
    np.testing.assert_array_equal(out["valid"], [[True, True], [True, True]])
    np.testing.assert_array_equal(out["realizable"], [[True, False], [False, False]])
    # 1024 / 3 is not whole; an impossible split is never realizable
    bad = solver.solve(wl, fl, batch_size=1024, tp_size=3)
    assert not bad["valid"] and not bad["realizable"]


def test_realizable_changes_no_number():
    # The mask is added; every priced output is the one of the same knobs (parity stays).
    wl, fl = _wl("Llama3_8B"), _fl("Lab_64_H100")
    micro = np.array([1, 3, 8, 256])
    out = solver.solve(wl, fl, batch_size=64, tp_size=2, pp_size=4, microbatch_count=micro)
    assert out["realizable"].any() and not out["realizable"].all()
    for j, m in enumerate(micro):
        alone = solver.solve(wl, fl, batch_size=64, tp_size=2, pp_size=4, microbatch_count=int(m))
        assert_outputs_equal({k: v[j] for k, v in out.items()}, alone)


# ------------------------------------------------------------------ dp_size sizes the cluster


def test_dp_size_equals_a_fleet_of_that_size():
    # With dp_size the cluster has tp*pp*ep*dp accelerators (whole 8-GPU nodes only);
    # each point equals the same layout on the catalog fleet resized to that many nodes.
    wl, fl = _wl("Llama3_70B"), _fl("Training_1K")
    tps, dps = [1, 2, 8], [1, 2, 3, 16, 128]
    out = solver.solve(wl, fl, batch_size=1024, tp_size=np.array(tps).reshape(3, 1), pp_size=4,
                       dp_size=np.array(dps))
    # whole nodes: 4 * tp * dp divisible by 8 -> fails only for tp = 1 with dp odd
    expected_valid = np.array([[(4 * t * d) % 8 == 0 for d in dps] for t in tps])
    np.testing.assert_array_equal(out["valid"], expected_valid)
    assert not expected_valid.all()
    for i, t in enumerate(tps):
        for j, d in enumerate(dps):
            if not expected_valid[i, j]:
                assert np.isnan(out["step_latency_total"][i, j])
                continue
            alone = solver.solve(wl, fl.with_count(4 * t * d // 8), batch_size=1024, tp_size=t, pp_size=4)
            assert_outputs_equal({k: v[i, j] for k, v in out.items()}, alone)
            assert out["dp_size"][i, j] == d
