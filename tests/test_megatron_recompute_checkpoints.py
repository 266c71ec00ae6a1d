"""recompute_modules' checkpointed modules in the megatron physics ([47] of
solver.physics.megatron): "mlp" (a dense layer's MLP), "moe" (an MoE layer whole: shared
experts, router, dispatch, experts, combine) and "shared_experts". Each keeps its input,
frees what runs inside it and runs its forward again before its backward. Held against
closed forms of the bytes freed, the backward and the communication added and the FLOPs in
hfu; against Megatron-Core's spec (the dense MLP's recompute leaves an MoE layer alone; "moe"
beside the combined 1F1B schedule is refused); and on random layouts of every knob (never
more memory, never a shorter step; the fused kernel prices them beside it, the same bits)."""

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from solver import catalog, gemm
from solver import network as net
from solver.physics import megatron as M

sys.path.insert(0, str(Path(__file__).parent))
from _megatron_steps import chain, engines_agree, solve  # noqa: E402
from test_fused_megatron import _draw  # noqa: E402

RM = "recompute_modules"
HGX = "HGX_H100_1K_MC"


def _solve(workload, fleet=HGX, engine="numpy", **kw):
    return solve(workload, fleet, engine, **kw)


def _act(workload, modules, **kw):
    out = _solve(workload, recompute="selective", **{RM: modules}, **kw)
    assert bool(out["realizable"]), M.why_unrealizable(
        catalog.workload(workload), catalog.fleet(HGX), recompute="selective",
        **{RM: modules}, **kw)
    return float(out["memory_activations"])


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_closed_form_of_the_freed_activations(precision):
    """One stage, one microbatch in flight (the logits outweigh a layer's working set), SP
    over TP 2: "mlp" frees a dense layer's first-GEMM input (the norm fused into it: 2 bytes
    an element of h, 1 under FP8) and its intermediates (the gated first GEMM's output, 2 x
    2 bytes an element of f, and the activation's, 2; 1 under FP8), over TP, every layer of
    Llama 3 8B, DeepSeek-V3's three dense ones; "shared_experts" DeepSeek-V3's shared
    expert's intermediates on its 58 MoE layers."""
    s, t, byte = 4096, 2, (1.0 if precision == "fp8" else 2.0)
    kw = dict(batch_size=64, seq_len=s, tp_size=t, pp_size=1, dp_size=8,
              sequence_parallel=True, precision=precision)
    mid = 6.0 - (byte == 1.0)  # bytes an intermediate element of a gated MLP keeps
    base = _act("Llama3_8B_MC", "core_attn", **kw)
    assert base - _act("Llama3_8B_MC", "core_attn,mlp", **kw) == pytest.approx(
        32 * s * (byte * 4096 + mid * 14336) / t, rel=1e-12)
    kw = dict(kw, ep_size=8, etp_size=1)
    base = _act("DeepSeek_V3_MC", "core_attn", **kw)
    assert base - _act("DeepSeek_V3_MC", "core_attn,mlp", **kw) == pytest.approx(
        3 * s * (byte * 7168 + mid * 18432) / t, rel=1e-12)
    assert base - _act("DeepSeek_V3_MC", "core_attn,shared_experts", **kw) == pytest.approx(
        58 * s * mid * 2048 / t, rel=1e-12)
    # "moe": its routed copies (top-8 of the SP slice's tokens, gathered over ETP 1: 8 / t
    # tokens at h) and the routed and shared experts' intermediates (8 + 1) x 2048 wide;
    # the shared experts' own checkpoint inside it frees nothing more
    moe = base - _act("DeepSeek_V3_MC", "core_attn,moe", **kw, fp8_recipe="tensorwise")
    assert moe == pytest.approx(58 * s * (8 / t * byte * 7168 + mid * 9 * 2048 / t), rel=1e-12)
    assert _act("DeepSeek_V3_MC", "core_attn,moe,shared_experts", **kw) == _act(
        "DeepSeek_V3_MC", "core_attn,moe", **kw)


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
@pytest.mark.parametrize("sp", [True, False])
def test_the_first_stage_frees_the_dense_mlps_but_one(precision, sp):
    """Llama 3 8B on two stages, two microbatches in flight on the first (16 layers, no
    logits): "mlp" frees X a layer-microbatch, the first GEMM's input (2 bytes an element of
    h, 1 under FP8; over TP with SP, whole on every rank without) and the intermediates (6
    bytes an element of f, 5 under FP8, over TP), from 32, and its backward holds one
    layer's again: 31 X."""
    s, t = 4096, 2
    kw = dict(batch_size=64, seq_len=s, tp_size=t, pp_size=2, dp_size=4,
              sequence_parallel=sp, precision=precision)
    byte = 1.0 if precision == "fp8" else 2.0
    x = s * (byte * 4096 / (t if sp else 1) + (6.0 - (byte == 1.0)) * 14336 / t)
    freed = _act("Llama3_8B_MC", "core_attn", **kw) - _act("Llama3_8B_MC", "core_attn,mlp", **kw)
    assert freed == pytest.approx(31 * x, rel=1e-9)


