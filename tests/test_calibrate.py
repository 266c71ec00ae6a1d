"""sweep.calibrate: constants recovered from synthetic runs, identifiability, profiles."""

from __future__ import annotations

import json
import math
import re
import tomllib
import warnings

import numpy as np
import pytest

import sweep
from solver.physics import megatron as M
from sweep.calibration import (CalibrationWarning, Profile, load_profile,
                               predict, read_measurements)
from sweep.calibration.core import LOO_WORSE_MARGIN

TRUE = dict(M.CONSTANTS, gemm_scale=0.65, scale_up_efficiency=0.8, scale_out_efficiency=0.5,
            overlap_efficiency=0.7, step_overhead=0.05)
FREE = ("gemm_scale", "scale_up_efficiency", "scale_out_efficiency", "overlap_efficiency",
        "step_overhead")


def _rows(dps=(1, 4, 16), tps=(1, 2, 4, 8), pps=(1, 2, 4)):
    return [dict(run_id=f"tp{tp}-pp{pp}-dp{dp}", workload="Llama3_8B_MC", fleet="EOS_H100_MC",
                 batch_size=128, seq_len=4096, tp_size=tp, pp_size=pp, dp_size=dp,
                 sequence_parallel=tp > 1, recompute="selective", zero_stage=1 if dp > 1 else 0,
                 step_time_s=1e4)  # a placeholder: _synthetic prices each
            for tp in tps for pp in pps for dp in dps]


def _synthetic(rows, constants, noise, seed=0):
    """The rows with step times of the model at ``constants`` times lognormal noise."""
    rng = np.random.default_rng(seed)
    pred = predict(read_measurements(rows), constants)
    return [dict(r, step_time_s=float(p * np.exp(rng.normal(0.0, noise))))
            for r, p in zip(rows, pred)]


@pytest.fixture(scope="module")
def synthetic_fit():
    rows = _synthetic(_rows(), TRUE, noise=0.02)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibrationWarning)  # every constant identified
        return sweep.calibrate(rows, loo=False)


def test_constants_recovered_within_their_uncertainty(synthetic_fit):
    cal = synthetic_fit
    assert cal.profile.free == FREE
    for name in FREE:
        fitted, std = cal.constants[name], cal.profile.uncertainty[name]
        assert 0 < std < 0.5 * TRUE[name], name
        assert abs(fitted - TRUE[name]) <= 3 * std, (name, fitted, std, TRUE[name])
    # the constants not fitted stay at the shipped values
    for name in set(M.CONSTANTS) - set(FREE):
        assert cal.constants[name] == M.CONSTANTS[name]
    # 2 % lognormal noise: the in-sample error is about sqrt(2/pi) * 2 % = 1.6 %
    assert 0.8 < cal.in_sample_error < 2.5
    table = cal.residuals()
    assert list(table["run_id"])[:2] == ["tp1-pp1-dp1", "tp1-pp1-dp4"]
    assert np.allclose(table["error_pct"], (cal.predicted / cal.measurements.step_times - 1) * 100)


def test_noise_free_runs_give_the_true_constants_exactly():
    rows = _synthetic(_rows(dps=(1, 16), pps=(1, 4)), TRUE, noise=0.0)
    cal = sweep.calibrate(rows, loo=False, prior_width=math.inf)  # plain least squares
    for name in FREE:
        assert cal.constants[name] == pytest.approx(TRUE[name], rel=2e-3), name
    assert cal.in_sample_error < 1e-3


def test_runs_inside_one_node_cannot_identify_the_scale_out_efficiency():
    rows = _synthetic(_rows(dps=(1,), tps=(1, 2, 4, 8), pps=(1,)) + _rows(dps=(2,), tps=(1, 2, 4),
                                                                          pps=(1,)), TRUE, 0.01)
    with pytest.warns(CalibrationWarning, match=r"scale_out_efficiency: not identified by these "
                      r"runs \(no run crosses nodes"):
        cal = sweep.calibrate(rows, loo=False)
    assert cal.constants["scale_out_efficiency"] == M.CONSTANTS["scale_out_efficiency"]
    assert math.isnan(cal.profile.uncertainty["scale_out_efficiency"])
    assert any(w.startswith("scale_out_efficiency") for w in cal.profile.warnings)


def test_leave_one_out_predicts_each_run_from_the_fit_of_the_others():
    rows = _synthetic(_rows(dps=(1, 16), tps=(1, 8), pps=(1, 4)), TRUE, noise=0.03, seed=1)
    free = ("gemm_scale", "step_overhead")
    cal = sweep.calibrate(rows, free=free, loo=True)
    assert np.all(np.isfinite(cal.loo_predicted))
    # the first run's LOO prediction is the fit of the other runs, priced on it
    rest = sweep.calibrate(rows[1:], free=free, loo=False)  # same start, so the same prior
    first = predict(read_measurements(rows[:1]), rest.constants)[0]
    assert cal.loo_predicted[0] == pytest.approx(first, rel=1e-4)
    assert cal.loo_error >= cal.in_sample_error
    assert cal.profile.loo_mape == pytest.approx(cal.loo_error)
    # the truth is far from the start: the fit predicts left-out runs far better, no warning
    assert cal.loo_error < 0.5 * cal.uncalibrated_error
    assert not any(w.startswith("leave-one-out") for w in cal.warnings)


