"""solver.physics.megatron.solve: limits, broadcasting, validation, realizable mask."""

import dataclasses
import warnings

import numpy as np
import pytest

from solver import catalog
from solver.physics import megatron as M

WL = catalog.workload("Llama3_70B_MC")
FL = catalog.fleet("HGX_H100_1K_MC")
BASE = dict(batch_size=512, seq_len=4096, tp_size=8, pp_size=4, dp_size=8, micro_batch_size=1,
            v_stages=5, sequence_parallel=True)


def test_outputs_declared_and_finite():
    out = M.solve(WL, FL, **BASE)
    assert set(out) == set(M.OUTPUTS)
    assert bool(out["valid"]) and bool(out["realizable"])
    assert 0.2 < float(out["mfu"]) < 0.8
    assert float(out["step_latency_total"]) > float(out["compute_latency"]) / 32 * 0.99  # m = 64... positive
    assert float(out["memory_footprint"]) == pytest.approx(sum(float(out[k]) for k in (
        "memory_weights", "memory_gradients", "memory_optimizer_state", "memory_activations",
        "memory_communication_buffers")))


def test_cp1_no_sp_is_plain_tp():
    a = M.solve(WL, FL, **{**BASE, "sequence_parallel": False, "cp_size": 1})
    assert float(a["cp_communication_latency"]) == 0.0
    # plain TP: the norms are replicated, so SP is faster and stores less
    b = M.solve(WL, FL, **{**BASE, "sequence_parallel": True})
    assert float(b["memory_activations"]) < float(a["memory_activations"])
    # with one TP rank, SP changes nothing at all
    c = M.solve(WL, FL, **{**BASE, "tp_size": 1, "pp_size": 8, "v_stages": 1, "sequence_parallel": False})
    d = M.solve(WL, FL, **{**BASE, "tp_size": 1, "pp_size": 8, "v_stages": 1, "sequence_parallel": True})
    for name in M.OUTPUTS:
        np.testing.assert_array_equal(c[name], d[name])
    assert float(c["tp_communication_latency"]) == 0.0


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_fp8_sequence_parallel_gathers_move_one_byte(engine):
    # Transformer Engine casts to FP8 before sequence parallelism's all-gathers ([28] of
    # the model): per TP exchange a reduce-scatter of the 16-bit bytes and an all-gather of
    # half of them, against an all-reduce (one RS + one AG of the 16-bit bytes) in BF16.
    # The bandwidth term, apart (priced at two NVLink efficiencies: time = B / eff + L):
    # 1.5 / 2; the latency term (ring steps and launches, two collectives either way) the same.
    kw = dict(batch_size=64, seq_len=8192, tp_size=8, pp_size=8, dp_size=1, micro_batch_size=4,
              recompute="selective", tp_comm_overlap=False, engine=engine)
    precision = np.array(["bf16", "fp8"])
    half, whole = (np.asarray(M.solve(WL, FL, sequence_parallel=True, precision=precision,
                                      scale_up_efficiency=e, **kw)["tp_communication_latency"],
                              dtype=np.float64) for e in (0.5, 1.0))
    moved, latency = half - whole, 2.0 * whole - half
    assert moved[1] / moved[0] == pytest.approx(0.75, rel=1e-9)
    assert latency[1] == pytest.approx(latency[0], rel=1e-9) and latency[0] > 0
    # without SP the layers all-reduce their 16-bit outputs, whatever the GEMMs' precision
    plain = M.solve(WL, FL, sequence_parallel=False, precision=precision, **kw)
    t = np.asarray(plain["tp_communication_latency"])
    assert t[0] == t[1] > 0


def test_one_stage_has_no_bubble_no_p2p_and_zero0_no_gather():
    out = M.solve(WL, FL, **{**BASE, "pp_size": 1, "v_stages": 1, "zero_stage": 0, "dp_size": 32,
                             "overlap_param_gather": False, "overlap_grad_reduce": False})
    assert float(out["pipeline_bubble_latency"]) == 0.0
    assert float(out["bubble_fraction"]) == 0.0
    assert float(out["pp_communication_latency"]) == 0.0
    z1 = M.solve(WL, FL, **{**BASE, "pp_size": 1, "v_stages": 1, "zero_stage": 1, "dp_size": 32,
                            "overlap_param_gather": False, "overlap_grad_reduce": False})
    # zero 0: all-reduce (RS + AG of fp32 grads); zero 1: RS of grads + AG of bf16 params: cheaper
    assert float(z1["dp_communication_latency"]) < float(out["dp_communication_latency"])
    one = M.solve(WL, FL, **{**BASE, "pp_size": 1, "v_stages": 1, "dp_size": 1, "batch_size": 16})
    assert float(one["dp_communication_latency"]) == 0.0


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_pipeline_sends_split_by_tp_under_sp_or_scatter_gather(engine):
    """p2p_split [26]: a pipeline send is 1/tp of the activations under sequence parallelism
    or legacy Megatron-LM's scatter/gather, the whole tensor otherwise (Megatron-Core
    without SP), on random layouts (seeded), both engines; scatter/gather then all-gathers
    the slices over TP on arrival. The send time is affine in the bytes over bandwidth, so
    where the stages talk across nodes its bandwidth part is read off two scale-out
    efficiencies (e, e/2) and must shrink by exactly tp, while the gather is the only
    NVLink term; its p2p buffers shrink by tp too."""
    if engine == "fused":
        pytest.importorskip("numba")
    rng = np.random.default_rng(26)
    n = 2048
    pick = lambda xs: rng.choice(xs, n)  # noqa: E731
    kw = dict(batch_size=pick([64, 128, 256]), seq_len=pick([2048, 4096]),
              tp_size=pick([1, 2, 4, 8]), pp_size=pick([1, 2, 4, 8]), dp_size=pick([1, 2, 4]),
              v_stages=pick([1, 2]), micro_batch_size=pick([1, 2]),
              sequence_parallel=rng.random(n) < 0.5, zero_stage=pick([0, 1]),
              recompute=pick(["none", "selective", "full"]), engine=engine)
    sg, plain = (M.solve(WL, FL, scatter_gather_tensors_in_pipeline=True, **kw),
                 M.solve(WL, FL, scatter_gather_tensors_in_pipeline=False, **kw))
    tp, pp, sp = kw["tp_size"], kw["pp_size"], kw["sequence_parallel"] & (kw["tp_size"] > 1)
    same = sp | (tp == 1) | (pp == 1)
    assert same.sum() > 100 and (~same & sg["valid"]).sum() > 100
    for name in M.OUTPUTS:  # SP, one TP rank or one stage: the knob changes nothing
        np.testing.assert_array_equal(sg[name][same], plain[name][same], err_msg=name)
    split = ~same & sg["valid"]
    t = tp[split]
    # the p2p buffers (two sends; zero 0-1: no bucket, no FSDP gather buffer)
    np.testing.assert_allclose(plain["memory_communication_buffers"][split],
                               t * sg["memory_communication_buffers"][split], rtol=1e-12)
    # the stages' sends cross nodes (TP x DP x 2 ranks beyond the node of 8), TP stays in it
    cross = (tp * kw["dp_size"] * 2 > 8)[split]
    assert cross.sum() > 100 and (~cross).sum() > 50
    x = {}
    for g in (True, False):
        for label, extra in (("e", {}),
                             ("out/2", dict(scale_out_efficiency=M.CONSTANTS["scale_out_efficiency"] / 2)),
                             ("up/2", dict(scale_up_efficiency=M.CONSTANTS["scale_up_efficiency"] / 2))):
            x[g, label] = M.solve(WL, FL, scatter_gather_tensors_in_pipeline=g, **kw,
                                  **extra)["pp_communication_latency"][split][cross]
    send = {g: x[g, "out/2"] - x[g, "e"] for g in (True, False)}
    gather = {g: x[g, "up/2"] - x[g, "e"] for g in (True, False)}
    assert np.all(send[False] > 0)
    np.testing.assert_allclose(send[False], t[cross] * send[True], rtol=1e-9)
    # the arrival's all-gather: (tp - 1) / tp of the tensor over NVLink, per send
    assert np.all(gather[False] == 0) and np.all(gather[True] > 0)
    np.testing.assert_allclose(gather[True], send[False] * (t[cross] - 1) / t[cross]
                               * M.CONSTANTS["scale_out_efficiency"] * FL.node.nic_bandwidth
                               / (M.CONSTANTS["scale_up_efficiency"]
                                  * (FL.node.scale_up_bus_bandwidth or FL.node.intra_node_bandwidth)),
                               rtol=1e-9)
    # over InfiniBand the split send plus the NVLink gather beat the whole send
    assert np.all(plain["step_latency_total"][split][cross] > sg["step_latency_total"][split][cross])


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_interleaved_sends_wait_per_chunk_without_overlap_p2p_comm(engine):
    """p2p_steady_sends [27]: the interleaved schedule (v > 1) waits on no steady-state
    exchange with overlap_p2p_comm, on one per microbatch and chunk without it, so its
    exposed p2p grows from (p v - 1) exchanges to (p v - 1) + m v, and the step by just
    that; 1F1B (v = 1) and one stage are unchanged. Random layouts (seeded), both engines."""
    if engine == "fused":
        pytest.importorskip("numba")
    rng = np.random.default_rng(27)
    n = 2048
    pick = lambda xs: rng.choice(xs, n)  # noqa: E731
    kw = dict(batch_size=pick([64, 128, 256]), seq_len=4096, tp_size=pick([1, 2, 4, 8]),
              pp_size=pick([1, 2, 4, 8]), dp_size=pick([1, 2, 4]), v_stages=pick([1, 2, 5]),
              micro_batch_size=pick([1, 2]), sequence_parallel=rng.random(n) < 0.5,
              scatter_gather_tensors_in_pipeline=rng.random(n) < 0.5,
              zero_stage=pick([0, 1, 2, 3]), engine=engine)
    on, off = (M.solve(WL, FL, overlap_p2p_comm=True, **kw),
               M.solve(WL, FL, overlap_p2p_comm=False, **kw))
    pp, v = kw["pp_size"], kw["v_stages"]
    same = (v == 1) | (pp == 1)
    hit = ~same & on["valid"]
    assert same.sum() > 100 and hit.sum() > 100
    for name in M.OUTPUTS:
        np.testing.assert_array_equal(on[name][same], off[name][same], err_msg=name)
    m = on["microbatch_count"][hit]
    x_on, x_off = on["pp_communication_latency"][hit], off["pp_communication_latency"][hit]
    # The steady state's exchanges wait on the slowest link, the ramp's cross each
    # boundary at its own: the same link where every boundary is on one side (the job in
    # one node of 8, or stages a node or more apart); else the slowest is the fabric.
    stride = (kw["tp_size"] * kw["dp_size"])[hit]
    one_link = (stride * pp[hit] <= 8) | (stride >= 8)
    per_ramp_send = x_on * m * v[hit] / (pp[hit] * v[hit] - 1)
    assert one_link.sum() > 100 and (~one_link).sum() > 20
    np.testing.assert_allclose((x_off - x_on)[one_link], per_ramp_send[one_link], rtol=1e-9)
    assert np.all((x_off - x_on)[~one_link] > per_ramp_send[~one_link] * 1.01)
    np.testing.assert_allclose(off["step_latency_total"][hit] - on["step_latency_total"][hit],
                               x_off - x_on, rtol=1e-9)


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_interleaved_chunks_leave_one_chunks_dp_traffic_exposed(engine):
    """Megatron-Core launches each model chunk's gradient reduction as its last backward
    ends, and each chunk's parameter gather before its first forward ([17] of the model):
    under interleaving only one chunk's share, 1/v, is left exposed; without the overlaps
    the whole traffic waits, whatever v. The layout puts 80 layers on 4 stages, DP 32 over
    the fabric, so the exposed traffic is well above zero."""
    if engine == "fused":
        pytest.importorskip("numba")
    v = np.array([1, 2, 4, 5, 10, 20])
    kw = dict(BASE, dp_size=32, batch_size=2560, v_stages=v, zero_stage=1, engine=engine)
    on = M.solve(WL, FL, overlap_grad_reduce=True, overlap_param_gather=True, **kw)
    off = M.solve(WL, FL, overlap_grad_reduce=False, overlap_param_gather=False, **kw)
    exposed = np.asarray(on["dp_communication_latency"])
    assert exposed[0] > 0.05
    np.testing.assert_allclose(exposed * v, exposed[0], rtol=1e-12)
    whole = np.asarray(off["dp_communication_latency"])
    np.testing.assert_allclose(whole, whole[0], rtol=0)
    assert (whole > exposed).all()


