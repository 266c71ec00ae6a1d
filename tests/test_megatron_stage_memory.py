"""Memory of each pipeline rank (megatron_compose.memory, megatron_steps.pipeline_ranks): every
rank its own layers, embedding or output layer, and microbatches in flight; the largest
footprint counts. Checked against closed forms on both engines, against Megatron-Core's
warm-up counts, and against every rank of random layouts priced one by one."""

import dataclasses
import types
import warnings

import numpy as np
import pytest

from solver import catalog
from solver import megatron_memory as mem
from solver.physics import megatron as M
from solver.physics import megatron_compose, megatron_steps

FLEET = catalog.fleet("HGX_H100_1K_MC")
L8 = catalog.workload("Llama3_8B_MC")
L70 = catalog.workload("Llama3_70B_MC")
DSV3 = catalog.workload("DeepSeek_V3_MC")


def _solve(workload, engine="numpy", **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return M.solve(workload, FLEET, engine=engine, **kw)


def _f(out, name):
    return float(np.asarray(out[name]))


def _layer_params(w):
    """A dense GQA layer's weights, closed form: Q, K, V and output projections, the MLP's
    matrices (3, gated), two norms."""
    h, d = w.hidden_dim, w.hidden_dim // w.heads
    return (h * d * (w.heads + 2 * w.kv_heads) + w.heads * d * h
            + (3 if w.gated_mlp else 2) * h * w.ffn_hidden_dim + 2 * h)


def _rank_layer_params(w, tp):
    """A TP rank's share of :func:`_layer_params`: the projections and the MLP over TP, the
    two norms whole (Transformer Engine keeps a norm's weight on every TP rank)."""
    return (_layer_params(w) - 2 * w.hidden_dim) / tp + 2 * w.hidden_dim


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_the_last_rank_holds_the_logits_of_its_one_microbatch(engine):
    """Llama 3 8B on 16 stages of 2 layers, full recompute, TP 1, 8,192 tokens: the first
    rank keeps 16 microbatches of its 2 layers' inputs (2 s h bytes each: 2.1 GB), the last
    one microbatch's and its FP32 logits (4 s V bytes: 4.2 GB) beside the final norm's and
    the output layer's 16-bit inputs (4 s h bytes), so the last counts. The
    weights are 2 layers and one embedding-sized matrix (the first rank's input embedding,
    the last's output layer: untied, the same size)."""
    if engine == "fused":
        pytest.importorskip("numba")
    s, h, vocab = 8192, L8.hidden_dim, L8.vocab_size
    kw = dict(batch_size=64, seq_len=s, tp_size=1, dp_size=1, micro_batch_size=1,
              recompute="full", zero_stage=0, precision="bf16")
    out = _solve(L8, engine, pp_size=16, **kw)
    assert bool(out["realizable"])
    head = 4.0 * s * vocab + 4.0 * s * h  # the logits and the head's two inputs
    last = 2 * 2.0 * s * h + head
    first = 16 * 2 * 2.0 * s * h
    assert first < last
    assert _f(out, "memory_activations") == pytest.approx(last, rel=1e-12)
    assert _f(out, "memory_weights") == pytest.approx(
        mem.WEIGHT_BYTES * (2 * _layer_params(L8) + vocab * h), rel=1e-12)
    # 4 stages of 8 layers and 2 of 16: the first rank's 32 layer inputs (2.1 GB) against
    # the last rank's 8 or 16 and the logits (4.8 and 5.3 GB)
    for pp, layers in ((4, 8), (2, 16)):
        o = _solve(L8, engine, pp_size=pp, **kw)
        # (the first rank's microbatches each hold the embedding dropout's mask too, s h)
        want = max(pp * (layers * 2.0 * s * h + s * h), layers * 2.0 * s * h + head)
        assert _f(o, "memory_activations") == pytest.approx(want, rel=1e-12), pp
    # one stage: the whole model's inputs and the logits, as before
    one = _solve(L8, engine, pp_size=1, **kw)
    assert _f(one, "memory_activations") == pytest.approx(32 * 2.0 * s * h + s * h + head, rel=1e-12)
    # TP 2 under SP: the layers' inputs and the head's two inputs are each rank's sequence
    # slice, the logits its half of the vocabulary (128,256 is a multiple of 256: unpadded)
    sp = _solve(L8, engine, pp_size=16, **{**kw, "tp_size": 2, "dp_size": 1},
                sequence_parallel=True)
    assert _f(sp, "memory_activations") == pytest.approx(
        2 * 2.0 * s * h / 2 + 4.0 * s * vocab / 2 + 4.0 * s * h / 2, rel=1e-12)


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_without_recompute_the_first_rank_still_counts(engine):
    """The same layout without recomputation keeps about 34 s h bytes a layer [1]: the first
    rank's 16 x 2 layers outweigh the last rank's 2 and its logits, and the activations are
    those the model priced before the last rank was counted (16 x 2 layers')."""
    if engine == "fused":
        pytest.importorskip("numba")
    kw = dict(batch_size=64, seq_len=8192, tp_size=1, dp_size=1, micro_batch_size=1,
              zero_stage=0, precision="bf16")
    none = _solve(L8, engine, pp_size=16, recompute="none", **kw)
    one = _solve(L8, engine, pp_size=1, recompute="none", **kw)
    head = 4.0 * 8192 * L8.vocab_size + 4.0 * 8192 * L8.hidden_dim  # logits, the head's inputs
    mask = 8192.0 * L8.hidden_dim  # the embedding dropout's, a byte an element a microbatch
    per_layer = (_f(one, "memory_activations") - head - mask) / 32
    assert _f(none, "memory_activations") == pytest.approx(16 * (2 * per_layer + mask), rel=1e-12)


@pytest.mark.parametrize("engine", ["numpy", "fused"])
@pytest.mark.parametrize("v, m, first_rank, second_rank", [
    (1, 16, 8 * 8, 10 * 7),        # 1F1B: rank r holds min(p - r, m) microbatches [4]
    (2, 16, 4 * 23, 5 * 21),       # interleaved: min(p v + p - 1 - 2 r, m v) chunks of n / v
])
def test_a_lighter_first_stage_moves_the_peak_to_rank_1(engine, v, m, first_rank, second_rank):
    """Llama 3 70B on 8 stages, no recompute: the even split keeps 10 layers x 8 microbatches
    on rank 0. Setting 8, 10 x 6, 12 [13] leaves rank 0 with 8 x 8 and rank 1 with 10 x 7
    (interleaved, v = 2: 4 x 23 and 5 x 21 chunk-layers against the even split's 5 x 23),
    so rank 1 counts: its activations are a whole number of the even split's layer's, and
    its weights are 10 layers, no embedding."""
    if engine == "fused":
        pytest.importorskip("numba")
    tp = 8
    kw = dict(batch_size=m, seq_len=4096, tp_size=tp, pp_size=8, dp_size=1, micro_batch_size=1,
              sequence_parallel=True, recompute="none", zero_stage=0, v_stages=v)
    even = _solve(L70, engine, **kw)
    set_ = _solve(L70, engine, num_layers_in_first_pipeline_stage=8,
                  num_layers_in_last_pipeline_stage=12, **kw)
    assert bool(even["realizable"]) and bool(set_["realizable"])
    even_rank0 = 10 * 8 if v == 1 else 5 * 23
    assert second_rank > first_rank
    # the even split's rank 0 also holds the embedding dropout's mask (its SP slice, a byte
    # an element) for each microbatch in flight: 8, or interleaved 23 chunks over 2
    mask = 4096.0 * L70.hidden_dim / tp * (8 if v == 1 else 23 / 2)
    assert _f(set_, "memory_activations") == pytest.approx(
        (_f(even, "memory_activations") - mask) * second_rank / even_rank0, rel=1e-12)
    assert _f(set_, "memory_weights") == pytest.approx(
        mem.WEIGHT_BYTES * 10 * _rank_layer_params(L70, tp), rel=1e-12)
    assert _f(set_, "memory_footprint") < _f(even, "memory_footprint")
    # the even split's rank 0: 10 layers and the input embedding, its 128,256 entries padded
    # to 129,024 (a multiple of 128 x TP [41])
    assert _f(even, "memory_weights") == pytest.approx(
        mem.WEIGHT_BYTES * (10 * _rank_layer_params(L70, tp) + 129_024 * L70.hidden_dim / tp),
        rel=1e-12)


def test_in_flight_microbatches_are_megatron_cores_warm_up_plus_one():
    """[4] of megatron_memory: rank r warms up with p - r - 1 microbatches (1F1B) or
    2 (p - r - 1) + (v - 1) p chunks (interleaved), at most all m v of them, and holds one
    more at its peak; a chunk holds layers / v of the stage's layers (one layer here)."""
    checked = 0
    for p in range(2, 9):
        for v in range(1, 5):
            for m in (p, 2 * p, 4 * p):
                for r in range(p):
                    warm = p - r - 1 if v == 1 else 2 * (p - r - 1) + (v - 1) * p
                    want = min(warm + 1, m * v)
                    assert mem.in_flight_layers(v, p, v, m, r) == want, (p, v, m, r)
                    checked += 1
    assert checked == 4 * 3 * sum(range(2, 9))


def _ranks(w, pp, v=1, first=0, last=0):
    shape = M._Shape(w)
    sp = types.SimpleNamespace(pp=np.asarray(pp), v=np.asarray(v), first=np.asarray(first),
                               last=np.asarray(last))
    return [(float(r), float(n), float(d), float(f), float(la))
            for r, n, d, f, la in megatron_steps.pipeline_ranks(shape, sp)]


def test_dense_layers_of_each_rank_follow_megatron_cores_layer_order():
    """Stage r holds its layers in v chunks, chunk j after j whole rounds of all ranks'
    chunks [13]. 64 layers, 10 dense, 4 stages: v = 1 puts all 10 on rank 0 (16 layers);
    v = 2 (chunks of 8) puts 8 on rank 0's first chunk and 2 on rank 1's. The ranks priced:
    0, 1, the one whose first chunk holds the first MoE layer and the next, the last."""
    w = dataclasses.replace(DSV3, layers=64, dense_layers=10)
    assert _ranks(w, 4, 1) == [(0, 16, 10, 1, 0), (1, 16, 0, 0, 0), (0, 16, 10, 1, 0),
                               (1, 16, 0, 0, 0), (3, 16, 0, 0, 1)]
    assert _ranks(w, 4, 2) == [(0, 16, 8, 1, 0), (1, 16, 2, 0, 0), (1, 16, 2, 0, 0),
                               (2, 16, 0, 0, 0), (3, 16, 0, 0, 1)]
    # DeepSeek-V3 on 6 stages as 1, 12 x 4, 12: its 3 dense layers on ranks 0 (1) and 1 (2)
    assert _ranks(DSV3, 6, 1, 1, 12) == [(0, 1, 1, 1, 0), (1, 12, 2, 0, 0), (1, 12, 2, 0, 0),
                                         (2, 12, 0, 0, 0), (5, 12, 0, 0, 1)]
    # a dense model: every layer dense; rank 1 only behind a set first stage (else it holds
    # rank 0's layers without the embedding and fewer microbatches in flight)
    assert _ranks(L70, 8, 2) == [(0, 10, 10, 1, 0), (7, 10, 10, 0, 1)]
    assert _ranks(L70, 8, 1, 3, 0) == [(0, 3, 3, 1, 0), (1, 11, 11, 0, 0), (7, 11, 11, 0, 1)]


def _every_rank(w, sp):
    """Every rank (up to the largest pp; a smaller pp's last rank repeated), its dense layers
    counted chunk by chunk."""
    pp, v = np.asarray(sp.pp) * 1.0, np.asarray(sp.v) * 1.0
    uneven, n_first, n_mid, n_last = megatron_steps.stage_layers(w, pp, sp.first, sp.last)
    n_even = np.ceil(w.layers / pp)
    nf, nm, nl = (np.where(uneven, n, n_even) for n in (n_first, n_mid, n_last))
    held = nf + (pp - 2.0) * nm + nl
    for r in range(int(pp.max())):
        r = np.minimum(float(r), pp - 1.0)
        is_first, is_last = r == 0, r == pp - 1
        n = np.where(is_first, nf, np.where(is_last, nl, nm))
        start = np.where(is_first, 0.0, np.where(is_last, held - nl, nf + (r - 1.0) * nm))
        dense = np.zeros_like(n)
        for j in range(int(v.max())):
            chunk0 = (j * held + start) / v
            layers_before = np.clip(w.dense_layers - chunk0, 0.0, n / v)
            dense = dense + np.where(j < v, layers_before, 0.0)
        if not w.moe:
            dense = n
        yield r, n, dense, is_first * 1.0, is_last * 1.0


@pytest.mark.parametrize("dense_layers", [0, 1, 3, 10])
def test_the_ranks_priced_hold_the_largest_footprint_of_every_rank(monkeypatch, dense_layers):
    """Random layouts (seeded) of DeepSeek-V3 shapes, set stages and interleaving among
    them: the footprint of the five ranks priced equals the largest over every rank,
    priced one by one with its dense layers counted chunk by chunk."""
    w = dataclasses.replace(DSV3, dense_layers=dense_layers)
    rng = np.random.default_rng(1405 + dense_layers)
    n = 6000
    kw = dict(batch_size=rng.choice([64, 128, 256], n), seq_len=rng.choice([2048, 4096], n),
              tp_size=rng.choice([1, 2, 4, 8], n), pp_size=rng.choice([2, 3, 4, 8, 16], n),
              ep_size=rng.choice([1, 8, 32, 64], n), micro_batch_size=rng.choice([1, 2], n),
              v_stages=rng.choice([1, 1, 2, 3], n), recompute=rng.choice(["none", "selective", "full"], n),
              zero_stage=rng.choice([0, 1], n), sequence_parallel=True,
              num_layers_in_first_pipeline_stage=rng.choice([0, 1, 2, 3, 4, 5, 6], n),
              num_layers_in_last_pipeline_stage=rng.choice([0, 1, 2, 4, 5, 7, 8, 13], n),
              mtp_num_layers=rng.choice([0, 1], n))
    got = _solve(w, **kw)
    monkeypatch.setattr(megatron_compose, "pipeline_ranks", _every_rank)
    want = _solve(w, **kw)
    ok = np.asarray(got["valid"]) & np.asarray(got["realizable"])
    assert ok.sum() > 300
    np.testing.assert_array_equal(np.asarray(got["memory_footprint"])[ok],
                                  np.asarray(want["memory_footprint"])[ok])
