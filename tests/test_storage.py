"""Cubes on disk (sweep.storage): exact round trips, streamed sweeps, atomic writes, resume."""

from __future__ import annotations

import json

import netCDF4
import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sweep
from sweep import cube as cube_
from sweep import evaluate, storage
from sweep.storage import partial_path

# These searches rank mfu over spaces with bf16 and fp8 on purpose; the warning that
# gives is asserted in test_search.py::test_utilization_objective_across_precisions_warns and
# test_analysis.py, not repeated in every report.
pytestmark = pytest.mark.filterwarnings("ignore::sweep.analysis.UtilizationWarning")


@pytest.fixture(autouse=True)
def _fixed_date(monkeypatch):
    # Both runs of a comparison carry the same date_created (reproducible files).
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1764460800")


SPEC = {"workload": ["Llama3_70B", "Mixtral_8x7B"], "fleet": "Training_1K", "dtype": "float32",
        "outputs": ["mfu", "step_latency_total", "memory_footprint", "feasible", "idle_ranks"],
        "axes": {"tp_size": [1, 2, 4, 8], "pp_size": [1, 2, 4, 5],
                 "microbatch_count": list(range(1, 17)), "zero_stage": [0, 1, 2, 3],
                 "activation_recomputation": [False, True], "precision": ["bf16", "fp8"]},
        "fixed": {"batch_size": 1024},
        "constraints": {"memory_limit": "72 GB", "max_accelerators": 512}}

CLUSTER = {"workload": "Llama3_70B", "fleet": "Training_1K",
           "axes": {"tp_size": [1, 2, 8], "pp_size": [1, 4, 5], "dp_size": [1, 2, 8, 64],
                    "efficiency": [0.4, 0.5]},
           "fixed": {"batch_size": 512}, "constraints": {"max_accelerators": 256}}


@pytest.fixture(scope="module")
def cube():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SOURCE_DATE_EPOCH", "1764460800")
        return sweep.run(SPEC)


def test_save_round_trips_exactly(cube, tmp_path):
    path = sweep.save(cube, tmp_path / "cube.nc")
    back = xr.load_dataset(path)
    xr.testing.assert_identical(cube, back)
    for name in ("feasible", "valid", "admissible", "activation_recomputation"):
        assert back[name].dtype == bool
    assert back["mfu"].dtype == np.float32
    assert back["mfu"].encoding["zlib"] and back["mfu"].encoding["complevel"] == storage.COMPLEVEL
    assert not partial_path(path).exists()


def test_a_file_in_a_missing_directory_is_refused_before_the_work(cube, tmp_path, monkeypatch):
    """sweep.save into a missing directory said "Permission denied" on its temporary name,
    and sweep.run(path=) a bare FileNotFoundError; both name the missing directory now, and
    run says so before it prices anything."""
    target = tmp_path / "nodir" / "x.nc"
    with pytest.raises(FileNotFoundError, match=r"expected a file in an existing directory, "
                                                 r"but got .*x\.nc.*nodir does not exist"):
        sweep.save(cube, target)
    with pytest.raises(IsADirectoryError, match="expected a file, but got the directory"):
        sweep.save(cube, tmp_path)
    priced = []
    monkeypatch.setattr(evaluate, "_evaluate_block",
                        lambda *a, **k: priced.append(1) or (_ for _ in ()).throw(AssertionError))
    with pytest.raises(FileNotFoundError, match="nodir does not exist"):
        sweep.run(CLUSTER, path=target)
    assert not priced and not (tmp_path / "nodir").exists()


def test_save_compresses(cube, tmp_path):
    packed = sweep.save(cube, tmp_path / "packed.nc")
    plain = sweep.save(cube, tmp_path / "plain.nc", complevel=0)
    assert packed.stat().st_size < 0.7 * plain.stat().st_size


@pytest.mark.parametrize("spec", [SPEC, CLUSTER], ids=["workload_axis", "dp_size_axis"])
@pytest.mark.parametrize("n_jobs", [1, 2])
def test_streamed_equals_in_memory(spec, n_jobs, tmp_path):
    in_memory = sweep.run(spec)
    path = tmp_path / "streamed.nc"
    streamed = sweep.run(spec, path=path, block_points=300, n_jobs=n_jobs)
    assert not streamed["mfu"].variable._in_memory  # opened lazily
    xr.testing.assert_identical(in_memory, streamed.load())
    assert not partial_path(path).exists()
    streamed.close()