@pytest.mark.parametrize("precision,etp", [("bf16", 1), ("fp8", 1), ("bf16", 2)])
def test_the_first_stage_frees_the_moe_layers_but_one(precision, etp):
    """Mixtral on two stages, two microbatches in flight on the first (16 layers, no logits):
    "moe" frees everything an MoE layer keeps past its input, X a layer-microbatch (the
    routed copies, k s etp / t tokens at 2 bytes an element of h, 1 under FP8, and the
    experts' intermediates, k f_e at 6 bytes, 5 under FP8, over TP), from 32, and its
    backward holds one layer's again: 31 X. "moe_act" beside it frees nothing more."""
    s, t = 4096, 2
    kw = dict(batch_size=64, seq_len=s, tp_size=t, pp_size=2, dp_size=4, ep_size=4 // etp,
              etp_size=etp, sequence_parallel=True, precision=precision,
              fp8_recipe="tensorwise")  # (Megatron-Core refuses moe_act beside delayed scaling)
    byte = 1.0 if precision == "fp8" else 2.0
    x = s * (2 * (etp / t) * byte * 4096 + (6.0 - (byte == 1.0)) * 2 * 14336 / t)
    base = _act("Mixtral_8x7B_MC", "core_attn", **kw)
    assert base - _act("Mixtral_8x7B_MC", "core_attn,moe", **kw) == pytest.approx(
        31 * x, rel=1e-9)
    assert _act("Mixtral_8x7B_MC", "core_attn,moe,moe_act", **kw) == _act(
        "Mixtral_8x7B_MC", "core_attn,moe", **kw)


