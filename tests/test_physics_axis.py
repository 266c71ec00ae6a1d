"""``physics`` as a spec key, a cube axis and a CLI flag (issue 14, point 1)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import xarray as xr

import solver
import sweep
from solver import outputs as outputs_
from solver.physics import megatron
from sweep import cli, grid
from sweep.spec import SpecError, load_spec

WORKLOAD, FLEET = "Llama3_70B_MC", "HGX_H100_1K_MC"
BOTH = {"workload": WORKLOAD, "fleet": FLEET, "physics": ["mlsysim", "megatron"],
        "axes": {"tp_size": [2, 4, 8], "pp_size": [1, 4],
                 "micro_batch_size": [1, 2],       # megatron only
                 "microbatch_count": [1, 8]},      # mlsysim only
        "fixed": {"batch_size": 1024, "precision": "bf16", "seq_len": 4096}}


# ------------------------------------------------------------------ registry

def test_registry_holds_every_output_of_each_model_with_its_units():
    for model in solver.PHYSICS:
        names = list(outputs_.outputs_of(model))
        returned = solver.solve(solver.catalog.workload(WORKLOAD), solver.catalog.fleet(FLEET),
                                physics=model, tp_size=8, pp_size=4, batch_size=1024)
        assert names == list(returned), model
        for name in names:
            assert model in outputs_.REGISTRY[name].physics, (model, name)
    for name, (units, _) in megatron.OUTPUTS.items():
        assert outputs_.REGISTRY[name].units == units, name
    assert list(outputs_.outputs_of("mlsysim")) == list(outputs_.OUTPUTS)  # compatibility
    assert outputs_.REGISTRY["realizable"].is_boolean
    assert outputs_.better("tokens_per_second_per_accelerator") == "maximize"
    assert outputs_.better("cp_communication_latency") == "minimize"
    assert "cp_communication_latency" not in outputs_.OUTPUTS


def test_n_accelerators_follows_each_models_rule():
    knobs = {"tp_size": 4, "pp_size": 2, "cp_size": 2, "ep_size": 8}
    out = {"dp_size": np.array(16)}
    assert outputs_.n_accelerators(out, knobs) == 16 * 4 * 2 * 8            # mlsysim: EP too
    assert outputs_.n_accelerators(out, knobs, physics="megatron") == 16 * 4 * 2 * 2  # CP
    mixed = outputs_.n_accelerators(out, {**knobs, "physics": np.array(["mlsysim", "megatron"])})
    assert mixed.tolist() == [1024, 256]
    with pytest.raises(ValueError, match="megatron"):
        outputs_.n_accelerators(out, knobs, physics="megatorn")


# --------------------------------------------------------------------- spec

def test_physics_fixed_is_an_attribute_not_an_axis():
    spec = load_spec({"workload": WORKLOAD, "fleet": FLEET, "physics": "megatron",
                      "axes": {"tp_size": [1, 2], "cp_size": [1, 2]}})
    assert spec.physics == ("megatron",) and "physics" not in spec.dims
    assert spec.outputs == tuple(megatron.OUTPUTS)   # the model's outputs by default
    assert load_spec({"workload": WORKLOAD, "fleet": FLEET}).physics == ("mlsysim",)


def test_physics_list_is_a_categorical_axis_and_outputs_are_the_union():
    spec = load_spec(BOTH)
    assert spec.dims[0] == "physics" and spec.axis("physics").values == ("mlsysim", "megatron")
    assert spec.size == 2 * 3 * 2 * 2 * 2
    assert set(spec.outputs) == set(outputs_.OUTPUTS) | set(megatron.OUTPUTS)
    assert spec.outputs[:len(outputs_.OUTPUTS)] == tuple(outputs_.OUTPUTS)


def test_unknown_physics_names_the_choices_and_the_closest():
    with pytest.raises(SpecError, match=r"physics.*'megatron', 'mlsysim'.*'megatorn'.*closest "
                                        r"is 'megatron'"):
        load_spec({"workload": WORKLOAD, "fleet": FLEET, "physics": "megatorn"})
    with pytest.raises(SpecError, match=r"physics\[1\]"):
        load_spec({"workload": WORKLOAD, "fleet": FLEET, "physics": ["mlsysim", "vtrain"]})


def test_a_knob_of_one_model_only():
    # refused when no model of the spec takes it, naming the one that does
    with pytest.raises(SpecError, match=r"axes.cp_size.*a knob of megatron"):
        load_spec({"workload": WORKLOAD, "fleet": FLEET, "axes": {"cp_size": [1, 2]}})
    with pytest.raises(SpecError, match=r"fixed.microbatch_count.*a knob of mlsysim"):
        load_spec({"workload": WORKLOAD, "fleet": FLEET, "physics": "megatron",
                   "fixed": {"microbatch_count": 4}})
    # a value is checked by every model that takes the knob: fp32 is no megatron precision
    with pytest.raises(SpecError, match=r"axes.precision\[1\].*'bf16'.*megatron"):
        load_spec({**BOTH, "axes": {"precision": ["bf16", "fp32"]}})
    with pytest.raises(SpecError, match=r"recompute.*'none', 'selective', 'full'"):
        load_spec({**BOTH, "axes": {"recompute": ["none", "some"]}})
    # with both models: passed only to the model that takes it
    spec = load_spec(BOTH)
    blocks = list(grid.blocks(spec))
    assert {b.physics for b in blocks} == {"mlsysim", "megatron"}
    for block in blocks:
        assert ("micro_batch_size" in block.knobs) == (block.physics == "megatron")
        assert ("microbatch_count" in block.knobs) == (block.physics == "mlsysim")


def test_an_output_of_the_other_model_only_is_refused():
    with pytest.raises(SpecError, match=r"cp_communication_latency.*of megatron only"):
        load_spec({"workload": WORKLOAD, "fleet": FLEET, "outputs": ["cp_communication_latency"]})


def test_a_cube_describes_each_output_as_its_models_do():
    from sweep.cube import layout
    from solver.physics import megatron as mg
    one = layout(load_spec(BOTH, physics="megatron")).variables
    assert one["tp_communication_latency"].attrs["long_name"] == \
        mg.OUTPUTS["tp_communication_latency"][1] == "exposed tensor-parallel collectives"
    assert one["mfu"].attrs["long_name"] == mg.OUTPUTS["mfu"][1]
    both = layout(load_spec(BOTH)).variables
    assert both["tp_communication_latency"].attrs["long_name"] == (
        "mlsysim: tensor-parallel activation all-reduces; megatron: exposed tensor-parallel "
        "collectives")
    mlsysim_only = layout(load_spec(BOTH, physics="mlsysim")).variables
    assert mlsysim_only["tp_communication_latency"].attrs["long_name"] == \
        "tensor-parallel activation all-reduces"


def test_one_model_of_a_spec_of_both_is_its_slice():
    # --physics megatron on a spec of both models: the knobs and outputs of mlsysim alone go
    both = {**BOTH, "outputs": ["mfu", "scaling_efficiency", "cp_communication_latency"]}
    spec = load_spec(both, physics="megatron")
    assert spec.physics == ("megatron",)
    blocks = list(grid.blocks(spec))
    assert blocks and all(b.physics == "megatron" for b in blocks)
    assert all("microbatch_count" not in b.knobs and "micro_batch_size" in b.knobs for b in blocks)
    assert spec.outputs == ("mfu", "cp_communication_latency")
    mlsysim_only = load_spec(both, physics="mlsysim")
    assert all("micro_batch_size" not in b.knobs and "microbatch_count" in b.knobs
               for b in grid.blocks(mlsysim_only))
    assert mlsysim_only.outputs == ("mfu", "scaling_efficiency")
    # the same cube as a spec of megatron alone
    alone = load_spec({**both, "physics": "megatron",
                       "axes": {k: v for k, v in BOTH["axes"].items() if k != "microbatch_count"},
                       "outputs": ["mfu", "cp_communication_latency"]})
    others = list(grid.blocks(alone))
    assert len(others) == len(blocks)
    for a, b in zip(others, blocks):
        assert a.knobs.keys() == b.knobs.keys()
        for name in a.knobs:
            np.testing.assert_array_equal(a.knobs[name], b.knobs[name])


def test_load_spec_physics_overrides_the_spec():
    spec = load_spec({"workload": WORKLOAD, "fleet": FLEET, "axes": {"tp_size": [1, 2]}},
                     physics="megatron")
    assert spec.physics == ("megatron",)
    assert load_spec(spec, physics="mlsysim").physics == ("mlsysim",)
    with pytest.raises(SpecError, match="closest is 'mlsysim'"):
        load_spec(spec, physics="mlsysm")


# --------------------------------------------------------------------- cube

@pytest.fixture(scope="module")
def both_cube():
    return sweep.run(BOTH)


def _own_solve(model, knobs):
    wl, fl = solver.catalog.workload(WORKLOAD), solver.catalog.fleet(FLEET)
    mesh = dict(zip(("tp_size", "pp_size", "micro_batch_size", "microbatch_count"),
                    np.ix_(*[np.array(BOTH["axes"][k]) for k in
                             ("tp_size", "pp_size", "micro_batch_size", "microbatch_count")])))
    mesh = {k: v for k, v in mesh.items() if k in knobs}
    return solver.solve(wl, fl, physics=model, **BOTH["fixed"], **mesh)


def test_each_physics_slice_equals_its_models_own_solve(both_cube):
    cube = both_cube
    shape = (3, 2, 2, 2)
    for model, other in (("mlsysim", "megatron"), ("megatron", "mlsysim")):
        own = _own_solve(model, sweep.physics.knobs_of(model))
        part = cube.sel(physics=model)
        assert part["mfu"].dims == ("tp_size", "pp_size", "micro_batch_size", "microbatch_count")
        for name in set(outputs_.outputs_of(model)) - set(cube.dims):
            expected = np.broadcast_to(own[name], shape)
            np.testing.assert_array_equal(part[name].values, expected, err_msg=f"{model} {name}")
        for name in set(outputs_.outputs_of(other)) - set(outputs_.outputs_of(model)) - set(
                cube.dims):  # megatron's microbatch_count output: here an axis of mlsysim
            values = part[name].values
            assert (not values.any()) if values.dtype == bool else np.isnan(values).all(), name
        np.testing.assert_array_equal(part["admissible"].values,
                                      np.broadcast_to(own["valid"] & (own["memory_footprint"]
                                                      <= sweep.load_spec(BOTH).memory_limit_for(
                                                          solver.catalog.fleet(FLEET))), shape))
    # mlsysim is constant along megatron's knob, and megatron along mlsysim's
    mfu = cube["mfu"]
    ml = mfu.sel(physics="mlsysim").values
    mg = mfu.sel(physics="megatron").values
    np.testing.assert_array_equal(ml[:, :, 0, :], ml[:, :, 1, :])
    np.testing.assert_array_equal(mg[..., 0], mg[..., 1])
    assert not np.array_equal(ml, mg)
    assert cube["physics"].values.tolist() == ["mlsysim", "megatron"]
    assert "physics" not in cube.attrs and "megatron" in cube.attrs["physics_models"]


def test_fixed_physics_cube_says_which_model_and_its_constants():
    cube = sweep.run({"workload": WORKLOAD, "fleet": FLEET, "physics": "megatron",
                      "axes": {"tp_size": [4, 8], "cp_size": [1, 2]},
                      "fixed": {"batch_size": 512}})
    assert cube.attrs["physics"] == "megatron" and "physics" not in cube.dims
    assert "megatron" in cube.attrs["reference"]
    import json
    facts = json.loads(cube.attrs["physics_models"])["megatron"]
    assert json.loads(facts["constants"]) == megatron.CONSTANTS
    assert json.loads(facts["constants_provenance"]) == megatron.CONSTANTS_PROVENANCE
    assert "cp_communication_latency" in cube and "node_latency" not in cube


def test_n_accelerators_of_megatron_counts_cp_when_the_layout_sizes_the_cluster():
    cube = sweep.run({"workload": WORKLOAD, "fleet": FLEET, "physics": ["mlsysim", "megatron"],
                      "axes": {"tp_size": [2, 8], "cp_size": [1, 2], "ep_size": [1, 2],
                               "dp_size": [1, 4]},
                      "fixed": {"batch_size": 64}})
    n = cube["n_accelerators"]
    assert n.dims == ("physics", "tp_size", "cp_size", "ep_size", "dp_size")
    tp, cp, ep, dp = np.ix_([2, 8], [1, 2], [1, 2], [1, 4])
    np.testing.assert_array_equal(n.sel(physics="mlsysim").values,
                                  np.broadcast_to(tp * ep * dp, (2, 2, 2, 2)))
    np.testing.assert_array_equal(n.sel(physics="megatron").values,
                                  np.broadcast_to(tp * cp * dp, (2, 2, 2, 2)))


def test_physics_axis_round_trips_through_netcdf(tmp_path, monkeypatch, both_cube):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1764460800")
    memory = sweep.run(BOTH)
    streamed = sweep.run(BOTH, path=tmp_path / "both.nc", block_points=5)
    saved = sweep.open_cube(sweep.save(memory, tmp_path / "saved.nc"))
    for other in (streamed, saved):
        xr.testing.assert_identical(memory, other.load())
        assert other["physics"].values.tolist() == ["mlsysim", "megatron"]
        assert other["realizable"].dtype == bool
        other.close()


# ---------------------------------------------------------------- search, CLI

def test_search_prices_with_the_chosen_physics():
    from sweep.search import search

    spec = {"workload": WORKLOAD, "fleet": FLEET, "physics": "megatron",
            "axes": {"tp_size": [2, 4, 8], "pp_size": [1, 2, 4], "micro_batch_size": [1, 2]},
            "fixed": {"batch_size": 1024, "seq_len": 4096}}
    result = search(spec, n_trials=18, seed=0, mode="exact")
    best = result.best_params
    assert best["physics"] == "megatron"
    knobs = {k: v for k, v in best.items() if k not in ("workload", "fleet", "physics")}
    out = solver.solve(solver.catalog.workload(WORKLOAD), solver.catalog.fleet(FLEET),
                       physics="megatron", **knobs)
    assert result.best_value == pytest.approx(float(out["mfu"]), rel=1e-12)
    cube = sweep.run(spec)
    assert result.best_value == pytest.approx(float(cube["mfu"].where(cube["admissible"]).max()),
                                              rel=1e-6)
    sampled = search(spec, n_trials=12, seed=0)   # the sampling loop prices by megatron too
    knobs = {k: v for k, v in sampled.best_params.items()
             if k not in ("workload", "fleet", "physics")}
    out = solver.solve(solver.catalog.workload(WORKLOAD), solver.catalog.fleet(FLEET),
                       physics="megatron", **knobs)
    assert sampled.best_value == pytest.approx(float(out["mfu"]), rel=1e-12)


def test_search_with_physics_as_an_axis_prices_each_trial_by_its_model():
    from sweep.search import search

    result = search({**BOTH, "constraints": {"memory_limit": 1.0}, "fixed": {
        **BOTH["fixed"], "seq_len": 1024, "activation_recomputation": True,
        "zero_stage": 1}}, n_trials=48, seed=0, mode="exact", k=48)
    wl, fl = solver.catalog.workload(WORKLOAD), solver.catalog.fleet(FLEET)
    seen = set()
    for entry in result.top:
        params = entry["params"]
        model = params["physics"]
        seen.add(model)
        knobs = sweep.physics.knobs_for(model, params)
        out = solver.solve(wl, fl, physics=model, **knobs)
        assert entry["values"]["mfu"] == pytest.approx(float(out["mfu"]), rel=1e-12)
    assert seen == {"mlsysim", "megatron"}


def _call(capsys, argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_physics_megatron_runs_the_main_job(capsys):
    code, out, err = _call(capsys, ["--physics", "megatron", "--no-save", "-k", "2",
                                    "--no-progress"])
    assert code == 0, err
    assert "megatron_llama70b" in out and "physics megatron" in out
    assert "207,360 layouts priced" in out and "Why #1 wins" in out


def test_cli_run_physics_overrides_the_spec_and_show_says_so(tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text(f'workload = "{WORKLOAD}"\nfleet = "{FLEET}"\n[axes]\ntp_size = [4, 8]\n'
                    '[fixed]\nbatch_size = 512\ncp_size = 2\n')  # cp_size: megatron's knob
    path = tmp_path / "m.nc"
    code, out, err = _call(capsys, ["run", spec, "-o", path, "--physics", "megatron",
                                    "--no-progress"])
    assert code == 0, err
    cube = sweep.open_cube(path)
    assert cube.attrs["physics"] == "megatron" and "cp_communication_latency" in cube
    cube.close()
    code, out, err = _call(capsys, ["show", path])
    assert code == 0 and "physics: megatron" in out and "constants_provenance" in out
    code, out, err = _call(capsys, ["top", path, "-k", "2"])
    assert code == 0, err
    assert re.search(r"tp_size=8, dp_size=64\b", out), out  # 1024 / (tp*cp): megatron's rule
    code, out, err = _call(capsys, ["run", spec, "-o", path, "--physics", "megatorn"])
    assert code == 2 and "megatron" in err


# ------------------------------------- an output of the other model (audit, 2026-12-05)

def test_ranking_one_models_points_by_the_other_models_output_is_refused(both_cube, tmp_path):
    """A cube of both models holds mlsysim's scaling_efficiency as NaN over megatron's
    points: ranking those by it selected nothing and said no layout was admissible (16
    were), and the CLI exited 0 with "top 0 of 16". Now it names the model that has it."""
    megatron_points = both_cube.sel(physics="megatron")
    with pytest.raises(KeyError, match=r"'scaling_efficiency' is an output of the mlsysim "
                                       r"model only, but these points are priced by megatron"):
        sweep.top_k(megatron_points, objective="scaling_efficiency")
    with pytest.raises(KeyError, match="output of the mlsysim model only"):
        sweep.best_along(megatron_points, "tp_size", objective="scaling_efficiency")
    with pytest.raises(KeyError, match="output of the megatron model only"):
        sweep.top_k(both_cube.sel(physics="mlsysim"), objective="tokens_per_second_per_accelerator")
    # each model's own output ranks its points; a shared one ranks either
    # (4 admissible points, 2 layouts: megatron's outputs are constant along mlsysim's
    # microbatch_count axis, and top_k collapses such ties)
    assert int(megatron_points["admissible"].sum()) == 4
    ranked = sweep.top_k(megatron_points, objective="tokens_per_second_per_accelerator", k=3)
    assert ranked.sizes["rank"] == 2
    assert np.isfinite(ranked["tokens_per_second_per_accelerator"].values).all()
    assert sweep.top_k(both_cube.sel(physics="mlsysim"), objective="scaling_efficiency",
                       k=2).sizes["rank"] >= 1
    path = sweep.save(both_cube, tmp_path / "both.nc")
    assert cli.main(["top", str(path), "--select", "physics=megatron",
                     "--objective", "scaling_efficiency"]) == 2


def test_search_refuses_an_objective_its_models_do_not_output():
    with pytest.raises(ValueError, match=r"'node_energy' is no output of the megatron model, "
                                         r"which prices spec 'sweep' beside mlsysim: search one "
                                         r"model"):
        sweep.search(BOTH, objective="node_energy")
    with pytest.raises(ValueError, match="it is the megatron model's"):
        sweep.search({**BOTH, "physics": "mlsysim",
                      "axes": {"tp_size": [2, 4, 8], "pp_size": [1, 4]}},
                     objective="tokens_per_second_per_accelerator")
    assert cli.main(["search", "megatron_moe", "--objective", "node_energy", "--no-progress"]) == 2


def test_a_reduction_across_models_or_jobs_warns(both_cube):
    """best_along (and the plots, which reduce the same way) took each cell's best over both
    models' predictions, and over sequence lengths, without a word; top_k warned."""
    with pytest.warns(sweep.analysis.ModelMixWarning):
        sweep.best_along(both_cube, "tp_size", objective="mfu")
    cube = sweep.run({"workload": WORKLOAD, "fleet": FLEET, "physics": "megatron",
                      "axes": {"tp_size": [4, 8], "seq_len": [2048, 4096]},
                      "fixed": {"batch_size": 512}})
    with pytest.warns(sweep.analysis.JobMixWarning, match=r"spans seq_len.*cube.sel\(seq_len=2048\)"):
        sweep.best_along(cube, "tp_size", objective="mfu")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sweep.best_along(cube, ["tp_size", "seq_len"], objective="mfu")  # one job a cell
        sweep.best_along(cube.sel(seq_len=4096), "tp_size", objective="mfu")
        sweep.best_along(both_cube.sel(physics="megatron"), "tp_size", objective="mfu")