def test_a_fit_that_predicts_left_out_runs_worse_than_its_start_says_so():
    # 8 runs priced at the start constants themselves, 3 % noise, 5 constants fitted
    # without a prior: the fit chases the noise, so each left-out run is predicted worse
    # than by the start constants (which are the truth here)
    rows = _synthetic(_rows(dps=(1, 16), tps=(1, 8), pps=(1, 4)), M.CONSTANTS, noise=0.03, seed=0)
    with pytest.warns(CalibrationWarning, match=r"leave-one-out: fitted without it, a run is "
                      r"predicted 2\.\d\d % off on average, against 1\.\d\d % with the start "
                      r"constants"):
        cal = sweep.calibrate(rows, loo=True, prior_width=math.inf)
    assert cal.loo_error > cal.uncalibrated_error + 0.5
    assert cal.uncalibrated_error == pytest.approx(
        np.mean(np.abs(predict(read_measurements(rows), M.CONSTANTS) / cal.measurements.step_times
                       - 1)) * 100)
    assert any(w.startswith("leave-one-out") for w in cal.profile.warnings)
    # without leave-one-out nothing is known about it, and nothing is said
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CalibrationWarning)
        sweep.calibrate(rows, loo=False, prior_width=math.inf)
    assert not any("leave-one-out" in str(w.message) for w in caught)


def test_free_auto_adds_the_constant_the_runs_need_and_stops_when_none_helps():
    # the truth differs from the start in the GEMM scale alone (x0.8), 1 % noise
    truth = dict(M.CONSTANTS, gemm_scale=M.CONSTANTS["gemm_scale"] * 0.8)
    rows = _synthetic(_rows(dps=(1, 16), tps=(1, 8), pps=(1, 4)), truth, noise=0.01, seed=2)
    cal = sweep.calibrate(rows, free="auto")
    steps = cal.selection
    assert steps[0] == ((), pytest.approx(cal.uncalibrated_error))
    assert steps[1][0] == ("gemm_scale",)  # the first constant chosen is the one that differs
    assert cal.uncalibrated_error > 5.0 and steps[1][1] < 1.5
    # each step beat the last by more than the margin, and the last is what was fitted
    for (_, before), (_, after) in zip(steps, steps[1:]):
        assert after < before - LOO_WORSE_MARGIN
    assert cal.profile.free == steps[-1][0]
    assert cal.loo_error == pytest.approx(steps[-1][1])
    assert cal.constants["gemm_scale"] == pytest.approx(truth["gemm_scale"], rel=0.03)
    # a step's error is that of calibrate with those constants free
    assert sweep.calibrate(rows, free=("gemm_scale",)).loo_error == pytest.approx(steps[1][1])


def test_free_auto_keeps_the_start_when_the_runs_are_its_own():
    rows = _synthetic(_rows(dps=(1, 16), tps=(1, 8), pps=(1,)), M.CONSTANTS, noise=0.0)
    cal = sweep.calibrate(rows, free="auto")
    assert cal.selection == (((), 0.0),)
    assert cal.profile.free == () and cal.constants == cal.start == M.CONSTANTS
    np.testing.assert_array_equal(cal.loo_predicted, cal.uncalibrated)
    assert len(cal.constants_table()) == 0


def test_free_constants_are_checked():
    with pytest.raises(ValueError, match=r"free must name constants .* but got 'gemm_scal' "
                       r"\(did you mean 'gemm_scale'\?\)"):
        sweep.calibrate(_rows()[:3], free=["gemm_scal"], loo=False)
    with pytest.raises(ValueError, match="physics must be 'megatron'"):
        sweep.calibrate(_rows()[:3], physics="mlsysim")


def test_fp8_runs_free_the_fp8_gemm_scale():
    rows = [dict(r, precision="fp8") for r in _rows(dps=(1, 16), pps=(1, 4))]
    cal = sweep.calibrate(_synthetic(rows, TRUE, 0.0), loo=False)
    # (in FP8, some of these Llama 3 8B layouts are launch-bound at the shipped floor: the
    # floor joins the free constants)
    assert cal.profile.free == FREE[:1] + ("fp8_gemm_scale",) + FREE[1:] + ("layer_overhead",)


def _small_rows():
    """vTrain-like layouts: a 350M GPT on one 8x A100 40GB node, microbatches of 1-8,
    many launch-bound (full recompute, fp16, unfused attention, as vTrain's stack ran)."""
    return [dict(run_id=f"tp{tp}-dp{dp}-mbs{mbs}", layers=24, hidden_dim=1024, heads=16,
                 node="DGX_A100_40GB_MC", fabric="InfiniBand_HDR", batch_size=32, seq_len=1024,
                 tp_size=tp, dp_size=dp, micro_batch_size=mbs, recompute="full", zero_stage=0,
                 precision="fp16", flash_attention=False, overlap_grad_reduce=False,
                 overlap_param_gather=False, step_time_s=1.0)
            for tp in (1, 2, 4, 8) for dp in (1, 2) if tp * dp <= 8 for mbs in (1, 8)]


