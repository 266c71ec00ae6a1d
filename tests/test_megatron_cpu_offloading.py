"""cpu_offloading_num_layers in the megatron physics ([51] of solver.physics.megatron):
Megatron-Core's activation offloading to host memory. Held to closed forms (the rank keeps
the other layers' activations; the copies over the host link stall a phase by what they
outlast of its layers' work), to Megatron-Core's refusals, to its limits, and to the fused
engine, which prices it beside its kernel, the same bits."""

import dataclasses
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from solver import catalog
from solver import megatron_memory as mem
from solver.physics import megatron as M
from sweep.analysis.explain import step_components

sys.path.insert(0, str(Path(__file__).parent))
from _megatron_steps import chain, engines_agree, solve, why  # noqa: E402
from test_fused_megatron import _draw  # noqa: E402

H100, NVL72 = "HGX_H100_1K_MC", "GB200_NVL72_8_MC"
N = "cpu_offloading_num_layers"
#: Llama 3 70B as NVIDIA's GB200 recipes run it: one stage, Megatron-FSDP.
KW = dict(batch_size=512, seq_len=8192, tp_size=4, pp_size=1, dp_size=64, micro_batch_size=1,
          sequence_parallel=True, zero_stage=3)


def test_the_rank_keeps_the_other_layers_activations():
    """Offloading N of Llama 3 70B's 80 layers frees N layers' stored activations (the closed
    form of megatron_memory.layer_activation_bytes: GQA, SwiGLU, TP 4 with SP, flash
    attention, dropout 0.1), on both fleets, and nothing else of the footprint."""
    layer = float(mem.layer_activation_bytes(
        1, 8192.0, 8192, heads=64, kv_heads=8, ffn_hidden=28672, gated=True, tp_size=4,
        sequence_parallel=True, recompute_code=0, flash_attention=True))
    for fleet in (H100, NVL72):
        base = solve("Llama3_70B_MC", fleet, **KW)
        for n in (1, 20, 40, 79):
            out = solve("Llama3_70B_MC", fleet, **KW, **{N: n})
            freed = float(base["memory_activations"] - out["memory_activations"])
            assert freed == pytest.approx(n * layer, rel=1e-12), (fleet, n)
            assert float(base["memory_footprint"] - out["memory_footprint"]) == pytest.approx(
                freed, rel=1e-12)
            assert bool(out["realizable"])


def test_the_dense_layers_go_first():
    """DeepSeek-V3's first three layers are dense: offloading one more layer frees a dense
    layer's activations up to three, an MoE layer's past them."""
    kw = dict(batch_size=64, seq_len=4096, tp_size=8, pp_size=1, ep_size=8, dp_size=8,
              micro_batch_size=1, sequence_parallel=True)
    acts = [float(solve("DeepSeek_V3_MC", H100, **kw, **{N: n})["memory_activations"])
            for n in range(6)]
    steps_ = np.diff(acts)
    assert steps_[0] == pytest.approx(steps_[1], rel=1e-12) == pytest.approx(steps_[2], rel=1e-12)
    assert steps_[3] == pytest.approx(steps_[4], rel=1e-12)
    assert steps_[3] < steps_[0] < 0.0  # an MoE layer stores more than a dense one


B200, GB200 = "DGX_B200_1K_MC", NVL72
#: (fleet, its host link one way, TP, layers offloaded, whether the forward and the backward
#: stall): H100s and B200s on PCIe Gen5 x16, GB200s on NVLink-C2C (225 GB/s a GPU, the
#: catalog's assumption; at 450 the GB200 layout would not stall)
STALLS = [(H100, 64e9, 1, 16, True, False), (H100, 64e9, 1, 31, True, False),
          (H100, 64e9, 2, 16, False, False), (H100, 64e9, 2, 24, True, False),
          (H100, 64e9, 4, 31, True, False), (B200, 64e9, 1, 24, True, True),
          (GB200, 225e9, 1, 24, False, False), (GB200, 225e9, 1, 31, True, False)]


