"""The command line (``layout-sweep`` / ``python -m sweep``): each command once, every bad input.

Commands run in-process through ``sweep.cli.main`` (fast); ``--help`` and the
main job also run as real subprocesses. Everything works on a 64-layout spec.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import solver
import sweep
from sweep import cli, grid

MAIN = str(Path(__file__).resolve().parents[1])
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

#: 4 x 4 x 2 x 2 = 64 layouts of Llama3_70B on 1024 H100s.
TINY = """\
name = "tiny"
workload = "Llama3_70B"
fleet = "Training_1K"
outputs = ["mfu", "step_latency_total", "memory_footprint", "effective_throughput", "feasible"]

[axes]
tp_size = [1, 2, 4, 8]
pp_size = [1, 2, 4, 8]
microbatch_count = [8, 16]
zero_stage = [1, 3]

[fixed]
batch_size = 1024

[constraints]
memory_limit = "72 GB"
"""


@pytest.fixture(autouse=True)
def _fixed_date(monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1764460800")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The tiny spec and its cube, made once with ``run``."""
    root = tmp_path_factory.mktemp("cli")
    spec = root / "tiny.toml"
    spec.write_text(TINY)
    cube = root / "tiny.nc"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SOURCE_DATE_EPOCH", "1764460800")
        assert cli.main(["run", str(spec), "-o", str(cube), "--no-progress"]) == 0
    return {"root": root, "spec": spec, "cube": cube}


