"""``calibrate``: fit the megatron physics to measured runs, print the fit, save a profile.

    layout-sweep calibrate runs.csv -o my_cluster.toml --plot cal.png
    layout-sweep calibrate runs.csv --calibration my_cluster.toml   # score a profile, no fit
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from ._common import EXIT_OK, UsageError, _check_figure_output, _check_output
from .format import format_table

__all__ = ["command"]


def _number(value, digits=4) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else f"{value:.{digits}g}"


def _constants_rows(cal) -> list:
    return [[r["constant"], _number(r["start"]), _number(r["fitted"]), _number(r["std"], 2),
             "-" if math.isnan(r["range_low"]) else
             f"{_number(r['range_low'], 3)}-{_number(r['range_high'], 3)}",
             f"[{r['low']:g}, {r['high']:g}]", _number(r["sensitivity"], 2)]
            for r in cal.constants_table().to_dict("records")]


def _residual_rows(table) -> list:
    rows = []
    for r in table.to_dict("records"):
        rows.append([r["run_id"], str(r["line"]), f"{r['measured_s']:.4g}", f"{r['predicted_s']:.4g}",
                     f"{r['error_pct']:+.1f}", "-" if math.isnan(r["loo_error_pct"])
                     else f"{r['loo_error_pct']:+.1f}", f"{r['uncalibrated_error_pct']:+.1f}"])
    return rows


def _score(args, data):
    """A profile's residuals on the runs, without fitting (``--calibration``)."""
    from ..calibration import load_profile, predict

    profile = load_profile(args.calibration)
    pred = predict(data, profile.constants)
    other = profile.other_accelerators(r.fleet.node.accelerator.name for r in data.runs)
    if other:
        print(f"warning: {profile.path or 'the profile'}: fitted on runs of "
              f"{', '.join(profile.accelerators)}, but these runs are on {', '.join(other)}: "
              f"its GEMM efficiency and link shares were fitted to other hardware")
    meas = data.step_times
    err = (pred / meas - 1.0) * 100.0
    print(f"{profile.path}: {profile.physics} constants fitted {profile.date} on "
          f"{profile.runs} runs of {profile.data_source} (sha256 {profile.data_sha256[:16]})")
    print(format_table(["run", "line", "measured [s]", "predicted [s]", "error [%]"],
                       [[r.run_id, str(r.line), f"{m:.4g}", f"{p:.4g}", f"{e:+.1f}"]
                        for r, m, p, e in zip(data.runs, meas, pred, err)]))
    print(f"mean absolute error {np.mean(np.abs(err)):.2f} %")
    return meas, pred, None


def _fit(args, data):
    import sweep

    from ..calibration.core import layout_groups

    free = [n.strip() for n in args.free.split(",") if n.strip()] if args.free else None
    if free == ["auto"]:
        if args.no_loo:
            raise UsageError("calibrate: --free auto chooses the constants by leave-one-out "
                             "error, so it cannot run with --no-loo")
        free = "auto"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            extra = {} if args.noise is None else {"noise": args.noise}
            cal = sweep.calibrate(data, free=free,
                                  loo=False if args.no_loo else (True if args.loo else None),
                                  prior_width=args.prior_width, **extra)
        except ValueError as err:
            raise UsageError(f"calibrate: {err}") from None
    for chosen, error in cal.selection:
        print(f"free auto: {', '.join(chosen) or 'nothing free (the start constants)'}: "
              f"leave-one-out error {error:.2f} %")
    print(f"{data.source}: {len(data)} runs, sha256 {data.sha256[:16]}; fitted "
          f"{', '.join(cal.profile.free) or 'nothing'} (megatron physics)")
    print(format_table(["constant", "start", "fitted", "std", "1-sd range", "bounds", "sensitivity"],
                       _constants_rows(cal)))
    print()
    print(format_table(["run", "line", "measured [s]", "predicted [s]", "error [%]",
                        "LOO error [%]", "uncalibrated [%]"], _residual_rows(cal.residuals())))
    loo = "" if args.no_loo else (
        f", leave-one-out {cal.loo_error:.2f} %" if math.isfinite(cal.loo_error)
        else ", leave-one-out needs two layouts or more" if len(layout_groups(data)) < 2
        else ", leave-one-out skipped (--loo runs it)")
    print(f"mean absolute error: in sample {cal.in_sample_error:.2f} %{loo} (uncalibrated "
          f"{np.mean(np.abs(cal.uncalibrated / data.step_times - 1)) * 100:.2f} %)")
    for w in caught:
        print(f"warning: {w.message}")
    if args.output:
        path = _check_output(args.output, "-o", inputs=(args.measurements,))
        cal.save(path)
        print(f"wrote {path}")
    return data.step_times, cal.predicted, cal.uncalibrated


def command(args) -> int:
    """``calibrate``: fit (or, with ``--calibration``, score) and print; save and plot."""
    from ..calibration import MeasurementError, ProfileError, read_measurements

    # where the results go is checked before the fit, which can take a while
    if args.output:
        _check_output(args.output, "-o", inputs=(args.measurements, args.calibration))
    if args.calibration:  # scoring a saved profile fits nothing: the fit's options do nothing
        given = [flag for flag, value in (("-o", args.output), ("--free", args.free),
                                          ("--noise", args.noise),
                                          ("--prior-width", args.prior_width),
                                          ("--loo", args.loo), ("--no-loo", args.no_loo))
                 if value not in (None, False)]
        if given:
            raise UsageError(f"calibrate --calibration scores a saved profile on the runs and "
                             f"fits nothing, so {', '.join(given)} would do nothing; drop "
                             f"{'it' if len(given) == 1 else 'them'}, or drop --calibration to fit")
    if not args.calibration:  # a fit (scoring a saved profile needs no optimizer)
        from ..calibration.core import SCIPY_HINT
        import importlib.util

        if importlib.util.find_spec("scipy") is None:
            raise UsageError(f"calibrate: expected scipy to be installed for the fit "
                             f"({SCIPY_HINT}), but it is not")
    if args.plot:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            raise UsageError("calibrate --plot: expected matplotlib to be installed (pip "
                             "install 'layout-sweep[plot]', or pip install matplotlib), but it "
                             "is not")
        args.plot = str(_check_figure_output(args.plot, "--plot"))
    try:
        data = read_measurements(args.measurements)
        meas, pred, base = _score(args, data) if args.calibration else _fit(args, data)
    except (MeasurementError, ProfileError) as err:
        raise UsageError(str(err)) from None
    if args.plot:
        from .. import plot

        path = _check_figure_output(args.plot, "--plot")
        figure = plot.calibration(meas, pred, labels=data.run_ids, uncalibrated=base)
        figure.savefig(path, dpi=120)
        print(f"wrote {path}")
    return EXIT_OK