def test_closed_form_of_the_backward_and_traffic_they_add():
    """Llama 3 8B, TP 2 with SP: "mlp" adds a layer's MLP forward to its backward (its two
    GEMMs on the efficiency curve, the activation memory-bound) and its TP pair (a
    reduce-scatter and an all-gather) to the backward's traffic; with tp_comm_overlap the
    recomputed GEMMs hide it as the others do. DeepSeek-V3: "moe" adds an MoE layer's
    forward (share of the stage's layers) and its dispatch and combine again, "shared_experts"
    the shared expert's MLP and its TP pair."""
    kw = dict(batch_size=64, seq_len=4096, tp_size=2, pp_size=1, dp_size=8,
              sequence_parallel=True, recompute="selective")
    off = chain("Llama3_8B_MC", HGX, **kw)
    on = chain("Llama3_8B_MC", HGX, **kw, **{RM: "core_attn,mlp"})
    g, hbm, tokens, f_t = on.hw.gemm, on.hw.hbm, 4096.0, 14336 / 2
    t_mlp = (g(2.0 * tokens * 4096 * f_t * 2, 1.0, k=4096) + g(2.0 * tokens * f_t * 4096, 1.0, k=f_t)
             + gemm.memory_bound_time(2.0 * tokens * f_t * 3.0, hbm))
    assert float(on.ly.layer_b) - float(off.ly.layer_b) == pytest.approx(float(t_mlp), rel=1e-9)
    assert float(on.ly.layer_f) == float(off.ly.layer_f)
    tp_bw, tp_lat = on.hw.link(on.hw.within(2, on.sp.n_acc))
    t_pair = (net.allreduce_time(float(on.ly.act_bytes), 2, bus_bandwidth=tp_bw, latency=tp_lat)
              + 2.0 * on.hw.call_lat)
    assert float(on.cm.tp_total) - float(off.cm.tp_total) == pytest.approx(t_pair, rel=1e-9)
    assert float(on.cm.tp_layer_b) - float(off.cm.tp_layer_b) == pytest.approx(t_pair, rel=1e-9)
    assert float(on.cm.tp_layer_f) == float(off.cm.tp_layer_f)
    # tp_comm_overlap: the backward's traffic hides behind its GEMMs, the recomputed ones
    # too; at TP 8 on 1,024 tokens the traffic outlasts the GEMMs, so they bound what hides
    small = dict(kw, seq_len=1024, tp_size=8, dp_size=2, tp_comm_overlap=True)
    off = chain("Llama3_8B_MC", HGX, **small)
    on = chain("Llama3_8B_MC", HGX, **small, **{RM: "core_attn,mlp"})
    tokens, f_t = 1024.0, 14336 / 8
    t_mlp8 = (g(2.0 * tokens * 4096 * f_t * 2, 1.0, k=4096) + g(2.0 * tokens * f_t * 4096, 1.0, k=f_t)
              + gemm.memory_bound_time(2.0 * tokens * f_t * 3.0, hbm))
    tp_bw, tp_lat = on.hw.link(on.hw.within(8, on.sp.n_acc))
    t_pair8 = (net.allreduce_time(float(on.ly.act_bytes), 8, bus_bandwidth=tp_bw, latency=tp_lat)
               + 2.0 * on.hw.call_lat)
    eff = float(on.c["overlap_efficiency"])
    tp_b = float(off.cm.tp_total) / 2.0 + t_pair8  # (the backward's pairs, as the forward's, and this)
    hide = 2.0 * float(off.ly.t_tp_gemms_f) + float(t_mlp8)
    assert hide < tp_b
    assert float(on.cm.tp_layer_b) == pytest.approx(tp_b - eff * hide, rel=1e-9)
    tokens = 4096.0

    kw = dict(kw, ep_size=8, etp_size=1)
    off = chain("DeepSeek_V3_MC", HGX, **kw)
    share = float(off.ly.moe_share)
    assert 0.0 < share < 1.0
    on = chain("DeepSeek_V3_MC", HGX, **kw, **{RM: "core_attn,moe"})
    # (rc 1: the forward's dispatch and combine are ep_layer_f; "moe" runs them again)
    assert float(on.cm.ep_layer_b) - float(off.cm.ep_layer_b) == pytest.approx(
        float(off.cm.ep_layer_f), rel=1e-12)
    assert float(on.cm.ep_layer) - float(off.cm.ep_layer) == pytest.approx(
        float(off.cm.ep_layer_f), rel=1e-12)
    assert float(on.cm.ep_layer_f) == float(off.cm.ep_layer_f)
    assert float(off.cm.ep_layer_f) > 0.0
    # its backward runs the MoE layer's forward again: the shared expert (TP 2), the router
    # (16 bits, on the SP slice), the permutes (16 bits: k + ... copies, _mlp_time's rule)
    # and the 32 local experts (256 over EP 8) on the top-8 copies of the SP slice gathered
    # over ETP 1
    hw = on.hw
    f_e, routed, slice_ = 2048 / 2, tokens * 8 * (1 / 2), tokens / 2
    t_shared = (g(2.0 * tokens * 7168 * f_e * 2, 1.0, k=7168) + g(2.0 * tokens * f_e * 7168, 1.0, k=f_e)
                + gemm.memory_bound_time(2.0 * tokens * f_e * 3.0, hbm))
    t_experts = (g(2.0 * routed * 7168 * 2048 * 2, 32.0, k=7168)
                 + g(2.0 * routed * 2048 * 7168, 32.0, k=2048)
                 + gemm.memory_bound_time(2.0 * routed * 2048 * 3.0, hbm))
    t_router = g(2.0 * slice_ * 7168 * 256, k=7168, peak=hw.peak16, plat=hw.plateau16)
    t_permutes = gemm.memory_bound_time(2.0 * ((3 * 8 + 2) * slice_ + 4 * routed) * 7168, hbm)
    assert float(on.ly.layer_b - off.ly.layer_b) == pytest.approx(
        share * float(t_shared + t_experts + t_router + t_permutes), rel=1e-9)
    # beside "moe_act", the experts' activation a third time (its own checkpoint inside)
    act = chain("DeepSeek_V3_MC", HGX, **kw, fp8_recipe="tensorwise", **{RM: "core_attn,moe,moe_act"})
    assert float(act.ly.layer_b - on.ly.layer_b) == pytest.approx(
        share * float(gemm.memory_bound_time(2.0 * routed * 2048 * 3.0, hbm)), rel=1e-9)
    shared = chain("DeepSeek_V3_MC", HGX, **kw, **{RM: "core_attn,shared_experts"})
    both = chain("DeepSeek_V3_MC", HGX, **kw, **{RM: "core_attn,moe,shared_experts"})
    assert float(shared.ly.layer_b - off.ly.layer_b) == pytest.approx(share * float(t_shared),
                                                                      rel=1e-9)
    # nested: the shared experts' checkpoint inside the MoE layer's runs them twice more
    assert float(both.ly.layer_b - on.ly.layer_b) == pytest.approx(share * float(t_shared),
                                                                   rel=1e-9)
    # the shared expert's TP pair again: once under "moe" or "shared_experts", twice under both
    d_moe = float(on.cm.tp_total - off.cm.tp_total)
    assert d_moe > 0.0
    assert float(shared.cm.tp_total - off.cm.tp_total) == pytest.approx(d_moe, rel=1e-9)
    assert float(both.cm.tp_total - off.cm.tp_total) == pytest.approx(2 * d_moe, rel=1e-9)


