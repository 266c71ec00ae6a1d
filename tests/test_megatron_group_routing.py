"""Group-limited routing in the megatron physics ([46] of solver.physics.megatron):
Megatron-Core's moe_router_num_groups and moe_router_group_topk (DeepSeek-V3's node-limited
routing). Held against an exact count of the routings, a closed form of the flex
dispatcher's fabric time, Megatron-Core's rules, the limits, and random layouts of every
knob (the fused kernel prices it beside it, the same bits)."""

import itertools
import sys
import warnings
from math import comb
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from solver import catalog
from solver.physics import megatron as M
from solver.physics import megatron_steps as steps

sys.path.insert(0, str(Path(__file__).parent))
from _megatron_steps import solve  # noqa: E402
from test_fused_megatron import _draw  # noqa: E402

GROUPS, TOPK = "moe_router_num_groups", "moe_router_group_topk"


def _solve(workload, fleet, engine="numpy", **kw):
    return solve(workload, fleet, engine, **kw)


def _counted_miss(experts, k, unit, groups, group_topk):
    """The share of a token's routings (every choice of group_topk groups, then every choice of
    k / group_topk experts in each, all alike) whose experts miss the first `unit` experts:
    counted."""
    size, per = experts // groups, k // group_topk
    missed = total = 0
    for chosen in itertools.combinations(range(groups), group_topk):
        ways_missed = ways = 1
        for g in chosen:
            inside = max(0, min(unit, (g + 1) * size) - g * size)
            ways_missed *= comb(size - inside, per)
            ways *= comb(size, per)
        missed += ways_missed
        total += ways
    return missed / total


