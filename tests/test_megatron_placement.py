"""Where Megatron-Core's process groups land on the NVLink domains, and the MoE dispatcher.

A group is priced on NVLink only where every group of its kind lies inside one domain
(``Hardware.within``: ranks in order, tp-cp-dp-pp for the dense grid, tp-ep-dp-pp with
cp 1 for the expert grid, [6] of solver.physics.megatron). The tests tell the two links
apart by the fitted ``scale_up_efficiency``: a term priced on the fabric does not move
with it, a term priced on NVLink does.
"""

import types

import numpy as np
import pytest

from solver import catalog
from solver import megatron_memory as mem
from solver import network as net
from solver.physics import megatron as M
from solver.physics import megatron_steps as steps
from solver.physics.megatron_compose import _stage_params

NVL72 = catalog.fleet("GB200_NVL72_8_MC")  # 8 racks of 72
HGX = catalog.fleet("HGX_H100_1K_MC")      # 128 nodes of 8
QWEN = catalog.workload("Qwen3_30B_A3B_MC")  # 48 MoE layers, 128 experts, top-8, no shared
MIXTRAL = catalog.workload("Mixtral_8x7B_MC")
LLAMA8 = catalog.workload("Llama3_8B_MC")
LLAMA70 = catalog.workload("Llama3_70B_MC")


def _moves_with_nvlink(wl, fl, output, engine="numpy", **knobs):
    """Whether ``output`` changes when NVLink's efficiency does (priced on NVLink, at least in part)."""
    a, b = (float(M.solve(wl, fl, engine=engine, scale_up_efficiency=e, **knobs)[output])
            for e in (0.5, 0.9))
    assert a > 0 and b > 0
    return a != b


@pytest.mark.parametrize("span, world, inside", [
    (8, 576, True), (16, 576, False), (24, 576, True), (32, 576, False), (36, 576, True),
    (64, 576, False), (72, 576, True), (144, 576, False),
    (16, 64, True), (64, 64, True),  # the whole job in one rack: nothing straddles
])
def test_within_tiles_groups_and_domains_in_rank_order(span, world, inside):
    hw = steps.hardware(NVL72, M.CONSTANTS, np.array(0))
    assert hw.domain == 72
    assert bool(hw.within(span, world)) is inside


def test_within_on_eight_gpu_nodes():
    hw = steps.hardware(HGX, M.CONSTANTS, np.array(0))
    got = hw.within(np.array([1, 2, 4, 8, 16, 6, 6]), np.array([1024] * 6 + [8]))
    np.testing.assert_array_equal(got, [True, True, True, True, False, False, True])