def test_a_launch_floor_above_the_start_is_found_and_joins_the_free_constants():
    # Runs launch-bound at 0.9 ms, from a start of 0.1 ms (a fit on large models, where no
    # run is launch-bound): at the start the floor has no slope, so only the fit from
    # FLOOR_START (1 ms, above it) can find it.
    start = dict(M.CONSTANTS, layer_overhead=1e-4)
    truth = dict(M.CONSTANTS, layer_overhead=9e-4)
    rows = _synthetic(_small_rows(), truth, noise=0.01, seed=2)
    data = read_measurements(rows)
    slope_free = predict(data, dict(start, layer_overhead=1.01e-4)) - predict(data, start)
    assert np.all(slope_free == 0.0)  # no run is launch-bound at the start
    assert np.any(predict(data, truth) > 1.2 * predict(data, start))  # many are at the truth
    with pytest.warns(CalibrationWarning) as caught:  # one node: no scale-out traffic
        cal = sweep.calibrate(rows, start=start, loo=False)
    assert not any("layer_overhead" in str(w.message) for w in caught)
    assert cal.profile.free == FREE + ("layer_overhead",)
    assert cal.constants["layer_overhead"] == pytest.approx(9e-4, rel=0.05)
    assert cal.in_sample_error < 2.0
    # held at the start (the default free constants before the floor joined them), the
    # other constants cannot make up for it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)  # (unidentified, prior-bound ones)
        without = sweep.calibrate(rows, start=start, free=FREE, loo=False)
    assert without.constants["layer_overhead"] == 1e-4
    assert without.in_sample_error > 5 * cal.in_sample_error


def test_a_floor_the_runs_bound_only_from_above_is_not_a_default_free_constant():
    # Llama 3 8B on H100 (the synthetic fit's runs): a floor well above the shipped one would
    # slow some, so the identifiability check sees it, but at the fit no run is launch-bound
    # and the runs say nothing of it: the default fit is the fit without it.
    rows = _synthetic(_rows(dps=(1, 16), pps=(1, 4)), TRUE, noise=0.02)
    data = read_measurements(rows)
    floor = M.CONSTANTS["layer_overhead"]
    assert np.all(predict(data, dict(TRUE, layer_overhead=1.01 * floor)) == predict(data, TRUE))
    assert np.any(predict(data, dict(TRUE, layer_overhead=np.e * floor)) > predict(data, TRUE))
    for width in (None, math.inf):  # with the prior, and plain least squares
        with warnings.catch_warnings():  # (plain: scale_up_efficiency ends at its bound)
            warnings.simplefilter("ignore", CalibrationWarning)
            cal = sweep.calibrate(rows, loo=False, prior_width=width)
            without = sweep.calibrate(rows, free=FREE, loo=False, prior_width=width)
        assert cal.profile.free == FREE
        assert cal.constants == without.constants
        assert not any("layer_overhead" in w for w in cal.warnings)


def test_fit_log_takes_the_least_cost_of_its_starts():
    from sweep.calibration.fit import fit_log

    # a floor at c over a fixed time of 1: flat below 1, so a start below cannot rise to 3
    def residuals(c):
        return np.array([np.log(max(1.0, c["floor"])) - np.log(3.0)])

    bounds = {"floor": (1e-3, 100.0, "a floor")}
    stuck = fit_log(residuals, {"floor": 0.5}, ("floor",), bounds)
    assert stuck.constants["floor"] == pytest.approx(0.5)
    found = fit_log(residuals, {"floor": 0.5}, ("floor",), bounds, other_starts=({"floor": 10.0},))
    assert found.constants["floor"] == pytest.approx(3.0, rel=1e-6)
    # the first start wins a tie
    assert fit_log(residuals, {"floor": 0.5}, ("floor",), bounds,
                   other_starts=({"floor": 0.25},)).constants["floor"] == pytest.approx(0.5)


# ---------------------------------------------------------------- profiles

def test_profile_round_trips_through_toml(synthetic_fit, tmp_path):
    path = synthetic_fit.save(tmp_path / "my_cluster.toml")
    back = load_profile(path)
    original = synthetic_fit.profile
    assert back.constants == original.constants
    assert back.uncertainty == original.uncertainty
    for key in ("physics", "free", "data_sha256", "date", "runs", "data_source", "warnings"):
        assert getattr(back, key) == getattr(original, key), key
    assert back.in_sample_mape == original.in_sample_mape
    assert math.isnan(back.loo_mape)  # loo=False
    assert len(back.data_sha256) == 64
    # the megatron model's own loader reads a profile's [constants]
    assert M.load_constants(path)[0] == original.constants
    data = tomllib.loads(path.read_text())
    assert data["calibration"]["physics"] == "megatron"


