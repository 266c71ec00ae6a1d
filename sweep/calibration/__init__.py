"""Calibrate the megatron physics to a user's own measured steps, then search with it.

    >>> import sweep
    >>> cal = sweep.calibrate("runs.csv")                 # fit the free constants
    >>> cal.constants_table(); cal.residuals()            # fit table, per-run residuals
    >>> cal.save("my_cluster.toml")                       # a profile (TOML)
    >>> sweep.calibrate("runs.csv", free="auto").selection  # the runs choose what to fit
    >>> sweep.search("spec.toml", calibration="my_cluster.toml")

Modules: :mod:`~sweep.calibration.measurements` (the CSV format),
:mod:`~sweep.calibration.fit` (the one least-squares core, shared with
``benchmarks/fidelity.py``), :mod:`~sweep.calibration.core` (``calibrate``),
:mod:`~sweep.calibration.profile` (the TOML profile).
"""

from .core import DEFAULT_FREE, Calibration, CalibrationWarning, calibrate, predict, select_free
from .measurements import COLUMNS, MeasurementError, Measurements, Run, read_measurements
from .profile import Profile, ProfileError, load_profile, solve_keywords, with_calibration

__all__ = ["calibrate", "select_free", "Calibration", "CalibrationWarning", "DEFAULT_FREE",
           "predict",
           "read_measurements", "Measurements", "Run", "MeasurementError", "COLUMNS",
           "Profile", "ProfileError", "load_profile", "solve_keywords", "with_calibration"]
