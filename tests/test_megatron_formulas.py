"""Formula modules of the megatron physics against the papers' closed forms."""

import numpy as np
import pytest

from solver import flops as fl
from solver import catalog, gemm, megatron_memory as mem, network as net
from solver.physics import megatron as M
from solver.physics.megatron_compose import _model_flops


def _layer_fwd(b, s, h, a, f=None, V=0, gated=False, kv=None):
    f = 4 * h if f is None else f
    kv = a if kv is None else kv
    d = h / a
    per_layer = fl.dense_layer_flops(b * s, s, h, heads=a, kv_heads=kv, head_dim=d, ffn_hidden=f,
                                     gated=gated, micro_batch=b)
    return per_layer


@pytest.mark.parametrize("b,s,l,h,a,V", [(1, 2048, 96, 12288, 96, 51200), (512, 2048, 24, 2304, 24, 51200),
                                          (8, 4096, 105, 20480, 128, 51200)])
def test_per_gemm_counts_sum_to_narayanan_eq3(b, s, l, h, a, V):
    fwd = l * _layer_fwd(b, s, h, a) + fl.logits_flops(b * s, h, V)
    # Full recompute: 4 forward passes of the layers (1 + 2 backward + 1 recompute), LM head 3.
    hw = 4 * (fwd - fl.logits_flops(b * s, h, V)) + 3 * fl.logits_flops(b * s, h, V)
    assert hw == pytest.approx(fl.narayanan_eq3_flops(b, s, l, h, V), rel=1e-12)
    # 96 B s l h^2 (1 + s/6h + V/16lh), by hand for the first case
    if b == 1 and l == 96:
        assert fl.narayanan_eq3_flops(1, 2048, 96, 12288, 51200) == pytest.approx(
            96 * 2048 * 96 * 12288 ** 2 * (1 + 2048 / (6 * 12288) + 51200 / (16 * 96 * 12288)))


def test_korthikanti_model_and_selective_flops():
    b, s, l, h, V = 4, 2048, 48, 6144, 51200
    fwd_layers = l * _layer_fwd(b, s, h, 64)
    model = 3 * (fwd_layers + fl.logits_flops(b * s, h, V))
    assert model == pytest.approx(fl.korthikanti_flops(b, s, l, h, V), rel=1e-12)
    core = fl.attention_core_flops(b, s, s, heads=64, head_dim=h / 64)
    assert fl.korthikanti_flops(b, s, l, h, V, recompute="selective") == pytest.approx(model + l * core)
    assert fl.korthikanti_flops(b, s, l, h, V, recompute="full") == fl.narayanan_eq3_flops(b, s, l, h, V)
    with pytest.raises(ValueError, match="recompute"):
        fl.korthikanti_flops(b, s, l, h, V, recompute="half")


def test_megatron_count_equals_korthikanti_for_gpt_and_counts_gqa_swiglu():
    b, s, l, h, a, V = 2, 4096, 32, 4096, 32, 128256
    assert fl.megatron_model_flops(b, s, l, h, heads=a, kv_heads=a, ffn_hidden=4 * h, vocab=V) == \
        pytest.approx(fl.korthikanti_flops(b, s, l, h, V), rel=1e-12)
    # Llama-3-8B-like: GQA 8 KV heads, SwiGLU 14336: per-GEMM sum, 3x forward
    fwd = l * _layer_fwd(b, s, h, a, f=14336, gated=True, kv=8) + fl.logits_flops(b * s, h, V)
    assert fl.megatron_model_flops(b, s, l, h, heads=a, kv_heads=8, ffn_hidden=14336, vocab=V,
                                   gated=True) == pytest.approx(3 * fwd, rel=1e-12)
    # = 6 (N_layers + N_lm_head) tokens + 12 l h s tokens (dense attention), by hand
    n_layers = l * (h * 128 * (32 + 16) + 32 * 128 * h + 3 * h * 14336)
    assert 3 * fwd == pytest.approx(b * s * (6 * (n_layers + V * h) + 12 * l * h * s), rel=1e-12)


def test_causal_kernel_halves_attention_core():
    full = fl.attention_core_flops(2, 1024, 1024, heads=8, head_dim=128)
    assert fl.attention_core_flops(2, 1024, 1024, heads=8, head_dim=128, causal_fraction=0.5) == full / 2
    assert full == 4 * 2 * 8 * 1024 * 1024 * 128


