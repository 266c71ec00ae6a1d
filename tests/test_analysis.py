"""Analysis (sweep.analysis): top-k, best per slice and Pareto fronts against brute force."""

from __future__ import annotations

import itertools
import json
import warnings

import numpy as np
import pytest
import xarray as xr

import solver
import sweep
from sweep.analysis import mask

SEEDS = range(6)


def _random_cube(seed, ties=False):
    """A synthetic cube: 4 dims, float outputs with NaNs, masks, a count on 2 dims."""
    rng = np.random.default_rng(seed)
    shape = tuple(int(n) for n in rng.integers(2, 7, size=4))
    dims = ("tp_size", "pp_size", "microbatch_count", "zero_stage")
    coords = {d: np.sort(rng.choice(np.arange(1, 100), size=n, replace=False))
              for d, n in zip(dims, shape)}

    def values():
        v = rng.integers(0, 5, size=shape).astype(float) if ties else rng.random(shape)
        v[rng.random(shape) < 0.1] = np.nan
        return v
    valid = rng.random(shape) < 0.8
    cube = xr.Dataset(
        {"mfu": (dims, values()), "step_latency_total": (dims, values()),
         "memory_footprint": (dims, values() * 1e11),
         "valid": (dims, valid), "admissible": (dims, valid & (rng.random(shape) < 0.7)),
         "n_accelerators": (dims[:2], rng.integers(1, 2048, size=shape[:2]))},
        coords=coords)
    return cube


def _brute_points(cube, selected):
    """Flat C-order list of (positions dict, values dict) for the selected points."""
    dims = tuple(cube["mfu"].dims)
    names = ("mfu", "step_latency_total", "memory_footprint", "n_accelerators")
    arrays = {n: cube[n].broadcast_like(cube["mfu"]).transpose(*dims).values for n in names}
    chosen = selected.broadcast_like(cube["mfu"]).transpose(*dims).values
    out = []
    for idx in itertools.product(*(range(cube.sizes[d]) for d in dims)):
        if chosen[idx]:
            out.append((dict(zip(dims, idx)), {n: float(arrays[n][idx]) for n in names}))
    return out


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("largest", [True, False])
def test_top_k_matches_brute_force(seed, largest):
    cube = _random_cube(seed, ties=seed % 2 == 1)
    points = [p for p in _brute_points(cube, cube["admissible"]) if not np.isnan(p[1]["mfu"])]
    # Stable sort: ties keep C order, as top_k promises.
    points.sort(key=lambda p: -p[1]["mfu"] if largest else p[1]["mfu"])
    for k, slab in ((1, 7), (5, 30), (1000, 1 << 20)):
        got = sweep.top_k(cube, objective="mfu", k=k, block_points=slab,
                          direction="maximize" if largest else "minimize", collapse_ties=False)
        want = points[:k]
        assert got.sizes["rank"] == len(want)
        assert got["rank"].values.tolist() == list(range(1, len(want) + 1))
        for d in ("tp_size", "pp_size", "microbatch_count", "zero_stage"):
            assert got[d].values.tolist() == [cube[d].values[p[0][d]] for p in want]
        np.testing.assert_array_equal(got["mfu"], [p[1]["mfu"] for p in want])
        np.testing.assert_array_equal(got["n_accelerators"], [p[1]["n_accelerators"] for p in want])
        assert got["admissible"].all()


def _brute_groups(cube, points):
    """``points`` (sorted) grouped by equal data variables: [(first point, members)], in order."""
    names = list(cube.data_vars)
    dims = tuple(cube["mfu"].dims)
    arrays = {n: cube[n].broadcast_like(cube["mfu"]).transpose(*dims).values for n in names}
    groups = {}
    for p in points:
        idx = tuple(p[0][d] for d in dims)
        key = tuple(str(arrays[n][idx]) for n in names)
        groups.setdefault(key, []).append(p)
    return list(groups.values())


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("k", [1, 3, 1000])
def test_top_k_collapses_layouts_equal_in_every_output(seed, k):
    # Ties: integer outputs in 0..4 on 4 dims, so many layouts agree in everything.
    cube = _random_cube(seed, ties=True).drop_vars(["memory_footprint"])
    cube["n_accelerators"] = cube["n_accelerators"] % 2
    points = [p for p in _brute_points(cube.assign(memory_footprint=cube["mfu"] * 0),
                                       cube["admissible"]) if not np.isnan(p[1]["mfu"])]
    points.sort(key=lambda p: -p[1]["mfu"])
    groups = _brute_groups(cube, points)[:k]
    got = sweep.top_k(cube, objective="mfu", k=k, block_points=13)
    assert got.sizes["rank"] == len(groups)
    dims = ("tp_size", "pp_size", "microbatch_count", "zero_stage")
    for i, members in enumerate(groups):
        first = members[0][0]
        assert [int(got[d][i]) for d in dims] == [int(cube[d].values[first[d]]) for d in dims]
        assert int(got["ties"][i]) == len(members)
        listed = dict(part.split("=") for part in str(got["equivalent"][i].values).split("; ")
                      if part)
        for d in dims:
            seen = sorted({int(cube[d].values[m[0][d]]) for m in members})
            assert listed.get(d) == ("|".join(map(str, seen)) if len(seen) > 1 else None)
    assert len({tuple(float(got[n][i]) for n in ("mfu", "step_latency_total", "n_accelerators"))
                for i in range(got.sizes["rank"])}) <= got.sizes["rank"]
    raw = sweep.top_k(cube, objective="mfu", k=k, collapse_ties=False)
    assert "equivalent" not in raw and raw.sizes["rank"] == min(k, len(points))


