"""Fidelity regression: the shipped constants keep the error measured by benchmarks/fidelity.py.

The bars are the in-sample errors measured with the all-data fit on 2026-12-01
(benchmarks/results/fidelity.md) plus a small margin, NEMO2407's and NEMOLS's re-set on
2026-12-02 (04:13) when NeMo's GPT-3 and Nemotron-4 340B runs took the bf16 gradient
reduction their configs state (NEMO2407 3.8 -> 3.1 % mean, NEMOLS 4.7 -> 5.6 % max; at
05:18, with the configs' recompute too, 2.7 % and 5.1 %); MLM24's max re-set on
2026-12-02 (23:25) when the interleaved schedule hid its steady-state p2p exchanges
(overlap_p2p_comm): MLM24 8.8 -> 9.3 % max in sample while the published LOSO max fell
15.8 -> 14.9 %; every bar re-set on 2026-12-03 (12:55) when Hopper's GEMMs got their own
fitted plateau scale (hopper_gemm_scale): in sample, published 4.0 / 10.9 -> 3.5 / 11.9 %
(NAR21's max 10.9 -> 11.9, vTrain 8.4 / 32.0 -> 8.7 / 32.4; MLM24 4.4 / 9.3 -> 2.5 / 5.8,
NEMO2407 2.8 / 8.7 -> 1.9 / 5.2), the bars tightened to the new values plus the margin;
every bar re-set on 2026-12-03 (14:26) when vTrain's layouts took the full recompute their
artifact's configs state ("use_checkpoint": true): published 3.5 / 11.9 -> 3.7 / 12.6 %
(NAR21 5.0 / 11.9 -> 5.6 / 12.6, KOR22 3.6 / 7.2 -> 2.7 / 4.9, vTrain 8.7 / 32.4 -> 9.0 /
31.5); every bar re-set on 2026-12-04 (17:08) when ZeRO-3 without overlap_param_gather
blocked on its gathers ([29] of the model: NAR21's DeepSpeed runs): published 3.7 / 12.5 ->
3.6 / 10.0 % (NAR21 5.5 / 12.5 -> 5.5 / 10.0, MLM24 3.0 / 5.8 -> 2.5 / 5.9, vTrain 9.0 / 31.5
-> 8.8 / 31.5); MLM24's max re-set on 2026-12-05 (01:12) when each interleaved model chunk's
DP traffic was launched on its own ([17] of the model: 1/v of it exposed): MLM24 2.5 / 6.0 ->
2.8 / 6.8 % (its 119B run, 23 chunks of one layer, -1.4 -> -6.8 %), published 3.5 / 9.4 ->
3.5 / 9.0, NAR21 5.2 / 9.4 -> 5.1 / 9.0, LOSO max 9.7 -> 9.5 %. A change to the physics or the constants that makes the fit worse fails
here. The leave-one-source-out error of the published runs is held to the issue's targets.
"""

import sys
from pathlib import Path

import pytest

import scipy  # noqa: F401,E402  (the test extra has it: a missing scipy fails, never skips)
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import fidelity as F  # noqa: E402

#: source -> (mean APE bar [%], max APE bar [%]) of the shipped constants, in sample.
BARS = {"NAR21": (6.0, 10.5), "KOR22": (3.1, 5.6), "MLM24": (3.0, 7.3), "NEMO2407": (2.6, 4.5),
        "NEMOLS": (3.6, 4.6), "VTRAIN": (9.3, 33.0), "published_overall": (4.0, 10.5)}
# (VTRAIN's max bar 31.9 -> 33.0 on 2026-12-06: the refit after the TP-overlap, CP-ring and
# SP-launch fixes put its worst layout, a TP 8 one, at 32.5 %, from 31.5 %.)
#: Minimum Kendall tau over the 8 vTrain groups.
TAU_BAR = 0.86


@pytest.fixture(scope="module")
def table():
    runs, _ = F.load_runs()
    return F.score(runs, lambda r: F.megatron_predict(r, F.M.CONSTANTS))


