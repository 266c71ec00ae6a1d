"""Partial recomputation (recompute_num_layers) in the megatron physics: under
recompute="full", Megatron-Core's block method recomputes the first recompute_num_layers
layers of each model chunk and runs the rest as a plain forward ([40] of
solver.physics.megatron). Held against the model's own limits (every layer: full recompute;
the layer counts' closed forms) on seeded random layouts across the whole space."""

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from solver import catalog
from solver.physics import megatron as M

sys.path.insert(0, str(Path(__file__).parent))
from test_fused_megatron import _draw  # noqa: E402

FLEETS = ("HGX_H100_1K_MC", "GB200_NVL72_8_MC", "Selene_MC")
WORKLOADS = ("Llama3_8B_MC", "Llama3_70B_MC", "Mixtral_8x7B_MC", "DeepSeek_V3_MC", "GPT3_175B_MC")


def _solve(workload, fleet, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return M.solve(catalog.workload(workload), catalog.fleet(fleet), engine="numpy", **kw)


def _full(rng, n, **over):
    """Random layouts of every knob (test_fused_megatron._draw), all under full recompute."""
    return {**_draw(rng, n, dp_given=True), "recompute": "full", **over}


def _same(a, b, rel=1e-12):
    for name in M.OUTPUTS:
        x, y = np.asarray(a[name]), np.asarray(b[name])
        if x.dtype == bool:
            np.testing.assert_array_equal(x, y, err_msg=name)
        else:
            np.testing.assert_allclose(x, y, rtol=rel, atol=0, equal_nan=True, err_msg=name)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_recomputing_a_chunks_every_layer_is_full_recompute(workload):
    """recompute_num_layers at or past every chunk's layers recomputes them all: every output
    as recompute="full" prices it (0, not set, too), on random layouts of every knob but MTP
    (set stages, interleaving, MoE) and three fleets. (The block method leaves MTP modules
    plain: the test below.)"""
    rng = np.random.default_rng(40)
    for fleet in FLEETS:
        k = _full(rng, 1500, mtp_num_layers=0)
        full = _solve(workload, fleet, **k)
        assert np.asarray(full["valid"]).any(), (workload, fleet)
        _same(_solve(workload, fleet, **k, recompute_num_layers=4095), full)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_partial_recompute_lies_between_none_and_full_and_grows_with_its_layers(workload):
    """More recomputed layers never shorten the step nor grow the memory footprint, and a
    partial recompute costs at least no recompute and at most full recompute (random
    layouts of every knob, set stages too, 1 to 3 layers a chunk). On set stages a partial
    recompute adds work to a stage that need not pace the pipeline: its time goes into the
    bubble whole (the sum of the other stages' times), never less than its longer backward
    hides of the DP traffic. (A bubble of the stages' mean let the step fall by up to 1 %
    in these draws.)"""
    rng = np.random.default_rng(41)
    for fleet in FLEETS:
        k = _full(rng, 1500)
        ok = np.asarray(_solve(workload, fleet, **k)["valid"])
        none = _solve(workload, fleet, **{**k, "recompute": "none"})
        steps = [np.asarray(none["step_latency_total"])]
        acts = []
        for n in (1, 2, 3, 0):
            out = _solve(workload, fleet, **k, recompute_num_layers=n)
            steps.append(np.asarray(out["step_latency_total"]))
            acts.append(np.asarray(out["memory_footprint"]))
        for a, b in zip(steps, steps[1:]):
            assert np.all((a <= b * (1 + 1e-12)) | ~ok), (workload, fleet)
        # every rank's stored activations fall and a recomputed layer's working set stays,
        # so the footprint (the fullest rank's, which can move with set stages) falls
        for a, b in zip(acts, acts[1:]):
            assert np.all((b <= a * (1 + 1e-12)) | ~ok), (workload, fleet)
        assert np.any(steps[1][ok] < steps[-1][ok]) and np.any(acts[0][ok] > acts[-1][ok])


#: pipeline and interleaving degrees that split each workload's layers into whole chunks
_CHUNKS = {"Llama3_8B_MC": ([1, 2, 4, 8], [1, 2, 4]), "Llama3_70B_MC": ([1, 2, 4, 8], [1, 2, 5]),
           "GPT3_175B_MC": ([1, 2, 4, 8], [1, 2, 3]), "Mixtral_8x7B_MC": ([1, 2, 4, 8], [1, 2, 4])}


def _even(rng, n, workload, **over):
    """Random layouts whose stages split evenly into whole chunks (no set stages, no MTP):
    every stage holds v_stages chunks of layers / (pp_size x v_stages)."""
    pps, vs = _CHUNKS[workload]
    over = {"pp_size": rng.choice(pps, n), "v_stages": rng.choice(vs, n), **over}
    return _full(rng, n, num_layers_in_first_pipeline_stage=0, num_layers_in_last_pipeline_stage=0,
                 mtp_num_layers=0, account_for_embedding_in_pipeline_split=False,
                 account_for_loss_in_pipeline_split=False, **over)


@pytest.mark.parametrize("workload", ("Llama3_70B_MC", "GPT3_175B_MC", "Mixtral_8x7B_MC"))
def test_compute_and_recomputed_flops_are_linear_in_the_recomputed_layers(workload):
    """On even stages, a partial recompute of N layers a chunk of c runs v min(N, c) of a
    stage's L / pp layers again: its compute time is none's plus that share of full
    recompute's extra, and HFU / MFU - 1 (the recomputed FLOPs over the model's) that share of
    full's (closed forms, random valid layouts of every other knob)."""
    rng = np.random.default_rng(42)
    layers = catalog.workload(workload).layers
    for fleet in FLEETS:
        for n in (1, 2, 5):
            k = _even(rng, 2000, workload)
            part = _solve(workload, fleet, **k, recompute_num_layers=n)
            ok = np.asarray(part["valid"])
            assert ok.sum() > 200, (workload, fleet, n)
            full = _solve(workload, fleet, **k)
            none = _solve(workload, fleet, **{**k, "recompute": "none"})
            pp, v = np.asarray(k["pp_size"]) * 1.0, np.asarray(k["v_stages"]) * 1.0
            chunk = layers / (pp * v)
            share = v * np.minimum(n, chunk) / (layers / pp)
            c = {name: np.asarray(out["compute_latency"])[ok] for name, out in
                 (("part", part), ("full", full), ("none", none))}
            np.testing.assert_allclose(c["part"], c["none"] + share[ok] * (c["full"] - c["none"]),
                                       rtol=1e-12)
            extra = {name: (np.asarray(out["hfu"]) / np.asarray(out["mfu"]) - 1.0)[ok]
                     for name, out in (("part", part), ("full", full))}
            np.testing.assert_allclose(extra["part"], share[ok] * extra["full"], rtol=1e-12)
            assert np.any(share[ok] < 1.0)


def test_stored_activations_are_linear_in_the_recomputed_layers():
    """Without a pipeline, a layer a microbatch: N recomputed layers store N checkpoints and
    the other L - N whole layers beside one recomputed layer's working set, so the
    activations are linear in N (second differences zero) for N from 1 to L - 1, and N = L
    prices full recompute's."""
    rng = np.random.default_rng(43)
    k = _even(rng, 2000, "Llama3_8B_MC", pp_size=1, v_stages=1)
    outs = [_solve("Llama3_8B_MC", "HGX_H100_1K_MC", **k, recompute_num_layers=n)
            for n in (1, 2, 3, 32)]
    ok = np.asarray(outs[0]["valid"])
    assert ok.sum() > 200
    a = [np.asarray(o["memory_activations"])[ok] for o in outs]
    np.testing.assert_allclose(a[0] - 2.0 * a[1] + a[2], 0.0, atol=1e-9 * a[0].max())
    assert np.all(a[0] > a[1])
    full = _solve("Llama3_8B_MC", "HGX_H100_1K_MC", **k)
    np.testing.assert_allclose(a[3], np.asarray(full["memory_activations"])[ok], rtol=1e-12)


def test_llama3_70b_recomputing_half_of_each_chunk():
    """Llama 3 70B, TP 8, PP 4 x 5 virtual stages (chunks of 4 layers), 64 nodes of H100:
    two layers a chunk recomputed take the step halfway from none to full in compute, and
    the activations halfway less the working set full recompute holds too."""
    kw = dict(batch_size=512, seq_len=8192, tp_size=8, pp_size=4, v_stages=5, micro_batch_size=1,
              sequence_parallel=True, dp_size=8)
    out = {name: _solve("Llama3_70B_MC", "EOS_H100_MC", recompute=rc, recompute_num_layers=n, **kw)
           for name, rc, n in (("none", "none", 0), ("half", "full", 2), ("full", "full", 0))}
    assert all(bool(o["realizable"]) and bool(o["feasible"]) for o in out.values())
    compute = {name: float(o["compute_latency"]) for name, o in out.items()}
    assert compute["half"] == pytest.approx((compute["none"] + compute["full"]) / 2, rel=1e-12)
    step = {name: float(o["step_latency_total"]) for name, o in out.items()}
    assert step["none"] < step["half"] < step["full"]
    act = {name: float(o["memory_activations"]) for name, o in out.items()}
    assert act["full"] < act["half"] < act["none"]


def test_recompute_num_layers_needs_full_recompute_and_prices_alike_on_either_engine():
    """Megatron-Core refuses recompute_num_layers beside selective recompute [40]; set
    without full recompute the layout is not realizable, and why_unrealizable names the
    rule. The fused kernel does not read the knob: a call of it prices the layouts that set
    it under full recompute on the numpy path and the rest itself, the same bits as
    engine="numpy" (random layouts of every knob, names and codes alike)."""
    kw = dict(batch_size=1024, seq_len=4096, tp_size=8, pp_size=4, micro_batch_size=1,
              sequence_parallel=True)
    wl, fl = catalog.workload("Llama3_70B_MC"), catalog.fleet("HGX_H100_1K_MC")
    for rc in ("none", "selective"):
        assert not bool(M.solve(wl, fl, recompute=rc, recompute_num_layers=2, **kw)["realizable"])
        assert sorted(M.why_unrealizable(wl, fl, recompute=rc, recompute_num_layers=2, **kw)) == [
            "recompute_layers"]
    assert bool(M.solve(wl, fl, recompute="full", recompute_num_layers=2, **kw)["realizable"])
    with pytest.raises(ValueError, match="recompute_num_layers"):
        M.solve(wl, fl, recompute="full", recompute_num_layers=-1, **kw)
    n = 3 * 4096  # past FUSED_MIN_POINTS: auto takes the fused kernel
    bad = np.zeros(n, dtype=np.int64)
    bad[7] = 4096  # past the knob's 4095, checked before the kernel
    with pytest.raises(ValueError, match="recompute_num_layers"):
        M.solve(wl, fl, recompute="full", recompute_num_layers=bad, **kw)
    rnl = np.tile(np.array([0, 1, 2, 20]), n // 4)
    auto = M.solve(wl, fl, recompute="full", recompute_num_layers=rnl, **kw)
    _same(auto, M.solve(wl, fl, recompute="full", recompute_num_layers=rnl, engine="numpy", **kw),
          rel=0)
    assert np.unique(np.asarray(auto["step_latency_total"])).size == 3  # 20, a stage of 80 / 4: full
    pytest.importorskip("numba")
    rng = np.random.default_rng(44)
    for workload in ("Llama3_8B_MC", "DeepSeek_V3_MC"):
        k = _draw(rng, n, dp_given=True)
        k["recompute_num_layers"] = rng.choice([0, 0, 1, 2, 3, 4095], n)
        numpy_ = _solve(workload, "HGX_H100_1K_MC", **k)
        # names as an array (matched in the kernel) and as a list (codes before it)
        for names in (k["recompute"], list(k["recompute"])):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fused = M.solve(catalog.workload(workload), catalog.fleet("HGX_H100_1K_MC"),
                                engine="fused", **dict(k, recompute=names))
            _same(fused, numpy_, rel=0)
        assert np.any(np.asarray(numpy_["realizable"]))


def test_a_cube_sweeps_recompute_num_layers_as_an_axis():
    from sweep.evaluate import run
    from sweep.spec import load_spec

    spec = load_spec({"workload": "Llama3_70B_MC", "fleet": "HGX_H100_1K_MC", "physics": "megatron",
                      "fixed": {"batch_size": 1024, "seq_len": 4096, "tp_size": 8, "pp_size": 4,
                                "sequence_parallel": True, "recompute": "full"},
                      "axes": {"recompute_num_layers": [0, 1, 5, 20]}})
    cube = run(spec)
    assert "recompute_num_layers" in cube.dims
    step = cube["step_latency_total"].sel(recompute_num_layers=[1, 5, 20, 0]).values.ravel()
    assert np.all(np.diff(step) >= 0) and step[0] < step[-1]
    assert step[-1] == step[-2]  # 20, a stage's layers (80 / 4): every layer, full recompute


def test_a_chunks_first_layers_recompute_so_leading_dense_layers_go_first():
    """DeepSeek-V3 on one stage: its first 3 layers are dense, the rest MoE, so the first
    3 recomputed layers are dense and the 4th on are MoE [40]: each of the first three
    saves a dense layer's activations less its checkpoint, each after an MoE layer's (the
    steps differ; in proportion they would all be the same). The first step also brings a
    recomputed layer's working set, and the 4th an MoE layer's, so those are left out."""
    kw = dict(batch_size=64, seq_len=4096, tp_size=8, ep_size=8, etp_size=1, pp_size=1,
              micro_batch_size=1, sequence_parallel=True, recompute="full", dp_size=8)
    act = [float(_solve("DeepSeek_V3_MC", "GB200_NVL72_8_MC", recompute_num_layers=n,
                        **kw)["memory_activations"]) for n in range(1, 8)]
    step = -np.diff(act)  # saved by recomputing layer n + 1 as well: n = 1 ... 6
    dense, moe = step[:2], step[3:]  # layers 2, 3; layers 5, 6, 7
    np.testing.assert_allclose(dense, dense[0], rtol=1e-12)
    np.testing.assert_allclose(moe, moe[0], rtol=1e-12)
    assert dense[0] > 0 and moe[0] > 0 and abs(moe[0] / dense[0] - 1.0) > 0.05


def test_the_block_method_leaves_multi_token_prediction_plain():
    """Megatron-Core's MTP layer skips recomputation under the block method ("recompute_method
    == 'block' is not supported for MTP yet. Skipping recompute.") [40]: DeepSeek-V3 with one
    MTP module, every layer of each chunk recomputed by recompute_num_layers, is full
    recompute less the MTP module's recomputed forward: a shorter compute time by it (on
    the paced last stage), HFU / MFU - 1 at 61 / 62 of full recompute's (a layer's FLOPs
    counted alike), and more activations on the last rank (its MTP layer stored whole)."""
    kw = dict(batch_size=1024, seq_len=4096, tp_size=2, pp_size=8, ep_size=32, etp_size=1,
              micro_batch_size=1, sequence_parallel=True, recompute="full", mtp_num_layers=1,
              num_layers_in_first_pipeline_stage=5, num_layers_in_last_pipeline_stage=8)
    full = _solve("DeepSeek_V3_MC", "HGX_H100_1K_MC", **kw)
    block = _solve("DeepSeek_V3_MC", "HGX_H100_1K_MC", **kw, recompute_num_layers=4095)
    plain = _solve("DeepSeek_V3_MC", "HGX_H100_1K_MC", **{**kw, "mtp_num_layers": 0})
    assert bool(full["realizable"]) and bool(block["realizable"])
    assert float(block["compute_latency"]) < float(full["compute_latency"])
    assert float(block["step_latency_total"]) < float(full["step_latency_total"])
    extra = {name: float(o["hfu"]) / float(o["mfu"]) - 1.0 for name, o in
             (("full", full), ("block", block))}
    assert extra["block"] == pytest.approx(extra["full"] * 61 / 62, rel=1e-12)
    assert float(block["memory_activations"]) >= float(full["memory_activations"])
    # without MTP the two are one layout
    _same(plain, _solve("DeepSeek_V3_MC", "HGX_H100_1K_MC", **{**kw, "mtp_num_layers": 0},
                        recompute_num_layers=4095))


def test_a_chunks_plain_layers_free_their_activations_before_its_first_recompute():
    """Llama 3 8B on 2 stages of 16 layers, 1F1B: rank 0 holds 2 microbatches in flight and
    sets the peak. With one layer a chunk recomputed its 15 plain layers are the chunk's
    last: their backward frees them before the first recomputed forward takes its working
    set (one plain layer's activations less its checkpoint), so the peak is the stored
    activations alone, 2 x (checkpoint + 15 plain layers + the embedding's dropout mask),
    where adding the working set on
    top had priced one layer more (a layer's plain activations read off no recompute's
    peak, 2 x 16 of them)."""
    s, h = 8192, catalog.workload("Llama3_8B_MC").hidden_dim
    kw = dict(batch_size=64, seq_len=s, tp_size=1, pp_size=2, micro_batch_size=1, dp_size=32)
    none = _solve("Llama3_8B_MC", "HGX_H100_1K_MC", recompute="none", **kw)
    one = _solve("Llama3_8B_MC", "HGX_H100_1K_MC", recompute="full", recompute_num_layers=1, **kw)
    mask = s * h  # the embedding dropout's mask on rank 0, a byte an element a microbatch
    layer = (float(none["memory_activations"]) - 2 * mask) / 32
    ckpt = 2.0 * s * h  # a recomputed layer's input, 16 bits
    assert float(one["memory_activations"]) == pytest.approx(2 * (ckpt + 15 * layer + mask),
                                                             rel=1e-12)
    assert layer - ckpt > 1e9  # the working set that is not added: over a gigabyte
