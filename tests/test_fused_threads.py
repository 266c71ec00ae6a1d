"""Fused calls spread over threads: the same bits as one thread and as the numpy path.

``solver.fused.in_ranges`` cuts a flat call into consecutive ranges priced in
threads (the kernels release the GIL). A range that is sliced wrong (an input
holding several items per configuration, like the precision's characters)
shows up as a mismatch in the second range, so the threshold is lowered here to
make small draws split.
"""

from __future__ import annotations

import numpy as np
import pytest

from solver import catalog, fused
from solver.physics import megatron as M
from solver.physics import mlsysim

pytestmark = pytest.mark.skipif(not fused.NUMBA, reason="numba is not installed")

import test_fused_megatron as meg  # noqa: E402  (its draw of every megatron knob)
import test_fused_mlsysim as mls  # noqa: E402  (its draw of every mlsysim knob)

N = 3001  # odd: the ranges are uneven


@pytest.fixture
def split_small(monkeypatch):
    monkeypatch.setattr(fused, "THREAD_MIN_POINTS", 500)
    monkeypatch.setenv(fused.THREADS_ENV, "3")


def _same(a, b):
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == np.asarray(b[name]).dtype, name
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_ranges_cover_the_call_once(split_small):
    seen = []
    out = fused.in_ranges(lambda lo, hi: seen.append((lo, hi)) or (lo, hi), N)
    # 3 threads, up to PIECES_PER_THREAD ranges each, none below THREAD_MIN_POINTS (500)
    assert sorted(seen) == [(0, 500), (500, 1000), (1000, 1500), (1500, 2000), (2000, 2500),
                            (2500, 3001)]
    assert out == sorted(seen)  # in range order, whichever thread took which


def test_a_slowed_thread_takes_fewer_ranges(monkeypatch):
    """Threads take the next range as they finish one: while one thread is held up (a
    slowed core), the other prices the rest, instead of the call waiting on its half."""
    import threading
    import time

    monkeypatch.setattr(fused, "THREAD_MIN_POINTS", 500)
    monkeypatch.setenv(fused.THREADS_ENV, "2")
    taken = {}

    def fn(lo, hi):
        taken.setdefault(threading.get_ident(), []).append(lo)
        time.sleep(1.0 if lo == 0 else 0.001)
        return hi - lo

    out = fused.in_ranges(fn, 4000)  # 2 threads x 4 ranges of 500
    assert out == [500] * 8
    assert sorted(len(v) for v in taken.values()) == [1, 7]
    assert [0] in taken.values()


@pytest.mark.parametrize("workload", ["Llama3_70B", "Mixtral_8x7B", "ResNet50"])
def test_mlsysim_threads_equal_numpy(split_small, workload):
    wl, fl = catalog.workload(workload), catalog.fleet("Training_1K")
    rng = np.random.default_rng(7)
    knobs = mls._draw(rng, N, wl)
    _same(mlsysim.solve(wl, fl, engine="fused", **knobs),
          mlsysim.solve(wl, fl, engine="numpy", **knobs))


@pytest.mark.parametrize("workload", ["Llama3_70B_MC", "DeepSeek_V3_MC"])
def test_megatron_threads_equal_numpy(split_small, workload):
    wl, fl = catalog.workload(workload), catalog.fleet("HGX_H100_1K_MC")
    knobs = meg._draw(np.random.default_rng(8), N, dp_given=True)
    _same(M.solve(wl, fl, engine="fused", **knobs), M.solve(wl, fl, engine="numpy", **knobs))


def test_threads_setting_is_checked(monkeypatch):
    monkeypatch.setenv(fused.THREADS_ENV, "0")
    with pytest.raises(ValueError, match="LAYOUT_SWEEP_THREADS must be a positive integer"):
        fused.threads()
    monkeypatch.setenv(fused.THREADS_ENV, "2")
    assert fused.threads() == 2


def passes_in_forked_child(check, seconds=20):
    """Whether ``check()`` returns True in a forked child, which an alarm kills after ``seconds``
    (a child stuck waiting fails the test instead of hanging it)."""
    import os
    import signal

    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.alarm(seconds)
            code = 0 if check() else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def _spreads():
    return fused.in_ranges(_width, N) == [500, 500, 500, 500, 500, 501]


def test_a_forked_child_gets_threads_of_its_own(split_small):
    import time

    # the parent's pool, every thread of it started (each range takes a while), then idle
    fused.in_ranges(lambda lo, hi: time.sleep(0.2) or hi - lo, N)
    time.sleep(0.3)
    # the child inherits the pool object, not its threads
    assert passes_in_forked_child(_spreads)


def _width(lo, hi):
    return hi - lo


def test_a_child_forked_while_the_pool_is_locked_can_still_spread(split_small):
    with fused._POOL_LOCK:  # another thread picking the pool, as the fork happens
        assert passes_in_forked_child(_spreads)
