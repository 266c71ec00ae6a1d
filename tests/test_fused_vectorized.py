"""The fused kernels' loops over configurations compile to vector code.

A loop LLVM leaves scalar still gives the right bits, so no bitwise test notices; it is
only slower (the megatron kernel's MoE loop went scalar for a stop: a variable set in
one branch and read in another carried a value over from the last iteration, and LLVM
refuses a loop with such a value; 1M Mixtral layouts, 1 thread, 158 -> 116 ms once it
vectorized again). This compiles the kernels in a fresh interpreter, with numba's cache
in a directory of its own (code read from a cache has no assembly to inspect), and counts
the packed float64 divisions in each: the loops are bound by their divisions, so a
vectorized loop has many, a scalar one none.
"""

import atexit
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile

import pytest

pytest.importorskip("numba")

_PROBE = r"""
import json, warnings
import numpy as np
warnings.simplefilter("ignore")
from solver import catalog
from solver.fused import megatron_kernel as mk, mlsysim_kernel as sk
from solver.physics import megatron, mlsysim

rng = np.random.default_rng(0)
n = 64
fleet = catalog.fleet("HGX_H100_1K_MC")
knobs = dict(tp_size=rng.choice([1, 2, 4, 8], n), pp_size=rng.choice([1, 2, 4], n),
             micro_batch_size=rng.choice([1, 2], n), batch_size=np.full(n, 1024))
for name in ("Llama3_70B_MC", "Mixtral_8x7B_MC"):
    megatron.solve(catalog.workload(name), fleet, seq_len=4096, engine="fused", **knobs)
mlsysim.solve(catalog.workload("Llama3_70B"), catalog.fleet("Training_1K"), engine="fused",
              seq_len=4096, batch_size=np.full(n, 1024), tp_size=rng.choice([1, 2, 4, 8], n),
              pp_size=rng.choice([1, 2, 4], n))

def packed_divisions(fn):
    out = {}
    for sig, asm in fn.inspect_asm().items():
        lines = [line.split("#")[0] for line in asm.splitlines()]
        out[str(sig)] = sum(("divpd" in line) and ("xmm" in line or "ymm" in line or "zmm" in line)
                            for line in lines)
    return out

print(json.dumps({"megatron dense, no stage set": packed_divisions(mk._price_block_dense_even),
                  "megatron MoE, no stage set": packed_divisions(mk._price_block_even),
                  "megatron dense, any stages": packed_divisions(mk._price_block_dense),
                  "megatron any": packed_divisions(mk._price_block),
                  "mlsysim": packed_divisions(sk._kernel)}))
"""


X86 = platform.machine().lower() in ("x86_64", "amd64")
_PROBE_RUN = {}


def start_in_background():
    """Start the probe (a minute or two of one core, compiling) if it is not running yet.

    tests/conftest.py calls this as soon as the session's tests are collected, so the probe
    compiles beside the suite's first tests (whose first megatron call compiles as long, in
    the suite's own process) instead of after them: on 2 cores the suite's wall time drops
    by about the probe's length. Run alone, the test starts it itself.
    """
    if _PROBE_RUN or not X86:
        return
    cache = tempfile.mkdtemp(prefix="numba-probe-")
    env = {**os.environ, "NUMBA_CACHE_DIR": cache}
    proc = subprocess.Popen([sys.executable, "-c", _PROBE], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _PROBE_RUN.update(proc=proc, cache=cache)

    def stop():
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(cache, ignore_errors=True)
    atexit.register(stop)


@pytest.mark.skipif(not X86, reason="counts x86-64 instructions (divpd); other architectures "
                                    "name them otherwise")
def test_the_kernels_loops_are_vectorized():
    start_in_background()
    out, err = _PROBE_RUN["proc"].communicate(timeout=900)
    shutil.rmtree(_PROBE_RUN["cache"], ignore_errors=True)
    assert _PROBE_RUN["proc"].returncode == 0, err[-3000:]
    counts = json.loads(out.strip().splitlines()[-1])
    for kernel, per_signature in counts.items():
        assert per_signature, f"{kernel}: nothing compiled"
        for sig, divisions in per_signature.items():
            # the loops make dozens of divisions a configuration (59 and 95 packed ones in
            # the megatron blocks, 4 lanes, on the AVX-512 machine this was written on)
            assert divisions >= 20, (f"{kernel} ({sig[:80]}...): {divisions} packed divisions: "
                                     f"its loop over configurations is no longer vectorized")
