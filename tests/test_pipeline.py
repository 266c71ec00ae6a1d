"""Pipeline bubble (solver.pipeline): (p-1)/(v*m+p-1) and the idle time it adds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.pipeline import bubble_fraction, bubble_time

RTOL = 1e-12


@pytest.mark.parametrize("p, m, v, expected", [
    (4, 8, 1, 3 / 11),
    (4, 8, 2, 3 / 19),
    (8, 1, 1, 7 / 8),
    (2, 3, 4, 1 / 13),
    (16, 64, 1, 15 / 79),
    (1, 5, 3, 0.0),
])
def test_bubble_fraction_hand_values(p, m, v, expected):
    f = bubble_fraction(p, m, v)
    assert np.ndim(f) == 0
    assert f == pytest.approx(expected, rel=RTOL, abs=0)


def test_bubble_fraction_default_v_is_one():
    assert bubble_fraction(4, 8) == pytest.approx(3 / 11, rel=RTOL)


def test_no_pipeline_no_bubble():
    m = np.array([1, 2, 7, 1000])
    np.testing.assert_array_equal(bubble_fraction(1, m), np.zeros(4))
    np.testing.assert_array_equal(bubble_time(np.array([0.5, 1.0, 2.0, 3.0]), bubble_fraction(1, m)),
                                  np.zeros(4))


def test_bubble_fraction_broadcasts():
    p = np.array([1, 2, 4, 8]).reshape(4, 1, 1)
    m = np.array([1, 4, 16]).reshape(1, 3, 1)
    v = np.array([1, 2]).reshape(1, 1, 2)
    f = bubble_fraction(p, m, v)
    assert f.shape == (4, 3, 2)
    for i in range(4):
        for j in range(3):
            for k in range(2):
                pp, mm, vv = p[i, 0, 0], m[0, j, 0], v[0, 0, k]
                assert f[i, j, k] == pytest.approx((pp - 1) / (vv * mm + pp - 1), rel=RTOL, abs=0)


def test_bubble_time_hand_values():
    # busy 2 s, p = 4, m = 8, v = 1: 2 * 3/8 = 0.75 s; v = 2: 2 * 3/16 = 0.375 s.
    assert bubble_time(2.0, bubble_fraction(4, 8, 1)) == pytest.approx(0.75, rel=RTOL)
    assert bubble_time(2.0, bubble_fraction(4, 8, 2)) == pytest.approx(0.375, rel=RTOL)
    # one microbatch, p = 8: the pipeline idles 7 busy-times.
    assert bubble_time(0.1, bubble_fraction(8, 1)) == pytest.approx(0.7, rel=RTOL)


def test_bubble_time_array_broadcast():
    busy = np.array([1.0, 3.0]).reshape(2, 1)
    p = np.array([1, 2, 5])
    m = 4
    t = bubble_time(busy, bubble_fraction(p, m))
    assert t.shape == (2, 3)
    np.testing.assert_allclose(t, busy * (p - 1) / m, rtol=RTOL, atol=0)


@settings(max_examples=80, deadline=None)
@given(busy=st.floats(1e-6, 1e4), p=st.integers(1, 256), m=st.integers(1, 4096), v=st.integers(1, 16))
def test_bubble_time_identity(busy, p, m, v):
    # busy * b / (1 - b) == busy * (p-1) / (v*m)
    t = bubble_time(busy, bubble_fraction(p, m, v))
    assert t == pytest.approx(busy * (p - 1) / (v * m), rel=1e-9, abs=0)
    f = bubble_fraction(p, m, v)
    assert 0.0 <= f < 1.0
    # the bubble is the idle share of the total step
    if p > 1:
        assert t / (busy + t) == pytest.approx(f, rel=1e-9)


def test_monotone_decreasing_in_microbatches_and_virtual_stages():
    m = np.arange(1, 200)
    for p in (2, 4, 8, 64):
        for v in (1, 2, 3):
            f = bubble_fraction(p, m, v)
            assert np.all(np.diff(f) < 0)
        v = np.arange(1, 50)
        assert np.all(np.diff(bubble_fraction(p, 8, v)) < 0)


def test_monotone_increasing_in_stages():
    p = np.arange(1, 129)
    f = bubble_fraction(p, 16, 2)
    assert f[0] == 0.0
    assert np.all(np.diff(f) > 0)


def test_bubble_vanishes_with_many_microbatches():
    assert bubble_fraction(8, 10**9) == pytest.approx(7e-9, rel=1e-6)
