"""Realizable layouts (issue #11.4): priced as the reference does, masked, and ranked only if runnable.

The reference prices any ``microbatch_count``; a layout a framework can run
splits the per-replica batch of each accumulation step into whole
microbatches and has no idle ranks. ``admissible`` requires it unless the
spec (``require_realizable = false``), ``sweep.run(require_realizable=False)``
or the command line (``--no-require-realizable``) turns it off.
"""

from __future__ import annotations

import numpy as np
import pytest

import sweep
from sweep.cli import main

# Training_1K: 1024 accelerators. TP 8 x PP 4 = 32 per replica, DP 32; a batch of 256 is
# 8 samples per replica: microbatch counts 1, 2, 4, 8 are whole, 3, 16 and 64 are not.
SPEC = {
    "workload": "Llama3_70B", "fleet": "Training_1K",
    "axes": {"tp_size": [8], "pp_size": [4], "microbatch_count": [1, 2, 3, 4, 8, 16, 64],
             "gradient_accumulation_steps": [1, 2]},
    "fixed": {"batch_size": 256, "activation_recomputation": True},
    "outputs": ["mfu", "feasible"],
}
# 8 per replica, by hand: realizable where microbatch_count * gas divides 8.
EXPECTED = np.array([[8 % (m * g) == 0 for g in (1, 2)] for m in (1, 2, 3, 4, 8, 16, 64)])


def test_cube_masks_unrealizable_layouts_and_admissible_requires_it():
    cube = sweep.run(SPEC)
    assert EXPECTED.any() and not EXPECTED.all()
    realizable = cube["realizable"].sel(tp_size=8, pp_size=4).transpose(
        "microbatch_count", "gradient_accumulation_steps")
    np.testing.assert_array_equal(realizable.values, EXPECTED)
    assert cube["realizable"].dtype == bool
    np.testing.assert_array_equal(
        cube["admissible"].values,
        (cube["valid"] & cube["within_memory_limit"] & cube["realizable"]).values)
    assert cube["valid"].all() and cube["within_memory_limit"].all()  # so only realizable bites
    assert cube.attrs["require_realizable"] == 1
    # top_k ranks through admissible: every ranked layout is realizable
    best = sweep.top_k(cube, objective="mfu", k=20)
    assert best.sizes["rank"] == EXPECTED.sum()
    assert bool(best["realizable"].all())


def test_switch_off_keeps_the_reference_layouts_and_the_numbers():
    on = sweep.run(SPEC)
    off = sweep.run(SPEC, require_realizable=False)
    by_spec = sweep.run({**SPEC, "constraints": {"require_realizable": False}})
    np.testing.assert_array_equal(off["admissible"].values, off["valid"].values)
    assert bool(off["admissible"].all()) and not bool(on["admissible"].all())
    np.testing.assert_array_equal(by_spec["admissible"].values, off["admissible"].values)
    assert off.attrs["require_realizable"] == 0
    # the mask is the same either way, and no number moves
    np.testing.assert_array_equal(off["realizable"].values, on["realizable"].values)
    np.testing.assert_array_equal(off["mfu"].values, on["mfu"].values)
    # the reference's best layout by MFU is one a framework cannot run (64 microbatches
    # of 1/8 of a sample: the smallest bubble); the default refuses it
    raw = sweep.top_k(off, objective="mfu", k=1)
    assert int(raw["microbatch_count"][0]) == 64 and not bool(raw["realizable"][0])
    best = sweep.top_k(on, objective="mfu", k=1)
    assert int(best["microbatch_count"][0]) == 8 and bool(best["realizable"][0])


def test_spec_key_is_checked():
    with pytest.raises(sweep.SpecError, match=r"constraints\.require_realizable: expected true "
                                              r"or false, but got 'no'"):
        sweep.load_spec({**SPEC, "constraints": {"require_realizable": "no"}})
    assert sweep.load_spec(SPEC).require_realizable is True


def test_the_default_main_job_ranks_only_realizable_layouts():
    # Before: the default sweep's best layout by MFU was TP 1 x PP 4 with 64 microbatches
    # of a replica holding 4 samples (MFU 0.479); with the mask it is runnable.
    cube = sweep.run("default")
    best = sweep.top_k(cube, objective="mfu", k=10)
    assert bool(best["realizable"].all())
    raw = sweep.top_k(sweep.run("default", require_realizable=False), objective="mfu", k=1)
    assert not bool(raw["realizable"][0])
    assert float(raw["mfu"][0]) > float(best["mfu"][0])


