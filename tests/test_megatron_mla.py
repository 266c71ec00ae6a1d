"""Multi-head latent attention (DeepSeek-V2/V3) in the megatron physics: shapes, FLOPs, TP
traffic and activations against closed forms written out here from the papers' configs."""

import dataclasses
import warnings

import numpy as np
import pytest

from solver import catalog, flops as fl, megatron_memory as mem
from solver.physics import megatron as M
from solver.specs import MLA_KEYS

DSV3 = catalog.workload("DeepSeek_V3_MC")
#: DeepSeek-V3 as the catalog had it before MLA was modelled: multi-head attention, heads 128 wide.
DSV3_MHA = dataclasses.replace(DSV3, head_dim=128, **{key: None for key in MLA_KEYS})


def _mla_attention_params(h, heads, q_lora, kv_lora, nope, rope, v):
    """One MLA layer's attention weights, module by module (DeepSeek-V2 Sec. 2.1)."""
    q = (h * q_lora + q_lora + q_lora * heads * (nope + rope)) if q_lora else h * heads * (nope + rope)
    kv = h * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v)
    return q + kv + heads * v * h


def _total_params(h, layers, dense_layers, ffn, moe_ffn, experts, shared, vocab, attention):
    dense = attention + 3 * h * ffn + 2 * h
    moe = attention + 2 * h + h * experts + (experts + shared) * 3 * h * moe_ffn
    return dense_layers * dense + (layers - dense_layers) * moe + 2 * vocab * h


def test_deepseek_v3_has_its_published_parameter_count():
    """The config's shape gives DeepSeek-V3's 671B (its paper's count, without the MTP module)."""
    shape = M._Shape(DSV3)
    attention = _mla_attention_params(7168, 128, 1536, 512, 128, 64, 128)
    assert attention == 187_107_328
    assert shape.attn_params == attention
    total = _total_params(7168, 61, 3, 18432, 2048, 256, 1, 129280, attention)
    stage = (shape.dense_layer_params * shape.dense_layers
             + (shape.moe_layer_nonexpert + shape.expert_params * shape.experts) * shape.moe_layers
             + 2 * shape.embedding_params)
    assert stage == total
    assert abs(total / 671e9 - 1) < 1e-4  # 671.03e9
    # the approximation it replaces counted 2.5x the attention weights
    assert M._Shape(DSV3_MHA).attn_params / attention == pytest.approx(2.51, abs=0.01)


def test_deepseek_v2_lite_without_q_lora_has_its_parameter_count():
    """Queries projected directly (no q_lora_rank): DeepSeek-V2-Lite's 15.7B."""
    from test_fused_megatron import V2_LITE
    shape = M._Shape(V2_LITE)
    attention = _mla_attention_params(2048, 16, 0, 512, 128, 64, 128)
    assert shape.attn_params == attention
    total = _total_params(2048, 27, 1, 10944, 1408, 64, 2, 102400, attention)
    assert abs(total / 15.7e9 - 1) < 0.01


def test_mla_model_flops_are_six_per_weight_and_the_core_at_its_widths():
    B, s, layers, h, heads = 8.0, 4096.0, 61.0, 7168.0, 128.0
    P = _mla_attention_params(7168, 128, 1536, 512, 128, 64, 128)
    got = fl.megatron_model_flops(B, s, layers, h, heads=heads, kv_heads=heads, ffn_hidden=0.0,
                                  vocab=0.0, attention_params=P, core_head_dim=(192 + 128) / 2)
    # forward + backward: 6 FLOPs per weight and token; QK^T (192 wide) and PV (128 wide), 2
    # FLOPs per MAC each, times 3
    expected = 6 * B * s * layers * P + 3 * 2 * B * s * s * layers * heads * (192 + 128)
    assert got == pytest.approx(expected, rel=1e-12)


