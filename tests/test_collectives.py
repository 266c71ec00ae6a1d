"""Collective times (solver.collectives): hand values, broadcasting, analytic limits, monotonicity.

Every expected number below is worked out by hand from the alpha-beta formulas

    ring all-reduce   T = 2 (n-1)/n * M/beta + 2 (n-1) * alpha          (0 for n = 1)
    all-to-all        T =   (n-1)/n * M/beta +   (n-1) * alpha
    hierarchical      T = 2 [(g-1)/g * M/beta_intra + (g-1) alpha_intra]
                          + ring(M/g, nodes, beta_inter, alpha_inter)

with alpha_intra = 500 ns by default.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.collectives import (
    HIERARCHICAL_INTRA_NODE_LATENCY,
    all_to_all_time,
    hierarchical_allreduce_time,
    ring_allreduce_time,
)

RTOL = 1e-12

# ------------------------------------------------------------------ ring all-reduce


def test_ring_scalar_hand_value():
    # M = 1 GB, n = 4, beta = 100 GB/s, alpha = 1 us:
    # 2 * 3/4 * 1e9 / 1e11 = 0.015 s; 2 * 3 * 1e-6 = 6e-6 s.
    t = ring_allreduce_time(1e9, 4, bandwidth=1e11, latency=1e-6)
    assert np.ndim(t) == 0
    assert t == pytest.approx(0.015006, rel=RTOL)


def test_ring_second_hand_value():
    # M = 2.20625e9 B (70.6 B params * 2 B / 64 shards), n = 16, beta = 25 GB/s, alpha = 7 us:
    # 2 * 15/16 * 2.20625e9 / 25e9 = 0.16546875; 2 * 15 * 7e-6 = 2.1e-4.
    t = ring_allreduce_time(2.20625e9, 16, bandwidth=25e9, latency=7e-6)
    assert t == pytest.approx(0.16546875 + 2.1e-4, rel=RTOL)


def test_ring_one_rank_costs_nothing():
    assert ring_allreduce_time(1e12, 1, bandwidth=1.0, latency=1.0) == 0.0
    t = ring_allreduce_time(np.array([1e3, 1e9, 1e12]), 1, bandwidth=1e9, latency=1e-3)
    np.testing.assert_array_equal(t, [0.0, 0.0, 0.0])


def test_ring_two_ranks():
    # n = 2: 2 * 1/2 * M/beta + 2 alpha = M/beta + 2 alpha.
    t = ring_allreduce_time(4e6, 2, bandwidth=4e11, latency=1e-6)
    assert t == pytest.approx(1e-5 + 2e-6, rel=RTOL)


def test_ring_array_of_ranks():
    # M = 8e9, beta = 1e10 -> M/beta = 0.8 s; alpha = 1e-3.
    n = np.array([1, 2, 4, 8])
    expected = [0.0, 0.8 + 2e-3, 1.2 + 6e-3, 1.4 + 14e-3]
    t = ring_allreduce_time(8e9, n, bandwidth=1e10, latency=1e-3)
    assert t.shape == (4,)
    np.testing.assert_allclose(t, expected, rtol=RTOL)


def test_ring_infinite_bandwidth_leaves_latency():
    n = np.array([2, 3, 8, 1024])
    alpha = 5e-6
    t = ring_allreduce_time(1e12, n, bandwidth=np.inf, latency=alpha)
    np.testing.assert_allclose(t, 2 * (n - 1) * alpha, rtol=RTOL)


def test_ring_zero_latency_is_bandwidth_term():
    n = np.array([2, 3, 8, 1024])
    t = ring_allreduce_time(6e9, n, bandwidth=3e10, latency=0.0)
    # 2 (n-1)/n * 0.2 s
    np.testing.assert_allclose(t, [0.2, 0.8 / 3, 0.35, 0.4 * 1023 / 1024], rtol=RTOL)


def test_ring_large_n_approaches_twice_message_over_bandwidth():
    t = ring_allreduce_time(1e9, 10**9, bandwidth=1e9, latency=0.0)
    assert t == pytest.approx(2.0, rel=1e-8)
    assert t < 2.0


def test_ring_mixed_shape_broadcast():
    message = np.array([1e6, 1e8, 1e10]).reshape(3, 1)
    ranks = np.array([1, 2, 4, 16]).reshape(1, 4)
    bandwidth = np.array([1e10, 5e10]).reshape(2, 1, 1)
    t = ring_allreduce_time(message, ranks, bandwidth=bandwidth, latency=2e-6)
    assert t.shape == (2, 3, 4)
    for b in range(2):
        for i in range(3):
            for j in range(4):
                m, n, beta = message[i, 0], ranks[0, j], bandwidth[b, 0, 0]
                expected = 0.0 if n == 1 else 2 * (n - 1) / n * m / beta + 2 * (n - 1) * 2e-6
                assert t[b, i, j] == pytest.approx(expected, rel=RTOL)
                assert t[b, i, j] == ring_allreduce_time(m, n, bandwidth=beta, latency=2e-6)


def test_ring_latency_array_broadcast():
    t = ring_allreduce_time(0.0, np.array([[2], [5]]), bandwidth=1.0, latency=np.array([1e-6, 1e-3]))
    np.testing.assert_allclose(t, [[2e-6, 2e-3], [8e-6, 8e-3]], rtol=RTOL)


# ------------------------------------------------------------------ all-to-all


def test_all_to_all_scalar_hand_value():
    # M = 1 GB, n = 4, beta = 100 GB/s, alpha = 1 us: 3/4 * 0.01 + 3e-6.
    t = all_to_all_time(1e9, 4, bandwidth=1e11, latency=1e-6)
    assert np.ndim(t) == 0
    assert t == pytest.approx(0.007503, rel=RTOL)


def test_all_to_all_one_rank_costs_nothing():
    assert all_to_all_time(1e12, 1, bandwidth=1.0, latency=1.0) == 0.0


def test_all_to_all_limits():
    n = np.array([2, 4, 8, 64])
    np.testing.assert_allclose(all_to_all_time(1e9, n, bandwidth=np.inf, latency=5e-6),
                               (n - 1) * 5e-6, rtol=RTOL)
    # zero latency: (n-1)/n * 1e9 / 5e10 = (n-1)/n * 0.02
    np.testing.assert_allclose(all_to_all_time(1e9, n, bandwidth=5e10, latency=0.0),
                               [0.01, 0.015, 0.0175, 0.02 * 63 / 64], rtol=RTOL)


def test_all_to_all_is_half_a_ring():
    # Same M, n, beta, alpha: the all-to-all moves half the ring's bytes in half its hops.
    m = np.array([1e6, 1e9]).reshape(2, 1)
    n = np.array([2, 3, 16])
    np.testing.assert_allclose(
        2 * all_to_all_time(m, n, bandwidth=2e10, latency=3e-6),
        ring_allreduce_time(m, n, bandwidth=2e10, latency=3e-6), rtol=RTOL)


def test_all_to_all_mixed_shape_broadcast():
    message = np.array([1e6, 1e8, 1e10]).reshape(3, 1)
    ranks = np.array([1, 2, 4, 16]).reshape(1, 4)
    t = all_to_all_time(message, ranks, bandwidth=1e10, latency=1e-6)
    assert t.shape == (3, 4)
    for i in range(3):
        for j in range(4):
            m, n = message[i, 0], ranks[0, j]
            assert t[i, j] == pytest.approx((n - 1) / n * m / 1e10 + (n - 1) * 1e-6, rel=RTOL, abs=0)
            assert t[i, j] == all_to_all_time(m, n, bandwidth=1e10, latency=1e-6)


# ------------------------------------------------------------------ hierarchical


def test_hierarchical_default_intra_latency_is_500ns():
    assert HIERARCHICAL_INTRA_NODE_LATENCY == 500e-9


def test_hierarchical_scalar_hand_value():
    # M = 8 GB, 4 nodes, g = 8, intra 400 GB/s, inter 50 GB/s, inter 5 us, intra 500 ns.
    # intra phase: 7/8 * 8e9/4e11 + 7 * 5e-7 = 0.0175 + 3.5e-6 = 0.0175035
    # inter phase: ring(1e9, 4): 2 * 3/4 * 1e9/5e10 + 6 * 5e-6 = 0.03 + 3e-5 = 0.03003
    t = hierarchical_allreduce_time(8e9, 4, 8, intra_node_bandwidth=4e11,
                                    inter_node_bandwidth=5e10, inter_node_latency=5e-6)
    assert np.ndim(t) == 0
    assert t == pytest.approx(2 * 0.0175035 + 0.03003, rel=RTOL)


def test_hierarchical_explicit_intra_latency():
    # M = 4e9, 2 nodes, g = 4, intra 2e11, inter 1e10, alpha_inter 1e-5, alpha_intra 1e-4:
    # intra: 3/4 * 0.02 + 3e-4 = 0.0153; inter: ring(1e9, 2) = 1e9/1e10 + 2e-5 = 0.10002
    t = hierarchical_allreduce_time(4e9, 2, 4, intra_node_bandwidth=2e11,
                                    inter_node_bandwidth=1e10, inter_node_latency=1e-5,
                                    intra_node_latency=1e-4)
    assert t == pytest.approx(2 * 0.0153 + 0.10002, rel=RTOL)


@pytest.mark.parametrize("g", [2, 4, 8])
def test_hierarchical_one_node_is_two_intra_phases(g):
    m, beta = 3e9, 3e11
    t = hierarchical_allreduce_time(m, 1, g, intra_node_bandwidth=beta,
                                    inter_node_bandwidth=1.0, inter_node_latency=1.0)
    intra = (g - 1) / g * m / beta + (g - 1) * 500e-9
    assert t == pytest.approx(2 * intra, rel=RTOL)


@pytest.mark.parametrize("nodes", [1, 2, 5, 64])
def test_hierarchical_one_rank_per_node_is_a_ring_across_nodes(nodes):
    m, beta, alpha = 2e9, 2.5e10, 7e-6
    t = hierarchical_allreduce_time(m, nodes, 1, intra_node_bandwidth=1.0,
                                    inter_node_bandwidth=beta, inter_node_latency=alpha)
    ring = 0.0 if nodes == 1 else 2 * (nodes - 1) / nodes * m / beta + 2 * (nodes - 1) * alpha
    assert t == pytest.approx(ring, rel=RTOL, abs=0)


def test_hierarchical_one_rank_in_total_costs_nothing():
    t = hierarchical_allreduce_time(1e12, 1, 1, intra_node_bandwidth=1.0,
                                    inter_node_bandwidth=1.0, inter_node_latency=1.0)
    assert t == 0.0


def test_hierarchical_infinite_bandwidth_leaves_latencies():
    nodes = np.array([1, 2, 16]).reshape(3, 1)
    g = np.array([1, 2, 8])
    t = hierarchical_allreduce_time(1e12, nodes, g, intra_node_bandwidth=np.inf,
                                    inter_node_bandwidth=np.inf, inter_node_latency=5e-6)
    expected = 2 * (g - 1) * 500e-9 + 2 * (nodes - 1) * 5e-6
    assert t.shape == (3, 3)
    np.testing.assert_allclose(t, expected, rtol=RTOL, atol=0)


def test_hierarchical_mixed_shape_broadcast():
    message = np.array([1e6, 1e9, 1e11]).reshape(3, 1, 1)
    nodes = np.array([1, 2, 4, 32]).reshape(1, 4, 1)
    g = np.array([1, 2, 8]).reshape(1, 1, 3)
    kw = dict(intra_node_bandwidth=4.5e11, inter_node_bandwidth=5e10, inter_node_latency=5e-6)
    t = hierarchical_allreduce_time(message, nodes, g, **kw)
    assert t.shape == (3, 4, 3)
    for i in range(3):
        for j in range(4):
            for k in range(3):
                m, n, gg = message[i, 0, 0], nodes[0, j, 0], g[0, 0, k]
                intra = (gg - 1) / gg * m / 4.5e11 + (gg - 1) * 500e-9
                inter = 0.0 if n == 1 else 2 * (n - 1) / n * (m / gg) / 5e10 + 2 * (n - 1) * 5e-6
                assert t[i, j, k] == pytest.approx(2 * intra + inter, rel=RTOL, abs=0)
                assert t[i, j, k] == hierarchical_allreduce_time(m, n, gg, **kw)


def test_hierarchical_beats_flat_ring_on_slow_fabric():
    # 64 ranks as 8 nodes x 8: the flat ring over the fabric moves 2*63/64 M over 5e10,
    # the hierarchical one only 2*7/8 (M/8) across it plus a fast NVLink phase.
    m = 1e10
    flat = ring_allreduce_time(m, 64, bandwidth=5e10, latency=5e-6)
    hier = hierarchical_allreduce_time(m, 8, 8, intra_node_bandwidth=4.5e11,
                                       inter_node_bandwidth=5e10, inter_node_latency=5e-6)
    assert hier < flat


# ------------------------------------------------------------------ monotone in bandwidth

positive = st.floats(min_value=1e-3, max_value=1e15, allow_nan=False, allow_infinity=False)
bandwidths = st.floats(min_value=1e3, max_value=1e13, allow_nan=False, allow_infinity=False)
latencies = st.floats(min_value=0.0, max_value=1e-2, allow_nan=False, allow_infinity=False)
ranks = st.integers(min_value=1, max_value=100_000)
factors = st.floats(min_value=1.0, max_value=1e3, allow_nan=False, allow_infinity=False)


@settings(max_examples=80, deadline=None)
@given(m=positive, n=ranks, beta=bandwidths, factor=factors, alpha=latencies)
def test_ring_more_bandwidth_never_slower(m, n, beta, factor, alpha):
    slow = ring_allreduce_time(m, n, bandwidth=beta, latency=alpha)
    fast = ring_allreduce_time(m, n, bandwidth=beta * factor, latency=alpha)
    assert fast <= slow
    assert fast >= 2 * (n - 1) * alpha * (1 - 1e-12)


@settings(max_examples=80, deadline=None)
@given(m=positive, n=ranks, beta=bandwidths, factor=factors, alpha=latencies)
def test_all_to_all_more_bandwidth_never_slower(m, n, beta, factor, alpha):
    slow = all_to_all_time(m, n, bandwidth=beta, latency=alpha)
    fast = all_to_all_time(m, n, bandwidth=beta * factor, latency=alpha)
    assert fast <= slow


@settings(max_examples=80, deadline=None)
@given(m=positive, nodes=st.integers(1, 4096), g=st.integers(1, 16), intra=bandwidths,
       inter=bandwidths, f_intra=factors, f_inter=factors, alpha=latencies)
def test_hierarchical_more_bandwidth_never_slower(m, nodes, g, intra, inter, f_intra, f_inter, alpha):
    def t(bi, be):
        return hierarchical_allreduce_time(m, nodes, g, intra_node_bandwidth=bi,
                                           inter_node_bandwidth=be, inter_node_latency=alpha)
    base = t(intra, inter)
    assert t(intra * f_intra, inter) <= base
    assert t(intra, inter * f_inter) <= base
    assert t(intra * f_intra, inter * f_inter) <= base


@settings(max_examples=60, deadline=None)
@given(m=positive, n=st.integers(2, 100_000), beta=bandwidths, alpha=latencies)
def test_ring_more_ranks_never_faster(m, n, beta, alpha):
    # Both 2(n-1)/n and 2(n-1) grow with n.
    assert (ring_allreduce_time(m, n + 1, bandwidth=beta, latency=alpha)
            >= ring_allreduce_time(m, n, bandwidth=beta, latency=alpha))
