"""The precision-aware optimizer in the megatron physics ([45] of solver.physics.megatron):
Megatron-Core's use_precision_aware_optimizer with main_params_dtype, exp_avg_dtype,
exp_avg_sq_dtype and store_param_remainders. Held against closed forms of the optimizer
state and of the step's bytes, Megatron-Core's rule, the knobs' limits, and random layouts
of every knob (the fused kernel prices it beside it, the same bits)."""

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from solver import catalog
from solver.physics import megatron as M

sys.path.insert(0, str(Path(__file__).parent))
from _megatron_steps import solve  # noqa: E402
from test_fused_megatron import _draw  # noqa: E402

FLEETS = ("HGX_H100_1K_MC", "GB200_NVL72_8_MC")
WORKLOADS = ("Llama3_70B_MC", "Mixtral_8x7B_MC", "DeepSeek_V3_MC")
#: What the optimizer changes: its state, its step, and what they sum into.
MOVES = ("memory_footprint", "memory_optimizer_state", "feasible", "optimizer_latency",
         "step_latency_total", "effective_throughput", "tokens_per_second_per_accelerator",
         "model_flops_per_accelerator", "mfu", "hfu")
PA = "use_precision_aware_optimizer"
PARTS = ("memory_weights", "memory_gradients", "memory_activations",
         "memory_communication_buffers")


def _solve(workload, fleet, engine="numpy", **kw):
    return solve(workload, fleet, engine, **kw)


