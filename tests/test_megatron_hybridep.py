"""moe_flex_dispatcher_backend="hybridep" in the megatron physics ([50] of
solver.physics.megatron): NVIDIA's HybridEP, the flex dispatcher's exchange with NVLink
across the whole domain (an NVL72 rack), where DeepEP reaches 8 ranks. Held to the closed
form of one exchange inside a rack, to DeepEP's bits where the domain is 8, to its rules,
and to the fused engine, which prices it beside its kernel, the same bits."""

import dataclasses
import sys
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
    assert why(odd, NVL72, **kw, **{BACKEND: "hybridep"}) == ["hybridep_hidden"]
    assert why(odd, HGX, **kw, **{BACKEND: "hybridep"}) == ["hybridep_hidden"]
    assert why(odd, HGX, **kw) == []
    plain = dict(kw, moe_enable_deepep=False)
    off = engines_agree("Mixtral_8x7B_MC", NVL72, **plain)
    on = engines_agree("Mixtral_8x7B_MC", NVL72, **plain, **{BACKEND: "hybridep"})
    for name in M.OUTPUTS:
        np.testing.assert_array_equal(on[name], off[name], err_msg=name)
    assert why("Llama3_8B_MC", NVL72, batch_size=64, tp_size=2, pp_size=1, dp_size=4,
               moe_enable_deepep=True, **{BACKEND: "hybridep"}) == []


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
    n = 3000
    knobs = _draw(rng, n, dp_given=True, etp_given=True)
    knobs[BACKEND] = rng.choice(["deepep", "hybridep"], n)
    out = engines_agree(workload, fleet, **knobs)
    deep = solve(workload, fleet, **dict(knobs, **{BACKEND: "deepep"}))
    valid = np.asarray(out["valid"])
    moved = valid & (out["ep_communication_latency"] != deep["ep_communication_latency"])
    assert moved.any()
    assert not (moved & ~((knobs[BACKEND] == "hybridep") & knobs["moe_enable_deepep"])).any()
