"""moe_flex_dispatcher_backend="hybridep" in the megatron physics ([50] of
solver.physics.megatron): NVIDIA's HybridEP, the flex dispatcher's exchange with NVLink
across the whole domain (an NVL72 rack), where DeepEP reaches 8 ranks. Held to the closed
form of one exchange inside a rack, to DeepEP's bits where the domain is 8, to its rules,
and to the fused engine, which prices it beside its kernel, the same bits."""

import dataclasses
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from solver import catalog
from solver.physics import megatron as M

sys.path.insert(0, str(Path(__file__).parent))
from _megatron_steps import chain, engines_agree, solve, why  # noqa: E402
from test_fused_megatron import _draw  # noqa: E402

RACKS64, NVL72, HGX = "GB200_NVL72_1K_MC", "GB200_NVL72_8_MC", "HGX_H100_1K_MC"
BACKEND = "moe_flex_dispatcher_backend"
#: Qwen3-235B-A22B (94 layers, 128 experts, top-8) at EP 64 on racks of 64: every EP group
#: inside one rack.
KW = dict(batch_size=1024, seq_len=4096, tp_size=1, pp_size=2, ep_size=64, micro_batch_size=1,
          moe_enable_deepep=True)


def test_one_exchange_inside_a_rack_is_nvlink_alone():
    """HybridEP at EP 64 inside a rack of 64: each token once to each of the other 63 ranks
    that holds one of its experts (each hit with 1 - C(126, 8) / C(128, 8), two experts a
    rank), over NVLink, plus 63 latency steps and a launch: nothing over the NICs. DeepEP
    reaches 8 ranks, sends the rest over the NICs and takes longer (and breaks its rule)."""
    hybrid = chain("Qwen3_235B_A22B_MC", RACKS64, **KW, **{BACKEND: "hybridep"})
    deep = chain("Qwen3_235B_A22B_MC", RACKS64, **KW, **{BACKEND: "deepep"})
    hw, share = hybrid.hw, hybrid.ly.moe_share
    hit = 1.0 - (120.0 * 119.0) / (128.0 * 127.0)
    flex = (63.0 * hit * float(hybrid.ly.act_bytes) / hw.up_bw + 63.0 * hw.up_lat
            + hw.call_lat)
    assert share == 1.0
    assert float(hybrid.cm.ep_layer_f) == pytest.approx(2.0 * flex, rel=1e-12)
    assert float(deep.cm.ep_layer_f) > 1.5 * float(hybrid.cm.ep_layer_f)
    assert why("Qwen3_235B_A22B_MC", RACKS64, **KW, **{BACKEND: "hybridep"}) == []
    assert why("Qwen3_235B_A22B_MC", RACKS64, **KW, **{BACKEND: "deepep"}) == ["deepep_domain"]


def test_on_nodes_of_8_it_prices_as_deepep():
    """Where the NVLink domain is 8 GPUs the two backends reach the same ranks: the same bits,
    on random layouts of the flex dispatcher."""
    rng = np.random.default_rng(5000)
    knobs = _draw(rng, 3000, dp_given=False, etp_given=True)
    knobs["moe_enable_deepep"] = np.ones(3000, dtype=bool)
    deep = solve("Qwen3_30B_A3B_MC", HGX, **knobs, **{BACKEND: "deepep"})
    hybrid = solve("Qwen3_30B_A3B_MC", HGX, **knobs, **{BACKEND: "hybridep"})
    for name in M.OUTPUTS:
        np.testing.assert_array_equal(hybrid[name], deep[name], err_msg=name)
    assert np.asarray(deep["valid"]).any()


def test_its_rules():
    """HybridEP runs on an NVL72 rack (DeepEP does not) and needs a hidden size divisible by
    512; outside the flex dispatcher, or on a dense model, the backend is not read."""
    kw = dict(KW, ep_size=8, pp_size=2, dp_size=64)
    assert why("Mixtral_8x7B_MC", NVL72, **kw, **{BACKEND: "hybridep"}) == []
    assert why("Mixtral_8x7B_MC", NVL72, **kw) == ["deepep_domain"]
    odd = dataclasses.replace(catalog.workload("Mixtral_8x7B_MC"), name="hidden 3840",
                              hidden_dim=3840)  # (divisible by 256, not by 512)
    assert why(odd, NVL72, **kw, **{BACKEND: "hybridep"}) == ["hybridep_layout"]
    assert why(odd, HGX, **kw, **{BACKEND: "hybridep"}) == ["hybridep_layout"]
    assert why(odd, HGX, **kw) == []
    # (the backend is read beside the flex dispatcher of an MoE model only)
    assert why(odd, HGX, **dict(kw, moe_enable_deepep=False), **{BACKEND: "hybridep"}) == []
    dense = dataclasses.replace(catalog.workload("Llama3_8B_MC"), name="dense 3840",
                                hidden_dim=3840)
    assert why(dense, HGX, batch_size=64, tp_size=2, pp_size=1, dp_size=4,
               moe_enable_deepep=True, **{BACKEND: "hybridep"}) == []
    # EP 64 on racks filled to 72 straddles them (8 + 56 ranks): HybridEP refuses the split
    # it prices, as on racks of 64, where every group is inside one
    ep64 = dict(KW, pp_size=1, dp_size=128, **{BACKEND: "hybridep"})
    assert why("Qwen3_235B_A22B_MC", NVL72, **ep64) == ["hybridep_layout"]
    assert why("Qwen3_235B_A22B_MC", RACKS64, **ep64) == []
    plain = dict(kw, moe_enable_deepep=False)
    off = engines_agree("Mixtral_8x7B_MC", NVL72, **plain)
    on = engines_agree("Mixtral_8x7B_MC", NVL72, **plain, **{BACKEND: "hybridep"})
    for name in M.OUTPUTS:
        np.testing.assert_array_equal(on[name], off[name], err_msg=name)
    assert why("Llama3_8B_MC", NVL72, batch_size=64, tp_size=2, pp_size=1, dp_size=4,
               moe_enable_deepep=True, **{BACKEND: "hybridep"}) == []


