"""Auto mode: exhaustive when the whole space prices within the time budget, sampled otherwise.

The decision is measured, not guessed: the exhaustive walk itself starts, and
after :data:`PROBE_SECONDS` of pricing its first blocks the rate so far gives
the time the whole walk would take. Within ``time_budget`` the walk simply goes
on (the probe's blocks are part of it, so nothing is priced twice); beyond it,
the walk stops and the sampled search runs instead. A space with a continuous
axis cannot be enumerated and is always sampled.
"""

from __future__ import annotations

import math
import time

__all__ = ["DEFAULT_TIME_BUDGET", "PROBE_SECONDS", "Probe", "duration", "MODES", "mode_name"]

#: Default wall-time budget of a search [s].
DEFAULT_TIME_BUDGET = 60.0
#: Pricing time after which the walk's rate decides auto mode [s].
PROBE_SECONDS = 0.5

#: Accepted spellings of ``mode`` -> the mode run (``"exact"``/``"sample"`` are aliases).
MODES = {"auto": "auto", "exhaustive": "exhaustive", "exact": "exhaustive",
         "sampled": "sampled", "sample": "sampled"}


def mode_name(mode) -> str:
    """The mode ``mode`` spells (``"auto"``, ``"exhaustive"`` or ``"sampled"``).

    Raises
    ------
    ValueError
        For an unknown spelling.
    """
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode must be 'sample' or 'exact' (aliases of 'sampled' and "
                         f"'exhaustive') or 'auto', but got {mode!r}")
    return MODES[mode]


def duration(seconds: float) -> str:
    """A readable duration: ``"1.7 s"``, ``"12 min"``, ``"2.4 h"``, ``"3.1 days"``."""
    if not math.isfinite(seconds):
        return "forever"
    if seconds < 120:
        return f"{seconds:.2g} s"
    if seconds < 7200:
        return f"{seconds / 60:.2g} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.2g} h"
    if seconds < 3 * 365 * 86400:
        return f"{seconds / 86400:.2g} days"
    return f"{seconds / (365 * 86400):.2g} years"


class Probe:
    """Called after each block of the walk: go on while the whole walk fits the budget.

    Parameters
    ----------
    time_budget : float [s]
    n_jobs : int
        Processes of the walk (the estimate divides by them only when the
        blocks were priced in parallel, i.e. the rate was measured so).

    Attributes
    ----------
    estimate : float [s]
        The time the whole walk would take, from the rate measured so far
        (``nan`` until measured).
    decided : bool
        The estimate fit the budget: the walk goes on to its end.
    """

    def __init__(self, time_budget: float, probe_seconds: float = PROBE_SECONDS):
        self.time_budget = float(time_budget)
        self.probe_seconds = float(probe_seconds)
        self.began = time.perf_counter()
        self.estimate = math.nan
        self.decided = False
        self.n_priced = 0

    def __call__(self, n_priced: int, size: int) -> bool:
        if self.decided:
            return True
        elapsed = time.perf_counter() - self.began
        self.n_priced = n_priced
        self.estimate = elapsed * size / max(n_priced, 1)
        if elapsed < self.probe_seconds and n_priced < size:
            return self.estimate <= 10 * self.time_budget  # hopeless already: stop early
        self.decided = self.estimate <= self.time_budget
        return self.decided