@pytest.mark.parametrize("engine", ["numpy", "fused"])
@pytest.mark.parametrize("ep, on_nvlink", [(8, True), (16, False), (32, False)])
def test_expert_parallel_group_straddling_an_nvl72_rack_is_priced_on_the_fabric(engine, ep, on_nvlink):
    # TP 1, 576 ranks: EP groups of 16 or 32 consecutive ranks do not tile a rack of 72
    # (ranks 64-79 are in two racks), so the slowest group's all-to-all crosses the NICs
    knobs = dict(batch_size=1152, seq_len=4096, tp_size=1, ep_size=ep, micro_batch_size=1,
                 recompute="none")
    assert _moves_with_nvlink(QWEN, NVL72, "ep_communication_latency", engine, **knobs) is on_nvlink


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_expert_parallel_group_spans_tp_ep_not_cp(engine):
    # The expert grid has no CP (MoE parallel folding, [6]): EP 8 at TP 1 and CP 4 is one
    # node's 8 ranks, on NVLink; EP 16 spans two nodes
    knobs = dict(batch_size=256, seq_len=8192, tp_size=1, cp_size=4, micro_batch_size=1,
                 recompute="none")
    assert _moves_with_nvlink(MIXTRAL, HGX, "ep_communication_latency", engine, ep_size=8, **knobs)
    assert not _moves_with_nvlink(MIXTRAL, HGX, "ep_communication_latency", engine, ep_size=16,
                                  **{**knobs, "cp_size": 2})


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_context_parallel_group_straddling_an_nvl72_rack(engine):
    # short sequences: the K/V ring outlasts the attention it hides behind
    knobs = dict(batch_size=576, seq_len=2048, pp_size=1, micro_batch_size=1, recompute="none",
                 sequence_parallel=True)
    # TP 4 x CP 2 = 8 ranks tile the rack; TP 8 x CP 2 = 16 do not
    assert _moves_with_nvlink(LLAMA70, NVL72, "cp_communication_latency", engine, tp_size=4,
                              cp_size=2, **knobs)
    assert not _moves_with_nvlink(LLAMA70, NVL72, "cp_communication_latency", engine, tp_size=8,
                                  cp_size=2, **knobs)


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_racks_of_64_as_nvidias_launchers_fill_them_keep_ep_64_on_nvlink(engine):
    """NVIDIA's launchers run a 1,024-GPU job on 64 GPUs of each NVL72 rack (Slurm segments
    of 16 trays); the catalog's GB200_NVL72_1K_MC is that. DeepSeek-V3 at EP 64 over 1,024
    GPUs: its groups tile racks of 64 and straddle racks filled to 72, whose all-to-all
    then crosses the fabric and costs several times more."""
    wl = catalog.workload("DeepSeek_V3_MC")
    knobs = dict(batch_size=8192, seq_len=4096, tp_size=1, pp_size=16, ep_size=64, dp_size=64,
                 micro_batch_size=1, recompute="selective", precision="fp8",
                 num_layers_in_first_pipeline_stage=3, num_layers_in_last_pipeline_stage=2,
                 check_shape=False)
    racks64 = catalog.fleet("GB200_NVL72_1K_MC")
    assert racks64.node.scale_up_domain == 64 and racks64.total_accelerators == 1024
    assert _moves_with_nvlink(wl, racks64, "ep_communication_latency", engine, **knobs)
    assert not _moves_with_nvlink(wl, NVL72, "ep_communication_latency", engine, **knobs)
    a2a = {fl: float(M.solve(wl, catalog.fleet(fl), engine=engine, **knobs)["ep_communication_latency"])
           for fl in ("GB200_NVL72_8_MC", "GB200_NVL72_1K_MC")}
    assert a2a["GB200_NVL72_8_MC"] > 5 * a2a["GB200_NVL72_1K_MC"]


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_fsdp_group_spans_tp_times_its_size(engine):
    # ZeRO-3 peers are tp ranks apart: 4 of them at TP 8 are on 4 nodes (the fabric), at
    # TP 2 on one node (NVLink)
    knobs = dict(batch_size=64, seq_len=4096, pp_size=1, dp_size=4, micro_batch_size=1,
                 zero_stage=3, recompute="full", overlap_param_gather=False,
                 overlap_grad_reduce=False, sequence_parallel=True)
    assert not _moves_with_nvlink(LLAMA70, HGX, "dp_communication_latency", engine, tp_size=8, **knobs)
    assert _moves_with_nvlink(LLAMA70, HGX, "dp_communication_latency", engine, tp_size=2, **knobs)


