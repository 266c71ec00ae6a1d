"""The fused megatron kernel (solver.fused.megatron_kernel) is the numpy path, bit for bit.

The kernel is a port of solver/physics/megatron_steps.py and megatron_compose.py.
This test holds the two equal with ``np.testing.assert_array_equal`` (NaN-aware) on
every output, on seeded random draws over the megatron catalog's workloads and
fleets that reach every branch of the numpy path (the coverage is asserted too),
so a formula changed there and not ported here fails it.

Bitwise holds because the kernel evaluates every expression in the numpy path's
order without fastmath, and the one transcendental, ``np.log`` of the GEMM size
curve, is the same function in both: libm's ``log`` where numpy's float64 loop calls
libm (the kernel checks this once, ``libm_is_numpy_log``), else (numpy's own AVX-512
log) the kernel takes those logs with ``np.log`` itself between its passes. No
tolerance anywhere.
"""

import dataclasses
import warnings

import numpy as np
import pytest

from solver import catalog, fused
from solver.physics import megatron as M
from solver.specs import MLA_KEYS

numba = pytest.importorskip("numba")

WORKLOADS = sorted(n for n in catalog.names("workloads") if n.endswith("_MC"))
FLEETS = sorted(n for n in catalog.names("fleets") if n.endswith("_MC"))


def _no_shape(w):
    """The workload without a stated shape (megatron._Shape's 12 L h^2 = N fallback)."""
    return dataclasses.replace(w, name=w.name + "_noshape", hidden_dim=None, heads=None, kv_heads=None,
                               head_dim=None, ffn_hidden_dim=None, vocab_size=None, gated_mlp=None,
                               **{key: None for key in MLA_KEYS})


def _draw(rng, n, *, dp_given, etp_given=False):
    pick = lambda values: rng.choice(values, n)  # noqa: E731
    knobs = dict(
        batch_size=pick([1, 7, 64, 256, 1024, 4096]),
        seq_len=pick([2048, 3000, 4096, 8192]),
        tp_size=pick([1, 2, 3, 4, 8, 16]),
        pp_size=pick([1, 2, 3, 4, 8]),
        cp_size=pick([1, 2, 4]),
        ep_size=pick([1, 2, 4, 8]),
        v_stages=pick([1, 2, 3, 5]),
        micro_batch_size=pick([1, 2, 4]),
        sequence_parallel=rng.random(n) < 0.5,
        recompute=pick(list(M.RECOMPUTE)),
        zero_stage=pick([0, 1, 2, 3]),
        precision=pick(list(M.PRECISIONS)),
        tp_comm_overlap=rng.random(n) < 0.5,
        overlap_grad_reduce=rng.random(n) < 0.5,
        overlap_param_gather=rng.random(n) < 0.5,
        flash_attention=rng.random(n) < 0.7,
        grad_reduce_in_bf16=rng.random(n) < 0.5,
        fsdp_own_nic=rng.random(n) < 0.5,
        scatter_gather_tensors_in_pipeline=rng.random(n) < 0.5,
        overlap_p2p_comm=rng.random(n) < 0.5,
        # 0 keeps no mask, anything above keeps one (the kernel's two bits)
        hidden_dropout=pick([0.0, 0.0, 0.1, 0.05, 1.0]),
        attention_dropout=pick([0.0, 0.0, 0.1, 0.3, 1.0]),
        mtp_num_layers=pick([0, 0, 1, 2, 63]),  # 63: the most the kernel's 6 bits pack
        # set first and last stages (0: not set), 4095 the most their 12 bits pack
        num_layers_in_first_pipeline_stage=pick([0, 0, 0, 1, 2, 3, 5, 8, 4095]),
        num_layers_in_last_pipeline_stage=pick([0, 0, 0, 1, 2, 4, 6, 4095]),
        overlap_moe_expert_parallel_comm=rng.random(n) < 0.5,
        moe_enable_deepep=rng.random(n) < 0.5,
        # the embedding / the loss counted in the split: set stages where the rule holds
        account_for_embedding_in_pipeline_split=rng.random(n) < 0.3,
        account_for_loss_in_pipeline_split=rng.random(n) < 0.3,
    )
    if dp_given:
        knobs["dp_size"] = pick([1, 2, 4, 8, 16, 64])
    if etp_given:
        knobs["etp_size"] = pick([1, 2, 3, 4, 8, 200])  # 200: past the memo key's 7 bits
    return knobs