def test_korthikanti_activation_table2():
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    kw = dict(heads=a, kv_heads=a, ffn_hidden=4 * h, gated=False, flash_attention=False)
    sbh = s * b * h
    none_tp = mem.layer_activation_bytes(b, s, h, tp_size=t, sequence_parallel=False, recompute_code=0, **kw)
    assert none_tp == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    none_sp = mem.layer_activation_bytes(b, s, h, tp_size=t, sequence_parallel=True, recompute_code=0, **kw)
    assert none_sp == pytest.approx(sbh / t * (34 + 5 * a * s / h))
    sel_sp = mem.layer_activation_bytes(b, s, h, tp_size=t, sequence_parallel=True, recompute_code=1, **kw)
    assert sel_sp == pytest.approx(34 * sbh / t)
    full = mem.layer_activation_bytes(b, s, h, tp_size=t, sequence_parallel=False, recompute_code=2, **kw)
    assert full == pytest.approx(2 * sbh)
    one = mem.layer_activation_bytes(b, s, h, tp_size=1, sequence_parallel=False, recompute_code=0, **kw)
    assert one == pytest.approx(sbh * (34 + 5 * a * s / h))


def test_dropout_zero_keeps_no_masks():
    """Korthikanti's 34 s b h + 5 a s^2 b, tensor by tensor, counts a one-byte mask for each
    of the two hidden dropouts (after the attention, after the MLP) and, in an unfused
    attention, the score dropout's mask (1) and output (2) beside the softmax output (2).
    PyTorch's dropout keeps no mask at p = 0 (megatron_memory [9]): at
    hidden_dropout 0 the 34 is 32 (the 10 replicated over TP is 8), at attention_dropout 0
    the 5 a s / h is 2 a s / h; a fused attention keeps no mask either way."""
    s, b, h, a, t = 2048, 2, 12288, 96, 8
    sbh = s * b * h
    kw = dict(heads=a, kv_heads=a, ffn_hidden=4 * h, gated=False, flash_attention=False,
              recompute_code=0)
    score = a * s / h
    for hid, att, rep, sc in ((0.1, 0.1, 10, 5), (0.0, 0.1, 8, 5), (0.1, 0.0, 10, 2),
                              (0.0, 0.0, 8, 2), (1.0, 1.0, 10, 5), (0.5, 1e-9, 10, 5)):
        tp_only = mem.layer_activation_bytes(b, s, h, tp_size=t, sequence_parallel=False,
                                             hidden_dropout=hid, attention_dropout=att, **kw)
        assert tp_only == pytest.approx(sbh * (rep + 24 / t + sc * score / t)), (hid, att)
        with_sp = mem.layer_activation_bytes(b, s, h, tp_size=t, sequence_parallel=True,
                                             hidden_dropout=hid, attention_dropout=att, **kw)
        assert with_sp == pytest.approx(sbh / t * (rep + 24 + sc * score)), (hid, att)
    # the defaults are Megatron-Core's 0.1 each: Korthikanti's count
    assert mem.layer_activation_bytes(b, s, h, tp_size=1, sequence_parallel=False, **kw) == \
        pytest.approx(sbh * (34 + 5 * score))
    # a fused attention: only the hidden masks move, and array probabilities broadcast
    fused = mem.layer_activation_bytes(b, s, h, tp_size=1, sequence_parallel=False,
                                       hidden_dropout=np.array([0.0, 0.1]),
                                       attention_dropout=np.array([[0.0], [0.1]]),
                                       **dict(kw, flash_attention=True))
    assert fused.shape == (2, 2)
    np.testing.assert_allclose(fused / sbh, [[32, 34], [32, 34]])
    # full recompute keeps the layer input alone, dropout or not
    for p in (0.0, 0.1):
        assert mem.layer_activation_bytes(b, s, h, tp_size=t, sequence_parallel=False,
                                          hidden_dropout=p, attention_dropout=p,
                                          **dict(kw, recompute_code=2)) == pytest.approx(2 * sbh)


