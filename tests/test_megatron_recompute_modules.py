"""recompute_modules in the megatron physics ([47] of solver.physics.megatron): what
recompute="selective" recomputes, Megatron-Core's "core_attn" (the default), "moe_act" and
"layernorm". Held against closed forms of the activations they free and the backward time
they add, Megatron-Core's spec (norms fused into a linear layer are left alone), the
knob's spellings, and random layouts of every knob (the fused kernel prices it beside it,
the same bits)."""

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import sweep.physics
from solver import catalog, gemm
from solver.physics import megatron as M

sys.path.insert(0, str(Path(__file__).parent))
from _megatron_steps import chain, engines_agree, solve  # noqa: E402
from test_fused_megatron import _draw  # noqa: E402

RM = "recompute_modules"
HGX = "HGX_H100_1K_MC"


def _solve(workload, fleet=HGX, engine="numpy", **kw):
    return solve(workload, fleet, engine, **kw)


def test_spellings_and_refusals():
    """Its modules in any order, joined by ',' or '+', any case, every set of Megatron-Core's
    seven; names Megatron-Core does not have are refused, naming the value."""
    assert M.recompute_module_set("layernorm + MOE_ACT") == "moe_act,layernorm"
    assert M.recompute_module_set("core_attn,layernorm,moe_act") == "core_attn,moe_act,layernorm"
    assert sweep.physics.convert("megatron", RM, "layernorm+moe_act") == "moe_act,layernorm"
    a = _solve("Mixtral_8x7B_MC", recompute="selective", **{RM: "layernorm,moe_act"})
    b = _solve("Mixtral_8x7B_MC", recompute="selective", **{RM: "moe_act+layernorm"})
    assert float(a["memory_footprint"]) == float(b["memory_footprint"])
    assert M.recompute_module_set("mla_up_proj+CORE_ATTN") == "core_attn,mla_up_proj"
    assert M.recompute_module_set("shared_experts+MOE, mlp") == "mlp,moe,shared_experts"
    # every set of Megatron-Core's seven modules, the four first keeping their old codes
    assert len(M.CHOICES[RM]) == 127 and len(set(M.CHOICES[RM])) == 127
    assert M.CHOICES[RM][:15] == tuple(
        ",".join(m for i, m in enumerate(("core_attn", "moe_act", "layernorm", "mla_up_proj"))
                 if (c >> i) & 1) for c in range(1, 16))
    for bad, says in (("mlps", "must name one or more"), ("moe_act,mpl", "'moe_act,mpl'"),
                      ("shared_expert", "must name one or more"), ("moe_layer", "'moe_layer'"),
                      ("core_att", "must name one or more"), ("", "must name one or more")):
        with pytest.raises(ValueError, match=says):
            _solve("Mixtral_8x7B_MC", recompute="selective", **{RM: bad})
        with pytest.raises(ValueError, match=says):
            sweep.physics.convert("megatron", RM, bad)


def _act(workload, modules, **kw):
    out = _solve(workload, recompute="selective", **{RM: modules}, **kw)
    assert bool(out["realizable"])
    return float(out["memory_activations"])


