"""moe_shared_expert_overlap in the megatron physics ([49] of solver.physics.megatron):
Megatron-Core's shared experts on a stream of their own beside the dispatcher. Held to
closed forms (the GEMMs hide up to overlap_efficiency of the exchange each runs beside; the
shared experts' TP pair leaves tp_comm_overlap and moves 16 bits; their first GEMM keeps its
gathered input whole), to its limits (nothing to hide at EP 1 and TP 1; a model without
shared experts ignores it), to Megatron-Core's refusals, and to the fused engine, which
prices it beside its kernel, the same bits."""

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

from solver import catalog
from solver import gemm
from solver import network as net
from solver.physics import megatron as M

sys.path.insert(0, str(Path(__file__).parent))
from _megatron_steps import chain, engines_agree, solve, why  # noqa: E402
from test_fused_megatron import _draw  # noqa: E402

H100, NVL72 = "HGX_H100_1K_MC", "GB200_NVL72_8_MC"
SEO = "moe_shared_expert_overlap"
#: A shared expert beside grouped-query attention (a Llama 4 Scout-like shape: 16 experts,
#: top-1, one shared expert as wide as an expert, every layer MoE): the catalog's one model
#: with shared experts, DeepSeek-V3, has multi-head latent attention, which turns
#: tp_comm_overlap off.
SCOUT = dataclasses.replace(
    catalog.workload("DeepSeek_V3_MC"), name="Scout-like", parameters=109e9,
    active_parameters=17e9, layers=48, dense_layers=0, hidden_dim=5120, heads=40, kv_heads=8,
    head_dim=128, q_lora_rank=None, kv_lora_rank=None, qk_nope_head_dim=None,
    qk_rope_head_dim=None, v_head_dim=None, ffn_hidden_dim=16384, moe_ffn_hidden_dim=8192,
    experts=16, active_experts_per_token=1, shared_experts=1, vocab_size=202048)
KW = dict(batch_size=256, seq_len=8192, pp_size=4, ep_size=8, micro_batch_size=1,
          sequence_parallel=True)


def _pair(**kw):
    return (chain(SCOUT, H100, **kw, **{SEO: False}), chain(SCOUT, H100, **kw, **{SEO: True}))


def _shared_gemms(ns, tp):
    """The shared expert's first GEMM with its activation, and its second, forward [s]."""
    tok, h, f = float(ns.ly.tokens), 5120.0, 8192.0 / tp
    fc1 = (ns.hw.gemm(2.0 * tok * h * f * 2.0, 1.0, k=h)
           + gemm.memory_bound_time(2.0 * tok * f * 3.0, ns.hw.hbm))
    return fc1, ns.hw.gemm(2.0 * tok * f * h, 1.0, k=f)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_the_shared_gemms_hide_the_exchanges_they_run_beside(recompute):
    """At TP 1 (one all-to-all each way, no expert TP gather; EP 16 over two nodes): the
    forward hides
    eta (min(a2a, fc1) + min(a2a, fc2)), the backward eta (min(a2a, 2 fc1) + min(a2a, 2 fc2))
    and, where the backward runs the forward again (full recompute), the forward's again."""
    off, on = _pair(**dict(KW, seq_len=4096, ep_size=16), tp_size=1, recompute=recompute)
    eta, share = off.c["overlap_efficiency"], off.ly.moe_share
    a2a = float(off.cm.ep_layer_f) / share / 2.0
    fc1, fc2 = _shared_gemms(off, 1)
    # both sides of each min are reached: the first GEMM outlasts the exchange, the second not
    assert fc2 < a2a < fc1 and a2a < 2.0 * fc2
    save_f = eta * (min(a2a, fc1) + min(a2a, fc2))
    save_b = eta * (min(a2a, 2.0 * fc1) + min(a2a, 2.0 * fc2)) + (recompute == "full") * save_f
    assert float(off.cm.ep_layer_f - on.cm.ep_layer_f) == pytest.approx(share * save_f, rel=1e-12)
    assert float(off.cm.ep_layer_b - on.cm.ep_layer_b) == pytest.approx(share * save_b, rel=1e-12)
    # the rest of the layer is the same: compute, and TP (none at TP 1)
    assert float(on.ly.layer_f) == float(off.ly.layer_f)
    assert float(on.cm.tp_layer) == float(off.cm.tp_layer) == 0.0