def test_a_cube_of_both_models_names_both_references(both_cube):
    assert both_cube.attrs["reference"] == (
        "physics=mlsysim: mlsysim 0.3.0 DistributedModel.solve; physics=megatron: "
        "solver.physics.megatron (Megatron-Core training step, fitted constants)")


def test_plots_refuse_the_other_models_output_and_warn_across_models(both_cube):
    import sweep.plot

    with pytest.raises(ValueError, match="output of the mlsysim model only"):
        sweep.plot.reduce_to(both_cube, "scaling_efficiency", ("tp_size",),
                             select={"physics": "megatron"})
    with pytest.warns(sweep.analysis.ModelMixWarning):
        sweep.plot.reduce_to(both_cube, "mfu", ("tp_size",))


def test_cli_search_of_a_physics_axis_prints_each_models_knobs_blank_for_the_other(capsys):
    """The top table of a search over both models: an mlsysim row has no micro_batch_size,
    a megatron row no microbatch_count (best_params keep their own model's knobs only); the
    table leaves such a cell blank (a review found the command raising KeyError on the
    shipped compare_physics spec)."""
    code, out, err = _call(capsys, ["search", "compare_physics", "--exact", "-k", "60",
                                    "--no-progress"])
    assert code == 0, err
    table = out[out.index("top "):].splitlines()
    header = next(line for line in table if line.lstrip().startswith("#"))
    rows = [line for line in table if re.match(r"\s*\d+\s", line)]
    assert len(rows) == 60  # (both models' layouts among them: megatron's best is 31st)

    def cell(line, name):  # the right-aligned column under ``name``
        end = header.index(name) + len(name)
        return line[end - len(name) - 2:end].strip()
    mls = [r for r in rows if cell(r, "physics") == "mlsysim"]
    mg = [r for r in rows if cell(r, "physics") == "megatron"]
    assert mls and mg and len(mls) + len(mg) == 60
    assert all(cell(r, "micro_batch_size") == "" and cell(r, "microbatch_count") == "8" for r in mls)
    assert all(cell(r, "micro_batch_size") == "1" and cell(r, "microbatch_count") == "" for r in mg)


