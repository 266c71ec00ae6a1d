"""Streamed sweeps survive real interruptions: SIGKILL and SIGINT of a sweep process, then resume.

Each test starts a real sweep in a child process (slowed a little per block, so
it is still running when the signal comes), stops it mid-run, resumes it here
and compares the cube with an uninterrupted in-memory run of the same spec.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import xarray as xr

import sweep
from sweep import evaluate, storage
from sweep.storage import partial_path

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX signals")

ROOT = Path(__file__).resolve().parent.parent
EPOCH = "1764460800"
SPEC = {"workload": ["Llama3_70B", "Mixtral_8x7B"], "fleet": "Training_1K", "dtype": "float32",
        "outputs": ["mfu", "step_latency_total", "memory_footprint", "feasible"],
        "axes": {"tp_size": [1, 2, 4, 8], "pp_size": [1, 2, 4, 5],
                 "microbatch_count": list(range(1, 17)), "zero_stage": [0, 1, 2, 3],
                 "activation_recomputation": [False, True], "precision": ["bf16", "fp8"]},
        "fixed": {"batch_size": 1024},
        "constraints": {"memory_limit": "72 GB", "max_accelerators": 512}}
BLOCK_POINTS = 40  # 256 blocks of 32 points

CHILD = """
import json, sys, time
import sweep
from sweep import evaluate, storage

spec, path = json.loads(sys.argv[1]), sys.argv[2]
delay, assembly_delay = float(sys.argv[3]), float(sys.argv[4])
storage.buffer.STAGE_SECONDS = 0.0  # stage each block as soon as it is priced
real_block, real_write = evaluate._evaluate_block, storage.assemble._write

def slow_block(*args, **kwargs):
    time.sleep(delay)
    return real_block(*args, **kwargs)

def slow_write(*args, **kwargs):
    time.sleep(assembly_delay)
    return real_write(*args, **kwargs)

evaluate._evaluate_block = slow_block
storage.assemble._write = slow_write
print("started", flush=True)
sweep.run(spec, path=path, block_points={block_points})
"""


@pytest.fixture(autouse=True)
def _fixed_date(monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)


@pytest.fixture(scope="module")
def uninterrupted():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SOURCE_DATE_EPOCH", EPOCH)
        return sweep.run(SPEC)


def _start(tmp_path, path, delay=0.01, assembly_delay=0.0):
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(block_points=BLOCK_POINTS))
    env = {**os.environ, "SOURCE_DATE_EPOCH": EPOCH,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, str(script), json.dumps(SPEC), str(path),
                             str(delay), str(assembly_delay)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(child, ready, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        if child.poll() is not None:
            out, err = child.communicate()
            pytest.fail(f"the sweep ended (rc {child.returncode}) before {what}:\n{err[-2000:]}")
        time.sleep(0.02)
    child.kill()
    child.wait()
    pytest.fail(f"timed out waiting for {what}")


def _staged_blocks(path):
    try:
        return storage.staged_progress(partial_path(path))[0]
    except (OSError, ValueError):
        return 0


def _sigkill_when(child, ready, what, settle=0.0):
    """Wait until ``ready()``, then SIGKILL the sweep process and reap it."""
    try:
        _wait_for(child, ready, what)
        time.sleep(settle)
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate()


def _resume_counting(monkeypatch, path):
    """Resume the sweep here; return (cube, blocks priced)."""
    priced = []
    real = evaluate._evaluate_block
    with monkeypatch.context() as mp:
        mp.setattr(evaluate, "_evaluate_block",
                   lambda block, *a, **k: priced.append(block.index) or real(block, *a, **k))
        cube = sweep.run(SPEC, path=path, resume=True)
    return cube, len(priced)


def test_sigkill_mid_sweep_then_resume_is_identical(tmp_path, monkeypatch, uninterrupted):
    path = tmp_path / "killed.nc"
    child = _start(tmp_path, path)
    _sigkill_when(child, lambda: _staged_blocks(path) >= 20, "20 blocks were staged")
    assert not path.exists()
    done, total = storage.staged_progress(partial_path(path))
    assert 20 <= done < total
    with pytest.raises(storage.IncompleteCubeError, match=rf"\({done} of {total} blocks done\)"):
        sweep.open_cube(path)
    with pytest.raises(FileExistsError, match="pass resume=True"):
        sweep.run(SPEC, path=path)
    with pytest.raises(sweep.SpecError, match="cannot resume"):
        sweep.run({**SPEC, "fixed": {"batch_size": 2048}}, path=path, resume=True)
    cube, priced = _resume_counting(monkeypatch, path)
    assert priced == total - done  # only the missing blocks
    xr.testing.assert_identical(uninterrupted, cube.load())
    cube.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["child.py", "killed.nc"]


def test_sigint_mid_sweep_stages_what_was_priced(tmp_path, monkeypatch, uninterrupted):
    path = tmp_path / "interrupted.nc"
    child = _start(tmp_path, path)
    try:
        _wait_for(child, lambda: _staged_blocks(path) >= 10, "10 blocks were staged")
        os.kill(child.pid, signal.SIGINT)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode != 0 and "KeyboardInterrupt" in err
    done, total = storage.staged_progress(partial_path(path))
    assert 10 <= done < total
    assert not [p for p in partial_path(path).iterdir() if ".tmp-" in p.name]
    cube, priced = _resume_counting(monkeypatch, path)
    assert priced == total - done
    xr.testing.assert_identical(uninterrupted, cube.load())
    cube.close()


def test_sigkill_during_assembly_then_resume_only_assembles(tmp_path, monkeypatch,
                                                            uninterrupted):
    path = tmp_path / "assembling.nc"
    child = _start(tmp_path, path, delay=0.0, assembly_delay=0.01)
    _sigkill_when(child, lambda: any(tmp_path.glob("assembling.nc.tmp-*")),
                  "the assembly began", settle=0.1)
    assert not path.exists()
    done, total = storage.staged_progress(partial_path(path))
    assert done == total
    cube, priced = _resume_counting(monkeypatch, path)
    assert priced == 0
    xr.testing.assert_identical(uninterrupted, cube.load())
    cube.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["assembling.nc", "child.py"]
