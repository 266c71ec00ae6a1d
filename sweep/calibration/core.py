"""``calibrate``: fit the megatron physics' free constants to a user's measured steps.

The free constants (``free=None``) and what each stands for:

========================  ==================================================================
``gemm_scale``            scale on the GEMM efficiency curve (the large-GEMM plateau's share
                          of peak): how fast this cluster's kernels run
``fp8_gemm_scale``        the FP8/FP4 GEMMs' extra scale (free only when a run uses FP8/FP4)
``scale_up_efficiency``   share of the NVLink domain's NCCL bus bandwidth achieved
``scale_out_efficiency``  share of the NIC rate achieved across nodes
``overlap_efficiency``    share of compute time that hides overlapped communication
``step_overhead``         fixed time per step (data loading, logging, synchronization) [s]
``layer_overhead``        the host's time to launch a layer's kernels, a floor under each
                          layer's forward and backward [s] (free only when the runs see it:
                          launch-bound layouts, small models on few accelerators)
========================  ==================================================================

Any constant of :data:`solver.physics.megatron.CONSTANT_BOUNDS` may be named in
``free``; the rest stay at the start values (the shipped all-data fit,
:data:`solver.physics.megatron.CONSTANTS`). The fit minimizes ``sum (log
predicted - log measured)^2`` over the runs with :func:`sweep.calibration.fit.fit_log`
(bounded by each constant's physical range), pricing every run of one
(workload, fleet) in one vectorized ``solve`` call per residual evaluation.

The fit is a maximum a posteriori one: each free constant has a Gaussian prior
on its log, centered at its start value, with the standard deviation of
:data:`PRIOR_WIDTHS` (set before looking at any run, from how far each kind of
constant differs between clusters: a kernel's share of peak by about 30 %,
NCCL's share of a link by about 50 %, fixed overheads by orders of magnitude),
against runs whose log step time scatters by ``noise`` (default
:data:`DEFAULT_NOISE`, 0.03, the error of the best published models). A
handful of runs then moves a constant as far as they agree on, but cannot drag
one they barely see to a bound (``benchmarks/bench_calibrate.py`` compares it
with the plain fit). ``prior_width=math.inf`` is the plain least-squares fit.

A constant the data cannot identify (the runs' step times barely move when it
changes by its prior's width from the start, e.g. no run crosses nodes, so the
scale-out efficiency changes nothing)
is held at its start value with a :class:`CalibrationWarning`; so is the
uncertainty of a constant that ends at a bound, or of constants so correlated
that the runs cannot tell them apart.

A fit can also describe its own runs well and predict new ones worse than the
start did (too many free constants for too few runs). With ``loo=True`` (the
default) each run is predicted by the fit of the others; when that error is above
the start constants' error on the same runs (by more than
:data:`LOO_WORSE_MARGIN`), a :class:`CalibrationWarning` says so: the runs do not
show that the profile predicts an untried layout better than no calibration.
(``benchmarks/bench_calibrate.py`` counts, over its calibrations on half of the
published H100 runs, those that predicted the other half worse than their start and
how many of them raised it: ``loo_warning`` in ``benchmarks/results/bench_calibrate.json``,
quoted in the README's Calibrate section. It can miss some.)

``free="auto"`` lets the runs choose the free constants, by leave-one-out error
(:func:`select_free`): starting from none, it adds, of the default free constants,
the one whose fit predicts left-out runs best, while that beats the last choice
(at first: the start constants) by more than :data:`LOO_WORSE_MARGIN`. It costs
one leave-one-out per candidate tried (up to some 20, each one fit per run), and
what it chose is ``Calibration.selection``. Measured in ``bench_calibrate.py``
(the README's Calibrate section has the figures): from a start that had already seen
the runs it beat the default, mostly by freeing nothing; from a start far from the
cluster, where calibrating matters, it beat the default on some splits and lost on
others. So it is not the default.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import warnings as warnings_
from typing import Mapping, Optional, Sequence

import numpy as np

from solver import fused
from solver.physics import megatron

from . import fit as fit_
from .measurements import CalibrationWarning, MeasurementError, Measurements, read_measurements
from .profile import Profile, load_profile, now

__all__ = ["calibrate", "Calibration", "CalibrationWarning", "DEFAULT_FREE", "LAUNCH_FLOOR",
           "FLOOR_START", "predict",
           "IDENTIFIED_SENSITIVITY", "SEPARABLE_CORRELATION", "PRIOR_WIDTHS",
           "DEFAULT_NOISE", "PRIOR_DOMINATED", "LOO_WORSE_MARGIN", "AUTO", "select_free"]

#: Free constants unless told otherwise (``fp8_gemm_scale`` joins when a run uses FP8/FP4,
#: :data:`LAUNCH_FLOOR` when the runs identify it).
DEFAULT_FREE = ("gemm_scale", "scale_up_efficiency", "scale_out_efficiency", "overlap_efficiency",
                "step_overhead")
#: The host's time to launch a layer's kernels, a floor (a ``max``) under each layer's forward
#: and backward: only launch-bound runs (small models on few accelerators) see it. It joins
#: the default free constants when the runs identify it, at the start or at
#: :data:`FLOOR_START`, is then fitted from both (``fit.fit_log``'s ``other_starts``), and
#: stays only if some run is launch-bound at the fit.
LAUNCH_FLOOR = "layer_overhead"
#: The launch floor's second start [s]: above the 0.856 ms that vTrain's 2022 software stack
#: needs (the shipped fit, ``configs/physics/megatron.toml``), so a fit from it comes down to
#: the runs' floor. A floor has no slope where the runs are above it, so a fit started below
#: their floor (a start fitted on large models, 0.1 ms) cannot rise to it: vTrain's layouts
#: calibrated from there kept 0.1 ms and ranked about as badly as uncalibrated (the README's
#: Calibrate section; ``benchmarks/results/bench_calibrate_vtrain.md``).
FLOOR_START = 1e-3
#: Below this RMS ``d log(step) / d log(constant)`` (a secant over the prior's width, at
#: most a factor of e) the data cannot identify a constant (a 1 % change moves the step
#: times by less than 0.001 %).
IDENTIFIED_SENSITIVITY = 1e-3
#: Widest step (in log) of the identifiability check: a factor of e.
IDENTIFY_STEP = 1.0
#: Where the near check sees nothing, the runs are looked at this many prior widths from
#: the start too (at most :data:`FAR_STEP` in log), up and down: a per-step overhead of
#: 3 s against the shipped 3.8 ms has no slope near the start, yet the runs plainly need
#: it. A constant seen only there is fitted from that far point as well (a second start).
FAR_WIDTHS = 3.0
FAR_STEP = 6.0
#: A fit whose in-sample error exceeds the start's by more than this many percentage
#: points is said to be worse than no calibration; a run whose error after the fit is
#: above :data:`OUTLIER_APE` % and this many times the median run's is named.
IN_SAMPLE_WORSE_MARGIN = 0.1
OUTLIER_APE = 10.0
OUTLIER_FACTOR = 3.0
#: The fit's residuals (RMS in log step time) past this many times the ``noise`` it assumes
#: are named, with the runs left farthest off: a run slowed 1.3-2.5x by something the runs
#: do not say spreads its error over the others (an audit: no run then passed OUTLIER_APE,
#: and the constants drifted, a per-step overhead of 3.8 ms fitted at 0.33-1.16 s).
NOISE_EXCESS = 2.0
#: A fit from another start (``fit_log``'s ``other_starts``) that leaves the runs no more
#: than this share of the assumed noise farther off (RMS in log step time; the prior's
#: rows aside, which favour the start) while some constant differs by more than
#: RIVAL_RATIO is named: the runs do not tell those constants apart (an audit's runs took a
#: 3 s per-step overhead as an 84 ms per-layer launch floor, 0.03 % off in sample and
#: 14-19x too slow on larger models; the fit from the other start had found the 3 s).
RIVAL_NOISE_SHARE = 0.25
RIVAL_RATIO = 2.0
#: Above this many runs leave-one-out (one fit per run) is skipped unless asked for
#: (``loo=True``): its cost grows with the square of the runs (10,000 runs ran for more
#: than 14 minutes with nothing printed).
LOO_MAX_RUNS = 200
#: A constant this close (in log) to a bound is at it (the optimizer stops just inside).
AT_BOUND = 1e-4
#: A run measured this many times slower than the start constants predict is refused:
#: its step time is in milliseconds, most likely (the runs of benchmarks/data/ are at most
#: 8x off uncalibrated).
SLOWER_THAN_MODEL = 100.0
#: Above this |correlation| two fitted constants are not told apart by the runs.
SEPARABLE_CORRELATION = 0.99
#: Relative step of the finite-difference Jacobian in log(constant).
DIFF_STEP = 1e-3
#: Standard deviation of the prior on log(constant) around the start value, per
#: constant (others: :data:`OTHER_PRIOR_WIDTH`).
PRIOR_WIDTHS = {"gemm_scale": 0.3, "fp8_gemm_scale": 0.3, "hopper_gemm_scale": 0.3,
                "scale_up_efficiency": 0.5, "scale_out_efficiency": 0.5, "overlap_efficiency": 0.5,
                "step_overhead": 2.0,
                "layer_overhead": 2.0, "collective_latency": 2.0}
OTHER_PRIOR_WIDTH = 1.0
#: Assumed standard deviation of log(measured step time) about the model, per run.
DEFAULT_NOISE = 0.03
#: A constant whose posterior standard deviation (in log) is above this share of the
#: prior's was learned mostly from the prior, not from the runs.
PRIOR_DOMINATED = 0.8
#: Percentage points by which the leave-one-out error may exceed the start constants'
#: error on the same runs before :func:`calibrate` warns that the fit does not generalize.
LOO_WORSE_MARGIN = 0.1
#: ``calibrate(free=AUTO)``: the runs choose the free constants (:func:`select_free`).
AUTO = "auto"


def predict(measurements: Measurements, constants: Mapping[str, float]) -> np.ndarray:
    """Predicted step time of every run [s]: one ``solve`` per (workload, fleet)."""
    return _pricer(measurements)(constants)


def _pricer(measurements: Measurements):
    """``constants -> predicted step times`` of the runs, with their knobs checked once.

    A fit prices the same few runs hundreds of times, so each (workload, fleet) group is
    prepared once (:func:`solver.physics.megatron.prepare`) and takes the fused kernel
    where numba is installed, however few its runs (``engine="auto"`` keeps calls this
    small on the numpy path, sparing a one-off call the kernel's first load): the same
    bits as ``solve``, at a fraction of the cost per call.
    """
    engine = "fused" if fused.NUMBA else "numpy"
    groups = [(indices, megatron.prepare(workload, fleet, engine=engine, check_shape=False,
                                         **knobs))  # (read_measurements checked each)
              for workload, fleet, indices, knobs in measurements.groups()]
    n = len(measurements)

    def price(constants):
        out = np.empty(n)
        for indices, prepared in groups:
            out[indices] = prepared(**constants)["step_latency_total"]
        return out
    return price


def _ape(pred, meas):
    return np.abs(np.asarray(pred) / np.asarray(meas) - 1.0) * 100.0


@dataclasses.dataclass(frozen=True)
class Calibration:
    """The result of :func:`calibrate`.

    ``profile`` holds the fitted constants and their uncertainty; ``predicted``
    and ``loo_predicted`` the step times [s] of the fit and of the fit that left
    each run out (NaN when not computed); ``sensitivity`` the RMS ``d log(step)
    / d log(constant)`` of each free constant; ``correlation`` the fitted
    constants' correlation matrix.
    """

    profile: Profile
    measurements: Measurements
    predicted: np.ndarray
    loo_predicted: np.ndarray
    uncalibrated: np.ndarray
    sensitivity: Mapping[str, float]
    correlation: np.ndarray
    warnings: tuple
    #: The start constants (every constant's value before the fit).
    start: Mapping[str, float] = dataclasses.field(default_factory=lambda: dict(megatron.CONSTANTS))
    #: ``free="auto"``: each step of :func:`select_free`, ``(free constants, leave-one-out
    #: error [%])``, the start's error first; empty otherwise.
    selection: tuple = ()

    @property
    def constants(self) -> dict:
        return dict(self.profile.constants)

    @property
    def in_sample_error(self) -> float:
        """Mean absolute percentage error of the fit on its own runs [%]."""
        return float(np.mean(_ape(self.predicted, self.measurements.step_times)))

    @property
    def loo_error(self) -> float:
        """Mean absolute percentage error, each run predicted by the fit without it [%]."""
        return float(np.mean(_ape(self.loo_predicted, self.measurements.step_times)))

    @property
    def uncalibrated_error(self) -> float:
        """Mean absolute percentage error of the start constants on the runs [%]."""
        return float(np.mean(_ape(self.uncalibrated, self.measurements.step_times)))

    def save(self, path):
        """Write the profile as TOML (see :mod:`sweep.calibration.profile`)."""
        return self.profile.save(path)

    def residuals(self):
        """Per-run table (pandas): measured, predicted, errors in and out of sample."""
        import pandas as pd

        meas = self.measurements.step_times
        return pd.DataFrame({
            "run_id": self.measurements.run_ids,
            "line": [r.line for r in self.measurements.runs],
            "measured_s": meas, "predicted_s": self.predicted,
            "error_pct": (self.predicted / meas - 1.0) * 100.0,
            "loo_predicted_s": self.loo_predicted,
            "loo_error_pct": (self.loo_predicted / meas - 1.0) * 100.0,
            "uncalibrated_s": self.uncalibrated,
            "uncalibrated_error_pct": (self.uncalibrated / meas - 1.0) * 100.0,
        })

    def constants_table(self):
        """Per fitted constant (pandas): start, fitted, one standard deviation, its range,
        sensitivity.

        The fit is in log space, so one standard deviation spans ``fitted * exp(-s)`` to
        ``fitted * exp(s)`` with ``s = std / fitted`` (``range_low``, ``range_high``), cut
        to the constant's bounds: ``fitted +- std`` can leave them (0.9 +- 0.48 of an
        efficiency bounded by 1), the range cannot.
        """
        import pandas as pd

        p = self.profile
        rows = []
        for n in p.free:
            c, sd = p.constants[n], p.uncertainty.get(n, np.nan)
            low, high = megatron.CONSTANT_BOUNDS[n][:2]
            s = sd / c if c > 0 else np.nan
            rows.append({"constant": n, "start": self.start[n], "fitted": c, "std": sd,
                         "range_low": float(np.clip(c * np.exp(-s), low, high)),
                         "range_high": float(np.clip(c * np.exp(s), low, high)),
                         "low": low, "high": high, "sensitivity": self.sensitivity[n],
                         "meaning": megatron.CONSTANT_BOUNDS[n][2]})
        return pd.DataFrame(rows, columns=["constant", "start", "fitted", "std", "range_low",
                                           "range_high", "low", "high", "sensitivity",
                                           "meaning"])


def _free_names(free, measurements) -> tuple:
    """The constants ``free`` names (None: the defaults, :data:`LAUNCH_FLOOR` last; see
    :func:`calibrate` for when it stays)."""
    if free is None:
        low_bits = any(r.knobs["precision"] in ("fp8", "fp4") for r in measurements.runs)
        return (DEFAULT_FREE[:1] + (("fp8_gemm_scale",) if low_bits else ()) + DEFAULT_FREE[1:]
                + (LAUNCH_FLOOR,))
    names = (free,) if isinstance(free, str) else tuple(free)
    for n in names:
        if n not in megatron.CONSTANT_BOUNDS:
            close = difflib.get_close_matches(n, list(megatron.CONSTANT_BOUNDS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"free must name constants of the megatron physics "
                             f"({', '.join(megatron.CONSTANT_BOUNDS)}), but got {n!r}{hint}")
    if not names or len(set(names)) != len(names):
        raise ValueError(f"free must name distinct constants, at least one, but got {list(names)}")
    for n in names:
        if n in megatron.UNFITTED_CONSTANTS:
            raise ValueError(f"free: {n!r} is a setting of the megatron physics, not a fitted "
                             f"constant ({megatron.CONSTANT_BOUNDS[n][2]}); free the others")
    return names


def _log_residuals(measurements):
    log_meas = np.log(measurements.step_times)
    price = _pricer(measurements)
    return lambda constants: np.log(price(constants)) - log_meas


def _jacobian(residuals, start, names, steps):
    """Secant ``d residual / d log(constant)`` from ``start`` over ``steps`` (in log; a start check).

    A wide step, not a derivative: a constant far below what the runs need (a
    fixed overhead of 3 ms against steps of seconds) has almost no slope at its
    start, yet the runs can still move it; over the prior's width they see it.
    """
    base = residuals(start)
    cols = []
    for n in names:
        value = max(start[n], fit_.LOG_FLOOR)
        moved = _moved(start, n, steps[n])
        cols.append((residuals(dict(start, **{n: moved})) - base) / np.log(moved / value))
    return np.stack(cols, axis=1) if cols else np.zeros((len(base), 0))


def _moved(start, name, step) -> float:
    """``start[name]`` moved by ``step`` in log within its bounds (the other way where an
    upward step would leave them)."""
    low, high = megatron.CONSTANT_BOUNDS[name][:2]
    value = max(start[name], fit_.LOG_FLOOR)
    step = step if value * np.exp(step) <= high else -step
    return float(np.clip(value * np.exp(step), max(low, fit_.LOG_FLOOR), high))


def _check_not_milliseconds(data, start) -> None:
    """Refuse a run measured :data:`SLOWER_THAN_MODEL` times slower than the start constants
    predict: milliseconds read as seconds (a fit would take it at its word and drive the
    constants to their bounds). Too fast a step is refused on reading (above the peak)."""
    ratio = data.step_times / predict(data, start)
    bad = np.flatnonzero(ratio > SLOWER_THAN_MODEL)
    if bad.size:
        run = data.runs[int(bad[0])]
        seconds = run.measured_as == "step_time_s"
        what = ("a step time in seconds, but got" if seconds else
                "tokens per second per GPU, but got a step time of")
        hint = ("milliseconds? (seconds per optimizer step" if seconds else
                "thousands of tokens? (tokens per second per GPU, not the job's")
        raise MeasurementError(
            f"{data.source} line {run.line}, column {run.measured_as}: expected {what} "
            f"{run.step_time:.4g} s, {ratio[bad[0]]:.0f}x what the model predicts at its start "
            f"constants ({run.step_time / ratio[bad[0]]:.4g} s): {hint}; batch_size is "
            f"global, in sequences)")


def _far_sensitivity(residuals, start, name, width) -> tuple:
    """(largest secant sensitivity, the far value it was seen at) of ``name`` over
    :data:`FAR_WIDTHS` prior widths from ``start`` (at most :data:`FAR_STEP` in log), up
    and down, within its bounds (:func:`_jacobian`'s secant)."""
    reach = min(FAR_WIDTHS * width, FAR_STEP) if np.isfinite(width) else FAR_STEP
    best, at = 0.0, start[name]
    for step in (reach, -reach):
        moved = _moved(start, name, step)
        if not abs(np.log(moved / max(start[name], fit_.LOG_FLOOR))) > 1e-6:
            continue  # at a bound already: no secant that way
        s = float(fit_.sensitivity(_jacobian(residuals, start, (name,), {name: step}))[0])
        if s > best:
            best, at = s, moved
    return best, at


#: Runs of one layout whose step times differ by more than this share are named.
SAME_LAYOUT_SPREAD = 0.2


def _same_layout_notes(data) -> list:
    """Runs of the same layout (workload, fleet, knobs) measured far apart: one is likely
    wrong, or the cluster changed between them (the fit takes both at their word)."""
    seen = {}
    for run in data.runs:
        key = (run.group, tuple(sorted((k, repr(v)) for k, v in run.knobs.items())))
        seen.setdefault(key, []).append(run)
    notes = []
    for runs in seen.values():
        times = [r.step_time for r in runs]
        if len(runs) > 1 and max(times) > (1.0 + SAME_LAYOUT_SPREAD) * min(times):
            notes.append(f"runs {', '.join(repr(r.run_id) for r in runs)} (lines "
                         f"{', '.join(str(r.line) for r in runs)}) are one layout measured "
                         f"{min(times):.4g} s to {max(times):.4g} s apart: one is likely wrong "
                         f"(the fit takes each at its word)")
    return notes


def _fit_notes(data, predicted, uncalibrated, measured, fitted, noise) -> list:
    """Warnings on the fit as a whole: worse in sample than the start; a run far off; the
    runs left off by more than the noise assumed; one layout measured far apart."""
    notes = _same_layout_notes(data)
    log_off = np.log(np.asarray(predicted, dtype=np.float64) / np.asarray(measured, dtype=np.float64))
    rms = float(np.sqrt(np.mean(log_off ** 2))) if len(log_off) else 0.0
    if len(log_off) >= 4 and rms > NOISE_EXCESS * noise:
        far = np.argsort(-np.abs(log_off))[:3]
        named = ", ".join(f"{data.runs[i].run_id!r} (line {data.runs[i].line}, "
                          f"{100 * (np.exp(log_off[i]) - 1):+.1f} %)" for i in far)
        notes.append(f"the fit leaves the runs {100 * rms:.1f} % off (RMS in log step time), "
                     f"{rms / noise:.1f}x the scatter it assumes (noise={noise:g}): a run's "
                     f"step time or layout is likely wrong, or the runs share something the "
                     f"model does not price, and the constants are pulled to make up for it; "
                     f"the farthest: {named}")
    after, before = _ape(predicted, measured), _ape(uncalibrated, measured)
    if fitted and float(np.mean(after)) > float(np.mean(before)) + IN_SAMPLE_WORSE_MARGIN:
        notes.append(f"the fit predicts these runs worse than the start constants, in sample "
                     f"({float(np.mean(after)):.2f} % against {float(np.mean(before)):.2f} %): "
                     f"some run's step time or layout is likely wrong, or the runs ask for what "
                     f"the free constants cannot give; do not use this profile as it is")
    if len(after) >= 3:
        worst = int(np.argmax(after))
        rest = np.delete(after, worst)
        if after[worst] > OUTLIER_APE and after[worst] > OUTLIER_FACTOR * float(np.median(rest)):
            run = data.runs[worst]
            notes.append(f"run {run.run_id!r} (line {run.line}) is {after[worst]:.1f} % off after "
                         f"the fit, the others at most {float(np.max(rest)):.1f} %: check its "
                         f"step time (seconds) and layout")
    return notes


#: Constants that can explain the same few runs as each other: a fixed cost a step and the
#: host's launch floor a layer (an audit's runs took a 3 s overhead as an 84 ms floor).
EXPLAIN_ALIKE = (("step_overhead", LAUNCH_FLOOR),)


def _with_alone(solution, residuals, base, seen, held, widths, noise, max_nfev, starts):
    """``solution`` with, among its rivals, a fit of each constant of an
    :data:`EXPLAIN_ALIKE` pair both fitted with the other held at its start: which of two
    such explanations a fit lands on depends on its starts (both of a fit's landed on the
    floor for overheads of 0.5-2 s, on the overhead for 3-4 s), so each is fitted alone,
    from the main fit's starts of it (``starts``: constant -> more starts), and
    :func:`_rival_notes` names them where both explain the runs. (Each holds a constant
    the main fit frees, so it cannot fit the runs and the prior better than the main fit's
    optimum; it is a rival, not a candidate.)"""
    alone = []
    for pair in EXPLAIN_ALIKE:
        if not all(n in seen for n in pair):
            continue
        for hold in pair:
            names = tuple(n for n in seen if n != hold)
            more = tuple(start for n in names for start in starts.get(n, ()))
            alone.append(fit_.fit_log(
                residuals, base, names, megatron.CONSTANT_BOUNDS, held={**held, hold: base[hold]},
                diff_step=DIFF_STEP, max_nfev=max_nfev, prior_center=base,
                prior_weight=[float(noise) / widths[n] for n in names], other_starts=more))
    return dataclasses.replace(solution, rivals=tuple(solution.rivals) + tuple(alone))


def _rival_notes(solution, names, runs, noise) -> list:
    """A fit from another start as good on the ``runs`` (its first residuals) as the chosen
    one, with some constant far apart: the runs do not tell those constants apart
    (:data:`RIVAL_NOISE_SHARE`)."""
    def rms(fit):
        return float(np.sqrt(np.mean(np.asarray(fit.residuals[:runs]) ** 2)))
    best = rms(solution)
    notes = []
    for fit in solution.rivals:
        off = rms(fit)
        if off > best + RIVAL_NOISE_SHARE * noise:
            continue
        apart = [n for n in names if max(fit.constants[n] / solution.constants[n],
                                         solution.constants[n] / fit.constants[n]) > RIVAL_RATIO]
        if not apart:
            continue
        chosen = ", ".join(f"{n} = {solution.constants[n]:.4g}" for n in apart)
        other = ", ".join(f"{n} = {fit.constants[n]:.4g}" for n in apart)
        notes.append(f"these runs are explained about as well ({100 * off:.2f} % RMS against "
                     f"{100 * best:.2f} %) by {other} as by the chosen {chosen}: they do not tell "
                     f"{', '.join(apart)} apart, and layouts unlike them (more layers, "
                     f"microbatches or accelerators) may be priced far apart by the two; "
                     f"measure such layouts, or hold one of the constants (free=...)")
        break
    return notes


def _why_unidentified(name, measurements) -> str:
    if name == "scale_out_efficiency":
        inside = all(r.n_accelerators <= (r.fleet.node.scale_up_domain
                                          or r.fleet.node.accelerators_per_node)
                     for r in measurements.runs)
        if inside:
            return "no run crosses nodes (each fits in one NVLink domain)"
    if name == "fp8_gemm_scale" and not any(r.knobs["precision"] in ("fp8", "fp4")
                                            for r in measurements.runs):
        return "no run uses FP8/FP4 GEMMs"
    return "the step times of these runs do not depend on it"


def _positive(label, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{label} must be a positive number (in log units), but got {value!r}")


def _prior_widths(prior_width, names) -> dict:
    """Prior standard deviation in log of each free constant (``inf``: no prior)."""
    widths = {n: PRIOR_WIDTHS.get(n, OTHER_PRIOR_WIDTH) for n in names}
    if prior_width is None:
        return widths
    if isinstance(prior_width, Mapping):
        for n, v in prior_width.items():
            if n not in megatron.CONSTANT_BOUNDS:
                raise ValueError(f"prior_width names constants of the megatron physics "
                                 f"({', '.join(megatron.CONSTANT_BOUNDS)}), but got {n!r}")
            _positive(f"prior_width[{n!r}]", v)
        return {n: float(prior_width.get(n, widths[n])) for n in names}
    _positive("prior_width", prior_width)
    return {n: float(prior_width) for n in names}


def _start(start) -> dict:
    if start is None:
        return dict(megatron.CONSTANTS)
    if isinstance(start, Mapping):
        return {**megatron.CONSTANTS, **start}
    return {**megatron.CONSTANTS, **load_profile(start).constants}


def calibrate(measurements, physics: str = "megatron", free: Optional[Sequence[str]] = None, *,
              start=None, loo: Optional[bool] = None, max_nfev: int = 300,
              prior_width=None, noise: float = DEFAULT_NOISE) -> Calibration:
    """Fit the physics' free constants to measured step times.

    Parameters
    ----------
    measurements : str, pathlib.Path, Measurements or list of dict
        The measured runs (:func:`sweep.calibration.read_measurements`).
    physics : {"megatron"}
        The physics model calibrated (only ``"megatron"`` has free constants).
    free : sequence of str or "auto", optional
        Constants fitted (default: :data:`DEFAULT_FREE`, with ``fp8_gemm_scale``
        when a run uses FP8/FP4, and the launch floor :data:`LAUNCH_FLOOR` when some
        run is launch-bound, at the start or at :data:`FLOOR_START`, and still at the
        fit; a launch floor, named or default, is fitted from both starts). ``"auto"``:
        those of the default ones that
        :func:`select_free` chooses by leave-one-out error (possibly none: then
        the start constants, unchanged).
    start : mapping, Profile or path, optional
        Start values, and the values of the constants not fitted (default: the
        shipped fit :data:`solver.physics.megatron.CONSTANTS`).
    loo : bool, optional
        Also refit with each run left out and predict it (one fit per run). Default:
        where there are at most :data:`LOO_MAX_RUNS` runs (skipped above, with a warning).
    max_nfev : int
        Most residual evaluations of one fit.
    prior_width : float or mapping of str -> float, optional
        Standard deviation of the Gaussian prior on each free constant's log,
        centered at its start value: one for all, or per constant over
        :data:`PRIOR_WIDTHS` (the default); ``math.inf``: no prior, plain
        least squares.
    noise : float
        Assumed standard deviation of a run's log step time about the model
        (the prior's weight is ``noise / prior_width``).

    Returns
    -------
    Calibration

    Warns
    -----
    CalibrationWarning
        For each constant the runs cannot identify, or whose uncertainty is not
        stated (at a bound; too few runs; inseparable from another).
    """
    cal = _calibrate(measurements, physics, free, start, loo, max_nfev, prior_width, noise)
    for note in cal.warnings:
        warnings_.warn(note, CalibrationWarning, stacklevel=2)
    return cal


#: How to get the fit's optimizer (scipy.optimize.least_squares): the ``fidelity`` extra.
SCIPY_HINT = "pip install 'layout-sweep[fidelity]', or pip install scipy"


def require_scipy() -> None:
    """Raise ``ImportError`` saying how to install scipy, before any work, where it is missing
    (a fit needs it; scoring a saved profile does not)."""
    import importlib.util

    if importlib.util.find_spec("scipy") is None:
        raise ImportError(f"a calibration fit needs scipy ({SCIPY_HINT}), but it is not "
                          f"installed")


def _calibrate(measurements, physics, free, start, loo, max_nfev, prior_width, noise):
    """:func:`calibrate`'s work; its notes are the result's ``warnings``, not yet warned."""
    if physics != "megatron":
        raise ValueError(f"physics must be 'megatron' (the physics with fitted constants), "
                         f"but got {physics!r}")
    _positive("noise", noise)
    if not math.isfinite(noise):  # (a prior width may be inf, a plain fit; a scatter not)
        raise ValueError(f"noise must be a finite positive number (the runs' scatter in log "
                         f"step time, e.g. 0.03), but got {noise!r}")
    require_scipy()
    data = read_measurements(measurements)
    selection = ()
    if isinstance(free, str) and free == AUTO:
        selection = select_free(data, start=start, max_nfev=max_nfev, prior_width=prior_width,
                                noise=noise)
        names = selection[-1][0]
    else:
        names = _free_names(free, data)
    base = _start(start)
    widths = _prior_widths(prior_width, names)
    _check_not_milliseconds(data, base)
    residuals = _log_residuals(data)
    notes = []
    steps = {n: min(widths[n], IDENTIFY_STEP) for n in names}
    sens0 = fit_.sensitivity(_jacobian(residuals, base, names, steps))
    far = {}  # constants the runs see only far from the start: a start of their own there
    for i, n in enumerate(names):
        if sens0[i] < IDENTIFIED_SENSITIVITY and n != LAUNCH_FLOOR:
            far_sens, at = _far_sensitivity(residuals, base, n, widths[n])
            if far_sens >= IDENTIFIED_SENSITIVITY:
                sens0[i], far[n] = far_sens, at
    floor_start = ({LAUNCH_FLOOR: FLOOR_START}
                   if LAUNCH_FLOOR in names and base[LAUNCH_FLOOR] < FLOOR_START else None)
    if floor_start:  # seen from above the floor too: from below, it may have no slope at all
        i = names.index(LAUNCH_FLOOR)
        sens0[i] = max(sens0[i], fit_.sensitivity(_jacobian(
            residuals, {**base, **floor_start}, (LAUNCH_FLOOR,), steps))[0])
    if free is None:  # the launch floor is a default free constant only where the runs see it
        # (here: identified; after the fit: some run still launch-bound, below)
        keep = [n != LAUNCH_FLOOR or s >= IDENTIFIED_SENSITIVITY for n, s in zip(names, sens0)]
        names = tuple(n for n, k in zip(names, keep) if k)
        sens0 = sens0[np.array(keep)]
    seen = tuple(n for n, s in zip(names, sens0) if s >= IDENTIFIED_SENSITIVITY)
    for n, s in zip(names, sens0):
        if s < IDENTIFIED_SENSITIVITY:
            notes.append(f"{n}: not identified by these runs ({_why_unidentified(n, data)}); "
                         f"kept at {base[n]:.4g}")
    held = {k: v for k, v in base.items() if k not in seen}
    if seen:
        prior = {"prior_center": base,
                 "prior_weight": [float(noise) / widths[n] for n in seen]}
        others = ((floor_start,) if floor_start and LAUNCH_FLOOR in seen else ()) + tuple(
            {n: at} for n, at in far.items() if n in seen)
        solution = fit_.fit_log(residuals, base, seen, megatron.CONSTANT_BOUNDS, held=held,
                                diff_step=DIFF_STEP, max_nfev=max_nfev, **prior,
                                other_starts=others)
        constants = dict(solution.constants)
    else:
        solution, constants, prior = None, dict(base), {}
    constants = {k: constants[k] for k in megatron.CONSTANT_BOUNDS}
    uncertainty, sens, corr = _uncertainty(solution, names, constants, len(data), notes,
                                           widths, noise, base)
    if free is None and LAUNCH_FLOOR in seen and not sens[LAUNCH_FLOOR] >= IDENTIFIED_SENSITIVITY:
        # The runs bound the floor from above only (none is launch-bound at the fit, where
        # it has no slope): it is no default free constant of theirs; the fit is made
        # without it.
        return _calibrate(data, physics, tuple(n for n in names if n != LAUNCH_FLOOR), start,
                          loo, max_nfev, prior_width, noise)
    for n, s in zip(names, sens0):
        sens.setdefault(n, float(s))
    predicted = predict(data, constants)
    meas = data.step_times
    uncalibrated = predict(data, base)
    notes += _fit_notes(data, predicted, uncalibrated, meas, bool(seen), noise)
    if solution is not None:
        starts = {LAUNCH_FLOOR: (floor_start,) if floor_start else ()}
        starts.update({n: ({n: at},) for n, at in far.items()})
        notes += _rival_notes(_with_alone(solution, residuals, base, seen, held, widths, noise,
                                          max_nfev, starts), seen, len(data), noise)
    if loo is None:
        loo = len(data) <= LOO_MAX_RUNS
        if not loo:
            notes.append(f"leave-one-out skipped: {len(data):,} runs would take {len(data):,} "
                         f"fits (more than {LOO_MAX_RUNS}); pass loo=True (the command line: "
                         f"--loo) to run it anyway")
    loo_pred = (_leave_one_out(data, constants, seen, max_nfev, prior) if loo
                else np.full(len(data), np.nan))
    if loo and seen:
        loo_mape = float(np.mean(_ape(loo_pred, meas)))
        start_mape = float(np.mean(_ape(uncalibrated, meas)))
        if loo_mape > start_mape + LOO_WORSE_MARGIN:
            notes.append(f"leave-one-out: fitted without it, a run is predicted {loo_mape:.2f} % off "
                         f"on average, against {start_mape:.2f} % with the start constants: these "
                         f"runs do not show that the fit predicts untried layouts better than no "
                         f"calibration (fit fewer constants with free=..., or measure more layouts)")
    profile = Profile(physics=physics, constants=constants, uncertainty=uncertainty, free=names,
                      data_sha256=data.sha256, data_source=data.source, date=now(), runs=len(data),
                      in_sample_mape=float(np.mean(_ape(predicted, meas))),
                      loo_mape=float(np.mean(_ape(loo_pred, meas))),
                      prior_width=dict(widths), noise=float(noise), warnings=tuple(notes),
                      accelerators=tuple(dict.fromkeys(r.fleet.node.accelerator.name
                                                       for r in data.runs)))
    return Calibration(profile=profile, measurements=data, predicted=predicted,
                       loo_predicted=loo_pred, uncalibrated=uncalibrated,
                       sensitivity=sens, correlation=corr, warnings=tuple(notes),
                       start={k: base[k] for k in megatron.CONSTANT_BOUNDS}, selection=selection)


def select_free(measurements, *, start=None, max_nfev: int = 300, prior_width=None,
                noise: float = DEFAULT_NOISE) -> tuple:
    """The free constants the runs support, chosen by leave-one-out error (forward selection).

    From no free constant (the start constants' error on the runs), each step fits,
    for every default free constant (:data:`DEFAULT_FREE`, with ``fp8_gemm_scale``
    when a run uses FP8/FP4) not yet chosen, the chosen ones plus it, and predicts each
    run by the fit of the others (:func:`calibrate` with ``loo=True``); it keeps the
    candidate with the lowest error while that is below the last step's by more than
    :data:`LOO_WORSE_MARGIN`. Only the runs given are used: no held-out data.

    Returns
    -------
    tuple of (tuple of str, float)
        Each step's free constants and leave-one-out mean absolute percentage error
        [%], from ``((), start's error)`` to the chosen set (the last).
    """
    data = read_measurements(measurements)
    base = _start(start)
    candidates = _free_names(None, data)
    chosen = ()
    steps = [(chosen, float(np.mean(_ape(predict(data, base), data.step_times))))]
    while len(chosen) < len(candidates):
        tried = {}
        with warnings_.catch_warnings():
            warnings_.simplefilter("ignore", CalibrationWarning)
            for name in candidates:
                if name not in chosen:
                    tried[name] = calibrate(data, free=chosen + (name,), start=start, loo=True,
                                            max_nfev=max_nfev, prior_width=prior_width,
                                            noise=noise).loo_error
        name = min(tried, key=tried.get)  # ties: the first in the default order
        if not tried[name] < steps[-1][1] - LOO_WORSE_MARGIN:
            break
        chosen = chosen + (name,)
        steps.append((chosen, float(tried[name])))
    return tuple(steps)


def _uncertainty(solution, names, constants, n_runs, notes, widths,
                 noise=DEFAULT_NOISE, start=None) -> tuple:
    """``(std per free constant, sensitivity per fitted one, correlation)``; notes appended.

    With a prior (a finite width in ``widths``), the posterior's (always
    defined); without, the least-squares one (needs more runs than fitted
    constants).
    """
    prior_width = widths if any(np.isfinite(w) for w in widths.values()) else None
    std = {n: float("nan") for n in names}
    if solution is None:
        return std, {}, np.zeros((0, 0))
    fitted = solution.names
    n_prior = len(fitted) if prior_width is not None else 0
    data_jac = solution.jac[:solution.jac.shape[0] - n_prior]
    sens = dict(zip(fitted, map(float, fit_.sensitivity(data_jac))))
    near = np.array([min(abs(np.log(max(constants[n], fit_.LOG_FLOOR)
                                 / max(megatron.CONSTANT_BOUNDS[n][i], fit_.LOG_FLOOR)))
                         for i in (0, 1)) < AT_BOUND for n in fitted], dtype=bool)
    active = np.asarray(solution.active, dtype=bool) | near
    use = ~active
    for n, at_bound in zip(fitted, active):
        if at_bound:
            low, high = megatron.CONSTANT_BOUNDS[n][:2]
            notes.append(f"{n}: ended at its bound ({constants[n]:.4g} in [{low:g}, {high:g}]): "
                         f"the runs push it past its physical range; uncertainty not stated")
    if prior_width is not None:
        cov = np.full((len(fitted),) * 2, np.nan)
        rows = np.concatenate([np.arange(data_jac.shape[0]),
                               data_jac.shape[0] + np.flatnonzero(use)])
        cov[np.ix_(use, use)] = fit_.posterior_covariance(
            solution.jac[np.ix_(rows, use)], solution.residuals[rows], int(use.sum()), noise)
    else:
        if n_runs <= int(use.sum()):
            notes.append(f"{n_runs} runs for {int(use.sum())} fitted constants: no uncertainty "
                         f"without more runs than constants")
        cov = fit_.covariance(solution.jac, solution.residuals, use)
    sd_x = np.sqrt(np.diag(cov))
    if prior_width is not None:
        for n, s in zip(fitted, sd_x):
            if np.isfinite(s) and s > PRIOR_DOMINATED * widths[n]:
                moved = (abs(np.log(max(constants[n], fit_.LOG_FLOOR)
                                    / max(start[n], fit_.LOG_FLOOR))) if start else 0.0)
                if moved > widths[n]:  # far from the start: not "mostly the start's"
                    notes.append(f"{n}: moved from {start[n]:.4g} to {constants[n]:.4g}, "
                                 f"though these runs barely constrain it (posterior sd {s:.2f} "
                                 f"in log against the prior's {widths[n]:g}): another constant "
                                 f"or a wrong run may be what moved it")
                else:
                    notes.append(f"{n}: barely constrained by these runs (posterior sd {s:.2f} "
                                 f"in log against the prior's {widths[n]:g}); its value is "
                                 f"mostly the start's")
    for n, s in zip(fitted, sd_x):
        std[n] = float(constants[n] * s)  # delta method: d c = c d log c
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = cov / np.outer(sd_x, sd_x)
    for i in range(len(fitted)):
        for j in range(i + 1, len(fitted)):
            if abs(corr[i, j]) > SEPARABLE_CORRELATION:
                notes.append(f"{fitted[i]} and {fitted[j]}: not told apart by these runs "
                             f"(correlation {corr[i, j]:+.3f}); their sum effect is fitted, "
                             f"each alone is uncertain")
    return std, sens, corr


def layout_groups(data) -> list:
    """The runs' indices grouped by layout (workload, fleet and every knob the same): repeated
    measurements of one layout are one point for leave-one-out, not several."""
    groups = {}
    for i, run in enumerate(data.runs):
        key = (run.group, tuple(sorted((k, str(v)) for k, v in run.knobs.items())))
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def _leave_one_out(data, constants, names, max_nfev, prior=None) -> np.ndarray:
    """Each run predicted by the fit of the runs of every other layout (started from the
    full fit): a layout measured twice would otherwise predict itself from its own repeat.

    With no constant fitted, the fit of the others is the start: each run gets the start's
    prediction (``constants`` are then the start's). With one layout only, NaN."""
    if not names:
        return predict(data, constants)
    out = np.full(len(data), np.nan)
    groups = layout_groups(data)
    if len(groups) < 2:
        return out
    held = {k: v for k, v in constants.items() if k not in names}
    for group in groups:
        left_out = set(group)
        rest = data.subset([j for j in range(len(data)) if j not in left_out])
        sol = fit_.fit_log(_log_residuals(rest), constants, names, megatron.CONSTANT_BOUNDS,
                           held=held, diff_step=DIFF_STEP, max_nfev=max_nfev, **(prior or {}))
        out[group] = predict(data.subset(group), sol.constants)
    return out