# Every axis a split knob (and physics): n_accelerators spans every dim of the cube.
_JOB = {"batch_size": 256, "seq_len": 8192}
_MLSYSIM_FITS = {"microbatch_count": 16, "activation_recomputation": True}


@pytest.mark.parametrize("physics, axes, fixed", [
    ("mlsysim", {"tp_size": [1, 2], "pp_size": [1, 2, 4], "dp_size": [8, 16]}, _MLSYSIM_FITS),
    ("megatron", {"tp_size": [1, 2], "cp_size": [1, 2, 4], "dp_size": [8, 16]}, {}),
    (["mlsysim", "megatron"], {"tp_size": [1, 2], "cp_size": [1, 2, 4], "dp_size": [8, 16]},
     _MLSYSIM_FITS),
], ids=["mlsysim", "megatron", "physics_axis"])
def test_streamed_n_accelerators_spanning_every_dim(physics, axes, fixed, tmp_path):
    """A streamed cube whose n_accelerators spans every dim (each axis a split knob) held
    uninitialised memory there: the file took it for a variable the blocks write, and none
    did. It is the spec's, written from the staged value, as in memory."""
    spec = {"workload": "Llama3_8B_MC", "fleet": "HGX_H100_1K_MC", "physics": physics,
            "axes": axes, "fixed": {**_JOB, **fixed}}
    path = tmp_path / "split.nc"
    streamed = sweep.run(spec, path=path, block_points=5)  # first: no freed cube to reuse
    in_memory = sweep.run(spec)
    assert streamed["n_accelerators"].dims == tuple(streamed.dims) == in_memory["mfu"].dims
    xr.testing.assert_identical(in_memory, streamed.load())
    # each layout's own count: tp * pp * dp (mlsysim), tp * pp * cp * dp (megatron)
    models = [physics] if isinstance(physics, str) else physics
    for model in models:
        part = in_memory.sel(physics=model) if "physics" in in_memory.dims else in_memory
        file_part = streamed.sel(physics=model) if "physics" in streamed.dims else streamed
        counted = file_part["n_accelerators"]
        expected = xr.ones_like(counted)
        for name in ("tp_size", "pp_size", "dp_size") + (("cp_size",) if model == "megatron"
                                                         else ()):
            if name in counted.coords:
                expected = expected * counted[name]
        np.testing.assert_array_equal(counted.values, expected.transpose(*counted.dims).values)
        # top_k's accelerator bound reads n_accelerators from the file
        opened = sweep.open_cube(path)
        ranked_file = sweep.top_k(opened.sel(physics=model) if "physics" in opened.dims
                                  else opened, k=3, constraints={"max_accelerators": 32})
        ranked = sweep.top_k(part, k=3, constraints={"max_accelerators": 32})
        assert ranked_file.sizes["rank"] == ranked.sizes["rank"] > 0
        assert (ranked_file["n_accelerators"] <= 32).all()
        for name in ("tp_size", "dp_size", "n_accelerators", "mfu"):
            np.testing.assert_array_equal(ranked_file[name].values, ranked[name].values)
        np.testing.assert_array_equal(
            ranked_file["n_accelerators"].values,
            np.prod([ranked_file[n].values for n in ("tp_size", "pp_size", "cp_size", "dp_size")
                     if n in ranked_file and (n != "cp_size" or model == "megatron")], axis=0))
        opened.close()
    streamed.close()


def test_streamed_file_uses_xarrays_conventions(tmp_path):
    path = tmp_path / "streamed.nc"
    sweep.run(SPEC, path=path).close()
    with netCDF4.Dataset(path) as ds:
        assert ds["valid"].dtype == np.int8 and ds["valid"].getncattr("dtype") == "bool"
        assert ds["activation_recomputation"].getncattr("dtype") == "bool"
        assert ds["precision"].dtype is str and ds["workload"].dtype is str
        assert ds["mfu"].dtype == np.float32 and np.isnan(ds["mfu"].getncattr("_FillValue"))
        assert ds["mfu"].filters()["zlib"] and ds["mfu"].filters()["complevel"] == 4
        assert not [a for a in ds.ncattrs() if a.startswith("sweep_partial")]
    back = sweep.open_cube(path)
    assert back["valid"].dtype == bool
    back.close()


