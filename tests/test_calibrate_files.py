"""The measurements CSV: columns read, bad lines refused with line and column; the CLI."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

import solver
import sweep
from solver.physics import megatron as M
from sweep.calibration import MeasurementError, predict, read_measurements
from sweep.cli import main

HEADER = "run_id,workload,fleet,batch_size,seq_len,tp_size,pp_size,dp_size,step_time_s"
GOOD = ["a,Llama3_8B_MC,EOS_H100_MC,128,4096,1,1,16,2.1",
        "b,Llama3_8B_MC,EOS_H100_MC,128,4096,2,1,8,2.3",
        "c,Llama3_8B_MC,EOS_H100_MC,128,4096,8,2,1,9.0"]


def _write(tmp_path, lines, name="runs.csv"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_file_is_read_with_defaults_hash_and_groups(tmp_path):
    path = _write(tmp_path, ["# my cluster, Nov 2026", HEADER, *GOOD])
    data = read_measurements(path)
    assert len(data) == 3 and data.run_ids == ["a", "b", "c"]
    assert [r.line for r in data.runs] == [3, 4, 5]
    assert data.runs[0].knobs["micro_batch_size"] == 1 and data.runs[0].knobs["recompute"] == "none"
    assert data.runs[2].n_accelerators == 16
    import hashlib
    assert data.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    [(workload, fleet, indices, knobs)] = data.groups()
    assert list(indices) == [0, 1, 2] and list(knobs["tp_size"]) == [1, 2, 8]
    # one solve prices the group as the solver prices each run
    wl, fl = solver.catalog.workload("Llama3_8B_MC"), solver.catalog.fleet("EOS_H100_MC")
    one = M.solve(wl, fl, batch_size=128, seq_len=4096, tp_size=8, pp_size=2, dp_size=1)
    assert predict(data, M.CONSTANTS)[2] == one["step_latency_total"]


def test_a_shape_and_tokens_per_second_are_read(tmp_path):
    path = _write(tmp_path, [
        "layers,hidden_dim,heads,kv_heads,ffn_hidden_dim,vocab_size,gated_mlp,tied_embeddings,node,"
        "num_gpus,tp_size,batch_size,seq_len,tokens_per_s_per_gpu",
        "32,4096,32,8,14336,128256,yes,no,DGX_H100_MC,16,2,64,8192,8000",
        "32,4096,32,8,14336,128256,yes,,DGX_H100_MC,16,2,64,8192,8000"])
    run, tied = read_measurements(path).runs
    assert run.knobs["dp_size"] == 8 and run.workload.gated_mlp and run.workload.kv_heads == 8
    assert run.step_time == pytest.approx(64 * 8192 / (8000 * 16))
    assert run.fleet.fabric.name == solver.catalog.fabric("InfiniBand_NDR").name
    # counted parameters of a Llama 3 8B shape (untied: embedding and output layer)
    assert run.workload.tied_embeddings is False
    assert run.workload.parameters == pytest.approx(8.03e9, rel=0.01)
    # Megatron-LM's default ties them: one vocabulary matrix fewer
    assert tied.workload.tied_embeddings is True
    assert run.workload.parameters - tied.workload.parameters == 128256 * 4096


def test_moe_and_latent_attention_shapes_are_read_and_counted(tmp_path):
    """An MoE shape is an MoE workload, its total and active parameters counted from the
    shape: Mixtral 8x7B's published 46.7B / 12.9B, DeepSeek-V2-Lite's (multi-head latent
    attention, queries projected directly) 15.7B."""
    cols = ("layers,hidden_dim,heads,kv_heads,ffn_hidden_dim,vocab_size,gated_mlp,tied_embeddings,"
            "experts,active_experts_per_token,moe_ffn_hidden_dim,shared_experts,dense_layers,"
            "kv_lora_rank,qk_nope_head_dim,qk_rope_head_dim,v_head_dim,node,num_gpus,ep_size,"
            "batch_size,seq_len,tokens_per_s_per_gpu")
    path = _write(tmp_path, [
        cols,
        "32,4096,32,8,14336,32000,yes,no,8,2,14336,,,,,,,DGX_H100_MC,64,8,256,4096,3000",
        "27,2048,16,,10944,102400,yes,no,64,6,1408,2,1,512,128,64,128,DGX_H100_MC,64,8,256,4096,9000"])
    mixtral, lite = read_measurements(path).runs
    assert mixtral.workload.kind == "moe" and lite.workload.kind == "moe"
    assert mixtral.workload.parameters == pytest.approx(46.7e9, rel=0.002)
    assert mixtral.workload.active_parameters == pytest.approx(12.9e9, rel=0.005)
    assert lite.workload.kv_lora_rank == 512 and lite.workload.q_lora_rank is None
    assert lite.workload.parameters == pytest.approx(15.7e9, rel=0.002)
    bad = _write(tmp_path, [cols, "27,2048,16,,10944,102400,yes,no,64,6,1408,2,1,512,128,64,,"
                                  "DGX_H100_MC,64,8,256,4096,9000"], name="bad.csv")
    with pytest.raises(MeasurementError, match=r"bad.csv line 2: expected a shape a model can "
                                               r"have.*v_head_dim must be a whole number >= 1"):
        read_measurements(bad)


@pytest.mark.parametrize("line, message", [
    ("d,Llama3_8B_MC,EOS_H100_MC,128,4096,x,1,16,2.0",
     "runs.csv line 5, column tp_size: expected a whole number >= 1, but got 'x'"),
    ("d,Llama3_8B_MC,EOS_H100_MC,128,4096,1.5,1,16,2.0",
     "runs.csv line 5, column tp_size: expected a whole number >= 1, but got '1.5'"),
    ("d,Llama3_8B_MC,EOS_H100_MC,128,4096,1,1,16,-2",
     "runs.csv line 5, column step_time_s: expected a positive number, but got '-2'"),
    ("d,Llama3_8B_MC,EOS_H100_MC,128,4096,1,1,16,",
     "runs.csv line 5, column step_time_s: expected exactly one of step_time_s, "
     "tokens_per_s_per_gpu, but got 'neither'"),
    ("d,Llama3_8X_MC,EOS_H100_MC,128,4096,1,1,16,2.0",
     "runs.csv line 5, column workload: expected a catalog name"),
    ("d,Llama3_8B_MC,EOS_H100_M,128,4096,1,1,16,2.0",
     "runs.csv line 5, column fleet: expected a catalog name (python -m sweep catalog fleets "
     "lists them), but got 'EOS_H100_M'; did you mean 'EOS_H100_MC'?"),
    ("d,Llama3_8B_MC,EOS_H100_MC,100,4096,1,1,16,2.0",
     "runs.csv line 5: expected a layout Megatron-Core can run (whole microbatches"),
    ("d,Llama3_8B_MC,EOS_H100_MC,128,4096,1,1,16",
     "runs.csv line 5: expected 9 cells (one per column of the header), but got '8 cells'"),
])
def test_a_bad_line_is_refused_with_its_line_and_column(tmp_path, line, message):
    path = _write(tmp_path, [HEADER, *GOOD, line])
    with pytest.raises(MeasurementError) as err:
        read_measurements(path)
    assert str(err.value).startswith(str(tmp_path / "runs.csv") + " line")
    assert message in str(err.value)


def test_a_dropout_column_is_read_as_a_probability(tmp_path):
    """``hidden_dropout`` and ``attention_dropout`` are numbers from 0 to 1 (Megatron-Core's
    probabilities), not names: a column of them is read, an empty cell takes 0.1, and a
    value outside [0, 1] is refused with its line and column."""
    head = "workload,fleet,batch_size,seq_len,tp_size,pp_size,dp_size,hidden_dropout,step_time_s"
    rows = ["Llama3_8B_MC,EOS_H100_MC,128,4096,1,1,16,0.0,2.0",
            "Llama3_8B_MC,EOS_H100_MC,128,4096,1,1,16,,2.0"]
    a, b = read_measurements(_write(tmp_path, [head, *rows])).runs
    assert a.knobs["hidden_dropout"] == 0.0 and b.knobs["hidden_dropout"] == 0.1
    assert a.knobs["attention_dropout"] == 0.1
    bad = _write(tmp_path, [head, rows[0].replace(",0.0,", ",1.5,")], name="bad.csv")
    with pytest.raises(MeasurementError, match=r"bad.csv line 2, column hidden_dropout: "
                       r"expected a number from 0 to 1, but got '1.5'"):
        read_measurements(bad)
    # Python's float reads "0_1" as 1.0: a number cell with an underscore is refused
    typo = _write(tmp_path, [head, rows[0].replace(",0.0,", ",0_1,")], name="typo.csv")
    with pytest.raises(MeasurementError, match=r"column hidden_dropout: expected a number "
                       r"from 0 to 1, but got '0_1'"):
        read_measurements(typo)
    typo = _write(tmp_path, [head, rows[0].replace(",128,", ",1_28,")], name="typo2.csv")
    with pytest.raises(MeasurementError, match=r"column batch_size: expected a whole number"):
        read_measurements(typo)


def test_a_bad_header_is_refused(tmp_path):
    with pytest.raises(MeasurementError, match=r"runs.csv line 1, column tp: expected a column of "
                       r"the measurements format \(did you mean 'tp_size'\?\), but got 'tp'"):
        read_measurements(_write(tmp_path, [HEADER.replace("tp_size", "tp"), *GOOD]))
    with pytest.raises(MeasurementError, match="line 1: expected a column step_time_s or "
                       "tokens_per_s_per_gpu"):
        read_measurements(_write(tmp_path, [HEADER.replace(",step_time_s", ""),
                                            *[g.rsplit(",", 1)[0] for g in GOOD]]))
    with pytest.raises(MeasurementError, match="expected a header line"):
        read_measurements(_write(tmp_path, ["# nothing"]))


def test_num_gpus_must_agree_with_the_layout(tmp_path):
    path = _write(tmp_path, ["workload,fleet,tp_size,dp_size,num_gpus,batch_size,step_time_s",
                             "Llama3_8B_MC,EOS_H100_MC,2,8,12,64,1.0"])
    with pytest.raises(MeasurementError, match=r"line 2, column num_gpus: expected tp_size \* "
                       r"pp_size \* cp_size \* dp_size = 16, but got '12'"):
        read_measurements(path)


# ---------------------------------------------------------------- CLI

def test_cli_calibrate_prints_the_fit_saves_and_plots(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    rows = [f"r{i},Llama3_8B_MC,EOS_H100_MC,128,4096,{tp},{pp},{dp},1e4"  # placeholder times
            for i, (tp, pp, dp) in enumerate([(1, 1, 16), (2, 1, 8), (8, 2, 1), (4, 1, 4),
                                              (1, 2, 8), (8, 1, 2)])]
    data = read_measurements(_write(tmp_path, [HEADER, *rows]))
    steps = predict(data, dict(M.CONSTANTS, gemm_scale=0.6, step_overhead=0.1))
    path = _write(tmp_path, [HEADER] + [r.rsplit(",", 1)[0] + f",{float(s)!r}" for r, s in zip(rows, steps)])
    code = main(["calibrate", str(path), "-o", str(tmp_path / "p.toml"), "--no-loo",
                 "--free", "gemm_scale,step_overhead", "--plot", str(tmp_path / "cal.png"),
                 "--prior-width", "inf"])
    out = capsys.readouterr().out
    assert code == 0
    assert "gemm_scale" in out and "step_overhead" in out and "r5" in out
    profile = sweep.load_profile(tmp_path / "p.toml")
    assert profile.constants["gemm_scale"] == pytest.approx(0.6, rel=1e-3)
    assert profile.prior_width == {"gemm_scale": math.inf, "step_overhead": math.inf}
    # the default prior moves the fit a little (step_overhead is pulled toward its start,
    # 0.005, and gemm_scale makes up for it), within a few per cent
    capsys.readouterr()
    assert main(["calibrate", str(path), "-o", str(tmp_path / "q.toml"), "--no-loo",
                 "--free", "gemm_scale,step_overhead"]) == 0
    pulled = sweep.load_profile(tmp_path / "q.toml")
    # the fit table gives one standard deviation as a range in log space too
    out = capsys.readouterr().out
    assert "1-sd range" in out.splitlines()[1]
    row = next(line.split() for line in out.splitlines() if line.split()[:1] == ["gemm_scale"])
    c, s = pulled.constants["gemm_scale"], pulled.uncertainty["gemm_scale"] / pulled.constants["gemm_scale"]
    assert row[4] == f"{c * math.exp(-s):.3g}-{c * math.exp(s):.3g}"
    assert pulled.constants["gemm_scale"] == pytest.approx(0.6, rel=0.05)
    assert pulled.constants["gemm_scale"] != pytest.approx(0.6, rel=1e-3)
    assert pulled.prior_width == {"gemm_scale": 0.3, "step_overhead": 2.0}
    assert main(["calibrate", str(path), "--no-loo", "--prior-width", "-1"]) == 2
    assert main(["calibrate", str(path), "--no-loo", "--free", "auto"]) == 2
    capsys.readouterr()
    # --free auto: the steps of the choice, then the fit of what it chose
    assert main(["calibrate", str(path), "--free", "auto"]) == 0
    out = capsys.readouterr().out
    assert "free auto: nothing free (the start constants): leave-one-out error" in out
    chosen = [line for line in out.splitlines() if line.startswith("free auto: ")][-1]
    assert "gemm_scale" in chosen
    assert (tmp_path / "cal.png").stat().st_size > 1000
    # scoring the saved profile, no fit
    assert main(["calibrate", str(path), "--calibration", str(tmp_path / "p.toml")]) == 0
    assert "mean absolute error 0.00 %" in capsys.readouterr().out


def test_cli_refuses_a_bad_file_in_one_line(tmp_path, capsys):
    path = _write(tmp_path, [HEADER, GOOD[0].replace(",1,1,16,", ",x,1,16,")])
    assert main(["calibrate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("runs.csv line 2, column tp_size: expected a whole number >= 1, "
                        "but got 'x'")
    assert "\n" not in err


def test_a_fit_without_scipy_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    """scipy is an extra (``fidelity``): a plain install that calibrates is told, in one line
    and before any work, how to get it; scoring a saved profile does not need it."""
    path = _write(tmp_path, [HEADER, *GOOD])
    monkeypatch.setitem(sys.modules, "scipy", None)  # as without the extra
    assert main(["calibrate", str(path), "--no-loo"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("calibrate: expected scipy to be installed for the fit (pip install "
                        "'layout-sweep[fidelity]', or pip install scipy), but it is not")
    assert "\n" not in err
    with pytest.raises(ImportError, match=r"a calibration fit needs scipy \(pip install "
                                          r"'layout-sweep\[fidelity\]'"):
        sweep.calibrate(path, loo=False)


def test_plot_calibration_draws_the_identity_line():
    pytest.importorskip("matplotlib")
    from sweep import plot

    figure = plot.calibration([1.0, 2.0, 4.0], [1.1, 1.9, 4.4], labels=["a", "b", "c"],
                              uncalibrated=[1.3, 2.5, 5.0])
    ax = figure.axes[0]
    identity = ax.lines[0]
    assert np.allclose(identity.get_xdata(), identity.get_ydata())
    assert ax.get_xscale() == "log"
    with pytest.raises(ValueError, match="1-D of one length"):
        plot.calibration([1.0, 2.0], [1.0])


def test_impossible_steps_and_repeated_names_are_refused(tmp_path):
    """A step faster than the accelerators' dense peak allows cannot have been measured
    (Llama 3 70B, 512 x 8192 tokens on 64 H100 in 11.2 s is MFU 2.5); two lines of one name
    would be one row of the residual table."""
    header = "run_id,workload,fleet,tp_size,pp_size,dp_size,batch_size,seq_len,precision,step_time_s"
    fast = _write(tmp_path, [header, "a,Llama3_70B_MC,EOS_H100_MC,8,4,2,512,8192,bf16,11.2"])
    with pytest.raises(MeasurementError, match=r"runs.csv line 2, column step_time_s: expected a "
                                               r"step the accelerators can run .* got 11\.2 s, "
                                               r"which is 2\.\d\dx that peak"):
        read_measurements(fast)
    ok = read_measurements(_write(tmp_path, [header, "a,Llama3_70B_MC,EOS_H100_MC,8,4,2,512,8192,bf16,84.6"]))
    assert ok.runs[0].step_time == 84.6
    twice = _write(tmp_path, [HEADER, GOOD[0], GOOD[1].replace("b,", "a,", 1)])
    with pytest.raises(MeasurementError, match=r"line 3, column run_id: expected a name no other "
                                               r"line has, but got 'a' \(also line 2\)"):
        read_measurements(twice)


def test_shipped_h100_measurements_are_the_benchmarks_records(tmp_path):
    # benchmarks/data/h100_measurements.csv (the notebook's calibration data) is derived
    # from the published runs, with the choice rule's picks under the shipped constants:
    # a physics or fit change that moves a pick must rewrite it (bench_calibrate.py
    # --write-measurements), or the notebook calibrates layouts the benchmarks do not.
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "benchmarks"))
    import bench_calibrate
    fresh = tmp_path / "h100.csv"
    bench_calibrate.write_measurements(fresh)
    shipped = root / "benchmarks" / "data" / "h100_measurements.csv"
    assert fresh.read_text() == shipped.read_text()
    assert len(read_measurements(shipped)) == 27


def test_cli_refuses_a_directory_as_the_profile_before_the_fit(tmp_path, capsys):
    path = _write(tmp_path, [HEADER, *GOOD])
    (tmp_path / "out").mkdir()
    assert main(["calibrate", str(path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"-o: expected a file, but got the directory {str(tmp_path / 'out')!r}")


def test_a_column_of_the_mlsysim_model_says_what_the_megatron_model_takes(tmp_path):
    """The close-match hint had sent microbatch_count to micro_batch_size (another quantity)."""
    from sweep.calibration import MeasurementError, read_measurements

    path = _write(tmp_path, [HEADER + ",microbatch_count", GOOD[0] + ",8"])
    with pytest.raises(MeasurementError, match=r"column microbatch_count: .* \('microbatch_count' "
                                               r"is a knob of the mlsysim model; .* follows from "
                                               r"batch_size, dp_size and micro_batch_size"):
        read_measurements(path)


def test_a_cell_over_two_lines_keeps_the_line_numbers_right(tmp_path):
    """A quoted run_id over two lines had put every later line's number off by one."""
    from sweep.calibration import MeasurementError, read_measurements

    good = GOOD[0].split(",", 1)[1]
    path = _write(tmp_path, [HEADER, f'"r0\nx",{good}', f"r1,{good}",
                             "r2," + good.replace(",1,1,16,", ",8x,1,16,")])
    with pytest.raises(MeasurementError, match=r"runs\.csv line 5, column tp_size: expected a "
                                               r"whole number >= 1, but got '8x'"):
        read_measurements(path)