def test_constants_are_the_stored_fit():
    assert F.M.CONSTANTS_PROVENANCE.get("data_sha256_16") == F.data_hash()


def test_error_stays_under_measured_bar(table):
    for src, (mean_bar, max_bar) in BARS.items():
        assert table[src]["mean_ape"] <= mean_bar, (src, table[src])
        assert table[src]["max_ape"] <= max_bar, (src, table[src])


def test_vtrain_ranking(table):
    assert min(table["VTRAIN"]["kendall_tau"]) >= TAU_BAR


def test_vtrain_by_tp_splits_every_layout_and_names_the_tp8_anomaly():
    # The README reads vTrain's in-sample max as a TP 8 layout, where vTrain measured one
    # sequence per microbatch slower than two: held here against the data and the fit.
    runs, _ = F.load_runs()
    got = F.vtrain_by_tp(runs, F.M.CONSTANTS)
    by_tp = got["by_tp"]
    assert sorted(by_tp) == [1, 2, 4, 8]
    assert sum(d["n"] for d in by_tp.values()) == 1440
    assert by_tp[8]["mean_signed"] < -15 and all(abs(by_tp[t]["mean_signed"]) < 7 for t in (1, 2, 4))
    assert by_tp[8]["max_ape"] == max(d["max_ape"] for d in by_tp.values())
    groups = got["tp8_per_layer_per_microbatch"]
    assert len(groups) == 8 and all(g["mbs1_ms"] > 1.1 * g["mbs2_ms"] for g in groups)


def test_every_vtrain_layout_fits_the_memory_it_ran_in():
    # vTrain's 1,440 layouts all ran on A100 40GB GPUs with full recompute: the model's
    # footprint of each stays under the device's 40,339 MiB. Without the recompute the
    # artifact's configs state, 6 of them (h2048, 20-24 layers, 8 sequences a microbatch,
    # no pipeline) came out over it, by up to 24 %.
    runs, _ = F.load_runs()
    mem = F.memory_check([r for r in runs if r.source == "VTRAIN"], F.M.CONSTANTS)["vtrain"]
    assert sum(g["n"] for g in mem) == 1440
    assert all(g["over"] == 0 for g in mem), mem
    assert 0.5 < max(g["max_ratio"] for g in mem) < 1.0


def test_every_published_layout_fits_the_memory_it_ran_in():
    # The 54 published runs ran, so `feasible` must not rule their layouts out. Nemotron-4
    # 340B on 128 H100 (FP8, no recompute) came out at 1.020 of the H100's 81,559 MiB until
    # the FP8 runs kept their linear layers' inputs in one byte, as Transformer Engine does
    # (megatron_memory [6]): 0.963 since, and 0.940 with its launcher config's dropout 0
    # (no masks stored; 2026-12-05).
    # One exception, known and bounded: NAR21's DeepSpeed ZeRO-3 run of the 530B model on 640
    # GPUs (TP 1, 4 sequences a microbatch, full recompute) comes out at 1.0015 since a
    # recomputed layer's working set is counted (16.1 GB here; 2026-12-06). The model
    # prefetches two whole layers as Megatron-FSDP does, 20.1 GB of this model's
    # 5.0e9-parameter layers, where DeepSpeed keeps at most stage3_max_live_parameters (1e9
    # by default) live: its buffers, not the working set, are what the model overstates.
    over_ok = {"NAR21-T2-Z3-529.6B-640": 1.01}
    runs, _ = F.load_runs()
    pub = F.memory_check([r for r in runs if r.source != "VTRAIN"], F.M.CONSTANTS)["published"]
    assert len(pub) == 54
    assert all(p["ratio"] <= over_ok.get(p["run_id"], 1.0) for p in pub), [p for p in pub if p["ratio"] > 1.0]
    top = max((p for p in pub if p["run_id"] not in over_ok), key=lambda p: p["ratio"])
    assert top["run_id"] == "NEMO2407-Nemotron-340B-128" and 0.93 < top["ratio"] < 0.95, top


