"""The last pipeline rank's activations (megatron_compose.memory): its microbatches in flight
and the FP32 logits of its one microbatch, against the first rank's, on both engines, and
the microbatches in flight against Megatron-Core's warm-up counts."""

import warnings

import numpy as np
import pytest

from solver import catalog
from solver import megatron_memory as mem
from solver.physics import megatron as M

FLEET = catalog.fleet("HGX_H100_1K_MC")
L8 = catalog.workload("Llama3_8B_MC")


def _solve(workload, engine="numpy", **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return M.solve(workload, FLEET, engine=engine, **kw)


def _f(out, name):
    return float(np.asarray(out[name]))


def _layer_params(w):
    """A dense GQA layer's weights, closed form: Q, K, V and output projections, the gated
    MLP's three matrices, two norms."""
    h, d = w.hidden_dim, w.hidden_dim // w.heads
    return (h * d * (w.heads + 2 * w.kv_heads) + w.heads * d * h
            + (3 if w.gated_mlp else 2) * h * w.ffn_hidden_dim + 2 * h)


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_the_last_rank_holds_the_logits_of_its_one_microbatch(engine):
    """Llama 3 8B on 16 stages of 2 layers, full recompute, TP 1, 8,192 tokens: the first
    rank keeps 16 microbatches of its 2 layers' inputs (2 s h bytes each: 2.1 GB), the last
    one microbatch's and its FP32 logits (4 s V bytes: 4.2 GB), so the last counts. The
    weights are 2 layers and one embedding-sized matrix (the first rank's input embedding,
    the last's output layer: untied, the same size)."""
    if engine == "fused":
        pytest.importorskip("numba")
    s, h, vocab = 8192, L8.hidden_dim, L8.vocab_size
    kw = dict(batch_size=64, seq_len=s, tp_size=1, dp_size=1, micro_batch_size=1,
              recompute="full", zero_stage=0, precision="bf16")
    out = _solve(L8, engine, pp_size=16, **kw)
    assert bool(out["realizable"])
    last = 2 * 2.0 * s * h + 4.0 * s * vocab
    first = 16 * 2 * 2.0 * s * h
    assert first < last
    assert _f(out, "memory_activations") == pytest.approx(last, rel=1e-12)
    assert _f(out, "memory_weights") == pytest.approx(
        mem.WEIGHT_BYTES * (2 * _layer_params(L8) + vocab * h), rel=1e-12)
    # 4 stages of 8 layers and 2 of 16: the first rank's 32 layer inputs (2.1 GB) against
    # the last rank's 8 or 16 and the logits (4.8 and 5.3 GB)
    for pp, layers in ((4, 8), (2, 16)):
        o = _solve(L8, engine, pp_size=pp, **kw)
        want = max(pp * layers * 2.0 * s * h, layers * 2.0 * s * h + 4.0 * s * vocab)
        assert _f(o, "memory_activations") == pytest.approx(want, rel=1e-12), pp
    # one stage: the whole model's inputs and the logits, as before
    one = _solve(L8, engine, pp_size=1, **kw)
    assert _f(one, "memory_activations") == pytest.approx(32 * 2.0 * s * h + 4.0 * s * vocab, rel=1e-12)


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
    per_layer = (_f(one, "memory_activations") - 4.0 * 8192 * L8.vocab_size) / 32
    assert _f(none, "memory_activations") == pytest.approx(16 * 2 * per_layer, rel=1e-12)


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
                    assert mem.in_flight_layers(v, p, v, m, r) == min(warm + 1, m * v), (p, v, m, r)
                    checked += 1
    assert checked == 4 * 3 * sum(range(2, 9))