@pytest.mark.parametrize("engine", ["numpy", "fused"])
@pytest.mark.parametrize("dp, cross", [(2, 0.0), (4, 0.5), (8, 1.0)])
def test_pipeline_sends_cross_the_fabric_where_stages_straddle_nodes(engine, dp, cross):
    # Llama 3 8B, TP 1, PP 4 on nodes of 8: stages dp ranks apart. DP 2: the whole job is
    # one node; DP 4: stages 0-1 and 2-3 share nodes, the 1-2 and 3-0 boundaries cross
    # (half of the cyclic chain); DP 8: every stage is a node. 1F1B: the first and last
    # sends cross the 3 boundaries, the steady state's m exchanges wait on the slowest.
    m = 4
    out = M.solve(LLAMA8, HGX, engine=engine, batch_size=dp * m, seq_len=4096, tp_size=1,
                  pp_size=4, dp_size=dp, micro_batch_size=1, recompute="none")
    c = M.CONSTANTS
    node, fabric = HGX.node, HGX.fabric
    act = 2.0 * 4096 * LLAMA8.hidden_dim  # one microbatch's activations, 16 bits
    t_in = act / (node.scale_up_bus_bandwidth * c["scale_up_efficiency"]) \
        + steps.SCALE_UP_STEP_LATENCY + c["collective_latency"]
    t_out = act / (node.nic_bandwidth * c["scale_out_efficiency"]) + fabric.latency \
        + c["collective_latency"]
    ramp = cross * t_out + (1 - cross) * t_in
    slow = t_out if cross > 0 else t_in
    assert float(out["pp_communication_latency"]) == pytest.approx(2 * (3 * ramp + m * slow), rel=1e-12)


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_moe_dispatcher_gathers_routed_tokens_over_tp(engine):
    # With TP the all-to-all dispatcher all-gathers the k routed copies over the (expert)
    # TP group and reduce-scatters them back ([31]); EP 1 leaves that alone. The MoE
    # layer's own TP pairs: the attention's only (Qwen3-30B-A3B has no shared expert).
    tp, s, mbs, m = 2, 4096, 1, 2
    out = M.solve(QWEN, HGX, engine=engine, batch_size=512 * m, seq_len=s, tp_size=tp, pp_size=1,
                  dp_size=512, ep_size=1, micro_batch_size=mbs, recompute="none",
                  sequence_parallel=True, tp_comm_overlap=False)
    c = M.CONSTANTS
    bw = HGX.node.scale_up_bus_bandwidth * c["scale_up_efficiency"]
    lat, call = steps.SCALE_UP_STEP_LATENCY, c["collective_latency"]
    act = 2.0 * mbs * s * QWEN.hidden_dim
    k = QWEN.active_experts_per_token
    one = net.all_gather_time(k * act, tp, bus_bandwidth=bw, latency=lat)
    dispatch = 2 * one + 2 * call  # AG + RS (same cost), forward; the same backward
    layers = QWEN.layers
    assert float(out["ep_communication_latency"]) == pytest.approx(m * layers * 2 * dispatch, rel=1e-12)
    pair = net.allreduce_time(act, tp, bus_bandwidth=bw, latency=lat) + 2 * call  # RS + AG: two calls
    assert float(out["tp_communication_latency"]) == pytest.approx(m * layers * 2 * pair, rel=1e-12)