def _measured(tmp_path, layouts, repeats=1, skew=0.0):
    """A measurements file of ``layouts`` (tp, pp, dp) priced by the model at a changed
    gemm_scale, each layout ``repeats`` times; ``skew``: the odd layouts that much slower,
    the even ones faster (runs the model cannot fit all at once)."""
    rows = [f"r{i}_{k},Llama3_8B_MC,EOS_H100_MC,128,4096,{tp},{pp},{dp},1e4"
            for i, (tp, pp, dp) in enumerate(layouts) for k in range(repeats)]
    data = read_measurements(_write(tmp_path, [HEADER, *rows]))
    steps = predict(data, dict(M.CONSTANTS, gemm_scale=0.6))
    sign = [1 if i % 2 else -1 for i in range(len(layouts)) for _ in range(repeats)]
    return _write(tmp_path, [HEADER] + [r.rsplit(",", 1)[0] + f",{float(s) * (1 + skew * g)!r}"
                                        for r, s, g in zip(rows, steps, sign)])


def test_the_profile_or_cube_written_may_not_replace_the_files_read(tmp_path, capsys):
    # -o on the measurements file had replaced them with the profile (exit 0); the same
    # for a spec file given to run -o
    path = _measured(tmp_path, [(1, 1, 16), (2, 1, 8)])
    before = path.read_text()
    assert main(["calibrate", str(path), "-o", str(path), "--no-loo"]) == 2
    assert "is the file this command reads" in capsys.readouterr().err
    assert path.read_text() == before
    spec = tmp_path / "s.toml"
    spec.write_text('workload = "Llama3_70B"\nfleet = "Training_1K"\n[axes]\ntp_size = [4, 8]\n'
                    '[fixed]\nbatch_size = 1024\n')
    assert main(["run", str(spec), "-o", str(spec), "--no-progress"]) == 2
    assert "is the file this command reads" in capsys.readouterr().err
    assert spec.read_text().startswith("workload")


