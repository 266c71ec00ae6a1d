"""Layout search: the best layout under a memory limit, exact where it can be, sampled where it must.

``search(spec)`` runs in one of two modes and says which and why
(:attr:`SearchResult.reason`):

* **exhaustive**: every grid point priced in blocks (:func:`sweep.grid.blocks`)
  keeping a running top-k (or Pareto set): the true optimum (the exact front);
* **sampled**: optuna proposes starting layouts and, around each, whole
  sub-grids are priced in one ``solver.solve`` call each until no group of axes
  improves (:mod:`sweep.search.subgrid`), stopped by evidence; or, given
  ``n_trials`` (or another sampler, several objectives, ``refine``), the
  classic ask/tell loop of that many trials.

``mode="auto"`` (the default) starts the exhaustive walk and measures its rate:
if the whole space prices within ``time_budget`` (60 s) the walk goes on to the
exact answer, else the search samples (:mod:`sweep.search.auto`).

    >>> from sweep.search import search
    >>> result = search("configs/sweeps/search_llama70b.toml", seed=0)
    >>> result.reason                                 # doctest: +SKIP
    'exhaustive: 4.4e+08 layouts, 45 s (estimated 48 s, within the time budget 60 s)'
    >>> print(result.summary())                        # doctest: +SKIP

Design choices
--------------
Constraints
    Every trial carries optuna 5 constraint values, set with
    ``Trial.set_constraint`` before ``study.tell`` (``constraints_func`` is
    deprecated in optuna 5); a trial is admissible (optuna says "feasible")
    when all are <= 0. TPE, NSGA-II and GP read them from the trial, and
    ``study.best_trial(s)`` only returns admissible trials. The constraints are unitless so that a sampler summing
    violations weighs them alike:

    * ``split``: 0 for a possible split, 1 where TP*PP*EP does not divide the
      fleet (or, with a ``dp_size`` axis, the layout is not whole nodes);
    * ``memory``: ``(memory_footprint - limit) / limit``, the sign of
      ``memory_footprint - limit``;
    * ``accelerators`` (with ``max_accelerators``, by default the fleet's size
      when ``dp_size`` sizes the cluster): ``(n_accelerators - max) / max``;
    * ``min_accelerators`` (with ``min_accelerators``): ``(min - n_accelerators) / min``;
    * ``realizable`` (unless ``require_realizable`` is false): 0 where the
      batch splits into whole microbatches with no idle ranks, else 1;
    * one per extra constraint function passed in ``constraints``.

Impossible splits are rejected, not parameterized away
    Whether TP*PP*EP divides the fleet (or DP*TP*PP*EP fills whole nodes) is a
    joint condition on several axes. Drawing TP, PP and EP "among divisors"
    would need each draw to depend on the earlier ones: a conditional,
    trial-dependent search space, which breaks the multivariate TPE's fixed
    joint space, NSGA-II's crossover and the grid sampler, and would no longer
    be the spec's space. So every axis is drawn independently over the spec's
    values and an impossible split is told to the study as infeasible
    (``split`` = 1, ``memory`` = 1: never priced, its memory unknown) with a
    penalty value (``-PENALTY`` when maximizing, ``+PENALTY`` when
    minimizing). Samplers learn to avoid the region; such trials never appear
    in ``best_params``, ``top`` or the Pareto set.

Budget, resume and parallel workers
    ``n_trials`` is the number of priced trials the *study* should hold when
    the call returns, counted across runs and workers (optuna's
    ``MaxTrialsCallback`` convention, not ``optimize``'s per-call count). So a
    killed search resumes by re-running the same call: it adds only the
    missing trials. Several processes sharing a journal file (or machines
    sharing an RDB) each run the same call and together fill the budget;
    before each ask a worker counts finished and running trials, so racing
    workers overshoot it by less than one batch per extra worker.

    Trials asked but never told (a SIGKILL'd worker, an exception in this
    process) stay RUNNING in the storage. Each trial records its owner
    (``host:pid:token``); a later call adopts the RUNNING trials whose owner is
    gone (a dead process on this host, a finished call of this process, or,
    from another host, older than :data:`STALE_AFTER`) and prices them with
    the parameters they were given, so no sampled trial is lost or counted
    twice. A trial killed before all its parameters were written is marked
    FAIL (it was never priced and is not counted).

Local moves
    Optuna's TPE proposes each trial in ~10 ms while ``solver.solve`` prices a
    batch in ~1 ms, and in spaces of many discrete axes TPE alone often stalls
    a few per cent short of the optimum (a coupled move such as TP halved and
    DP doubled is rare under its density model). So by default the sampler is
    wrapped in :class:`~sweep.search.local.LocalMovesSampler`: a quarter of
    each batch (``refine``) goes to untried layouts one or two coordinate
    steps from the best admissible trials, a hill climb restarted whenever the
    sampler finds better; these are ordinary, counted trials (asked and told
    like the others, marked ``user_attrs["search:origin"] = "local"``).
    On the benchmark's 10^6-layout spaces, after 1000 evaluations over 5
    seeds, plain TPE reaches 97.2-100 % of the optimum, TPE with local moves
    the optimum itself in every seed (``benchmarks/bench_search.py``).
    ``refine=0`` is plain TPE.

When to search, when to sweep
    The solver prices ~10^6-10^7 layouts/s on an open mesh while optuna's TPE
    takes ~10 ms per proposal (its cost grows with the history). So auto mode
    sweeps whatever prices within the time budget (10^8-10^9 layouts), and the
    sampled search spends optuna's proposals only on starting points: on the
    4.4e8-layout ``configs/sweeps/search_llama70b.toml`` ``mode="sampled"``
    reaches the exhaustive optimum on each of 5 seeds in 0.46-0.62 s, against
    44.6-48.5 s for the walk auto chooses there (2 cores, 2026-12-06:
    ``benchmarks/results/bench_search_example.json``, written by
    ``python benchmarks/bench_search.py --example``).

Seeds
    ``seed`` seeds the sampler and the local moves: the same seed, spec and batch size give the
    same trial sequence and the same best layout (in one process, from an
    empty study). A resumed study continues with a freshly seeded sampler, so
    it is not the same sequence as an uninterrupted run. Parallel workers
    should get different seeds (or ``None``), else their random start-up
    trials coincide.

Modules
-------
:mod:`~sweep.search.space` (axes as optuna distributions),
:mod:`~sweep.search.pricing` (a batch priced: objectives, constraints),
:mod:`~sweep.search.loop` (ask/tell, resume, adoption),
:mod:`~sweep.search.local` (the local-moves sampler),
:mod:`~sweep.search.exhaustive` (exact mode),
:mod:`~sweep.search.result` (:class:`SearchResult`),
:mod:`~sweep.search.reference` (the reference optimizer's space),
:mod:`~sweep.search.storage` (:func:`open_storage`).
"""