def _saved_without(fit, path, constant):
    """``fit``'s profile saved at ``path`` without ``constant``'s line: as a profile written
    before the constant existed reads."""
    fit.save(path)
    text = "\n".join(line for line in path.read_text().splitlines()
                     if not line.startswith(f"{constant} ="))
    path.write_text(text + "\n")
    return path


def test_a_profile_that_predates_a_constant_prices_as_it_was_fitted(synthetic_fit, tmp_path):
    # A profile written before hopper_gemm_scale existed fitted gemm_scale with no Hopper
    # factor: it must not take the shipped fit's 0.87 on top (H100 GEMMs 13 % slower).
    path = _saved_without(synthetic_fit, tmp_path / "old.toml", "hopper_gemm_scale")
    old = load_profile(path)
    assert old.constants["hopper_gemm_scale"] == M.PREDATED_CONSTANTS["hopper_gemm_scale"] == 1.0
    assert old.constants["gemm_scale"] == synthetic_fit.profile.constants["gemm_scale"]
    assert any("predates it" in w for w in old.warnings)
    # a hand-written profile of a few constants keeps the shipped values for the others,
    # and says so (a profile cut short had priced quietly at the shipped constants)
    path.write_text('[calibration]\nphysics = "megatron"\n[constants]\ngemm_scale = 0.5\n')
    shipped = re.escape(f"step_overhead = {M.CONSTANTS['step_overhead']:.4g}")
    with pytest.warns(CalibrationWarning, match=r"not in this profile; priced at the shipped "
                                                r"values \(.*" + shipped):
        few = load_profile(path)
    assert few.constants == {"gemm_scale": 0.5} and len(few.warnings) == 1
    # an empty table of constants is no calibration at all
    path.write_text('[calibration]\nphysics = "megatron"\n[constants]\n')
    with pytest.raises(ValueError, match="constants: expected the fitted constants of the "
                                         "megatron physics .* but got an empty table"):
        load_profile(path)


def test_a_profile_fitted_before_the_measured_plateaus_keeps_the_plateau_it_was_fitted_on(
        synthetic_fit, tmp_path):
    # Until 2026-12-04 every GPU's GEMM plateau was 0.95 (Calculon's); the catalog now states
    # each GPU's measured one (0.80 on an H100). A profile of then fitted gemm_scale on 0.95:
    # read back, it takes gemm_plateau = 0.95 and prices as it was fitted, not 16 % slower.
    old = load_profile(_saved_without(synthetic_fit, tmp_path / "old.toml", "gemm_plateau"))
    assert old.constants["gemm_plateau"] == M.PREDATED_CONSTANTS["gemm_plateau"] == 0.95
    assert any("constants.gemm_plateau" in w and "predates it" in w for w in old.warnings)
    assert synthetic_fit.profile.constants["gemm_plateau"] == 0.0  # a profile of now: the catalog's
    with pytest.raises(ValueError, match="'gemm_plateau' is a setting"):
        sweep.calibrate(synthetic_fit.measurements, free=["gemm_scale", "gemm_plateau"])