def _call(capsys, argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = MAIN + os.pathsep + env.get("PYTHONPATH", "")
    return env


# ----------------------------------------------------------------------------- subprocesses


def test_help_runs_as_a_module():
    done = subprocess.run([sys.executable, "-m", "sweep", "--help"], capture_output=True,
                          text=True, env=_env(), cwd="/tmp", timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m sweep")
    for command in ("run", "search", "top", "show", "catalog", "plot"):
        assert command in done.stdout


def test_main_job_runs_as_a_module(files, tmp_path):
    done = subprocess.run([sys.executable, "-m", "sweep", "--spec", str(files["spec"])],
                          capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "64 layouts priced" in out
    assert "Best layout of each parallel split" in out
    assert "Why #1 wins: #2 (" in out
    assert "Where #1's step goes: " in out
    saved = tmp_path / cli.DEFAULT_CUBE
    assert f"wrote {cli.DEFAULT_CUBE}" in out and saved.exists()
    assert int(sweep.open_cube(saved)["admissible"].sum()) > 0


# ----------------------------------------------------------------------------- the main job


def test_main_job_in_process_without_saving(files, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = _call(capsys, ["--spec", files["spec"], "--no-save", "-k", "3"])
    assert code == 0, err
    assert "cube not saved" in out and not (tmp_path / cli.DEFAULT_CUBE).exists()
    table = out.split("Best layout of each parallel split")[1]
    assert "(3 shown)" in table
    # rows 1..3 of the table, best first; MFU column read back and compared with the cube
    cube = sweep.open_cube(files["cube"])
    best = float(cube["mfu"].where(cube["admissible"]).max())
    assert f"{best:.4f}" in table


def test_main_job_prints_a_limit_of_whole_gib_in_gb_and_gib(files, tmp_path, monkeypatch, capsys):
    # the tiny spec's 72 GB stays "72 GB"; without a limit it is the H100's 80 GiB, which
    # printed as a bare "86 GB" (a datasheet's 80 misread)
    monkeypatch.chdir(tmp_path)
    code, out, err = _call(capsys, ["--spec", files["spec"], "--no-save", "-k", "1"])
    assert code == 0, err
    assert "memory <= 72 GB" in out
    nolimit = tmp_path / "nolimit.toml"
    nolimit.write_text(TINY.split("[constraints]")[0])
    code, out, err = _call(capsys, ["--spec", nolimit, "--no-save", "-k", "1"])
    assert code == 0, err
    assert "memory <= 85.9 GB = 80 GiB" in out


def test_default_spec_is_the_shipped_one():
    assert cli.DEFAULT_SPEC.exists()
    assert sweep.load_spec(cli.DEFAULT_SPEC).name == "default"


def test_step_components_sum_to_the_step():
    spec = sweep.load_spec(TINY_DICT)
    wl, fl, knobs = grid.point(spec, {"tp_size": 8, "pp_size": 4, "microbatch_count": 16,
                                      "zero_stage": 1})
    out = solver.solve(wl, fl, **knobs, overlap_comm=True, straggler_factor=1.1)
    parts = cli.step_components(out, 1.1)
    assert sum(parts.values()) == pytest.approx(float(out["step_latency_total"]), rel=1e-12)
    assert parts["pipeline bubble"] > 0 and parts["EP communication"] == 0


@pytest.mark.parametrize("workload, knobs", [
    ("Llama3_70B_MC", dict(batch_size=512, seq_len=4096, tp_size=8, pp_size=4, dp_size=8,
                           v_stages=5, sequence_parallel=True, cp_size=2, zero_stage=1)),
    ("Llama3_8B_MC", dict(batch_size=256, seq_len=4096, tp_size=8, cp_size=2, dp_size=2,
                          sequence_parallel=True)),  # launch-bound: launch time > 0
    ("Mixtral_8x7B_MC", dict(batch_size=256, seq_len=4096, tp_size=2, pp_size=4, ep_size=4,
                             dp_size=8, v_stages=2, sequence_parallel=True,
                             overlap_moe_expert_parallel_comm=True)),
])
def test_step_components_of_the_megatron_physics(workload, knobs):
    """step_components raised KeyError 'node_latency' on the megatron physics' outputs: it
    takes its own terms, launch time and the fixed step overhead, which sum to the step."""
    from solver.physics import megatron as M

    out = solver.solve(workload, "HGX_H100_1K_MC", physics="megatron", **knobs)
    assert bool(out["valid"]) and bool(out["realizable"])
    parts = sweep.step_components(out)
    assert parts == sweep.step_components(out, physics="megatron")
    assert list(parts) == [name for name, _ in sweep.analysis.explain.MEGATRON_TERMS] + [
        "launch", "step overhead"]
    assert sum(parts.values()) == pytest.approx(float(out["step_latency_total"]), rel=1e-12)
    for name, key in sweep.analysis.explain.MEGATRON_TERMS + (("launch", "launch_latency"),):
        assert parts[name] == float(out[key])
    assert parts["step overhead"] == pytest.approx(M.CONSTANTS["step_overhead"], rel=1e-9)
    assert parts["compute"] > 0 and parts["TP communication"] > 0
    assert (parts["launch"] > 0) == (workload == "Llama3_8B_MC")
    assert (parts["EP communication"] > 0) == (workload == "Mixtral_8x7B_MC")
    # a calibrated overhead is the step's rest as well
    slow = solver.solve(workload, "HGX_H100_1K_MC", physics="megatron", step_overhead=0.25,
                        **knobs)
    assert sweep.step_components(slow)["step overhead"] == pytest.approx(0.25, rel=1e-9)


def test_step_components_say_what_they_cannot_split():
    spec = {"workload": "Llama3_8B_MC", "fleet": "HGX_H100_1K_MC",
            "physics": ["mlsysim", "megatron"], "axes": {"tp_size": [2, 8]},
            "fixed": {"batch_size": 256, "dp_size": 4}}
    cube = sweep.run(spec)
    for model in ("mlsysim", "megatron"):  # a physics axis' row holds both models' outputs
        row = {name: cube[name].sel(physics=model, tp_size=8).item() for name in cube.data_vars}
        parts = sweep.step_components(row)
        assert sum(parts.values()) == pytest.approx(row["step_latency_total"], rel=1e-6)
        assert ("replica compute" in parts) == (model == "mlsysim")
    out = solver.solve("Llama3_8B_MC", "HGX_H100_1K_MC", physics="megatron", batch_size=256)
    with pytest.raises(ValueError, match=r"no straggler factor, so expected straggler_factor=1, "
                                         r"but got 1.1"):
        sweep.step_components(out, straggler_factor=1.1)
    with pytest.raises(ValueError, match=r"expected the mlsysim physics' outputs .*, but "
                                         r"node_latency is missing"):
        sweep.step_components(out, physics="mlsysim")
    with pytest.raises(ValueError, match="physics must be one of"):
        sweep.step_components(out, physics="megatorn")
    with pytest.raises(ValueError, match=r"expected one layout's solver.solve outputs .* but "
                                         r"got neither"):
        sweep.step_components({"mfu": 0.5})


def test_explain_runner_up_names_the_changes_and_terms():
    spec = sweep.load_spec(TINY_DICT)
    winner = {"tp_size": 8, "pp_size": 4, "microbatch_count": 16, "zero_stage": 1}
    runner = {"tp_size": 8, "pp_size": 8, "microbatch_count": 16, "zero_stage": 1}
    line = cli.explain_runner_up(spec, winner, runner)
    assert "pp_size 4->8" in line and "tp_size" not in line.split(")")[0]
    assert "pipeline bubble" in line and "\n" not in line


def test_explain_runner_up_calls_a_tie_a_tie():
    # Two splits that give each rank the same tokens (cp 2 x 1 sequence, cp 4 x 2) price the
    # same in the megatron physics (at 16k tokens each ring step's K/V hides under its share
    # of the attention in both; at 8k cp 4's does not): the main job printed "Why #1 wins:
    # #2 ... has 0.0% lower MFU ... no step-time term differs".
    spec = sweep.load_spec({
        "workload": "Llama3_70B_MC", "fleet": "HGX_H100_1K_MC", "physics": "megatron",
        "axes": {"cp_size": [2, 4], "micro_batch_size": [1, 2]},
        "fixed": {"batch_size": 1024, "seq_len": 16384, "tp_size": 4, "pp_size": 4,
                  "v_stages": 4, "sequence_parallel": True, "recompute": "none",
                  "zero_stage": 1, "tp_comm_overlap": True, "precision": "bf16"}})
    a, b = {"cp_size": 2, "micro_batch_size": 1}, {"cp_size": 4, "micro_batch_size": 2}
    pa, pb = (solver.solve(*grid.point(spec, p)[:2], **grid.point(spec, p)[2]) for p in (a, b))
    assert float(pa["mfu"]) == float(pb["mfu"]) and float(pa["step_latency_total"]) == float(
        pb["step_latency_total"])
    line = cli.explain_runner_up(spec, a, b)
    assert line.startswith("#1 and #2 (cp_size 2->4, micro_batch_size 1->2) tie: ")
    assert "wins:" not in line and "neither wins" in line
    # one sequence more per microbatch at cp 2 is not a tie
    line = cli.explain_runner_up(spec, a, {"cp_size": 2, "micro_batch_size": 2})
    assert line.startswith("Why #1 wins: #2 (micro_batch_size 1->2) has ")


def test_why_one_wins_and_where_the_step_goes_price_with_the_specs_calibration():
    """The main job's explanations price the two layouts again: with the spec's calibration
    profile, as the cube was (without it, an audit's profile of a 2 s step overhead
    was left out of the shares and the runner-up's gap read 7.3 % where the table's was 2.1 %)."""
    import tomllib

    from sweep.analysis import explain
    from sweep.calibration.profile import Profile, with_calibration

    shipped = tomllib.loads((Path(__file__).resolve().parent.parent / "configs" / "physics" /
                             "megatron.toml").read_text())["constants"]
    profile = Profile(physics="megatron", constants={**shipped, "step_overhead": 2.0,
                                                      "gemm_scale": 0.6}, path="audit.toml")
    spec = with_calibration(sweep.load_spec({
        "workload": "Llama3_70B_MC", "fleet": "HGX_H100_1K_MC", "physics": "megatron",
        "axes": {"tp_size": [4, 8], "pp_size": [4, 8]},
        "fixed": {"batch_size": 1024, "seq_len": 4096, "micro_batch_size": 1,
                  "sequence_parallel": True, "precision": "bf16"}}), profile)
    cube = sweep.run(spec)
    layout = {"tp_size": 8, "pp_size": 4}
    again = explain._price(spec, layout)
    assert again["step_latency_total"] == pytest.approx(
        float(cube["step_latency_total"].sel(layout)), rel=1e-6)  # the cube is float32
    assert again["step_latency_total"] > 2.0
    line = sweep.where_step_goes(spec, layout)
    assert "compute" in line


@pytest.mark.parametrize("physics", ["mlsysim", "megatron"])
def test_where_step_goes_gives_the_shares_of_the_step(physics):
    if physics == "mlsysim":
        spec = sweep.load_spec(TINY_DICT)
        layout = {"tp_size": 8, "pp_size": 4, "microbatch_count": 16, "zero_stage": 1}
    else:
        spec = sweep.load_spec({**sweep.load_spec("megatron_llama70b").raw, "axes": {"tp_size": [8]}})
        layout = {"tp_size": 8}
    line = sweep.where_step_goes(spec, layout)
    assert line.startswith("Where #1's step goes: ") and "\n" not in line
    shares = {name.strip(): float(value) for name, value in
              re.findall(r"([A-Za-z ]+?) ([0-9.]+)%", line.split(": ", 1)[1].split(" (`")[0])}
    wl, fl, knobs = grid.point(spec, layout)
    out = solver.solve(wl, fl, **knobs)
    step = float(out["step_latency_total"])
    if physics == "mlsysim":
        expected = {k: 100 * v / step for k, v in cli.step_components(out).items()}
    else:
        expected = {"compute": 100 * float(out["compute_latency"]) / step,
                    "TP communication": 100 * float(out["tp_communication_latency"]) / step}
    for name, value in expected.items():
        if value >= 0.1:
            assert shares[name] == pytest.approx(value, abs=0.051), name
    assert sum(shares.values()) == pytest.approx(100.0, abs=0.05 * len(shares) + 0.1 * 8)
    assert list(shares.values()) == sorted(shares.values(), reverse=True)


TINY_DICT = {"workload": "Llama3_70B", "fleet": "Training_1K",
             "axes": {"tp_size": [1, 2, 4, 8], "pp_size": [1, 2, 4, 8],
                      "microbatch_count": [8, 16], "zero_stage": [1, 3]},
             "fixed": {"batch_size": 1024}}


# ----------------------------------------------------------------------------- commands


def test_run_prints_a_summary_and_writes_the_cube(files, tmp_path, capsys):
    path = tmp_path / "again.nc"
    code, out, err = _call(capsys, ["run", files["spec"], "-o", path, "--block-points", "7",
                                    "--no-progress"])
    assert code == 0, err
    assert "tiny: 64 layouts (tp_size 4 x pp_size 4 x microbatch_count 2 x zero_stage 2)" in out
    assert "layouts/s" in out and f"wrote {path}" in out
    assert path.exists() and not Path(str(path) + ".partial").exists()
    xr.testing.assert_identical(sweep.open_cube(path).load(),
                                sweep.open_cube(files["cube"]).load())
    code, out, _ = _call(capsys, ["run", files["spec"], "-o", path, "--resume"])
    assert code == 0 and "64 layouts" in out
    with pytest.warns(DeprecationWarning, match="--max-points is deprecated"):
        code, out, _ = _call(capsys, ["run", files["spec"], "-o", path, "--resume",
                                      "--max-points", "7"])
    assert code == 0 and "already holds this finished sweep" in out


def test_top_lists_the_best_layouts(files, capsys):
    code, out, err = _call(capsys, ["top", files["cube"], "-k", "4"])
    assert code == 0, err
    cube = sweep.open_cube(files["cube"])
    expected = sweep.top_k(cube, objective="mfu", k=4)
    assert f"top 4 of {int(cube['admissible'].sum())} admissible layouts by mfu" in out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("#"))
    rows = lines[header + 2:]
    assert len(rows) == 4
    for row, mfu in zip(rows, expected["mfu"].values):
        assert f"{mfu:.4f}" in row
    assert "memory [GB]" in lines[header] and "accelerators" in lines[header]


#: A megatron space and one over both physics models, with every output kept.
TINY_MEGATRON = """\
name = "tiny_megatron"
workload = "Llama3_70B_MC"
fleet = "HGX_H100_1K_MC"
physics = "megatron"

[axes]
tp_size = [4, 8]
pp_size = [1, 4]
recompute = ["none", "full"]

[fixed]
batch_size = 1024
seq_len = 4096
micro_batch_size = 1
sequence_parallel = true
"""


def _breakdown(out):
    """The --breakdown table's rows: {column: text} each."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("where each step goes"))
    header = re.split(r"\s{2,}", lines[start + 1].strip())
    rows = []
    for line in lines[start + 3:]:
        if not line[:1].isdigit():
            break
        rows.append(dict(zip(header, line.split())))
    return rows


def test_top_breakdown_splits_each_step_into_the_cubes_terms(tmp_path, capsys):
    spec = tmp_path / "m.toml"
    spec.write_text(TINY_MEGATRON)
    cube_path = tmp_path / "m.nc"
    assert cli.main(["run", str(spec), "-o", str(cube_path), "--no-progress"]) == 0
    code, out, err = _call(capsys, ["top", cube_path, "-k", "3", "--breakdown"])
    assert code == 0, err
    rows = _breakdown(out)
    assert len(rows) == 3
    cube = sweep.open_cube(cube_path)
    best = sweep.top_k(cube, objective="mfu", k=3)
    terms = {"compute %": "compute_latency", "TP %": "tp_communication_latency",
             "CP %": "cp_communication_latency", "EP %": "ep_communication_latency",
             "PP %": "pp_communication_latency", "DP exposed %": "dp_communication_latency",
             "bubble %": "pipeline_bubble_latency", "optimizer %": "optimizer_latency"}
    for i, row in enumerate(rows):
        step = float(best["step_latency_total"][i])
        assert row["step [s]"] == f"{step:.3f}"
        for column, name in terms.items():
            assert row[column] == f"{100 * float(best[name][i]) / step:.1f}", column
        # the shares and the rest (fixed overhead, launch floor) make the whole step
        shares = [float(row[c]) for c in terms] + [float(row["other %"])]
        assert abs(sum(shares) - 100.0) < 0.05 * len(shares)
        assert float(row["other %"]) >= 0.0
        assert row["weights [GB]"] == f"{float(best['memory_weights'][i]) / 1e9:.1f}"
        assert row["activations [GB]"] == f"{float(best['memory_activations'][i]) / 1e9:.1f}"
    assert "other: the fixed per-step overhead" in out


def test_top_breakdown_flags_the_layouts_whose_step_rests_on_the_launch_floor(tmp_path, capsys):
    # Llama 3 8B at 512 tokens a sequence, one a microbatch: its layers' GPU work is shorter
    # than the host's launches (layer_overhead), whose value only vTrain's runs identify
    spec = tmp_path / "lb.toml"
    spec.write_text(TINY_MEGATRON.replace("Llama3_70B_MC", "Llama3_8B_MC").replace(
        "seq_len = 4096", "seq_len = 512"))
    cube_path = tmp_path / "lb.nc"
    assert cli.main(["run", str(spec), "-o", str(cube_path), "--no-progress"]) == 0
    code, out, err = _call(capsys, ["top", cube_path, "-k", "8", "--breakdown"])
    assert code == 0, err
    rows = _breakdown(out)
    flagged = [str(i) for i, row in enumerate(rows, 1)
               if float(row["other %"]) + float(row["launch %"]) >= 5.0]
    assert flagged and "layer_overhead" in out
    assert f"#{', #'.join(flagged)}: 5% or more of the step is launch and other" in out
    # the launch time is its own column (launch_latency), the fixed overhead the rest
    assert any(float(row["launch %"]) > 1.0 for row in rows)
    # a compute-bound cube flags none
    spec.write_text(TINY_MEGATRON)
    assert cli.main(["run", str(spec), "-o", str(cube_path), "--no-progress"]) == 0
    capsys.readouterr()
    code, out, _ = _call(capsys, ["top", cube_path, "-k", "3", "--breakdown"])
    assert code == 0 and "or more of the step is launch and other" not in out


def test_top_breakdown_shows_the_footprint_and_says_when_the_parts_exceed_it(tmp_path, capsys):
    # With 16-bit gradients the optimizer state holds the step's FP32 copy of them, which the
    # footprint counts only where it outweighs the activations and buffers: the parts add up
    # to more than the footprint (an audit found the table silent on it, with no footprint).
    spec = tmp_path / "g.toml"
    spec.write_text(TINY_MEGATRON.replace("sequence_parallel = true", "sequence_parallel = true\n"
                                          "zero_stage = 0\ngrad_reduce_in_bf16 = true"))
    cube_path = tmp_path / "g.nc"
    assert cli.main(["run", str(spec), "-o", str(cube_path), "--no-progress"]) == 0
    code, out, err = _call(capsys, ["top", cube_path, "-k", "3", "--breakdown"])
    assert code == 0, err
    rows = _breakdown(out)
    best = sweep.top_k(sweep.open_cube(cube_path), objective="mfu", k=3)
    parts = ("memory_weights", "memory_gradients", "memory_optimizer_state", "memory_activations",
             "memory_communication_buffers")
    over = []
    for i, row in enumerate(rows):
        foot = float(best["memory_footprint"][i])
        assert row["footprint [GB]"] == f"{foot / 1e9:.1f}"
        if sum(float(best[n][i]) for n in parts) > foot * (1 + 1e-9):
            over.append(f"#{i + 1}")
    assert over and f"{', '.join(over)}: the parts add up to more than the footprint" in out


def test_top_breakdown_of_an_mlsysim_cube_and_of_one_that_lacks_the_terms(files, tmp_path, capsys):
    # the shipped default spec keeps the terms: compute, TP, EP, bubble and the rest (DP)
    spec = sweep.load_spec("default")
    small = {**spec.raw, "axes": {**spec.raw["axes"], "tp_size": [4, 8], "pp_size": [4, 8],
                                  "microbatch_count": [16, 32], "seq_len": [4096]}}
    cube_path = tmp_path / "d.nc"
    sweep.run(small, path=cube_path, progress=False)
    code, out, err = _call(capsys, ["top", cube_path, "-k", "2", "--breakdown"])
    assert code == 0, err
    rows = _breakdown(out)
    best = sweep.top_k(sweep.open_cube(cube_path), objective="mfu", k=2)
    for i, row in enumerate(rows):
        step = float(best["step_latency_total"][i])
        parts = {"compute %": float(best["node_latency"][i]),
                 "TP %": float(best["tp_communication_latency"][i]),
                 "EP %": float(best["ep_communication_latency"][i]),
                 "bubble %": float(best["pipeline_bubble_latency"][i])}
        for column, value in parts.items():
            assert row[column] == f"{100 * value / step:.1f}"
        assert row["DP exposed %"] == f"{100 * (step - sum(parts.values())) / step:.1f}"
    assert "DP exposed (mlsysim)" in out
    # the default spec's outputs leave the memory parts out: the table says so, not its title
    assert "where each step goes (share of step_latency_total, %):" in out
    assert "and memory per accelerator" not in out and "weights [GB]" not in out
    assert "memory by part: this cube does not keep it" in out
    # a cube that keeps them shows them
    sweep.run({**small, "outputs": spec.raw["outputs"] + ["memory_weights", "memory_activations"]},
              path=tmp_path / "m.nc", progress=False)
    code, out, err = _call(capsys, ["top", tmp_path / "m.nc", "-k", "2", "--breakdown"])
    assert code == 0, err
    assert "and memory per accelerator:" in out and "weights [GB]" in out
    assert "memory by part" not in out
    # a cube whose spec's outputs leave the terms out: refused, nothing else printed
    code, out, err = _call(capsys, ["top", files["cube"], "--breakdown"])
    assert code == 2 and out == ""
    assert "--breakdown: this cube does not keep" in err and "node_latency" in err and "outputs" in err


NARROWED = ["-k", "2", "--select", "zero_stage=3", "tp_size=8", "--memory-limit", "20 GB",
            "--max-accelerators", "1024"]


def test_top_minimize_select_and_constraints(files, capsys):
    code, out, err = _call(capsys, ["top", files["cube"], "--objective", "step_latency_total",
                                    "--minimize", *NARROWED])
    assert code == 0, err
    cube = sweep.open_cube(files["cube"]).sel(zero_stage=[3], tp_size=[8])
    expected = sweep.top_k(cube, objective="step_latency_total", k=2, direction="minimize",
                           constraints={"memory_limit": "20 GB", "max_accelerators": 1024})
    assert "smallest first" in out and "zero_stage=3" in out and "memory_limit <= 20 GB" in out
    for value in expected["step_latency_total"].values:
        assert f"{value:.3f}" in out
    # The registry's direction by default (step time: smallest first), the same table.
    code, default, _ = _call(capsys, ["top", files["cube"], "--objective",
                                      "step_latency_total", *NARROWED])
    assert code == 0 and default == out


def test_top_says_when_its_ranking_spans_jobs(tmp_path, capsys):
    # the main job's cube has a seq_len axis: a longer sequence gives a higher MFU, so a
    # ranking over it puts one job's layouts first; top says so, and how to rank one job
    spec = sweep.load_spec("default")
    small = {**spec.raw, "axes": {**spec.raw["axes"], "tp_size": [4, 8], "pp_size": [4, 8],
                                  "microbatch_count": [16, 32], "seq_len": [2048, 4096]}}
    cube_path = tmp_path / "d.nc"
    sweep.run(small, path=cube_path, progress=False)
    code, out, err = _call(capsys, ["top", cube_path, "-k", "3"])
    assert code == 0, err
    assert out.rstrip().endswith("this ranking spans more than one seq_len (the job, not a "
                                 "choice between layouts; the main job ranks each on its own): "
                                 "--select seq_len=2048 ranks one job")
    code, out, err = _call(capsys, ["top", cube_path, "-k", "3", "--select", "seq_len=4096"])
    assert code == 0 and "this ranking spans" not in out


def test_top_smallest_select_and_constraints(files, capsys):
    with pytest.warns(DeprecationWarning, match="--smallest is deprecated; use --minimize"):
        code, out, err = _call(capsys, ["top", files["cube"], "--by", "step_latency_total",
                                        "--smallest", "-k", "2", "--select", "zero_stage=3",
                                        "tp_size=8", "--memory-limit", "20 GB",
                                        "--max-accelerators", "1024"])
    assert code == 0, err
    cube = sweep.open_cube(files["cube"]).sel(zero_stage=[3], tp_size=[8])
    expected = sweep.top_k(cube, objective="step_latency_total", k=2, direction="minimize",
                           constraints={"memory_limit": 20e9, "max_accelerators": 1024})
    assert "smallest first" in out and "zero_stage=3" in out and "memory_limit <= 20 GB" in out
    for value in expected["step_latency_total"].values:
        assert f"{value:.3f}" in out


def test_show_describes_the_cube(files, capsys):
    code, out, err = _call(capsys, ["show", files["cube"]])
    assert code == 0, err
    cube = sweep.open_cube(files["cube"])
    assert "dims (4; 64 points)" in out
    assert "tp_size" in out and "1, 2, 4, 8" in out
    assert "fleet model FLOPs utilization" in out and "training step time" in out
    assert re.search(rf"^admissible +{int(cube['admissible'].sum())} ", out, re.MULTILINE)
    assert solver.REFERENCE in out and "package_version: 0.1.0" in out
    assert '"tp_size": [1, 2, 4, 8]' in out  # the spec, pretty JSON


@pytest.mark.parametrize("kind, expected", [
    ("workloads", "Llama3_70B"), ("fleets", "Training_1K"), ("accelerators", "H100"),
    ("nodes", "DGX_H100"), ("fabrics", "InfiniBand_NDR")])
def test_catalog_tables(kind, expected, capsys):
    code, out, err = _call(capsys, ["catalog", kind])
    assert code == 0, err
    assert out.startswith(f"{kind} ({len(solver.catalog.names(kind))}):")
    assert expected in out


def test_catalog_all_kinds(capsys):
    code, out, _ = _call(capsys, ["catalog"])
    assert code == 0
    for kind in ("workloads", "fleets", "accelerators", "nodes", "fabrics"):
        assert f"{kind} (" in out
    assert "1024" in out  # Training_1K: 128 x 8


@pytest.mark.parametrize("args", [
    ["--kind", "heatmap", "--var", "mfu", "--x", "tp_size", "--y", "pp_size"],
    ["--kind", "heatmap", "--var", "memory_footprint", "--reduce", "min",
     "--select", "zero_stage=3"],
    ["--kind", "line", "--x", "pp_size", "--hue", "tp_size", "--where", "valid"],
    ["--kind", "pareto", "--x", "memory_footprint", "--y", "mfu"],
])
def test_plot_writes_a_png(files, tmp_path, capsys, args):
    pytest.importorskip("matplotlib")
    path = tmp_path / "plot.png"
    code, out, err = _call(capsys, ["plot", files["cube"], *args, "-o", path])
    assert code == 0, err
    assert f"wrote {path}" in out
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_plot_functions_for_notebooks(files):
    pytest.importorskip("matplotlib")
    from sweep import plot

    cube = sweep.open_cube(files["cube"])
    figure = plot.heatmap(cube, "mfu", "tp_size", "pp_size")
    image = figure.axes[0].images[0].get_array()
    expected = plot.reduce_to(cube, "mfu", ("pp_size", "tp_size")).values
    np.testing.assert_allclose(np.ma.filled(image, np.nan), expected, equal_nan=True)
    np.testing.assert_allclose(np.nanmax(expected),
                               float(cube["mfu"].where(cube["admissible"]).max()))
    assert plot.line(cube, "mfu", "tp_size", hue="zero_stage").axes
    assert plot.pareto(cube, "memory_footprint", "mfu").axes
    with pytest.raises(ValueError, match="must be a dim of the cube"):
        plot.heatmap(cube, "mfu", "tp", "pp_size")


def test_search_samples(files, capsys):
    code, out, err = _call(capsys, ["search", files["spec"], "--mode", "sampled", "--trials",
                                    "12", "--seed", "0", "--top", "3", "--no-progress"])
    assert code == 0, err
    assert out.startswith("search [tpe] for mfu (maximize): 12 layout pricings (12 this run; a "
                          "layout priced again counts again)")
    assert "top 3 distinct layouts by mfu" in out


def test_search_exact_finds_the_cube_optimum(files, capsys):
    code, out, err = _call(capsys, ["search", files["spec"], "--exact", "-k", "2",
                                    "--memory-limit", "72 GB"])
    assert code == 0, err
    assert "search [exhaustive]" in out and "64 layouts evaluated" in out
    cube = sweep.open_cube(files["cube"])
    best = float(cube["mfu"].where(cube["admissible"]).max())
    assert f"best: {best:.6g}" in out


# ----------------------------------------------------------------------------- bad input


def _bad_files(root: Path) -> dict:
    """Spec files with one mistake each."""
    texts = {
        "not_toml.toml": "workload = = Llama\n",
        "unknown_key.toml": TINY.replace('fleet = "Training_1K"', 'fleets = "Training_1K"'),
        "unknown_knob.toml": TINY.replace("tp_size = [1, 2, 4, 8]", "tp_sise = [1, 2, 4, 8]"),
        "wrong_type.toml": TINY.replace("batch_size = 1024", 'batch_size = "big"'),
        "unknown_workload.toml": TINY.replace('"Llama3_70B"', '"Lama3_70B"'),
        "unknown_fleet.toml": TINY.replace('"Training_1K"', '"Training_1k"'),
    }
    for name, text in texts.items():
        (root / name).write_text(text)
    return texts


BAD = [
    # (argv with {root}/{cube} placeholders, substrings of the one error line)
    (["run", "{root}/missing.toml"], ["missing.toml", "no such spec file"]),
    (["run", "{root}/not_toml.toml"], ["not_toml.toml", "not valid TOML"]),
    (["run", "{root}/unknown_key.toml"], ["unknown_key.toml", "fleets", "did you mean 'fleet'"]),
    (["run", "{root}/unknown_knob.toml"], ["axes.tp_sise", "did you mean 'tp_size'"]),
    (["run", "{root}/wrong_type.toml"], ["fixed.batch_size", "expected a whole number",
                                         "but got 'big'"]),
    (["run", "{root}/unknown_workload.toml"], ["workload", "'Lama3_70B'",
                                               "did you mean 'Llama3_70B'"]),
    (["search", "{root}/unknown_fleet.toml"], ["fleet", "'Training_1k'",
                                               "did you mean 'Training_1K'"]),
    (["--spec", "{root}/unknown_knob.toml", "--no-save"], ["axes.tp_sise"]),
    (["top", "{root}/missing.nc"], ["missing.nc", "expected a cube file", "no cube at"]),
    (["show", "{root}/unknown_key.toml"], ["expected a cube", "cannot be read as netCDF"]),
    (["show", "{root}/foreign.nc"], ["foreign.nc", "expected a cube written by",
                                      "has the variables: x"]),
    (["top", "{cube}", "--by", "mfuu"], ["--by", "expected a numeric variable",
                                         "but got 'mfuu'", "did you mean 'mfu'"]),
    (["top", "{cube}", "--by", "admissible"], ["--by", "but got 'admissible'"]),
    (["top", "{cube}", "--objective", "mfuu"], ["--objective", "expected a numeric variable",
                                                "did you mean 'mfu'"]),
    (["top", "{cube}", "--minimize", "--maximize"], ["not allowed with argument"]),
    (["top", "{cube}", "--memory-limit", "80"], ["--memory-limit", "did you mean '80 GB'"]),
    (["top", "{cube}", "--where", "admissable"], ["--where", "did you mean 'admissible'"]),
    (["top", "{cube}", "--select", "tp=4"], ["--select", "expected a dim of the cube",
                                             "but got 'tp'", "did you mean 'tp_size'"]),
    (["top", "{cube}", "--select", "tp_size=3"], ["--select tp_size", "expected one of 1, 2, 4, 8",
                                                  "but got '3'"]),
    (["top", "{cube}", "--select", "tp_size"], ["expected dim=value", "but got 'tp_size'"]),
    (["top", "{cube}", "--select", "tp_size=2", "tp_size=4"], ["twice"]),
    (["top", "{cube}", "-k", "0"], ["-k", "expected a whole number >= 1", "but got '0'"]),
    (["top", "{cube}", "--memory-limit", "72 GX"], ["--memory-limit", "but got '72 GX'"]),
    (["plot", "{cube}", "--var", "mfx"], ["--var", "did you mean 'mfu'"]),
    (["plot", "{cube}", "--x", "tp"], ["--x", "did you mean 'tp_size'"]),
    (["plot", "{cube}", "--select", "tp_size=2"], ["--select tp_size", "not plotted"]),
    (["plot", "{cube}", "--kind", "heat"], ["--kind", "did you mean 'heatmap'"]),
    (["plot", "{cube}", "--kind", "pareto", "--x", "tp_size"], ["--x", "but got 'tp_size'"]),
    (["plot", "{cube}", "-o", "{root}/no/such/dir/x.png"], ["-o", "does not exist"]),
    (["catalog", "fleet"], ["expected a catalog kind", "did you mean 'fleets'"]),
    (["search", "{root}/tiny.toml", "--objective", "mfuu"], ["--objective", "did you mean 'mfu'"]),
    (["search", "{root}/tiny.toml", "--sampler", "tpee"], ["--sampler", "did you mean 'tpe'"]),
    (["search", "{root}/tiny.toml", "--storage", "{root}/study.txt"],
     ["storage must be", "but got"]),
    (["run", "{root}/tiny.toml", "--jobs", "0"], ["--jobs", "but got '0'"]),
    (["top"], ["required", "CUBE"]),
    (["bogus"], ["invalid choice", "'bogus'"]),
]


@pytest.mark.parametrize("argv, expected", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(files, capsys, argv, expected):
    root = files["root"]
    _bad_files(root)
    if not (root / "foreign.nc").exists():
        xr.Dataset({"x": ("i", np.arange(3))}).to_netcdf(root / "foreign.nc")
    argv = [a.format(root=root, cube=files["cube"]) for a in argv]
    code, out, err = _call(capsys, argv)
    assert code == cli.EXIT_USAGE, (out, err)
    assert "Traceback" not in err
    assert err.count("\n") == 1, err  # one line
    for text in expected:
        assert text in err, err


def test_unfinished_cube_is_refused(files, tmp_path, capsys):
    cube = sweep.open_cube(files["cube"]).load()
    cube.attrs.pop("complete", None)
    cube.to_netcdf(tmp_path / "unfinished.nc")
    code, _, err = _call(capsys, ["show", tmp_path / "unfinished.nc"])
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1
    assert "unfinished.nc: expected a finished cube, but" in err


def test_bad_input_in_a_subprocess_has_no_traceback(files):
    done = subprocess.run([sys.executable, "-m", "sweep", "top", str(files["cube"]),
                           "--by", "mfuu"], capture_output=True, text=True, env=_env(),
                          cwd="/tmp", timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("python -m sweep: error: --by:")
    assert "Traceback" not in done.stderr


def test_format_table_aligns_columns():
    text = cli.format_table(["name", "n"], [["a", "1"], ["bbb", "22"]], left=(0,))
    assert text.splitlines() == ["name   n", "----  --", "a      1", "bbb   22"]


def test_megatron_main_job_without_numba_keeps_the_default_cube(tmp_path):
    """An install without the ``fast`` extra has no numba: the megatron physics takes the
    numpy path (it had imported the fused kernel's module on every call, so raised
    ModuleNotFoundError), and its main job writes a cube of its own, not over the default's."""
    (tmp_path / cli.DEFAULT_CUBE).write_bytes(b"the default job's cube")
    code = "\n".join([
        "import runpy, sys",
        "sys.modules['numba'] = None  # no numba, as without the fast extra",
        "import numpy as np, solver",
        "from solver import catalog, fused",
        "assert not fused.NUMBA",
        "rng = np.random.default_rng(0)",
        "n = 4 * fused.FUSED_MIN_POINTS",
        "out = solver.solve(catalog.workload('Llama3_8B_MC'), catalog.fleet('HGX_H100_1K_MC'),",
        "                   physics='megatron', tp_size=rng.choice([1, 2, 4, 8], n),",
        "                   recompute=rng.choice(['none', 'full'], n), precision='bf16')",
        "assert np.isfinite(out['step_latency_total']).sum() > n // 2",
        "sys.argv = ['sweep', '--physics', 'megatron', '-k', '3']",
        "runpy.run_module('sweep', run_name='__main__')",
    ])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(),
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "wrote default_megatron_cube.nc" in done.stdout
    assert sweep.open_cube(tmp_path / "default_megatron_cube.nc").attrs
    assert (tmp_path / cli.DEFAULT_CUBE).read_bytes() == b"the default job's cube"


def test_search_says_a_memory_limit_above_the_accelerators_memory_as_top_does(capsys):
    # MemoryLimitWarning is a RuntimeWarning, which the search command silences for its
    # "no feasible layout" (its summary says that): the limit's warning went with it.
    code, out, err = _call(capsys, ["search", "search_llama70b", "--memory-limit", "200 GB",
                                    "--trials", "10", "--mode", "sampled", "--seed", "0"])
    assert "memory limit 200 GB is above the accelerator's memory" in err
    code, out, err = _call(capsys, ["search", "search_llama70b", "--memory-limit", "60 GB",
                                    "--trials", "10", "--mode", "sampled", "--seed", "0"])
    assert "above the accelerator's memory" not in err