from __future__ import annotations

import hashlib
import time
import warnings
from pathlib import Path
from typing import Callable, Mapping, Optional

import numpy as np
import optuna

from solver.blocks import BLOCK_POINTS

from ..analysis.scenarios import warn_across_jobs
from ..analysis.utilization import warn_across_models, warn_across_precisions
from ..calibration.profile import with_calibration
from ..physics import check_shapes
from ..spec import SpecError, load_spec
from .auto import DEFAULT_TIME_BUDGET, MODES, Probe, duration, mode_name
from .exhaustive import exact as _exact
from .local import DEFAULT_REFINE, LocalMovesSampler
from .loop import SAMPLERS, SIGNATURE_KEY, STALE_AFTER, make_sampler, quiet_optuna, run, signature
from .pricing import (DEFAULT_DIRECTIONS, DERIVED, PENALTY, _Setup, parse_objectives,
                      resolve_memory_limit)
from .reference import ReferenceSpace, reference_optimizer_space, reproduce_reference_optimizer
from .result import SearchResult, study_result
from .space import SearchSpace, build_space, index_encoded
from .storage import JOURNAL_SUFFIXES, StorageError, open_storage
from .subgrid import DEFAULT_PATIENCE, Evidence, refine_search

__all__ = [
    "search",
    "SearchResult",
    "resolve_memory_limit",
    "open_storage",
    "StorageError",
    "DEFAULT_DIRECTIONS",
    "DERIVED",
    "PENALTY",
    "STALE_AFTER",
    "SAMPLERS",
    "DEFAULT_REFINE",
    "DEFAULT_TIME_BUDGET",
    "DEFAULT_PATIENCE",
    "MODES",
    "Evidence",
    "LocalMovesSampler",
    "SearchSpace",
    "build_space",
    "ReferenceSpace",
    "reference_optimizer_space",
    "reproduce_reference_optimizer",
]

