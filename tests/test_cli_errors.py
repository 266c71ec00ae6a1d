"""Faults at the edges of the command line: one line and status 2 for what the user can fix,
the traceback for a bug.

A damaged cube is a real cube with bytes flipped inside a compressed data chunk
(the header still reads); the storage URLs name a missing directory or a
missing driver.
"""

from __future__ import annotations

import importlib
import sys

import pytest
import xarray as xr

from sweep import cli
from sweep.cli import cubes

SPEC = """\
name = "mid"
workload = "Llama3_70B"
fleet = "Training_1K"
outputs = ["mfu", "step_latency_total", "memory_footprint", "effective_throughput", "feasible"]

[axes]
tp_size = [1, 2, 4, 8]
pp_size = [1, 2, 4, 8]
microbatch_count = { from = 1, to = 64 }
zero_stage = [0, 1, 2, 3]

[fixed]
batch_size = 1024

[constraints]
memory_limit = "72 GB"
"""


def _call(capsys, argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A 4,096-layout spec, its cube, and a copy whose mask data cannot be read."""
    root = tmp_path_factory.mktemp("edges")
    spec = root / "mid.toml"
    spec.write_text(SPEC)
    cube = root / "mid.nc"
    assert cli.main(["run", str(spec), "-o", str(cube), "--no-progress"]) == 0
    return {"root": root, "spec": spec, "cube": cube, "bad": _damage(cube, root / "bad.nc")}


def _reads_every_mask(path) -> bool:
    """Whether the header opens (else None) and the ``admissible`` mask's data reads.

    ``admissible`` is the mask every command reads (``show`` counts it, ``top`` and
    ``plot`` select by it), so damage there must reach each of them.
    """
    try:
        ds = xr.open_dataset(path, engine="netcdf4")
    except Exception:  # noqa: BLE001 - the header itself was hit: try another offset
        return None
    try:
        for name in ("admissible",):
            ds[name].values.sum()
        return True
    except RuntimeError as err:
        assert "NetCDF" in str(err)
        return False
    finally:
        ds.close()


def _damage(cube, out):
    """A copy of ``cube`` with 64 bytes flipped in the middle of ``admissible``'s data."""
    data = cube.read_bytes()
    for offset in range(len(data) // 4, len(data) - 64, 512):
        copy = bytearray(data)
        copy[offset:offset + 64] = bytes(b ^ 0xFF for b in copy[offset:offset + 64])
        out.write_bytes(bytes(copy))
        if _reads_every_mask(out) is False:
            return out
    raise AssertionError(f"no offset of {cube} damaged a mask's data and not the header")


@pytest.mark.parametrize("argv", [
    ["show"], ["top"], ["top", "--where", "feasible"],
    ["plot", "--kind", "heatmap", "--x", "tp_size", "--y", "pp_size"]])
def test_a_damaged_cube_is_one_line(files, capsys, argv):
    extra = ["-o", files["root"] / "x.png"] if argv[0] == "plot" else []
    code, out, err = _call(capsys, [argv[0], files["bad"], *argv[1:], *extra])
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"{files['bad']}: expected a readable cube" in err
    assert "NetCDF: HDF error" in err and "damaged" in err and "layout-sweep run" in err
    assert _call(capsys, [argv[0], files["cube"], *argv[1:], *extra])[0] == 0  # the original


@pytest.mark.parametrize("storage, named", [
    ("/nonexistent/s.log", "/nonexistent does not exist"),
    ("sqlite:////nonexistent/x.db", "/nonexistent does not exist"),
    ("postgresql://nobody:secret@127.0.0.1:9/x", "needs the database driver"),
])
def test_storage_that_cannot_open_is_one_line(files, capsys, monkeypatch, storage, named):
    monkeypatch.setitem(sys.modules, "psycopg2", None)  # no PostgreSQL driver at all
    monkeypatch.setitem(sys.modules, "psycopg", None)
    code, out, err = _call(capsys, ["search", files["spec"], "--trials", "4", "--storage",
                                    storage, "--no-progress"])
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert named in err
    assert storage.replace("secret", "***") in err and "secret" not in err


@pytest.mark.parametrize("error", [ValueError, RuntimeError])
def test_a_bug_in_search_keeps_its_traceback(files, monkeypatch, error):
    def broken(storage):
        raise error("an internal bug")

    # The modules (sweep.search is also the name of the function the package exports).
    monkeypatch.setattr(importlib.import_module("sweep.search.storage"), "open_storage", broken)
    monkeypatch.setattr(importlib.import_module("sweep.search"), "open_storage", broken)
    with pytest.raises(error, match="an internal bug"):
        cli.main(["search", str(files["spec"]), "--trials", "4", "--no-progress"])


@pytest.mark.parametrize("error", [ValueError, RuntimeError, AttributeError])
def test_a_bug_reading_a_cube_keeps_its_traceback(files, monkeypatch, error):
    def broken(path, dataset):
        raise error("an internal bug")

    monkeypatch.setattr(cubes, "_check_masks", broken)
    with pytest.raises(error, match="an internal bug"):
        cli.main(["top", str(files["cube"])])


def _cube_with(tmp_path, capsys, axes: str):
    """The cube of SPEC with ``axes`` (TOML lines) in place of its zero_stage axis."""
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.replace("zero_stage = [0, 1, 2, 3]", axes))
    cube = tmp_path / "spec.nc"
    assert cli.main(["run", str(spec), "-o", str(cube), "--no-progress"]) == 0
    capsys.readouterr()
    return cube


def test_select_on_a_boolean_dim(tmp_path, capsys):
    """--select on a boolean dim (a list of one bool read as a mask raised IndexError)."""
    cube = _cube_with(tmp_path, capsys, "zero_stage = [1, 3]\nactivation_recomputation = [false, true]")
    for value in ("false", "true"):
        code, out, err = _call(capsys, ["top", cube, "-k", "2", "--select",
                                        f"activation_recomputation={value}"])
        assert code == 0, err
        assert f"activation_recomputation={value}" in out


def test_figure_names_are_checked_before_the_work(files, tmp_path, capsys):
    """plot -o: no suffix means .png (and says so); an unknown suffix is one line, status 2."""
    pytest.importorskip("matplotlib")
    code, out, err = _call(capsys, ["plot", files["cube"], "-o", tmp_path / "noext"])
    assert code == 0, err
    assert (tmp_path / "noext.png").exists() and f"wrote {tmp_path / 'noext.png'}" in out
    code, out, err = _call(capsys, ["plot", files["cube"], "-o", tmp_path / "x.foo"])
    assert code == 2 and "expected a figure file ending in one of" in err and "x.foo" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("seed", ["-1", str(2 ** 32), "x"])
def test_search_seed_outside_numpy_range_is_one_line(files, capsys, seed):
    code, out, err = _call(capsys, ["search", files["spec"], "--seed", seed, "--mode", "sampled"])
    assert code == 2 and "expected a whole number in [0, 2**32 - 1]" in err


def test_search_seed_is_checked_in_every_mode(files):
    import sweep
    for mode in ("sampled", "exhaustive", "auto"):
        with pytest.raises(ValueError, match="seed must be a whole number"):
            sweep.search(str(files["spec"]), seed=-1, mode=mode)


def test_the_packages_warnings_are_one_line(tmp_path, capsys):
    """A warning of ours (here: MFU across precisions) prints as 'prog: warning: ...', not
    Python's file path and source line."""
    cube = _cube_with(tmp_path, capsys, 'zero_stage = [1]\nprecision = ["fp16", "fp8"]')
    code, out, err = _call(capsys, ["top", cube, "-k", "1"])
    assert code == 0, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("layout-sweep: warning: objective 'mfu'")
    assert ".py:" not in err


def test_a_minimum_above_the_maximum_is_refused(files, capsys):
    """top had run with --min-accelerators 64 --max-accelerators 32 and said no layout was
    admissible (exit 3); the spec parser already refused min > max."""
    code, out, err = _call(capsys, ["top", files["cube"], "--max-accelerators", "32",
                                    "--min-accelerators", "64"])
    assert code == 2 and out == ""
    assert "--min-accelerators: expected at most --max-accelerators (32), but got 64" in err


@pytest.mark.parametrize("command", [["run", "-o", "x.nc"], ["search"]])
def test_a_workload_that_is_no_transformer_under_megatron_is_one_line(tmp_path, capsys, command):
    """A spec of ViT_Large (kind generic) under a physics axis with megatron had run into
    the solver's ValueError: a 20-line traceback, exit 1. It is a spec error: one line naming
    the entry, status 2, before any work."""
    spec = tmp_path / "wl.toml"
    spec.write_text('workload = ["Llama3_70B_MC", "ViT_Large"]\nfleet = "HGX_H100_1K_MC"\n'
                    'physics = ["mlsysim", "megatron"]\n[axes]\ntp_size = [1, 8]\n'
                    '[fixed]\nbatch_size = 1024\nseq_len = 4096\n')
    argv = [command[0], spec, *[tmp_path / a if a.endswith(".nc") else a for a in command[1:]]]
    code, out, err = _call(capsys, argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert lines[0].endswith(
        "wl.toml: workload[1]: expected a transformer (kind 'transformer' or 'moe') under "
        "physics = [\"mlsysim\", \"megatron\"], but got 'ViT_Large', of kind 'generic': the "
        "megatron physics prices transformers only; price it with physics = \"mlsysim\"")
    assert "Traceback" not in err and not (tmp_path / "x.nc").exists()