def test_streaming_never_allocates_the_cube(monkeypatch, tmp_path):
    def refuse(*args, **kwargs):
        raise AssertionError("a streamed sweep allocated the whole cube")
    monkeypatch.setattr(cube_, "allocate", refuse)
    sweep.run(SPEC, path=tmp_path / "s.nc", block_points=1000).close()


def _interrupt_after(monkeypatch, calls):
    real = evaluate._evaluate_block
    count = {"n": 0}

    def flaky(*args, **kwargs):
        count["n"] += 1
        if count["n"] > calls:
            raise KeyboardInterrupt("stopped")
        return real(*args, **kwargs)
    monkeypatch.setattr(evaluate, "_evaluate_block", flaky)


def test_interrupted_sweep_resumes(monkeypatch, tmp_path):
    path = tmp_path / "resumed.nc"
    with monkeypatch.context() as mp:
        _interrupt_after(mp, 5)
        with pytest.raises(KeyboardInterrupt):
            sweep.run(SPEC, path=path, block_points=500)
    assert not path.exists() and partial_path(path).is_dir()  # atomic: no half file at path
    assert storage.staged_progress(partial_path(path))[0] == 5  # what was priced is staged
    with pytest.raises(sweep.SpecError, match=r"cannot resume .*\(differs in variables idle_ranks, "
                       r"memory_footprint, step_latency_total; attributes spec\)"):
        sweep.run({**SPEC, "outputs": ["mfu"]}, path=path, resume=True)
    # The block size of the staged sweep is kept, whatever block_points says now; only the
    # missing blocks are priced.
    priced = []
    real = evaluate._evaluate_block
    monkeypatch.setattr(evaluate, "_evaluate_block",
                        lambda block, *a, **k: priced.append(block.index) or real(block, *a, **k))
    resumed = sweep.run(SPEC, path=path, resume=True, block_points=10_000)
    assert len(priced) == len(list(sweep.grid.blocks(sweep.load_spec(SPEC), 500))) - 5
    xr.testing.assert_identical(sweep.run(SPEC), resumed.load())
    resumed.close()
    assert not partial_path(path).exists()


def test_resume_returns_a_finished_file(monkeypatch, tmp_path):
    path = tmp_path / "done.nc"
    sweep.run(SPEC, path=path).close()
    before = path.stat().st_mtime_ns, path.stat().st_ino
    expected = sweep.run(SPEC)  # priced in memory, before any evaluation is made to raise
    _interrupt_after(monkeypatch, 0)  # any evaluation would raise
    again = sweep.run(SPEC, path=path, resume=True)
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == before  # the file was not rewritten
    assert not again["mfu"].variable._in_memory  # the finished file, opened lazily
    xr.testing.assert_identical(expected, again.load())
    again.close()