@pytest.mark.parametrize("fleet, bw, tp, n, forward, backward", STALLS)
def test_the_copies_stall_what_they_outlast(fleet, bw, tp, n, forward, backward):
    """Llama 3 8B: each microbatch's offloaded bytes B cross to the host in the forward and
    back in the backward, beside the stage's L layers: m (max(0, B / bw - L t_f) + max(0,
    B / bw - L t_b)), t_f and t_b a layer's forward and backward phases; the step grows by
    that alone, and step_components names it."""
    kw = dict(batch_size=256, seq_len=8192, tp_size=tp, pp_size=1, dp_size=64,
              micro_batch_size=1, sequence_parallel=tp > 1, zero_stage=1)
    base = solve("Llama3_8B_MC", fleet, **kw)
    out = solve("Llama3_8B_MC", fleet, **kw, **{N: n})
    ns = chain("Llama3_8B_MC", fleet, **kw, **{N: n})
    moved = float(base["memory_activations"] - out["memory_activations"])
    copy = moved / bw
    m = 256 / 64
    f = copy - 32 * float(ns.pl.window_f)
    b = copy - 32 * float(ns.pl.window_b)
    assert ns.hw.host_bw == bw
    assert (f > 0, b > 0) == (forward, backward)
    expect = m * (max(f, 0.0) + max(b, 0.0))
    assert float(out["offload_latency"]) == pytest.approx(expect, rel=1e-12)
    assert float(out["step_latency_total"] - base["step_latency_total"]) == pytest.approx(
        expect, rel=1e-9)
    parts = step_components(out, physics="megatron")
    assert parts["activation offload"] == float(out["offload_latency"])
    assert sum(parts.values()) == pytest.approx(float(out["step_latency_total"]), rel=1e-12)


def test_a_cube_from_before_it_has_no_stall():
    """step_components of outputs without offload_latency (a cube written before it was
    priced): the term is 0.0 and the terms still sum to the step."""
    out = dict(solve("Llama3_8B_MC", H100, batch_size=256, seq_len=8192, tp_size=1, pp_size=1,
                     dp_size=64))
    out.pop("offload_latency")
    parts = step_components(out, physics="megatron")
    assert parts["activation offload"] == 0.0
    assert sum(parts.values()) == pytest.approx(float(out["step_latency_total"]), rel=1e-12)


def test_fused_calls_of_valid_layouts_only():
    """A fused call whose layouts are all valid (the kernel's offload_latency one shared view
    of 0.0) and some offload: those are priced beside it, the rest keep 0.0."""
    n = 5000
    layers = np.where(np.arange(n) % 3 == 0, 20, 0)
    out = engines_agree("Llama3_70B_MC", H100, **KW, **{N: layers})
    assert np.asarray(out["valid"]).all()
    assert (np.asarray(out["memory_activations"])[layers > 0]
            < np.asarray(out["memory_activations"])[layers == 0][0]).all()


def test_a_faster_host_link_hides_more():
    """The same layout on GB200 (NVLink-C2C, 225 GB/s one way a GPU in the catalog) hides
    what PCIe Gen5 stalls on."""
    kw = dict(batch_size=256, seq_len=8192, tp_size=1, pp_size=1, dp_size=64,
              micro_batch_size=1, zero_stage=1, **{N: 24})
    assert float(solve("Llama3_8B_MC", H100, **kw)["offload_latency"]) > 0.5
    assert float(solve("Llama3_8B_MC", NVL72, **kw)["offload_latency"]) == 0.0