def test_bubble_is_narayanan_eq1():
    for v in (1, 5):
        out = M.solve(WL, FL, **{**BASE, "v_stages": v})
        m = float(out["microbatch_count"])
        # bubble / (m * stage) = (p-1)/(v m) up to the LM head's share on the last stage
        frac = float(out["bubble_fraction"])
        ideal = (4 - 1) / (v * m) / (1 + (4 - 1) / (v * m))
        assert frac == pytest.approx(ideal, rel=0.05)


def test_grid_equals_flat_on_random_draws():
    rng = np.random.default_rng(7)
    axes = dict(tp_size=np.array([1, 2, 4, 8]), pp_size=np.array([1, 2, 4]), cp_size=np.array([1, 2]),
                micro_batch_size=np.array([1, 2]), recompute=np.array(["none", "selective", "full"]),
                zero_stage=np.array([0, 1, 3]), precision=np.array(["bf16", "fp8"]),
                sequence_parallel=np.array([False, True]))
    mesh = {k: v.reshape([-1 if i == j else 1 for j in range(len(axes))])
            for i, (k, v) in enumerate(axes.items())}
    grid = M.solve(WL, FL, batch_size=256, seq_len=4096, dp_size=4, **mesh)
    shape = grid["step_latency_total"].shape
    idx = [rng.integers(0, n, 40) for n in shape]
    flat = {k: v[i] for (k, v), i in zip(axes.items(), idx)}
    got = M.solve(WL, FL, batch_size=256, seq_len=4096, dp_size=4, **flat)
    for name in M.OUTPUTS:
        np.testing.assert_allclose(got[name], grid[name][tuple(idx)], rtol=1e-12, equal_nan=True,
                                   err_msg=name)


def test_derived_dp_and_valid_mask():
    out = M.solve(WL, FL, batch_size=1024, seq_len=4096, tp_size=np.array([8, 3, 16]), pp_size=4)
    assert out["valid"].tolist() == [True, False, True]
    assert out["dp_size"][0] == 1024 / 32
    assert np.isnan(out["step_latency_total"][1]) and not out["feasible"][1]
    moe = catalog.workload("Mixtral_8x7B_MC")
    e = M.solve(moe, FL, batch_size=1024, tp_size=2, pp_size=4, ep_size=np.array([8, 3]))
    assert e["valid"].tolist() == [True, False]
    assert float(e["ep_communication_latency"][0]) > 0


