"""The fused kernels' loops over configurations compile to vector code.

A loop LLVM leaves scalar still gives the right bits, so no bitwise test notices; it is
only slower (the megatron kernel's MoE loop went scalar for a stop: a variable set in
one branch and read in another carried a value over from the last iteration, and LLVM
refuses a loop with such a value; 1M Mixtral layouts, 1 thread, 158 -> 116 ms once it
vectorized again). A probe compiles the kernels in a fresh interpreter and counts the
packed float64 divisions in each: the loops are bound by their divisions, so a vectorized
loop has many, a scalar one none.

The probe compiles into numba's own cache (the one the suite's calls read), as soon as the
tests are collected, on the second core: the megatron kernel takes some three minutes to
compile, which the suite's first megatron call would otherwise spend itself (tests/conftest.py
runs the tests that reach the kernel last, and their first call waits for the probe). Code
read from a cache has no assembly to inspect, so where the cache already held the kernels
the probe compiles them again in a cache directory of its own to count.
"""

import atexit
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

pytest.importorskip("numba")

_PROBE = r"""
import json, os, pathlib, shutil, subprocess, sys, tempfile, warnings
import numpy as np
warnings.simplefilter("ignore")
from solver import catalog
from solver.fused import megatron_kernel as mk, mlsysim_kernel as sk
from solver.physics import megatron, mlsysim

only = os.environ.get("PROBE_ONLY", "megatron,mlsysim").split(",")
rng = np.random.default_rng(0)
n = 64
if "megatron" in only:
    fleet = catalog.fleet("HGX_H100_1K_MC")
    knobs = dict(tp_size=rng.choice([1, 2, 4, 8], n), pp_size=rng.choice([1, 2, 4], n),
                 micro_batch_size=rng.choice([1, 2], n), batch_size=np.full(n, 1024))
    for name in ("Llama3_70B_MC", "Mixtral_8x7B_MC"):
        megatron.solve(catalog.workload(name), fleet, seq_len=4096, engine="fused", **knobs)
    if os.environ.get("PROBE_WARM_MARKER"):  # the kernel is in numba's cache now
        pathlib.Path(os.environ["PROBE_WARM_MARKER"]).touch()
        # the kernel's entry for names given as arrays (their characters) as well as one
        # name (its code): the suite calls all four pairs (the blocks are the same)
        # (arrays of names the kernel matches itself: big ones, megatron.FUSED_MIN_POINTS)
        big = {name: np.resize(v, megatron.FUSED_MIN_POINTS) for name, v in knobs.items()}
        names = {"recompute": np.resize(["none", "full"], megatron.FUSED_MIN_POINTS),
                 "precision": np.resize(["bf16", "fp8"], megatron.FUSED_MIN_POINTS)}
        for given in ({"recompute": names["recompute"]}, {"precision": names["precision"]}, names):
            megatron.solve(catalog.workload("Llama3_70B_MC"), fleet, seq_len=4096,
                           engine="fused", **big, **given)
if "mlsysim" in only:
    mlsysim.solve(catalog.workload("Llama3_70B"), catalog.fleet("Training_1K"), engine="fused",
                  seq_len=4096, batch_size=np.full(n, 1024), tp_size=rng.choice([1, 2, 4, 8], n),
                  pp_size=rng.choice([1, 2, 4], n))
families = {"megatron": {"megatron dense, no stage set": mk._price_block_dense_even,
                         "megatron MoE, no stage set": mk._price_block_even,
                         "megatron dense, any stages": mk._price_block_dense,
                         "megatron any": mk._price_block},
            "mlsysim": {"mlsysim": sk._kernel}}

def packed_divisions(fn):
    out = {}
    for sig, asm in fn.inspect_asm().items():
        lines = [line.split("#")[0] for line in asm.splitlines()]
        out[str(sig)] = sum(("divpd" in line) and ("xmm" in line or "ymm" in line or "zmm" in line)
                            for line in lines)
    return out

counts, again = {}, []
for family in only:
    kernels = families[family]
    if any(fn.stats.cache_hits for fn in kernels.values()):
        again.append(family)  # read from numba's cache: no assembly to count
    else:
        counts.update({name: packed_divisions(fn) for name, fn in kernels.items()})
if again:  # compile those again where no cache holds them
    fresh = tempfile.mkdtemp(prefix="numba-probe-", dir=os.environ.get("PROBE_SCRATCH"))
    try:
        env = {**os.environ, "NUMBA_CACHE_DIR": fresh, "PROBE_ONLY": ",".join(again),
               "PROBE_WARM_MARKER": ""}
        run = subprocess.run([sys.executable, "-c", sys.argv[1], sys.argv[1]], env=env,
                             capture_output=True, text=True)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    if run.returncode:
        sys.exit(run.stderr[-3000:])
    counts.update(json.loads(run.stdout.strip().splitlines()[-1]))
print(json.dumps(counts))
"""