@pytest.mark.parametrize("fleet, ep, etp", [(H100, 8, 4), ("DGX_B200_1K_MC", 16, 2)])
def test_the_expert_tp_collectives_widen_one_window_each_way(fleet, ep, etp):
    """With expert TP (etp beside TP 1): forward, the first GEMM runs beside the all-to-all
    and the expert TP group's all-gather after it, the second beside the combine's
    all-to-all; backward, the collectives run the other way round, the second GEMM's
    gradients beside the combine's all-to-all and the all-gather (its reduce-scatter's
    backward), the first's beside the dispatch's all-to-all alone. The two layouts reach
    each side of every min (the H100's first GEMM about its window, the second's gradients
    inside theirs; the B200's first GEMM inside its window, its gradients outside)."""
    kw = dict(KW, ep_size=ep, seq_len=4096)
    off = chain(SCOUT, fleet, **kw, tp_size=1, etp_size=etp, dp_size=32, **{SEO: False})
    on = chain(SCOUT, fleet, **kw, tp_size=1, etp_size=etp, dp_size=32, **{SEO: True})
    eta, share, hw = off.c["overlap_efficiency"], off.ly.moe_share, off.hw
    routed = float(off.ly.act_bytes) * etp  # top-1 copies, etp / tp = etp
    bw, lat = hw.link(hw.within(etp, off.sp.n_acc))
    gather = float(net.all_gather_time(routed, etp, bus_bandwidth=bw, latency=lat)) + hw.call_lat
    scatter = float(net.reduce_scatter_time(routed, etp, bus_bandwidth=bw, latency=lat)) + hw.call_lat
    a2a = (float(off.cm.ep_layer_f) / share - gather - scatter) / 2.0
    fc1, fc2 = _shared_gemms(off, 1)
    save_f = eta * (min(a2a + gather, fc1) + min(a2a, fc2))
    save_b = eta * (min(a2a, 2.0 * fc1) + min(a2a + gather, 2.0 * fc2))
    assert float(off.cm.ep_layer_f - on.cm.ep_layer_f) == pytest.approx(share * save_f, rel=1e-12)
    assert float(off.cm.ep_layer_b - on.cm.ep_layer_b) == pytest.approx(share * save_b, rel=1e-12)
    assert gather > 0.0 and fc2 < a2a and 2.0 * fc2 < a2a + gather
    if fleet == H100:
        assert a2a < 2.0 * fc1 and a2a + gather < fc1 * 1.02
    else:
        assert fc1 < a2a < 2.0 * fc1


def test_the_flex_dispatchers_exchange_is_hidden_alike():
    """Beside the flex dispatcher (DeepEP), each GEMM runs beside its one exchange, the
    dispatch's or the combine's, forward and backward: eta (min(x, fc1) + min(x, fc2))
    forward, eta (min(x, 2 fc1) + min(x, 2 fc2)) backward, x = moe_f / 2."""
    off, on = _pair(**dict(KW, seq_len=4096, ep_size=16), tp_size=1, moe_enable_deepep=True)
    eta, share = off.c["overlap_efficiency"], off.ly.moe_share
    flex = float(off.cm.ep_layer_f) / share / 2.0
    fc1, fc2 = _shared_gemms(off, 1)
    assert fc2 < flex < fc1
    save_f = eta * (min(flex, fc1) + min(flex, fc2))
    save_b = eta * (min(flex, 2.0 * fc1) + min(flex, 2.0 * fc2))
    assert float(off.cm.ep_layer_f - on.cm.ep_layer_f) == pytest.approx(share * save_f, rel=1e-12)
    assert float(off.cm.ep_layer_b - on.cm.ep_layer_b) == pytest.approx(share * save_b, rel=1e-12)


def test_fused_calls_that_set_it_alone_are_priced_beside_the_kernel():
    """A call of the fused engine that sets the knob and no other knob the kernel does not
    read is priced again on the numpy path (the knob moves it); on a model without shared
    experts the fused engine keeps Megatron-Core's refusal beside the combined 1F1B
    schedule."""
    kw = dict(KW, tp_size=2)
    off = engines_agree(SCOUT, H100, **kw, **{SEO: False})
    on = engines_agree(SCOUT, H100, **kw, **{SEO: True})
    assert float(on["ep_communication_latency"]) < float(off["ep_communication_latency"])
    mixtral = dict(KW, tp_size=1, pp_size=1, ep_size=8, dp_size=8,
                   overlap_moe_expert_parallel_comm=True)
    assert bool(engines_agree("Mixtral_8x7B_MC", H100, **mixtral)["realizable"])
    assert not bool(engines_agree("Mixtral_8x7B_MC", H100, **mixtral, **{SEO: True})["realizable"])