def test_megatron_refuses_it_where_it_cannot_run():
    """One pipeline stage, no recompute (selective or full), fewer layers than the model's,
    and a host link the catalog states."""
    assert why("Llama3_70B_MC", H100, **KW, **{N: 20}) == []
    assert why("Llama3_70B_MC", H100, **dict(KW, pp_size=2, zero_stage=1), **{N: 20}) == [
        "cpu_offloading"]
    assert why("Llama3_70B_MC", H100, **dict(KW, pp_size=2, zero_stage=1)) == []
    for recompute in ("selective", "full"):
        assert why("Llama3_70B_MC", H100, **KW, recompute=recompute, **{N: 20}) == [
            "cpu_offloading"]
    assert why("Llama3_70B_MC", H100, **KW, **{N: 79}) == []
    assert why("Llama3_70B_MC", H100, **KW, **{N: 80}) == ["cpu_offloading"]
    fleet = catalog.fleet(H100)
    bare = dataclasses.replace(fleet, node=dataclasses.replace(
        fleet.node, accelerator=dataclasses.replace(fleet.node.accelerator,
                                                    host_link_bandwidth=None)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wl = catalog.workload("Llama3_70B_MC")
        assert sorted(M.why_unrealizable(wl, bare, **KW, **{N: 20})) == ["cpu_offloading"]
        assert sorted(M.why_unrealizable(wl, bare, **KW)) == []


def test_none_is_the_default_and_changes_nothing():
    """0 (the default) is no offloading: the same bits as leaving the knob out."""
    assert M.DEFAULTS[N] == 0
    off = engines_agree("Llama3_70B_MC", H100, **KW)
    zero = engines_agree("Llama3_70B_MC", H100, **KW, **{N: 0})
    for name in M.OUTPUTS:
        np.testing.assert_array_equal(zero[name], off[name], err_msg=name)
    assert float(off["offload_latency"]) == 0.0


@pytest.mark.parametrize("workload, fleet", [("Llama3_8B_MC", H100), ("DeepSeek_V3_MC", NVL72),
                                             ("Mixtral_8x7B_MC", H100)])
def test_the_fused_kernel_prices_it_beside_it(workload, fleet):
    """Random layouts, a number of layers offloaded in half of them: the fused engine's
    outputs are the numpy path's, bit for bit (its kernel's own path: 5,000 rows)."""
    rng = np.random.default_rng(5100 + len(workload))
    n = 5000
    knobs = _draw(rng, n, dp_given=True, etp_given=workload != "Llama3_8B_MC")
    knobs[N] = np.where(rng.random(n) < 0.5, rng.choice([1, 2, 5, 20, 31], n), 0)
    knobs["pp_size"] = np.where(rng.random(n) < 0.5, 1, knobs["pp_size"])
    out = engines_agree(workload, fleet, **knobs)
    base = solve(workload, fleet, **dict(knobs, **{N: 0}))
    valid = np.asarray(out["valid"])
    moved = valid & (out["memory_activations"] != base["memory_activations"])
    assert moved.any() and not (moved & (knobs[N] == 0)).any()


def test_more_layers_offloaded_hold_less_and_never_run_faster():
    """On random one-stage layouts without recompute: activations fall and the step never
    shortens as more layers are offloaded."""
    rng = np.random.default_rng(5150)
    n = 3000
    knobs = _draw(rng, n, dp_given=True)
    knobs.update(pp_size=1, recompute="none")
    prev = solve("Llama3_8B_MC", H100, **knobs, **{N: 0})
    valid = prev["valid"]
    assert valid.mean() > 0.2
    for layers in (1, 8, 16, 31):
        out = solve("Llama3_8B_MC", H100, **knobs, **{N: layers})
        assert np.all(out["memory_activations"][valid] < prev["memory_activations"][valid])
        assert np.all(out["step_latency_total"][valid] >= prev["step_latency_total"][valid])
        prev = out
    assert (prev["offload_latency"][valid] > 0).mean() > 0.1


def test_top_breakdown_names_the_stall():
    """`sweep top --breakdown` shows the stall as its own term, not in "other" (which then
    holds the step overhead alone)."""
    from sweep.cli.top import _terms_of
    kw = dict(batch_size=256, seq_len=8192, tp_size=1, pp_size=1, dp_size=64, zero_stage=1)
    out = solve("Llama3_8B_MC", H100, **kw, **{N: 31})
    row = {name: float(np.asarray(value)) for name, value in out.items()}
    terms = _terms_of(dict(row, physics="megatron"), {}, "megatron")["terms"]
    assert terms["offload"] == row["offload_latency"] > 0.0
    assert terms["other"] == pytest.approx(M._constants({})["step_overhead"], rel=1e-6, abs=1e-9)