def test_hybrideps_own_checks_of_its_ranks_a_domain():
    """At most 72 of the group's ranks in a domain (EP 128 inside a domain of 144 is
    refused), and an even number of them (expert TP 3 x EP 1 inside a node is refused),
    where the group is otherwise inside one domain."""
    hgx = catalog.fleet(HGX)
    big = dataclasses.replace(hgx, node=dataclasses.replace(hgx.node, scale_up_domain=144))
    kw = dict(KW, pp_size=1, ep_size=128, dp_size=128, **{BACKEND: "hybridep"})
    assert sorted(M.why_unrealizable(catalog.workload("Qwen3_235B_A22B_MC"), big, **kw)) == [
        "hybridep_layout"]
    assert sorted(M.why_unrealizable(catalog.workload("Qwen3_235B_A22B_MC"), big,
                                     **dict(kw, ep_size=64, dp_size=64))) == []
    odd = dict(KW, pp_size=1, ep_size=1, etp_size=3, dp_size=6, batch_size=6,
               **{BACKEND: "hybridep"})
    assert why("Qwen3_235B_A22B_MC", HGX, **odd) == ["hybridep_layout"]
    assert why("Qwen3_235B_A22B_MC", HGX, **dict(odd, etp_size=2, dp_size=4, batch_size=4)) == []