def test_hfu_counts_the_recomputed_flops():
    """hfu over mfu grows by the recomputed MLPs' FLOPs over the model's: 2 x 3 h f a token
    a dense layer ("mlp": every layer of Llama 3 8B); 2 x 3 h (k f_e + f_shared) an MoE
    layer ("moe"), its MTP module's layer too, and the shared experts' again under
    "shared_experts"."""
    kw = dict(batch_size=64, seq_len=4096, tp_size=2, pp_size=1, dp_size=8,
              sequence_parallel=True, recompute="selective")

    def ratio(workload, modules, **more):
        out = _solve(workload, **kw, **more, **{RM: modules})
        return float(out["hfu"]) / float(out["mfu"]), out

    def model_flops(out, n):
        peak = float(chain("Llama3_8B_MC", HGX, **kw).hw.peak_gemm)
        return float(out["mfu"]) * peak * float(out["step_latency_total"]) * n

    tokens = 64 * 4096
    a, x = ratio("Llama3_8B_MC", "core_attn")
    b, _ = ratio("Llama3_8B_MC", "core_attn,mlp")
    assert b - a == pytest.approx(2 * 3 * 4096 * 14336 * 32 * tokens / model_flops(x, 16),
                                  rel=1e-9)
    # an MTP module's layer is of the last layer's kind: dense here, MoE in DeepSeek-V3
    a, x = ratio("Llama3_8B_MC", "core_attn", mtp_num_layers=1)
    b, _ = ratio("Llama3_8B_MC", "core_attn,mlp", mtp_num_layers=1)
    assert b - a == pytest.approx(2 * 3 * 4096 * 14336 * 33 * tokens / model_flops(x, 16),
                                  rel=1e-9)
    more = dict(ep_size=8, etp_size=1, mtp_num_layers=1)
    a, x = ratio("DeepSeek_V3_MC", "core_attn", **more)
    b, _ = ratio("DeepSeek_V3_MC", "core_attn,moe", **more)
    c, _ = ratio("DeepSeek_V3_MC", "core_attn,moe,shared_experts", **more)
    flops = model_flops(x, 16)
    assert b - a == pytest.approx(2 * 3 * 7168 * (8 + 1) * 2048 * (58 + 1) * tokens / flops,
                                  rel=1e-9)
    assert c - b == pytest.approx(2 * 3 * 7168 * 2048 * (58 + 1) * tokens / flops, rel=1e-9)
    d, _ = ratio("DeepSeek_V3_MC", "core_attn,mlp", **more)
    assert d - a == pytest.approx(2 * 3 * 7168 * 18432 * 3 * tokens / flops, rel=1e-9)