#: Trials per batch by default (see ``search``'s ``batch_size``).
DEFAULT_BATCH_SIZE = 16
#: Priced trials a study holds by default (the grid size for ``sampler="grid"``).
DEFAULT_TRIALS = 256


def _alias(new, old, old_name: str, new_name: str):
    """``new``, or the deprecated keyword's value ``old`` when given (with a DeprecationWarning)."""
    if old is None:
        return new
    warnings.warn(f"search({old_name}=...) is deprecated: use {new_name}=...",
                  DeprecationWarning, stacklevel=3)
    return old


def _whole(name, value, low=1):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be a whole number >= {low}, but got {value!r}")
    return int(value)


def search(spec, *, n_trials: Optional[int] = None, seed: Optional[int] = None,
           memory_limit=None, objective: str = "mfu", direction: Optional[str] = None,
           objectives=None, sampler="tpe", batch_size: Optional[int] = None, storage=None,
           study_name: Optional[str] = None, load_if_exists: bool = True, k: int = 10,
           mode: str = "auto", progress=None, derive: Optional[Callable] = None,
           constraints: Optional[Mapping[str, Callable]] = None, refine: Optional[float] = None,
           block_points: Optional[int] = None, n_jobs: int = 1, top_k: Optional[int] = None,
           max_points: Optional[int] = None, time_budget: Optional[float] = None,
           patience: Optional[int] = None,
           require_realizable: Optional[bool] = None, calibration=None) -> SearchResult:
    """Search a spec's layouts for the best objective under a memory limit.

    Parameters
    ----------
    spec : Spec, dict or TOML path
        The space: its axes are searched (listed values, integer ranges,
        ordered choices such as powers of two, continuous float ranges), its
        ``fixed`` knobs held, its constraints applied.
    n_trials : int, optional
        A fixed trial budget for the classic ask/tell loop (see ``mode``):
        priced trials the study should hold when the call returns, counted
        across runs and workers (a resumed or parallel call adds only the
        missing ones); for ``sampler="grid"`` the grid size by default.
        Without it, the sampled search stops by evidence.
    seed : int, optional
        Seeds the sampler, the local moves and the refinement (same seed, same
        trial sequence and result).
    memory_limit : None, float, str or sweep.limits.MemoryLimit
        Per-accelerator limit, as :func:`sweep.limits.parse_memory_limit`
        reads it: a size such as ``"72 GB"``, a fraction (0 < x <= 1) of the
        accelerator's capacity, or bytes (>= 1e6). ``None``: the spec's
        ``constraints.memory_limit``, else the capacity.
    objective : str
        An output of ``solver.solve`` (``mfu``, ``effective_throughput``,
        ``step_latency_total``, ...) or a derived quantity of
        :data:`solver.outputs.DERIVED` (``n_accelerators``,
        ``memory_headroom``, ``exposed_dp_time``). Default ``mfu``.
    direction : {"maximize", "minimize"}, optional
        Default: the registry's (:func:`solver.outputs.better`).
    objectives : mapping or list, optional
        Several objectives (a Pareto search), e.g.
        ``{"mfu": "maximize", "n_accelerators": "minimize"}``; replaces
        ``objective``/``direction`` (``"max"``/``"min"`` are deprecated
        spellings).
    sampler : {"tpe", "nsga2", "random", "grid"} or optuna sampler
        TPE by default (it proposes the starts of the sub-grid search); any
        other sampler runs the classic loop, NSGA-II with ``batch_size`` as
        its population.
    batch_size : int, optional
        Classic loop: trials asked, priced in one ``solver.solve`` call, then
        told (default 16).
    storage : None, str or optuna storage
        In memory by default; a journal file path (``*.log``, ``*.jsonl``,
        ``journal:///path``) for several local processes; an RDB URL for
        several machines (see :func:`open_storage`).
    study_name : str, optional
        Default: the spec's name, the objectives and a hash of the space and
        constraints, so that re-running the same search resumes it.
    load_if_exists : bool
        Continue a study of that name in the storage (its space and
        objectives must match).
    k : int
        Distinct admissible layouts to report (``top_k`` is its deprecated name).
    mode : {"auto", "exhaustive", "sampled"}
        ``"auto"`` (default) starts the exhaustive walk and measures its rate
        (:mod:`sweep.search.auto`): if the whole space prices within
        ``time_budget`` it is walked to the end (the exact optimum, or the
        exact Pareto front), else it is sampled; giving ``n_trials`` or
        ``storage`` (asking for an optuna study) samples. ``"exhaustive"`` prices
        every grid point in blocks of at most ``block_points``, keeping a
        running top-k (or Pareto set); ``n_trials``, ``sampler``, ``seed`` and
        ``storage`` are then unused. ``"sampled"`` searches with optuna: with
        one objective, TPE and no ``n_trials``, by sub-grid refinement
        stopped by evidence (:mod:`sweep.search.subgrid`); otherwise the
        classic loop of ``n_trials`` trials. ``"exact"`` and ``"sample"``
        are aliases. :attr:`SearchResult.reason` says which ran and why.
    progress : bool, optional
        Show a tqdm progress bar.
    derive : callable, optional
        ``derive(knobs, workload, fleet) -> dict`` of knobs computed from the
        others (arrays in, arrays out), applied before each ``solve`` (e.g. a
        microbatch count tied to the DP degree).
    constraints : mapping of str -> callable, optional
        Extra constraints ``fn(outputs, knobs, workload, fleet) -> array``,
        admissible where <= 0.
    refine : float, optional
        Classic loop: share of each batch spent on local moves
        (:class:`~sweep.search.local.LocalMovesSampler`). Default 0.25 with
        TPE on a single objective, else 0; must be 0 with the grid. Giving it
        selects the classic loop.
    block_points : int, optional
        Grid points per block in exhaustive mode (default
        :data:`solver.blocks.BLOCK_POINTS`; ``max_points`` is its deprecated name).
    n_jobs : int
        Processes for exhaustive mode (joblib); 1 runs in this process.
    time_budget : float, optional [s]
        Wall time auto mode allows the exhaustive walk, and after which the
        sub-grid search starts no new round. Default 60 s.
    patience : int, optional
        Sub-grid search: rounds without a better best after which it stops
        (default :data:`~sweep.search.subgrid.DEFAULT_PATIENCE`).
    require_realizable : bool, optional
        Whether a layout must be realizable (whole microbatches, no idle
        ranks) to be admissible; None: the spec's
        ``constraints.require_realizable`` (default true).

    calibration : str, pathlib.Path or sweep.calibration.Profile, optional
        Price with a calibration profile's physics and constants (replaces the
        spec's ``calibration``; see :func:`sweep.calibrate`).

    Returns
    -------
    SearchResult

    Raises
    ------
    ValueError
        For an unknown objective, direction, sampler, mode or storage, a bad
        memory limit, or a stored study whose space differs from this one.
    """
    started = time.perf_counter()
    k = _whole("top_k" if top_k is not None else "k", _alias(k, top_k, "top_k", "k"))
    block_points = _alias(block_points, max_points, "max_points", "block_points")
    if seed is not None:  # numpy seeds the sampler: 0 .. 2**32 - 1, refused in every mode
        seed = _whole("seed", seed, low=0)
        if seed >= 2 ** 32:
            raise ValueError(f"seed must be a whole number in [0, 2**32 - 1], but got {seed!r}")
    chosen = mode_name(mode)
    time_budget = _budget(time_budget)
    spec = with_calibration(load_spec(spec), calibration)
    spec = spec.with_constraints(require_realizable=require_realizable)
    objs = parse_objectives(objective, direction, objectives)
    check_objectives_of_models(spec, objs)
    _warn_utilization_across_precisions(spec, objs)
    check_shapes(spec)  # once, here: the trials price with warn=False
    limits = {label: resolve_memory_limit(memory_limit, spec, fleet)
              for label, fleet in spec.fleets.items()}
    setup = _Setup(spec=spec, objectives=objs, limits=limits, derive=derive,
                   constraints=dict(constraints or {}))
    block_points = _whole("block_points", BLOCK_POINTS if block_points is None else block_points)
    if refine is not None:  # refused whatever the mode, not only when sampling
        refine = _refine(refine, sampler, objs)
    _check_storage(storage)
    reason = "sampled: asked for (mode='sampled')"
    if chosen == "exhaustive":
        result = _exact(setup, k=k, block_points=block_points, n_jobs=n_jobs, progress=progress,
                        started=started)
        result.reason = f"exhaustive: asked for; {spec.size:.3g} layouts, " \
                        f"{duration(result.elapsed)}"
        return result
    if chosen == "auto":
        continuous = [a.name for a in spec.axes if a.is_continuous]
        study = [name for name, value in (("n_trials", n_trials), ("storage", storage))
                 if value is not None]
        if continuous:
            reason = (f"sampled: the continuous axis {', '.join(continuous)} cannot be "
                      f"enumerated")
        elif study:  # a study of trials was asked for: an exhaustive walk would ignore it
            reason = f"sampled: an optuna study was asked for ({', '.join(study)})"
        else:
            probe = Probe(time_budget)
            result = _exact(setup, k=k, block_points=block_points, n_jobs=n_jobs,
                            progress=progress, started=started, probe=probe)
            if result is not None:
                result.reason = (f"exhaustive: {spec.size:.3g} layouts, "
                                 f"{duration(result.elapsed)} (estimated "
                                 f"{duration(probe.estimate)}, within the time budget "
                                 f"{duration(time_budget)})")
                return result
            reason = (f"sampled: {spec.size:.3g} layouts would take "
                      f"{duration(probe.estimate)} to price (time budget "
                      f"{duration(time_budget)})")
    return _sampled(setup, spec, objs, reason=reason, n_trials=n_trials, seed=seed,
                    sampler=sampler, batch_size=batch_size, storage=storage,
                    study_name=study_name, load_if_exists=load_if_exists, k=k,
                    progress=progress, refine=refine, started=started,
                    time_budget=max(0.0, time_budget - (time.perf_counter() - started)),
                    patience=patience)