def test_a_bad_profile_is_refused(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[calibration]\nphysics = "megatron"\n[constants]\ngemm_scale = 7.0\n')
    with pytest.raises(sweep.calibration.ProfileError,
                       match=r"bad.toml: constants.gemm_scale: expected a number in \[0.001, "
                             r"1.24486\], but got 7.0"):
        load_profile(path)
    path.write_text('[constants]\ngemm_scale = 0.5\n')
    with pytest.raises(sweep.calibration.ProfileError, match=r"expected a \[calibration\] table"):
        load_profile(path)


def test_profile_constants_go_straight_to_solve(synthetic_fit):
    import solver

    wl, fl = solver.catalog.workload("Llama3_8B_MC"), solver.catalog.fleet("EOS_H100_MC")
    knobs = dict(batch_size=128, seq_len=4096, tp_size=2, dp_size=16, sequence_parallel=True)
    via_profile = solver.solve(wl, fl, **knobs, **synthetic_fit.profile.solve_keywords())
    direct = M.solve(wl, fl, **knobs, **synthetic_fit.constants)
    assert via_profile["step_latency_total"] == direct["step_latency_total"]
    assert via_profile["step_latency_total"] != M.solve(wl, fl, **knobs)["step_latency_total"]


def test_profile_is_a_plain_dataclass():
    p = Profile(physics="megatron", constants=dict(M.CONSTANTS))
    assert p.solve_keywords() == {"physics": "megatron", **M.CONSTANTS}


# ------------------------------------------------------- sweeps and searches

def _spec(**extra):
    return {"name": "cal", "workload": "Llama3_8B_MC", "fleet": "EOS_H100_MC",
            "outputs": ["step_latency_total", "memory_footprint", "mfu"],
            "axes": {"tp_size": [1, 2, 4, 8], "dp_size": [1, 2, 8, 16]},
            "fixed": {"batch_size": 256, "seq_len": 4096}, **extra}


def _profiles(tmp_path):
    """The shipped constants, and the same with a 160x slower scale-out fabric."""
    base = Profile(physics="megatron", constants=dict(M.CONSTANTS))
    slow = Profile(physics="megatron", constants=dict(M.CONSTANTS, scale_out_efficiency=0.005))
    return base.save(tmp_path / "base.toml"), slow.save(tmp_path / "slow.toml")


def test_a_calibrated_sweep_slows_only_the_layouts_that_cross_nodes(tmp_path):
    base_path, slow_path = _profiles(tmp_path)
    (tmp_path / "spec.toml").write_text(
        'name = "cal"\nworkload = "Llama3_8B_MC"\nfleet = "EOS_H100_MC"\n'
        'outputs = ["step_latency_total", "memory_footprint", "mfu"]\ncalibration = "slow.toml"\n'
        '[axes]\ntp_size = [1, 2, 4, 8]\ndp_size = [1, 2, 8, 16]\n'
        '[fixed]\nbatch_size = 256\nseq_len = 4096\n')
    slow = sweep.run(tmp_path / "spec.toml")  # the spec's own calibration, relative to it
    base = sweep.run(_spec(), calibration=base_path)
    n_acc = slow["tp_size"] * slow["dp_size"]
    inside, across = (n_acc <= 8).values, (n_acc > 8).values
    s, b = slow["step_latency_total"].values, base["step_latency_total"].values
    assert np.array_equal(s[inside], b[inside])
    assert np.all(s[across] > b[across])
    # the megatron physics priced it: the shipped constants give megatron's step times
    import solver
    wl, fl = solver.catalog.workload("Llama3_8B_MC"), solver.catalog.fleet("EOS_H100_MC")
    one = M.solve(wl, fl, batch_size=256, seq_len=4096, tp_size=2, dp_size=8)
    assert b[1, 2] == one["step_latency_total"]
    recorded = json.loads(slow.attrs["calibration"])
    assert recorded["constants"]["scale_out_efficiency"] == 0.005
    assert recorded["physics"] == "megatron"
    assert "calibration" not in sweep.run(_spec(), calibration=None).attrs


def test_a_calibration_that_sets_the_physics_names_itself_when_the_spec_cannot_take_it(tmp_path):
    # A spec without a physics key is priced by its calibration's physics; one written with
    # mlsysim's knobs then fails on them. The error had said the physics was "asked for
    # (--physics, or physics=)", which the user had not done, and advised physics =
    # 'mlsysim', which the calibration refuses next: it names the calibration now.
    from sweep.calibration import ProfileError
    base_path, _ = _profiles(tmp_path)
    spec = _spec(fixed={"batch_size": 256, "seq_len": 4096, "microbatch_count": 8})
    with pytest.raises(ProfileError) as err:
        sweep.run(spec, calibration=base_path)
    message = str(err.value)
    assert message.startswith(f"{base_path}: a calibration of the 'megatron' physics, which the "
                              "spec 'cal' takes from it")
    assert "microbatch_count" in message and "a knob of mlsysim" in message
    assert "--physics" not in message and "set physics = 'mlsysim'" not in message


def test_show_names_the_calibration_a_cube_was_priced_with(tmp_path, capsys):
    from sweep.cli import main

    _, slow_path = _profiles(tmp_path)
    sweep.run(_spec(), calibration=slow_path, path=tmp_path / "slow.nc", progress=False)
    sweep.run(_spec(physics="megatron"), path=tmp_path / "plain.nc", progress=False)
    capsys.readouterr()
    assert main(["show", str(tmp_path / "slow.nc")]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("  calibration: "))
    assert str(slow_path) in line and '"scale_out_efficiency": 0.005' in line
    assert "physics megatron (the shipped constants; the calibration above replaced them)" in out
    assert main(["show", str(tmp_path / "plain.nc")]) == 0
    out = capsys.readouterr().out
    assert "  calibration: " not in out and "  physics megatron: " in out
    assert "\n\n" not in out.split("provenance:\n")[1].split("  spec:")[0]  # no blank line


def test_a_calibrated_search_finds_another_best_layout(tmp_path):
    base_path, slow_path = _profiles(tmp_path)
    spec = _spec(axes={"tp_size": [1, 2, 4, 8], "dp_size": [4, 8, 16, 32, 64]},
                 constraints={"max_accelerators": 64})
    kw = dict(objective="step_latency_total", direction="minimize", mode="exact", k=3)
    fast = sweep.search(spec, calibration=base_path, **kw).best_params
    slow = sweep.search(spec, calibration=slow_path, **kw).best_params
    assert (fast["tp_size"], fast["dp_size"]) != (slow["tp_size"], slow["dp_size"])
    # the shipped fabric: the most data parallelism; a very slow one: stay inside one node
    assert (fast["tp_size"], fast["dp_size"]) == (1, 64)
    assert slow["tp_size"] * slow["dp_size"] <= 8


def test_a_spec_with_a_missing_profile_is_refused(tmp_path):
    with pytest.raises(sweep.SpecError, match=r"calibration: .*nope.toml: expected a "
                       r"calibration profile"):
        sweep.load_spec(_spec(calibration=str(tmp_path / "nope.toml")))


def test_the_prior_gives_few_runs_an_uncertainty_and_keeps_unseen_constants_near_the_start():
    # 2 runs inside one node for 2 constants: the plain fit states no uncertainty;
    # the prior does, and flags the constants the runs barely see
    rows = _synthetic(_rows(dps=(1,), tps=(4, 8), pps=(1,)), TRUE, 0.01)
    free = ("gemm_scale", "scale_up_efficiency")
    with pytest.warns(CalibrationWarning, match="no uncertainty without more runs"):
        plain = sweep.calibrate(rows, free=free, loo=False, prior_width=math.inf)
    assert math.isnan(plain.profile.uncertainty["gemm_scale"])
    # the scale-up efficiency starts near its bound of 1 (whatever the shipped fit says),
    # so that one standard deviation above it crosses the bound
    start = dict(M.CONSTANTS, scale_up_efficiency=0.95)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CalibrationWarning)
        cal = sweep.calibrate(rows, free=free, loo=False, start=start)
    assert all(np.isfinite(cal.profile.uncertainty[n]) and cal.profile.uncertainty[n] > 0
               for n in free)
    # gemm_scale is seen by every run: it moves from the shipped start (0.79) to the truth (0.65)
    assert cal.constants["gemm_scale"] == pytest.approx(TRUE["gemm_scale"], rel=0.05)
    # the posterior is never wider than the prior, in log
    for n in free:
        sd_log = cal.profile.uncertainty[n] / cal.constants[n]
        assert sd_log <= cal.profile.prior_width[n] * 1.0001, n
    assert any("barely constrained" in str(w.message) for w in caught) or \
        all(cal.profile.uncertainty[n] / cal.constants[n] < 0.8 * cal.profile.prior_width[n]
            for n in free)
    assert cal.in_sample_error < 3.0
    # one standard deviation as a range in log space, inside the bounds even where
    # fitted + std is not (the barely seen scale-up efficiency, bounded by 1)
    table = cal.constants_table().set_index("constant")
    for n in free:
        c, s = cal.constants[n], cal.profile.uncertainty[n] / cal.constants[n]
        low, high = M.CONSTANT_BOUNDS[n][:2]
        assert table.loc[n, "range_low"] == pytest.approx(max(low, c * math.exp(-s)), rel=1e-12)
        assert table.loc[n, "range_high"] == pytest.approx(min(high, c * math.exp(s)), rel=1e-12)
        assert low <= table.loc[n, "range_low"] < c < table.loc[n, "range_high"] <= high
    n = "scale_up_efficiency"
    assert cal.constants[n] + cal.profile.uncertainty[n] > M.CONSTANT_BOUNDS[n][1]
    assert table.loc[n, "range_high"] == M.CONSTANT_BOUNDS[n][1]