def test_fp8_keeps_linear_inputs_in_one_byte():
    """Transformer Engine under FP8 saves each linear layer's input as FP8 (megatron_memory
    [6]). Korthikanti's 34 s b h, tensor by tensor: QKV input 2, Q K 4, V 2, projection
    input 2, attention dropout mask 1, fc1 input 2, GELU input 8, fc2 input 8, MLP dropout
    mask 1, norm inputs 4. Under FP8 the QKV, fc1, fc2 and projection inputs take one byte
    an element: 34 - 1 - 1 - 4 - 1 = 27; beside a fused attention, which keeps its 16-bit
    output (the projection input) itself, the projection's FP8 copy adds one: 34 - 6 + 1."""
    s, b, h, a, t = 4096, 1, 8192, 64, 8
    sbh = s * b * h
    kw = dict(heads=a, kv_heads=a, ffn_hidden=4 * h, gated=False)
    for sp, div in ((False, 1), (True, t)):
        bf16 = mem.layer_activation_bytes(b, s, h, tp_size=t, sequence_parallel=sp, recompute_code=1,
                                          flash_attention=False, **kw)
        fp8 = mem.layer_activation_bytes(b, s, h, tp_size=t, sequence_parallel=sp, recompute_code=1,
                                         flash_attention=False, low_bits=True, **kw)
        # replicated (norm inputs 4, QKV input 2 -> 1, fc1 input 2 -> 1, masks 2) and split
        # (Q K 4, V 2, projection input 2 -> 1, GELU input 8, fc2 input 8 -> 4)
        assert bf16 == pytest.approx(sbh * (10 / div + 24 / t))
        assert fp8 == pytest.approx(sbh * (8 / div + 19 / t))
        flash = mem.layer_activation_bytes(b, s, h, tp_size=t, sequence_parallel=sp, recompute_code=0,
                                           flash_attention=True, low_bits=True, **kw)
        assert flash == pytest.approx(sbh * (8 / div + 21 / t))
        # Under selective recompute the fused attention runs inside the checkpoint and keeps
        # nothing of its own: the projection's input is its FP8 copy alone, as unfused
        # (an audit found the fused attention then charged a byte more than the unfused).
        flash_sel = mem.layer_activation_bytes(b, s, h, tp_size=t, sequence_parallel=sp,
                                               recompute_code=1, flash_attention=True,
                                               low_bits=True, **kw)
        assert flash_sel == pytest.approx(fp8)
    one = mem.layer_activation_bytes(b, s, h, tp_size=1, sequence_parallel=False, recompute_code=1,
                                     flash_attention=False, low_bits=True, **kw)
    assert one == pytest.approx(27 * sbh)
    # SwiGLU (fc1 output 2 x f wide, fc2 input f wide) with GQA: fc2's input f/h -> f/(2h)
    g = dict(heads=a, kv_heads=8, ffn_hidden=28672, gated=True, flash_attention=True)
    d = [mem.layer_activation_bytes(b, s, h, tp_size=1, sequence_parallel=False, recompute_code=0,
                                    low_bits=x, **g) for x in (False, True)]
    assert (d[0] - d[1]) / sbh == pytest.approx(1 + 1 + 28672 / h - 1)
    # MoE layer, top-2: the routed copies (2 bytes each) take one; the router's input stays
    moe = dict(heads=a, kv_heads=8, ffn_hidden=14336, gated=True, flash_attention=True,
               moe_top_k=2, moe_ffn_hidden=14336)
    d = [mem.layer_activation_bytes(b, s, h, tp_size=1, sequence_parallel=False, recompute_code=0,
                                    low_bits=x, **moe) for x in (False, True)]
    assert (d[0] - d[1]) / sbh == pytest.approx(1 + 2 + 2 * 14336 / h - 1)
    # full recompute keeps the 16-bit layer input alone, whatever the GEMMs' precision
    full = [mem.layer_activation_bytes(b, s, h, tp_size=t, sequence_parallel=True, recompute_code=2,
                                       flash_attention=True, low_bits=x, **kw) for x in (False, True)]
    assert full[0] == full[1] == pytest.approx(2 * sbh / t)


def test_interleaved_in_flight_layers_and_distributed_optimizer_bytes():
    L, p, v = 96, 8, 3
    got = mem.in_flight_layers(L / p, p, v, 64)
    assert got == pytest.approx(L * (1 + (p - 1) / (p * v)))
    assert mem.in_flight_layers(L / p, p, 1, 64) == pytest.approx(L)
    assert mem.in_flight_layers(L / p, p, 1, 2) == pytest.approx(2 * L / p)
    w, g, o = mem.model_state(1e9, shard_group=8, zero_stage=1)
    assert (w + g + o) / 1e9 == pytest.approx(2 + 4 + 12 / 8)
    w3, g3, o3 = mem.model_state(1e9, shard_group=8, zero_stage=3)
    assert (w3 + g3 + o3) / 1e9 == pytest.approx(18 / 8)
    # dist_optimizer.md's table: fp16 params and grads 20 B / parameter, 4 + 16 / d sharded
    w, g, o = mem.model_state(1e9, shard_group=8, zero_stage=0, grad_bytes=2.0)
    assert (w + g + o) / 1e9 == pytest.approx(20)
    w, g, o = mem.model_state(1e9, shard_group=8, zero_stage=1, grad_bytes=2.0)
    assert (w + g + o) / 1e9 == pytest.approx(4 + 16 / 8)
    w, g, o = mem.model_state(1e9, shard_group=8, zero_stage=0)
    assert (w + g + o) / 1e9 == pytest.approx(18)