def test_top_k_constraints_and_where():
    cube = _random_cube(11)
    got = sweep.top_k(cube, k=3, where="valid",
                      constraints={"memory_limit": "50 GB", "max_accelerators": 1000,
                                   "step_latency_total": (0.2, None)})
    assert (got["memory_footprint"] <= 50e9).all() and (got["n_accelerators"] <= 1000).all()
    assert (got["step_latency_total"] >= 0.2).all() and got["valid"].all()
    selected = mask(cube, "valid", {"memory_limit": 5e10, "max_accelerators": 1000,
                                    "step_latency_total": (0.2, None)})
    best = cube["mfu"].where(selected).max()
    assert float(got["mfu"][0]) == float(best)
    with pytest.raises(KeyError, match="constraints: expected memory_limit, max_accelerators"):
        sweep.top_k(cube, constraints={"memory_limt": 1})
    with pytest.raises(KeyError, match="objective must be a data variable") as caught:
        sweep.top_k(cube, objective="mfuu")
    assert str(caught.value).endswith("but got 'mfuu'; did you mean 'mfu'?")  # not wrapped in quotes
    with pytest.raises(KeyError, match="by must be a data variable"), \
            pytest.warns(DeprecationWarning, match="use objective="):
        sweep.top_k(cube, by="mfuu")
    with pytest.raises(ValueError, match="k must be a whole number >= 1, but got 0"):
        sweep.top_k(cube, k=0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dims", [("pp_size",), ("tp_size", "zero_stage"), ("microbatch_count",)])
def test_best_along_matches_brute_force(seed, dims):
    cube = _random_cube(seed, ties=seed % 2 == 1)
    got = sweep.best_along(cube, dims, objective="mfu", block_points=11)
    assert tuple(got["mfu"].dims) == dims
    order = tuple(cube["mfu"].dims)
    others = [d for d in order if d not in dims]
    mfu = cube["mfu"].transpose(*order).values
    admissible = cube["admissible"].transpose(*order).values
    for key in itertools.product(*(range(cube.sizes[d]) for d in dims)):
        at = dict(zip(dims, key))
        best, best_at = None, None
        for rest in itertools.product(*(range(cube.sizes[d]) for d in others)):
            point = {**at, **dict(zip(others, rest))}
            idx = tuple(point[d] for d in order)
            value = float(mfu[idx])
            if admissible[idx] and not np.isnan(value):
                if best is None or value > best:
                    best, best_at = value, point
        here = got.isel(at)
        assert bool(here["found"]) == (best is not None)
        if best is None:
            assert np.isnan(float(here["mfu"]))
            continue
        assert float(here["mfu"]) == best
        for d in others:
            assert int(here[d]) == cube[d].values[best_at[d]]


def _dominated_brute(values):
    n = len(values)
    return np.array([any(np.all(values[j] <= values[i]) and np.any(values[j] < values[i])
                         for j in range(n)) for i in range(n)], dtype=bool)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("objectives", [
    {"mfu": "maximize", "memory_footprint": "minimize"},
    {"mfu": "maximize", "n_accelerators": "minimize", "memory_footprint": "minimize"},
    {"mfu": "maximize", "step_latency_total": "maximize", "memory_footprint": "minimize"},
])
def test_pareto_front_matches_brute_force(seed, objectives):
    cube = _random_cube(seed, ties=seed % 2 == 1)
    points = _brute_points(cube, cube["admissible"])
    names = list(objectives)
    rows = np.array([[p[1][n] * (-1 if objectives[n] == "maximize" else 1) for n in names]
                     for p in points]).reshape(-1, len(names))
    finite = ~np.isnan(rows).any(axis=1)
    rows, points = rows[finite], [p for p, f in zip(points, finite) if f]
    on_front = ~_dominated_brute(rows)
    expected = {tuple(p[0][d] for d in cube["mfu"].dims) for p, f in zip(points, on_front) if f}
    got = sweep.pareto_front(cube, objectives, block_points=13)
    positions = {tuple(int(np.flatnonzero(cube[d].values == v)[0]) for d, v in
                       ((d, got[d].values[i]) for d in cube["mfu"].dims))
                 for i in range(got.sizes["point"])}
    assert positions == expected
    assert got.sizes["point"] == len(expected)
    first = names[0]
    sign = -1 if objectives[first] == "maximize" else 1
    assert np.all(np.diff(sign * got[first].values) >= 0)  # sorted, best first


def test_pareto_front_needs_two_objectives():
    with pytest.raises(ValueError, match="at least 2"):
        sweep.pareto_front(_random_cube(0), {"mfu": "maximize"})
    with pytest.raises(ValueError, match="must be 'maximize' or 'minimize', but got 'up'"):
        sweep.pareto_front(_random_cube(0), {"mfu": "up", "memory_footprint": "minimize"})
    with pytest.raises(ValueError, match="must be 'max' or 'min', but got 'up'"):  # old words
        sweep.pareto_front(_random_cube(0), {"mfu": "up", "memory_footprint": "min"})


def test_pareto_front_takes_a_list_of_outputs_in_their_own_directions():
    cube = _random_cube(1)
    listed = sweep.pareto_front(cube, ["mfu", "memory_footprint"])
    spelled = sweep.pareto_front(cube, {"mfu": "maximize", "memory_footprint": "minimize"})
    assert listed.sizes["point"] == spelled.sizes["point"] > 0
    for name in listed.data_vars:
        np.testing.assert_array_equal(listed[name].values, spelled[name].values)
    with pytest.raises(ValueError, match=r"'tp_size' is no output with a direction of better; "
                                         r"give a dict such as \{'tp_size': 'maximize'"):
        sweep.pareto_front(cube, ["mfu", "tp_size"])
    with pytest.raises(ValueError, match=r"'mfuu' is no output .*did you mean 'mfu'\?"):
        sweep.pareto_front(cube, ("mfuu", "memory_footprint"))
    with pytest.raises(ValueError, match="at least 2"):
        sweep.pareto_front(cube, ["mfu"])


def test_a_ranking_across_physics_models_warns_unless_one_is_selected():
    cube = _random_cube(2).expand_dims(physics=["mlsysim", "megatron"])
    with pytest.warns(sweep.analysis.ModelMixWarning, match="spans the physics models megatron, mlsysim"):
        sweep.top_k(cube, objective="mfu", k=3)
    with pytest.warns(sweep.analysis.ModelMixWarning):
        sweep.pareto_front(cube, ["mfu", "memory_footprint"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", sweep.analysis.ModelMixWarning)
        sweep.top_k(cube.sel(physics="megatron"), objective="mfu", k=3)
        one = (cube.physics == "megatron") & (cube.mfu > -1.0)
        sweep.top_k(cube, objective="mfu", k=3, where=one)


def test_deprecated_spellings_give_the_same_answers():
    cube = _random_cube(3)
    with pytest.warns(DeprecationWarning, match="by= is deprecated; use objective="):
        old = sweep.top_k(cube, by="step_latency_total", k=4, largest=False, slab_points=7)
    new = sweep.top_k(cube, objective="step_latency_total", k=4, direction="minimize",
                      block_points=7)
    xr.testing.assert_identical(old, new)
    # The registry's direction by default: step time is minimized, MFU maximized.
    xr.testing.assert_identical(new, sweep.top_k(cube, objective="step_latency_total", k=4))
    with pytest.raises(TypeError, match=r"largest \(deprecated\) must be True or False, but got 'no'"):
        sweep.top_k(cube, objective="mfu", largest="no")  # a string had read as True
    with pytest.warns(DeprecationWarning, match="largest= is deprecated"):
        old = sweep.best_along(cube, "pp_size", by="mfu", largest=True)
    xr.testing.assert_identical(old, sweep.best_along(cube, "pp_size", objective="mfu"))
    with pytest.warns(DeprecationWarning, match="'max' is deprecated; use 'maximize'"):
        old = sweep.pareto_front(cube, {"mfu": "max", "memory_footprint": "min"})
    xr.testing.assert_identical(old, sweep.pareto_front(cube, {"mfu": "maximize",
                                                              "memory_footprint": "minimize"}))
    with pytest.raises(TypeError, match="not also its deprecated spelling by="):
        sweep.top_k(cube, objective="step_latency_total", by="mfu")
    with pytest.warns(DeprecationWarning, match="SLAB_POINTS is deprecated"):
        assert sweep.analysis.SLAB_POINTS == sweep.analysis.BLOCK_POINTS


@pytest.fixture(scope="module")
def real_cube():
    return sweep.run({"workload": "Llama3_70B", "fleet": "Training_1K",
                      "outputs": ["mfu", "step_latency_total", "memory_footprint"],
                      "axes": {"tp_size": [1, 2, 4, 8], "pp_size": [1, 2, 4, 5, 8],
                               "dp_size": [4, 16, 64], "microbatch_count": [1, 4, 16, 64],
                               "seq_len": [2048, 8192], "zero_stage": [0, 1, 3]},
                      "fixed": {"batch_size": 1024},
                      "constraints": {"memory_limit": "72 GB", "max_accelerators": 1024}})


def test_analysis_of_a_real_cube_and_its_file(real_cube, tmp_path):
    best = sweep.top_k(real_cube, k=5, constraints={"max_accelerators": 256})
    assert (best["n_accelerators"] <= 256).all() and best["admissible"].all()
    assert np.all(np.diff(best["mfu"].values) <= 0)
    per_seq = sweep.best_along(real_cube, "seq_len")
    assert per_seq["found"].all()
    np.testing.assert_array_equal(
        per_seq["mfu"], real_cube["mfu"].where(real_cube["admissible"]).max(
            [d for d in real_cube["mfu"].dims if d != "seq_len"]))
    front = sweep.pareto_front(real_cube)
    assert set(front["n_accelerators"].values) <= {64 * k for k in range(1, 33)} | set(
        np.unique(real_cube["n_accelerators"]).tolist())
    # The same answers from the file opened lazily, scanned in small slabs.
    lazy = sweep.open_cube(sweep.save(real_cube, tmp_path / "real.nc"))
    xr.testing.assert_identical(best, sweep.top_k(lazy, k=5, constraints={"max_accelerators": 256},
                                                  block_points=1000))
    xr.testing.assert_identical(front, sweep.pareto_front(lazy, block_points=1000))
    xr.testing.assert_identical(per_seq, sweep.best_along(lazy, "seq_len", block_points=1000))
    lazy.close()


def test_a_mask_over_a_dim_the_cube_selected_to_one_value(real_cube):
    """cube.sel(seq_len=8192) keeps seq_len as a scalar coordinate; a where= mask built on the
    whole cube still spans it. Looking the 0-d value up in the mask's index raised
    TypeError: unhashable type: 'numpy.ndarray'."""
    one = real_cube.sel(seq_len=8192)
    got = sweep.top_k(one, objective="mfu", k=3, where=real_cube["admissible"].sel(tp_size=[4, 8]))
    want = sweep.top_k(one.sel(tp_size=[4, 8]), objective="mfu", k=3)
    assert set(got["tp_size"].values) <= {4, 8}
    np.testing.assert_array_equal(got["mfu"].values, want["mfu"].values)
    # a mask that holds only the other sequence length selects nothing
    none = sweep.top_k(one, objective="mfu", k=3, where=real_cube["admissible"].sel(seq_len=[2048]))
    assert none["mfu"].size == 0


def test_best_along_says_why_each_empty_slice_is_empty(real_cube, tmp_path):
    """A slice with no selected point had found=False and NaNs, with no why unless every
    slice was empty; now each such slice counts what removed its points."""
    best = sweep.best_along(real_cube, "tp_size", constraints={"memory_limit": "20 GB"})
    assert best["found"].values.tolist() == [False, False, True, True]
    assert best["why_not_found"].values[2:].tolist() == ["", ""]
    assert "why_empty" not in best.attrs  # (some slice is found)
    for tp in (1, 2):
        one = real_cube.sel(tp_size=tp)
        admissible = int(one["admissible"].sum())
        valid = int(one["valid"].sum())
        over = int((one["valid"] & ~one["feasible"]).sum())
        text = str(best["why_not_found"].sel(tp_size=tp).values)
        assert text.startswith(f"no admissible layout among {one['mfu'].size:,} points: "
                               f"valid split removed {one['mfu'].size - valid:,}, "
                               f"fits memory removed {over:,}, ")
        # every point the cube admits is over the 20 GB asked, and is what relaxing it gives
        assert admissible > 0 and (one["memory_footprint"].where(one["admissible"]) > 20e9).sum() == admissible
        assert f"memory limit (20 GB) removed {admissible:,}; relax memory limit (20 GB): {admissible:,} layouts" in text
    # the same from the file read lazily in small blocks, and per slice of two dims
    lazy = sweep.open_cube(sweep.save(real_cube, tmp_path / "why.nc"))
    xr.testing.assert_identical(best, sweep.best_along(lazy, "tp_size", block_points=1000,
                                                       constraints={"memory_limit": "20 GB"}))
    lazy.close()
    pairs = sweep.best_along(real_cube, ["seq_len", "tp_size"], constraints={"memory_limit": "20 GB"})
    fits = real_cube["admissible"] & (real_cube["memory_footprint"] <= 20e9)
    assert pairs["found"].values.tolist() == fits.any(["pp_size", "dp_size", "microbatch_count",
                                                      "zero_stage"]).transpose(
        "seq_len", "tp_size").values.tolist() == [[False, False, True, True],
                                                   [False, False, False, False]]
    over = []
    for seq, tp in ((2048, 1), (2048, 2), (8192, 1), (8192, 2), (8192, 4), (8192, 8)):
        n = int(real_cube["admissible"].sel(seq_len=seq, tp_size=tp).sum())
        over.append(n)
        assert f"memory limit (20 GB) removed {n:,}" in str(
            pairs["why_not_found"].sel(seq_len=seq, tp_size=tp).values)
    assert sum(n > 0 for n in over) >= 4, over


def test_memory_limit_as_fraction_of_capacity(real_cube):
    got = sweep.top_k(real_cube, k=3, constraints={"memory_limit": 0.5})
    capacity = solver.catalog.fleet("Training_1K").node.accelerator.memory_capacity
    assert (got["memory_footprint"] <= 0.5 * capacity).all()
    assert float(got["mfu"][0]) == float(real_cube["mfu"].where(
        real_cube["admissible"] & (real_cube["memory_footprint"] <= 0.5 * capacity)).max())


def test_a_where_mask_is_read_by_its_labels(real_cube, tmp_path):
    # Issue #11.2: a mask over tp_size 4 and 8 was read by position (as tp_size 1 and 2).
    where = real_cube["admissible"].sel(tp_size=[4, 8])
    admissible_48 = real_cube["admissible"] & real_cube["tp_size"].isin([4, 8])
    best = float(real_cube["mfu"].where(admissible_48).max())
    got = sweep.top_k(real_cube, k=5, where=where)
    assert set(got["tp_size"].values.tolist()) <= {4, 8} and got["admissible"].all()
    assert float(got["mfu"][0]) == best
    np.testing.assert_array_equal(mask(real_cube, where).transpose(*admissible_48.dims),
                                  admissible_48)
    per_seq = sweep.best_along(real_cube, "seq_len", where=where)
    assert set(per_seq["tp_size"].values.tolist()) <= {4, 8}
    front = sweep.pareto_front(real_cube, where=where)
    assert set(front["tp_size"].values.tolist()) <= {4, 8} and front["admissible"].all()
    # A mask in another order is the same mask; so is one read lazily in small blocks.
    reversed_ = real_cube["admissible"].isel(tp_size=slice(None, None, -1))
    xr.testing.assert_identical(sweep.top_k(real_cube, k=5, where=reversed_),
                                sweep.top_k(real_cube, k=5))
    lazy = sweep.open_cube(sweep.save(real_cube, tmp_path / "aligned.nc"))
    xr.testing.assert_identical(got, sweep.top_k(lazy, k=5, where=where, block_points=500))
    lazy.close()
    # A mask over a dim the cube lacks, or without labels and of another length, is refused.
    with pytest.raises(ValueError, match="expected dims of the cube .* the dim 'v_stages'"):
        sweep.top_k(real_cube, where=xr.DataArray([True, False], dims="v_stages"))
    with pytest.raises(ValueError, match="to have coordinates, or the cube's 4 points"):
        sweep.top_k(real_cube, where=xr.DataArray([True, False], dims="tp_size"))


def test_plots_read_a_where_mask_by_its_labels(real_cube):
    pytest.importorskip("matplotlib")
    from sweep.plot import reduce_to

    where = real_cube["admissible"].sel(tp_size=[4, 8])
    got = reduce_to(real_cube, "mfu", ("tp_size",), where=where)
    assert np.isnan(got.sel(tp_size=[1, 2])).all()
    expected = real_cube["mfu"].where(real_cube["admissible"]).max(
        [d for d in real_cube["mfu"].dims if d != "tp_size"]).sel(tp_size=[4, 8])
    np.testing.assert_array_equal(got.sel(tp_size=[4, 8]), expected)


def test_an_empty_answer_says_which_condition_removed_the_points(real_cube):
    # Issue #11.3: at most 8 accelerators: every layout here uses 64 or more.
    got = sweep.top_k(real_cube, constraints={"max_accelerators": 8})
    assert got.sizes["rank"] == 0
    counts = json.loads(got.attrs["empty_counts"])
    admissible = int(real_cube["admissible"].sum())
    assert counts["total"] == int(np.prod(list(real_cube.sizes.values())))
    assert counts["removed"]["accelerator budget (<= 8)"] == admissible
    assert sum(counts["removed"].values()) == counts["total"]
    assert counts["removed"]["valid split"] == int((~real_cube["valid"]).sum())
    assert counts["relaxed"]["accelerator budget (<= 8)"] == admissible
    why = got.attrs["why_empty"]
    assert why.startswith(f"no admissible layout among {counts['total']:,} points: ")
    assert f"accelerator budget (<= 8) removed {admissible:,}" in why
    assert f"relax accelerator budget (<= 8): {admissible:,} layouts pass" in why
    assert int(real_cube["n_accelerators"].where(real_cube["admissible"]).min()) > 8
    # best_along and pareto_front say the same.
    assert sweep.best_along(real_cube, "seq_len", constraints={"max_accelerators": 8}
                            ).attrs["why_empty"] == why
    assert sweep.pareto_front(real_cube, constraints={"max_accelerators": 8}
                              ).attrs["why_empty"] == why
    # A non-empty answer carries no such attribute.
    assert "why_empty" not in sweep.top_k(real_cube, k=1).attrs


def test_explain_empty_from_counts_alone():
    counts = {"total": 10, "removed": {"valid split": 4, "within the memory limit": 6},
              "relaxed": {"valid split": 0, "within the memory limit": 3}}
    assert sweep.analysis.explain_empty(counts, "trial") == (
        "no admissible trial among 10 points: valid split removed 4, within the memory limit "
        "removed 6; relax within the memory limit: 3 trials pass every other condition")
    err = sweep.analysis.NoAdmissibleError(counts)
    assert isinstance(err, ValueError) and err.counts == counts
    assert "relax within the memory limit" in str(err)
    two = {"total": 5, "removed": {"a": 2, "b": 3}, "relaxed": {"a": 0, "b": 0}}
    assert "relax two or more" in sweep.analysis.explain_empty(two)
    # Physics is not a limit to relax: the split and the accelerator's memory say widen the axes.
    physics = {"total": 5, "removed": {"fits memory": 5}, "relaxed": {"fits memory": 5}}
    assert sweep.analysis.explain_empty(physics).endswith(
        "fits memory removed 5; no limit relaxed alone gives a point: widen the axes (splits, "
        "ZeRO stages, recomputation) or relax two or more")
    one = {"total": 5, "removed": {"a": 5}, "relaxed": {"a": 1}}
    assert sweep.analysis.explain_empty(one).endswith("relax a: 1 layout passes every other "
                                                      "condition")


def _brute_split_fails(cube, factors, batch):
    """Points only realizable removes, and those of them whose batch does not split."""
    others = cube["valid"] & cube["feasible"] & cube["within_memory_limit"]
    blocked = others & ~cube["realizable"]
    divisor = cube["dp_size"]
    for f in factors:
        divisor = divisor * (cube[f] if f in cube.coords else 1)
    blocked, divisor, dp = xr.broadcast(blocked, divisor, cube["dp_size"])
    b, d, dp = blocked.values.ravel(), divisor.values.ravel(), dp.values.ravel()
    fails = np.zeros_like(b)
    fails[b] = np.asarray([batch % int(x) != 0 for x in d[b]])
    return int(b.sum()), int(fails.sum()), d[fails], sorted({int(x) for x in dp[fails]})


@pytest.mark.parametrize("physics", ["megatron", "mlsysim"])
def test_an_empty_answer_says_why_layouts_are_not_realizable(physics):
    """No realizable layout: the explanation counts those whose global batch does not split into
    whole microbatches (brute force over the cube), names their dp_size values and the batch size
    that splits the most of them, and that batch size does make them realizable."""
    if physics == "megatron":
        # 576 accelerators (8 NVL72 racks): dp = 576 / (tp pp cp) has a factor 9 that 1000 lacks.
        spec = {"workload": "Llama3_8B_MC", "fleet": "GB200_NVL72_8_MC", "physics": "megatron",
                "axes": {"tp_size": [1, 2, 4], "pp_size": [1, 2, 4], "cp_size": [1, 2],
                         "micro_batch_size": [1, 2], "v_stages": [1, 2]},
                "fixed": {"batch_size": 1000, "seq_len": 8192}}
        factors = ["micro_batch_size"]
    else:
        spec = {"workload": "Llama3_70B", "fleet": "Training_1K",
                "axes": {"tp_size": [1, 2, 4, 8], "pp_size": [1, 2, 4], "dp_size": [3, 6, 12, 24],
                         "microbatch_count": [1, 4, 16]},
                "fixed": {"batch_size": 1000}}
        factors = ["gradient_accumulation_steps", "microbatch_count"]
    cube = sweep.run(spec)
    batch = spec["fixed"]["batch_size"]
    counts = sweep.analysis.admissible_counts(cube)
    assert counts["admissible"] == 0
    n_blocked, n_fail, divisors, dps = _brute_split_fails(cube, factors, batch)
    assert n_blocked == counts["relaxed"]["realizable"] > 0 and n_fail > 0
    why = counts["why"]["realizable"]
    assert why.startswith(f"{n_fail:,} of the {n_blocked:,} layouts it alone removes do not split "
                          f"batch_size ({batch:,}) into whole microbatches")
    shown = ", ".join(f"{d:,}" for d in dps[:5]) + (", ..." if len(dps) > 5 else "")
    assert f"must divide it; dp_size there: {shown})" in why
    # The batch size it names splits the most of them (brute force over half to twice).
    named = int(why.split("; batch_size ")[1].split(" ")[0].replace(",", ""))
    split = lambda b: int(sum(b % int(d) == 0 for d in divisors))  # noqa: E731
    assert split(named) == max(split(b) for b in range(batch // 2, 2 * batch + 1)) > 0
    suggestion = (f"; batch_size {named:,} would split {split(named):,} of them into "
                  f"whole microbatches")
    # (the megatron model then counts the other rules its layouts break, by name)
    assert why.endswith(suggestion) or (
        physics == "megatron"
        and suggestion + "; the megatron model's rules they break (a layout may break several): "
        in why)
    assert ". Realizable: " + why in sweep.analysis.explain_empty(counts)
    # ... and at that batch size the cube has admissible layouts.
    again = sweep.run({**spec, "fixed": {**spec["fixed"], "batch_size": named}})
    assert int(again["admissible"].sum()) > 0
    # A cube too big to hold the evidence in memory says no why, and the rest as before.
    from sweep.analysis import empty

    saved, empty.WHY_MAX_POINTS = empty.WHY_MAX_POINTS, int(np.prod(list(cube.sizes.values()))) - 1
    try:
        big = sweep.analysis.admissible_counts(cube)
    finally:
        empty.WHY_MAX_POINTS = saved
    assert "why" not in big and big["removed"] == counts["removed"]


def test_an_empty_answer_over_a_physics_axis_gives_counts_but_no_realizable_why():
    """The two models split the batch by different rules: over a physics axis the counts stand
    and no single rule's reason is given (rather than one model's rule for both slices)."""
    spec = {"workload": "Llama3_8B_MC", "fleet": "GB200_NVL72_8_MC",
            "physics": ["mlsysim", "megatron"],
            "axes": {"tp_size": [1, 2, 4], "pp_size": [1, 2, 4]},
            "fixed": {"batch_size": 1000, "seq_len": 8192}}
    cube = sweep.run(spec)
    counts = sweep.analysis.admissible_counts(cube)
    assert counts["admissible"] == 0 and counts["removed"]["realizable"] == 18
    assert "why" not in counts
    # ... nor does an exhaustive search of the same space, which prices each model's block apart.
    from sweep.search import search

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = search(spec, mode="exhaustive")
    assert result.empty_counts["removed"]["realizable"] == 18 and "why" not in result.empty_counts


def test_top_k_of_a_utilization_across_precisions_warns():
    """top_k by MFU over a precision dim of mixed widths warns and names what ranks speed;
    one precision, one width (bf16 and fp16) or a speed objective do not warn."""
    cube = _random_cube(0)
    cube = xr.concat([cube, cube], dim=xr.DataArray(["bf16", "fp8"], dims="precision",
                                                    name="precision"))
    with pytest.warns(sweep.analysis.UtilizationWarning,
                      match="'mfu' is measured against each precision's own peak.*effective_throughput"):
        sweep.top_k(cube, "mfu")
    quiet = [(cube.sel(precision=["bf16"]), "mfu"), (cube, "step_latency_total"),
             (cube.assign_coords(precision=["bf16", "fp16"]), "mfu")]
    for one, objective in quiet:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            sweep.top_k(one, objective)


def _cube_within_60_gb():
    """Llama3_70B on Training_1K over TP x PP x ZeRO, its spec's memory limit 60 GB."""
    return sweep.run({"workload": "Llama3_70B", "fleet": "Training_1K",
                      "axes": {"tp_size": [1, 2, 4, 8], "pp_size": [1, 2, 4, 8],
                               "zero_stage": [0, 1, 3]},
                      "fixed": {"batch_size": 1024, "microbatch_count": 8},
                      "constraints": {"memory_limit": "60 GB"},
                      "outputs": ["mfu", "memory_footprint"]})


def test_a_looser_memory_limit_than_the_cubes_is_refused_not_ignored():
    """admissible holds the spec's memory limit: a looser limit asked of it could admit
    nothing more, so it is refused naming both limits; a tighter one applies, and a mask
    without the limit (valid) takes any."""
    cube = _cube_within_60_gb()
    with pytest.raises(ValueError, match=r"looser than the cube's own limit .*\(60 GB"):
        sweep.top_k(cube, "mfu", k=3, constraints={"memory_limit": "84 GB"})
    tight = sweep.top_k(cube, "mfu", k=50, constraints={"memory_limit": "40 GB"})
    assert tight.sizes["rank"] > 0 and float(tight["memory_footprint"].max()) <= 40e9
    loose = sweep.top_k(cube, "mfu", k=200, where="valid", constraints={"memory_limit": "84 GB"})
    assert 60e9 < float(loose["memory_footprint"].max()) <= 84e9
    same = sweep.top_k(cube, "mfu", k=3, constraints={"memory_limit": "60 GB"})  # equal: fine
    assert same.identical(sweep.top_k(cube, "mfu", k=3))


def test_a_boolean_mask_is_no_objective():
    spec = {"workload": "Llama3_70B", "fleet": "Training_1K", "axes": {"tp_size": [4, 8]},
            "fixed": {"batch_size": 1024, "pp_size": 4}, "outputs": ["mfu"]}
    cube = sweep.run(spec)
    with pytest.raises(ValueError, match="objective must be a numeric variable, but got the "
                                         "boolean mask 'valid'"):
        sweep.top_k(cube, "valid")


def test_an_empty_answer_names_the_accelerator_minimum():
    """The spec's min_accelerators is one of the conditions an empty answer counts (it
    had been lumped into 'admissible (its other conditions)')."""
    cube = sweep.run({"workload": "Llama3_70B", "fleet": "Training_1K",
                      "axes": {"tp_size": [8], "dp_size": [1, 2], "pp_size": [1, 2]},
                      "fixed": {"batch_size": 1024}, "constraints": {"min_accelerators": 64}})
    why = sweep.top_k(cube).attrs["why_empty"]
    assert "accelerator minimum (>= 64, the spec's) removed" in why
    assert "its other conditions" not in why


def _two_fleet_cube(limit):
    spec = {"workload": "Llama3_70B", "fleet": ["Training_1K", "Training_1K_B200"],
            "axes": {"tp_size": [1, 2, 4, 8], "pp_size": [1, 2, 4, 8], "zero_stage": [0, 1, 3],
                     "activation_recomputation": [False, True]},
            "fixed": {"batch_size": 1024, "microbatch_count": 8},
            "outputs": ["mfu", "memory_footprint"]}
    if limit is not None:
        spec["constraints"] = {"memory_limit": limit}
    return sweep.run(spec)


def test_a_fractional_limit_after_selecting_one_fleet_takes_that_fleets_memory():
    """cube.sel(fleet=X) leaves fleet a scalar coordinate: a fraction of the accelerator's
    memory is X's (a B200's 193 GB), not the first fleet's of the cube's attributes (an
    H100's 86 GB, as an audit found: half the layouts dropped)."""
    cube = _two_fleet_cube(None)
    b200 = "Training_1K_B200"
    one = sweep.top_k(cube.sel(fleet=b200), "mfu", k=1, constraints={"memory_limit": 0.9})
    listed = sweep.top_k(cube.sel(fleet=[b200]), "mfu", k=1, constraints={"memory_limit": 0.9})
    assert float(one["mfu"][0]) == float(listed["mfu"][0])
    capacity = sweep.analysis.masks._capacities(cube.sel(fleet=b200))
    assert capacity > 150e9
    n = int(sweep.analysis.mask(cube.sel(fleet=b200), constraints={"memory_limit": 0.9}).sum())
    assert n == int(((cube["admissible"] & (cube["memory_footprint"] <= 0.9 * capacity))
                     .sel(fleet=b200)).sum())


def test_a_size_limit_is_checked_against_the_selected_fleets_own_limit_only():
    """With the spec's 90 % a fleet, 100 GB is looser than the H100 fleet's 77 GB but
    tighter than the B200 fleet's 174 GB: asked of the B200 fleet alone it applies."""
    cube = _two_fleet_cube(0.9)
    b200 = cube.sel(fleet=["Training_1K_B200"])
    top = sweep.top_k(b200, "mfu", k=5, constraints={"memory_limit": "100 GB"})
    assert top.sizes["rank"] > 0 and float(top["memory_footprint"].max()) <= 100e9
    with pytest.raises(sweep.limits.MemoryLimitError, match="looser than the cube's own limit"):
        sweep.top_k(cube.sel(fleet=["Training_1K"]), "mfu", constraints={"memory_limit": "100 GB"})


def test_a_looser_limit_on_a_mask_within_admissible_is_refused_too():
    """``cube.admissible & ...`` holds the cube's limit as ``admissible`` does: a looser limit
    asked with it is refused, not quietly the cube's own; a mask built on ``valid`` takes it."""
    cube = _cube_within_60_gb()
    with pytest.raises(ValueError, match=r"looser than the cube's own limit .*\(60 GB"):
        sweep.top_k(cube, "mfu", where=cube["admissible"] & (cube["tp_size"] >= 1),
                    constraints={"memory_limit": "80 GB"})
    derived = sweep.top_k(cube, "mfu", k=200, where=cube["valid"] & (cube["tp_size"] >= 1),
                          constraints={"memory_limit": "80 GB"})
    plain = sweep.top_k(cube, "mfu", k=200, where="valid", constraints={"memory_limit": "80 GB"})
    assert derived.sizes["rank"] == plain.sizes["rank"]
    assert 60e9 < float(derived["memory_footprint"].max()) <= 80e9


def test_best_along_and_pareto_front_warn_across_precisions_and_rankings_across_jobs():
    """best_along over a precision axis took each cell's best MFU across bf16 and fp8 (each
    against its own peak: not the faster layout) without the warning top_k gives; top_k
    and pareto_front ranked across sequence lengths without the JobMixWarning."""
    spec = {"workload": "Llama3_70B", "fleet": "Training_1K",
            "axes": {"tp_size": [2, 4, 8], "pp_size": [1, 2, 4], "precision": ["bf16", "fp8"]},
            "fixed": {"batch_size": 1024, "microbatch_count": 8},
            "outputs": ["mfu", "memory_footprint", "effective_throughput"]}
    cube = sweep.run(spec)
    with pytest.warns(sweep.analysis.UtilizationWarning, match="each precision's own peak"):
        sweep.best_along(cube, "tp_size", "mfu")
    with pytest.warns(sweep.analysis.UtilizationWarning):
        sweep.pareto_front(cube, {"mfu": "max", "memory_footprint": "min"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sweep.best_along(cube, ["tp_size", "precision"], "mfu")  # one precision a cell
        sweep.best_along(cube, "tp_size", "effective_throughput")
    jobs = sweep.run({**spec, "axes": {"tp_size": [4, 8], "seq_len": [2048, 4096]}})
    with pytest.warns(sweep.analysis.JobMixWarning, match=r"the ranking spans seq_len"):
        sweep.top_k(jobs, "mfu", k=3)
    with pytest.warns(sweep.analysis.JobMixWarning):
        sweep.pareto_front(jobs, {"mfu": "max", "memory_footprint": "min"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sweep.top_k(jobs.sel(seq_len=4096), "mfu", k=3)


def test_the_precision_warning_names_the_narrowest_precision_in_play():
    # It said "a faster FP8 layout" whatever the precisions (an audit saw it over bf16 and fp4).
    from sweep.analysis.utilization import warn_across_precisions
    for values, name in ((["bf16", "fp4"], "FP4"), (["bf16", "fp8"], "FP8"), (["fp32", "bf16"], "BF16")):
        with pytest.warns(sweep.analysis.UtilizationWarning, match=f"a faster {name} layout"):
            assert warn_across_precisions(["mfu"], values)