def test_prior_width_is_checked():
    rows = _rows()[:3]
    with pytest.raises(ValueError, match="prior_width must be a positive number"):
        sweep.calibrate(rows, loo=False, prior_width=0)
    with pytest.raises(ValueError, match="prior_width names constants"):
        sweep.calibrate(rows, loo=False, prior_width={"gemm_scal": 0.1})
    with pytest.raises(ValueError, match="noise must be a positive number"):
        sweep.calibrate(rows, loo=False, noise=-1.0)


# ------------------------------------------------ a user's own runs (audit, 2026-12-05)

def test_a_large_per_step_overhead_is_fitted_not_called_unidentified():
    """A per-step overhead of 1 s, 270x the shipped 3.7 ms: near the start it has no slope,
    and the check had called it "not identified ... do not depend on it", kept it, and
    pushed the slowdown into gemm_scale. Seen over three prior widths it is fitted, from a
    second start out there."""
    truth = dict(M.CONSTANTS, step_overhead=1.0)
    rows = _synthetic(_rows(), truth, noise=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        cal = sweep.calibrate(rows, free=["step_overhead"], loo=False)
    assert cal.profile.free == ("step_overhead",)
    assert cal.constants["step_overhead"] == pytest.approx(1.0, rel=0.05)
    assert cal.in_sample_error < 0.5
    assert not any("not identified" in w for w in cal.warnings)


def test_a_wrong_run_is_named_and_a_fit_worse_than_its_start_is_said():
    rows = _synthetic(_rows(), M.CONSTANTS, noise=0.0)
    rows[5] = dict(rows[5], step_time_s=rows[5]["step_time_s"] * 20)  # a typo, 20x
    with pytest.warns(CalibrationWarning) as caught:
        cal = sweep.calibrate(rows, loo=False)
    text = " ".join(str(w.message) for w in caught)
    assert f"run {rows[5]['run_id']!r} (line 7) is" in text and "check its step time" in text
    assert cal.profile.warnings == cal.warnings


def test_milliseconds_are_refused_before_the_fit(tmp_path):
    rows = _synthetic(_rows(dps=(1, 4), tps=(1, 2), pps=(1,)), M.CONSTANTS, noise=0.0)
    in_ms = [dict(r, step_time_s=r["step_time_s"] * 1000) for r in rows]
    with pytest.raises(ValueError, match=r"line 2, column step_time_s: expected a step time in "
                                         r"seconds, but got .* 1000x what the model predicts"
                                         r".*milliseconds\?"):
        sweep.calibrate(in_ms, loo=False)


def test_leave_one_out_is_skipped_past_its_cost_unless_asked(monkeypatch):
    from sweep.calibration import core

    monkeypatch.setattr(core, "LOO_MAX_RUNS", 4)
    rows = _synthetic(_rows(dps=(1, 4), tps=(1, 2, 4), pps=(1,)), TRUE, noise=0.01)
    with pytest.warns(CalibrationWarning, match="leave-one-out skipped: 6 runs would take 6 fits"):
        cal = sweep.calibrate(rows, free=["gemm_scale"])
    assert math.isnan(cal.loo_error)
    forced = sweep.calibrate(rows, free=["gemm_scale"], loo=True)
    assert math.isfinite(forced.loo_error)


def test_a_profile_with_a_number_that_is_not_one_is_refused(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('[calibration]\nphysics = "megatron"\nruns = "eight"\n'
                    '[constants]\ngemm_scale = 0.5\n')
    with pytest.raises(ValueError, match=r"calibration\.runs: expected a whole number, but got "
                                         r"'eight'"):
        load_profile(path)


def test_a_file_not_in_utf8_is_one_line(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_bytes("run_id,workload\nr\xe9,Llama3_8B_MC\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"runs\.csv line 2: expected UTF-8 text"):
        read_measurements(path)


def test_a_profile_used_on_other_hardware_is_warned(synthetic_fit, tmp_path):
    """A profile fitted on H100 runs priced a B200 spec without a word (an audit); it now
    records its runs' accelerators and warns where a spec prices others."""
    path = synthetic_fit.save(tmp_path / "h100.toml")
    profile = load_profile(path)
    assert profile.accelerators == (synthetic_fit.measurements.runs[0].fleet.node.accelerator.name,)
    spec = {"workload": "Llama3_8B_MC", "physics": "megatron", "calibration": str(path),
            "axes": {"tp_size": [1, 2]}, "fixed": {"batch_size": 64, "dp_size": 8}}
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibrationWarning)
        sweep.load_spec({**spec, "fleet": "EOS_H100_MC"}).calibration  # noqa: B018 - the same GPU
        sweep.run({**spec, "fleet": "EOS_H100_MC"})
    with pytest.warns(CalibrationWarning, match=r"fitted on runs of .*H100.*, but spec .* prices "
                                                r"fleet 'DGX_B200_1K_MC' of .*B200"):
        sweep.run({**spec, "fleet": "DGX_B200_1K_MC"})


def test_one_layout_measured_far_apart_is_named():
    rows = _synthetic(_rows(dps=(1, 4), tps=(1, 2, 4), pps=(1,)), M.CONSTANTS, noise=0.0)
    twin = dict(rows[2], run_id="again", step_time_s=rows[2]["step_time_s"] * 1.6)
    with pytest.warns(CalibrationWarning, match=rf"runs {rows[2]['run_id']!r}, 'again' \(lines 4, "
                                                r"8\) are one layout measured"):
        sweep.calibrate(rows + [twin], free=["gemm_scale"], loo=False)


def test_search_and_top_name_the_calibration_they_priced_with(synthetic_fit, tmp_path, capsys):
    """search's summary and top's table had never said a calibration priced them."""
    from sweep.cli import main

    path = synthetic_fit.save(tmp_path / "fit.toml")
    spec = {"workload": "Llama3_8B_MC", "fleet": "EOS_H100_MC", "calibration": str(path),
            "axes": {"tp_size": [1, 2, 4]}, "fixed": {"batch_size": 64, "dp_size": 8}}
    summary = sweep.search(spec).summary()
    assert f"priced with the calibration {path} ({len(synthetic_fit.measurements)} runs of" in summary
    plain = sweep.search({k: v for k, v in spec.items() if k != "calibration"} | {
        "physics": "megatron"}).summary()
    assert "calibration" not in plain
    cube = sweep.save(sweep.run(spec), tmp_path / "c.nc")
    assert main(["top", str(cube), "-k", "1"]) == 0
    assert f"priced with the calibration {path} (see show for its constants)" in capsys.readouterr().out


def test_a_posterior_is_never_wider_than_its_prior():
    # A fit worse than the stated noise widens the data's share of the uncertainty only: a
    # constant the runs do not see keeps its prior's width (the whole matrix had been
    # scaled by rms / noise, an audit's 4.31 in log against a prior of 0.5)
    from sweep.calibration import fit as fit_

    noise, widths = 0.03, np.array([0.3, 0.5])
    data_jac = np.array([[1.0, 0.0], [0.5, 0.0], [2.0, 0.0]])  # the second constant unseen
    jac = np.vstack([data_jac, np.diag(noise / widths)])
    residuals = np.concatenate([[0.3, -0.25, 0.2], [0.0, 0.0]])  # rms 10x the noise
    sd = np.sqrt(np.diag(fit_.posterior_covariance(jac, residuals, 2, noise)))
    assert sd[1] == pytest.approx(0.5, rel=1e-9)
    assert sd[0] < 0.3
    # at the stated noise it is the usual Laplace approximation
    small = residuals * 0.01
    want = noise ** 2 * np.linalg.inv(jac.T @ jac)
    np.testing.assert_allclose(fit_.posterior_covariance(jac, small, 2, noise), want, rtol=1e-9)


def test_slips_an_audit_found_are_named(tmp_path):
    """A file without seq_len is read at 2,048 tokens a sequence: the warning names the
    column and the default (an audit's runs of 2,048-8,192 tokens fitted scale_up_efficiency
    to 0.046 without a word). Per-GPU tokens/s given in thousands is refused naming tokens, not
    milliseconds. A source name past U+FFFF (an emoji) is written into a profile that reads
    back (JSON's surrogate-pair escapes, which TOML refuses, had made it unreadable)."""
    rows = _synthetic(_rows(dps=(1, 4), tps=(1, 2), pps=(1,)), M.CONSTANTS, noise=0.0)
    without = [{k: v for k, v in r.items() if k != "seq_len"} for r in rows]
    with pytest.warns(CalibrationWarning, match=r"no column seq_len: every run takes the default "
                                                r"\(seq_len \(2048\)\)"):
        read_measurements(without)
    tokens = [{**{k: v for k, v in r.items() if k != "step_time_s"},
               "tokens_per_s_per_gpu": 128 * 4096 / (r["step_time_s"] * r["tp_size"] * r["dp_size"])
               / 1000} for r in rows]
    with pytest.raises(ValueError, match=r"column tokens_per_s_per_gpu: expected tokens per second "
                                         r"per GPU, .*thousands of tokens\?"):
        sweep.calibrate(tokens, loo=False)
    path = tmp_path / "runs_\U0001F680.csv"
    path.write_text(",".join(rows[0]) + "\n" + "\n".join(
        ",".join(str(r[k]) for k in rows[0]) for r in rows) + "\n", encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        cal = sweep.calibrate(str(path), loo=False)
    out = cal.profile.save(tmp_path / "fit.toml")
    assert load_profile(out).data_source.endswith("runs_\U0001F680.csv")


@pytest.mark.parametrize("overhead", [0.5, 3.0])
def test_runs_that_cannot_tell_two_constants_apart_say_so(overhead):
    """Four runs of a 12-layer model, one microbatch a replica, measured with a 3 s per-step
    overhead: a per-layer launch floor of 84 ms explains them as well (an audit's case: the
    default fit chose the floor, 0.03 % off in sample, and priced larger models 14-19x too
    slow, with no warning). Which of the two a fit lands on depends on its starts (at the
    fit of 2026-12-06 09:30 every start found the floor at 0.5 s and the overhead at 3 s,
    neither warning), so each is also fitted with the other held: the warning names both
    constants, whichever the fit chose."""
    from solver.physics import megatron
    rows = [dict(run_id=f"t{i}", layers=12, hidden_dim=768, heads=12, vocab_size=50304,
                 node="DGX_H100_MC", batch_size=b, seq_len=1024, dp_size=d, tp_size=1, pp_size=1,
                 micro_batch_size=8, step_time_s=1.0)
            for i, (b, d) in enumerate([(8, 1), (16, 2), (32, 4), (64, 8)])]
    true = dict(megatron.CONSTANTS, step_overhead=overhead)
    rows = [dict(r, step_time_s=float(t)) for r, t in zip(rows, predict(read_measurements(rows), true))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        cal = sweep.calibrate(rows, loo=False)
    told = [w for w in cal.warnings if "do not tell" in w]
    assert told and "step_overhead" in told[0] and "layer_overhead" in told[0], cal.warnings


def test_a_run_slowed_by_what_the_others_do_not_share_is_named():
    """One run of the synthetic set measured 1.6x slower (2 % noise on the rest): the fit
    spreads its error, no run passes the 10 % outlier rule, and the constants drift (an
    audit's case). The residuals, far above the noise the fit assumes, are named, that run
    first."""
    rows = _synthetic(_rows(dps=(1, 4, 16), tps=(1, 2, 8), pps=(1, 2)), TRUE, noise=0.02, seed=3)
    rows[4] = dict(rows[4], step_time_s=rows[4]["step_time_s"] * 1.6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        cal = sweep.calibrate(rows, loo=False)
    scatter = [w for w in cal.warnings if "the scatter it assumes" in w]
    assert scatter, cal.warnings
    assert scatter[0].split("the farthest: ")[1].startswith(repr(rows[4]["run_id"]))