def _assert_same(fast, ref):
    assert list(fast) == list(ref) == list(M.OUTPUTS)
    for name in M.OUTPUTS:
        a, b = fast[name], np.asarray(ref[name])
        assert a.dtype == b.dtype, (name, a.dtype, b.dtype)
        assert a.shape == b.shape, (name, a.shape, b.shape)
        np.testing.assert_array_equal(a, b, err_msg=name)


CASES = [(wl, fl) for wl in WORKLOADS for fl in FLEETS]


def test_catalog_covers_the_branches():
    """The draws below meet every kind of workload and fleet the numpy path distinguishes."""
    shapes = [M._Shape(catalog.workload(n)) for n in WORKLOADS]
    assert any(s.moe and s.shared for s in shapes) and any(s.moe and not s.shared for s in shapes)
    assert any(s.moe and s.dense_layers for s in shapes) and any(not s.moe for s in shapes)
    assert any(s.gated for s in shapes) and any(not s.gated for s in shapes)
    assert any(s.kv_heads < s.heads for s in shapes) and any(s.kv_heads == s.heads for s in shapes)
    assert any(s.mla and s.q_lora for s in shapes) and any(not s.mla for s in shapes)
    domains = {catalog.fleet(n).node.scale_up_domain or catalog.fleet(n).node.accelerators_per_node
               for n in FLEETS}
    assert {8, 72} <= domains
    assert any("fp4" in catalog.fleet(n).node.accelerator.precision_flops for n in FLEETS)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_fused_is_numpy_bitwise(case):
    wl_name, fl_name = CASES[case]
    rng = np.random.default_rng(1600 + case)
    wl, fl = catalog.workload(wl_name), catalog.fleet(fl_name)
    if case % 5 == 4:
        wl = _no_shape(wl)
    knobs = _draw(rng, 3000, dp_given=case % 2 == 0, etp_given=case % 3 == 1)
    # The first 1,536 configurations set no stage: a block of 1,024 of them takes the
    # kernel's _even loops (with rank 1's memory and the uneven stages dropped), the
    # blocks after it the loops of any stages, on one thread or two.
    for name in ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"):
        knobs[name][:1536] = 0
    # (and counts neither the embedding nor the loss in the split, which would set them)
    for name in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
        knobs[name][:1024] = False
    # scalar knobs and scalar constant overrides ride along on some cases
    if case % 3 == 0:
        knobs["seq_len"] = 4096
        knobs["flash_attention"] = bool(case % 2)
    constants = {}
    if case % 4 == 1:
        constants = dict(gemm_size_shift=0.5, overlap_efficiency=0.3, collective_latency=0.0,
                         fp8_gemm_scale=1.2, gemm_k_overhead=0.0, attention_efficiency=0.7)
    fast = M.solve(wl, fl, engine="fused", **knobs, **constants)
    ref = M.solve(wl, fl, engine="numpy", **knobs, **constants)
    _assert_same(fast, ref)
    # the draw reaches both sides of the masks
    assert ref["valid"].any()
    assert not ref["valid"].all() or "dp_size" in knobs


#: Multi-head latent attention with queries projected directly (no q_lora_rank), the other
#: branch of its q projection: DeepSeek-V2-Lite's shape (deepseek-ai/DeepSeek-V2-Lite config.json).
V2_LITE = dataclasses.replace(
    catalog.workload("DeepSeek_V3_MC"), name="DeepSeek-V2-Lite", parameters=15.7e9,
    active_parameters=2.4e9, layers=27, dense_layers=1, hidden_dim=2048, heads=16, q_lora_rank=None,
    kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
    ffn_hidden_dim=10944, moe_ffn_hidden_dim=1408, experts=64, active_experts_per_token=6,
    shared_experts=2, vocab_size=102400)