def test_vtrain_pipelined_layouts_recompute_like_the_rest():
    # Priced with every stage recomputing, as Megatron-DeepSpeed's checkpointing does: a
    # pipeline 2 layout against its data parallel 2 twin costs what vTrain measured, and
    # vTrain's simulator's rule (no recompute on the last stage, so none without a
    # pipeline) would price it a third dearer than measured.
    runs, _ = F.load_runs()
    got = F.vtrain_pipeline_pairs(runs, F.M.CONSTANTS)
    m, every, rule = got["measured"], got["every_stage"], got["simulator_rule"]
    assert m["n"] == every["n"] == rule["n"] == 288
    assert 1.1 < m["median"] < 1.35
    assert abs(every["median"] / m["median"] - 1) < 0.06
    assert rule["median"] > 1.15 * m["median"]


def test_vtrain_vocabulary_is_padded_per_tp_as_megatron_pads_it():
    # GPT-2's 50,257 tokens to a multiple of 128 x TP (Megatron's _vocab_size_with_padding)
    assert [F.vtrain_vocab(tp) for tp in (1, 2, 4, 8)] == [50304, 50432, 50688, 51200]
    runs, _ = F.load_runs()
    vt = [r for r in runs if r.source == "VTRAIN"]
    assert sum(r.measured.size for r in vt) == 1440 and len({r.group for r in vt}) == 8
    for r in vt:
        tp = set(map(int, r.knobs["tp_size"]))
        assert len(tp) == 1 and r.workload.vocab_size == F.vtrain_vocab(tp.pop())


def test_vtrain_error_by_tp_and_microbatch_covers_every_layout():
    runs, _ = F.load_runs()
    cells = F.vtrain_by_tp(runs, F.M.CONSTANTS)["by_tp_and_microbatch"]
    assert sum(c["n"] for c in cells.values()) == 1440
    assert {(c["tp"], c["micro_batch_size"]) for c in cells.values()} == {
        (tp, m) for tp in (1, 2, 4, 8) for m in (1, 2, 4, 8)}
    # the README's reading: at TP 1 the model is slowest against the measurement at 8 sequences
    tp1 = [cells[f"1x{m}"]["mean_signed"] for m in (1, 2, 4, 8)]
    assert tp1 == sorted(tp1) and tp1[-1] > 10


def test_published_sources_left_out_meet_the_targets_and_the_saved_table():
    # Issue #14's targets for the leave-one-source-out error of the published runs: mean
    # <= 5 %, max <= 12 %; refitted here, equal to what benchmarks/results/fidelity.json
    # (which the README quotes) saved. Each fold's fit starts from the constants that file
    # saved for it (benchmarks/fidelity.py fits from the prior's two starts): where the model
    # has not moved it is the optimum already and the fit stops in a few iterations; where
    # it has, the fit moves to the new optimum and the errors, and this test, with it.
    import json

    import numpy as np

    runs, _ = F.load_runs()
    errs = []
    published = [s for s in F.SOURCES if s != "VTRAIN"]
    saved = json.loads((ROOT / "benchmarks" / "results" / "fidelity.json").read_text())
    starts = saved["loso"]["constants"]
    for src, c in F.loso_megatron_fits(runs, published, starts=starts).items():  # (two at once)
        errs += [float(F.ape(F.megatron_predict(r, c), r.measured)) for r in runs if r.source == src]
    assert len(errs) == 54
    assert np.mean(errs) <= 5.0 and max(errs) <= 12.0, (np.mean(errs), max(errs))
    saved = saved["loso"]["megatron"]["published_overall"]
    assert np.mean(errs) == pytest.approx(saved["mean_ape"], rel=1e-3)
    assert max(errs) == pytest.approx(saved["max_ape"], rel=1e-3)