def test_an_axis_that_is_one_models_knob_and_the_others_output_warns():
    # microbatch_count: mlsysim's knob, megatron's derived count. The cube keeps the axis,
    # so megatron's layouts showed the axis's 1 | 4 | 8 where they ran 16 (an audit's find).
    import warnings
    spec = {"workload": "Llama3_70B_MC", "fleet": "HGX_H100_1K_MC",
            "physics": ["mlsysim", "megatron"],
            "axes": {"tp_size": [4, 8], "microbatch_count": [1, 4, 8]},
            "fixed": {"batch_size": 1024, "seq_len": 4096}}
    with pytest.warns(sweep.ShadowedOutputWarning,
                      match="axis 'microbatch_count' is a knob of mlsysim and an output of megatron"):
        sweep.load_spec(spec)
    # one model, or the knob fixed (no axis), or an axis both take: nothing to warn of
    with warnings.catch_warnings():
        warnings.simplefilter("error", sweep.ShadowedOutputWarning)
        sweep.load_spec({**spec, "physics": "mlsysim"})
        sweep.load_spec({**spec, "axes": {"tp_size": [4, 8]},
                         "fixed": {**spec["fixed"], "microbatch_count": 8}})
        sweep.load_spec({**spec, "axes": {"tp_size": [4, 8], "dp_size": [8, 16]}})