@pytest.mark.parametrize("fl_name", ["HGX_H100_1K_MC", "GB200_NVL72_8_MC"])
def test_fused_is_numpy_bitwise_mla_without_q_lora(fl_name):
    assert M._Shape(V2_LITE).mla and not M._Shape(V2_LITE).q_lora
    knobs = _draw(np.random.default_rng(1700 + len(fl_name)), 3000, dp_given=fl_name.startswith("G"),
                  etp_given=True)
    fast = M.solve(V2_LITE, catalog.fleet(fl_name), engine="fused", **knobs)
    ref = M.solve(V2_LITE, catalog.fleet(fl_name), engine="numpy", **knobs)
    _assert_same(fast, ref)
    assert ref["valid"].any()


def test_every_branch_is_reached_somewhere():
    """Big draws on MoE workloads on an NVL72 fleet: every mask and term takes both values."""
    fl = catalog.fleet("GB200_NVL72_8_MC")
    seen = {}
    for seed, name in enumerate(("DeepSeek_V3_MC", "Mixtral_8x7B_MC")):
        wl = catalog.workload(name)
        knobs = _draw(np.random.default_rng(16 + seed), 20000, dp_given=bool(seed),
                      etp_given=not seed)
        fast = M.solve(wl, fl, engine="fused", **knobs)
        ref = M.solve(wl, fl, engine="numpy", **knobs)
        _assert_same(fast, ref)
        v = ref["valid"]
        for mask in ("valid", "realizable", "feasible"):
            seen.setdefault(mask, set()).update(np.unique(ref[mask]).tolist())
        for term in ("cp_communication_latency", "ep_communication_latency",
                     "pp_communication_latency", "dp_communication_latency",
                     "tp_communication_latency", "pipeline_bubble_latency"):
            seen.setdefault(term, set()).update(np.unique(ref[term][v] > 0).tolist())
    assert all(values == {False, True} for values in seen.values()), seen


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("wl_name", ["Llama3_8B_MC", "Mixtral_8x7B_MC"])
def test_step_memo_paths_are_numpy_bitwise(wl_name, chunked, monkeypatch):
    """The kernel memoizes steps 3-4, the LM head and the later steps' terms of the same
    knobs. Its hits, knobs too wide to pack into its key, and more distinct keys than it
    keeps (it starts again when full: at a block, or where numpy's log is not libm's at a
    chunk, ``chunked`` making chunks of 1,000) all give the numpy path's bits (one thread,
    so one memo sees the whole draw)."""
    from solver.fused import megatron_kernel as fk
    monkeypatch.setenv(fused.THREADS_ENV, "1")
    if chunked:
        monkeypatch.setattr(fk, "_NUMPY_LOG_CHUNK", 1000)
    wl, fl = catalog.workload(wl_name), catalog.fleet("HGX_H100_1K_MC")
    rng = np.random.default_rng(2026)
    n = 3 * fk.MEMO_KEYS
    knobs = _draw(rng, n, dp_given=True)
    # the second half: a new sequence length on nearly every row, so new keys past MEMO_KEYS
    half = np.arange(n) >= n // 2
    knobs["seq_len"] = np.where(half, 2 * rng.integers(512, 1 << 20, n), knobs["seq_len"])
    # some rows too wide for the key's fields (tp_size, micro_batch_size, seq_len)
    wide = rng.integers(0, 30, n)
    knobs["tp_size"] = np.where(wide == 0, 1 << 16, knobs["tp_size"])
    knobs["micro_batch_size"] = np.where(wide == 1, (1 << 28) + 1, knobs["micro_batch_size"])
    knobs["seq_len"] = np.where(wide == 2, 1 << 32, knobs["seq_len"])
    fast = M.solve(wl, fl, engine="fused", **knobs)
    ref = M.solve(wl, fl, engine="numpy", **knobs)
    _assert_same(fast, ref)
    # the draw reaches each path: repeated keys, more distinct ones than kept, unpackable ones
    tp, s, mbs = knobs["tp_size"], knobs["seq_len"], knobs["micro_batch_size"]
    packs = (tp < 1 << 16) & (s < 1 << 32) & (mbs < 1 << 28)
    keys = np.stack([s, mbs, tp, knobs["cp_size"], knobs["ep_size"],
                     knobs["sequence_parallel"] & (tp > 1), knobs["tp_comm_overlap"],
                     knobs["flash_attention"]], axis=1)[packs]
    keys = np.concatenate([keys.astype(str), np.stack([knobs["recompute"], knobs["precision"]],
                                                      axis=1)[packs]], axis=1)
    distinct = np.unique(keys, axis=0).shape[0]
    assert fk.MEMO_KEYS < distinct < packs.sum() and not packs.all()
    assert np.isfinite(ref["step_latency_total"][~packs]).any()