@pytest.mark.parametrize("tp, seq_len", [(2, 8192), (4, 4096), (8, 4096)])
def test_the_shared_pair_leaves_tp_comm_overlap(tp, seq_len):
    """Under tp_comm_overlap each phase's TP traffic hides eta of itself behind that phase's
    TP-communicating GEMMs, as far as they last (the forward's W, the backward's 2 W).
    With the knob the shared expert's pair (a half of the traffic: the attention's pair
    and it) is exposed whole and its GEMMs leave the window: (T - p) - eta min(T - p,
    W' - S) + p, S the shared GEMMs' time (2 S backward). The three layouts: no window
    binds; the knob's forward window binds; both forward windows and the knob's backward
    one bind. Without
    tp_comm_overlap (BF16) the pair is exposed either way."""
    kw = dict(KW, tp_size=tp, seq_len=seq_len, tp_comm_overlap=True)
    off, on = _pair(**kw)
    eta = off.c["overlap_efficiency"]
    tp_f = float(off.cm.tp_total) / 2.0  # the forward's, the backward's the same (rc 0)
    pair = tp_f / 2.0
    shared = sum(_shared_gemms(off, tp))
    window = float(off.ly.t_tp_gemms_f)
    assert float(off.cm.tp_layer_f) == pytest.approx(tp_f - eta * min(tp_f, window), rel=1e-12)
    assert float(off.cm.tp_layer_b) == pytest.approx(tp_f - eta * min(tp_f, 2.0 * window),
                                                     rel=1e-12)
    for got, hide in ((on.cm.tp_layer_f, window - shared), (on.cm.tp_layer_b,
                                                             2.0 * (window - shared))):
        expect = (tp_f - pair) - eta * min(tp_f - pair, hide) + pair
        assert float(got) == pytest.approx(expect, rel=1e-12)
    assert float(on.cm.tp_total) == float(off.cm.tp_total)
    binds = {2: (False, False, False), 4: (False, True, False), 8: (True, True, True)}[tp]
    assert (window < tp_f, window - shared < tp_f - pair,
            2.0 * (window - shared) < tp_f - pair) == binds
    plain_off, plain_on = _pair(**dict(kw, tp_comm_overlap=False))
    assert float(plain_on.cm.tp_layer) == pytest.approx(float(plain_off.cm.tp_layer), rel=1e-12)


def test_under_fp8_the_shared_pair_gathers_16_bits():
    """Under FP8 with SP the layer's all-gathers move FP8; the shared expert's own all-gather
    (outside its linear layer) moves the 16-bit input: per pair call, a 16-bit all-gather
    where the others move half the bytes; forward and backward, three with full recompute
    or "moe" (whose backward runs the layer's forward again, its pair with it)."""
    for recompute, modules, calls in (("none", "core_attn", 2.0), ("full", "core_attn", 3.0),
                                      ("selective", "core_attn,moe", 3.0)):
        off, on = _pair(**KW, tp_size=4, precision="fp8", recompute=recompute,
                        fp8_recipe="tensorwise", recompute_modules=modules)
        hw, act = off.hw, float(off.ly.act_bytes)
        bw, lat = hw.link(hw.within(4, off.sp.n_acc))
        d = float(net.all_gather_time(act, 4, bus_bandwidth=bw, latency=lat)
                  - net.all_gather_time(act / 2.0, 4, bus_bandwidth=bw, latency=lat))
        assert d > 0.0
        assert float(on.cm.tp_total - off.cm.tp_total) == pytest.approx(calls * d, rel=1e-9)
        assert float(on.cm.tp_layer - off.cm.tp_layer) == pytest.approx(calls * d, rel=1e-9)


@pytest.mark.parametrize("precision, recipe, width", [
    ("bf16", "delayed", 2.0), ("fp8", "delayed", 1.0), ("fp8", "tensorwise", 2.0)])
def test_the_first_gemm_keeps_its_gathered_input_whole(precision, recipe, width):
    """The first rank holds pp microbatches of its L / pp layers in 1F1B: L layers of one
    microbatch, each keeping s b h more (the gathered input, whole on every TP rank): 2 bytes,
    the FP8 cast (1) under delayed scaling, the original input under current scaling; none
    at TP 1, where nothing is gathered."""
    kw = dict(KW, batch_size=1024, precision=precision, fp8_recipe=recipe)  # 4+ microbatches
    sbh = 1 * 8192 * 5120.0
    for tp, extra in ((4, 48 * sbh * width), (2, 48 * sbh * width), (1, 0.0)):
        off = solve(SCOUT, H100, **kw, tp_size=tp, **{SEO: False})
        on = solve(SCOUT, H100, **kw, tp_size=tp, **{SEO: True})
        assert float(on["memory_activations"] - off["memory_activations"]) == extra, tp


def test_moe_recompute_frees_the_gathered_input():
    """Under "moe" the MoE layer keeps its input alone: the gathered copy is freed with the
    rest and held again by the one layer whose backward runs (its working set)."""
    kw = dict(KW, tp_size=4, recompute="selective", recompute_modules="core_attn,moe")
    off = solve(SCOUT, H100, **kw, **{SEO: False})
    on = solve(SCOUT, H100, **kw, **{SEO: True})
    assert float(on["memory_activations"] - off["memory_activations"]) == 8192 * 5120.0 * 2.0