def test_scoring_a_profile_refuses_the_fits_options_and_names_other_hardware(tmp_path, capsys):
    path = _measured(tmp_path, [(1, 1, 16), (2, 1, 8), (8, 2, 1)])
    assert main(["calibrate", str(path), "-o", str(tmp_path / "p.toml"), "--no-loo"]) == 0
    capsys.readouterr()
    # -o, --free, --noise were silently dropped when scoring
    assert main(["calibrate", str(path), "--calibration", str(tmp_path / "p.toml"), "-o",
                 str(tmp_path / "q.toml"), "--noise", "0.05"]) == 2
    err = capsys.readouterr().err
    assert "fits nothing, so -o, --noise would do nothing" in err
    assert not (tmp_path / "q.toml").exists()
    # runs on an A100 fleet scored with a profile of H100 runs: said, not silent
    a100 = _write(tmp_path, [HEADER, *(line.replace("EOS_H100_MC", "Selene_MC").rsplit(",", 1)[0]
                                      + f",{3 * float(line.rsplit(',', 1)[1])!r}"
                                      for line in path.read_text().splitlines()[1:])], "a100.csv")
    assert main(["calibrate", str(a100), "--calibration", str(tmp_path / "p.toml")]) == 0
    assert "but these runs are on" in capsys.readouterr().out


