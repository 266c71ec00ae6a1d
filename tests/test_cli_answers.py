"""Answers the command line gives (issue #11): empty answers say why, ties are one row,
scenarios are answered per value, sizes carry the right unit.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import sweep
from sweep import cli

BASE = """\
name = "{name}"
workload = "Llama3_70B"
fleet = "Training_1K"
outputs = ["mfu", "step_latency_total", "memory_footprint", "feasible"]

[axes]
{axes}

[fixed]
batch_size = 1024
{fixed}

[constraints]
memory_limit = "72 GB"
{constraints}
"""


def _spec(root, name, axes, fixed="", constraints=""):
    path = root / f"{name}.toml"
    path.write_text(BASE.format(name=name, axes=axes, fixed=fixed, constraints=constraints))
    return path


@pytest.fixture(scope="module")
def ties(tmp_path_factory):
    """pp_size 1 only: microbatch_count changes nothing (2 layouts per split; v_stages > 1
    needs stages to interleave). overlap_efficiency, a no-op without overlap_comm, had been
    the second such axis; it is what the model assumes, answered each value on its own now.

    Every layout is realizable: a replica holds at least 2 samples (TP 2 of 1024).
    """
    root = tmp_path_factory.mktemp("answers")
    spec = _spec(root, "ties", "tp_size = [2, 4, 8]\npp_size = [1]\n"
                 "microbatch_count = [1, 2]",
                 "zero_stage = 3\noverlap_comm = false")
    cube = sweep.save(sweep.run(sweep.load_spec(spec)), root / "ties.nc")
    return {"root": root, "spec": spec, "cube": cube}


def _call(capsys, argv) -> tuple:
    """``(exit status, stdout, stderr)`` of the command line run in-process."""
    return (cli.main(list(map(str, argv))), *capsys.readouterr())


def test_top_with_no_admissible_layout_says_why_and_exits_3(ties, capsys):
    # Issue #11.3: every layout of this fixed fleet uses 1024 accelerators.
    code, out, err = _call(capsys, ["top", ties["cube"], "--max-accelerators", "512"])
    assert code == cli.EXIT_EMPTY == 3
    assert out == ""
    cube = sweep.open_cube(ties["cube"])
    kept = int(cube["admissible"].sum())
    assert kept > 0
    assert f"no admissible layout among {int(np.prod(list(cube.sizes.values())))} points" in err
    assert f"accelerator budget (<= 512) removed {kept}" in err
    assert f"relax accelerator budget (<= 512): {kept} layouts pass every other condition" in err
    cube.close()
    code, out, err = _call(capsys, ["top", ties["cube"], "--max-accelerators", "512",
                                    "--select", "tp_size=4"])
    assert code == 3 and "(with tp_size=4): no admissible layout among 2 points" in err


def test_plot_with_no_admissible_layout_says_why_and_exits_3(ties, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    for kind in ("heatmap", "pareto"):
        code, out, err = _call(capsys, ["plot", ties["cube"], "--kind", kind, "--x",
                                        "tp_size" if kind == "heatmap" else "memory_footprint",
                                        "--y", "microbatch_count" if kind == "heatmap" else "mfu",
                                        "--max-accelerators", "512", "-o", tmp_path / "x.png"])
        assert code == 3, err
        assert "accelerator budget (<= 512) removed" in err and not (tmp_path / "x.png").exists()


def test_main_job_with_no_admissible_layout_exits_3_after_saving(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = _spec(tmp_path, "none", "tp_size = [4, 8]\npp_size = [1, 2]",
                 constraints="max_accelerators = 512")
    code, out, err = _call(capsys, ["--spec", spec, "-o", tmp_path / "none.nc"])
    assert code == 3
    assert "accelerator budget (<= 512, the spec's) removed" in out + err
    assert (tmp_path / "none.nc").exists()


def test_top_shows_layouts_equal_in_every_output_as_one_row(ties, capsys):
    # Issue #11.6: with pp_size 1, microbatch_count changes no output.
    code, out, err = _call(capsys, ["top", ties["cube"], "-k", "10"])
    assert code == 0, err
    cube = sweep.open_cube(ties["cube"])
    splits = int(cube["admissible"].any("microbatch_count").sum())
    assert out.startswith(f"top {splits} of {int(cube['admissible'].sum())} admissible")
    assert "microbatch_count=1|2" in out
    table = [line for line in out.splitlines() if re.match(r"\s*\d+ ", line)]
    assert len(table) == splits
    best = sweep.top_k(cube, k=1)
    assert int(best["ties"][0]) == 2 and str(best["equivalent"][0].values) == "microbatch_count=1|2"
    code, out, err = _call(capsys, ["top", ties["cube"], "-k", "5", "--keep-ties"])
    assert len([line for line in out.splitlines() if re.match(r"\s*\d+ ", line)]) == 5
    cube.close()


def test_main_job_answers_each_sequence_length(tmp_path, capsys, monkeypatch):
    # Issue #11.7: seq_len describes the job; the best layout is given for each value.
    monkeypatch.chdir(tmp_path)
    spec = _spec(tmp_path, "seq", "tp_size = [4, 8]\npp_size = [2, 4]\nseq_len = [1024, 2048]",
                 "zero_stage = 3")
    code, out, err = _call(capsys, ["--spec", spec, "--no-save"])
    assert code == 0, err
    cube = sweep.run(sweep.load_spec(spec))
    best = sweep.best_along(cube, "seq_len")
    for seq_len in (1024, 2048):
        block = out.split(f"seq_len={seq_len}: Best layout of each parallel split")[1]
        block = block.split("seq_len=")[0]
        mfu = float(best["mfu"].sel(seq_len=seq_len))
        first = [line for line in block.splitlines() if line.startswith("1 ")][0]
        assert f"{mfu:.4f}" in first
        assert "seq_len" not in block.splitlines()[2]  # not a column of the table
        assert "Why #1 wins" in block
    assert "(seq_len: the job, not a choice), 2 blocks" in out


def test_show_prints_memory_in_the_unit_it_names(ties, capsys):
    # Issue #11.9: 80 GiB printed as "86 GB" read like a datasheet's 80.
    code, out, err = _call(capsys, ["show", ties["cube"]])
    assert code == 0, err
    assert "NVIDIA H100 (85.9 GB = 80 GiB)" in out
    assert "memory_limit: Training_1K 72 GB" in out
    from sweep.cli.format import _memory_size

    assert _memory_size(141 * 2**30) == "151 GB = 141 GiB"
    assert _memory_size(72e9) == "72 GB"


def test_search_shows_layouts_equal_in_every_output_as_one_row(ties, capsys):
    code, out, err = _call(capsys, ["search", ties["spec"], "--exact", "-k", "12",
                                    "--no-progress"])
    assert code == 0, err
    table = out.split("distinct layouts by mfu:")[1]
    rows = [line for line in table.splitlines() if re.match(r"\s*\d+ ", line)]
    cube = sweep.open_cube(ties["cube"])
    splits = int(cube["admissible"].any("microbatch_count").sum())
    cube.close()
    assert len(rows) == splits
    assert "microbatch_count=1|2" in table.splitlines()[1]


def test_a_search_with_no_admissible_layout_says_why_and_exits_3(ties, capsys):
    # Issue #11.3 for search: it printed "no admissible layout" and exited 0.
    code, out, err = _call(capsys, ["search", ties["spec"], "--memory-limit", "1 GB",
                                    "--no-progress"])
    assert code == cli.EXIT_EMPTY == 3
    spec = sweep.load_spec(ties["spec"])
    assert f"no admissible layout among {spec.size:,} points" in err
    assert "within the memory limit removed" in err and "relax within the memory limit" in err


def test_the_main_job_with_no_admissible_layout_says_why_once(tmp_path, capsys):
    # one scenario: the reasons go to stderr with exit 3, not to stdout as well
    spec = _spec(tmp_path, "none", "tp_size = [2, 4]\npp_size = [1]", "zero_stage = 3",
                 "max_accelerators = 512")
    code, out, err = _call(capsys, ["--spec", spec, "--no-save", "--no-progress"])
    assert code == cli.EXIT_EMPTY == 3
    assert "no admissible layout among 2 points" in err and "relax accelerator budget" in err
    assert "no admissible layout" not in out and "relax" not in out
    # two scenarios, one empty: its reasons are part of the report, under its name
    spec = _spec(tmp_path, "some", "tp_size = [2, 4, 8]\npp_size = [1]\n"
                 "seq_len = [1024, 131072]", "zero_stage = 3\noverlap_comm = false")
    code, out, err = _call(capsys, ["--spec", spec, "--no-save", "--no-progress"])
    assert code == 0, err
    assert "seq_len=131072: no admissible layout among 3 points" in out


def test_search_top_one_shows_its_whole_tie_group(ties, capsys):
    # The search's top-k counted layouts: a group cut at k showed only some of its equals.
    code, out, err = _call(capsys, ["search", ties["spec"], "--exact", "-k", "1",
                                    "--no-progress"])
    assert code == 0, err
    rows = [line for line in out.split("distinct layouts by mfu:")[1].splitlines()
            if re.match(r"\s*\d+ ", line)]
    assert len(rows) == 1
    assert "microbatch_count=1|2" in out.split("distinct layouts by mfu:")[1]


def test_main_job_rows_list_the_knob_values_that_change_nothing(ties, tmp_path, capsys):
    code, out, err = _call(capsys, ["--spec", ties["spec"], "--no-save", "--no-progress"])
    assert code == 0, err
    table = out.split("Best layout of each parallel split", 1)[1]
    rows = [line for line in table.splitlines() if re.match(r"\s*\d+ ", line)]
    assert len(rows) == 3  # one per TP split, each standing for its 2 equal layouts
    assert "same in every row: pp_size=1, microbatch_count=1|2" in table
    assert "a|b: layouts with these values are equal in every output" in out


def test_an_assumption_of_the_model_is_answered_per_value_not_ranked(tmp_path, capsys,
                                                                     monkeypatch):
    """efficiency (what the mlsysim model assumes a GEMM achieves) had been ranked like a
    layout knob: every answer took the most optimistic value, without a word."""
    monkeypatch.chdir(tmp_path)
    spec = _spec(tmp_path, "eff", "tp_size = [4, 8]\npp_size = [2, 4]\nefficiency = [0.3, 0.7]",
                 "zero_stage = 3")
    code, out, err = _call(capsys, ["--spec", spec, "--no-save", "--no-progress"])
    assert code == 0, err
    assert "(efficiency: what the model assumes, not a choice), 2 blocks" in out
    assert "efficiency=0.3: Best layout" in out and "efficiency=0.7: Best layout" in out
    cube = sweep.run(sweep.load_spec(spec))
    with pytest.warns(sweep.analysis.JobMixWarning,
                      match=r"spans efficiency \(what the model assumes, not a choice"):
        sweep.top_k(cube, k=1)
    code, out, err = _call(capsys, ["top", sweep.save(cube, tmp_path / "eff.nc"), "-k", "3"])
    assert "this ranking spans more than one efficiency (what the model assumes" in out


def test_an_objective_in_capitals_gets_its_name_suggested(ties, capsys):
    code, out, err = _call(capsys, ["top", ties["cube"], "--objective", "MFU"])
    assert code == 2 and err.rstrip().endswith("but got 'MFU'; did you mean 'mfu'?")
    cube = sweep.open_cube(ties["cube"])
    with pytest.raises(KeyError, match=r"but got 'MFU'; did you mean 'mfu'\?"):
        sweep.top_k(cube, objective="MFU")
    cube.close()
    with pytest.raises(ValueError, match=r"but got 'MFU'; did you mean 'mfu'\?"):
        sweep.search(ties["spec"], objective="MFU", progress=False)