def check_objectives_of_models(spec, objs) -> None:
    """Refuse an objective that is an output of another physics model than the spec's: the
    models' outputs differ (mlsysim's node_energy, megatron's cp_communication_latency...),
    and an output no point has cannot rank any."""
    from solver.outputs import REGISTRY, outputs_of
    from solver.physics import PHYSICS

    for name, _ in objs:
        if name not in REGISTRY:
            continue  # a derived quantity: every model's
        missing = [m for m in spec.physics if name not in outputs_of(m)]
        if missing:
            owners = [m for m in spec.physics if m not in missing] or [
                m for m in PHYSICS if name in outputs_of(m)]
            raise ValueError(
                f"objective {name!r} is no output of the {' and '.join(missing)} model, which "
                f"prices spec {spec.name!r}"
                + (f" beside {' and '.join(owners)}: search one model (sweep.load_spec(spec, "
                   f"physics={owners[0]!r}); on the command line --physics {owners[0]})" if len(missing) < len(spec.physics)
                   else f"; it is the {' and '.join(owners)} model's")
                + f" (outputs: solver.outputs.outputs_of({missing[0]!r}))")


def _warn_utilization_across_precisions(spec, objs) -> None:
    """Warn when a utilization objective would rank a precision axis of mixed widths
    (:mod:`sweep.analysis.utilization`)."""
    axis = next((a for a in spec.axes if a.name == "precision"), None)
    warn_across_precisions([name for name, _ in objs], None if axis is None else axis.values,
                           stacklevel=4)
    models = next((a for a in spec.axes if a.name == "physics"), None)
    warn_across_models(None if models is None else models.values, stacklevel=4)
    warn_across_jobs(spec.axes, stacklevel=4)