def test_leave_one_out_leaves_out_a_layout_with_its_repeats(tmp_path, capsys):
    # The same layouts measured three times each: leaving out one row let its repeats
    # predict it (an audit's 2.73 % against 3.93 % for the layouts once each); a file of one
    # layout five times reported 0.02 %
    from sweep.calibration.core import layout_groups

    once = read_measurements(_measured(tmp_path, [(1, 1, 16), (2, 1, 8), (8, 2, 1), (4, 1, 4)]))
    thrice = read_measurements(_measured(tmp_path, [(1, 1, 16), (2, 1, 8), (8, 2, 1), (4, 1, 4)],
                                         repeats=3, skew=0.08))
    assert len(layout_groups(thrice)) == 4
    free = ["gemm_scale", "step_overhead"]
    b = sweep.calibrate(thrice, free=free, loo=True)
    # the first layout's three runs: predicted by a fit of the other layouts' nine alone
    rest = sweep.calibrate(thrice.subset(list(range(3, 12))), free=free, loo=False)
    want = predict(thrice.subset([0, 1, 2]), rest.profile.constants)
    np.testing.assert_allclose(b.loo_predicted[:3], want, rtol=1e-4)
    assert len(set(b.loo_predicted[:3])) == 1
    assert len(layout_groups(once)) == 4
    one = _measured(tmp_path, [(2, 1, 8)], repeats=5)
    assert main(["calibrate", str(one), "--free", "gemm_scale"]) == 0
    assert "leave-one-out needs two layouts or more" in capsys.readouterr().out