def test_auto_picks_fused_for_big_flat_calls(monkeypatch):
    wl, fl = catalog.workload("Llama3_8B_MC"), catalog.fleet("HGX_H100_1K_MC")
    knobs = _draw(np.random.default_rng(3), M.FUSED_MIN_POINTS, dp_given=True)
    calls = []
    real = M._solve_fused
    monkeypatch.setattr(M, "_solve_fused", lambda *a: calls.append(1) or real(*a))
    M.solve(wl, fl, **knobs)
    assert calls == [1]
    small = {k: v[:10] for k, v in knobs.items()}
    M.solve(wl, fl, **small)  # too small to be worth it
    M.solve(wl, fl, engine="numpy", **knobs)
    M.solve(wl, fl, **knobs, overlap_efficiency=np.full(M.FUSED_MIN_POINTS, 0.5))  # array constant
    assert calls == [1]


def test_auto_falls_back_without_numba(monkeypatch):
    wl, fl = catalog.workload("Llama3_8B_MC"), catalog.fleet("HGX_H100_1K_MC")
    knobs = _draw(np.random.default_rng(4), M.FUSED_MIN_POINTS, dp_given=True)
    monkeypatch.setattr(fused, "NUMBA", False)
    monkeypatch.setattr(M, "_solve_fused", lambda *a: pytest.fail("fused path taken without numba"))
    out = M.solve(wl, fl, **knobs)
    assert out["step_latency_total"].shape == (M.FUSED_MIN_POINTS,)
    with pytest.raises(ValueError, match="numba is not installed"):
        M.solve(wl, fl, engine="fused", **knobs)


def test_fused_refuses_what_it_cannot_price():
    wl, fl = catalog.workload("Llama3_8B_MC"), catalog.fleet("HGX_H100_1K_MC")
    with pytest.raises(ValueError, match=r"flat inputs.*shape \(4, 3\)"):
        M.solve(wl, fl, engine="fused", tp_size=np.array([1, 2, 4, 8])[:, None],
                pp_size=np.array([1, 2, 4])[None, :])
    with pytest.raises(ValueError, match="constants must be scalars"):
        M.solve(wl, fl, engine="fused", tp_size=[1, 2], overlap_efficiency=[0.1, 0.2])
    with pytest.raises(ValueError, match="engine must be one of"):
        M.solve(wl, fl, engine="numba")
    # a scalar call is flat too: shape (), priced by the numpy path under auto
    _assert_same(M.solve(wl, fl, engine="fused", tp_size=8, pp_size=2, recompute="full"),
                 M.solve(wl, fl, tp_size=8, pp_size=2, recompute="full"))


def test_fast_normalization_is_the_checking_one():
    """Big 1-D knobs take a one-pass check; what it does not accept goes through the
    checking converters, so values, codes and error messages are the numpy path's."""
    wl, fl = catalog.workload("Llama3_8B_MC"), catalog.fleet("HGX_H100_1K_MC")
    n = M.FUSED_MIN_POINTS
    rng = np.random.default_rng(5)
    knobs = _draw(rng, n, dp_given=True)
    knobs["precision"] = rng.choice(["bf16", "FP8", "fp16", "Fp4"], n)  # case-folded by the slow path
    knobs["recompute"] = rng.choice(["none", "selective", "full"], n).astype("<U12")
    knobs["tp_size"] = knobs["tp_size"].astype(np.int32)  # not int64: converted
    knobs["pp_size"] = knobs["pp_size"].astype(np.float64)  # whole floats: converted
    fast = M._normalize(knobs, fast=True)
    slow = M._normalize(knobs, fast=False)
    for name in knobs:
        assert fast[name].dtype == slow[name].dtype, name
        np.testing.assert_array_equal(fast[name], slow[name], err_msg=name)
    _assert_same(M.solve(wl, fl, engine="fused", **knobs), M.solve(wl, fl, engine="numpy", **knobs))
    bad = dict(knobs, zero_stage=np.where(np.arange(n) == n - 1, 4, knobs["zero_stage"]))
    with pytest.raises(ValueError, match="zero_stage"):
        M.solve(wl, fl, engine="fused", **bad)
    bad = dict(knobs, recompute=np.where(np.arange(n) == 7, "sometimes", knobs["recompute"]))
    with pytest.raises(ValueError, match="recompute must be one of.*'sometimes'"):
        M.solve(wl, fl, engine="fused", **bad)
    bad = dict(knobs, batch_size=np.full(n, 2 ** 53))
    with pytest.raises(ValueError, match="batch_size must be below 2\\*\\*53"):
        M.solve(wl, fl, engine="fused", **bad)


