"""Output arrays kept for reuse (solver.fused.buffers): never handed out while a caller can reach them.

A fused call takes its outputs from a cache of arrays earlier calls returned;
an array is handed out again only once nothing else refers to it. A mistake
here would overwrite a result a caller still holds, a quiet wrong answer, so
every way of holding a result is tried: the array, a view of it, an xarray
object, a memoryview, another thread's call.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import xarray as xr

from solver import catalog, fused
from solver.fused import buffers
from solver.physics import megatron as M
from solver.physics import mlsysim

pytestmark = pytest.mark.skipif(not fused.NUMBA, reason="numba is not installed")

import test_fused_megatron as meg  # noqa: E402  (its draw of every megatron knob)
import test_fused_mlsysim as mls  # noqa: E402  (its draw of every mlsysim knob)
from test_fused_threads import passes_in_forked_child  # noqa: E402

N = 700


@pytest.fixture(autouse=True)
def empty_cache(monkeypatch):
    monkeypatch.delenv(buffers.CACHE_ENV, raising=False)
    monkeypatch.setattr(buffers, "MIN_BYTES", 0)  # the draws here are small
    buffers.release()
    yield
    buffers.release()


def _mlsysim(seed):
    wl, fl = catalog.workload("Llama3_70B"), catalog.fleet("Training_1K")
    knobs = mls._draw(np.random.default_rng(seed), N, wl)
    return (lambda: mlsysim.solve(wl, fl, engine="fused", **knobs),
            lambda: mlsysim.solve(wl, fl, engine="numpy", **knobs))


def _megatron(seed):
    wl, fl = catalog.workload("Llama3_70B_MC"), catalog.fleet("HGX_H100_1K_MC")
    knobs = meg._draw(np.random.default_rng(seed), N, dp_given=True)
    return (lambda: M.solve(wl, fl, engine="fused", **knobs),
            lambda: M.solve(wl, fl, engine="numpy", **knobs))


MODELS = pytest.mark.parametrize("model", [_mlsysim, _megatron], ids=["mlsysim", "megatron"])


def _copy(out):
    return {name: np.array(value, copy=True) for name, value in out.items()}


def _owners(out, skip=()):
    """ids of the arrays that own the outputs' memory (an output may be a view, e.g. a reshape)."""
    return {id(v if v.base is None else v.base) for name, v in out.items() if name not in skip}


def _same(a, b):
    assert list(a) == list(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@MODELS
def test_a_dropped_result_is_reused_and_rewritten_in_full(model):
    first, numpy_first = model(1)
    second, numpy_second = model(2)
    out = first()
    ids = _owners(out)
    del out
    again = second()  # every array of the dropped result, written with the second draw
    assert _owners(again) == ids
    _same(again, numpy_second())
    del again
    _same(first(), numpy_first())


@MODELS
@pytest.mark.parametrize("hold", ["array", "view", "xarray", "memoryview", "dict"])
def test_a_held_result_is_never_handed_out_again(model, hold):
    first, numpy_first = model(3)
    second, numpy_second = model(4)
    out = first()
    expected = _copy(out)
    names = list(out)
    if hold == "array":
        held = [out[name] for name in names]
    elif hold == "view":
        held = [out[name][::3] for name in names]
    elif hold == "xarray":
        held = xr.Dataset({name: ("point", out[name]) for name in names})
    elif hold == "memoryview":
        held = [memoryview(out[name]) for name in names]
    else:
        held = dict(out)
    del out
    for _ in range(3):  # calls that could reuse anything unused, with other values
        _same(second(), numpy_second())
    if hold == "xarray":
        now = {name: held[name].values for name in names}
    elif hold == "dict":
        now = held
    else:
        now = dict(zip(names, (np.asarray(h) for h in held)))
    for name in names:
        want = expected[name][::3] if hold == "view" else expected[name]
        np.testing.assert_array_equal(now[name], want, err_msg=f"{name} held as {hold}")


def test_a_result_held_by_one_output_keeps_only_that_output():
    first, numpy_first = _mlsysim(5)
    out = first()
    step, kept = out["step_latency_total"], np.array(out["step_latency_total"])
    others = _owners(out, skip=("step_latency_total",))
    del out
    again = first()
    ids = _owners(again)
    assert not _owners({"step": step}) & ids and others <= ids  # the others' arrays, reused
    np.testing.assert_array_equal(step, kept)
    _same(again, numpy_first())


def test_concurrent_calls_never_share_an_array():
    calls = [_mlsysim(10 + i) for i in range(4)]
    results, errors = {}, []

    def work(i):
        try:
            for _ in range(5):
                out = calls[i][0]()
                results.setdefault(i, []).append(out)
                if len(results[i]) > 1:
                    results[i].pop(0)
        except Exception as exc:  # noqa: BLE001  (re-raised below, in the test's thread)
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    seen = set()
    for i, (fast, slow) in enumerate(calls):
        (out,) = results[i]
        _same(out, slow())
        ids = _owners(out)
        assert not ids & seen
        seen |= ids


def test_the_cache_is_bounded_and_can_be_turned_off(monkeypatch):
    first, numpy_first = _mlsysim(6)
    one = sum(v.nbytes for v in first().values())
    monkeypatch.setenv(buffers.CACHE_ENV, str(1.5 * one / 2 ** 20))
    held = [first() for _ in range(3)]  # three results held: only what fits is kept
    kept, unused = buffers.kept_bytes()
    assert one <= kept <= 1.5 * one and unused == 0
    del held
    assert buffers.kept_bytes()[1] == buffers.kept_bytes()[0] > 0
    assert buffers.release() == kept
    assert buffers.kept_bytes() == (0, 0)

    monkeypatch.setenv(buffers.CACHE_ENV, "0")  # (ids of freed arrays may recur: not compared)
    first()
    assert buffers.kept_bytes() == (0, 0)
    _same(first(), numpy_first())


@pytest.mark.parametrize("raw", ["-1", "lots", "nan"])
def test_a_bad_cache_setting_is_refused(monkeypatch, raw):
    monkeypatch.setenv(buffers.CACHE_ENV, raw)
    with pytest.raises(ValueError, match="LAYOUT_SWEEP_BUFFER_CACHE must be a number of MiB >= 0"):
        buffers.cache_limit()


def test_the_reference_count_probe_sees_a_caller():
    assert buffers._COUNTS_CALLERS
    a = buffers.empty(5, np.float64)
    b = buffers.empty(5, np.float64)
    assert a is not b
    del a
    c = buffers.empty(5, np.float64)
    assert c is not b and buffers.empty(5, np.int64).dtype == np.int64


def test_small_arrays_are_not_kept(monkeypatch):
    monkeypatch.setattr(buffers, "MIN_BYTES", 8 * N + 1)
    first, numpy_first = _mlsysim(7)
    _same(first(), numpy_first())
    assert buffers.kept_bytes() == (0, 0)
    monkeypatch.setattr(buffers, "MIN_BYTES", 8 * N)  # the float outputs now, not the bools
    out = first()
    assert buffers.kept_bytes()[0] == 8 * N * sum(v.dtype == np.float64 for v in out.values())


def test_a_child_forked_while_the_cache_is_locked_can_still_price():
    first, numpy_first = _mlsysim(8)

    def prices():
        _same(first(), numpy_first())
        return True

    with buffers._LOCK:  # another thread in the middle of empty(), as the fork happens
        assert passes_in_forked_child(prices, seconds=30)