def _check_storage(storage) -> None:
    """Refuse a storage :func:`open_storage` would refuse, whatever the mode (opens nothing)."""
    from optuna.storages import BaseStorage

    if storage is None or isinstance(storage, BaseStorage):
        return
    text = str(storage) if isinstance(storage, (str, Path)) else None
    if text is not None and (text.startswith("journal://") or "://" in text
                             or text.endswith(JOURNAL_SUFFIXES)):
        return
    open_storage(storage)  # raises ValueError naming the accepted forms


def _budget(time_budget) -> float:
    if time_budget is None:
        return DEFAULT_TIME_BUDGET
    if isinstance(time_budget, bool) or not isinstance(time_budget, (int, float)) \
            or not time_budget > 0 or not np.isfinite(time_budget):
        raise ValueError(f"time_budget must be a positive, finite number of seconds, "
                         f"but got {time_budget!r}")
    return float(time_budget)


def _sampled(setup, spec, objs, *, reason, n_trials, seed, sampler, batch_size, storage,
             study_name, load_if_exists, k, progress, refine, started, time_budget,
             patience) -> SearchResult:
    """Sampled mode: the sub-grid search, or the classic loop of ``n_trials`` trials."""
    space = build_space(spec)
    if not space.params:
        raise SpecError(f"spec {spec.name!r} has no axis with more than one value: nothing to "
                         f"search (price it with solver.solve)")
    subgrid = (n_trials is None and refine is None and sampler == "tpe" and len(objs) == 1)
    batch_size = _whole("batch_size", DEFAULT_BATCH_SIZE if batch_size is None else batch_size)
    if not subgrid:
        n_trials = _whole("n_trials", (space.size if sampler == "grid" else DEFAULT_TRIALS)
                          if n_trials is None else n_trials)
        if sampler == "grid":
            n_trials = min(n_trials, int(space.size))
        refine = _refine(refine, sampler, objs)
    patience = _whole("patience", DEFAULT_PATIENCE if patience is None else patience)
    with quiet_optuna(), warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study = _open_study(setup, space, sampler, seed=seed, batch_size=batch_size,
                            refine=0.0 if subgrid else refine, storage=storage,
                            study_name=study_name, load_if_exists=load_if_exists)
        if subgrid:
            before = len(study.trials)
            evidence = refine_search(study, space, setup, seed=seed, time_budget=time_budget,
                                     patience=patience)
            result = study_result(study, space, setup, n_new=evidence.n_priced, k=k,
                                  started=started, sampler="tpe+subgrid",
                                  reason=f"{reason}; sub-grid refinement of optuna's "
                                         f"proposals, {len(study.trials) - before} trials "
                                         f"recorded")
            result.n_evaluated = evidence.n_priced + before
            result.evidence = evidence
            return result
        n_new = run(study, space, setup, n_trials=n_trials, batch_size=batch_size,
                    progress=progress)
        return study_result(study, space, setup, n_new=n_new, k=k, started=started,
                            sampler=sampler if isinstance(sampler, str)
                            else type(sampler).__name__,
                            reason=f"{reason}; {n_trials} optuna trials")