def _tp_bytes_and_latency(workload, fleet, **kw):
    """The TP time's bandwidth part and its latency part, apart: priced at two NVLink
    efficiencies (the time is B / efficiency + L)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        half = M.solve(workload, fleet, scale_up_efficiency=0.5, **kw)["tp_communication_latency"]
        whole = M.solve(workload, fleet, scale_up_efficiency=1.0, **kw)["tp_communication_latency"]
    return half - whole, 2.0 * whole - half


@pytest.mark.parametrize("engine", ["numpy", "fused"])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_mla_tp_pair_moves_its_latents_where_gqa_moves_h(engine, recompute):
    """Per layer, one of the attention's two collectives carries (q_lora + kv_lora + rope)
    elements a token instead of h; the MLP's pair (dense or shared experts) is unchanged.
    Under SP the attention makes four collectives a direction (three all-gathers and a
    reduce-scatter) where GQA makes two, so its latency is two pairs'; without SP, one."""
    if engine == "fused":
        pytest.importorskip("numba")
    h = 7168
    attn_pair = (h + 1536 + 512 + 64) / (2 * h)
    assert M._Shape(DSV3).attn_pair == attn_pair
    fleet = catalog.fleet("GB200_NVL72_8_MC")
    kw = dict(batch_size=1152, seq_len=4096, tp_size=[8, 4, 8, 4], pp_size=9, ep_size=8,
              micro_batch_size=1, sequence_parallel=[True, True, False, False],
              recompute=recompute, engine=engine)
    mla_bytes, mla_latency = _tp_bytes_and_latency(DSV3, fleet, **kw)
    mha_bytes, mha_latency = _tp_bytes_and_latency(DSV3_MHA, fleet, **kw)
    assert (mha_latency > 0.05 * mha_bytes).all() and (mha_bytes > 0.05 * mha_latency).all()  # both count
    # every DeepSeek-V3 layer has an MLP pair: dense MLP or shared expert
    np.testing.assert_allclose(mla_bytes / mha_bytes, (attn_pair + 1.0) / 2.0, rtol=1e-9)
    np.testing.assert_allclose(mla_latency / mha_latency,
                               [(2.0 + 1.0) / 2.0] * 2 + [(attn_pair + 1.0) / 2.0] * 2, rtol=1e-6)


def test_mla_activations_keep_q_k_v_and_context_at_their_widths():
    shape = M._Shape(DSV3)
    b, s, h, t = 1.0, 4096.0, 7168.0, 8.0
    common = dict(heads=128, kv_heads=128, ffn_hidden=18432, gated=True, tp_size=t,
                  recompute_code=0, flash_attention=True)
    for sp in (False, True):
        with_mla = mem.layer_activation_bytes(
            b, s, h, sequence_parallel=sp, attention_bytes=shape.attn_act,
            latent_bytes=shape.latent_act, context_ratio=shape.context_ratio, **common)
        without = mem.layer_activation_bytes(b, s, h, sequence_parallel=sp, attention_bytes=0.0,
                                             **common)
        # Q and K 192 wide, V and the context 128, per head, 2 bytes, split by TP with the
        # heads; the q and kv latents before and after their norms and the positional key,
        # 2 bytes, split by TP only under SP
        split = 2 * 128 * (192 + 192 + 128 + 128) / t
        latents = 2 * (2 * 1536 + 2 * 512 + 64) / (t if sp else 1.0)
        assert float(with_mla - without) == pytest.approx(b * s * (split + latents), rel=1e-12)


