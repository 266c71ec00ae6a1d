"""The one fitting core: physics constants by bounded least squares in log space.

Used by :func:`sweep.calibrate` (a user's runs) and by
``benchmarks/fidelity.py`` (the published runs). The fitted variables are
``x = log(constant)``, so a constant stays positive and a residual's
sensitivity reads as a relative change; the bounds are each constant's
physical range (:data:`solver.physics.megatron.CONSTANT_BOUNDS`, a zero lower
bound taken as 1e-9). The optimizer is :func:`scipy.optimize.least_squares`
(trust-region reflective, finite-difference Jacobian).

A Gaussian prior on ``x`` (``prior_center``, ``prior_weight``) makes the fit a
maximum a posteriori one: the residuals gain a row ``prior_weight * (x_j -
log center_j)`` per fitted constant, a ridge that keeps a constant the runs
barely see near its center instead of letting a handful of runs drag it to a
bound [2].

The uncertainty is the linearized one: ``cov(x) = s^2 (J^T J)^-1`` with ``s^2 =
sum(r^2) / (n - p)`` [1] (:func:`covariance`), or with a prior, the Laplace
approximation of the posterior ``(J^T J / s^2 + w^2 I / noise^2)^-1`` [2]
(:func:`posterior_covariance`); a constant's standard deviation is
``constant * sqrt(cov(x)_jj)`` (the delta method).

References
----------
[1] Bates, D. M. and Watts, D. G. (1988), "Nonlinear Regression Analysis and Its
    Applications", Wiley, Sec. 2.3 (linear approximation inference regions).
[2] Gelman, A. et al. (2013), "Bayesian Data Analysis", 3rd ed., CRC, Sec. 4.1
    (normal approximation to the posterior) and Sec. 14.6 (a normal prior on
    regression coefficients is ridge regression).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

__all__ = ["LogFit", "fit_log", "log_bounds", "covariance", "posterior_covariance", "sensitivity", "FAILED_RESIDUAL",
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
    #: The solutions from the other starts (:func:`fit_log`'s ``other_starts``): one as close
    #: to the runs but far away says they do not tell some constants apart.
    rivals: tuple = ()


def log_bounds(names: Sequence[str], bounds: Mapping) -> tuple:
    """``(low, high)`` arrays of ``log`` of each constant's bounds."""
    lo = np.array([np.log(max(bounds[n][0], LOG_FLOOR)) for n in names])
    hi = np.array([np.log(bounds[n][1]) for n in names])
    return lo, hi


def _residual_fn(residuals: Callable, names, held, prior_x=None, prior_weight=0.0):
    def fn(x):
        constants = {**held, **{n: float(np.exp(v)) for n, v in zip(names, x)}}
        res = np.asarray(residuals(constants), dtype=np.float64)
        res = np.where(np.isfinite(res), res, FAILED_RESIDUAL)
        if prior_x is None:
            return res
        return np.concatenate([res, prior_weight * (x - prior_x)])
    return fn


def fit_log(residuals: Callable[[dict], np.ndarray], start: Mapping[str, float],
            names: Sequence[str], bounds: Mapping, *, held: Optional[Mapping] = None,
            diff_step: float = 1e-3, max_nfev: int = 300,
            prior_center: Optional[Mapping[str, float]] = None, prior_weight=0.0,
            other_starts: Sequence[Mapping[str, float]] = ()) -> LogFit:
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
    other_starts : sequence of mapping, optional
        More starting points, each as overrides of ``start`` (the prior stays
        centered where it is): the fit is run from each, and the solution of least
        cost (half the sum of squared residuals, prior rows included) is returned;
        the first of equal cost. A constant behind a ``max`` (a floor the runs are
        above at ``start``) has no slope there, so no fit started below it can
        find it.

    Returns
    -------
    LogFit
    """
    fits = [_fit_log(residuals, {**start, **overrides}, names, bounds, held, diff_step,
                     max_nfev, prior_center, prior_weight)
            for overrides in ({},) + tuple(other_starts)]
    best = min(range(len(fits)), key=lambda i: (_cost(fits[i]), i))  # the first of equal cost
    rivals = tuple(fit for i, fit in enumerate(fits) if i != best)
    return dataclasses.replace(fits[best], rivals=rivals)


def _cost(fit: LogFit) -> float:
    return 0.5 * float(np.sum(fit.residuals ** 2))


def _fit_log(residuals, start, names, bounds, held, diff_step, max_nfev, prior_center,
             prior_weight) -> LogFit:
    """:func:`fit_log` from one start."""
    from scipy.optimize import least_squares

    names = tuple(names)
    held = dict(held or {})
    prior_x = None
    weight = np.broadcast_to(np.asarray(prior_weight, dtype=np.float64), (len(names),))
    if prior_center is not None and np.any(weight > 0):
        prior_x = np.array([np.log(max(prior_center[n], LOG_FLOOR)) for n in names])
    fn = _residual_fn(residuals, names, held, prior_x, weight)
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


def posterior_covariance(jac: np.ndarray, residuals: np.ndarray, n_prior: int,
                         noise: float) -> np.ndarray:
    """``s^2 (J^T J)^-1`` of a MAP fit whose last ``n_prior`` rows are the prior's [2].

    ``J`` holds the prior rows (``prior_weight`` times the identity), so this is
    the Laplace approximation ``(J_data^T J_data / s^2 + w^2 I / noise^2)^-1``; ``s``
    is the larger of the stated ``noise`` and the data residuals' RMS (a fit worse
    than the stated noise widens the data's share of its uncertainty, not the prior's).

    Returns
    -------
    numpy.ndarray, shape (p, p)
        Covariance of ``x = log(constant)``.
    """
    jac = np.atleast_2d(jac)
    split = len(residuals) - n_prior
    data = np.asarray(residuals)[:split]
    rms2 = float(np.mean(data ** 2)) if data.size else 0.0
    s2 = max(noise ** 2, rms2)
    # The widening is the data's: the prior rows keep the stated noise, so no constant's
    # posterior is wider than its prior (scaling the whole matrix had widened the prior too).
    jd, jp = jac[:split], jac[split:]
    return np.linalg.pinv(jd.T @ jd / s2 + jp.T @ jp / noise ** 2)