def test_main_job_and_switch_on_the_command_line(tmp_path, capsys):
    assert main(["--no-save"]) == 0
    out = capsys.readouterr().out
    # The main job answers per scenario (seq_len here): its first block is the first value's.
    head, table = out.split("Best layout of each parallel split", 1)
    scenario = head.splitlines()[-1].rstrip(": ")
    dim, value = scenario.split("=")
    first = next(line for line in table.splitlines() if line.split()[:1] == ["1"])
    cube = sweep.run("default")
    best = sweep.top_k(cube.sel({dim: [int(value)]}), objective="mfu", k=1)
    assert bool(best["realizable"][0])
    assert f"{float(best['mfu'][0]):.4f}" in first
    path = tmp_path / "raw.nc"
    spec = tmp_path / "s.toml"
    spec.write_text('workload = "Llama3_70B"\nfleet = "Training_1K"\noutputs = ["mfu"]\n'
                    '[axes]\ntp_size = [8]\npp_size = [4]\nmicrobatch_count = [1, 64]\n'
                    '[fixed]\nbatch_size = 256\nactivation_recomputation = true\n')
    assert main(["run", str(spec), "-o", str(path), "--no-require-realizable"]) == 0
    raw = sweep.open_cube(path)
    assert raw.attrs["require_realizable"] == 0 and bool(raw["admissible"].all())
    assert not bool(raw["realizable"].all())
    raw.close()


def test_search_requires_realizable_by_default():
    spec = {**SPEC, "axes": {**SPEC["axes"], "microbatch_count": [1, 2, 3, 4, 8, 16, 64]}}
    result = sweep.search(spec, mode="exact", k=20)
    assert result.n_admissible == EXPECTED.sum()
    assert result.breakdown["realizable"] is True
    assert result.breakdown["constraint:realizable"] == 0.0
    assert result.best_params["microbatch_count"] == 8
    assert {row["params"]["microbatch_count"] for row in result.top} == {1, 2, 4, 8}
    raw = sweep.search(spec, mode="exact", k=20, require_realizable=False)
    assert raw.n_admissible == EXPECTED.size
    assert raw.best_params["microbatch_count"] == 64
    assert raw.breakdown["realizable"] is False


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_mlsysim_layouts_must_split_the_model_evenly(engine):
    """The reference prices any split; realizable also needs TP to divide the heads, an
    interleaved schedule to cut the layers into pp_size x v_stages equal chunks (with
    more than one stage; without interleaving any pp_size up to the layer count), and EP
    to divide the experts (EP 1 on a dense model). Brute force over every point, both
    engines (4096-point flat batches reach the fused kernel); the prices are the
    reference's whatever the mask."""
    import solver
    if engine == "fused":
        pytest.importorskip("numba")
    rng = np.random.default_rng(7)
    n = 4096
    for name, fleet in (("Llama3_70B", "Training_1K"), ("Mixtral_8x7B", "Training_1K"),
                        ("GPT3", "Training_1K")):
        w = solver.catalog.workload(name)
        tp = rng.choice([1, 2, 3, 4, 8, 16, 64], n)
        pp = rng.choice([1, 2, 4, 5, 16, 32, 96, 200], n)
        v = rng.choice([1, 2, 3, 4, 8], n)
        ep = rng.choice([1, 2, 4, 8, 16], n)
        out = solver.solve(w, solver.catalog.fleet(fleet), batch_size=4096, tp_size=tp,
                           pp_size=pp, v_stages=v, ep_size=ep, microbatch_count=1, dp_size=2,
                           engine=engine)
        experts = w.experts if w.kind == "moe" else 1
        even = np.array([w.heads % t == 0
                         and ((p <= w.layers) if s == 1 else (p > 1 and w.layers % (p * s) == 0))
                         and experts % e == 0 for t, p, s, e in zip(tp, pp, v, ep)])
        assert 0 < even.sum() < n
        whole = np.asarray(out["valid"])  # batch 4096 over dp 2: whole microbatches everywhere
        np.testing.assert_array_equal(out["realizable"], even & whole)
        raw = solver.solve(w, solver.catalog.fleet(fleet), batch_size=4096, tp_size=tp, pp_size=pp,
                           v_stages=v, ep_size=ep, microbatch_count=1, dp_size=2, engine="numpy")
        np.testing.assert_array_equal(out["step_latency_total"], raw["step_latency_total"])