def test_realizable_mask():
    out = M.solve(WL, FL, seq_len=4096, tp_size=8, pp_size=4, dp_size=8,
                  batch_size=np.array([512, 500, 4]), micro_batch_size=1)
    assert out["realizable"].tolist() == [True, False, False]  # whole microbatches; none idle
    bad_tp = M.solve(WL, FL, batch_size=512, tp_size=3, pp_size=1, dp_size=4)  # 64 heads % 3
    assert bool(bad_tp["valid"]) and not bool(bad_tp["realizable"])
    bad_v = M.solve(WL, FL, batch_size=512, tp_size=8, pp_size=4, v_stages=3, dp_size=4)  # 80 % 12
    assert not bool(bad_v["realizable"])


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_expert_parallelism_in_fp16_is_not_realizable(engine):
    """Megatron-LM refuses expert parallelism with fp16 training (validate_args, [15] of the
    model): such a layout is valid and priced, not realizable; bf16, fp8 and ep 1 are. Both
    engines, with the precisions and ep as arrays of 4096 layouts (the fused kernel's size)."""
    if engine == "fused":
        pytest.importorskip("numba")
    moe = catalog.workload("Mixtral_8x7B_MC")
    n = 4096
    prec = np.array(["bf16", "fp16", "fp8", "fp16"] * (n // 4))
    ep = np.array([8, 8, 8, 1] * (n // 4))
    out = M.solve(moe, FL, batch_size=512, seq_len=4096, tp_size=2, pp_size=1, dp_size=8,
                  micro_batch_size=1, sequence_parallel=True, ep_size=ep, precision=prec,
                  engine=engine)
    assert out["valid"].all()
    assert out["realizable"].tolist() == [True, False, True, True] * (n // 4)
    assert np.isfinite(out["step_latency_total"]).all()
    # fp16 prices as bf16 does (the same 16-bit peak): only the mask differs.
    np.testing.assert_array_equal(out["step_latency_total"][1::4], out["step_latency_total"][0::4])


#: (workload, fleet, knobs over BASE, realizable?): Megatron-LM / Megatron-Core refuse each
#: False layout ([15]-[21] of the model); the True ones beside them differ in one knob.
_RULE_CASES = [
    # [16] num_query_groups must be a multiple of tp (no KV-head replication)
    ("Llama3_70B_MC", "HGX_H100_1K_MC", dict(tp_size=16, pp_size=2), False),
    ("Llama3_70B_MC", "HGX_H100_1K_MC", dict(tp_size=8, pp_size=2), True),
    # [17] interleaving: the microbatch count a multiple of pp_size, and at least pp_size
    ("Llama3_70B_MC", "HGX_H100_1K_MC", dict(batch_size=48, v_stages=2), False),   # m = 6
    ("Llama3_70B_MC", "HGX_H100_1K_MC", dict(batch_size=16, v_stages=2), False),   # m = 2
    ("Llama3_70B_MC", "HGX_H100_1K_MC", dict(batch_size=64, v_stages=2), True),    # m = 8
    ("Llama3_70B_MC", "HGX_H100_1K_MC", dict(batch_size=48, v_stages=1), True),    # 1F1B
    # [18] context parallelism only with the fused (Transformer Engine) attention
    ("Llama3_70B_MC", "HGX_H100_1K_MC", dict(cp_size=2, flash_attention=False), False),
    ("Llama3_70B_MC", "HGX_H100_1K_MC", dict(cp_size=2, flash_attention=True), True),
    ("Llama3_70B_MC", "HGX_H100_1K_MC", dict(cp_size=1, flash_attention=False), True),
    # [19] sequence parallelism splits seq_len / cp_size over tp
    ("Llama3_70B_MC", "HGX_H100_1K_MC", dict(seq_len=4100), False),
    ("Llama3_70B_MC", "HGX_H100_1K_MC", dict(seq_len=4100, sequence_parallel=False), True),
    # [15] tp_comm_overlap needs sequence parallelism, which tp 1 turns off
    ("Llama3_70B_MC", "HGX_H100_1K_MC", dict(tp_size=1, pp_size=8, v_stages=1, tp_comm_overlap=True), False),
    ("Llama3_70B_MC", "HGX_H100_1K_MC", dict(tp_size=1, pp_size=8, v_stages=1), True),
    ("Llama3_70B_MC", "HGX_H100_1K_MC", dict(tp_comm_overlap=True), True),
    # [15] overlap_param_gather needs overlap_grad_reduce (a no-op without a distributed optimizer)
    ("Llama3_70B_MC", "HGX_H100_1K_MC", dict(overlap_grad_reduce=False), False),
    ("Llama3_70B_MC", "HGX_H100_1K_MC", dict(overlap_grad_reduce=False, overlap_param_gather=False), True),
    ("Llama3_70B_MC", "HGX_H100_1K_MC", dict(overlap_grad_reduce=False, zero_stage=0), True),
    # [21] the precision must exist on the accelerator
    ("Llama3_70B_MC", "Selene_MC", dict(precision="fp8"), False),
    ("Llama3_70B_MC", "Selene_MC", dict(precision="bf16"), True),
    ("Llama3_70B_MC", "HGX_H100_1K_MC", dict(precision="fp4"), False),
    ("Llama3_70B_MC", "HGX_H100_1K_MC", dict(precision="fp8"), True),
    ("Llama3_70B_MC", "DGX_B200_1K_MC", dict(precision="fp4"), True),
    # [30] no ZeRO-2/3 (FSDP) with a pipeline; the distributed optimizer runs with one
    ("Llama3_70B_MC", "HGX_H100_1K_MC", dict(zero_stage=3), False),
    ("Llama3_70B_MC", "HGX_H100_1K_MC", dict(zero_stage=2), False),
    ("Llama3_70B_MC", "HGX_H100_1K_MC", dict(zero_stage=1), True),
    ("Llama3_70B_MC", "HGX_H100_1K_MC", dict(zero_stage=3, pp_size=1, v_stages=1), True),
    # [20] MoE with tp > 1 needs sequence parallelism
    ("Mixtral_8x7B_MC", "HGX_H100_1K_MC", dict(tp_size=2, pp_size=4, v_stages=1, ep_size=8, sequence_parallel=False), False),
    ("Mixtral_8x7B_MC", "HGX_H100_1K_MC", dict(tp_size=2, pp_size=4, v_stages=1, ep_size=8), True),
    ("Mixtral_8x7B_MC", "HGX_H100_1K_MC", dict(tp_size=1, pp_size=4, v_stages=1, ep_size=8, sequence_parallel=False), True),
]


@pytest.mark.parametrize("engine", ["numpy", "fused"])
@pytest.mark.parametrize("wl_name,fl_name", sorted({(c[0], c[1]) for c in _RULE_CASES}))
def test_megatron_refusals_are_not_realizable(engine, wl_name, fl_name):
    """Each rule of Megatron-LM's validate_args / Megatron-Core's asserts the model follows,
    with a layout it refuses beside one it runs; every layout stays valid and priced. Both
    engines, the cases' knobs as arrays of 4096 layouts (the fused kernel's size)."""
    if engine == "fused":
        pytest.importorskip("numba")
    cases = [c for c in _RULE_CASES if (c[0], c[1]) == (wl_name, fl_name)]
    reps = -(-4096 // len(cases))
    rows = [{**BASE, "flash_attention": True, "tp_comm_overlap": False, "overlap_grad_reduce": True,
             "overlap_param_gather": True, "zero_stage": 1, "precision": "bf16", "cp_size": 1,
             "ep_size": 1, **c[2]} for c in cases] * reps
    knobs = {name: np.array([r[name] for r in rows]) for name in rows[0]}
    out = M.solve(catalog.workload(wl_name), catalog.fleet(fl_name), engine=engine, **knobs)
    assert out["valid"].all()
    assert np.isfinite(out["step_latency_total"]).all()
    assert out["realizable"].tolist() == [c[3] for c in cases] * reps


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_model_state_buckets_and_untied_embeddings(engine):
    """Memory against Megatron-Core's layout, on both engines (4096 layouts): 18 B per
    parameter in bf16 and 20 in fp16 without the distributed optimizer [2 of
    megatron_memory]; DDP buckets are views into the gradient buffer, so one stage alone
    (no pipeline buffers) has no buffer memory unless its gradients are sharded [23]; an
    untied model's single stage holds the output layer too [22]."""
    if engine == "fused":
        pytest.importorskip("numba")
    small = catalog.workload("Llama3_8B_MC")
    assert small.tied_embeddings is False
    n = 4096
    zero = np.array([0, 0, 1, 2] * (n // 4))
    prec = np.array(["bf16", "fp16", "bf16", "bf16"] * (n // 4))
    kw = dict(batch_size=64, seq_len=4096, tp_size=1, pp_size=1, dp_size=8, micro_batch_size=1,
              zero_stage=zero, precision=prec, engine=engine)
    out = M.solve(small, FL, **kw)
    shape = M._Shape(small)
    params = shape.layers * shape.dense_layer_params + 2 * shape.embedding_params
    assert params == pytest.approx(8.03e9, rel=2e-3)  # the model card's count
    state = out["memory_weights"] + out["memory_gradients"] + out["memory_optimizer_state"]
    np.testing.assert_allclose(state[:4], [18 * params, 20 * params, (6 + 12 / 8) * params,
                                           (2 + 16 / 8) * params], rtol=1e-12)
    np.testing.assert_array_equal(out["memory_communication_buffers"][:3], 0.0)
    assert out["memory_communication_buffers"][3] == 4 * 4e7  # one FP32 bucket of 40M
    tied = M.solve(dataclasses.replace(small, tied_embeddings=True), FL, **kw)
    np.testing.assert_allclose(out["memory_weights"] - tied["memory_weights"],
                               2 * shape.embedding_params, rtol=1e-12)
    # with stages, the last holds the output layer whether tied or not
    staged = {k: M.solve(dataclasses.replace(small, tied_embeddings=t), FL,
                         **{**kw, "pp_size": 2})["memory_weights"] for k, t in (("u", False), ("t", True))}
    np.testing.assert_array_equal(staged["u"], staged["t"])


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_bf16_gradient_reduction_halves_the_gradients_on_the_wire_and_in_memory(engine):
    """grad_reduce_in_bf16 [25]: BF16 and FP8 training then hold the FP16 layout (2 B of
    gradients, the optimizer's FP32 copy of its shard: 2 + 2 + 16 / d B per parameter
    with the distributed optimizer), and every gradient reduction moves half the bytes
    (with nothing overlapped, the DP time at zero 0 and 1 is a reduction of the gradient
    buffer, so it halves up to its per-step latency). FP16 training reduces FP16
    gradients either way (4096 layouts, both engines). The FP32 copy is never held with
    the activations."""
    if engine == "fused":
        pytest.importorskip("numba")
    small = catalog.workload("Llama3_8B_MC")
    n = 4096
    zero = np.array([0, 1, 0, 1] * (n // 4))
    prec = np.array(["bf16", "fp8", "fp16", "fp16"] * (n // 4))
    kw = dict(batch_size=64, seq_len=4096, tp_size=1, pp_size=1, dp_size=8, micro_batch_size=1,
              zero_stage=zero, precision=prec, overlap_grad_reduce=False,
              overlap_param_gather=False, engine=engine)
    fp32 = M.solve(small, FL, **kw)
    bf16 = M.solve(small, FL, grad_reduce_in_bf16=True, **kw)
    shape = M._Shape(small)
    params = shape.layers * shape.dense_layer_params + 2 * shape.embedding_params
    state = lambda o: o["memory_weights"] + o["memory_gradients"] + o["memory_optimizer_state"]  # noqa: E731
    np.testing.assert_allclose(state(fp32)[:2], [18 * params, (6 + 12 / 8) * params], rtol=1e-12)
    np.testing.assert_allclose(state(bf16)[:2], [20 * params, (4 + 16 / 8) * params], rtol=1e-12)
    np.testing.assert_allclose(bf16["memory_gradients"][:2], fp32["memory_gradients"][:2] / 2,
                               rtol=1e-12)
    for name in M.OUTPUTS:  # fp16: the knob changes nothing
        np.testing.assert_array_equal(bf16[name][2::4], fp32[name][2::4], err_msg=name)
        np.testing.assert_array_equal(bf16[name][3::4], fp32[name][3::4], err_msg=name)
    # the optimizer's FP32 copy of 16-bit gradients (4 / d of those bytes) lives only in
    # the step, when the activations are freed ([5] of megatron_memory): the footprint
    # counts the larger. At zero 0 the copy (32 GB) outweighs the activations (21 GB), at
    # zero 1 (4 GB at d = 8) the activations do; FP32 gradients are their own copy.
    parts = sum(bf16[k] for k in ("memory_weights", "memory_gradients", "memory_optimizer_state",
                                  "memory_activations", "memory_communication_buffers"))
    held = bf16["memory_activations"] + bf16["memory_communication_buffers"]
    copy = 4.0 * params / np.array([1.0, 8.0])
    assert copy[0] > held[0] and copy[1] < held[1]
    np.testing.assert_allclose(bf16["memory_footprint"][:2], parts[:2] - np.minimum(copy, held[:2]),
                               rtol=1e-12)
    np.testing.assert_allclose(bf16["memory_footprint"][0], state(bf16)[0], rtol=1e-12)
    np.testing.assert_allclose(fp32["memory_footprint"][:2], sum(
        fp32[k][:2] for k in ("memory_weights", "memory_gradients", "memory_optimizer_state",
                              "memory_activations", "memory_communication_buffers")), rtol=1e-12)
    dp32, dp16 = fp32["dp_communication_latency"][:2], bf16["dp_communication_latency"][:2]
    assert (dp16 < dp32).all() and (dp16 > dp32 / 2).all()
    assert (bf16["step_latency_total"][:2] < fp32["step_latency_total"][:2]).all()


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_zero2_reduces_gradients_every_microbatch(engine):
    """ZeRO-2 keeps only its gradient shard, so it reduce-scatters after every microbatch
    ([24] of the model), where the distributed optimizer (zero 1) reduces once a step: with
    nothing overlapped, zero 2's extra time is (m - 1) reductions, the same reduction at
    every m; and it is never faster than zero 1."""
    if engine == "fused":
        pytest.importorskip("numba")
    n = 4096
    zero = np.array([1, 2] * (n // 2))
    batch = np.repeat([64, 128, 256, 512], n // 4)  # m = 8, 16, 32, 64 at dp 8
    out = M.solve(WL, FL, batch_size=batch, seq_len=4096, tp_size=8, pp_size=4, dp_size=8,
                  micro_batch_size=1, sequence_parallel=True, zero_stage=zero,
                  overlap_grad_reduce=False, overlap_param_gather=False, engine=engine)
    dp = out["dp_communication_latency"]
    m = out["microbatch_count"]
    per_reduction = (dp[1::2] - dp[0::2]) / (m[1::2] - 1)
    assert per_reduction.min() > 0
    np.testing.assert_allclose(per_reduction, per_reduction[0], rtol=1e-12)
    assert (out["step_latency_total"][1::2] > out["step_latency_total"][0::2]).all()
    # overlapped, each reduction hides behind its own microbatch's backward
    hidden = M.solve(WL, FL, batch_size=batch, seq_len=4096, tp_size=8, pp_size=4, dp_size=8,
                     micro_batch_size=1, sequence_parallel=True, zero_stage=zero, engine=engine)
    assert (hidden["dp_communication_latency"] <= dp).all()


def test_uneven_pipeline_stages_without_interleaving():
    """126 layers (Llama 3 405B) on 16 stages: priced on the heaviest stage of ceil(126 / 16)
    = 8 layers, but not realizable as given: Megatron-LM's validate_args refuses layers the
    pipeline does not divide unless the first or last stage's layers are set (Meta's 7,
    8 x 14, 7 is; tests/test_megatron_stages.py). Interleaved it needs even chunks; more
    stages than layers is never realizable."""
    big = catalog.workload("Llama3_405B_MC")
    assert big.layers == 126
    kw = dict(batch_size=512, seq_len=4096, tp_size=8, dp_size=4, micro_batch_size=1,
              sequence_parallel=True)
    out = M.solve(big, FL, pp_size=np.array([14, 16, 18, 126, 127]), **kw)
    assert out["realizable"].tolist() == [True, False, True, True, False]  # 126 % 14, 18 == 0
    assert bool(out["valid"][4])  # a possible split, just not one Megatron-Core runs
    inter = M.solve(big, FL, pp_size=np.array([14, 16]), v_stages=np.array([3, 2]),
                    **{**kw, "batch_size": 896})  # m = 224, a multiple of 14 and of 16 [17]
    assert inter["realizable"].tolist() == [True, False]  # 126 % 42 == 0; 126 % 32 != 0
    # the heaviest stage is priced: 16 stages hold 8 layers at most, as 15.75 rounds up,
    # so the stage's weights match those of an even split of 128 layers on 16
    even = M.solve(dataclasses.replace(big, layers=128), FL, pp_size=16, **kw)
    np.testing.assert_allclose(out["memory_weights"][1], even["memory_weights"], rtol=1e-12)


@pytest.mark.parametrize("kw,needle", [
    (dict(tp_size=0), "tp_size"), (dict(recompute="half"), "recompute must be one of"),
    (dict(precision="fp12"), "precision must be one of"), (dict(zero_stage=4), "zero_stage"),
    (dict(precision=np.array(["bf16", "fp12"])), "'fp12'"), (dict(gemm_scale=-1.0), "gemm_scale"),
    (dict(micro_batch_size=1.5), "micro_batch_size"),
    (dict(hidden_dropout=-0.1), r"hidden_dropout must be a number >= 0 and <= 1"),
    (dict(attention_dropout=1.5), "attention_dropout must be a number"),
    (dict(hidden_dropout=np.nan), "hidden_dropout must be finite"),
    (dict(attention_dropout="0.1"), "attention_dropout must be a number"),
])
def test_bad_knobs_raise_naming_knob(kw, needle):
    with pytest.raises(ValueError, match=needle):
        M.solve(WL, FL, **kw)


def test_unknown_keyword_and_string_arrays():
    with pytest.raises(TypeError, match="unexpected keyword"):
        M.solve(WL, FL, microbatch_count=4)
    out = M.solve(WL, FL, batch_size=512, tp_size=8, pp_size=4, dp_size=8,
                  recompute=np.array(["none", "FULL", "selective"]), flash_attention=False)
    t = out["step_latency_total"]
    assert t[1] > t[2] > t[0]  # full recompute costs most, selective a little
    assert out["memory_activations"][1] < out["memory_activations"][2] < out["memory_activations"][0]
    # a fused attention kernel stores no scores: selective recompute then saves no memory
    fused = M.solve(WL, FL, batch_size=512, tp_size=8, pp_size=4, dp_size=8,
                    recompute=np.array(["none", "selective"]), flash_attention=True)
    assert fused["memory_activations"][0] == fused["memory_activations"][1]


def test_fp8_speeds_gemms_only_and_more_bandwidth_never_slows():
    out = M.solve(WL, FL, **{**BASE, "precision": np.array(["bf16", "fp8"])})
    t = out["step_latency_total"]
    assert t[1] < t[0] and t[1] > t[0] / 2
    slow = M.solve(WL, FL, **BASE, scale_out_efficiency=0.3, scale_up_efficiency=0.5)
    assert float(slow["step_latency_total"]) >= float(t[0])


def test_launch_floor_makes_small_microbatches_cost_the_same():
    # A layer takes max(GPU time, host launch time): with a huge launch time the step is
    # bound by microbatches x launches (half the microbatches, half the time); with none,
    # it is the GPU time, which is shorter.
    kw = {**BASE, "pp_size": 1, "v_stages": 1, "dp_size": 32, "micro_batch_size": np.array([1, 2])}
    slow_host = M.solve(WL, FL, **kw, layer_overhead=1.0)["step_latency_total"]
    assert slow_host[0] == pytest.approx(2 * slow_host[1], rel=0.05)
    fast_host = M.solve(WL, FL, **kw, layer_overhead=0.0)["step_latency_total"]
    assert np.all(fast_host < slow_host)


def test_gemm_tile_term_and_lm_head_stay_16_bit_under_fp8():
    from solver import gemm

    assert gemm.gemm_tile_time(np.array([1.0, 1e9]), 256.0, 0.0).tolist() == [0.0, 0.0]
    # F / K output element pairs, each paying tile_cost: 2 M N K / K = 2 M N
    assert gemm.gemm_tile_time(2.0 * 64 * 32 * 256, 256.0, 1e-3) == pytest.approx(2 * 64 * 32 * 1e-3)
    # the tile term adds to the main loop's time, unstretched by the size curve
    main = gemm.gemm_time(1e9, 1e15, plateau=0.5)
    assert gemm.gemm_time(1e9, 1e15, plateau=0.5, k_dim=128.0, tile_cost=1e-15) == pytest.approx(
        main + 1e9 / 128.0 * 1e-15, rel=1e-15)
    kw = {**BASE, "precision": np.array(["bf16", "fp8"])}
    deep = M.solve(WL, FL, **kw, gemm_k_overhead=0.0)["step_latency_total"]
    shallow = M.solve(WL, FL, **kw, gemm_k_overhead=1024.0)["step_latency_total"]
    assert np.all(shallow > deep)
    # The LM head runs in 16 bits: FP8 saves less than half of the GEMM time.
    assert deep[1] > deep[0] / 2


def test_fsdp_gathers_layer_by_layer_pay_one_call_per_layer_and_pass():
    # FSDP runs one gather forward, one backward and one reduce-scatter per layer: with
    # TP = PP = CP = 1 (no other collective), each call's fixed cost adds 3 per layer
    # per microbatch (the first layer's is inside the stage-wide collective's)
    knobs = dict(batch_size=64, seq_len=4096, dp_size=16, micro_batch_size=2, zero_stage=3,
                 overlap_param_gather=False)
    base = M.solve(WL, FL, **knobs, collective_latency=0.0)
    more = M.solve(WL, FL, **knobs, collective_latency=1e-5)
    m = 64 / (16 * 2)
    assert float(more["communication_latency"]) - float(base["communication_latency"]) == \
        pytest.approx(m * 3 * (WL.layers - 1) * 1e-5, rel=1e-9)
    # the distributed optimizer gathers once per step: no per-layer calls
    z1 = {**knobs, "zero_stage": 1}
    assert float(M.solve(WL, FL, **z1, collective_latency=1e-5)["communication_latency"]) - \
        float(M.solve(WL, FL, **z1, collective_latency=0.0)["communication_latency"]) < 1e-5 * 4


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_fsdp_blocking_gathers_leave_only_the_reduce_scatter_to_hide(engine):
    # [29]: without overlap_param_gather the two gathers of each layer block; with
    # overlap_grad_reduce the reduce-scatter hides behind the backward. Under FP16 a
    # gradient is as wide as a weight, so the reduce-scatter is a third of the FSDP
    # traffic (and of the per-layer calls). TP = PP = CP = 1: no other collective, and
    # the backward of 2 microbatches of 4 x 8192 tokens hides the reduce-scatters.
    if engine == "fused":
        pytest.importorskip("numba")
    knobs = dict(batch_size=128, seq_len=8192, dp_size=16, micro_batch_size=4, zero_stage=3,
                 precision="fp16", engine=engine)
    out = {(ogr, opg): M.solve(WL, FL, **knobs, overlap_grad_reduce=ogr, overlap_param_gather=opg)
           for ogr, opg in ((False, False), (True, False), (True, True))}
    total = float(out[True, False]["communication_latency"])
    for o in out.values():  # the traffic is the same; only what is exposed differs
        assert float(o["communication_latency"]) == pytest.approx(total, rel=1e-12)
    assert float(out[False, False]["dp_communication_latency"]) == pytest.approx(total, rel=1e-12)
    assert float(out[True, False]["dp_communication_latency"]) == pytest.approx(2 / 3 * total, rel=1e-9)
    assert float(out[True, True]["dp_communication_latency"]) == 0.0  # prefetched behind it all
    assert float(out[True, False]["compute_latency"]) > 2 * total
    # one data-parallel rank: nothing to gather or reduce, no call at all (as ZeRO 0-2)
    for zero in (0, 1, 2, 3):
        solo = M.solve(WL, FL, **{**knobs, "batch_size": 8, "dp_size": 1, "zero_stage": zero},
                       overlap_param_gather=False)
        assert float(solo["dp_communication_latency"]) == 0.0
        assert float(solo["communication_latency"]) == 0.0  # TP = PP = CP = 1


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_fsdp_across_nodes_crosses_the_fabric_on_every_nic_unless_own_nic(engine):
    """[38]: NCCL spreads a collective's rings over the node's NICs, so FSDP's gathers and
    reduce-scatters over 16 ranks on 2 nodes of 8 cost what ZeRO-1's gather and
    reduce-scatter over them cost (the two-level collective), per microbatch and pass. They
    had been priced as one flat ring at one NIC's rate, 15x the fabric time here (a 70B FSDP
    layout on 64 B200s at 7.9 % MFU); ``fsdp_own_nic`` keeps that, as DeepSpeed's ZeRO-3
    of 2021 ran (NAR21 Table 2). One layer, so no per-layer calls; FP16: a gradient as
    wide as a weight, so a reduce-scatter costs what a gather does."""
    if engine == "fused":
        pytest.importorskip("numba")
    from solver.physics import megatron_steps as steps

    wl = dataclasses.replace(WL, layers=1)
    knobs = dict(batch_size=64, seq_len=4096, tp_size=1, pp_size=1, dp_size=16, micro_batch_size=1,
                 precision="fp16", overlap_grad_reduce=False, overlap_param_gather=False,
                 recompute="full", engine=engine, check_shape=False)
    m = 64 / 16
    z1 = float(M.solve(wl, FL, zero_stage=1, **knobs)["dp_communication_latency"])
    z3, own = (float(M.solve(wl, FL, zero_stage=3, fsdp_own_nic=flag, **knobs)["dp_communication_latency"])
               for flag in (False, True))
    assert z3 == pytest.approx(m * 1.5 * z1, rel=1e-12)  # 2 gathers + 1 reduce-scatter, each z1 / 2
    # the bytes from ZeRO-1's two-level gather: 8 ranks of a node, then 2 nodes on 1/8 of them
    hw = steps.hardware(FL, M.CONSTANTS, np.array(1), False)
    per_byte = 7 / 8 / hw.up_bw + 1 / 2 / 8 / hw.out_bw
    nbytes = (z1 / 2 - 7 * hw.up_lat - hw.out_lat) / per_byte
    # (2 bytes a parameter: one layer of Llama 3 70B, its two norms, the embedding, the
    # head; the final norm's h weights are not counted, a part in 10^6 here)
    h, kv, ffn, vocab = wl.hidden_dim, wl.kv_heads * wl.hidden_dim // wl.heads, wl.ffn_hidden_dim, \
        wl.vocab_size
    params = 2 * h * h + 2 * h * kv + 3 * h * ffn + 2 * h + 2 * vocab * h
    assert nbytes == pytest.approx(2 * params, rel=1e-9)
    flat = 15 / 16 * nbytes / hw.out_bw + 15 * hw.out_lat
    assert own == pytest.approx(m * 3 * flat, rel=1e-9)
    assert own > 5 * z3  # (the two-level's NVLink part stays: 5.7x here)
    # inside one domain the two are one collective: the same bits
    inside = dict(knobs, dp_size=8, batch_size=32)
    a, b = (M.solve(wl, FL, zero_stage=3, fsdp_own_nic=flag, **inside)["dp_communication_latency"]
            for flag in (False, True))
    assert float(a) == float(b) > 0.0
    # Four layers: each after the first pays one call more a pass, at the latency of the
    # collective it is (the two-level's 7 NVLink and 1 fabric steps; a flat ring's 15
    # fabric steps with fsdp_own_nic; a review found the flat ring's charged to both)
    wl4 = dataclasses.replace(WL, layers=4)
    z3, own = (float(M.solve(wl4, FL, zero_stage=3, fsdp_own_nic=flag, collective_latency=0.0,
                             **knobs)["dp_communication_latency"]) for flag in (False, True))
    z1 = float(M.solve(wl4, FL, zero_stage=1, collective_latency=0.0, **knobs)["dp_communication_latency"])
    assert z3 == pytest.approx(m * (1.5 * z1 + 3 * 3 * (7 * hw.up_lat + hw.out_lat)), rel=1e-12)
    nbytes4 = (z1 / 2 - 7 * hw.up_lat - hw.out_lat) / per_byte
    assert own == pytest.approx(m * 3 * (15 / 16 * nbytes4 / hw.out_bw + 4 * 15 * hw.out_lat), rel=1e-9)


def test_partial_last_microbatch_is_priced_as_a_whole_one():
    """7 sequences over dp 4 x micro_batch 1: 1.75 microbatches, not realizable, priced as
    2 (the last one partly filled) so the step takes batch 8's time and MFU is batch 8's
    times 7/8 (pricing 1 microbatch for 7 sequences' FLOPs gave MFU above 1)."""
    kw = dict(seq_len=4096, tp_size=8, pp_size=4, dp_size=4, micro_batch_size=1,
              sequence_parallel=True)
    part, whole = M.solve(WL, FL, batch_size=7, **kw), M.solve(WL, FL, batch_size=8, **kw)
    assert not bool(part["realizable"]) and bool(whole["realizable"])
    assert float(part["microbatch_count"]) == 1.75
    np.testing.assert_allclose(part["step_latency_total"], whole["step_latency_total"], rtol=1e-12)
    np.testing.assert_allclose(part["mfu"], whole["mfu"] * 7 / 8, rtol=1e-12)
    tiny = M.solve(WL, FL, batch_size=1, **kw)  # a quarter microbatch: one whole one's time
    np.testing.assert_allclose(tiny["step_latency_total"], M.solve(
        WL, FL, batch_size=4, **kw)["step_latency_total"], rtol=1e-12)


def test_utilization_is_physical_on_random_layouts():
    """Seeded random layouts over every _MC workload and fleet: wherever a layout is valid,
    MFU and HFU lie in (0, 1], times and bytes are positive and finite."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from test_fused_megatron import _draw

    rng = np.random.default_rng(11)
    workloads = sorted(n for n in catalog.names("workloads") if n.endswith("_MC"))
    fleets = sorted(n for n in catalog.names("fleets") if n.endswith("_MC"))
    for wl in workloads:
        for fl in fleets:
            out = M.solve(catalog.workload(wl), catalog.fleet(fl),
                          **_draw(rng, 2000, dp_given=bool(rng.random() < 0.5)))
            valid = np.asarray(out["valid"])
            assert valid.any(), (wl, fl)
            for name in ("mfu", "hfu"):
                x = np.asarray(out[name])[valid]
                assert np.all((x > 0) & (x <= 1)), (wl, fl, name, x.max())
            for name in ("step_latency_total", "compute_latency", "memory_footprint",
                         "memory_weights"):
                x = np.asarray(out[name])[valid]
                assert np.all(np.isfinite(x) & (x > 0)), (wl, fl, name)


def test_launch_bound_layers_hide_dp_traffic_behind_their_wall_time():
    """Under the launch floor a layer's phases last as long as the host takes to issue
    them: GPU work added (selective recompute) or taken out (tp_comm_overlap) changes
    neither the step nor the window that hides the gradient and parameter traffic. (The
    windows were the GPU work, so both looked faster, the wrong way round.)"""
    small = catalog.workload("Llama3_8B_MC")
    kw = dict(batch_size=64, seq_len=2048, tp_size=2, pp_size=1, dp_size=64, micro_batch_size=1,
              sequence_parallel=True, zero_stage=1, overlap_grad_reduce=True,
              overlap_param_gather=True, layer_overhead=0.002)  # every layer launch-bound
    rc = M.solve(small, FL, recompute=np.array(["none", "selective"]), **kw)
    assert float(rc["dp_communication_latency"][0]) > 0  # traffic left exposed to compare
    assert rc["step_latency_total"][0] == rc["step_latency_total"][1]
    tco = M.solve(small, FL, tp_comm_overlap=np.array([False, True]), **kw)
    assert tco["step_latency_total"][0] == tco["step_latency_total"][1]
    # off the floor, both behave as before: selective costs, the overlap saves
    off = dict(kw, layer_overhead=1e-6)
    rc = M.solve(small, FL, recompute=np.array(["none", "selective"]), **off)
    tco = M.solve(small, FL, tp_comm_overlap=np.array([False, True]), **off)
    assert rc["step_latency_total"][1] > rc["step_latency_total"][0]
    assert tco["step_latency_total"][1] < tco["step_latency_total"][0]


def test_step_is_monotone_in_knobs_and_constants_on_random_layouts():
    """Seeded random layouts: more recomputation never makes a step shorter, an overlap
    never longer, and every fitted constant moves the step one way only (a faster GEMM,
    link or host, or better overlap, never slows it). The DP windows once broke this at
    the launch floor (selective recompute looked faster than none)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from test_fused_megatron import _draw

    rng = np.random.default_rng(17)
    faster = {"gemm_scale": 1.2, "fp8_gemm_scale": 1.2, "scale_up_efficiency": 1.0,
              "scale_out_efficiency": 1.2, "overlap_efficiency": 1.3, "layer_overhead": 0.5,
              "step_overhead": 0.5, "collective_latency": 0.5, "attention_efficiency": 1.2,
              "elementwise_bytes": 0.8, "gemm_k_overhead": 0.5, "gemm_size_shift": 0.8}
    for wl in ("Llama3_8B_MC", "Mixtral_8x7B_MC", "DeepSeek_V3_MC", "GPT3_175B_MC"):
        for fl in ("HGX_H100_1K_MC", "GB200_NVL72_8_MC", "Selene_MC"):
            workload, fleet = catalog.workload(wl), catalog.fleet(fl)
            k = _draw(rng, 1500, dp_given=True)
            step = lambda **over: np.asarray(M.solve(workload, fleet, **{**k, **over})  # noqa: E731
                                             ["step_latency_total"])
            base, valid = step(), np.asarray(M.solve(workload, fleet, **k)["valid"])
            # a <= b up to rounding (where two terms trade the same time, the last bit moves)
            le = lambda a, b: np.all((a <= b * (1 + 1e-12)) | ~valid)  # noqa: E731
            none, sel, full = (step(recompute=r) for r in ("none", "selective", "full"))
            assert le(none, sel) and le(sel, full), (wl, fl)
            for flag in ("tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather",
                         "overlap_moe_expert_parallel_comm"):
                assert le(step(**{flag: True}), step(**{flag: False})), (wl, fl, flag)
            for name, factor in faster.items():
                value = min(M.CONSTANTS[name] * factor, M.CONSTANT_BOUNDS[name][1])
                if name == "scale_up_efficiency":
                    value = M.CONSTANTS[name] * 0.8  # at its bound of 1: test the slower side
                    assert le(base, step(**{name: value})), (wl, fl, name)
                    continue
                assert le(step(**{name: value}), base), (wl, fl, name)


def test_a_knob_of_the_other_model_names_the_model():
    import solver

    with pytest.raises(TypeError, match=r"'sequence_parallel' is a knob of physics='megatron', not "
                       r"of physics='mlsysim' \(pass physics='megatron'\)"):
        solver.solve(WL, FL, tp_size=8, sequence_parallel=True)
    with pytest.raises(TypeError, match=r"'microbatch_count' is a knob of physics='mlsysim'"):
        solver.solve(WL, FL, physics="megatron", microbatch_count=4)
    with pytest.raises(TypeError, match=r"^solve\(\) got an unexpected keyword argument 'foo'"):
        solver.solve(WL, FL, physics="megatron", foo=1)


def test_why_unrealizable_names_each_rule_a_layout_breaks():
    """realizable is the split's validity and each condition of
    megatron_steps.REALIZABLE_CONDITIONS: why_unrealizable names the ones broken, layout by
    layout, and where none is, the layout is realizable (random layouts of every knob)."""
    from test_fused_megatron import _draw

    from solver.physics.megatron_steps import REALIZABLE_CONDITIONS

    for workload in (WL, catalog.workload("Mixtral_8x7B_MC"), catalog.workload("DeepSeek_V3_MC")):
        knobs = _draw(np.random.default_rng(11), 3000, dp_given=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = M.solve(workload, FL, engine="numpy", **knobs)
            why = M.why_unrealizable(workload, FL, **knobs)
        assert set(why) <= {"valid", *REALIZABLE_CONDITIONS} and len(why) >= 5
        broken = np.zeros(3000, dtype=bool)
        for where in why.values():
            broken |= where
        np.testing.assert_array_equal(out["realizable"], ~broken)
        assert out["realizable"].any() and broken.any()
    # one rule at a time
    dsv3 = catalog.workload("DeepSeek_V3_MC")
    kw = dict(batch_size=1024, seq_len=4096, tp_size=1, pp_size=16, ep_size=8)
    assert sorted(M.why_unrealizable(dsv3, FL, **kw)) == ["layers"]  # 61 layers, no stage set
    assert not M.why_unrealizable(dsv3, FL, **kw, num_layers_in_first_pipeline_stage=1)
    assert sorted(M.why_unrealizable(WL, FL, batch_size=1024, tp_size=8, tp_comm_overlap=True,
                                     sequence_parallel=False)) == ["tp_comm_overlap_needs_sp"]
    assert sorted(M.why_unrealizable(WL, FL, batch_size=1024, tp_size=8, sequence_parallel=True,
                                     precision="fp4")) == ["precision"]  # no FP4 on H100
    with pytest.raises(TypeError, match="microbatch_count"):
        M.why_unrealizable(WL, FL, microbatch_count=4)


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_interleaving_two_stages_needs_overlapped_p2p(engine):
    """Megatron-LM's validate_args: "When interleaved schedule is used and p2p communication
    overlap is disabled, pipeline-model-parallel size should be greater than 2" ([27]; an
    audit against its source found the model letting it through)."""
    if engine == "fused":
        pytest.importorskip("numba")
    pp = np.array([2, 2, 4, 4, 2])
    v = np.array([2, 2, 2, 2, 1])
    overlap = np.array([False, True, False, True, False])
    kw = dict(batch_size=512, tp_size=8, sequence_parallel=True, pp_size=pp, v_stages=v,
              overlap_p2p_comm=overlap)
    out = M.solve(WL, FL, engine=engine, **kw)
    assert out["realizable"].tolist() == [False, True, True, True, True]
    why = M.why_unrealizable(WL, FL, **kw)
    assert sorted(why) == ["interleaved_p2p"] and why["interleaved_p2p"].tolist() == [
        True, False, False, False, False]


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_a_faster_peak_never_makes_a_gemm_or_a_step_slower(engine):
    """A GEMM's tiles pay a fixed time beside the main loop (gemm.gemm_tile_time). Taken as
    an efficiency multiplying the size curve's, it was counted twice: a small GEMM of short
    K (Qwen3-30B-A3B's experts, 768 wide, over 4 expert-TP ranks: K 192) took longer at a
    higher peak, so FP8 priced slower than BF16 and FP4 than FP8 on B200 (an audit,
    2026-12-05: FP8's compute 0.1251 -> 0.1453 s). Now every GEMM time falls with the peak,
    and the step with it."""
    if engine == "fused":
        pytest.importorskip("numba")
    from solver import gemm

    peaks = np.geomspace(1e14, 2e16, 60)
    for flops in np.geomspace(1e6, 1e13, 40):
        for k in (64.0, 192.0, 8192.0):
            t = gemm.gemm_time(flops, peaks, plateau=0.7, size_shift=M.CONSTANTS["gemm_size_shift"],
                               k_dim=k, tile_cost=M.CONSTANTS["gemm_k_overhead"] / (312e12 * 0.7))
            assert np.all(np.diff(t) <= 1e-12 * t[:-1]), (flops, k)
    wl, fl = catalog.workload("Qwen3_30B_A3B_MC"), catalog.fleet("DGX_B200_1K_MC")
    out = M.solve(wl, fl, engine=engine, batch_size=8, dp_size=8, tp_size=4, seq_len=4096,
                  sequence_parallel=True, precision=np.array(["bf16", "fp8", "fp4"]))
    assert out["realizable"].all()
    assert np.all(np.diff(out["compute_latency"]) < 0)
    assert np.all(np.diff(out["step_latency_total"]) < 0)
    acc = fl.node.accelerator
    fast = dataclasses.replace(fl, node=dataclasses.replace(fl.node, accelerator=dataclasses.replace(
        acc, peak_flops=2 * acc.peak_flops,
        precision_flops={p: 2 * v for p, v in acc.precision_flops.items()})))
    twice = M.solve(wl, fast, engine=engine, batch_size=8, dp_size=8, tp_size=4, seq_len=4096,
                    sequence_parallel=True, precision=np.array(["bf16", "fp8", "fp4"]))
    assert np.all(twice["compute_latency"] < out["compute_latency"])


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_sharded_gradient_bucket_is_no_larger_than_the_gradients(engine):
    """ZeRO-2/3's bucket is max(40M, 1M x the DP x CP group) gradients [7], but the buckets
    partition the rank's gradients [23]: at a group of 2048 the size (2.05e9) passes Llama 3
    8B's 1.0e9 a rank at TP 8, and the bucket stays the rank's gradients (an audit found
    8.19 GB of bucket beside 4.0 GB of FP32 gradients, ZeRO-2 then above ZeRO-1)."""
    if engine == "fused":
        pytest.importorskip("numba")
    wl, fl = catalog.workload("Llama3_8B_MC"), catalog.fleet("GB200_NVL72_8_MC")
    out = M.solve(wl, fl, engine=engine, batch_size=2048 * 8, seq_len=4096, tp_size=8, cp_size=4,
                  dp_size=512, recompute="full", zero_stage=np.array([1, 2, 3]), sequence_parallel=True)
    assert out["realizable"].all()
    # ZeRO-1 keeps whole FP32 gradients, ZeRO-2/3 a bucket of them: no more than those
    grads_unsharded = out["memory_gradients"][0]
    assert out["memory_communication_buffers"][1] == pytest.approx(grads_unsharded, rel=1e-12)
    assert out["memory_footprint"][1] <= out["memory_footprint"][0] * (1 + 1e-3)
    assert out["memory_footprint"][2] < out["memory_footprint"][0]
    # below the cap the bucket is the size Megatron-Core asks for
    small = M.solve(wl, fl, engine=engine, batch_size=64, seq_len=4096, tp_size=8, dp_size=16,
                    zero_stage=2, sequence_parallel=True)
    assert small["memory_communication_buffers"] == 4 * 4e7


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_zero_stages_without_data_parallel_peers_hold_no_bucket_and_no_gather_buffers(engine):
    """With no DP, CP or expert DP peers (a group of one rank) ZeRO-2 and ZeRO-3 shard
    nothing and gather nothing: the footprint is ZeRO-1's (an audit found ZeRO-2's 160 MB
    bucket and ZeRO-3's two layers' gather buffers priced at DP 1). With two peers they
    come back."""
    wl = catalog.workload("Llama3_8B_MC")
    zero = np.array([1, 2, 3])
    one, two = (M.solve(wl, FL, engine=engine, batch_size=64, seq_len=4096, tp_size=8, dp_size=dp,
                        sequence_parallel=True, zero_stage=zero) for dp in (1, 2))
    assert one["memory_communication_buffers"][1] == one["memory_communication_buffers"][0] == 0.0
    assert one["memory_communication_buffers"][2] == 0.0
    np.testing.assert_array_equal(one["memory_footprint"], one["memory_footprint"][0])
    np.testing.assert_array_equal(one["step_latency_total"], one["step_latency_total"][0])
    assert two["memory_communication_buffers"][1] == 4 * 4e7
    assert two["memory_communication_buffers"][2] > 4 * 4e7


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_dropout_zero_stores_no_masks_and_changes_memory_only(engine):
    """At hidden_dropout 0 a layer keeps two one-byte masks of s b h fewer (Korthikanti's 34
    -> 32), at attention_dropout 0 an unfused attention 3 of its 5 bytes a score fewer
    (megatron_memory [9]); the step's time does not move. Llama 3 70B at TP 8, PP 4,
    8k tokens with SP, selective recompute (the audit's case): the masks are 2 of 34 of
    a layer's stored bytes per TP rank, about 3.5 % of the footprint."""
    kw = dict(BASE, seq_len=8192, recompute="selective", v_stages=1, micro_batch_size=1)
    n = 4
    hid = np.array([0.1, 0.0, 0.1, 0.0])
    att = np.array([0.1, 0.1, 0.0, 0.0])
    flat = {k: np.repeat(v, n) if np.ndim(v) == 0 else v for k, v in kw.items()}
    out = M.solve(WL, FL, engine=engine, hidden_dropout=hid, attention_dropout=att, **flat)
    act = out["memory_activations"]
    # two masks, a byte each, split by SP, per layer-microbatch in flight on the peak rank
    # (rank 0), and the embedding dropout's mask there for each of its 4 microbatches in flight
    s, h, t = 8192, WL.hidden_dim, 8
    in_flight = (act[0] - act[1] - 4 * s * h / t) / (2 * s * h / t)
    assert in_flight == pytest.approx(round(in_flight)) and round(in_flight) >= 20
    assert act[2] == act[0] and act[3] == act[1]  # selective recompute: no scores stored
    # Megatron-Core's defaults (0.1 each) are the solve's
    assert float(M.solve(WL, FL, engine="numpy", **kw)["memory_activations"]) == act[0]
    share = (act[0] - act[1]) / out["memory_footprint"][0]
    assert 0.02 < share < 0.05
    for name in M.OUTPUTS:
        if not name.startswith("memory") and name != "feasible":
            np.testing.assert_array_equal(out[name][0], out[name][1:], err_msg=name)
    # an unfused attention without recompute also drops 3 of 5 score bytes a score
    un = M.solve(WL, FL, engine=engine, hidden_dropout=np.array([0.1, 0.1]),
                 attention_dropout=np.array([0.1, 0.0]),
                 **{k: np.repeat(v, 2) if np.ndim(v) == 0 else v[:2] for k, v in
                    dict(kw, recompute="none", flash_attention=False).items()})
    heads = WL.heads
    per_score = (un["memory_activations"][0] - un["memory_activations"][1]) / (s * heads * s / t)
    assert per_score / round(in_flight) == pytest.approx(3.0)
    # and a layout that does not fit at Megatron-Core's default 0.1 can fit at 0: on an
    # accelerator of a capacity between the two footprints, feasible only without masks
    foot = out["memory_footprint"][:2]
    acc = dataclasses.replace(FL.node.accelerator, memory_capacity=float(foot.mean()))
    small = dataclasses.replace(FL, node=dataclasses.replace(FL.node, accelerator=acc))
    two = M.solve(WL, small, engine=engine, hidden_dropout=hid[:2], attention_dropout=att[:2],
                  **{k: v[:2] for k, v in flat.items()})
    np.testing.assert_array_equal(two["memory_footprint"], foot)
    assert two["feasible"].tolist() == [False, True]


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_a_set_stage_waiting_for_the_paced_one_hides_its_dp_traffic(engine):
    """With set stages the DP traffic is priced on the stage of the most layers, which can
    wait every microbatch for a slower one (the last, with the head and MTP modules). That
    wait hides its traffic (Pipeline.slack): before, selective recompute lengthened its
    backward window more than the step and priced 0.9 % faster than no recompute (a layout
    the seeded monotonicity test drew: ZeRO-2 reduce-scatters every microbatch)."""
    wl = catalog.workload("Llama3_8B_MC")
    kw = dict(batch_size=4096, seq_len=4096, tp_size=4, pp_size=8, cp_size=4, ep_size=2,
              v_stages=1, micro_batch_size=2, sequence_parallel=True, zero_stage=2,
              precision="bf16", tp_comm_overlap=True, flash_attention=False,
              overlap_p2p_comm=False, mtp_num_layers=1, num_layers_in_first_pipeline_stage=2,
              num_layers_in_last_pipeline_stage=1, dp_size=8)
    n = 3
    flat = {k: np.repeat(v, n) for k, v in kw.items()}
    out = M.solve(wl, FL, engine=engine, recompute=np.array(["none", "selective", "full"]), **flat)
    assert out["valid"].all()
    step = out["step_latency_total"]
    assert step[0] <= step[1] <= step[2]
    # the even split of the same layout has no wait: its DP time is as before (no slack)
    even = dict(flat, num_layers_in_first_pipeline_stage=np.zeros(n, int),
                num_layers_in_last_pipeline_stage=np.zeros(n, int))
    e = M.solve(wl, FL, engine=engine, recompute=np.array(["none", "selective", "full"]), **even)
    assert (e["step_latency_total"][:-1] <= e["step_latency_total"][1:]).all()


def test_dropout_never_adds_memory_or_time_on_random_layouts():
    """Seeded random layouts (every kind of workload and fleet the fused tests draw): at
    dropout 0 a layout never needs more memory than at Megatron-Core's 0.1, and no output
    but memory and feasibility moves."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from test_fused_megatron import _draw

    rng = np.random.default_rng(23)
    for wl, fl in (("Llama3_8B_MC", "Selene_MC"), ("Mixtral_8x7B_MC", "GB200_NVL72_8_MC"),
                   ("DeepSeek_V3_MC", "HGX_H100_1K_MC")):
        workload, fleet = catalog.workload(wl), catalog.fleet(fl)
        k = _draw(rng, 2000, dp_given=True)
        on = M.solve(workload, fleet, **{**k, "hidden_dropout": 0.1, "attention_dropout": 0.1})
        off = M.solve(workload, fleet, **{**k, "hidden_dropout": 0.0, "attention_dropout": 0.0})
        valid = on["valid"]
        assert valid.sum() > 100
        assert np.all(off["memory_footprint"][valid] <= on["memory_footprint"][valid])
        assert np.any(off["memory_footprint"][valid] < on["memory_footprint"][valid])
        assert np.all(off["feasible"] >= on["feasible"])
        for name in M.OUTPUTS:
            if not name.startswith("memory") and name != "feasible":
                np.testing.assert_array_equal(off[name], on[name], err_msg=(wl, name))


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_combined_1f1b_hides_the_paired_microbatches_all_to_alls(engine):
    """overlap_moe_expert_parallel_comm [35]: each steady-state microbatch's EP all-to-alls
    hide behind the work of the one it is paired with. Mixtral 8x7B's compute covers them
    whole here, so what stays exposed is the unpaired microbatches' share: without a
    pipeline 1 of m; interleaved over 4 stages of 2 chunks, the first rank's warm-up of
    2 (p - 1) + (v - 1) p + 1 = 11 of its m v chunks. The step falls by exactly what is
    hidden; the gradient reduction (ZeRO 1: in the last backward, which runs unpaired),
    the bubble (the fill and drain run unpaired) and every other term stay."""
    if engine == "fused":
        pytest.importorskip("numba")
    wl = catalog.workload("Mixtral_8x7B_MC")
    for kw, exposed in ((dict(pp_size=1, v_stages=1, dp_size=64), 1.0 / 8.0),
                        (dict(pp_size=4, v_stages=2, dp_size=16), 11.0 / 16.0)):
        base = dict(batch_size=512 if kw["pp_size"] == 1 else 128, seq_len=4096, tp_size=1,
                    ep_size=8, micro_batch_size=1, recompute="selective", engine=engine, **kw)
        off = M.solve(wl, FL, **base)
        on = M.solve(wl, FL, **base, overlap_moe_expert_parallel_comm=True)
        assert off["realizable"] and on["realizable"] and off["microbatch_count"] == 8.0
        assert off["ep_communication_latency"] > 0.01 * off["step_latency_total"]
        np.testing.assert_allclose(on["ep_communication_latency"],
                                   exposed * off["ep_communication_latency"], rtol=1e-12)
        np.testing.assert_allclose(off["step_latency_total"] - on["step_latency_total"],
                                   off["ep_communication_latency"] - on["ep_communication_latency"],
                                   rtol=1e-9)
        for name in ("compute_latency", "tp_communication_latency", "pp_communication_latency",
                     "dp_communication_latency", "pipeline_bubble_latency",
                     "communication_latency", "launch_latency"):
            np.testing.assert_allclose(on[name], off[name], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_combined_1f1b_books_a_launch_bound_forwards_idle_host_time_as_launch(engine):
    """Where a phase is launch-bound, the pair's two host floors also absorb the idle
    host time of the phase beside it: that saving is launch time, not all-to-all, which
    stays within [0, what was exposed] (a review found it going negative at a launch
    floor 18x the fitted one)."""
    if engine == "fused":
        pytest.importorskip("numba")
    wl = catalog.workload("Mixtral_8x7B_MC")
    kw = dict(batch_size=1024, seq_len=8192, tp_size=1, pp_size=1, ep_size=4, dp_size=16,
              micro_batch_size=1, recompute="selective", layer_overhead=0.0159, engine=engine)
    off = M.solve(wl, FL, **kw)
    on = M.solve(wl, FL, **kw, overlap_moe_expert_parallel_comm=True)
    assert on["realizable"] and off["launch_latency"] > 0.0
    assert 0.0 <= on["ep_communication_latency"] < off["ep_communication_latency"]
    assert 0.0 <= on["launch_latency"] < off["launch_latency"]
    np.testing.assert_allclose(
        off["step_latency_total"] - on["step_latency_total"],
        (off["ep_communication_latency"] - on["ep_communication_latency"])
        + (off["launch_latency"] - on["launch_latency"]), rtol=1e-9)


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_combined_1f1b_holds_one_layer_more(engine):
    """[35]: a paired step's forward builds a layer of one microbatch while its backward
    frees a layer of another (layer i beside layer L - 1 - i): at the peak one layer's
    activations more than 1F1B holds. One microbatch pairs with none: nothing more."""
    if engine == "fused":
        pytest.importorskip("numba")
    from solver import megatron_memory as mem

    wl = catalog.workload("Mixtral_8x7B_MC")
    # the logits and the final norm's and the output layer's inputs beside them, and the
    # embedding dropout's mask (a byte an element, one microbatch in flight)
    logits = mem.logits_bytes(1, 4096.0, wl.vocab_size, tp_size=1) \
        + mem.head_input_bytes(1, 4096.0, wl.hidden_dim, norm_split=1) + 4096.0 * wl.hidden_dim
    for batch, more in ((512, 1.0 / wl.layers), (64, 0.0)):
        base = dict(batch_size=batch, seq_len=4096, tp_size=1, pp_size=1, ep_size=8, dp_size=64,
                    micro_batch_size=1, engine=engine)
        off = M.solve(wl, FL, **base)
        on = M.solve(wl, FL, **base, overlap_moe_expert_parallel_comm=True)
        np.testing.assert_allclose(on["memory_activations"] - logits,
                                   (1.0 + more) * (off["memory_activations"] - logits), rtol=1e-12)
        assert (on["memory_footprint"] > off["memory_footprint"]) == (more > 0)


def test_combined_1f1b_runs_only_where_megatron_core_allows_it():
    """Megatron-Core's TransformerConfig refuses overlap_moe_expert_parallel_comm without
    expert parallelism, with full recomputation, with a pipeline that is not interleaved
    and with more than one MTP layer [35]; each is named by why_unrealizable."""
    wl = catalog.workload("Mixtral_8x7B_MC")
    base = dict(batch_size=512, seq_len=4096, tp_size=1, pp_size=1, ep_size=8, dp_size=64,
                overlap_moe_expert_parallel_comm=True)
    assert not M.why_unrealizable(wl, FL, **base)
    for change in (dict(ep_size=1), dict(recompute="full"), dict(pp_size=2, dp_size=32),
                   dict(mtp_num_layers=2)):
        assert sorted(M.why_unrealizable(wl, FL, **{**base, **change})) == ["a2a_overlap"], change
    assert not M.why_unrealizable(wl, FL, **{**base, "pp_size": 2, "v_stages": 2, "dp_size": 32})
    assert not M.why_unrealizable(wl, FL, **{**base, "mtp_num_layers": 1})
    assert not M.why_unrealizable(wl, FL, **{**base, "recompute": "full",
                                             "overlap_moe_expert_parallel_comm": False})
    out = M.solve(wl, FL, **{**base, "recompute": np.array(["none", "selective", "full"])})
    assert out["realizable"].tolist() == [True, True, False]


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_fsdp_gathers_experts_over_the_expert_data_parallel_group_only(engine):
    """ZeRO-3 shards, gathers and reduces the expert weights over the expert DP group [6],
    the dense ones over the DP group. Mixtral 8x7B at EP 8 on 8 DP ranks has an expert DP
    group of one rank: its experts are whole on each rank, so neither its gather buffers nor
    its DP traffic grow with them (an audit found two layers' experts, 0.70 GB, in the
    buffers, and their gathers priced over the 8 dense peers). At EP 4 the group is two
    ranks, and the buffers hold exactly two layers of the rank's experts more."""
    if engine == "fused":
        pytest.importorskip("numba")
    wl = catalog.workload("Mixtral_8x7B_MC")
    wide = dataclasses.replace(wl, moe_ffn_hidden_dim=2 * wl.moe_ffn_hidden_dim)
    fl = catalog.fleet("DGX_B200_1K_MC")
    knobs = dict(batch_size=64, seq_len=4096, dp_size=8, zero_stage=3, recompute="full",
                 engine=engine, check_shape=False)
    ep = np.array([8, 4])
    out, out_wide = (M.solve(w, fl, ep_size=ep, **knobs) for w in (wl, wide))
    assert out["realizable"].all() and out_wide["realizable"].all()
    buf, buf_wide = out["memory_communication_buffers"], out_wide["memory_communication_buffers"]
    assert buf_wide[0] == pytest.approx(buf[0], rel=1e-12)
    assert out_wide["communication_latency"][0] == pytest.approx(out["communication_latency"][0],
                                                                 rel=1e-12)
    # two layers' gathered experts in 16 bits: 8 experts of 3 h x ffn over EP 4
    h, ffn = wl.hidden_dim, wl.moe_ffn_hidden_dim
    assert buf[1] - buf[0] == pytest.approx(2 * 2 * 8 * 3 * h * ffn / 4, rel=1e-9)
    assert buf_wide[1] - buf_wide[0] == pytest.approx(2 * (buf[1] - buf[0]), rel=1e-9)
    assert out_wide["communication_latency"][1] > out["communication_latency"][1]


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_a_faster_gpu_of_one_architecture_is_never_slower_at_any_tile_overhead(engine):
    """A GEMM tile's fixed cost is a time of the architecture (its fitted GEMM scale), not
    of a GPU's measured plateau share: priced over that share, GB200 (the higher peak, its
    share 72.88 % against B200's 77.56 %) paid longer tiles and came out slower than B200
    on the same node at FP4 (an audit, 2026-12-06: +0.16 % at the shipped constants, and
    A100 -> H100-like inversions up to 14 % at the bound of gemm_k_overhead). Same node,
    the two GPUs swapped, a seeded draw of dense layouts at three tile overheads up to the
    bound: GB200 never slower, and H200 never slower than H100. (Across architectures
    the fitted scales still differ, and near the bound an H100 can price slower than an
    A100: README, Fidelity.)"""
    if engine == "fused":
        pytest.importorskip("numba")
    base = catalog.fleet("HGX_H100_1K_MC")

    def on(name):
        return dataclasses.replace(base, node=dataclasses.replace(
            base.node, accelerator=catalog.accelerator(name)))
    wl = catalog.workload("Llama3_8B_MC")
    rng = np.random.default_rng(6)
    n = 3000
    kw = dict(batch_size=1024, seq_len=rng.choice([2048, 8192], n), tp_size=rng.choice([1, 2, 4, 8], n),
              pp_size=rng.choice([1, 2, 4], n), cp_size=rng.choice([1, 2], n),
              dp_size=rng.choice([8, 16, 64], n), micro_batch_size=rng.choice([1, 2, 4], n),
              sequence_parallel=True, recompute=rng.choice(["none", "selective", "full"], n),
              precision=rng.choice(["bf16", "fp8", "fp4"], n))
    for k_overhead in (M.CONSTANTS["gemm_k_overhead"], 1024.0, 8192.0):
        for slow, fast, prec in (("B200_MC", "GB200_MC", None), ("H100_SXM_MC", "H200_MC", "bf16")):
            knobs = dict(kw, precision=prec) if prec else kw
            a, b = (M.solve(wl, on(g), engine=engine, gemm_k_overhead=k_overhead, **knobs)
                    for g in (slow, fast))
            ok = np.asarray(a["realizable"]) & np.asarray(b["realizable"])
            assert ok.sum() > 500
            assert (np.asarray(b["step_latency_total"])[ok]
                    <= np.asarray(a["step_latency_total"])[ok] * (1 + 1e-12)).all(), (slow, k_overhead)


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_fsdp_expert_gathers_pay_one_call_per_moe_layer(engine):
    """FSDP's per-layer calls [9]: the dense weights' gathers and reduce-scatter once a
    layer over the DP group, the experts' once a MoE layer over the expert DP group
    (DeepSeek-V3: 61 layers, 3 of them dense; a review found the experts' calls counted
    on all 61). No overlap, so the DP term is the whole FSDP traffic."""
    if engine == "fused":
        pytest.importorskip("numba")
    wl, fl = catalog.workload("DeepSeek_V3_MC"), catalog.fleet("DGX_B200_1K_MC")
    knobs = dict(batch_size=64, seq_len=4096, dp_size=16, ep_size=8, zero_stage=3,
                 recompute="full", overlap_param_gather=False, overlap_grad_reduce=False,
                 engine=engine, check_shape=False)
    a, b = (float(M.solve(wl, fl, **knobs, collective_latency=lat)["dp_communication_latency"])
            for lat in (0.0, 1e-5))
    m = 64 / 16
    assert b - a == pytest.approx(m * 3 * ((61 - 1) + (58 - 1)) * 1e-5, rel=1e-9)


@pytest.mark.parametrize("key", ["ResNet50", "Mamba_2_8B", "YOLOv8_Nano", "ViT_Large",
                                 "StableDiffusion_v1_5", "OpenVLA_7B"])
def test_a_workload_that_is_no_transformer_is_refused(key):
    """A CNN or an SSM was priced as a transformer of its layer count (ResNet50 realizable,
    an MFU and all), silently; it is refused naming the workload and its kind, in solve,
    prepare, why_unrealizable and check_shape, before any pricing."""
    import solver

    wl = catalog.workload(key)
    assert not wl.is_transformer
    needle = (rf"workload {wl.name!r} is of kind {wl.kind!r}, but the megatron physics "
              r"prices transformers only \(kind 'transformer' or 'moe'\): price it with "
              r"physics='mlsysim'")
    knobs = dict(batch_size=256, tp_size=1, dp_size=8)
    for call in (lambda: solver.solve(wl, FL, physics="megatron", **knobs),
                 lambda: solver.solve(key, FL, physics="megatron", engine="numpy", **knobs),
                 lambda: M.solve(wl, FL, **knobs),
                 lambda: M.prepare(wl, FL, **knobs),
                 lambda: M.why_unrealizable(wl, FL, **knobs),
                 lambda: M.check_shape(wl)):
        with pytest.raises(ValueError, match=needle):
            call()
    # the mlsysim physics prices it as before
    assert bool(solver.solve(wl, FL, warn=False, **knobs)["valid"])
    # transformers and MoE pass the check, with and without a stated shape
    for ok in ("Llama3_70B_MC", "Mixtral_8x7B", "BERT_Base"):
        assert bool(M.solve(catalog.workload(ok), FL, **knobs, check_shape=False)["valid"])


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_the_vocabulary_is_padded_to_a_multiple_of_128_times_tp(engine):
    """Megatron pads the vocabulary to a multiple of 128 x TP [41]: Llama 3's 128,256 entries
    are 129,024 at TP 8, so a model of 129,024 prices every time and byte alike there (its
    MFU apart: the model FLOPs count the tokenizer's vocabulary), and differs at TP 1, where
    128,256 is already a multiple of 128."""
    if engine == "fused":
        pytest.importorskip("numba")
    llama = catalog.workload("Llama3_8B_MC")
    padded = dataclasses.replace(llama, vocab_size=129_024)
    kw = dict(batch_size=512, seq_len=8192, pp_size=2, dp_size=8, micro_batch_size=1,
              sequence_parallel=True, engine=engine)
    same = ("step_latency_total", "compute_latency", "memory_footprint", "memory_weights",
            "memory_activations", "dp_communication_latency", "optimizer_latency")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        at8 = [M.solve(w, FL, tp_size=8, **kw) for w in (llama, padded)]
        at1 = [M.solve(w, FL, tp_size=1, **kw) for w in (llama, padded)]
    for name in same:
        assert float(at8[0][name]) == float(at8[1][name]), name
    assert float(at8[0]["mfu"]) < float(at8[1]["mfu"])  # the same step, fewer model FLOPs
    for name in ("step_latency_total", "memory_weights"):
        assert float(at1[0][name]) < float(at1[1][name]), name
