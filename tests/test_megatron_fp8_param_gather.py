"""fp8_param_gather in the megatron physics ([43] of solver.physics.megatron): under FP8 the
distributed optimizer's and FSDP's parameter all-gathers move a byte a transformer-layer
parameter, not two; the embedding and output matrices stay 16-bit; memory as without it.
Held against a closed form of the collective, Megatron-LM's rule, and random layouts of
every knob (the fused kernel prices it beside it, the same bits)."""

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from solver import catalog
from solver.physics import megatron as M

sys.path.insert(0, str(Path(__file__).parent))
from _megatron_steps import chain  # noqa: E402
from test_fused_megatron import _draw  # noqa: E402

FLEETS = ("HGX_H100_1K_MC", "GB200_NVL72_8_MC")
WORKLOADS = ("Llama3_8B_MC", "Llama3_70B_MC", "Mixtral_8x7B_MC", "DeepSeek_V3_MC")
MEMORY = ("memory_footprint", "memory_weights", "memory_gradients", "memory_optimizer_state",
          "memory_activations", "memory_communication_buffers", "feasible")


def _solve(workload, fleet, engine="numpy", **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return M.solve(catalog.workload(workload), catalog.fleet(fleet), engine=engine, **kw)


def test_megatron_lms_rule():
    """"--fp8-param-gather only supported with distributed optimizer, torch fsdp2, megatron
    fsdp, or inference mode", and FP8 parameters need FP8 GEMMs [43]."""
    wl, fl = catalog.workload("Llama3_70B_MC"), catalog.fleet("HGX_H100_1K_MC")
    kw = dict(batch_size=512, seq_len=8192, tp_size=4, pp_size=4, sequence_parallel=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert M.why_unrealizable(wl, fl, precision="fp8", zero_stage=1, fp8_param_gather=True,
                                  **kw) == {}
        for bad in (dict(precision="bf16", zero_stage=1), dict(precision="fp8", zero_stage=0)):
            assert sorted(M.why_unrealizable(wl, fl, fp8_param_gather=True, **bad, **kw)) == [
                "fp8_param_gather"], bad
            assert M.why_unrealizable(wl, fl, fp8_param_gather=False, **bad, **kw) == {}


def _dp(workload, fleet, **knobs):
    s = chain(workload, fleet, **knobs)
    return s.w, s.hw, s.dpr


# (workload, pp_size, mtp_num_layers, ep_size, embedding matrices on the heaviest stage)
CASES = [("Llama3_8B_MC", 1, 0, 1, 2),      # untied, one stage: both
         ("GPT3_175B_MC", 1, 0, 1, 1),      # tied: one
         ("Mixtral_8x7B_MC", 1, 0, 2, 2),   # experts over an expert DP group of 4
         ("DeepSeek_V3_MC", 2, 1, 2, 2)]    # the last stage: the output layer and MTP's copy


@pytest.mark.parametrize("workload,pp,mtp,ep,copies,zero",
                         # (FSDP runs without a pipeline: no_sharding_with_pipeline)
                         [(*case, zero) for case in CASES for zero in (1, 3)
                          if zero == 1 or case[1] == 1])
def test_closed_form_of_the_saved_bytes(workload, pp, mtp, ep, copies, zero):
    """DP 8 / pp in one HGX node (TP 1): the layers' parameters (the heaviest stage's, less
    its embedding matrices, counted from the model's shape) and the experts' go at one byte
    where they went at two, the embeddings at two still: the gathers shorten by
    (n - 1) / n of the layers' parameters over the bus bandwidth, the experts' over their
    group of 8 / ep (ZeRO-1: one gather a step; FSDP: two a layer and microbatch, so m x 2
    that, the calls' latency alike)."""
    n = 8 // pp
    kw = dict(batch_size=64, seq_len=4096, tp_size=1, pp_size=pp, dp_size=n, ep_size=ep,
              etp_size=1, precision="fp8", zero_stage=zero, mtp_num_layers=mtp)
    wl = catalog.workload(workload)
    w, hw, off = _dp(workload, "HGX_H100_1K_MC", **kw)
    *_, on = _dp(workload, "HGX_H100_1K_MC", fp8_param_gather=True, **kw)
    assert wl.vocab_size % 128 == 0  # no padding at TP 1
    layers = float(off.heavy_params) - copies * wl.vocab_size * wl.hidden_dim
    assert layers > 0.5 * float(off.heavy_params)
    experts = float(off.expert_stage_params)
    assert (experts > 0) == (ep > 1)
    group_e = n // ep
    saved = (n - 1) / n * layers / hw.up_bw + (
        (group_e - 1) / group_e * experts / hw.up_bw if experts else 0.0)
    m = 64 / n  # microbatches of one sequence
    np.testing.assert_allclose(float(off.t_dp_total) - float(on.t_dp_total),
                               saved * (2 * m if zero == 3 else 1), rtol=1e-9)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_fp8_parameters_never_slow_a_step_nor_move_its_memory(workload):
    """On random layouts of every knob under FP8 with the distributed optimizer or FSDP: the
    step and the exposed DP traffic never grow, and the memory outputs are the same bits (the
    FP8 weight and its transpose, two bytes as the 16-bit weight priced without it).
    Outside FP8 or without sharding only `realizable` moves."""
    rng = np.random.default_rng(430)
    for fleet in FLEETS:
        k = {**_draw(rng, 2000, dp_given=True), "precision": "fp8",
             "zero_stage": rng.choice([1, 2, 3], 2000)}
        off = _solve(workload, fleet, **k)
        on = _solve(workload, fleet, **{**k, "fp8_param_gather": True})
        ok = np.asarray(off["valid"])
        assert ok.sum() > 200
        for name in MEMORY:
            np.testing.assert_array_equal(np.asarray(on[name]), np.asarray(off[name]), err_msg=name)
        step_off, step_on = np.asarray(off["step_latency_total"]), np.asarray(on["step_latency_total"])
        assert np.all(step_on[ok] <= step_off[ok])
        assert np.all(np.asarray(on["dp_communication_latency"])[ok]
                      <= np.asarray(off["dp_communication_latency"])[ok])
        assert np.any(step_on[ok] < step_off[ok])
        k2 = {**k, "precision": rng.choice(["bf16", "fp16"], 2000), "zero_stage": rng.choice([0, 1, 3], 2000)}
        off2, on2 = _solve(workload, fleet, **k2), _solve(workload, fleet, **{**k2, "fp8_param_gather": True})
        for name in M.OUTPUTS:
            if name != "realizable":
                np.testing.assert_array_equal(np.asarray(on2[name]), np.asarray(off2[name]), err_msg=name)
        assert not np.asarray(on2["realizable"]).any()


@pytest.mark.parametrize("workload", ("Llama3_70B_MC", "Mixtral_8x7B_MC"))
def test_the_fused_kernel_prices_it_beside_it(workload):
    pytest.importorskip("numba")
    rng = np.random.default_rng(431)
    n = 3 * 4096
    k = {**_draw(rng, n, dp_given=True), "fp8_param_gather": rng.random(n) < 0.5}
    numpy_ = _solve(workload, "HGX_H100_1K_MC", **k)
    fused = _solve(workload, "HGX_H100_1K_MC", engine="fused", **k)
    for name in M.OUTPUTS:
        np.testing.assert_array_equal(np.asarray(fused[name]), np.asarray(numpy_[name]), err_msg=name)
    assert np.asarray(numpy_["valid"])[k["fp8_param_gather"]].sum() > 100
    # a scalar knob: its rows priced beside the kernel where they gather in FP8 only
    for flag in (True, False):
        one = {**k, "fp8_param_gather": flag}
        fused, numpy_ = (_solve(workload, "HGX_H100_1K_MC", engine=e, **one) for e in ("fused", "numpy"))
        for name in M.OUTPUTS:
            np.testing.assert_array_equal(np.asarray(fused[name]), np.asarray(numpy_[name]),
                                          err_msg=name)
