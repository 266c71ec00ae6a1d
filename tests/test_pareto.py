"""``sweep.pareto.nondominated``: the one Pareto implementation, against an O(n^2) check."""

from __future__ import annotations

import numpy as np
import pytest

from sweep.pareto import _front_2d, _front_nd, nondominated


def _dominated_brute(values):
    """Row i is dominated when some row is <= it everywhere and < it somewhere."""
    n = len(values)
    return np.array([any(np.all(values[j] <= values[i]) and np.any(values[j] < values[i])
                         for j in range(n)) for i in range(n)], dtype=bool)


def _random_scores(seed, m):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    if seed % 2:  # few distinct values: many ties and equal rows
        return rng.integers(0, 8, size=(n, m)).astype(float), rng
    return rng.random((n, m)), rng


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_nondominated_matches_brute_force(seed, m):
    values, rng = _random_scores(seed, m)
    expected = ~_dominated_brute(values)
    np.testing.assert_array_equal(nondominated(values), expected)
    np.testing.assert_array_equal(nondominated(values, batch=int(rng.integers(1, 64))), expected)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("m", [2, 3, 4])
def test_front_kernels_match_brute_force(seed, m):
    values, rng = _random_scores(seed, m)
    expected = np.flatnonzero(~_dominated_brute(values))
    np.testing.assert_array_equal(_front_nd(values, batch=int(rng.integers(1, 64))), expected)
    if m == 2:
        np.testing.assert_array_equal(_front_2d(values), expected)


def test_equal_rows_are_all_kept():
    scores = np.array([[1.0, 2.0], [1.0, 2.0], [2.0, 1.0], [2.0, 2.0], [2.0, 1.0]])
    assert nondominated(scores).tolist() == [True, True, True, False, True]
    three = np.array([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    assert nondominated(three).tolist() == [True, True, False]


def test_edges():
    assert nondominated(np.empty((0, 3))).shape == (0,)
    assert nondominated([[5.0, 5.0]]).tolist() == [True]
    with pytest.raises(ValueError, match=r"\(n, m\) array"):
        nondominated([1.0, 2.0])


def test_search_front_counts_equal_rows_once():
    """Search keeps one row of equal objective vectors: the smallest tiebreak."""
    from sweep.search.result import front_indices

    scores = np.array([[1.0, 2.0], [1.0, 2.0], [2.0, 1.0], [0.0, 0.0]])  # larger is better
    assert sorted(front_indices(scores, np.array([5, 3, 9, 0])).tolist()) == [1, 2]
