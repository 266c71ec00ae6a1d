"""recompute_method="uniform" in the megatron physics ([40] of solver.physics.megatron):
Megatron-Core's full recompute of every layer in checkpoints of recompute_num_layers layers.
Held against the closed form of the activations the first pipeline rank holds (one input a
checkpoint a microbatch in flight, and one checkpoint's layers as without recompute in its
backward), against full recompute's time and FLOPs (the same bits), against the block
method it leaves alone, and on random layouts (the fused kernel prices it beside it, the
same bits)."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from solver.physics import megatron as M

sys.path.insert(0, str(Path(__file__).parent))
from _megatron_steps import engines_agree, solve, why  # noqa: E402
from test_fused_megatron import _draw  # noqa: E402

HGX = "HGX_H100_1K_MC"
# GPT-3 175B on two stages of 48 layers, TP 8 with SP, no dropout (no masks): the first rank
# holds two microbatches in flight and no logits, and the most activations
KW = dict(batch_size=64, seq_len=4096, tp_size=8, pp_size=2, dp_size=4, sequence_parallel=True,
          hidden_dropout=0.0, attention_dropout=0.0)
MEMORY = ("memory_activations", "memory_footprint")


def _solve(workload="GPT3_175B_MC", fleet=HGX, engine="numpy", **kw):
    return solve(workload, fleet, engine, **kw)


def _why(workload="GPT3_175B_MC", fleet=HGX, **kw):
    return why(workload, fleet, **kw)


def test_closed_form_of_the_first_ranks_activations():
    """Without recompute the first rank holds 96 layer-microbatches of W bytes; under full
    recompute 96 layer inputs of F and one layer's W - F in its backward. With checkpoints
    of n layers (n dividing the stage's 48): 48 / n inputs a microbatch, and n layers' W
    less the input in the backward. The fewest at a few layers a checkpoint: fewer than at
    1 and at 48. An n that does not divide 48 is not realizable (Megatron-Core's last
    checkpoint would index past the chunk), priced as a shorter last checkpoint."""
    none = float(_solve(**KW, recompute="none")["memory_activations"])
    full = float(_solve(**KW, recompute="full")["memory_activations"])
    w = none / 96
    f = (full - w) / 95
    assert 0 < 10 * f < w  # (an input is a small share of what a layer stores)
    held = {}
    for n in (1, 2, 3, 4, 5, 16, 48, 64):
        kw = dict(KW, recompute="full", recompute_method="uniform", recompute_num_layers=n)
        out = _solve(**kw)
        assert bool(out["realizable"]) == (48 % n == 0), n
        if 48 % n:
            assert _why(**kw) == ["recompute_uniform"]
        held[n] = float(out["memory_activations"])
        assert held[n] == pytest.approx(2 * math.ceil(48 / n) * f + min(n, 48) * w - f,
                                        rel=1e-12), n
    assert held[1] == full and held[64] == held[48]
    assert min(held, key=held.get) not in (1, 48)


def test_interleaved_chunks_and_the_embeddings_mask():
    """Two stages of two chunks of 24 layers, hidden dropout on: the first rank holds 2.5
    microbatches in flight (Megatron's interleaved warm-up, (p v + p - 1) / v chunks at 16
    microbatches), each its chunks' checkpoint inputs, 2 x 24 / n of F, and the embedding
    dropout's one-byte mask of its tokens over TP, M; its backward one checkpoint's n
    layers. W and F from no recompute and from full recompute of single layers."""
    kw = dict(KW, v_stages=2, hidden_dropout=0.1)
    m = 4096 * 12288 / 8  # the embedding's dropout mask: a byte an element, SP slice
    none = float(_solve(**kw, recompute="none")["memory_activations"])
    full = float(_solve(**kw, recompute="full")["memory_activations"])
    w = none / 2.5 / 48 - m / 48
    f = (full - w - 2.5 * m) / (2.5 * 48 - 1)
    assert 0 < 10 * f < w
    for n in (2, 3, 4, 6, 8, 12, 24):
        out = _solve(**kw, recompute="full", recompute_method="uniform", recompute_num_layers=n)
        assert bool(out["realizable"]), n
        assert float(out["memory_activations"]) == pytest.approx(
            2.5 * (2 * 24 / n * f + m) + n * w - f, rel=1e-12), n
    assert not bool(_solve(**kw, recompute="full", recompute_method="uniform",
                           recompute_num_layers=16)["realizable"])  # (16 divides 48, not 24)


def test_megatron_refuses_the_method_where_it_cannot_run_it():
    """Megatron-LM refuses a recompute method under selective recompute and beside the
    combined 1F1B schedule, and the uniform method's checkpoints of more than one layer
    beside MTP layers; under no recompute without that schedule it does nothing."""
    base = dict(KW, recompute_method="uniform")
    assert _why(**base, recompute="selective") == ["recompute_method"]
    assert _why(**base, recompute="none") == []
    moe = dict(batch_size=512, seq_len=4096, tp_size=1, pp_size=1, ep_size=8, dp_size=64,
               overlap_moe_expert_parallel_comm=True, recompute_method="uniform")
    assert _why("Mixtral_8x7B_MC", **moe) == ["recompute_method"]
    assert _why("Mixtral_8x7B_MC", **dict(moe, recompute_method="block")) == []
    mtp = dict(KW, recompute="full", recompute_method="uniform", mtp_num_layers=1)
    assert _why(**mtp, recompute_num_layers=2) == ["recompute_uniform"]
    assert _why(**mtp, recompute_num_layers=1) == []


def test_time_and_flops_are_full_recomputes():
    """Every layer is recomputed whatever the checkpoints' size: every output but the memory
    ones is full recompute's, bit for bit; outside full recompute the method prices nothing
    (under selective recompute it breaks its rule: realizable apart); the block method is as
    it was."""
    base = _solve(**KW, recompute="full")
    for n in (0, 1, 4, 48):
        out = _solve(**KW, recompute="full", recompute_method="uniform", recompute_num_layers=n)
        for name in M.OUTPUTS:
            if name not in MEMORY or n <= 1:
                assert np.array_equal(np.asarray(out[name]), np.asarray(base[name]),
                                      equal_nan=True), (n, name)
    for r in ("none", "selective"):
        a = _solve(**KW, recompute=r)
        b = _solve(**KW, recompute=r, recompute_method="uniform")
        for name in M.OUTPUTS:
            if name != "realizable":
                assert np.array_equal(np.asarray(a[name]), np.asarray(b[name]),
                                      equal_nan=True), name
        assert bool(b["realizable"]) == (r == "none")
    a = _solve(**KW, recompute="full", recompute_num_layers=4)
    b = _solve(**KW, recompute="full", recompute_num_layers=4, recompute_method="block")
    for name in M.OUTPUTS:
        assert np.array_equal(np.asarray(a[name]), np.asarray(b[name]), equal_nan=True), name
    assert float(a["step_latency_total"]) < float(base["step_latency_total"])
    with pytest.raises(ValueError, match="recompute_method must be one of 'block', 'uniform'"):
        _solve(**KW, recompute="full", recompute_method="selective")


def test_a_rank_of_both_kinds_holds_the_heavier_kinds_layers():
    """DeepSeek-V3 (3 dense layers, then MoE) on 4 stages with the first set to 16 layers:
    the first rank holds both kinds, and a checkpoint's backward holds n layers of the
    heavier kind's (less the input), bounded by the rank's layers: more activations with
    larger checkpoints there, as everywhere the working set outgrows the inputs saved."""
    kw = dict(batch_size=64, seq_len=4096, tp_size=8, pp_size=4, dp_size=2, ep_size=8,
              etp_size=1, sequence_parallel=True, recompute="full", recompute_method="uniform",
              num_layers_in_first_pipeline_stage=16, hidden_dropout=0.0, attention_dropout=0.0)
    held = [float(_solve("DeepSeek_V3_MC", **kw, recompute_num_layers=n)["memory_activations"])
            for n in (4, 8, 16)]
    assert held[0] < held[1] < held[2]


@pytest.mark.parametrize("workload", ["GPT3_175B_MC", "Mixtral_8x7B_MC"])
def test_the_fused_kernel_prices_it_beside_it(workload):
    pytest.importorskip("numba")
    rng = np.random.default_rng(490)
    n = 3 * 4096
    k = {**_draw(rng, n, dp_given=True),
         "recompute_method": rng.choice(["block", "uniform"], n),
         "recompute_num_layers": rng.choice([0, 0, 1, 2, 3, 7, 100], n)}
    numpy_ = engines_agree(workload, HGX, **k)
    grouped = ((np.asarray(k["recompute"]) == "full") & (k["recompute_method"] == "uniform")
               & (k["recompute_num_layers"] > 1))
    assert (np.asarray(numpy_["valid"]) & grouped).sum() > 200