def test_megatron_cores_rule():
    """"--use-precision-aware-optimizer only supported with distributed optimizer" [45]:
    ZeRO-1 and FSDP run it, plain DDP does not; and "main_params_dtype can only be fp32 when
    not using precision-aware optimizer", the moments' likewise."""
    wl, fl = catalog.workload("Llama3_8B_MC"), catalog.fleet("HGX_H100_1K_MC")
    kw = dict(batch_size=64, seq_len=4096, tp_size=1, pp_size=1, dp_size=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for zero in (1, 3):
            assert M.why_unrealizable(wl, fl, zero_stage=zero, **{PA: True}, **kw) == {}
        assert sorted(M.why_unrealizable(wl, fl, zero_stage=0, **{PA: True}, **kw)) == [
            "precision_aware_optimizer"]
        for dtype in (dict(exp_avg_dtype="fp8"), dict(main_params_dtype="fp16"),
                      dict(exp_avg_sq_dtype="bf16")):
            assert sorted(M.why_unrealizable(wl, fl, zero_stage=1, **dtype, **kw)) == [
                "optimizer_dtypes"], dtype
            assert M.why_unrealizable(wl, fl, zero_stage=1, **{PA: True}, **dtype, **kw) == {}
        assert M.why_unrealizable(wl, fl, zero_stage=1, store_param_remainders=False, **kw) == {}


def test_bad_dtypes_are_refused_by_name():
    wl, fl = catalog.workload("Llama3_8B_MC"), catalog.fleet("HGX_H100_1K_MC")
    for name, bad in (("main_params_dtype", "bf16"), ("exp_avg_dtype", "fp4"),
                      ("exp_avg_sq_dtype", "int8")):
        with pytest.raises(ValueError, match=f"{name} must be one of"):
            M.solve(wl, fl, **{PA: True, name: bad})


# (precision, main_params_dtype, exp_avg_dtype, exp_avg_sq_dtype, store_param_remainders,
#  grad_reduce_in_bf16) -> (state and the step's FP32 copies, step bytes) a parameter [45]
CASES = [
    # BF16 weights, FP32 master as 16-bit remainders (Megatron-Core's default): 2 + 4 + 4;
    # the step reads the FP32 gradient (4), the BF16 weight and its remainder in and out
    # (8), the moments in and out (2 x 8)
    (("bf16", "fp32", "fp32", "fp32", True, False), (10.0, 28.0)),
    # without remainders: Adam's own 12 and 30 (the master in and out, the weight written)
    (("bf16", "fp32", "fp32", "fp32", False, False), (12.0, 30.0)),
    # DeepSeek-V3's BF16 moments, updated in place: 2 + 2 + 2; 4 + 8 + 2 x 4
    (("bf16", "fp32", "bf16", "bf16", True, False), (6.0, 20.0)),
    # one BF16 moment beside an FP32 one goes through an FP32 copy: 2 + 2 + 4, and 4 held
    # in the step; 4 + 8 + 20 + 8
    (("bf16", "fp32", "bf16", "fp32", True, False), (12.0, 40.0)),
    # FP16 master, FP8 moments: 2 + 1 + 1, and three FP32 copies, 12; 4 + (40 + 2) + 2 x 22
    (("bf16", "fp16", "fp8", "fp8", True, False), (16.0, 90.0)),
    # BF16 gradients, read as they are (no FP32 copy; Adam's: 12 + 4): 2 + 2 + 4 and the
    # FP16 moment's copy, 4; 2 + 8 + 40 + 8
    (("bf16", "fp32", "fp16", "fp32", True, True), (12.0, 58.0)),
    # FP16 weights: no remainders (BF16 only); FP16 gradients read as they are
    (("fp16", "fp32", "fp32", "fp32", True, False), (12.0, 28.0)),
    # FP8 with FP32 master under current scaling (any fp8_recipe but delayed scaling):
    # Megatron-Core's own FP32 copy and its copy of BF16 gradients (4 + 2 + 2 + 4); the step
    # as Adam's but for the moments: 4 + 10 + 8
    (("fp8", "fp32", "bf16", "bf16", True, True, "tensorwise"), (12.0, 22.0)),
    (("fp8", "fp32", "bf16", "bf16", True, True, "mxfp8"), (12.0, 22.0)),
    # ... under delayed scaling (Megatron-Core's default) TE holds it, as remainders of the
    # BF16 parameters, and reads the BF16 gradients: 2 + 2 + 2; 2 + 8 + 8
    (("fp8", "fp32", "bf16", "bf16", True, True), (6.0, 18.0)),
    # ... whole for FP8 parameters (fp8_param_gather): 4 + 2 + 2; 2 + (8 + 2) + 8
    (("fp8", "fp32", "bf16", "bf16", True, True, "delayed", True), (8.0, 20.0)),
    # FP8 with FP16 master: TE holds it, reads the BF16 gradients: 2 + 2 + 2 and the
    # master's copy, 4; 2 + 42 + 8
    (("fp8", "fp16", "bf16", "bf16", True, True), (10.0, 52.0)),
    # FP4 (NVFP4) keeps BF16 weights, Megatron-LM's --fp8-recipe at its default: TE holds
    # the master as remainders, as under BF16
    (("fp4", "fp32", "fp32", "fp32", True, False), (10.0, 28.0)),
]


@pytest.mark.parametrize("case,expected", CASES)
@pytest.mark.parametrize("zero,pp", [(1, 2), (3, 1)])
def test_closed_form_of_state_and_step(case, expected, zero, pp):
    """The optimizer's state and the step's time, against Adam's (12 B a parameter, and the
    FP32 copy of 16-bit gradients, 4 more; 30 B through HBM), scale by the closed-form bytes
    of the table: the same parameters over the same shard group at the same bandwidth. The
    rest of the step is the same bits."""
    prec, main, avg, sq, rem, g16, recipe, fp8_params = case + ("delayed", False)[len(case) - 6:]
    state, step = expected
    fleet = "DGX_B200_1K_MC" if prec == "fp4" or recipe == "mxfp8" else "HGX_H100_1K_MC"
    kw = dict(batch_size=64, seq_len=4096, tp_size=2, pp_size=pp, dp_size=4, zero_stage=zero,
              precision=prec, grad_reduce_in_bf16=g16, sequence_parallel=True,
              fp8_recipe=recipe, fp8_param_gather=fp8_params)
    off = _solve("Llama3_8B_MC", fleet, **kw)
    on = _solve("Llama3_8B_MC", fleet, **kw, **{PA: True}, main_params_dtype=main,
                exp_avg_dtype=avg, exp_avg_sq_dtype=sq, store_param_remainders=rem)
    assert bool(on["realizable"]) and bool(off["realizable"])
    adam = 12.0 + (4.0 if (g16 or prec == "fp16") else 0.0)
    np.testing.assert_allclose(float(on["memory_optimizer_state"]),
                               float(off["memory_optimizer_state"]) * state / adam, rtol=1e-12)
    np.testing.assert_allclose(float(on["optimizer_latency"]),
                               float(off["optimizer_latency"]) * step / 30.0, rtol=1e-12)
    np.testing.assert_allclose(
        float(on["step_latency_total"]) - float(off["step_latency_total"]),
        float(on["optimizer_latency"]) - float(off["optimizer_latency"]), rtol=1e-9, atol=1e-15)
    for name in M.OUTPUTS:
        if name not in MOVES:
            np.testing.assert_array_equal(np.asarray(on[name]), np.asarray(off[name]),
                                          err_msg=name)


def test_experts_shard_over_their_own_group():
    """An MoE model's expert state is sharded over the expert data-parallel group, the dense
    state over DP x CP; BF16 moments halve the moments of both (12 -> 2 + 2 + 2 with
    remainders: half), whatever the groups."""
    kw = dict(batch_size=64, seq_len=4096, tp_size=1, pp_size=1, dp_size=8, ep_size=4,
              etp_size=1, zero_stage=1)
    off = _solve("Mixtral_8x7B_MC", "HGX_H100_1K_MC", **kw)
    on = _solve("Mixtral_8x7B_MC", "HGX_H100_1K_MC", **kw, **{PA: True},
                exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")
    np.testing.assert_allclose(float(on["memory_optimizer_state"]),
                               0.5 * float(off["memory_optimizer_state"]), rtol=1e-12)
    assert float(off["memory_optimizer_state"]) > 1e9


@pytest.mark.parametrize("workload", WORKLOADS)
def test_it_never_costs_and_changes_nothing_where_it_does_not_run(workload):
    """On random layouts of every knob and random dtypes, with the distributed optimizer or
    FSDP: every output but those the optimizer feeds is the same bits; where every state is
    FP32 or both moments BF16 (updated in place, no FP32 copies) the footprint, the optimizer
    state and the step never grow, and somewhere each shrinks. At zero_stage 0 only
    `realizable` moves (not realizable); the dtypes other than FP32 without the optimizer
    likewise break their rule and move nothing else."""
    rng = np.random.default_rng(450)
    n = 1500
    for fleet in FLEETS:
        k = {**_draw(rng, n, dp_given=True), "zero_stage": rng.choice([1, 2, 3], n)}
        dtypes = dict(main_params_dtype=rng.choice(["fp32", "fp16"], n),
                      exp_avg_dtype=rng.choice(["fp32", "fp16", "bf16", "fp8"], n),
                      exp_avg_sq_dtype=rng.choice(["fp32", "fp16", "bf16", "fp8"], n),
                      store_param_remainders=rng.random(n) < 0.7)
        off = _solve(workload, fleet, **k)
        on = _solve(workload, fleet, **k, **dtypes, **{PA: True})
        ok = np.asarray(off["valid"])
        assert ok.sum() > 150
        avg, sq = dtypes["exp_avg_dtype"], dtypes["exp_avg_sq_dtype"]
        in_place = (ok & (dtypes["main_params_dtype"] == "fp32")
                    & (((avg == "fp32") & (sq == "fp32")) | ((avg == "bf16") & (sq == "bf16"))))
        assert in_place.sum() > 20
        for name in ("memory_footprint", "memory_optimizer_state", "optimizer_latency",
                     "step_latency_total"):
            a, b = np.asarray(on[name])[in_place], np.asarray(off[name])[in_place]
            # (to rounding: without the gradient copy the footprint sums other terms)
            assert np.all(a <= b * (1.0 + 1e-12)), name
            assert np.any(a < b), name
        # FP16 master weights with FP8 moments: the least state, the longest step
        least = ok & (dtypes["main_params_dtype"] == "fp16") & (avg == "fp8") & (sq == "fp8")
        assert least.sum() > 3
        assert np.all(np.asarray(on["optimizer_latency"])[least]
                      > 2.9 * np.asarray(off["optimizer_latency"])[least])
        # (the memory parts are the heaviest pipeline rank's, and that rank may change: one
        # stage, one rank)
        one_stage = np.broadcast_to(np.asarray(k["pp_size"]) == 1, (n,))
        for name in M.OUTPUTS:
            if name not in MOVES:
                rows = one_stage if name in PARTS else slice(None)
                np.testing.assert_array_equal(np.asarray(on[name])[rows],
                                              np.asarray(off[name])[rows], err_msg=name)
        assert one_stage.sum() > 100
        assert np.array_equal(np.asarray(on["realizable"]), np.asarray(off["realizable"]))
        k0 = {**k, "zero_stage": 0}
        off0 = _solve(workload, fleet, **k0)
        narrow = ((dtypes["main_params_dtype"] != "fp32") | (avg != "fp32") | (sq != "fp32"))
        for extra, refused in (({PA: True, **dtypes}, np.ones(n, dtype=bool)),
                               (dtypes, narrow)):
            other = _solve(workload, fleet, **k0, **extra)
            for name in M.OUTPUTS:
                if name != "realizable":
                    np.testing.assert_array_equal(np.asarray(other[name]),
                                                  np.asarray(off0[name]), err_msg=name)
            np.testing.assert_array_equal(np.asarray(other["realizable"]),
                                          np.asarray(off0["realizable"]) & ~refused)
        assert not np.asarray(_solve(workload, fleet, **k0, **{PA: True})["realizable"]).any()


@pytest.mark.parametrize("workload", ("Llama3_70B_MC", "Mixtral_8x7B_MC"))
def test_the_fused_kernel_prices_it_beside_it(workload):
    pytest.importorskip("numba")
    rng = np.random.default_rng(451)
    n = 3 * 4096
    k = {**_draw(rng, n, dp_given=True), PA: rng.random(n) < 0.5,
         "main_params_dtype": rng.choice(["fp32", "fp16"], n),
         "exp_avg_dtype": rng.choice(["fp32", "bf16", "fp8"], n),
         "store_param_remainders": rng.random(n) < 0.5}
    numpy_ = _solve(workload, "HGX_H100_1K_MC", **k)
    fused = _solve(workload, "HGX_H100_1K_MC", engine="fused", **k)
    for name in M.OUTPUTS:
        np.testing.assert_array_equal(np.asarray(fused[name]), np.asarray(numpy_[name]),
                                      err_msg=name)
    assert np.asarray(numpy_["valid"])[k[PA]].sum() > 100
    # a scalar knob: its rows priced beside the kernel where it runs (zero_stage >= 1) only
    for flag in (True, False):
        one = {**k, PA: flag, "exp_avg_sq_dtype": "bf16"}
        fused, numpy_ = (_solve(workload, "HGX_H100_1K_MC", engine=e, **one)
                         for e in ("fused", "numpy"))
        for name in M.OUTPUTS:
            np.testing.assert_array_equal(np.asarray(fused[name]), np.asarray(numpy_[name]),
                                          err_msg=name)


def test_a_bad_name_in_a_big_array_is_refused_on_every_engine():
    """The fused kernel does not read these knobs: their names are checked before it, so a
    bad one among many is refused by name on the fused engine as on the numpy one."""
    pytest.importorskip("numba")
    n = 3 * 4096
    for name, good, bad in (("exp_avg_dtype", "bf16", "bf17"), ("main_params_dtype", "fp16", "fp8")):
        values = np.full(n, good)
        values[n // 2] = bad
        for engine in ("numpy", "fused", "auto"):
            with pytest.raises(ValueError, match=f"{name} must be one of"):
                _solve("Llama3_8B_MC", "HGX_H100_1K_MC", engine=engine, batch_size=64,
                       seq_len=4096, dp_size=8, **{PA: True, name: values})