# Mixtral 8x7B: 32 MoE layers, h 4096, top-2 of experts 14336 wide, gated, no MLA.
# DeepSeek-V3: 3 dense and 58 MoE layers, h 7168, top-8 of experts 2048 wide, MLA.
@pytest.mark.parametrize("precision,etp", [("bf16", 1), ("fp8", 1), ("bf16", 2)])
def test_closed_form_of_the_freed_activations(precision, etp):
    """One stage, one microbatch in flight, so the stored activations lose, a layer: "moe_act"
    the routed experts' activation output, s k f_e / t elements at 2 bytes (1 under FP8,
    what the second GEMM kept; 0 now, its 16-bit input discarded); "layernorm" an MoE
    layer's pre-MLP norm output, 2 s h / t (SP), and with MLA the input norm's, 2 s h / t (1
    under FP8, what the down projections kept), a dense MLA layer that one alone; the
    experts' TP (etp) changes none of it. (The logits outweigh the one layer's working set
    the recompute adds.)"""
    s, t, byte = 4096, 2, (1.0 if precision == "fp8" else 2.0)
    kw = dict(batch_size=64, seq_len=s, tp_size=t, pp_size=1, dp_size=8, ep_size=8 // etp,
              etp_size=etp, sequence_parallel=True, precision=precision,
              fp8_recipe="tensorwise")  # (Megatron-Core refuses moe_act, layernorm beside delayed)
    base = _act("Mixtral_8x7B_MC", "core_attn", **kw)
    assert base - _act("Mixtral_8x7B_MC", "core_attn,moe_act", **kw) == pytest.approx(
        32 * byte * s * 2 * 14336 / t, rel=1e-12)
    assert base - _act("Mixtral_8x7B_MC", "core_attn,layernorm", **kw) == pytest.approx(
        32 * 2.0 * s * 4096 / t, rel=1e-12)
    base = _act("DeepSeek_V3_MC", "core_attn", **kw)
    assert base - _act("DeepSeek_V3_MC", "core_attn,layernorm", **kw) == pytest.approx(
        (3 * byte + 58 * (2.0 + byte)) * s * 7168 / t, rel=1e-12)
    assert base - _act("DeepSeek_V3_MC", "core_attn,moe_act", **kw) == pytest.approx(
        58 * byte * s * 8 * 2048 / t, rel=1e-12)