def test_network_collectives():
    M, n = 1e9, 8
    assert net.allreduce_time(M, 1, bus_bandwidth=1e11, latency=1e-6) == 0.0
    ar = net.allreduce_time(M, n, bus_bandwidth=1e11, latency=0.0)
    rs = net.reduce_scatter_time(M, n, bus_bandwidth=1e11, latency=0.0)
    ag = net.all_gather_time(M, n, bus_bandwidth=1e11, latency=0.0)
    assert ar == pytest.approx(rs + ag) and ar == pytest.approx(2 * 7 / 8 * M / 1e11)
    # two-level with everything in one domain is the one-domain collective
    kw = dict(scale_up_bandwidth=1e11, scale_up_latency=1e-6, scale_out_bandwidth=1e10, scale_out_latency=5e-6)
    assert net.two_level_time("all_reduce", M, 8, 8, **kw) == pytest.approx(
        net.allreduce_time(M, 8, bus_bandwidth=1e11, latency=1e-6))
    assert net.two_level_time("all_reduce", M, 16, 1, **kw) == pytest.approx(
        net.allreduce_time(M, 16, bus_bandwidth=1e10, latency=5e-6))
    assert net.p2p_time(1e6, bandwidth=1e9, latency=1e-6) == pytest.approx(1e-3 + 1e-6)


def test_gemm_curve_is_calculon_table():
    peak = 312e12
    for gflop, eff in ((128, 0.95), (16, 0.9), (1, 0.6), (1000, 0.95)):
        assert gemm.gemm_size_efficiency(gflop * 1e9, peak) * 0.95 == pytest.approx(eff)
    # faster accelerator needs larger GEMMs: same size is less efficient on 3x the peak
    assert gemm.gemm_size_efficiency(4e9, 3 * peak) < gemm.gemm_size_efficiency(4e9, peak)
    assert gemm.gemm_time(1e12, 1e15, plateau=0.5) == pytest.approx(2e-3)


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_hfu_counts_the_recomputed_forward_of_the_layers_not_the_output_layer(engine):
    # Narayanan 2021 eq. 3, full recompute: 96 B s l h^2 (1 + s/6h + V/16lh) hardware
    # FLOPs against 72 B s l h^2 (1 + s/6h + V/12lh) model FLOPs (GPT-3 175B: MHA, plain
    # MLP of 4h): the output layer is not recomputed.
    wl = catalog.workload("GPT3_175B_MC")
    s, h, l, V = 2048, wl.hidden_dim, wl.layers, wl.vocab_size
    out = M.solve(wl, catalog.fleet("HGX_H100_1K_MC"), engine=engine, batch_size=64, seq_len=s,
                  tp_size=8, pp_size=8, micro_batch_size=1, recompute="full")
    want = 96 * (1 + s / (6 * h) + V / (16 * l * h)) / (72 * (1 + s / (6 * h) + V / (12 * l * h)))
    assert float(out["hfu"] / out["mfu"]) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("engine", ["numpy", "fused"])
@pytest.mark.parametrize("name", ["Qwen3_30B_A3B_MC", "DeepSeek_V3_MC", "Llama3_70B_MC"])
def test_hfu_of_selective_recompute_is_the_attention_cores_forward(engine, name):
    # Selective recompute reruns QK^T and PV forward: 4 s heads d FLOPs a token and layer,
    # at the heads' own width (Qwen3-30B-A3B: 32 heads of 128 on h = 2048; DeepSeek-V3's
    # MLA: the mean of its key and value widths), not h.
    wl = catalog.workload(name)
    w = M._Shape(wl)
    s, batch = 4096, 256
    out = M.solve(wl, catalog.fleet("HGX_H100_1K_MC"), engine=engine, batch_size=batch, seq_len=s,
                  tp_size=4, pp_size=1, micro_batch_size=1, sequence_parallel=True,
                  recompute="selective")
    # against the model's own FLOP count of a step
    per_token = float(_model_flops(w, batch, s, float(w.hidden), w.head_dim)) / (batch * s)
    core = 4.0 * s * w.heads * w.core_dim * w.layers
    got = float(out["hfu"] / out["mfu"]) - 1.0
    assert got == pytest.approx(core / per_token, rel=1e-12)
    if w.heads * w.core_dim != w.hidden:  # not the h-wide count
        assert got > 1.4 * 4.0 * s * w.hidden * w.layers / per_token
