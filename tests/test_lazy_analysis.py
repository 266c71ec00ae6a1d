"""Analyses of a lazily opened cube: the in-memory answers, read a slab at a time (never a point)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import xarray as xr

import sweep
from sweep.analysis import ranking

#: 4 x 5 x 16 x 4 x 2 x 2 = 10,240 points; best_along over tp, pp, mb keeps 320 groups.
SPEC = {"workload": ["Llama3_70B", "Mixtral_8x7B"], "fleet": "Training_1K", "dtype": "float32",
        "outputs": ["mfu", "step_latency_total", "memory_footprint", "feasible"],
        "axes": {"tp_size": [1, 2, 4, 8], "pp_size": [1, 2, 4, 5, 8],
                 "microbatch_count": list(range(1, 17)), "zero_stage": [0, 1, 2, 3],
                 "activation_recomputation": [False, True]},
        "fixed": {"batch_size": 1024}, "constraints": {"memory_limit": "72 GB"}}
BLOCK = 1000


@pytest.fixture(scope="module")
def cubes(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SOURCE_DATE_EPOCH", "1764460800")
        in_memory = sweep.run(SPEC)
    path = sweep.save(in_memory, tmp_path_factory.mktemp("lazy") / "cube.nc")
    lazy = sweep.open_cube(path)
    assert not lazy["mfu"].variable._in_memory
    yield in_memory, lazy
    lazy.close()


@pytest.fixture
def reads(monkeypatch):
    """Every read of a lazily opened variable (``Variable.__getitem__`` on data not in memory)."""
    calls = []
    real = xr.Variable.__getitem__

    def counted(self, key):
        if not self._in_memory:
            calls.append(key)
        return real(self, key)
    monkeypatch.setattr(xr.Variable, "__getitem__", counted)
    return calls


def _full_vars(cube):
    return [n for n, v in cube.data_vars.items() if v.ndim == len(cube.dims)]


@pytest.mark.parametrize("dims", [["tp_size", "pp_size", "microbatch_count"], "zero_stage",
                                  ["workload", "tp_size", "pp_size", "microbatch_count",
                                   "zero_stage"]])
def test_best_along_lazy_equals_in_memory_in_o_blocks_reads(cubes, reads, dims):
    in_memory, lazy = cubes
    expected = sweep.best_along(in_memory, dims, block_points=BLOCK)
    assert not reads  # in memory: no slab reads
    got = sweep.best_along(lazy, dims, block_points=BLOCK)
    xr.testing.assert_identical(expected, got)
    groups = int(np.prod(expected["found"].shape))
    size = math.prod(lazy.sizes.values())
    slabs = math.ceil(size / BLOCK) + 1  # slabs align to the first dim
    n_vars = len([n for n in lazy.data_vars if lazy[n].ndim])
    # The scan reads each slab of the objective and the mask, the gather each slab of each.
    assert 0 < len(reads) <= 2 * n_vars * slabs, (len(reads), groups)
    if groups > 100:
        # A point at a time would be one read per group and variable.
        assert len(reads) < groups * len(_full_vars(lazy)) / 4


def test_top_k_and_pareto_lazy_equal_in_memory(cubes, reads):
    in_memory, lazy = cubes
    for analysis in (lambda c: sweep.top_k(c, k=25, block_points=BLOCK),
                     lambda c: sweep.pareto_front(c, block_points=BLOCK)):
        xr.testing.assert_identical(analysis(in_memory), analysis(lazy))
    # top_k's 25 points touch at most 25 slabs of each variable.
    assert 0 < len(reads)


def test_top_k_reads_only_the_slabs_that_hold_its_points(cubes, reads):
    _, lazy = cubes
    sweep.top_k(lazy, k=1, block_points=BLOCK)
    scan = len(reads)
    sweep.top_k(lazy, k=1, block_points=BLOCK)  # the same again, for the count
    assert len(reads) == 2 * scan
    n_vars = len([n for n in lazy.data_vars if lazy[n].ndim])
    ranked_reads = []
    real = ranking._read_slab
    ranking_gather = ranking._gather

    def spy(variable, idx, shape, block_points):
        before = len(reads)
        out = ranking_gather(variable, idx, shape, block_points)
        ranked_reads.append(len(reads) - before)
        return out
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ranking, "_gather", spy)
        sweep.top_k(lazy, k=1, block_points=BLOCK)
    assert ranked_reads == [1] * n_vars  # one point: one slab of each variable