def test_what_megatron_core_leaves_alone_changes_nothing():
    """"mlp" leaves an MoE layer alone (Mixtral: every layer MoE), "moe" and "shared_experts"
    a dense model, "shared_experts" an MoE model without shared experts: every output the
    same bits; outside selective recompute the knob is not read."""
    kw = dict(batch_size=64, seq_len=4096, tp_size=2, pp_size=2, dp_size=4,
              sequence_parallel=True)
    cases = [("Mixtral_8x7B_MC", "core_attn,mlp", "core_attn"),
             ("Mixtral_8x7B_MC", "core_attn,shared_experts", "core_attn"),
             ("Llama3_8B_MC", "moe,shared_experts,core_attn", "core_attn"),
             ("Llama3_8B_MC", "moe", None)]
    for workload, modules, same in cases:
        x = _solve(workload, **kw, recompute="selective", **{RM: modules})
        y = _solve(workload, **kw, **(dict(recompute="selective", **{RM: same}) if same
                                      else dict(recompute="none")))
        for name in M.OUTPUTS:
            assert np.array_equal(np.asarray(x[name]), np.asarray(y[name]), equal_nan=True), \
                (workload, modules, name)
    for r in ("none", "full"):
        x = _solve("DeepSeek_V3_MC", **kw, recompute=r, **{RM: "mlp,moe,shared_experts"})
        y = _solve("DeepSeek_V3_MC", **kw, recompute=r)
        for name in M.OUTPUTS:
            assert np.array_equal(np.asarray(x[name]), np.asarray(y[name]), equal_nan=True), \
                (r, name)


def test_moe_recompute_is_refused_beside_the_combined_schedule():
    """Megatron-Core: "moe" not in recompute_modules under overlap_moe_expert_parallel_comm
    (the MoE recompute re-runs the dispatch); "moe_act" and "shared_experts" are allowed."""
    wl, fl = catalog.workload("Mixtral_8x7B_MC"), catalog.fleet(HGX)
    base = dict(batch_size=512, seq_len=4096, tp_size=1, pp_size=1, ep_size=8, dp_size=64,
                overlap_moe_expert_parallel_comm=True, recompute="selective")
    assert not M.why_unrealizable(wl, fl, **base)
    assert sorted(M.why_unrealizable(wl, fl, **base, **{RM: "core_attn,moe"})) == ["a2a_overlap"]
    assert not M.why_unrealizable(wl, fl, **base, **{RM: "moe_act,shared_experts"})
    assert not M.why_unrealizable(wl, fl, **dict(base, overlap_moe_expert_parallel_comm=False),
                                  **{RM: "moe"})
    out = _solve("Mixtral_8x7B_MC", **base, **{RM: ["core_attn", "moe", "moe_act"]})
    assert out["realizable"].tolist() == [True, False, True]
    # Megatron-Core asserts it whatever the granularity, though it reads the list under
    # selective recompute alone (here none: priced as no recompute, not realizable)
    none = dict(base, recompute="none")
    assert sorted(M.why_unrealizable(wl, fl, **none, **{RM: "moe"})) == ["a2a_overlap"]
    assert not M.why_unrealizable(wl, fl, **none, **{RM: "moe_act"})
    # (the module read from any set: six of the seven, and one without it)
    assert sorted(M.why_unrealizable(wl, fl, **none, **{
        RM: "core_attn,moe_act,layernorm,mla_up_proj,mlp,moe"})) == ["a2a_overlap"]
    assert not M.why_unrealizable(wl, fl, **none, **{
        RM: "core_attn,moe_act,layernorm,mla_up_proj,mlp,shared_experts"})


