"""Faults at the edges of a machine: a small /dev/shm, a killed parent, no room for the cube.

Each test builds the fault for real where it can (a 1 MiB tmpfs, a SIGKILL, an
address-space cap in a subprocess); where it needs privileges (mounting) it is
skipped outside CI with the reason, and must pass under CI (``CI`` set: root).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import sweep
from sweep import evaluate

ROOT = Path(__file__).resolve().parents[1]

#: 107,520 points, about 1.6 MiB of cube: more than the 1 MiB tmpfs below holds.
BIG = {"workload": "Llama3_70B", "fleet": "Training_1K", "dtype": "float32",
       "outputs": ["mfu", "step_latency_total", "memory_footprint", "feasible"],
       "axes": {"tp_size": {"powers_of_two": 64}, "pp_size": {"divisors_of": "layers"},
                "microbatch_count": {"from": 1, "to": 64}, "zero_stage": [0, 1, 2, 3],
                "activation_recomputation": [False, True], "v_stages": [1, 2, 4]},
       "fixed": {"batch_size": 1024}, "constraints": {"memory_limit": "72 GB"}}


@pytest.fixture(autouse=True)
def _fixed_date(monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1764460800")


@pytest.fixture(scope="module")
def in_this_process():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SOURCE_DATE_EPOCH", "1764460800")
        return sweep.run(BIG)


@pytest.fixture
def small_shm(tmp_path):
    """A 1 MiB tmpfs (a container's small /dev/shm), mounted for the test and removed after."""
    where = tmp_path / "shm"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"under CI the tests run as root and must mount a tmpfs: {done.stderr}")
        pytest.skip(f"mounting a tmpfs needs root here ({done.stderr.strip()})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _record_directories(monkeypatch) -> list:
    used = []
    real = evaluate._SharedArrays._allocate

    def spy(self, *args):
        used.append(self.directory)
        return real(self, *args)
    monkeypatch.setattr(evaluate._SharedArrays, "_allocate", spy)
    return used


def test_small_shared_memory_falls_back_to_a_file(small_shm, monkeypatch, in_this_process):
    monkeypatch.setenv("SWEEP_SHARED_MEMORY", str(small_shm))
    used = _record_directories(monkeypatch)
    cube = sweep.run(BIG, n_jobs=2)
    xr.testing.assert_identical(in_this_process, cube)
    assert len(used) == 1 and not used[0].startswith(str(small_shm))  # the free-space check
    assert os.listdir(small_shm) == []


def test_a_tmpfs_filled_after_the_check_is_caught_before_any_worker_writes(
        small_shm, monkeypatch, in_this_process):
    # The free-space check passes (another process could fill the tmpfs right after it):
    # the files are allocated up front, ENOSPC comes here, and the sweep moves to the disk.
    # Without the allocation both workers die of SIGBUS (TerminatedWorkerError).
    monkeypatch.setenv("SWEEP_SHARED_MEMORY", str(small_shm))
    monkeypatch.setattr(evaluate, "_free_bytes", lambda directory: 1 << 60)
    used = _record_directories(monkeypatch)
    cube = sweep.run(BIG, n_jobs=2)
    xr.testing.assert_identical(in_this_process, cube)
    assert len(used) == 2 and used[0].startswith(str(small_shm))
    assert not used[1].startswith(str(small_shm))
    assert os.listdir(small_shm) == []


def test_shared_memory_with_room_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("SWEEP_SHARED_MEMORY", str(tmp_path))
    used = _record_directories(monkeypatch)
    spec = {**BIG, "axes": {"tp_size": [1, 2, 8], "pp_size": [1, 4]}}
    xr.testing.assert_identical(sweep.run(spec), sweep.run(spec, n_jobs=2))
    assert len(used) == 1 and used[0].startswith(str(tmp_path))
    assert list(tmp_path.iterdir()) == []  # removed at the end


def test_no_room_anywhere_is_refused_with_the_numbers(monkeypatch):
    monkeypatch.setattr(evaluate, "_free_bytes", lambda directory: 1 << 20)
    with pytest.raises(OSError, match=r"expected a folder with 2 MiB free, but .* has 1 MiB "
                                      r"free.*stream it to a file instead \(path=\.\.\., or "
                                      r"`-o cube\.nc`"):
        sweep.run(BIG, n_jobs=2)


# ----------------------------------------------------------------------------- killed parent

def _children(pid: int) -> list:
    """Pids whose parent is ``pid`` (from /proc/<pid>/stat; psutil is not a dependency)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"  # a zombie has exited


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


LONG_SPEC = """
name = "long"
workload = "Llama3_70B"
fleet = "Training_1K"
dtype = "float32"
[axes]
tp_size = { powers_of_two = 64 }
pp_size = { divisors_of = "layers" }
microbatch_count = { from = 1, to = 64 }
zero_stage = [0, 1, 2, 3]
activation_recomputation = [false, true]
v_stages = [1, 2, 4]
seq_len = [2048, 4096, 8192]
efficiency = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
[fixed]
batch_size = 1024
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")
def test_workers_exit_within_seconds_of_a_killed_parent(tmp_path):
    spec = tmp_path / "long.toml"
    # 7 x 10 x 64 x 4 x 2 x 3 x 3 x 8 = 10.3M layouts: minutes on 2 workers.
    spec.write_text(LONG_SPEC)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen([sys.executable, "-m", "sweep", "run", str(spec), "--jobs", "2",
                               "-o", str(tmp_path / "x.nc"), "--no-progress"],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    workers = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and parent.poll() is None:
            kids = _children(parent.pid)
            workers = [k for k in kids if "loky" in _command_line(k)
                       or "joblib" in _command_line(k)]
            if len([k for k in workers if "resource_tracker" not in _command_line(k)]) >= 2 \
                    and list(tmp_path.glob("x.nc.partial/blocks-*")):
                break  # both workers run and blocks are being staged
            time.sleep(0.2)
        assert parent.poll() is None, parent.communicate()
        tracker = [k for k in workers if "resource_tracker" in _command_line(k)]
        pool = [k for k in workers if k not in tracker]
        assert len(pool) >= 2, [(k, _command_line(k)) for k in _children(parent.pid)]
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        gone_by = time.monotonic() + 10
        while time.monotonic() < gone_by and any(_alive(k) for k in workers):
            time.sleep(0.1)
        left = [(k, _command_line(k)) for k in workers if _alive(k)]
        assert not left, f"still running 10 s after their parent's SIGKILL: {left}"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for k in workers:  # nothing of ours is left behind, even when the test fails
            if _alive(k):
                os.kill(k, signal.SIGKILL)


# ----------------------------------------------------------------------------- pre-flight checks

def test_a_cube_too_big_for_the_address_space_is_refused_with_the_numbers():
    import resource

    def cap():  # 12 GiB of address space, as a batch scheduler would grant
        resource.setrlimit(resource.RLIMIT_AS, (12 * 2 ** 30, 12 * 2 ** 30))
    done = subprocess.run([sys.executable, "-m", "sweep", "--spec",
                           str(ROOT / "configs/sweeps/search_llama70b.toml"), "--no-save"],
                          preexec_fn=cap, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd="/tmp")
    # Before: "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 19.7 GiB", exit 1
    # (for the spec's former 2.64e9 layouts).
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    for text in ("an in-memory sweep of 'search_llama70b' needs about 81.3 GiB",
                 "440,401,920 points x 198 B of cube",
                 "the address-space limit (RLIMIT_AS) of 12.0 GiB leaves",
                 "search_llama70b.toml -o cube.nc"):
        assert text in done.stderr, done.stderr


def test_memory_check_counts_cube_and_temporaries(monkeypatch):
    from sweep import preflight

    spec = sweep.load_spec(BIG)
    assert sweep.cube.layout(spec).bytes_per_point() == 17  # 3 float32 outputs, 5 masks
    need = 17 * spec.size + preflight.SOLVE_BYTES_PER_POINT * spec.size  # one block: all
    monkeypatch.setattr(preflight, "available_memory", lambda: (need - 1, "a test's budget"))
    with pytest.raises(preflight.ResourceError,
                       match=r"needs about 0\.0 GiB \(107,520 points x 17 B of cube.*only 0\.0 "
                             r"GiB is available \(a test's budget\): stream it"):
        sweep.run(BIG, block_points=2 ** 17)
    monkeypatch.setattr(preflight, "available_memory", lambda: (need, "a test's budget"))
    assert sweep.run(BIG, block_points=2 ** 17).sizes["tp_size"] == 7


def test_a_disk_too_small_is_refused_before_anything_is_staged(monkeypatch, tmp_path, capsys):
    from sweep import preflight
    from sweep.cli import main

    monkeypatch.setattr(preflight, "free_disk", lambda folder: 100_000)
    path = tmp_path / "big.nc"
    with pytest.raises(preflight.ResourceError,
                       match=r"a streamed sweep of 'sweep' needs up to 0\.00 GiB of disk \(its "
                             r"0\.00 GiB cube compressed at least 4x, staged in big\.nc\.partial "
                             r".* has 0\.00 GiB free"):
        sweep.run(BIG, path=path)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(preflight, "free_disk", lambda folder: 2 * 17 * 107_520 // 4)
    sweep.run(BIG, path=path).close()  # exactly enough
    spec = tmp_path / "big.toml"
    spec.write_text(LONG_SPEC)
    monkeypatch.setattr(preflight, "free_disk", lambda folder: 100_000)
    code = main(["run", str(spec), "-o", str(tmp_path / "long.nc"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert "needs up to" in err and "GiB free" in err


def test_staged_blocks_are_compressed(monkeypatch, tmp_path):
    import zipfile

    from sweep.storage import partial_path

    real = evaluate._evaluate_block
    count = {"n": 0}

    def stop_after_three(*args, **kwargs):
        count["n"] += 1
        if count["n"] > 3:
            raise KeyboardInterrupt("stopped")
        return real(*args, **kwargs)
    monkeypatch.setattr(evaluate, "_evaluate_block", stop_after_three)
    path = tmp_path / "c.nc"
    with pytest.raises(KeyboardInterrupt):
        sweep.run(BIG, path=path, block_points=10_000)
    staged = sorted(partial_path(path).glob("blocks-*.npz"))
    assert staged
    raw = compressed = 0
    for file in staged:
        with zipfile.ZipFile(file) as archive:
            for info in archive.infolist():
                assert info.compress_type == zipfile.ZIP_DEFLATED, info
                raw += info.file_size
                compressed += info.compress_size
    assert compressed < raw / 3, (compressed, raw)  # before: stored, compressed == raw
    monkeypatch.setattr(evaluate, "_evaluate_block", real)
    resumed = sweep.run(BIG, path=path, resume=True)
    xr.testing.assert_identical(sweep.run(BIG), resumed.load())
    resumed.close()