def test_mla_prices_less_attention_work_than_the_multi_head_approximation():
    """At TP 1 with no communication to speak of, the MLA layer's compute is below the
    multi-head approximation's (2.5x the attention weights) and its MFU counts fewer FLOPs."""
    fleet = catalog.fleet("HGX_H100_1K_MC")
    kw = dict(batch_size=1024, seq_len=4096, tp_size=1, pp_size=16, ep_size=64,
              micro_batch_size=1, recompute="full", engine="numpy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mla, mha = M.solve(DSV3, fleet, **kw), M.solve(DSV3_MHA, fleet, **kw)
    assert mla["valid"] and mha["valid"]
    assert float(mla["compute_latency"]) < 0.9 * float(mha["compute_latency"])
    assert float(mla["memory_weights"]) < float(mha["memory_weights"])
    # the model FLOPs differ by the attention weights' 6 per token and the core's widths
    B, s, layers, n = 1024, 4096, 61, 1024
    p_mha = 7168 * 128 * (128 + 2 * 128) + 128 * 128 * 7168
    p_mla = _mla_attention_params(7168, 128, 1536, 512, 128, 64, 128)
    diff = 6 * B * s * layers * (p_mha - p_mla) + 12 * B * s * s * layers * 128 * (128 - 160)
    step = {name: float(o["model_flops_per_accelerator"]) * float(o["step_latency_total"]) * n
            for name, o in (("mha", mha), ("mla", mla))}  # the output is a rate
    got = step["mha"] - step["mla"]
    assert got == pytest.approx(diff, rel=1e-9)


@pytest.mark.parametrize("change, key", [
    (dict(v_head_dim=None), "v_head_dim"),
    (dict(qk_rope_head_dim=0), "qk_rope_head_dim"),
    (dict(head_dim=128), "head_dim"),
    (dict(kv_heads=8), "kv_heads"),
    (dict(q_lora_rank=0), "q_lora_rank"),
])
def test_mla_keys_are_checked(change, key):
    with pytest.raises(ValueError, match=key):
        dataclasses.replace(DSV3, **change)


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_a_pipelined_deepseek_v3_is_paced_by_a_stage_of_moe_layers_only(engine):
    """Megatron-Core gives stages consecutive layers: DeepSeek-V3's 3 dense layers sit on the
    first stage, and a stage of MoE layers only paces the pipeline and holds the most expert
    weights. Pipelined, its time is priced as the same model with no dense layers (but for
    the model FLOPs); without a pipeline the one stage holds the model's mix. Its memory is
    each rank's own: the largest weights are a stage of MoE layers and an embedding matrix
    in both (rank 0 of the all-MoE model, the last rank of DeepSeek-V3), and DeepSeek-V3's
    first rank, of lighter dense layers, holds no more, so its footprint is at most the
    all-MoE model's, less where the all-MoE first rank's microbatches in flight count."""
    if engine == "fused":
        pytest.importorskip("numba")
    all_moe = dataclasses.replace(DSV3, dense_layers=0)
    fleet = catalog.fleet("GB200_NVL72_8_MC")
    kw = dict(batch_size=1152, seq_len=4096, tp_size=[1, 2, 4], pp_size=[[1], [2], [4], [8]],
              ep_size=8, micro_batch_size=1, sequence_parallel=True, recompute="full",
              dp_size=16, engine=engine)
    if engine == "fused":  # flat knobs
        grid = np.broadcast_arrays(np.array(kw["tp_size"]), np.array(kw["pp_size"]))
        kw["tp_size"], kw["pp_size"] = grid[0].ravel(), grid[1].ravel()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mixed, moe = M.solve(DSV3, fleet, **kw), M.solve(all_moe, fleet, **kw)
    pp = np.broadcast_to(np.asarray(kw["pp_size"]), mixed["valid"].shape)
    assert mixed["valid"].all()
    for name in ("step_latency_total", "memory_weights", "ep_communication_latency",
                 "dp_communication_latency"):
        np.testing.assert_array_equal(mixed[name][pp > 1], moe[name][pp > 1], err_msg=name)
    for name in ("step_latency_total", "memory_footprint", "memory_weights", "ep_communication_latency",
                 "dp_communication_latency"):
        # (the gradient reduction hides behind the backward without a pipeline: 0 in both)
        assert (mixed[name][pp == 1] < moe[name][pp == 1]).all() or name.startswith("dp"), name
    foot_mixed, foot_moe = mixed["memory_footprint"], moe["memory_footprint"]
    assert (foot_mixed[pp > 1] <= foot_moe[pp > 1]).all()
    # 4 and 8 stages: the all-MoE model's first rank, 4 and 8 microbatches in flight, holds more
    assert (foot_mixed[pp >= 4] < foot_moe[pp >= 4]).all()


def test_dense_layers_filling_the_stages_leave_the_heaviest_stage_mixed():
    """Where the leading dense layers fill every stage but part of the last, no stage is all
    MoE: the heaviest stage is priced at the model's mix (6 dense of 8 layers on 2 stages)."""
    from solver.physics.megatron_steps import heaviest_moe_share, heavy_moe_stage
    shape = M._Shape(dataclasses.replace(DSV3, layers=8, dense_layers=6))
    assert not heavy_moe_stage(shape, np.array(2)) and heavy_moe_stage(shape, np.array(4))
    np.testing.assert_array_equal(heaviest_moe_share(shape, np.array([1, 2, 4, 8])),
                                  [2 / 8, 2 / 8, 1.0, 1.0])
    assert heaviest_moe_share(M._Shape(DSV3), 1) == 58 / 61


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_mla_turns_tp_comm_overlap_off(engine):
    """TELinear turns tp_comm_overlap off on the shared config for any buffer but qkv, proj,
    fc1 and fc2, and MLA's projections have others [33]: the knob hides nothing for
    DeepSeek-V3, and hides TP traffic for the same model with multi-head attention."""
    if engine == "fused":
        pytest.importorskip("numba")
    fleet = catalog.fleet("GB200_NVL72_8_MC")
    kw = dict(batch_size=1152, seq_len=4096, tp_size=8, pp_size=9, ep_size=8, micro_batch_size=1,
              sequence_parallel=True, tp_comm_overlap=np.array([False, True]), engine=engine,
              num_layers_in_first_pipeline_stage=5)  # 61 layers: 5, then 7 on each of 8 stages
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mla, mha = M.solve(DSV3, fleet, **kw), M.solve(DSV3_MHA, fleet, **kw)
    assert mla["realizable"].all() and mha["realizable"].all()
    assert mla["tp_communication_latency"][0] == mla["tp_communication_latency"][1] > 0
    assert mha["tp_communication_latency"][1] < mha["tp_communication_latency"][0]


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_mla_down_projections_are_whole_on_every_tp_rank(engine):
    """The down projections and the latents' norms are duplicated (15,140,864 weights a
    layer), as are the layer's two norms and an MoE layer's router: from TP 4 to TP 8 the
    weights a rank holds fall by an eighth of the rest (the experts kept whole on each
    rank, etp_size 1, so they do not move)."""
    if engine == "fused":
        pytest.importorskip("numba")
    shape = M._Shape(DSV3)
    assert shape.attn_dup == 1536 * 7168 + 1536 + 7168 * (512 + 64) + 512 == 15_140_864
    fleet = catalog.fleet("GB200_NVL72_8_MC")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = M.solve(DSV3, fleet, batch_size=1152, seq_len=4096, tp_size=np.array([4, 8]),
                      dp_size=8, ep_size=8, etp_size=1, micro_batch_size=1, recompute="full",
                      sequence_parallel=True, zero_stage=0, engine=engine)
    assert shape.dense_dup == shape.attn_dup + 2 * 7168
    assert shape.moe_dup == shape.dense_dup + 7168 * 256
    split = (3 * (shape.dense_layer_params - shape.dense_dup)
             + 58 * (shape.moe_layer_nonexpert - shape.moe_dup))
    # the two embedding matrices, their 129,280 entries padded to a multiple of 128 x TP [41]:
    # 129,536 at TP 4, 130,048 at TP 8
    embeddings = 2 * 7168 * (129_536 / 4 - 130_048 / 8)
    drop = out["memory_weights"][0] - out["memory_weights"][1]
    assert drop == pytest.approx(2.0 * (split * (1 / 4 - 1 / 8) + embeddings), rel=1e-12)


def test_interleaved_stages_leave_every_device_a_dense_layer_where_chunks_are_short():
    """Device r holds chunks r, r + pp, ...: with 3 dense layers in 92 and pp 2, chunks of 2
    (v 23) put a dense layer on both devices; chunks of 23 (v 2) leave device 1 MoE only."""
    from solver.physics.megatron_steps import heavy_moe_stage
    shape = M._Shape(dataclasses.replace(DSV3, layers=92, dense_layers=3))
    assert not heavy_moe_stage(shape, np.array(2), np.array(23))
    assert heavy_moe_stage(shape, np.array(2), np.array(2))
    assert heavy_moe_stage(shape, np.array(2), np.array(1))


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_the_first_stage_counts_where_its_dense_layers_outweigh_moe_ones(engine):
    """At EP 64 a DeepSeek-V3 MoE layer holds 4 experts a rank, fewer weights than a dense
    layer: on 16 stages (4 layers each) the first stage's 3 dense layers, 1 MoE layer and
    embedding outweigh 4 MoE layers and the output layer, and its memory is the one priced
    (DDP, zero_stage 0: every parameter's state whole on every rank, so weights decide)."""
    if engine == "fused":
        pytest.importorskip("numba")
    shape = M._Shape(DSV3)
    fleet = catalog.fleet("GB200_NVL72_8_MC")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = M.solve(DSV3, fleet, batch_size=1024, seq_len=4096, tp_size=1, pp_size=np.array([16, 8]),
                      dp_size=64, ep_size=64, micro_batch_size=1, recompute="full", zero_stage=0,
                      engine=engine)
    assert out["valid"].all()
    first = (3 * shape.dense_layer_params + shape.moe_layer_nonexpert + shape.embedding_params
             + shape.expert_params * 256 / 64)
    moe_only = 4 * (shape.moe_layer_nonexpert + shape.expert_params * 256 / 64) + shape.embedding_params
    assert first > 1.15 * moe_only
    assert out["memory_weights"][0] == pytest.approx(2.0 * first, rel=1e-12)


@pytest.mark.parametrize("sp, tp", [(True, 4), (False, 4), (False, 1)])
def test_mla_latent_norms_rope_and_concatenations_stream_their_bytes(sp, tp, monkeypatch):
    """Besides the layer's elementwise work, an MLA layer streams, 16 bits read and written:
    the two latents' norms on the down projections' tokens, RoPE on the positional query
    (every local head) and key (one), and the query's and key's concatenations (local
    heads x qk_head_dim each). DeepSeek-V3's widths, written out from its config."""
    from solver import gemm
    from solver.physics import megatron_steps
    seen = []
    real = gemm.memory_bound_time

    def record(nbytes, bandwidth, **kw):
        seen.append(np.asarray(nbytes, dtype=float).copy())
        return real(nbytes, bandwidth, **kw)

    monkeypatch.setattr(megatron_steps.gemm, "memory_bound_time", record)
    mbs, s = 1, 4096
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        M.solve(DSV3, catalog.fleet("GB200_NVL72_8_MC"), batch_size=1152, seq_len=s, tp_size=tp,
                pp_size=8, ep_size=8, micro_batch_size=mbs, sequence_parallel=sp, engine="numpy")
    tokens, heads_t = mbs * s, 128 / tp
    norm_tokens = tokens / (tp if sp else 1)
    expected = (4 * (1536 + 512) * norm_tokens + 4 * 64 * (heads_t + 1) * tokens
                + 8 * heads_t * (128 + 64) * tokens)
    assert any(np.size(b) == 1 and float(b) == pytest.approx(expected, rel=1e-12) for b in seen)
    # and the multi-head approximation has no such term
    seen.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        M.solve(DSV3_MHA, catalog.fleet("GB200_NVL72_8_MC"), batch_size=1152, seq_len=s, tp_size=tp,
                pp_size=8, ep_size=8, micro_batch_size=mbs, sequence_parallel=sp, engine="numpy")
    assert not any(np.size(b) == 1 and float(b) == pytest.approx(expected, rel=1e-12) for b in seen)


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_mla_under_fp8_keeps_two_copies_of_the_norm_output_and_its_latents_in_one_byte(engine):
    """Under FP8 each of MLA's two down projections keeps its own one-byte copy of the
    layer's norm output (one more byte a token and h than GQA's fused norm and QKV), and
    the up projections keep the latents' norm outputs in one byte, not two. Against the
    multi-head approximation (whose FP8 saving is the rest of the layer's, the same), the
    activations FP8 adds are h - q_lora - kv_lora bytes a token, a layer, split by TP
    under SP."""
    if engine == "fused":
        pytest.importorskip("numba")
    fleet = catalog.fleet("GB200_NVL72_8_MC")
    mbs, s, tp = 2, 4096, 4
    kw = dict(batch_size=1152, seq_len=s, tp_size=tp, pp_size=1, ep_size=8,
              micro_batch_size=mbs, sequence_parallel=np.array([True, False]), engine=engine)

    def activations(workload, precision):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = M.solve(workload, fleet, precision=precision, **kw)
        return np.asarray(out["memory_activations"], dtype=float)

    added = ((activations(DSV3, "fp8") - activations(DSV3, "bf16"))
             - (activations(DSV3_MHA, "fp8") - activations(DSV3_MHA, "bf16")))
    per_layer = mbs * s * (7168 - 1536 - 512) / np.array([tp, 1.0])
    np.testing.assert_allclose(added, 61 * per_layer, rtol=1e-9)
