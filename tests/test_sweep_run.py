"""sweep.run: blocks priced by solver.solve into a labeled cube; any point solves back the same."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr

import solver
import sweep
from sweep import grid
from sweep.cube import MASKS

SEED = 20261130


@pytest.fixture(autouse=True)
def _fixed_date(monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1764460800")


def _random_spec(rng):
    """A random small space over many knobs, float64, every output."""
    pick = lambda values, n: sorted(rng.choice(values, size=n, replace=False).tolist())  # noqa: E731
    return {
        "workload": ["Llama3_70B", "Mixtral_8x7B"],
        "fleet": ["Training_1K", "Research_256"],
        "axes": {
            "tp_size": pick([1, 2, 4, 8, 16], 3),
            "pp_size": sorted(pick([1, 2, 4, 8], 2) + [3]),  # 3 does not divide: invalid points
            "ep_size": pick([1, 2, 4], 2),
            "microbatch_count": pick(list(range(1, 33)), 3),
            "zero_stage": pick([0, 1, 2, 3], 2),
            "activation_recomputation": [False, True],
            "precision": ["bf16", "fp8"],
            "efficiency": [float(rng.uniform(0.3, 0.7))],
            "overlap_comm": [True, False],
        },
        "fixed": {"batch_size": int(rng.choice([256, 1024, 4096])), "seq_len": 4096},
        "constraints": {"memory_limit": "72 GB", "max_accelerators": 512},
    }


def _assert_point(cube, spec, coords):
    workload, fleet, knobs = grid.point(spec, coords)
    expected = solver.solve(workload, fleet, **knobs)
    here = cube.sel(coords)
    for name in spec.outputs:
        np.testing.assert_allclose(here[name].values, expected[name], rtol=1e-12,
                                   err_msg=f"{name} at {coords}")


def test_random_points_solve_back_the_same():
    rng = np.random.default_rng(SEED)
    spec = sweep.load_spec(_random_spec(rng))
    cube = sweep.run(spec, block_points=500)  # many blocks
    assert cube.sizes == dict(zip(spec.dims, spec.shape))
    assert cube["valid"].any() and not cube["valid"].all()
    for _ in range(40):
        coords = {d: cube[d].values[rng.integers(cube.sizes[d])] for d in spec.dims}
        _assert_point(cube, spec, coords)


def test_cube_layout_and_attrs():
    spec = sweep.load_spec({"workload": "Llama3_70B", "fleet": "Training_1K", "dtype": "float32",
                            "outputs": ["mfu", "memory_footprint", "idle_ranks"],
                            "axes": {"tp_size": [1, 2, 4, 8], "pp_size": [1, 5, 8],
                                     "activation_recomputation": [False, True],
                                     "precision": ["bf16", "fp8"]},
                            "fixed": {"batch_size": 1024},
                            "constraints": {"memory_limit": 0.5}})
    cube = sweep.run(spec)
    assert tuple(cube.dims) == spec.dims
    assert list(cube.data_vars) == ["mfu", "memory_footprint", "idle_ranks", *MASKS,
                                    "n_accelerators"]
    assert cube["mfu"].dtype == np.float32 and cube["memory_footprint"].dtype == np.float32
    for name in ("idle_ranks", *MASKS):
        assert cube[name].dtype == bool
    assert cube["activation_recomputation"].dtype == bool
    assert cube["precision"].values.tolist() == ["bf16", "fp8"]
    for name in ("mfu", "memory_footprint"):
        units, long_name = solver.OUTPUTS[name].units, solver.OUTPUTS[name].long_name
        assert cube[name].attrs == {"units": units, "long_name": long_name}
    assert cube["mfu"].attrs["units"] == "1"
    # Provenance: netCDF-safe attrs only (str / numbers), JSON for structures.
    attrs = cube.attrs
    assert attrs["reference"] == "mlsysim 0.3.0 DistributedModel.solve"
    assert attrs["package_version"] == solver.__version__
    assert json.loads(attrs["spec"]) == json.loads(spec.to_json())
    assert json.loads(attrs["fixed"]) == {"batch_size": 1024}
    assert json.loads(attrs["workloads"])["Llama3_70B"]["layers"] == 80
    fleet = json.loads(attrs["fleets"])["Training_1K"]
    assert fleet["count"] == 128 and fleet["node"]["accelerator"]["memory_capacity"] > 0
    assert attrs["date_created"].startswith("2025-11-30")
    for var in [cube, *cube.variables.values()]:
        for key, value in var.attrs.items():
            if key == "flag_values":  # CF flags of a boolean: int8 like the stored variable
                assert var.dtype == bool and value.dtype == np.int8 and value.tolist() == [0, 1]
                continue
            assert isinstance(value, (str, int, float)) and not isinstance(value, bool)
    # Masks.
    limit = 0.5 * spec.fleet_spec().node.accelerator.memory_capacity
    np.testing.assert_array_equal(cube["within_memory_limit"], cube["memory_footprint"] <= limit)
    np.testing.assert_array_equal(cube["admissible"], cube["valid"] & cube["within_memory_limit"])
    assert int(cube["n_accelerators"]) == 1024
    assert not cube["valid"].sel(pp_size=5).any()
    assert np.isnan(cube["mfu"].sel(pp_size=5)).all()


def test_dp_size_axis_equals_a_fleet_of_that_size():
    spec = sweep.load_spec({"workload": "Llama3_70B", "fleet": "Training_1K",
                            "axes": {"tp_size": [1, 2, 8], "pp_size": [1, 4, 5],
                                     "dp_size": [1, 2, 8, 64], "zero_stage": [0, 3]},
                            "fixed": {"batch_size": 512, "microbatch_count": 8},
                            "constraints": {"max_accelerators": 1024}})
    cube = sweep.run(spec)
    assert cube["n_accelerators"].dims == ("tp_size", "pp_size", "dp_size")
    n = cube["tp_size"] * cube["pp_size"] * cube["dp_size"]
    xr.testing.assert_equal(cube["n_accelerators"], n.astype(np.int64).rename("n_accelerators")
                            .assign_attrs(cube["n_accelerators"].attrs))
    np.testing.assert_array_equal(cube["valid"], (n % 8 == 0).broadcast_like(cube["valid"]))
    np.testing.assert_array_equal(
        cube["admissible"], cube["valid"] & cube["within_memory_limit"] & (n <= 1024))
    fleet = spec.fleet_spec()
    checked = 0
    for tp in (1, 2, 8):
        for pp in (1, 4, 5):
            for dp in (1, 2, 8, 64):
                if (tp * pp * dp) % 8:
                    continue
                sized = fleet.with_count(tp * pp * dp // 8)
                expected = solver.solve(spec.workload_spec(), sized, tp_size=tp, pp_size=pp,
                                        zero_stage=np.array([0, 3]), batch_size=512,
                                        microbatch_count=8)
                here = cube.sel(tp_size=tp, pp_size=pp, dp_size=dp)
                for name in spec.outputs:
                    np.testing.assert_allclose(here[name].values, expected[name], rtol=1e-12,
                                               err_msg=name)
                checked += 1
    assert checked >= 10


def test_block_size_does_not_change_the_cube():
    spec = {"workload": "GPT3", "fleet": "Training_1K", "dtype": "float32",
            "outputs": ["mfu", "step_latency_total"],
            "axes": {"tp_size": [1, 2, 4, 8], "pp_size": [1, 2, 3, 4, 6, 8],
                     "microbatch_count": list(range(1, 17)), "zero_stage": [0, 1, 2, 3]},
            "fixed": {"batch_size": 1536}}
    whole = sweep.run(spec)
    xr.testing.assert_identical(whole, sweep.run(spec, block_points=7))
    xr.testing.assert_identical(whole, sweep.run(spec, block_points=100))


SMALL = {"workload": "Llama3_70B", "fleet": ["Training_1K", "Research_256"], "dtype": "float32",
         "outputs": ["mfu", "memory_footprint", "feasible"],
         "axes": {"tp_size": [1, 2, 4, 8], "pp_size": [1, 2, 4, 5, 8],
                  "microbatch_count": list(range(1, 33)), "zero_stage": [0, 1, 2, 3],
                  "activation_recomputation": [False, True]},
         "fixed": {"batch_size": 1024}}


def test_loky_workers_give_the_same_cube():
    serial = sweep.run(SMALL)
    xr.testing.assert_identical(serial, sweep.run(SMALL, n_jobs=2, block_points=1000))


def test_dask_backend_gives_the_same_cube():
    distributed = pytest.importorskip("distributed")
    loky = sweep.run(SMALL, n_jobs=2, block_points=1000)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster):
        on_dask = sweep.run(SMALL, backend="dask", block_points=1000)
    xr.testing.assert_identical(loky, on_dask)


def test_dask_backend_needs_a_client():
    pytest.importorskip("distributed")
    with pytest.raises(RuntimeError, match="needs a dask.distributed Client"):
        sweep.run(SMALL, backend="dask")


def test_progress_bar(capsys):
    sweep.run(SMALL, progress=True, block_points=1000)
    assert "config" in capsys.readouterr().err
    sweep.run(SMALL, progress=False)
    sweep.run(SMALL)  # auto: stderr is not a terminal under pytest
    assert capsys.readouterr().err == ""


def test_bad_arguments():
    with pytest.raises(ValueError, match="block_points must be a whole number >= 1, but got 0"):
        sweep.run(SMALL, block_points=0)
    with pytest.deprecated_call(), \
            pytest.raises(ValueError, match="max_points must be a whole number >= 1, but got 0"):
        sweep.run(SMALL, max_points=0)  # the deprecated alias is named as it was spelled
    with pytest.raises(ValueError, match="resume=True .* needs path="):
        sweep.run(SMALL, resume=True)


def test_max_points_is_a_deprecated_alias_of_block_points():
    with pytest.warns(DeprecationWarning, match="use block_points="):
        old = sweep.run(SMALL, max_points=1000)
    xr.testing.assert_identical(sweep.run(SMALL, block_points=1000), old)
    with pytest.warns(DeprecationWarning, match="use block_points="):
        assert len(list(grid.blocks(sweep.load_spec(SMALL), max_points=1000))) == \
            len(list(grid.blocks(sweep.load_spec(SMALL), 1000)))
    with pytest.raises(TypeError, match="got both block_points= and"):
        sweep.run(SMALL, block_points=1000, max_points=1000)
    with pytest.warns(DeprecationWarning, match="solver.blocks.BLOCK_POINTS"):
        assert sweep.evaluate.DEFAULT_MAX_POINTS == solver.blocks.BLOCK_POINTS
    assert grid.DEFAULT_BLOCK_POINTS == solver.blocks.BLOCK_POINTS


def test_cube_dtypes_come_from_the_registry(monkeypatch):
    from solver.outputs import OUTPUTS

    def refuse(*args, **kwargs):
        raise AssertionError("the cube's layout ran the solver")
    monkeypatch.setattr(solver, "solve", refuse)
    layout = sweep.cube.layout(sweep.load_spec({**SMALL, "outputs": list(OUTPUTS)}))
    for name, output in OUTPUTS.items():
        var = layout.variables[name]
        assert (var.dtype == bool) == output.is_boolean, name
        if name not in MASKS:  # valid and feasible are masks of every cube
            assert var.attrs == {"units": output.units, "long_name": output.long_name}
    assert sweep.cube.bool_outputs() == {"valid", "feasible", "idle_ranks", "realizable"}
