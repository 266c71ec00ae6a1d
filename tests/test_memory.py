"""Per-accelerator training memory (solver.memory): model state and ZeRO, activations, buffers.

Hand arithmetic with the constants of the papers: Adam keeps 12 B per trainable
parameter (FP32 master weights + 2 moments, ZeRO Sec. 3), Korthikanti et al.
keep 34 B (selective recomputation) or 2 B (full recomputation) per token per
hidden unit per layer at FP16.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from solver.memory import (
    ADAM_OPTIMIZER_BYTES,
    COMMUNICATION_BUFFER_FRACTION,
    LORA_RANK,
    activation_memory,
    lora_trainable_fraction,
    model_state,
    pipeline_buffer,
    stored_microbatch,
)

RTOL = 1e-12


def test_constants():
    assert ADAM_OPTIMIZER_BYTES == 12.0
    assert COMMUNICATION_BUFFER_FRACTION == 0.05
    assert LORA_RANK == 16


# ------------------------------------------------------------------ model state and ZeRO

# 1e9 parameters at 2 B, no model parallelism, dp = 8:
# weights 2e9 B, gradients 2e9 B, Adam 12e9 B; /8 = 2.5e8, 2.5e8, 1.5e9.
@pytest.mark.parametrize("stage, expected", [
    (0, (2e9, 2e9, 12e9)),
    (1, (2e9, 2e9, 1.5e9)),
    (2, (2e9, 2.5e8, 1.5e9)),
    (3, (2.5e8, 2.5e8, 1.5e9)),
])
def test_zero_stages_shard_the_right_terms(stage, expected):
    w, g, o = model_state(1e9, precision_bytes=2.0, model_parallel=1, dp_size=8, zero_stage=stage)
    np.testing.assert_allclose([w, g, o], expected, rtol=RTOL)


def test_zero_stage_array_broadcasts_against_dp():
    stage = np.array([0, 1, 2, 3]).reshape(4, 1)
    dp = np.array([1, 2, 16])
    w, g, o = model_state(1e9, precision_bytes=4.0, model_parallel=1, dp_size=dp, zero_stage=stage)
    assert w.shape == g.shape == o.shape == (4, 3)
    # 4 B: weights 4e9, gradients 4e9, Adam 12e9.
    full_w, full_g, full_o = 4e9, 4e9, 12e9
    np.testing.assert_allclose(w[:3], np.broadcast_to(full_w, (3, 3)), rtol=RTOL)
    np.testing.assert_allclose(w[3], full_w / dp, rtol=RTOL)
    np.testing.assert_allclose(g[:2], np.broadcast_to(full_g, (2, 3)), rtol=RTOL)
    np.testing.assert_allclose(g[2:], np.broadcast_to(full_g / dp, (2, 3)), rtol=RTOL)
    np.testing.assert_allclose(o[0], [full_o] * 3, rtol=RTOL)
    np.testing.assert_allclose(o[1:], np.broadcast_to(full_o / dp, (3, 3)), rtol=RTOL)


def test_dp_one_shards_nothing():
    for stage in range(4):
        w, g, o = model_state(7e9, precision_bytes=2.0, model_parallel=1, dp_size=1, zero_stage=stage)
        np.testing.assert_allclose([w, g, o], [14e9, 14e9, 84e9], rtol=RTOL)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_model_parallel_shards_everything(stage):
    # TP*PP*EP = 2*4*2 = 16: every term of the unsharded state divided by 16.
    base = model_state(1.6e10, precision_bytes=2.0, model_parallel=1, dp_size=4, zero_stage=stage)
    split = model_state(1.6e10, precision_bytes=2.0, model_parallel=16, dp_size=4, zero_stage=stage)
    for whole, part in zip(base, split):
        assert part == pytest.approx(whole / 16, rel=RTOL)
    # by hand at stage 0: 1e9 params per rank -> 2e9, 2e9, 12e9.
    if stage == 0:
        np.testing.assert_allclose(split, [2e9, 2e9, 12e9], rtol=RTOL)


def test_trainable_fraction_scales_gradients_and_optimizer_only():
    # 1e9 params, fraction 0.1 -> 1e8 trainable: weights 2e9, gradients 2e8, Adam 1.2e9.
    w, g, o = model_state(1e9, precision_bytes=2.0, model_parallel=1, dp_size=4, zero_stage=0,
                          trainable_fraction=0.1)
    np.testing.assert_allclose([w, g, o], [2e9, 2e8, 1.2e9], rtol=RTOL)
    # with ZeRO-3 over dp = 4 every term is also divided by 4.
    w, g, o = model_state(1e9, precision_bytes=2.0, model_parallel=1, dp_size=4, zero_stage=3,
                          trainable_fraction=0.1)
    np.testing.assert_allclose([w, g, o], [5e8, 5e7, 3e8], rtol=RTOL)


def test_trainable_fraction_array():
    frac = np.array([1.0, 0.5, 0.01])
    w, g, o = model_state(2e9, precision_bytes=1.0, model_parallel=2, dp_size=1, zero_stage=0,
                          trainable_fraction=frac)
    np.testing.assert_allclose(w, [1e9] * 3, rtol=RTOL)
    np.testing.assert_allclose(g, [1e9, 5e8, 1e7], rtol=RTOL)
    np.testing.assert_allclose(o, [12e9, 6e9, 1.2e8], rtol=RTOL)


def test_precision_bytes_scale_weights_and_gradients_not_adam():
    w, g, o = model_state(1e9, precision_bytes=np.array([0.5, 1.0, 2.0, 4.0]), model_parallel=1,
                          dp_size=1, zero_stage=0)
    np.testing.assert_allclose(w, [5e8, 1e9, 2e9, 4e9], rtol=RTOL)
    np.testing.assert_allclose(g, [5e8, 1e9, 2e9, 4e9], rtol=RTOL)
    np.testing.assert_allclose(o, [12e9] * 4, rtol=RTOL)


# ------------------------------------------------------------------ activations

# 10 layers, s = 2048, b = 4, h = 4096: tokens*h = 2048*4*4096 = 33,554,432.
_SBH = 2048 * 4 * 4096


def test_activation_selective_fp16():
    a = activation_memory(10, 2048, 4, 4096, precision_bytes=2.0, full_recomputation=False, tp_size=1)
    assert a == pytest.approx(10 * 34 * _SBH, rel=RTOL)  # 11,408,506,880 B
    assert a == pytest.approx(11_408_506_880, rel=RTOL)


def test_activation_full_recompute_fp16():
    a = activation_memory(10, 2048, 4, 4096, precision_bytes=2.0, full_recomputation=True, tp_size=1)
    assert a == pytest.approx(10 * 2 * _SBH, rel=RTOL)


@pytest.mark.parametrize("nbytes", [0.5, 1.0, 2.0, 4.0])
def test_activation_scales_with_bytes_over_two(nbytes):
    for full, per in ((False, 34), (True, 2)):
        a = activation_memory(10, 2048, 4, 4096, precision_bytes=nbytes,
                              full_recomputation=full, tp_size=1)
        assert a == pytest.approx(10 * per * _SBH * nbytes / 2, rel=RTOL)


@pytest.mark.parametrize("tp", [2, 4, 8, 3])
def test_activation_divided_by_tp(tp):
    a = activation_memory(10, 2048, 4, 4096, precision_bytes=2.0, full_recomputation=False, tp_size=tp)
    assert a == pytest.approx(10 * 34 * _SBH / tp, rel=RTOL)


def test_activation_broadcast_grid():
    layers = np.array([1, 10]).reshape(2, 1, 1, 1)
    full = np.array([False, True]).reshape(1, 2, 1, 1)
    tp = np.array([1, 2, 8]).reshape(1, 1, 3, 1)
    nbytes = np.array([1.0, 2.0, 4.0]).reshape(1, 1, 1, 3)
    a = activation_memory(layers, 1024, 2, 1024, precision_bytes=nbytes,
                          full_recomputation=full, tp_size=tp)
    assert a.shape == (2, 2, 3, 3)
    sbh = 1024 * 2 * 1024
    for i, L in enumerate([1, 10]):
        for j, per in enumerate([34, 2]):
            for k, t in enumerate([1, 2, 8]):
                for n, nb in enumerate([1.0, 2.0, 4.0]):
                    assert a[i, j, k, n] == pytest.approx(L * per * sbh * nb / 2 / t, rel=RTOL)


def test_activation_large_values_do_not_overflow():
    # 1e6 tokens per sample * 1e5 samples * 1e5 hidden overflows int64 if not float.
    a = activation_memory(1, 10**6, 10**5, 10**5, precision_bytes=2.0,
                          full_recomputation=True, tp_size=1)
    assert a == pytest.approx(2.0 * 1e16, rel=RTOL)


# ------------------------------------------------------------------ pipeline buffers


def test_pipeline_buffer_hand_value():
    # 2 * b * s * h * bytes = 2 * 4 * 2048 * 8192 * 2 = 268,435,456 B
    assert pipeline_buffer(2048, 4, 8192, precision_bytes=2.0, pp_size=2) == pytest.approx(268_435_456, rel=RTOL)


def test_pipeline_buffer_zero_without_pipeline():
    pp = np.array([1, 2, 8])
    b = pipeline_buffer(1024, 1, 1024, precision_bytes=np.array([[1.0], [4.0]]), pp_size=pp)
    assert b.shape == (2, 3)
    np.testing.assert_allclose(b, [[0.0, 2 * 1024 * 1024, 2 * 1024 * 1024],
                                   [0.0, 8 * 1024 * 1024, 8 * 1024 * 1024]], rtol=RTOL)


# ------------------------------------------------------------------ stored microbatch


@pytest.mark.parametrize("local, divisor, expected", [
    (10, 4, 3),   # ceil(2.5)
    (8, 4, 2),
    (1, 8, 1),
    (3, 5, 1),
    (0, 1, 1),    # at least one sample
    (1024, 1, 1024),
    (1025, 8, 129),
])
def test_stored_microbatch(local, divisor, expected):
    got = stored_microbatch(local, divisor)
    assert got == expected
    assert float(got).is_integer()


def test_stored_microbatch_broadcast():
    local = np.array([1, 7, 64]).reshape(3, 1)
    k = np.array([1, 2, 3, 100])
    got = stored_microbatch(local, k)
    expected = [[max(1, math.ceil(b / d)) for d in (1, 2, 3, 100)] for b in (1, 7, 64)]
    np.testing.assert_array_equal(got, expected)


# ------------------------------------------------------------------ LoRA fraction


def test_lora_trainable_fraction_hand_value():
    # 2 * 16 * 4096 * 4 * 32 = 16,777,216 of 1e9 parameters.
    assert lora_trainable_fraction(1e9, hidden_dim=4096, layers=32) == pytest.approx(0.016777216, rel=RTOL)
    # Llama-3 70B: 2 * 16 * 8192 * 4 * 80 = 83,886,080 of 7.06e10.
    assert lora_trainable_fraction(7.06e10, hidden_dim=8192, layers=80) == pytest.approx(
        83_886_080 / 7.06e10, rel=RTOL)


def test_lora_trainable_fraction_rank():
    assert lora_trainable_fraction(1e9, hidden_dim=4096, layers=32, rank=8) == pytest.approx(
        0.016777216 / 2, rel=RTOL)


def test_lora_trainable_fraction_capped_at_one():
    assert lora_trainable_fraction(1000.0, hidden_dim=4096, layers=32) == 1.0
    # exactly at the cap
    assert lora_trainable_fraction(16_777_216.0, hidden_dim=4096, layers=32) == 1.0
    assert lora_trainable_fraction(16_777_217.0, hidden_dim=4096, layers=32) < 1.0