def test_hybrideps_experts_times_ranks_a_domain_divisible_by_4():
    """``(num_of_experts_per_rank * num_of_ranks_per_node) % 4 == 0``: six experts over EP 2
    leave 3 a rank, in groups of 2 ranks a node: 6, refused; expert TP 2 makes the groups 4
    ranks (12), and eight experts make 4 a rank (8): the product is checked, not either
    factor. DeepEP alone checks none of it."""
    six = dataclasses.replace(catalog.workload("Mixtral_8x7B_MC"), name="6 experts", experts=6)
    kw = dict(KW, pp_size=1, ep_size=2, dp_size=8, batch_size=64, **{BACKEND: "hybridep"})
    assert why(six, HGX, **kw) == ["hybridep_layout"]
    assert why(six, HGX, **dict(kw, etp_size=2)) == []
    assert why("Mixtral_8x7B_MC", HGX, **kw) == []
    assert why(six, HGX, **dict(kw, **{BACKEND: "deepep"})) == []
    # the ranks counted are those in one domain, not the group's: expert TP 2 x EP 2 over
    # NVLink domains of 2 is 2 ranks a domain (3 x 2, refused), not 4
    hgx = catalog.fleet(HGX)
    pairs = dataclasses.replace(hgx, node=dataclasses.replace(hgx.node, scale_up_domain=2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the shape's parameters against the declared count)
        assert sorted(M.why_unrealizable(six, pairs, **dict(kw, etp_size=2))) == ["hybridep_layout"]
    # the fused engine (which prices HybridEP's rows beside its kernel) refuses what the
    # check refuses, bit for bit the numpy path, on random layouts past the kernel's own size
    rng = np.random.default_rng(4646)
    n = 5000
    knobs = dict(_draw(rng, n, dp_given=True, etp_given=True), moe_enable_deepep=np.ones(n, bool),
                 **{BACKEND: "hybridep"})
    out = engines_agree(six, HGX, **knobs)
    ranks = np.minimum(knobs["etp_size"] * knobs["ep_size"], 8)
    binds = np.asarray(out["valid"]) & (ranks % 2 == 0) & ((6 / knobs["ep_size"] * ranks) % 4 != 0)
    assert binds.sum() > 100 and not np.asarray(out["realizable"])[binds].any()


def test_reach_is_the_whole_rack_up_to_72():
    """A flex group of 72 ranks (expert TP 9 x EP 8) filling a rack of 72: HybridEP's NVLink
    reaches all 72, so each EP block's 9 ranks are near and nothing crosses the NICs: 71
    NVLink sends, each hit with 1 - C(56, 8) / C(64, 8) (8 experts a rank of 64, top-8),
    71 latency steps and a launch. (A reach of 64 would leave a block over the NICs.)"""
    wl = dataclasses.replace(catalog.workload("Qwen3_30B_A3B_MC"), name="64 experts of 2304",
                             experts=64, moe_ffn_hidden_dim=2304)
    kw = dict(batch_size=72, seq_len=4096, tp_size=1, pp_size=1, ep_size=8, etp_size=9,
              dp_size=72, micro_batch_size=1, moe_enable_deepep=True, **{BACKEND: "hybridep"})
    ns = chain(wl, NVL72, **kw)
    hw = ns.hw
    miss = 1.0
    for i in range(8):
        miss *= (56.0 - i) / (64.0 - i)
    flex = 71.0 * (1.0 - miss) * float(ns.ly.act_bytes) / hw.up_bw + 71.0 * hw.up_lat + hw.call_lat
    assert float(ns.cm.ep_layer_f) == pytest.approx(2.0 * ns.ly.moe_share * flex, rel=1e-12)
    assert why(wl, NVL72, **kw) == []


def test_deepep_is_the_default_backend():
    """Without the backend named, the flex dispatcher is DeepEP's: refused on an NVL72 rack."""
    import inspect
    assert M.DEFAULTS[BACKEND] == "deepep"
    assert inspect.signature(M.solve).parameters[BACKEND].default == "deepep"
    out = solve("Qwen3_235B_A22B_MC", RACKS64, **KW)
    assert not bool(out["realizable"])
    deep = solve("Qwen3_235B_A22B_MC", RACKS64, **KW, **{BACKEND: "deepep"})
    for name in M.OUTPUTS:
        np.testing.assert_array_equal(out[name], deep[name], err_msg=name)


def test_the_flex_dispatcher_needs_an_nvidia_gpu_it_runs_on():
    """On an accelerator of no NVIDIA architecture the flex dispatcher (either backend) is not
    realizable; the fused engine keeps the rule."""
    hgx = catalog.fleet(HGX)
    amd = dataclasses.replace(hgx, node=dataclasses.replace(
        hgx.node, accelerator=catalog.accelerator("MI300X")))
    kw = dict(KW, ep_size=8, dp_size=64)
    for backend in ("deepep", "hybridep"):
        assert why("Mixtral_8x7B_MC", HGX, **kw, **{BACKEND: backend}) == []
        broken = sorted(M.why_unrealizable(catalog.workload("Mixtral_8x7B_MC"), amd, **kw,
                                           **{BACKEND: backend}))
        assert "flex_architecture" in broken
    rng = np.random.default_rng(5151)
    knobs = _draw(rng, 5000, dp_given=True)
    knobs["precision"] = rng.choice(["bf16", "fp8"], 5000)
    wl = catalog.workload("Mixtral_8x7B_MC")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = M.solve(wl, amd, engine="numpy", **knobs)
        fast = M.solve(wl, amd, engine="fused", **knobs)
    for name in M.OUTPUTS:
        np.testing.assert_array_equal(fast[name], ref[name], err_msg=name)
    assert not (np.asarray(ref["realizable"]) & knobs["moe_enable_deepep"]).any()


def test_bad_backends_are_refused_by_name():
    with pytest.raises(ValueError, match="moe_flex_dispatcher_backend"):
        solve("Mixtral_8x7B_MC", NVL72, **KW, **{BACKEND: "ncclep"})


@pytest.mark.parametrize("workload", ["DeepSeek_V3_MC", "Qwen3_30B_A3B_MC"])
@pytest.mark.parametrize("fleet", [NVL72, RACKS64])
def test_the_fused_kernel_prices_it_beside_it(workload, fleet):
    """Random layouts, the flex dispatcher and the backend each on in half of them: the fused
    engine's outputs are the numpy path's, bit for bit, and HybridEP moves the rows of the
    flex dispatcher that reach past 8 ranks of a rack (and no other)."""
    rng = np.random.default_rng(5050 + len(fleet) + len(workload))
    n = 5000  # (past FUSED_MIN_POINTS: the kernel's own path)
    knobs = _draw(rng, n, dp_given=True, etp_given=True)
    knobs[BACKEND] = rng.choice(["deepep", "hybridep"], n)
    out = engines_agree(workload, fleet, **knobs)
    deep = solve(workload, fleet, **dict(knobs, **{BACKEND: "deepep"}))
    valid = np.asarray(out["valid"])
    moved = valid & (out["ep_communication_latency"] != deep["ep_communication_latency"])
    assert moved.any()
    assert not (moved & ~((knobs[BACKEND] == "hybridep") & knobs["moe_enable_deepep"])).any()