def test_nothing_to_hide_and_nothing_to_read():
    """At TP 1 and EP 1 there is no exchange to hide and no pair or gather: the same bits; a
    model without shared experts ignores the knob (Megatron-Core reads it only with them)."""
    kw = dict(KW, tp_size=1, ep_size=1)
    for workload, knobs in ((SCOUT, kw), ("Mixtral_8x7B_MC", dict(KW, tp_size=2))):
        off = engines_agree(workload, H100, **knobs, **{SEO: False})
        on = engines_agree(workload, H100, **knobs, **{SEO: True})
        for name in M.OUTPUTS:
            np.testing.assert_array_equal(on[name], off[name], err_msg=name)


def test_megatron_refuses_it_where_it_cannot_run():
    """Beside the combined 1F1B schedule (whatever the model); with shared experts, beside
    "shared_experts" recompute (under selective recompute). Beside the flex dispatcher it
    runs (Megatron-Core since 2026)."""
    kw = dict(KW, tp_size=1, pp_size=1, dp_size=8, **{SEO: True})
    assert why(SCOUT, H100, **kw) == []
    assert why(SCOUT, H100, **kw, moe_enable_deepep=True) == []
    assert why("Mixtral_8x7B_MC", H100, **kw, moe_enable_deepep=True) == []
    for workload in (SCOUT, "Mixtral_8x7B_MC"):
        assert why(workload, H100, **kw, overlap_moe_expert_parallel_comm=True) == [
            "shared_expert_overlap"]
        assert why(workload, H100, **dict(kw, **{SEO: False}),
                   overlap_moe_expert_parallel_comm=True) == []
    shared = dict(kw, recompute_modules="core_attn,shared_experts")
    assert why(SCOUT, H100, **shared, recompute="selective") == ["shared_expert_overlap"]
    assert why(SCOUT, H100, **shared, recompute="full") == []
    assert why(SCOUT, H100, **dict(shared, **{SEO: False}), recompute="selective") == []
    assert why("Mixtral_8x7B_MC", H100, **shared, recompute="selective") == []


@pytest.mark.parametrize("workload", [SCOUT, "DeepSeek_V3_MC", "Mixtral_8x7B_MC"])
@pytest.mark.parametrize("fleet", [H100, NVL72])
def test_the_fused_kernel_prices_it_beside_it(workload, fleet):
    """Random layouts, the knob on in half of them, with recompute module sets: the fused
    engine's outputs are the numpy path's, bit for bit."""
    rng = np.random.default_rng(4900 + len(fleet) + (workload is SCOUT))
    n = 3000
    knobs = _draw(rng, n, dp_given=fleet == NVL72, etp_given=True)
    knobs[SEO] = rng.random(n) < 0.5
    knobs["recompute_modules"] = rng.choice(["core_attn", "core_attn,moe", "shared_experts",
                                             "core_attn,moe_act"], n)
    out = engines_agree(workload, fleet, **knobs)
    assert np.asarray(out["valid"]).any()
    if workload != "Mixtral_8x7B_MC":  # (with shared experts, the knob moves the rows it sets)
        off = solve(workload, fleet, **dict(knobs, **{SEO: False}))
        moved = out["ep_communication_latency"] != off["ep_communication_latency"]
        assert moved.any() and not (moved & ~knobs[SEO] & out["valid"]).any()


def test_it_hides_and_never_more_than_eta():
    """On random layouts at TP 1 (no TP pair to move): the step never grows; where one stage
    holds every layer (the stage that paces the pipeline cannot change with it) and the
    combined 1F1B schedule (which Megatron-Core refuses beside it) hides nothing, the
    exposed EP time never grows, and keeps at least 1 - eta of what it was."""
    rng = np.random.default_rng(4949)
    n = 4000
    knobs = _draw(rng, n, dp_given=True)
    knobs.update(tp_size=1, etp_size=1, moe_enable_deepep=False)
    off = solve(SCOUT, NVL72, **knobs, **{SEO: False})
    on = solve(SCOUT, NVL72, **knobs, **{SEO: True})
    eta = M._constants({})["overlap_efficiency"]
    valid = off["valid"]
    assert valid.mean() > 0.2
    assert np.all(on["step_latency_total"][valid]
                  <= off["step_latency_total"][valid] * (1.0 + 1e-12))
    one = (valid & (knobs["pp_size"] == 1) & (knobs["mtp_num_layers"] == 0)
           & ~knobs["overlap_moe_expert_parallel_comm"])
    assert one.sum() > 80
    ep_off, ep_on = off["ep_communication_latency"][one], on["ep_communication_latency"][one]
    assert np.all(ep_on <= ep_off)
    assert np.all(ep_on >= (1.0 - eta) * ep_off * (1.0 - 1e-12))
    assert (ep_on < ep_off).mean() > 0.5
    np.testing.assert_array_equal(on["memory_footprint"], off["memory_footprint"])