@pytest.mark.parametrize("name", M._KERNEL_INTS)
def test_the_kernels_range_checks_refuse_what_the_converter_refuses(name):
    """solve leaves big int64 knobs' range checks to the fused kernel's first pass; one
    value out of range, anywhere, raises the checking converter's message on every path."""
    wl, fl = catalog.workload("Llama3_8B_MC"), catalog.fleet("HGX_H100_1K_MC")
    n = 3 * M.FUSED_MIN_POINTS  # three threads' worth of configurations where threads exist
    rng = np.random.default_rng(11)
    knobs = _draw(rng, n, dp_given=True, etp_given=name == "etp_size")
    knob = M.KNOBS[name]
    wrong = knob.low - 1 if knob.high is None else knob.high + 1
    at = int(rng.integers(n))
    bad = dict(knobs, **{name: np.where(np.arange(n) == at, wrong, knobs[name])})
    assert bad[name].dtype == np.int64
    message = f"{name} must be an integer .*but got {name}={wrong}"
    for engine in ("fused", "auto", "numpy"):
        with pytest.raises(ValueError, match=message):
            M.solve(wl, fl, engine=engine, **bad)
    with pytest.raises(ValueError, match=message):  # an array constant: the numpy path
        M.solve(wl, fl, **bad, gemm_scale=np.full(n, 0.7))
    with pytest.raises(ValueError, match=message):  # prepare checks before any pricing
        M.prepare(wl, fl, **bad)
    # the largest value that is in range passes
    edge = 2 ** 53 - 1 if knob.high is None else knob.high
    fine = dict(knobs, **{name: np.where(np.arange(n) == at, edge, knobs[name])})
    out = M.solve(wl, fl, engine="fused", **fine)
    assert out["valid"].shape == (n,)


def test_factorize_choices_matches_exactly_on_every_thread(monkeypatch):
    """The one-pass name match (7-bit packed keys up to 9 characters, the character table
    beyond) gives the codes of an exact match and refuses anything else, wherever in a
    threaded call the odd value sits."""
    from solver.fused import megatron_kernel as fk
    monkeypatch.setattr(fused, "THREAD_MIN_POINTS", 1024)
    monkeypatch.setenv(fused.THREADS_ENV, "3")
    choices = ("bf16", "fp16", "fp8", "fp4")
    rng = np.random.default_rng(9)
    names = rng.choice(list(choices), 5000)
    for dtype in ("<U4", "<U9", "<U12"):  # packed keys, packed keys, character table
        values = names.astype(dtype)
        np.testing.assert_array_equal(fk.factorize_choices(values, choices),
                                      [choices.index(v) for v in values])
        # "b\u00e6" + "16" packs, 7 bits a character, to bf16's key (U+00E6 is 'f' + 128,
        # whose top bit lands on the low bit of '1'): only the check for characters above
        # 127 refuses it; a case change; a longer name; each in the last thread's range
        for odd in ("b\u00e616", "BF16", "bf16x"):
            if len(odd) > int(dtype[2:]) or odd in choices:
                continue
            bad = values.copy()
            bad[-3] = odd
            assert fk.factorize_choices(bad, choices) is None, (dtype, odd)
    # a choice longer than the array's strings matches no value
    assert fk.factorize_choices(np.array(["fp8", "fp4"] * 600, dtype="<U3"), ("fp8", "fp16")) is None
    np.testing.assert_array_equal(
        fk.factorize_choices(np.array(["fp8", "fp4"] * 600, dtype="<U3"), ("fp16", "fp8", "fp4")),
        [1, 2] * 600)