@pytest.mark.parametrize("workload", ["DeepSeek_V3_MC", "Qwen3_30B_A3B_MC", "Llama3_8B_MC"])
def test_more_modules_never_hold_more_nor_run_faster(workload):
    """On random layouts of every knob under selective recompute, where the layers split into
    whole chunks: adding "mlp", "shared_experts" and "moe" never grows the stored activations
    nor the footprint and never shortens the step; somewhere each moves what it can move (on
    a dense model "mlp" alone). (Where the chunks are not whole, the model spreads a rank's
    dense layers over them in fractions, a third of one a microbatch beside a whole one's
    working set: those layouts are not realizable, and "mlp" can add there.)"""
    rng = np.random.default_rng(472)
    n = 4000
    k = {**_draw(rng, n, dp_given=True), "recompute": "selective"}
    chain_ = ["core_attn", "core_attn,mlp", "core_attn,mlp,shared_experts",
              "core_attn,mlp,moe,shared_experts"]
    outs = {m: _solve(workload, **k, **{RM: m}) for m in chain_}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        why = M.why_unrealizable(catalog.workload(workload), catalog.fleet(HGX), **k)
    ok = np.asarray(outs["core_attn"]["valid"]) & ~np.broadcast_to(why.get("layers", False), (n,))
    assert ok.sum() > 100
    moves = {"core_attn,mlp": workload != "Qwen3_30B_A3B_MC",  # (Qwen3-30B-A3B: every layer MoE)
             "core_attn,mlp,shared_experts": workload == "DeepSeek_V3_MC",  # (the one with one)
             "core_attn,mlp,moe,shared_experts": workload != "Llama3_8B_MC"}
    for fewer, more in zip(chain_, chain_[1:]):
        a, b = outs[fewer], outs[more]
        for name in ("memory_activations", "memory_footprint", "step_latency_total"):
            x, y = np.asarray(b[name])[ok], np.asarray(a[name])[ok]
            if name == "step_latency_total":
                x, y = y, x
            assert np.all(x <= y * (1 + 1e-12)), (more, name)
            assert np.any(x < y * (1 - 1e-6)) == moves[more], (more, name)


@pytest.mark.parametrize("workload", ["DeepSeek_V3_MC", "Llama3_8B_MC"])
def test_the_fused_kernel_prices_them_beside_it(workload):
    pytest.importorskip("numba")
    rng = np.random.default_rng(473)
    n = 3 * 4096
    k = {**_draw(rng, n, dp_given=True),
         RM: rng.choice(["core_attn", "mlp", "moe", "shared_experts", "core_attn,mlp,moe",
                          "moe_act,moe", "layernorm,shared_experts+mla_up_proj"], n)}
    numpy_ = engines_agree(workload, HGX, **k)
    selective = np.broadcast_to(np.asarray(k["recompute"]) == "selective", (n,))
    assert (np.asarray(numpy_["valid"]) & selective & (k[RM] != "core_attn")).sum() > 100