def test_expert_gradients_reduce_over_peers_tp_ep_apart():
    # TP 1, EP 8 on nodes of 8: every expert data-parallel peer is on another node, so the
    # expert gradients' reduce-scatter and the parameters' all-gather run flat over the
    # fabric; the dense ones run two-level (8 per node). No overlap: all exposed.
    dp = 1024
    out = M.solve(QWEN, HGX, batch_size=dp, seq_len=4096, tp_size=1, pp_size=1, ep_size=8,
                  micro_batch_size=1, zero_stage=1, overlap_grad_reduce=False,
                  overlap_param_gather=False)
    c = M.CONSTANTS
    w = M._Shape(QWEN)
    dense, expert, heavy = _stage_params(w, types.SimpleNamespace(tp=1, pp=1, ep=8, etp=1, v=1, mtp=0, first=0, last=0), np.float64(48))
    up = dict(scale_up_bandwidth=HGX.node.scale_up_bus_bandwidth * c["scale_up_efficiency"],
              scale_up_latency=steps.SCALE_UP_STEP_LATENCY,
              scale_out_bandwidth=HGX.node.nic_bandwidth * c["scale_out_efficiency"],
              scale_out_latency=HGX.fabric.latency)
    t = (net.two_level_time("reduce_scatter", 4.0 * heavy, dp, 8, **up)
         + net.two_level_time("reduce_scatter", 4.0 * expert, dp // 8, 1, **up)
         + net.two_level_time("all_gather", 2.0 * heavy, dp, 8, **up)
         + net.two_level_time("all_gather", 2.0 * expert, dp // 8, 1, **up))
    assert float(out["dp_communication_latency"]) == pytest.approx(float(t), rel=1e-12)


def test_routed_copies_are_whole_on_every_tp_rank():
    # Two routed copies more (k 2 -> 4 at the same k x expert width) add 2 x 2 bytes per
    # s b h element, on every TP rank, with or without SP (the dispatcher gathers them)
    s, b, h = 4096, 2, 4096
    kw = dict(heads=32, kv_heads=8, ffn_hidden=14336, gated=True, flash_attention=True,
              recompute_code=0)
    for t, sp in ((1, False), (4, True), (8, True)):
        two, four = (mem.layer_activation_bytes(b, s, h, tp_size=t, sequence_parallel=sp,
                                                moe_top_k=k, moe_ffn_hidden=8192 / k, **kw)
                     for k in (2, 4))
        assert four - two == pytest.approx(2 * 2 * s * b * h, rel=1e-12)
        fp8 = [mem.layer_activation_bytes(b, s, h, tp_size=t, sequence_parallel=sp, low_bits=True,
                                          moe_top_k=k, moe_ffn_hidden=8192 / k, **kw) for k in (2, 4)]
        assert fp8[1] - fp8[0] == pytest.approx(2 * 1 * s * b * h, rel=1e-12)


def test_split_all_to_all_is_the_plain_one_inside_a_domain():
    m, bw = 3e8, 4e11
    for n in (1, 2, 8):
        assert net.split_all_to_all_time(m, n, n, scale_up_bandwidth=bw, scale_up_latency=2e-6,
                                         scale_out_bandwidth=1e9, scale_out_latency=1.0) \
            == net.all_to_all_time(m, n, bus_bandwidth=bw, latency=2e-6)
    # 16 ranks on two nodes: 7 peers near, 8 far, at once; the far ones take longer
    t = net.split_all_to_all_time(m, 16, 8, scale_up_bandwidth=bw, scale_up_latency=2e-6,
                                  scale_out_bandwidth=4e10, scale_out_latency=5e-6)
    assert t == pytest.approx(8 / 16 * m / 4e10 + 15 * 5e-6, rel=1e-12)


@pytest.mark.parametrize("engine", ["numpy", "fused"])
@pytest.mark.parametrize("fleet, ep, near, world", [
    (HGX, 16, 8, None), (HGX, 64, 8, None), (NVL72, 16, 8, None), (NVL72, 64, 8, None),
    (NVL72, 144, 72, None),
    (NVL72, 128, 56, 128),  # one group over the job: 72 in rack 0, 56 in rack 1 (had been 8)
    (NVL72, 256, 40, 256),  # one group: 72, 72, 72 and 40
    (NVL72, 128, 8, 256),   # two groups: the second's 16, 72 and 40, priced by the gcd, 8
])
def test_expert_all_to_all_sends_over_the_nics_only_to_far_peers(engine, fleet, ep, near, world):
    # TP 1: the slowest rank has gcd(domain, ep) peers in its own domain (8 of an EP 64
    # group straddling a rack of 72 at ranks 64-127; a whole node of 8 on HGX), a bound;
    # one group over the whole job, those of its last rack
    dp = world or fleet.total_accelerators
    s, m = 4096, 2
    out = M.solve(QWEN, fleet, engine=engine, batch_size=m * dp, seq_len=s, tp_size=1, pp_size=1,
                  ep_size=ep, micro_batch_size=1, recompute="none",
                  **({"dp_size": world} if world else {}))
    c = M.CONSTANTS
    node = fleet.node
    up = node.scale_up_bus_bandwidth * c["scale_up_efficiency"]
    far_bw = node.nic_bandwidth * c["scale_out_efficiency"]
    nbytes = 2.0 * s * QWEN.hidden_dim * QWEN.active_experts_per_token
    a2a = max((near - 1) / ep * nbytes / up, (ep - near) / ep * nbytes / far_bw) \
        + (ep - 1) * fleet.fabric.latency + c["collective_latency"]
    # dispatch and combine, forward and backward, every layer and microbatch
    assert float(out["ep_communication_latency"]) == pytest.approx(m * QWEN.layers * 4 * a2a, rel=1e-12)


@pytest.mark.parametrize("ep, local_sorts", [(8, True), (128, False)])
def test_moe_token_permutes_are_copies_at_hbm_bandwidth(monkeypatch, ep, local_sorts):
    # [32]: permute (2k) and unpermute (k + 2) of the rank's SP slice of tokens, and with
    # more than one local expert the sorts of all k x tokens received copies (2 x 2)
    seen = []
    real = steps.gemm.memory_bound_time

    def spy(nbytes, bandwidth, **kw):
        seen.append(np.asarray(nbytes, dtype=float))
        return real(nbytes, bandwidth, **kw)

    monkeypatch.setattr(steps.gemm, "memory_bound_time", spy)
    tp, s = 2, 4096
    M.solve(QWEN, HGX, engine="numpy", batch_size=512, seq_len=s, tp_size=tp, pp_size=1,
            dp_size=512, ep_size=ep, micro_batch_size=1, sequence_parallel=True)
    k, h = QWEN.active_experts_per_token, QWEN.hidden_dim
    elements = (3 * k + 2) * s / tp + (4 * k * s if local_sorts else 0)
    assert any(b.size == 1 and float(b) == pytest.approx(2 * elements * h, rel=1e-12) for b in seen)


@pytest.mark.parametrize("engine", ["numpy", "fused"])
@pytest.mark.parametrize("pp, dp, up", [
    (2, 8, 1),   # the second stage's DP groups: 1 peer in one rack, 7 in the next
    (1, 9, 9),   # TP 8 x DP 9 = 72: every group inside one rack
    (1, 18, 9),  # 144 ranks cover two racks, 9 peers in each
    (1, 16, 7),  # 128 ranks, one group: 9 peers in rack 0, 7 in rack 1 (had been priced 1)
    (1, 32, 5),  # 256 ranks, one group: 9, 9, 9 and 5 in rack 3
    (2, 16, 1),  # 2 x 128: stage 1's group holds 2, 9 and 5; priced 8 / 8 = 1, a bound
])
def test_data_parallel_groups_share_the_nvl72_racks_evenly_or_are_priced_by_the_fewest_peers(
        engine, pp, dp, up):
    # Llama 3 70B at TP 8 on racks of 72: DP peers are 8 ranks apart and a group spans
    # 8 x DP. Where the groups do not share the racks evenly the rack with the fewest peers
    # carries the cross-rack traffic: priced as if every rack held that few (one group: its
    # last rack's; more: 8 / 8, the power of two dividing 72 and the span). ZeRO 0, no overlap:
    # the all-reduce of the stage's gradients, exposed whole.
    out = M.solve(LLAMA70, NVL72, engine=engine, batch_size=8 * dp, seq_len=4096, tp_size=8,
                  pp_size=pp, dp_size=dp, micro_batch_size=1, sequence_parallel=True,
                  recompute="full", zero_stage=0, overlap_grad_reduce=False,
                  overlap_param_gather=False)
    c = M.CONSTANTS
    w = M._Shape(LLAMA70)
    ns = types.SimpleNamespace(tp=8, pp=pp, ep=1, etp=8, v=1, mtp=0, first=0, last=0)
    heavy = _stage_params(w, ns, np.float64(w.layers / pp))[2]
    node = NVL72.node
    t = net.two_level_time("all_reduce", 4.0 * heavy, dp, up,
                           scale_up_bandwidth=node.scale_up_bus_bandwidth * c["scale_up_efficiency"],
                           scale_up_latency=steps.SCALE_UP_STEP_LATENCY,
                           scale_out_bandwidth=node.nic_bandwidth * c["scale_out_efficiency"],
                           scale_out_latency=NVL72.fabric.latency)
    assert float(out["dp_communication_latency"]) == pytest.approx(float(t), rel=1e-12)


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_an_nvl72_rack_never_prices_data_parallel_traffic_above_eight_gpu_domains(engine):
    """The same GPUs, NVLink and NICs with the domain cut to 8: a rack of 72 holds every
    8-GPU domain's peers and more, so no collective may come out slower. Straddling groups
    had been priced one peer a rack: 128 GPUs of Qwen3-30B-A3B took 1.03 s a step against
    0.45 s at 144, and 36 % of a draw's layouts were slower than on the cut fleet."""
    import dataclasses
    node = dataclasses.replace(NVL72.node, accelerators_per_node=8, scale_up_domain=8)
    cut = dataclasses.replace(NVL72, node=node, count=72)
    rng = np.random.default_rng(11)
    n = 6000
    for wl in (QWEN, MIXTRAL, LLAMA70):
        knobs = dict(batch_size=1024, seq_len=4096, tp_size=rng.choice([1, 2, 4, 8], n),
                     pp_size=rng.choice([1, 2, 4], n), cp_size=rng.choice([1, 2], n),
                     ep_size=rng.choice([1, 2, 4, 8], n) if wl is not LLAMA70 else 1,
                     dp_size=rng.choice([8, 16, 32, 64, 128], n), zero_stage=rng.choice([0, 1, 2, 3], n),
                     micro_batch_size=1, sequence_parallel=True, recompute="full")
        a = M.solve(wl, NVL72, engine=engine, **knobs)
        b = M.solve(wl, cut, engine=engine, **knobs)
        ok = np.asarray(a["valid"]) & np.asarray(b["valid"])
        assert ok.sum() > 1000
        dp_a, dp_b = (np.asarray(o["dp_communication_latency"])[ok] for o in (a, b))
        assert (dp_a <= dp_b * (1 + 1e-12)).all(), wl.name
        step_a, step_b = (np.asarray(o["step_latency_total"])[ok] for o in (a, b))
        assert (step_a <= step_b * (1 + 1e-12)).all(), wl.name


def test_miss_all_is_the_hypergeometric_chance_of_no_hit():
    from math import comb
    for e, k, m in ((128, 8, 8), (128, 8, 64), (256, 8, 32), (8, 2, 4), (8, 2, 7), (8, 2, 8)):
        got = float(steps.miss_all(e, k, np.float64(m)))
        assert got == pytest.approx(comb(e - m, k) / comb(e, k), rel=1e-12, abs=1e-300)


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_deepep_sends_a_token_once_a_rank_and_a_domain_not_once_a_copy(engine):
    """The flex dispatcher with DeepEP [39]: Qwen3-30B-A3B (128 experts, top-8) at TP 1 on
    nodes of 8. EP 8 inside a node: a token reaches each of the 7 other ranks holding any
    of its experts once, 7 x P(rank) copies, where the all-to-all sends 8 x 7/8; EP 16 over
    two nodes: the other node once where any of its 64 experts is among the token's 8,
    P(node) copies over the NICs, where the all-to-all sends 8 x 8/16. The bytes scale
    with the tokens and the latency does not, so the difference of two sequence lengths
    is the bandwidth term alone; its ratio to the all-to-all's is the copies' ratio."""
    from math import comb
    if engine == "fused":
        pytest.importorskip("numba")
    e, k = 128, 8

    def ep_time(ep, deepep, s):
        return float(M.solve(QWEN, HGX, engine=engine, batch_size=1024, seq_len=s, tp_size=1,
                             pp_size=1, dp_size=1024, ep_size=ep, micro_batch_size=1,
                             recompute="none", moe_enable_deepep=deepep)["ep_communication_latency"])

    def ratio(ep):
        flex = ep_time(ep, True, 8192) - ep_time(ep, True, 4096)
        a2a = ep_time(ep, False, 8192) - ep_time(ep, False, 4096)
        assert flex > 0 and a2a > 0
        return flex / a2a
    hit_rank = 1 - comb(e - e // 8, k) / comb(e, k)
    assert ratio(8) == pytest.approx(7 * hit_rank / (k * 7 / 8), rel=1e-9)
    hit_node = 1 - comb(e - 64, k) / comb(e, k)
    assert ratio(16) == pytest.approx(hit_node / (k * 8 / 16), rel=1e-9)  # about 4x less
    assert ratio(16) < 0.26


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_deepep_needs_an_expert_group_and_leaves_a_dense_model_alone(engine):
    if engine == "fused":
        pytest.importorskip("numba")
    knobs = dict(batch_size=64, seq_len=4096, tp_size=1, pp_size=1, dp_size=8, micro_batch_size=1,
                 engine=engine)
    why = M.why_unrealizable(QWEN, HGX, ep_size=1, moe_enable_deepep=True,
                             **{k: v for k, v in knobs.items() if k != "engine"})
    assert list(why) == ["deepep_group"] and bool(why["deepep_group"])
    assert not bool(M.solve(QWEN, HGX, ep_size=1, moe_enable_deepep=True, **knobs)["realizable"])
    assert bool(M.solve(QWEN, HGX, ep_size=2, moe_enable_deepep=True, **knobs)["realizable"])
    a, b = (M.solve(LLAMA8, HGX, moe_enable_deepep=flag, **knobs) for flag in (False, True))
    assert bool(b["realizable"])
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_deepep_reaches_eight_nvlink_peers_of_an_nvl72_rack(engine):
    """DeepEP's normal kernels reach 8 NVLink peers (NUM_MAX_NVL_PEERS) [39]: EP 16 of
    Qwen3-30B-A3B inside a rack of 64 is two groups of 8 joined over the NICs, where the
    all-to-all dispatcher runs wholly on the rack's NVLink. So DeepEP's exchange is the NIC
    copy of a token to the other group, P(hit) of the other 64 experts, against the
    all-to-all's 8 x 15/16 copies on NVLink (a bandwidth ratio; the tokens' difference
    leaves out the latency). Megatron-Bridge refuses DeepEP on GB200, so such a layout is
    priced but not realizable (rule deepep_domain); on B200 nodes of 8 it is."""
    from math import comb
    if engine == "fused":
        pytest.importorskip("numba")
    fl = catalog.fleet("GB200_NVL72_1K_MC")
    hw = steps.hardware(fl, M.CONSTANTS, np.array(0))

    def ep_time(deepep, s):
        return float(M.solve(QWEN, fl, engine=engine, batch_size=1024, seq_len=s, tp_size=1,
                             pp_size=1, dp_size=1024, ep_size=16, micro_batch_size=1,
                             recompute="none", moe_enable_deepep=deepep)["ep_communication_latency"])
    flex = ep_time(True, 8192) - ep_time(True, 4096)
    a2a = ep_time(False, 8192) - ep_time(False, 4096)
    hit_group = 1 - comb(128 - 64, 8) / comb(128, 8)
    want = (hit_group / hw.out_bw) / (8 * 15 / 16 / hw.up_bw)
    assert flex / a2a == pytest.approx(want, rel=1e-9)
    assert flex > a2a  # on the rack's NVLink the all-to-all is the faster
    knobs = dict(batch_size=1024, seq_len=4096, tp_size=1, pp_size=1, dp_size=1024, ep_size=16,
                 micro_batch_size=1, recompute="none", moe_enable_deepep=True)
    why = M.why_unrealizable(QWEN, fl, **knobs)
    assert list(why) == ["deepep_domain"] and bool(why["deepep_domain"])
    assert not bool(M.solve(QWEN, fl, engine=engine, **knobs)["realizable"])
    b200 = catalog.fleet("DGX_B200_1K_MC")
    assert M.why_unrealizable(QWEN, b200, **knobs) == {}
    assert bool(M.solve(QWEN, b200, engine=engine, **knobs)["realizable"])