def test_a_profile_list_given_as_a_string_and_an_mlsysim_profile_are_refused(tmp_path):
    path = _measured(tmp_path, [(1, 1, 16), (2, 1, 8)])
    cal = sweep.calibrate(read_measurements(path), free=["gemm_scale"], loo=False)
    cal.save(tmp_path / "p.toml")
    text = (tmp_path / "p.toml").read_text()
    bad = tmp_path / "bad.toml"
    import re

    bad.write_text(re.sub(r"^accelerators = \[.*\]$", 'accelerators = "NVIDIA H100"', text,
                          flags=re.M))
    with pytest.raises(sweep.calibration.ProfileError,
                       match=r"calibration.accelerators: expected a list of strings"):
        sweep.load_profile(bad)
    mls = tmp_path / "mls.toml"
    mls.write_text(text.replace('physics = "megatron"', 'physics = "mlsysim"'))
    with pytest.raises(sweep.calibration.ProfileError, match="has no fitted constants"):
        sweep.load_profile(mls)
    with pytest.raises(ValueError, match="noise must be a finite positive number"):
        sweep.calibrate(read_measurements(path), free=["gemm_scale"], loo=False, noise=math.inf)


def test_a_semicolon_separated_file_says_so(tmp_path):
    path = _write(tmp_path, [HEADER.replace(",", ";"), GOOD[0].replace(",", ";")])
    with pytest.raises(MeasurementError, match=r"line 1: expected columns separated by commas, "
                                               r"but got one column holding ;-separated names"):
        read_measurements(path)