def _refine(refine, sampler, objs) -> float:
    if refine is None:
        refine = DEFAULT_REFINE if (sampler == "tpe" and len(objs) == 1) else 0.0
    if isinstance(refine, bool) or not isinstance(refine, (int, float)) or not 0 <= refine <= 1:
        raise ValueError(f"refine must be a share of the batch in [0, 1], but got {refine!r}")
    if refine and (sampler == "grid" or len(objs) > 1):
        raise ValueError(f"refine applies to a single objective with a sampler other than the "
                         f"grid, but got refine={refine} with "
                         f"{'several objectives' if len(objs) > 1 else 'the grid'}")
    return float(refine)


def _signature_difference(stored: str, sig: str) -> str:
    """Which keys of two study signatures differ, and how (their JSON had been printed whole,
    a constant apart in two blobs of hundreds of characters)."""
    import json

    try:
        a, b = json.loads(stored), json.loads(sig)
    except ValueError:
        return f"expected {stored}, but got {sig}"
    def shown(value):  # (a dict against nothing: its size, not its hundreds of characters)
        return f"{len(value)} values" if isinstance(value, dict) else repr(value)

    parts = []
    for key in sorted(set(a) | set(b)):
        if a.get(key) == b.get(key):
            continue
        old, new = a.get(key), b.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            inner = [f"{key}.{k}: stored {old.get(k)!r}, now {new.get(k)!r}"
                     for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
            parts += inner[:4] + ([f"... {len(inner) - 4} more"] if len(inner) > 4 else [])
        else:
            # a key only where it is not the default (loop._rules): absent is the default,
            # or, stored, a study of a version that did not record it
            was = shown(old) if key in a else "not recorded (the default, or a version before the key)"
            now = shown(new) if key in b else "the default"
            parts.append(f"{key}: stored {was}, now {now}")
    return "; ".join(parts) or f"expected {stored}, but got {sig}"


def _open_study(setup, space, sampler, *, seed, batch_size, refine, storage, study_name,
                load_if_exists) -> optuna.Study:
    """Create or load the study; refuse one stored for another space or objectives."""
    sig = signature(setup, space)
    if study_name is None:
        digest = hashlib.sha256(sig.encode()).hexdigest()[:10]
        study_name = f"{setup.spec.name}:{'+'.join(setup.names)}:{digest}"
    sampler_obj = make_sampler(sampler, seed, space, batch_size)
    if refine:
        sampler_obj = LocalMovesSampler(sampler_obj, space, refine=refine, batch_size=batch_size,
                                        sign=float(setup.signs[0]), seed=seed)
    study = optuna.create_study(storage=open_storage(storage), sampler=sampler_obj,
                                study_name=study_name, load_if_exists=load_if_exists,
                                directions=[d for _, d in setup.objectives])
    stored = study.user_attrs.get(SIGNATURE_KEY)
    if stored is None:
        study.set_user_attr(SIGNATURE_KEY, sig)
    elif stored != sig and index_encoded(stored):
        raise StorageError(f"study {study_name!r} in this storage was written with the former "
                         f"position encoding ({', '.join(index_encoded(stored))}: positions in "
                         f"the sorted values), but this version stores the knob values "
                         f"themselves; start a new study (another study_name or storage) and "
                         f"search again; the old study stays readable with optuna")
    elif stored != sig:
        raise StorageError(f"study {study_name!r} in this storage was created for another "
                           f"space or objectives: {_signature_difference(stored, sig)}; start a "
                           f"new study (another study_name or storage) or search as it was")
    return study