@pytest.mark.parametrize("experts,k,groups", [(16, 4, 4), (16, 2, 8), (32, 8, 8), (24, 6, 4)])
def test_the_miss_chance_is_the_counted_one(experts, k, groups):
    """Every unit that nests with the groups (a rank's block inside a group, a domain of whole
    groups) and every group_topk the rule admits: the closed form is the exact count; where
    neither nests, or the groups break the rule, or every group is chosen (no mask), uniform
    routing's miss."""
    size = experts // groups
    checked = 0
    for g in range(1, groups + 1):
        # (all chosen: the plain top-k; one expert a group: near it, priced so)
        if k % g or size < k // g or g == groups or k == g:
            for unit in (1, size, experts):
                assert float(steps.routed_miss(float(experts), float(k), float(unit), groups, g)) \
                    == float(steps.miss_all(float(experts), float(k), float(unit))), (g, unit)
            continue
        for unit in range(1, experts + 1):
            got = float(steps.routed_miss(float(experts), float(k), float(unit), groups, g))
            uniform = float(steps.miss_all(float(experts), float(k), float(unit)))
            if unit % size == 0 or size % unit == 0:
                assert got == pytest.approx(_counted_miss(experts, k, unit, groups, g),
                                            rel=1e-12, abs=1e-15), (g, unit)
                checked += 1
            else:
                assert got == uniform
    assert checked >= 8
    # one group, chosen: uniform routing
    for unit in (1, size, experts):
        assert float(steps.routed_miss(float(experts), float(k), float(unit), 1, 1)) \
            == pytest.approx(float(steps.miss_all(float(experts), float(k), float(unit))),
                             rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("experts,k,groups,group_topk,unit", [
    (256, 8, 8, 4, 32),   # DeepSeek-V3's node-limited routing, a node of EP 64 over 8
    (256, 8, 8, 4, 64),   # two nodes
    (256, 8, 8, 4, 4),    # an EP rank inside a node
    (64, 8, 8, 4, 8),
    (256, 8, 64, 8, 4),   # device-limited routing, a rank a group
    (64, 4, 4, 2, 16),    # half the groups, a group a unit
    (64, 4, 4, 2, 2),     # a unit inside a group
    (64, 4, 16, 4, 4)])   # one expert a chosen group: priced as uniform
def test_the_router_simulated_agrees(experts, k, groups, group_topk, unit):
    """Megatron-Core's group_limited_topk run on scores drawn alike for every expert: each
    group scored by the sum of its best k / group_topk, the best group_topk kept, the top-k
    of their experts taken. The share of tokens that miss the unit agrees with routed_miss
    within 0.012 (20,000 tokens: 0.0036 of sampling error at 0.5)."""
    rng = np.random.default_rng(462)
    n, size, per = 20_000, experts // groups, k // group_topk
    scores = rng.standard_normal((n, experts))
    grouped = scores.reshape(n, groups, size)
    group_scores = np.sort(grouped, axis=2)[:, :, size - per:].sum(axis=2)
    chosen = np.argsort(-group_scores, axis=1)[:, :group_topk]
    keep = np.zeros((n, groups), dtype=bool)
    np.put_along_axis(keep, chosen, True, axis=1)
    masked = np.where(np.repeat(keep, size, axis=1), scores, -np.inf)
    top = np.argpartition(-masked, k - 1, axis=1)[:, :k]
    simulated = np.mean(~np.any(top < unit, axis=1))
    model = float(steps.routed_miss(float(experts), float(k), float(unit), groups, group_topk))
    assert abs(model - simulated) < 0.012, (model, simulated)


def test_deepseek_v3s_nodes_on_the_fabric():
    """DeepSeek-V3 (256 experts, top 8) at EP 64 over 8 HGX nodes with DeepEP, node-limited
    routing (8 groups, 4 chosen, 2 experts in each): a remote node is reached with 1 -
    C(7, 4) / C(8, 4) = 1/2, against 1 - C(224, 8) / C(256, 8) routed over all; the
    fabric's bytes (which pace the dispatch here) scale by the ratio."""
    hw = SimpleNamespace(up_bw=450e9, out_bw=50e9, up_lat=0.0, out_lat=0.0)
    token_bytes = 1e8
    off = steps.flex_dispatch_time(token_bytes, 256.0, 8.0, 64, 64, 8, hw, 0.0)
    on = steps.flex_dispatch_time(token_bytes, 256.0, 8.0, 64, 64, 8, hw, 0.0, 8, 4)
    hit_on = 1.0 - comb(7, 4) / comb(8, 4)
    hit_off = 1.0 - comb(224, 8) / comb(256, 8)
    assert float(off) == pytest.approx(7 * hit_off * token_bytes / hw.out_bw, rel=1e-12)
    assert float(on) == pytest.approx(7 * hit_on * token_bytes / hw.out_bw, rel=1e-12)
    # 4 nodes a token, its own among them or not
    assert 8 * hit_on == pytest.approx(4.0, rel=1e-12) and 8 * hit_off > 5.0
    # a fabric as fast as it gets: NVLink paces, a rank of 4 experts reached with
    # 1 - (1/2 + 1/2 C(28, 2) / C(32, 2)), against 1 - C(252, 8) / C(256, 8)
    fast = SimpleNamespace(up_bw=450e9, out_bw=1e18, up_lat=0.0, out_lat=0.0)
    off = steps.flex_dispatch_time(token_bytes, 256.0, 8.0, 64, 64, 8, fast, 0.0)
    on = steps.flex_dispatch_time(token_bytes, 256.0, 8.0, 64, 64, 8, fast, 0.0, 8, 4)
    rank_on = 1.0 - (0.5 + 0.5 * comb(28, 2) / comb(32, 2))
    rank_off = 1.0 - comb(252, 8) / comb(256, 8)
    assert float(off) == pytest.approx(63 * rank_off * token_bytes / fast.up_bw, rel=1e-12)
    assert float(on) == pytest.approx(63 * rank_on * token_bytes / fast.up_bw, rel=1e-12)


def test_megatron_cores_rules():
    """Megatron-Core's TransformerConfig: the groups set, dividing the experts, no fewer than
    the chosen ones; Transformer Engine's fused router: the chosen ones divide top-k; and a
    group holds top-k / the chosen ones. A dense model and the groups alone break nothing,
    and a count below 0 is refused."""
    wl, fl = catalog.workload("Mixtral_8x7B_MC"), catalog.fleet("HGX_H100_1K_MC")  # 8 experts, top 2
    kw = dict(batch_size=64, seq_len=4096, tp_size=1, dp_size=8, ep_size=8, etp_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert M.why_unrealizable(wl, fl, **{GROUPS: 4, TOPK: 2}, **kw) == {}
        assert M.why_unrealizable(wl, fl, **{GROUPS: 8, TOPK: 2}, **kw) == {}
        for bad in ({TOPK: 2}, {GROUPS: 3, TOPK: 1}, {GROUPS: 2, TOPK: 4}, {GROUPS: 8, TOPK: 1},
                    {GROUPS: 4, TOPK: 4}, {GROUPS: 1, TOPK: 2}):
            assert sorted(M.why_unrealizable(wl, fl, **bad, **kw)) == ["moe_router_groups"], bad
        # {GROUPS: 8, TOPK: 1}: groups of one expert, two taken of each; {GROUPS: 4, TOPK: 4}:
        # 4 does not divide top-2 alone; {GROUPS: 1, TOPK: 2}: more chosen than there are
        for name in (GROUPS, TOPK):
            with pytest.raises(ValueError, match=name):
                M.solve(wl, fl, **{name: -1}, **kw)
        assert M.why_unrealizable(wl, fl, **{GROUPS: 3}, **kw) == {}
        dense = catalog.workload("Llama3_8B_MC")
        assert M.why_unrealizable(dense, fl, **{GROUPS: 3, TOPK: 5}, batch_size=64,
                                  seq_len=4096, dp_size=8) == {}


EP_FED = ("ep_communication_latency", "communication_latency", "step_latency_total",
          "effective_throughput", "tokens_per_second_per_accelerator",
          "model_flops_per_accelerator", "mfu", "hfu", "pipeline_bubble_latency",
          "bubble_fraction", "dp_communication_latency", "pp_communication_latency",
          "launch_latency")


@pytest.mark.parametrize("fleet", ("HGX_H100_1K_MC", "DGX_B200_1K_MC"))
def test_it_moves_the_flex_dispatcher_only_and_never_adds(fleet):
    """DeepSeek-V3 on random layouts of every knob with DeepEP: node-limited routing (8 groups,
    4 chosen) never lengthens the exposed EP time nor the step, shortens some, and leaves
    every output the EP time does not feed the same bits. With the all-to-all dispatcher,
    or all the groups chosen, nothing moves (to rounding)."""
    rng = np.random.default_rng(460)
    n = 1500
    k = {**_draw(rng, n, dp_given=True), "ep_size": rng.choice([8, 16, 32, 64], n),
         "etp_size": 1, "moe_enable_deepep": True}
    off = _solve("DeepSeek_V3_MC", fleet, **k)
    on = _solve("DeepSeek_V3_MC", fleet, **k, **{GROUPS: 8, TOPK: 4})
    ok = np.asarray(off["valid"])
    assert ok.sum() > 150
    for name in ("ep_communication_latency", "step_latency_total"):
        a, b = np.asarray(on[name])[ok], np.asarray(off[name])[ok]
        assert np.all(a <= b * (1.0 + 1e-12)), name
        assert np.any(a < b * (1.0 - 1e-3)), name
    for name in M.OUTPUTS:
        if name not in EP_FED:
            np.testing.assert_array_equal(np.asarray(on[name]), np.asarray(off[name]),
                                          err_msg=name)
    a2a = {**k, "moe_enable_deepep": False}
    off2, on2 = _solve("DeepSeek_V3_MC", fleet, **a2a), _solve(
        "DeepSeek_V3_MC", fleet, **a2a, **{GROUPS: 8, TOPK: 4})
    every = _solve("DeepSeek_V3_MC", fleet, **k, **{GROUPS: 8, TOPK: 8})
    for name in M.OUTPUTS:
        np.testing.assert_array_equal(np.asarray(on2[name]), np.asarray(off2[name]),
                                      err_msg=name)
        np.testing.assert_allclose(np.asarray(every[name], dtype=float),
                                   np.asarray(off[name], dtype=float), rtol=1e-12, err_msg=name)


@pytest.mark.parametrize("workload", ("DeepSeek_V3_MC", "Mixtral_8x7B_MC", "Llama3_8B_MC"))
def test_the_fused_kernel_prices_it_beside_it(workload):
    pytest.importorskip("numba")
    rng = np.random.default_rng(461)
    n = 3 * 4096
    k = {**_draw(rng, n, dp_given=True), GROUPS: rng.choice([0, 2, 3, 4, 8], n),
         TOPK: rng.choice([0, 1, 2, 4], n)}
    numpy_ = _solve(workload, "HGX_H100_1K_MC", **k)
    fused = _solve(workload, "HGX_H100_1K_MC", engine="fused", **k)
    for name in M.OUTPUTS:
        np.testing.assert_array_equal(np.asarray(fused[name]), np.asarray(numpy_[name]),
                                      err_msg=name)
    if workload != "Llama3_8B_MC":
        deepep = np.broadcast_to(np.asarray(k["moe_enable_deepep"]), (n,))
        assert (np.asarray(numpy_["valid"]) & deepep & (k[TOPK] > 0)).sum() > 100


def test_the_fused_kernel_marks_the_rule_beside_the_all_to_all_dispatcher():
    """Rows that break only the group rule, with the all-to-all dispatcher (which the groups
    do not move, so the kernel prices them): not realizable on the fused engine as on the
    numpy one, and every other output the kernel's own."""
    pytest.importorskip("numba")
    n = 3 * 4096
    rng = np.random.default_rng(463)
    groups = rng.choice([0, 1, 2, 4, 8, 3], n)
    topk = rng.choice([0, 1, 2, 4], n)
    kw = dict(batch_size=64, seq_len=4096, tp_size=1, dp_size=8, ep_size=8, etp_size=1,
              moe_enable_deepep=False, **{GROUPS: groups, TOPK: topk})
    fused = _solve("Mixtral_8x7B_MC", "HGX_H100_1K_MC", engine="fused", **kw)
    numpy_ = _solve("Mixtral_8x7B_MC", "HGX_H100_1K_MC", **kw)
    for name in M.OUTPUTS:
        np.testing.assert_array_equal(np.asarray(fused[name]), np.asarray(numpy_[name]),
                                      err_msg=name)
    broken = ~np.asarray(fused["realizable"])
    assert 1000 < broken.sum() < n - 1000  # (the layout is realizable but for the groups)
    plain = _solve("Mixtral_8x7B_MC", "HGX_H100_1K_MC", engine="fused", batch_size=64,
                   seq_len=4096, tp_size=1, dp_size=8, ep_size=8, etp_size=1)
    assert bool(plain["realizable"])
    assert np.all(np.asarray(fused["step_latency_total"]) == float(plain["step_latency_total"]))
