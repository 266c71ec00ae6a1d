"""Sweeps: declared design spaces, evaluated in chunks, into labeled xarray cubes.

    >>> import sweep
    >>> cube = sweep.run("configs/sweeps/default.toml")              # in memory
    >>> sweep.top_k(cube.sel(seq_len=4096), objective="mfu", k=5)  # best admissible, one job
    >>> sweep.run("configs/sweeps/calculon_gpt3.toml", path="gpt3.nc", n_jobs=2)  # streamed
    >>> cube = sweep.open_cube("gpt3.nc")                             # lazy
    >>> sweep.search("configs/sweeps/search_llama70b.toml", n_trials=1000, seed=0)  # optuna

A cube's dims are named like ``solver.solve``'s keywords, so any point goes
straight back to the solver (``sweep.grid.point(spec, coords)``).
"""

from .analysis import (NoAdmissibleError, best_along, explain_runner_up, pareto_front,
                       step_components, top_k, where_step_goes)
from .calibration import Calibration, calibrate, load_profile
from .evaluate import run
from .spec import (PrecisionWarning, ShadowedOutputWarning, Spec, SpecError, divisors, load_spec,
                   powers_of_two)
from .storage import IncompleteCubeError, open_cube, save

from .search import SearchResult, search

__all__ = [
    "load_spec",
    "Spec",
    "SpecError",
    "PrecisionWarning",
    "ShadowedOutputWarning",
    "run",
    "save",
    "open_cube",
    "IncompleteCubeError",
    "top_k",
    "best_along",
    "pareto_front",
    "NoAdmissibleError",
    "explain_runner_up",
    "where_step_goes",
    "step_components",
    "search",
    "SearchResult",
    "calibrate",
    "Calibration",
    "load_profile",
    "powers_of_two",
    "divisors",
]