X86 = platform.machine().lower() in ("x86_64", "amd64")
_PROBE_RUN = {}


def start_in_background():
    """Start the probe (some three minutes of one core, compiling) if it is not running yet.

    tests/conftest.py calls this as soon as the session's tests are collected, so the probe
    compiles beside the suite's first tests, which do not reach the megatron kernel; run
    alone, the test starts it itself.
    """
    if _PROBE_RUN or not X86:
        return
    scratch = tempfile.mkdtemp(prefix="probe-")
    marker = os.path.join(scratch, "warm")
    err = open(os.path.join(scratch, "stderr"), "w+")
    # a session of its own: stop() ends the probe and the compile it may start in turn
    proc = subprocess.Popen([sys.executable, "-c", _PROBE, _PROBE], stdout=subprocess.PIPE,
                            stderr=err, text=True, start_new_session=True,
                            env={**os.environ, "PROBE_WARM_MARKER": marker, "PROBE_SCRATCH": scratch})
    _PROBE_RUN.update(proc=proc, scratch=scratch, marker=marker, err=err)

    def stop():
        if proc.poll() is None:  # (a probe that exited waited for its compile)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        err.close()
        shutil.rmtree(scratch, ignore_errors=True)
    atexit.register(stop)


def wait_until_warm(timeout=900.0):
    """Block until the probe has put the megatron kernel in numba's cache, or has stopped
    (tests/conftest.py calls this before the suite's first megatron kernel call)."""
    if not _PROBE_RUN:
        return
    proc, marker = _PROBE_RUN["proc"], _PROBE_RUN["marker"]
    end = time.monotonic() + timeout
    while proc.poll() is None and not os.path.exists(marker) and time.monotonic() < end:
        time.sleep(0.25)


@pytest.mark.skipif(not X86, reason="counts x86-64 instructions (divpd); other architectures "
                                    "name them otherwise")
def test_the_kernels_loops_are_vectorized():
    start_in_background()
    out, _ = _PROBE_RUN["proc"].communicate(timeout=900)
    err = _PROBE_RUN["err"]
    err.seek(0)
    assert _PROBE_RUN["proc"].returncode == 0, err.read()[-3000:]
    counts = json.loads(out.strip().splitlines()[-1])
    assert set(counts) == {"megatron dense, no stage set", "megatron MoE, no stage set",
                           "megatron dense, any stages", "megatron any", "mlsysim"}
    for kernel, per_signature in counts.items():
        assert per_signature, f"{kernel}: nothing compiled"
        for sig, divisions in per_signature.items():
            # the loops make dozens of divisions a configuration (59 and 95 packed ones in
            # the megatron blocks, 4 lanes, on the AVX-512 machine this was written on)
            assert divisions >= 20, (f"{kernel} ({sig[:80]}...): {divisions} packed divisions: "
                                     f"its loop over configurations is no longer vectorized")
