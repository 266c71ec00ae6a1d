"""Cluster size as an axis respects the user's cluster (issue #11.5).

With ``dp_size`` as an axis the layout sizes the cluster (``tp*pp*ep*dp``
accelerators); ``max_accelerators`` then defaults to the fleet's own size, a
spec lifts it with a number or ``"none"``, and ``min_accelerators`` bounds it
from below (spec, ``--min-accelerators`` on ``top`` and ``search``).
"""

from __future__ import annotations

import numpy as np
import pytest

import sweep
from sweep.cli import main

# Training_1K has 1024 H100s (8 per node). tp*pp*dp spans 8 .. 8*4*512 = 16384; a batch of
# 512 fits the memory from 256 accelerators up.
SPEC = {
    "workload": "Llama3_8B", "fleet": "Training_1K",
    "axes": {"tp_size": [1, 8], "pp_size": [1, 4], "dp_size": [8, 64, 128, 256, 512]},
    "fixed": {"batch_size": 512},
    "outputs": ["mfu", "step_latency_total", "memory_footprint", "effective_throughput"],
    "constraints": {"require_realizable": False},
}


def _counts(cube):
    n = cube["n_accelerators"].broadcast_like(cube["admissible"])
    return n.values, cube["admissible"].values, cube["valid"].values & cube[
        "within_memory_limit"].values


def test_dp_size_axis_defaults_max_accelerators_to_the_fleet():
    spec = sweep.load_spec(SPEC)
    assert spec.max_accelerators is None and spec.sizes_cluster
    assert spec.accelerator_range(spec.fleet_spec()) == (None, 1024)
    cube = sweep.run(spec)
    n, admissible, fits = _counts(cube)
    assert n.max() == 16384 and (fits & (n > 1024)).any()  # such layouts exist and fit...
    np.testing.assert_array_equal(admissible, fits & (n <= 1024))  # ...but are not admissible
    assert admissible.any() and cube.attrs["max_accelerators"] == 1024
    best = sweep.top_k(cube, objective="effective_throughput", k=5)
    assert int(best["n_accelerators"].max()) <= 1024
    assert "n_accelerators" in best  # every ranked row says its cluster size


def test_the_default_bound_is_lifted_explicitly():
    none = sweep.run({**SPEC, "constraints": {**SPEC["constraints"],
                                              "max_accelerators": "none"}})
    n, admissible, fits = _counts(none)
    np.testing.assert_array_equal(admissible, fits)
    assert (admissible & (n > 1024)).any() and "max_accelerators" not in none.attrs
    larger = sweep.run({**SPEC, "constraints": {**SPEC["constraints"],
                                                "max_accelerators": 4096}})
    n, admissible, fits = _counts(larger)
    np.testing.assert_array_equal(admissible, fits & (n <= 4096))
    assert larger.attrs["max_accelerators"] == 4096


def test_a_fixed_fleet_has_no_default_bound():
    spec = sweep.load_spec({**SPEC, "axes": {"tp_size": [1, 8], "pp_size": [1, 4]}})
    assert not spec.sizes_cluster and spec.accelerator_range(spec.fleet_spec()) == (None, None)


def test_min_accelerators():
    cube = sweep.run({**SPEC, "constraints": {**SPEC["constraints"], "min_accelerators": 512}})
    n, admissible, fits = _counts(cube)
    np.testing.assert_array_equal(admissible, fits & (n >= 512) & (n <= 1024))
    assert admissible.any() and cube.attrs["min_accelerators"] == 512
    with pytest.raises(sweep.SpecError, match=r"constraints\.min_accelerators: expected at most "
                                              r"max_accelerators \(64\), but got 128"):
        sweep.load_spec({**SPEC, "constraints": {"min_accelerators": 128,
                                                 "max_accelerators": 64}})
    with pytest.raises(sweep.SpecError, match=r"constraints\.min_accelerators: expected a whole "
                                              r"number from 1 to 2\*\*53 - 1, but got 0"):
        sweep.load_spec({**SPEC, "constraints": {"min_accelerators": 0}})
    with pytest.raises(sweep.SpecError, match=r"constraints\.max_accelerators: expected a whole "
                                              r"number from 1 to 2\*\*53 - 1 or \"none\", "
                                              r"but got 'all'"):
        sweep.load_spec({**SPEC, "constraints": {"max_accelerators": "all"}})


def test_each_fleet_bounds_its_own_layouts():
    # Research_256 has 256 accelerators, Training_1K 1024: each fleet's layouts by its own size.
    spec = sweep.load_spec({**SPEC, "fleet": ["Training_1K", "Research_256"]})
    cube = sweep.run(spec)
    assert cube.attrs["max_accelerators"] == '{"Research_256": 256, "Training_1K": 1024}'
    for label, size in (("Training_1K", 1024), ("Research_256", 256)):
        here = cube.sel(fleet=label)
        n, admissible, fits = _counts(here)
        np.testing.assert_array_equal(admissible, fits & (n <= size), err_msg=label)
        assert (fits & (n > size)).any()


def test_search_respects_the_fleet_and_min_accelerators():
    result = sweep.search(SPEC, mode="exact", objective="effective_throughput", k=5)
    assert result.breakdown["n_accelerators"] <= 1024
    assert result.breakdown["constraint:accelerators"] <= 0
    cube = sweep.run(SPEC)
    truth = sweep.top_k(cube, objective="effective_throughput", k=1)
    assert result.best_value == pytest.approx(float(truth["effective_throughput"][0]), rel=1e-12)
    small = sweep.search(sweep.load_spec(SPEC).with_constraints(max_accelerators=256),
                         mode="exact", objective="mfu", k=5)
    assert small.breakdown["n_accelerators"] <= 256
    big = sweep.search(sweep.load_spec(SPEC).with_constraints(min_accelerators=512),
                       mode="exact", objective="mfu", k=5)
    assert 512 <= big.breakdown["n_accelerators"] <= 1024
    assert all(512 <= row["values"]["n_accelerators"] <= 1024 for row in big.top)


def test_min_accelerators_on_the_command_line(tmp_path, capsys):
    path = tmp_path / "c.nc"
    sweep.save(sweep.run(SPEC), path)
    assert main(["top", str(path), "-k", "50", "--min-accelerators", "512"]) == 0
    out = capsys.readouterr().out
    assert "n_accelerators >= 512" in out and out.splitlines()[1].endswith("accelerators")
    counts = [int(line.split()[-1]) for line in out.splitlines()[3:] if line.strip()]
    assert counts and min(counts) >= 512 and max(counts) <= 1024
    spec = tmp_path / "s.toml"
    spec.write_text('workload = "Llama3_8B"\nfleet = "Training_1K"\n[axes]\ntp_size = [1, 8]\n'
                    'pp_size = [1, 4]\ndp_size = [8, 64, 128, 256, 512]\n[fixed]\n'
                    'batch_size = 512\n[constraints]\nrequire_realizable = false\n')
    assert main(["search", str(spec), "--exact", "--min-accelerators", "512", "-k", "3"]) == 0
    out = capsys.readouterr().out
    assert "accelerators" in out
