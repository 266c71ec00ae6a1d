"""The one fitting core: physics constants by bounded least squares in log space.

Used by :func:`sweep.calibrate` (a user's runs) and by
``benchmarks/fidelity.py`` (the published runs). The fitted variables are
``x = log(constant)``, so a constant stays positive and a residual's
sensitivity reads as a relative change; the bounds are each constant's
physical range (:data:`solver.physics.megatron.CONSTANT_BOUNDS`, a zero lower
bound taken as 1e-9). The optimizer is :func:`scipy.optimize.least_squares`
(trust-region reflective, finite-difference Jacobian).

The uncertainty is the linearized one: ``cov(x) = s^2 (J^T J)^-1`` with ``s^2 =
sum(r^2) / (n - p)`` [1]; a constant's standard deviation is
``constant * sqrt(cov(x)_jj)`` (the delta method).

References
----------
[1] Bates, D. M. and Watts, D. G. (1988), "Nonlinear Regression Analysis and Its
    Applications", Wiley, Sec. 2.3 (linear approximation inference regions).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

__all__ = ["LogFit", "fit_log", "log_bounds", "covariance", "sensitivity", "FAILED_RESIDUAL",
           "LOG_FLOOR"]

#: Residual given to a prediction that is NaN or infinite (the layout cannot be priced
#: at these constants): large, finite, so the optimizer steps away.
FAILED_RESIDUAL = 10.0
#: Smallest constant the log parameterization represents (a zero lower bound).
LOG_FLOOR = 1e-9


@dataclasses.dataclass(frozen=True)
class LogFit:
    """A solution: ``constants`` (fitted and held), the fitted ``names`` and
    their ``x = log(constant)``, the Jacobian ``jac`` (residual per x, shape
    ``(n, p)``), the residuals, and which x ended at a bound (``active``)."""

    constants: Mapping[str, float]
    names: tuple
    x: np.ndarray
    jac: np.ndarray
    residuals: np.ndarray
    active: np.ndarray
    nfev: int
    message: str


def log_bounds(names: Sequence[str], bounds: Mapping) -> tuple:
    """``(low, high)`` arrays of ``log`` of each constant's bounds."""
    lo = np.array([np.log(max(bounds[n][0], LOG_FLOOR)) for n in names])
    hi = np.array([np.log(bounds[n][1]) for n in names])
    return lo, hi


def _residual_fn(residuals: Callable, names, held):
    def fn(x):
        constants = {**held, **{n: float(np.exp(v)) for n, v in zip(names, x)}}
        res = np.asarray(residuals(constants), dtype=np.float64)
        return np.where(np.isfinite(res), res, FAILED_RESIDUAL)
    return fn


def fit_log(residuals: Callable[[dict], np.ndarray], start: Mapping[str, float],
            names: Sequence[str], bounds: Mapping, *, held: Optional[Mapping] = None,
            diff_step: float = 1e-3, max_nfev: int = 300) -> LogFit:
    """Fit ``names`` so that ``residuals(constants)`` is least in the 2-norm.

    Parameters
    ----------
    residuals : callable
        ``constants -> 1-D array`` (e.g. weighted ``log(predicted) -
        log(measured)``); NaN or infinite entries count as
        :data:`FAILED_RESIDUAL`.
    start : mapping of str -> float
        Starting values (at least ``names``); clipped into the bounds.
    names : sequence of str
        The constants fitted.
    bounds : mapping of str -> (low, high, ...)
        Each constant's physical range.
    held : mapping of str -> float, optional
        Constants passed to ``residuals`` unchanged.
    diff_step, max_nfev
        Of :func:`scipy.optimize.least_squares` (relative step of the
        finite-difference Jacobian in x; most residual evaluations).

    Returns
    -------
    LogFit
    """
    from scipy.optimize import least_squares

    names = tuple(names)
    held = dict(held or {})
    fn = _residual_fn(residuals, names, held)
    lo, hi = log_bounds(names, bounds)
    x0 = np.clip(np.array([np.log(max(start[n], LOG_FLOOR)) for n in names]), lo + 1e-9, hi - 1e-9)
    sol = least_squares(fn, x0, bounds=(lo, hi), x_scale=1.0, diff_step=diff_step,
                        max_nfev=max_nfev)
    constants = {**held, **{n: float(np.exp(v)) for n, v in zip(names, sol.x)}}
    return LogFit(constants=constants, names=names, x=sol.x, jac=np.atleast_2d(sol.jac),
                  residuals=sol.fun, active=sol.active_mask != 0, nfev=int(sol.nfev),
                  message=str(sol.message))


def sensitivity(jac: np.ndarray) -> np.ndarray:
    """Root-mean-square ``d residual / d log(constant)`` of each column [1].

    0.01 means a 1 % change of the constant moves the residuals by 0.01 % on
    average: next to nothing the data can see.
    """
    jac = np.atleast_2d(jac)
    return np.sqrt(np.mean(jac ** 2, axis=0)) if jac.size else np.zeros(jac.shape[1])


def covariance(jac: np.ndarray, residuals: np.ndarray, use: Optional[np.ndarray] = None):
    """``s^2 (J^T J)^-1`` of the columns ``use`` (bool mask; all by default) [1].

    Returns
    -------
    numpy.ndarray, shape (p, p)
        Covariance of ``x = log(constant)``; rows and columns not used, and all
        of them when there are no more residuals than used columns, are NaN.
    """
    jac = np.atleast_2d(jac)
    p = jac.shape[1]
    use = np.ones(p, dtype=bool) if use is None else np.asarray(use, dtype=bool)
    cov = np.full((p, p), np.nan)
    n, k = len(residuals), int(use.sum())
    if k == 0 or n <= k:
        return cov
    s2 = float(np.sum(np.asarray(residuals) ** 2)) / (n - k)
    sub = jac[:, use]
    cov[np.ix_(use, use)] = s2 * np.linalg.pinv(sub.T @ sub)
    return cov