def test_without_resume_staged_blocks_are_refused_not_replaced(monkeypatch, tmp_path, capsys):
    path = tmp_path / "fresh.nc"
    with monkeypatch.context() as mp:
        _interrupt_after(mp, 2)
        with pytest.raises(KeyboardInterrupt):
            sweep.run(SPEC, path=path, block_points=500)
    with pytest.raises(FileExistsError, match=r"holds an unfinished sweep of spec 'sweep' "
                                              r"\(2 of \d+ blocks done\): pass resume=True"):
        sweep.run(SPEC, path=path)
    with pytest.raises(FileExistsError, match="of another spec or catalog, so delete it"):
        sweep.run({**SPEC, "dtype": "float64"}, path=path)
    # the command line's one line names --resume once, in the message itself
    from sweep.cli import main

    toml = tmp_path / "sweep.toml"  # SPEC as TOML (JSON's lists, strings and bools are TOML's)
    toml.write_text("\n".join(
        [f"{k} = {json.dumps(v)}" for k, v in SPEC.items() if not isinstance(v, dict)]
        + [line for table in ("axes", "fixed", "constraints") for line in
           [f"[{table}]"] + [f"{k} = {json.dumps(v)}" for k, v in SPEC[table].items()]]) + "\n")
    assert main(["run", str(toml), "-o", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("pass resume=True (--resume on the command line) to go on from it, or "
                        "delete it to start anew") and err.count("--resume") == 1
    done, total = storage.staged_progress(partial_path(path))
    assert done == 2  # nothing was lost
    # resumed on the command line: no rate over points an earlier run priced
    assert main(["run", str(toml), "-o", str(path), "--resume", "--no-progress",
                 "--block-points", "500"]) == 0
    out = capsys.readouterr().out
    assert f"resumed: 2 of {total:,} blocks were staged by an earlier run; the other " \
           f"{total - 2:,} priced and the cube written in " in out
    assert "layouts/s" not in out
    resumed = sweep.run(SPEC, path=path, resume=True).load()  # the finished file, as it is
    expected = sweep.run(SPEC)
    expected.attrs["spec_source"] = str(toml)  # (the command line read the spec from its file)
    xr.testing.assert_identical(expected, resumed)
    resumed.close()


def test_incomplete_cubes_are_refused_unless_allowed(monkeypatch, tmp_path):
    path = tmp_path / "half.nc"
    with monkeypatch.context() as mp:
        _interrupt_after(mp, 3)
        with pytest.raises(KeyboardInterrupt):
            sweep.run(SPEC, path=path, block_points=500)
    with pytest.raises(storage.IncompleteCubeError,
                       match=r"no finished cube at .*half\.nc: only an unfinished sweep staged "
                             r"at .*half\.nc\.partial \(3 of \d+ blocks done\); resume it .*"
                             r"or pass allow_partial=True"):
        sweep.open_cube(path)
    whole = sweep.run(SPEC)
    # the command line's show reads it too (there is no file at the path yet)
    from sweep import cli
    assert cli.main(["show", str(path), "--allow-partial"]) == 0
    for where in (path, partial_path(path)):
        part = sweep.open_cube(where, allow_partial=True)
        assert part.attrs["complete"] == 0 and part.attrs["blocks_done"] == 3
        assert 0 < int(part["valid"].sum()) < int(whole["valid"].sum())
        # What is staged is exactly the full run's values; the rest is NaN / False.
        xr.testing.assert_identical(part["mfu"].where(~np.isnan(part["mfu"])),
                                    whole["mfu"].where(~np.isnan(part["mfu"])))
        assert not (part["admissible"] & ~whole["admissible"]).any()
        for analysis in (lambda c, **k: sweep.top_k(c, **k),
                         lambda c, **k: sweep.best_along(c, "tp_size", **k),
                         lambda c, **k: sweep.pareto_front(c, **k)):
            with pytest.raises(storage.IncompleteCubeError, match="allow_partial=True"):
                analysis(part)
            analysis(part, allow_partial=True)
    # A file without complete = 1 (e.g. a foreign or hand-edited file) is refused too.
    foreign = tmp_path / "foreign.nc"
    bare = whole.copy()
    bare.attrs = {}
    sweep.save(bare, foreign)
    with pytest.raises(storage.IncompleteCubeError,
                       match=r"foreign\.nc is not a finished cube: expected the attribute "
                             r"complete = 1 .* but got complete = missing"):
        sweep.open_cube(foreign)
    opened = sweep.open_cube(foreign, allow_partial=True)
    assert opened.attrs["complete"] == 0
    opened.close()


def test_kill_during_assembly_repeats_only_the_assembly(monkeypatch, tmp_path):
    path = tmp_path / "assembled.nc"
    real_write = storage.assemble._write
    calls = {"n": 0}

    def dying_write(var, index, value):
        calls["n"] += 1
        if calls["n"] > 60:
            raise KeyboardInterrupt("stopped while assembling")
        real_write(var, index, value)
    with monkeypatch.context() as mp:
        mp.setattr(storage.assemble, "_write", dying_write)
        with pytest.raises(KeyboardInterrupt):
            sweep.run(SPEC, path=path, block_points=500)
    assert not path.exists() and not list(tmp_path.glob("assembled.nc.tmp-*"))
    done, total = storage.staged_progress(partial_path(path))
    assert done == total
    # A file left by a process killed while assembling is cleaned up.
    (tmp_path / "assembled.nc.tmp-999999999").write_bytes(b"half a file")
    with monkeypatch.context() as mp:
        _interrupt_after(mp, 0)  # nothing is priced again
        resumed = sweep.run(SPEC, path=path, resume=True)
    xr.testing.assert_identical(sweep.run(SPEC), resumed.load())
    resumed.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["assembled.nc"]


def test_a_second_writer_is_refused(tmp_path):
    path = tmp_path / "shared.nc"
    spec = sweep.load_spec(SPEC)
    cube_layout = cube_.layout(spec)
    first = storage.StreamWriter(path, cube_layout, spec=spec, block_points=500)
    with pytest.raises(FileExistsError, match="being written by another process"):
        storage.StreamWriter(path, cube_layout, spec=spec, block_points=500, resume=True)
    first.close()
    again = storage.StreamWriter(path, cube_layout, spec=spec, block_points=500, resume=True)
    assert again.done == set()
    again.close()


def test_save_is_atomic(cube, tmp_path, monkeypatch):
    path = sweep.save(cube, tmp_path / "kept.nc")
    before = path.read_bytes()

    def broken(*args, **kwargs):
        raise KeyboardInterrupt("stopped while saving")
    monkeypatch.setattr(xr.Dataset, "to_netcdf", broken)
    with pytest.raises(KeyboardInterrupt):
        sweep.save(cube.isel(tp_size=[0]), path)
    assert path.read_bytes() == before  # the old file is intact, nothing left aside
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.nc"]


def test_open_cube_is_lazy_and_chunks_with_dask(cube, tmp_path):
    path = sweep.save(cube, tmp_path / "lazy.nc")
    lazy = sweep.open_cube(path)
    assert not lazy["mfu"].variable._in_memory
    lazy.close()
    pytest.importorskip("dask")
    chunked = sweep.open_cube(path, chunks={})  # the file's own chunks
    assert chunked["mfu"].chunks is not None
    xr.testing.assert_identical(cube, chunked.compute())
    chunked.close()
    with pytest.raises(FileNotFoundError, match="no cube at"):
        sweep.open_cube(tmp_path / "missing.nc")


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tp=st.sets(st.sampled_from([1, 2, 3, 4, 8]), min_size=1),
       mb=st.sets(st.integers(1, 64), min_size=1, max_size=4),
       dtype=st.sampled_from(["float32", "float64"]),
       recompute=st.sampled_from([[False], [True], [False, True]]))
def test_round_trip_property(tmp_path, tp, mb, dtype, recompute):
    spec = {"workload": "GPT3", "fleet": "Training_1K", "dtype": dtype,
            "axes": {"tp_size": sorted(tp) + [16], "microbatch_count": sorted(mb),
                     "activation_recomputation": recompute}}
    cube = sweep.run(spec)
    path = tmp_path / f"p-{dtype}.nc"
    xr.testing.assert_identical(cube, xr.load_dataset(sweep.save(cube, path)))
    streamed = sweep.run(spec, path=path, block_points=5)
    xr.testing.assert_identical(cube, streamed.load())
    streamed.close()


def test_block_buffer_stages_consecutive_blocks_together(monkeypatch):
    from sweep.storage.buffer import BlockBuffer

    monkeypatch.setattr(storage.buffer, "STAGE_SECONDS", 3600.0)
    written = []
    buffer = BlockBuffer(["mfu"], lambda first, stop, arrays: written.append(
        (first, stop, sorted(arrays))))
    for n in (0, 1, 2, 5):  # a gap after 2: blocks 0-2 are staged before 5 is gathered
        buffer.add(n, (slice(n, n + 1),), {"mfu": np.full(1, n), "unused": np.zeros(1)})
    assert written == [(0, 3, ["b0.index", "b0.mfu", "b1.index", "b1.mfu", "b2.index",
                               "b2.mfu"])]
    buffer.flush()
    buffer.flush()  # nothing gathered: nothing written
    assert written[1:] == [(5, 6, ["b5.index", "b5.mfu"])]