def test_a_parameter_count_far_from_the_shapes_is_refused(tmp_path):
    # the megatron physics prices the shape's own count (1.48e9 here: no GQA, a plain MLP);
    # 1000x it (a unit slip) had been read without a word, and priced the same as the right
    # count
    head = "run_id,layers,hidden_dim,heads,ffn_hidden_dim,vocab_size,parameters,fleet," \
           "batch_size,seq_len,tp_size,pp_size,dp_size,step_time_s"
    row = "a,24,2048,16,8192,131072,{},EOS_H100_MC,128,4096,1,1,16,2.5"
    ok = read_measurements(_write(tmp_path, [head, row.format("1.7e9")]))  # 15 % off: a check
    assert len(ok) == 1
    with pytest.raises(MeasurementError, match=r"line 2, column parameters: expected about the "
                                               r"shape's own count, 1.476e\+09"):
        read_measurements(_write(tmp_path, [head, row.format("1.7e12")], "bad.csv"))


def test_a_knob_column_left_empty_on_some_runs_is_named(tmp_path):
    """An empty cell takes the knob's default, as documented; a column filled on some runs
    and empty on others is most likely a slip, and a pp_size left empty had been fitted as
    PP 1 without a word."""
    lines = [HEADER, *GOOD[:2], "c,Llama3_8B_MC,EOS_H100_MC,128,4096,8,,2,9.0"]
    with pytest.warns(sweep.calibration.CalibrationWarning,
                      match=r"runs\.csv: column pp_size is empty on line 4 \(1 of 3 runs\), "
                            r"which take its default \(1\)") as caught:
        data = read_measurements(_write(tmp_path, lines))
    assert data.runs[2].knobs["pp_size"] == 1 and caught[0].filename == __file__
    with pytest.warns(sweep.calibration.CalibrationWarning, match="column pp_size") as caught:
        sweep.calibrate(_write(tmp_path, lines), free=["gemm_scale"], loo=False)
    assert caught[0].filename == __file__  # through calibrate too, not core.py
    # a column empty on every run, dp_size empty beside num_gpus, or a dropout stated only
    # where a run set it (the shipped H100 file), is no slip
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", sweep.calibration.CalibrationWarning)
        read_measurements(Path(__file__).resolve().parents[1] / "benchmarks" / "data"
                          / "h100_measurements.csv")
        read_measurements(_write(tmp_path, [HEADER + ",recompute",
                                            *(g + "," for g in GOOD)], "all.csv"))
        read_measurements(_write(tmp_path, [
            "run_id,workload,fleet,batch_size,seq_len,tp_size,num_gpus,dp_size,step_time_s",
            "a,Llama3_8B_MC,EOS_H100_MC,128,4096,1,16,,2.1",
            "b,Llama3_8B_MC,EOS_H100_MC,128,4096,2,,8,2.3"], "either.csv"))


def test_a_workload_that_is_no_transformer_is_refused_with_its_line(tmp_path):
    """The megatron physics refuses a CNN or an SSM; a runs file naming one is refused at its
    line and column, not with the solver's traceback."""
    path = _write(tmp_path, [HEADER, GOOD[0], GOOD[1].replace("Llama3_8B_MC", "ResNet50")])
    with pytest.raises(MeasurementError, match=r"runs.csv line 3, column workload: expected a "
                       r"transformer \(kind 'transformer' or 'moe': the megatron physics, which "
                       r"calibrate fits, prices transformers only\), but got 'ResNet50', of "
                       r"kind 'cnn'"):
        read_measurements(path)
