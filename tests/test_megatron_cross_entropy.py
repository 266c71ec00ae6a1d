"""The LM head's cross-entropy in the megatron physics ([44] of solver.physics.megatron):
Megatron-Core's unfused vocabulary-parallel one (FP32, 52 bytes through HBM a logit, an FP32
copy of the logits held), its "native" fusion (priced alike), and Transformer Engine's fused
one (cross_entropy_fusion_impl="te": 10 bytes a logit on the 16-bit logits, its gradient
written into them). Held against closed forms and random layouts of every knob."""

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from solver import catalog
from solver import gemm
from solver.physics import megatron as M
from solver.physics import megatron_steps as steps

sys.path.insert(0, str(Path(__file__).parent))
from test_fused_megatron import _draw  # noqa: E402

FLEETS = ("HGX_H100_1K_MC", "GB200_NVL72_8_MC")
WORKLOADS = ("Llama3_8B_MC", "Mixtral_8x7B_MC", "DeepSeek_V3_MC", "GPT3_175B_MC")


def _solve(workload, fleet, engine="numpy", **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return M.solve(catalog.workload(workload), catalog.fleet(fleet), engine=engine, **kw)


def test_the_knobs_are_megatron_cores():
    assert M.DEFAULTS["cross_entropy_loss_fusion"] is False
    assert M.DEFAULTS["cross_entropy_fusion_impl"] == "native"
    assert M.CHOICES["cross_entropy_fusion_impl"] == ("native", "te")
    with pytest.raises(ValueError, match="cross_entropy_fusion_impl must be one of 'native', 'te'"):
        _solve("Llama3_8B_MC", "HGX_H100_1K_MC", cross_entropy_fusion_impl="triton")


@pytest.mark.parametrize("workload,tp,mtp", [("Llama3_8B_MC", 1, 0), ("Llama3_70B_MC", 8, 0),
                                             ("DeepSeek_V3_MC", 8, 1)])
def test_tes_cross_entropy_in_closed_form(workload, tp, mtp):
    """One stage, m microbatches: TE's fused cross-entropy moves 52 - 10 bytes a logit less
    through HBM (at the memory-bound kernels' 0.9 of the bandwidth), each microbatch, once
    for the output layer and once for each MTP module's head, and the rank holds the 16-bit
    logits, not the FP32 ones: 2 bytes a logit less for the head and each MTP module (no
    recompute, so the logits are the last rank's peak beside its stored activations).
    The vocabulary is padded to 128 x TP [41]."""
    wl, fl = catalog.workload(workload), catalog.fleet("HGX_H100_1K_MC")
    kw = dict(batch_size=16, seq_len=4096, tp_size=tp, micro_batch_size=2, dp_size=1,
              sequence_parallel=tp > 1, mtp_num_layers=mtp, recompute="none",
              ep_size=8 if workload == "DeepSeek_V3_MC" else 1, etp_size=1 if mtp else None)
    kw = {name: value for name, value in kw.items() if value is not None}
    off = _solve(workload, "HGX_H100_1K_MC", **kw)
    on = _solve(workload, "HGX_H100_1K_MC", cross_entropy_loss_fusion=True,
                cross_entropy_fusion_impl="te", **kw)
    vocab_t = np.ceil(wl.vocab_size / (128 * tp)) * 128
    logits = 2 * 4096 * vocab_t  # a microbatch's logits on a TP rank
    hbm = fl.node.accelerator.memory_bandwidth * gemm.MEMORY_EFFICIENCY
    m = 16 / 2
    np.testing.assert_allclose(float(off["step_latency_total"]) - float(on["step_latency_total"]),
                               m * (1 + mtp) * (52 - 10) * logits / hbm, rtol=1e-9)
    np.testing.assert_allclose(float(off["memory_activations"]) - float(on["memory_activations"]),
                               (1 + mtp) * 2 * logits, rtol=1e-12)
    assert steps.CROSS_ENTROPY_BYTES == 52 and steps.TE_CROSS_ENTROPY_BYTES == 10


@pytest.mark.parametrize("cp", [1, 2])
@pytest.mark.parametrize("rc,rnl", [("none", 0), ("selective", 0), ("full", 0), ("full", 2)])
@pytest.mark.parametrize("v", [1, 2])
def test_tes_cross_entropy_on_a_pipeline(cp, rc, rnl, v):
    """Llama 3 8B on 4 even stages (8 layers each, the head on the last, which paces the
    pipeline), 32 microbatches: the step shortens by m times the head's saved bytes (at
    the rank's s / cp tokens), every recompute mode, partial recompute, interleaved or not;
    the bubble keeps its length (the slowest stage and the others' sum shorten alike).
    One stage, or two with the last one's layers the most: the last rank holds 2 bytes a
    logit less, every recompute mode (its logits outweigh a recomputed layer's working
    set)."""
    wl, fl = catalog.workload("Llama3_8B_MC"), catalog.fleet("HGX_H100_1K_MC")
    te = dict(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te")
    kw = dict(batch_size=32, seq_len=8192, tp_size=1, pp_size=4, cp_size=cp, dp_size=1,
              micro_batch_size=1, recompute=rc, recompute_num_layers=rnl, v_stages=v)
    off, on = _solve("Llama3_8B_MC", "HGX_H100_1K_MC", **kw), _solve("Llama3_8B_MC", "HGX_H100_1K_MC", **kw, **te)
    assert bool(off["realizable"])
    logits = 8192 / cp * wl.vocab_size  # 128,256: a multiple of 128
    hbm = fl.node.accelerator.memory_bandwidth * gemm.MEMORY_EFFICIENCY
    np.testing.assert_allclose(float(off["step_latency_total"]) - float(on["step_latency_total"]),
                               32 * (52 - 10) * logits / hbm, rtol=1e-9)
    assert float(on["pipeline_bubble_latency"]) == pytest.approx(
        float(off["pipeline_bubble_latency"]), rel=1e-12)
    # (two stages, the last one's 20 layers set, so that its rank keeps the peak)
    for held in ({**kw, "pp_size": 1, "v_stages": 1},
                 {**kw, "pp_size": 2, "v_stages": 1, "num_layers_in_last_pipeline_stage": 20}):
        off = _solve("Llama3_8B_MC", "HGX_H100_1K_MC", **held)
        on = _solve("Llama3_8B_MC", "HGX_H100_1K_MC", **held, **te)
        np.testing.assert_allclose(float(off["memory_activations"]) - float(on["memory_activations"]),
                                   2 * logits, rtol=1e-12)


@pytest.mark.parametrize("rc", ["none", "full"])
def test_tes_cross_entropy_on_set_stages(rc):
    """Llama 3 8B on 4 stages, the last one's layers set: with 5 (the middle stages' 9
    pace the pipeline) the step shortens by the head's saved time once, in the bubble (the
    stages' sum less the slowest); with 11 (the last paces) by 32 times it, per microbatch,
    the bubble the same."""
    wl, fl = catalog.workload("Llama3_8B_MC"), catalog.fleet("HGX_H100_1K_MC")
    te = dict(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te")
    saved = (52 - 10) * 8192 * wl.vocab_size / (fl.node.accelerator.memory_bandwidth
                                                 * gemm.MEMORY_EFFICIENCY)
    for last, step, bubble in ((5, 1, 1), (11, 32, 0)):
        kw = dict(batch_size=32, seq_len=8192, tp_size=1, pp_size=4, dp_size=1, micro_batch_size=1,
                  recompute=rc, num_layers_in_last_pipeline_stage=last)
        off = _solve("Llama3_8B_MC", "HGX_H100_1K_MC", **kw)
        on = _solve("Llama3_8B_MC", "HGX_H100_1K_MC", **kw, **te)
        assert bool(off["realizable"])
        for name, times in (("step_latency_total", step), ("pipeline_bubble_latency", bubble)):
            np.testing.assert_allclose(float(off[name]) - float(on[name]), times * saved,
                                       rtol=1e-9, atol=1e-12 * float(off[name]), err_msg=name)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_only_tes_fusion_moves_a_price(workload):
    """Random layouts of every knob: the unfused cross-entropy, the native fusion, and TE's
    named without the fusion on are one price, every output; TE's fused one never prices a
    step slower (but for rounding, where the head's time had hidden DP traffic: FSDP's on
    set stages) nor a footprint larger, and is faster somewhere."""
    rng = np.random.default_rng(440)
    for fleet in FLEETS:
        k = _draw(rng, 2000, dp_given=True)
        off = _solve(workload, fleet, **k)
        ok = np.asarray(off["valid"])
        assert ok.sum() > 200
        for kw in (dict(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="native"),
                   dict(cross_entropy_loss_fusion=False, cross_entropy_fusion_impl="te")):
            same = _solve(workload, fleet, **k, **kw)
            for name in M.OUTPUTS:
                np.testing.assert_array_equal(np.asarray(same[name]), np.asarray(off[name]), err_msg=name)
        on = _solve(workload, fleet, **k, cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te")
        step_off, step_on = np.asarray(off["step_latency_total"])[ok], np.asarray(on["step_latency_total"])[ok]
        # (equal where the head's time hid DP traffic that is then exposed: a last-bit tie)
        assert np.all(step_on <= step_off * (1 + 1e-12)) and np.any(step_on < step_off * (1 - 1e-6))
        assert np.all(np.asarray(on["memory_footprint"])[ok] <= np.asarray(off["memory_footprint"])[ok])


@pytest.mark.parametrize("workload", ("Llama3_70B_MC", "DeepSeek_V3_MC"))
def test_the_fused_kernel_prices_it_beside_it(workload):
    pytest.importorskip("numba")
    rng = np.random.default_rng(441)
    n = 3 * 4096
    k = {**_draw(rng, n, dp_given=True), "cross_entropy_loss_fusion": rng.random(n) < 0.5,
         "cross_entropy_fusion_impl": rng.choice(["native", "te"], n)}
    numpy_ = _solve(workload, "HGX_H100_1K_MC", **k)
    for impl in (k["cross_entropy_fusion_impl"], list(k["cross_entropy_fusion_impl"])):
        fused = _solve(workload, "HGX_H100_1K_MC", engine="fused", **{**k, "cross_entropy_fusion_impl": impl})
        for name in M.OUTPUTS:
            np.testing.assert_array_equal(np.asarray(fused[name]), np.asarray(numpy_[name]), err_msg=name)