@pytest.mark.parametrize("numpy_log", [False, True])
def test_names_matched_in_the_kernel_are_the_checking_converters(numpy_log, monkeypatch):
    """Big arrays of names of up to 9 characters reach the kernel as characters, matched
    exactly in its first pass (in each thread's range); a name that is not exactly a
    choice fails the call, and the checking converter then takes it (case-folded) or
    raises its message, wherever in the call it sits."""
    from solver.fused import megatron_kernel as fk
    monkeypatch.setattr(fused, "THREAD_MIN_POINTS", 1024)
    monkeypatch.setenv(fused.THREADS_ENV, "3")
    # the libm pass (numpy_log False) is bitwise where libm's log is numpy's, else to an ulp or two
    exact = numpy_log or fk.libm_is_numpy_log()
    monkeypatch.setattr(fk, "_LIBM_IS_NUMPY_LOG", not numpy_log)
    wl, fl = catalog.workload("Mixtral_8x7B_MC"), catalog.fleet("GB200_NVL72_8_MC")
    n = 5000
    knobs = _draw(np.random.default_rng(8), n, dp_given=True)
    assert knobs["recompute"].dtype == "<U9" and knobs["precision"].dtype == "<U4"
    k = M._normalize(dict(knobs), fast=True, unchecked=(unchecked := []))
    assert {"recompute", "precision"} <= set(unchecked) and k["recompute"] is knobs["recompute"]

    def same(fast, ref):
        if exact:
            return _assert_same(fast, ref)
        for name in M.OUTPUTS:
            np.testing.assert_allclose(fast[name], ref[name], rtol=1e-14, err_msg=name)
    for dense in (catalog.workload("Llama3_8B_MC"), wl):
        same(M.solve(dense, fl, engine="fused", **knobs), M.solve(dense, fl, engine="numpy", **knobs))
    at = np.arange(n)
    folded = dict(knobs, recompute=np.where(at == n - 2, "Selective", knobs["recompute"]))
    assert folded["recompute"].dtype == "<U9"
    same(M.solve(wl, fl, engine="fused", **folded), M.solve(wl, fl, engine="numpy", **folded))
    for name, odd, where in (("recompute", "sometimes", n - 1), ("recompute", "nine", 0),
                             ("precision", "b\u00e616", n - 3), ("precision", "fp8 ", 2000)):
        bad = dict(knobs, **{name: np.where(at == where, odd, knobs[name]).astype(knobs[name].dtype)})
        assert bad[name][where] == odd
        with pytest.raises(ValueError, match=f"{name} must be one of.*{odd!r}"):
            M.solve(wl, fl, engine="fused", **bad)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("case", [1, 12, 27, 44])
def test_numpy_log_mode_is_numpy_bitwise(case, threads, monkeypatch):
    """Where numpy's float64 log is not libm's (its AVX-512 code), the kernel takes the
    logs of only the step memo's misses with np.log between its passes, in each thread's
    range: the same bits there too."""
    from solver.fused import megatron_kernel as fk
    monkeypatch.setattr(fk, "_LIBM_IS_NUMPY_LOG", False)
    monkeypatch.setattr(fk, "_NUMPY_LOG_CHUNK", 1000)  # several chunks, a ragged last one
    monkeypatch.setattr(fused, "THREAD_MIN_POINTS", 700)  # 3 ranges of 833: not chunk-aligned
    monkeypatch.setenv(fused.THREADS_ENV, str(threads))
    wl_name, fl_name = CASES[case]
    wl, fl = catalog.workload(wl_name), catalog.fleet(fl_name)
    knobs = _draw(np.random.default_rng(case), 2500, dp_given=bool(case % 2))
    _assert_same(M.solve(wl, fl, engine="fused", **knobs), M.solve(wl, fl, engine="numpy", **knobs))


def test_libm_log_probe_here():
    """The probe that picks the kernel's log mode runs and says what it found."""
    from solver.fused import megatron_kernel as fk
    assert fk.libm_is_numpy_log() in (True, False)