def test_closed_form_of_the_backward_it_adds():
    """A layer's backward grows by what the recompute runs again, memory-bound at HBM speed:
    the routed experts' activation as its forward (read the gated fc1 output, 2 x 2 bytes,
    write 2, per element of the k f_e / etp of each routed token copy), and each norm that is
    a module of its own (2 bytes read and written an element of h, on the SP slice)."""
    hbm = catalog.fleet(HGX).node.accelerator.memory_bandwidth
    tokens = 4096.0
    for etp in (1, 2):
        kw = dict(batch_size=64, seq_len=4096, tp_size=2, pp_size=1, dp_size=8,
                  ep_size=8 // etp, etp_size=etp, sequence_parallel=True, recompute="selective")
        off = chain("Mixtral_8x7B_MC", HGX, **kw)
        on = chain("Mixtral_8x7B_MC", HGX, **kw, **{RM: "core_attn,moe_act"})
        # top-2 copies of the rank's tokens over TP 2, gathered over ETP, each 14336 / ETP wide
        routed = tokens * 2 * (etp / 2)
        t_act = gemm.memory_bound_time(2.0 * routed * (14336 / etp) * 3.0, hbm)
        assert float(on.ly.layer_b) - float(off.ly.layer_b) == pytest.approx(t_act, rel=1e-9)
        assert float(on.ly.layer_f) == float(off.ly.layer_f)
    kw = dict(batch_size=64, seq_len=4096, tp_size=2, pp_size=1, dp_size=8, ep_size=8,
              etp_size=1, sequence_parallel=True, recompute="selective")
    off = chain("DeepSeek_V3_MC", HGX, **kw)
    on = chain("DeepSeek_V3_MC", HGX, **kw, **{RM: "core_attn,layernorm"})
    t_norm = gemm.memory_bound_time(4.0 * tokens * 7168 / 2, hbm)
    share = float(off.ly.moe_share)
    assert 0.0 < share <= 1.0
    assert float(on.ly.layer_b) - float(off.ly.layer_b) == pytest.approx(
        (1 - share) * t_norm + share * 2 * t_norm, rel=1e-9)
    # the routed experts' activation on the MoE layers alone (8 of 256 experts 2048 wide)
    on = chain("DeepSeek_V3_MC", HGX, **kw, **{RM: "core_attn,moe_act"})
    t_act = gemm.memory_bound_time(2.0 * tokens * 8 * (1 / 2) * 2048 * 3.0, hbm)
    assert float(on.ly.layer_b) - float(off.ly.layer_b) == pytest.approx(share * t_act, rel=1e-9)


def test_what_megatron_core_leaves_alone_changes_nothing():
    """On a dense model without MLA (its norms fused into TELayerNormColumnParallelLinear,
    IdentityOp in their slot) "moe_act" and "layernorm" price as no recompute, every output
    the same bits, and beside "core_attn" as "core_attn" alone; outside selective recompute
    the knob is not read at all (MoE and MLA models too)."""
    kw = dict(batch_size=64, seq_len=4096, tp_size=2, pp_size=2, dp_size=4,
              sequence_parallel=True)
    pairs = [(dict(recompute="selective", **{RM: "moe_act,layernorm"}), dict(recompute="none")),
             (dict(recompute="selective", **{RM: "core_attn,moe_act,layernorm"}),
              dict(recompute="selective"))]
    pairs += [(dict(recompute=r, **{RM: "moe_act"}), dict(recompute=r)) for r in ("none", "full")]
    for workload in ("Llama3_8B_MC", "GPT3_175B_MC", "Mixtral_8x7B_MC", "DeepSeek_V3_MC"):
        for a, b in (pairs if workload.startswith(("Llama", "GPT")) else pairs[2:]):
            x, y = _solve(workload, **kw, **a), _solve(workload, **kw, **b)
            for name in M.OUTPUTS:
                assert np.array_equal(np.asarray(x[name]), np.asarray(y[name]),
                                      equal_nan=True), (workload, a, name)


@pytest.mark.parametrize("workload", ["Mixtral_8x7B_MC", "DeepSeek_V3_MC", "Qwen3_30B_A3B_MC"])
def test_more_modules_never_hold_more_nor_run_faster(workload):
    """On random layouts of every knob under selective recompute: adding "moe_act" and
    "layernorm" to a set never grows the stored activations nor the footprint and never
    shortens the step (their recompute is more backward work, hiding only what it adds);
    somewhere each moves. Without "core_attn" the attention core is not recomputed: the
    step is shorter than with it."""
    rng = np.random.default_rng(470)
    n = 1500
    k = {**_draw(rng, n, dp_given=True), "recompute": "selective"}
    outs = {m: _solve(workload, **k, **{RM: m}) for m in
            ("core_attn", "core_attn,moe_act", "core_attn,moe_act,layernorm",
             "core_attn,moe_act,layernorm,mla_up_proj", "moe_act,layernorm")}
    ok = np.asarray(outs["core_attn"]["valid"])
    assert ok.sum() > 150
    chain_ = ["core_attn", "core_attn,moe_act", "core_attn,moe_act,layernorm"]
    if workload == "DeepSeek_V3_MC":  # (MLA)
        chain_.append("core_attn,moe_act,layernorm,mla_up_proj")
    for fewer, more in zip(chain_, chain_[1:]):
        a, b = outs[fewer], outs[more]
        for name in ("memory_activations", "memory_footprint"):
            x, y = np.asarray(b[name])[ok], np.asarray(a[name])[ok]
            assert np.all(x <= y * (1 + 1e-12)), (more, name)
            assert np.any(x < y * (1 - 1e-6)), (more, name)
        x, y = np.asarray(b["step_latency_total"])[ok], np.asarray(a["step_latency_total"])[ok]
        assert np.all(x >= y * (1 - 1e-12)), more
        assert np.any(x > y), more
    x = np.asarray(outs["moe_act,layernorm"]["step_latency_total"])[ok]
    y = np.asarray(outs["core_attn,moe_act,layernorm"]["step_latency_total"])[ok]
    assert np.all(x <= y * (1 + 1e-12)) and np.any(x < y)


@pytest.mark.parametrize("workload", ["Mixtral_8x7B_MC", "DeepSeek_V3_MC"])
def test_the_fused_kernel_prices_it_beside_it(workload):
    pytest.importorskip("numba")
    rng = np.random.default_rng(471)
    n = 3 * 4096
    k = {**_draw(rng, n, dp_given=True),
         RM: rng.choice(["core_attn", "moe_act", "layernorm+moe_act", "core_attn,layernorm",
                          "mla_up_proj", "moe_act,mla_up_proj+layernorm"], n)}
    numpy_ = engines_agree(workload, HGX, **k)
    selective = np.broadcast_to(np.asarray(k["recompute"]) == "selective", (n,))
    assert (np.asarray(numpy_["valid"]) & selective & (k[RM] != "core_attn")).sum() > 100


def test_the_working_set_holds_what_was_discarded():
    """A layer whose backward recomputes a discarded output holds it again while that
    backward runs: the working set is what the layer stores without the recompute, less what
    it stores with it, the discarded bytes, also where the attention core is not
    recomputed (recompute code 0)."""
    from solver import megatron_memory as mem
    shape = dict(heads=32, kv_heads=8, ffn_hidden=14336, gated=True, tp_size=2,
                 sequence_parallel=True, flash_attention=True, moe_top_k=2.0,
                 moe_ffn_hidden=14336.0)
    for code in (0, 1):
        plain = mem.layer_activation_bytes(1, 4096, 4096, recompute_code=code, **shape)
        freed = dict(discarded_norms=2.0, discarded_act=2.0 * 2 * 14336 / 4096)
        kept = mem.layer_activation_bytes(1, 4096, 4096, recompute_code=code, **shape, **freed)
        work = mem.recompute_working_bytes(kept, 1, 4096, 4096, recompute_code=code, **shape,
                                           **freed)
        work0 = mem.recompute_working_bytes(plain, 1, 4096, 4096, recompute_code=code, **shape)
        assert float(plain - kept) == pytest.approx(2.0 * 4096 * 4096 / 2
                                                    + 2.0 * 4096 * 2 * 14336 / 2, rel=1e-12)
        assert float(work - work0) == pytest.approx(float(plain - kept), rel=1e-12)
        assert code == 1 or float(work0) == 0.0


def test_a_bad_set_in_a_big_array_is_refused_on_every_engine():
    pytest.importorskip("numba")
    n = 3 * 4096
    values = np.full(n, "moe_act").astype("<U20")
    values[n // 3] = "moe_act,mpl"
    for engine in ("numpy", "fused", "auto"):
        with pytest.raises(ValueError, match="'moe_act,mpl'"):
            _solve("Mixtral_8x7B_MC", engine=engine, recompute="selective", **{RM: values})


@pytest.mark.parametrize("parts", [dict(discarded_norms=2.0),
                                   dict(discarded_act=2.0 * 2 * 14336 / 4096)])
def test_each_discarded_part_is_held_again(parts):
    """The norms' outputs alone, the experts' activation alone: what one frees, the layer's
    backward holds again; and under FP8, where the layer had kept a one-byte copy, the 16-bit
    tensor the recompute restores (twice the bytes freed)."""
    from solver import megatron_memory as mem
    shape = dict(heads=32, kv_heads=8, ffn_hidden=14336, gated=True, tp_size=2,
                 sequence_parallel=True, flash_attention=True, moe_top_k=2.0,
                 moe_ffn_hidden=14336.0)
    plain = mem.layer_activation_bytes(1, 4096, 4096, recompute_code=0, **shape)
    kept = mem.layer_activation_bytes(1, 4096, 4096, recompute_code=0, **shape, **parts)
    work = mem.recompute_working_bytes(kept, 1, 4096, 4096, recompute_code=0, **shape, **parts)
    assert float(plain - kept) > 1e6
    assert float(work) == pytest.approx(float(plain - kept), rel=1e-12)
    halves = {name: value / 2 for name, value in parts.items()}
    restored = {name.replace("discarded", "restored"): value for name, value in parts.items()}
    restored.setdefault("restored_norms", 0.0)
    restored.setdefault("restored_act", 0.0)
    fp8 = dict(shape, low_bits=True)
    kept8 = mem.layer_activation_bytes(1, 4096, 4096, recompute_code=0, **fp8, **halves)
    work8 = mem.recompute_working_bytes(kept8, 1, 4096, 4096, recompute_code=0, **fp8,
                                        **halves, **restored)
    assert float(work8) == pytest.approx(float(plain - kept), rel=1e-12)


def test_a_dense_model_with_latent_attention_recomputes_its_input_norm():
    """DeepSeek-V3's attention on a dense model (no experts): "layernorm" frees the input
    norm's output of every layer, 2 s h / t under SP, and "moe_act" nothing."""
    import dataclasses
    wl = catalog.workload("DeepSeek_V3_MC")
    dense = dataclasses.replace(wl, name="dense MLA", kind="transformer", experts=None,
                                active_experts_per_token=None, moe_ffn_hidden_dim=None,
                                shared_experts=None, dense_layers=None, parameters=40e9,
                                active_parameters=None)
    kw = dict(batch_size=64, seq_len=4096, tp_size=8, dp_size=8, pp_size=1,
              sequence_parallel=True, recompute="selective")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fl = catalog.fleet(HGX)
        base, norms, act = (M.solve(dense, fl, **kw, **{RM: m}) for m in
                            ("core_attn", "core_attn,layernorm", "core_attn,moe_act"))
    assert float(base["memory_activations"]) - float(norms["memory_activations"]) == \
        pytest.approx(61 * 2.0 * 4096 * 7168 / 8, rel=1e-12)
    assert float(act["memory_activations"]) == float(base["memory_activations"])


def test_the_calibration_file_takes_any_order(tmp_path):
    """A measurements file's recompute_modules cell takes the modules in any order, joined by
    "+" (a "," needs the cell quoted), and names a module Megatron-Core does not have."""
    from sweep.calibration import MeasurementError, read_measurements
    head = ("run_id,workload,fleet,batch_size,seq_len,tp_size,pp_size,dp_size,"
            "sequence_parallel,recompute,recompute_modules,step_time_s\n")
    row = "a,Mixtral_8x7B_MC,HGX_H100_1K_MC,64,4096,2,1,8,true,selective,{},9.0\n"
    path = tmp_path / "runs.csv"
    path.write_text(head + row.format("layernorm+moe_act"))
    assert read_measurements(path).runs[0].knobs[RM] == "moe_act,layernorm"
    path.write_text(head + row.format("shared_experts+moe"))
    assert read_measurements(path).runs[0].knobs[RM] == "moe,shared_experts"
    path.write_text(head + row.format("mlps"))
    with pytest.raises(MeasurementError, match=r"column recompute_modules: .*'mlps'"):
        read_measurements(path)


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_the_first_stage_holds_the_restored_activation(precision):
    """Mixtral on two stages: the first (16 layers, two microbatches in flight, no logits)
    holds the most, its stored activations and one layer's working set. "moe_act" frees
    x = s k f_e / t elements a layer-microbatch at 2 bytes (1 under FP8) from 32, and its
    backward holds the restored 16-bit activation, 2 x, once: 62 x (30 x under FP8)."""
    s, t = 4096, 2
    kw = dict(batch_size=64, seq_len=s, tp_size=t, pp_size=2, dp_size=4, ep_size=4,
              etp_size=1, sequence_parallel=True, precision=precision,
              fp8_recipe="tensorwise")  # (Megatron-Core refuses moe_act, layernorm beside delayed)
    byte = 1.0 if precision == "fp8" else 2.0
    x = s * 2 * 14336 / t
    freed = _act("Mixtral_8x7B_MC", "core_attn", **kw) - _act("Mixtral_8x7B_MC",
                                                              "core_attn,moe_act", **kw)
    assert freed == pytest.approx((32 * byte - 2.0) * x, rel=1e-12)



def test_closed_form_of_the_up_projections_recomputed():
    """DeepSeek-V3 (MLA: 128 heads, query-key width 192, value 128, latents 1536 and 512,
    positional key 64) on one stage, TP 2: "mla_up_proj" frees every layer's Q, K and V, 2
    bytes at 2 x 192 + 128 a head, over TP (the core's output stays); its backward runs the
    up projections and the memory-bound work around them again, and under SP their
    all-gathers of the latents (the latents' share of a pair's bytes and three
    collectives' latency), nothing more forward; hfu counts the up projections' FLOPs,
    2 x 128 (1536 x 192 + 512 x 256) a token a layer."""
    s, t = 4096, 2
    kw = dict(batch_size=64, seq_len=s, tp_size=t, pp_size=1, dp_size=8, ep_size=8,
              etp_size=1, sequence_parallel=True)
    base = _act("DeepSeek_V3_MC", "core_attn", **kw)
    assert base - _act("DeepSeek_V3_MC", "core_attn,mla_up_proj", **kw) == pytest.approx(
        61 * 2.0 * s * 128 * (2 * 192 + 128) / t, rel=1e-12)
    hbm = catalog.fleet(HGX).node.accelerator.memory_bandwidth
    off = chain("DeepSeek_V3_MC", HGX, recompute="selective", **kw)
    on = chain("DeepSeek_V3_MC", HGX, recompute="selective", **kw, **{RM: "core_attn,mla_up_proj"})
    g, tokens, heads_t = on.hw.gemm, float(s), 128 / t
    t_up = (g(2.0 * tokens * 1536 * heads_t * 192, k=1536)
            + g(2.0 * tokens * 512 * heads_t * (192 - 64 + 128), k=512)
            + gemm.memory_bound_time(4.0 * (1536 + 512) * tokens / t + 4.0 * 64 * (heads_t + 1)
                                     * tokens + 8.0 * heads_t * 192 * tokens, hbm))
    assert float(on.ly.layer_b) - float(off.ly.layer_b) == pytest.approx(float(t_up), rel=1e-9)
    assert float(on.ly.layer_f) == float(off.ly.layer_f)
    from solver import network as net
    tp_bw, tp_lat = on.hw.link(on.hw.within(t, on.sp.n_acc))
    call = on.hw.call_lat
    t_ar = net.allreduce_time(float(on.ly.act_bytes), t, bus_bandwidth=tp_bw, latency=tp_lat) \
        + 2.0 * call
    t_lat = net.allreduce_time(0.0, t, bus_bandwidth=tp_bw, latency=tp_lat) + 2.0 * call
    latents = (1536 + 512 + 64) / (2.0 * 7168)
    assert float(on.cm.tp_total) - float(off.cm.tp_total) == pytest.approx(
        float(latents * t_ar + (1.5 - latents) * t_lat), rel=1e-9)
    assert float(on.cm.tp_layer_f) == float(off.cm.tp_layer_f)
    assert float(on.cm.tp_layer_b) - float(off.cm.tp_layer_b) == pytest.approx(
        float(latents * t_ar + (1.5 - latents) * t_lat), rel=1e-9)  # (MLA: no TP overlap)
    no_sp = dict(kw, sequence_parallel=False)  # (not realizable for an MoE model: priced)
    a = chain("DeepSeek_V3_MC", HGX, recompute="selective", **no_sp)
    b = chain("DeepSeek_V3_MC", HGX, recompute="selective", **no_sp, **{RM: "core_attn,mla_up_proj"})
    assert float(b.cm.tp_total) == float(a.cm.tp_total)
    # (its MTP module's layer too)
    x, y = (_solve("DeepSeek_V3_MC", recompute="selective", mtp_num_layers=1, **kw, **{RM: m})
            for m in ("core_attn", "core_attn,mla_up_proj"))
    flops = float(x["mfu"]) * float(off.hw.peak_gemm) * float(x["step_latency_total"]) * 16
    up = 2.0 * 128 * (1536 * 192 + 512 * 256) * (61 + 1) * 64 * s
    assert float(y["hfu"]) / float(y["mfu"]) - float(x["hfu"]) / float(x["mfu"]) == \
        pytest.approx(up / flops, rel=1e-9)
    # without MLA nothing but realizable: Megatron-Core refuses it ("mla_up_proj in
    # recompute_modules is only supported with multi_latent_attention")
    a, b = (_solve("Mixtral_8x7B_MC", recompute="selective", **kw, **{RM: m})
            for m in ("core_attn", "core_attn,mla_up_proj"))
    for name in M.OUTPUTS:
        if name != "realizable":
            assert np.array_equal(np.asarray(a[name]), np.asarray(b[name]), equal_nan=True), name
    assert bool(a["realizable"]) and not bool(b["realizable"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert sorted(M.why_unrealizable(catalog.workload("Mixtral_8x7B_MC"), catalog.fleet(HGX),
                                         recompute="selective", **kw,
                                         **{RM: "mla_up_proj"})) == ["recompute_mla_up_proj"]
        assert M.why_unrealizable(catalog.workload("Mixtral_8x7B_MC"), catalog.fleet(HGX),
                                  recompute="full", **kw, **{RM: "mla_up_proj"}) == {}