def test_inlined_step_calls_stay_under_cpythons_argument_limit():
    """CPython 3.11 compiles a call of more than 30 positional arguments to a call with
    ``*args``, which numba cannot inline ("Calling a closure with *args is unsupported",
    an error that names neither the call nor the limit): every call in the kernels'
    modules keeps to 30 (the block loop takes its range as one ``span`` argument for
    this; only Python calls ``_kernel``, with its 39, through ``*args``)."""
    import ast
    import inspect

    from solver.fused import megatron_fused_steps, megatron_kernel, megatron_primitives
    calls = 0
    for module in (megatron_kernel, megatron_fused_steps, megatron_primitives):
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(node, ast.Call):
                calls += 1
                assert len(node.args) <= 30, (module.__name__, ast.unparse(node.func), node.lineno,
                                              len(node.args))
    assert calls > 100  # the modules were read


def test_sources_digest_is_current():
    """numba keys the cached kernel on its own file only: the digest recorded there must be
    that of the other sources it compiles in, or a stale cache could serve old code. On a
    failure, set the module's SOURCES_DIGEST to the value this test prints."""
    from solver.fused import megatron_primitives
    from solver.fused import megatron_kernel as module
    from solver.fused._numba import sources_digest
    actual = sources_digest(module.COMPILED_FROM, megatron_primitives.COMPILED_CONSTANTS)
    assert module.SOURCES_DIGEST == actual, (
        f"solver/fused/megatron_kernel.py: set SOURCES_DIGEST = {actual!r} (its other sources changed)")


def test_stale_sources_digest_compiles_instead_of_reading_the_cache(tmp_path):
    """A recorded digest that does not match says so and turns the disk cache off."""
    from solver.fused._numba import cache_is_current, sources_digest
    src = tmp_path / "steps.py"
    src.write_text("x = 1\n")
    recorded = sources_digest([src], (1.0,))
    assert cache_is_current("m", recorded, [src], (1.0,))
    src.write_bytes(b"x = 1\r\n")  # a Windows checkout of the same file
    assert cache_is_current("m", recorded, [src], (1.0,))
    src.write_text("x = 2\n")
    with pytest.warns(RuntimeWarning, match="set SOURCES_DIGEST = '[0-9a-f]{16}' in m"):
        assert not cache_is_current("m", recorded, [src], (1.0,))
    with pytest.warns(RuntimeWarning):
        assert not cache_is_current("m", sources_digest([src], (1.0,)), [src], (2.0,))
    # sources that are not files (a zip): no cache, no warning, no failure at import
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sources_digest([tmp_path / "missing.py"]) is None
        assert not cache_is_current("m", recorded, [tmp_path / "missing.py"])


def test_benchmark_mirrors_the_kernels_inputs():
    """benchmarks/bench_fused.py times the knobs' normalization as megatron.solve does it
    (one shared function: a copy had broken when the dropout knobs were packed)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
    import bench_fused

    n = 2000
    a = bench_fused.megatron_normalization(bench_fused.megatron_draw(n), n)
    assert a["p2p_flags"].dtype == np.uint32 and a["memory_flags"].dtype == np.uint8
    # Megatron-Core's defaults: both dropouts keep their masks (bits 1 and 2)
    assert (a["memory_flags"] & 6 == 6).all()
    assert not {"hidden_dropout", "attention_dropout", "mtp_num_layers"} & set(a)
    assert all(np.shape(v) == (n,) for v in a.values())
    # the pipeline-split flags become set stages before the kernel, as in solve (a copy
    # that skipped it passed the flags on as arrays of their own)
    draw = dict(bench_fused.megatron_draw(n), account_for_embedding_in_pipeline_split=True,
                account_for_loss_in_pipeline_split=True, pp_size=np.full(n, 2),
                v_stages=np.ones(n, dtype=np.int64))
    a = bench_fused.megatron_normalization(draw, n)
    assert not {"account_for_embedding_in_pipeline_split",
                "account_for_loss_in_pipeline_split"} & set(a)
    assert (a["memory_flags"] >> 4 == 1).all()  # 80 + 2 on 2 stages of 41: the rule holds
    first, last = (a["p2p_flags"] >> 8) & 4095, a["p2p_flags"] >> 20
    assert (first == 40).all() and (last == 40).all()
