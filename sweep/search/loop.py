"""The ask/tell loop: batched trials, the study's budget, resume, and adoption of lost trials.

A worker asks a batch of trials, prices it (:func:`~sweep.search.pricing.price_trials`),
sets each trial's constraints and tells the study. Every trial records its
owner (``host:pid:token``); a RUNNING trial whose owner is gone is adopted and
priced with the parameters it was given (see :mod:`sweep.search`).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import uuid

import optuna
from optuna.trial import TrialState

from solver.physics import megatron

from .. import physics as physics_
from ..spec import SpecError
from .local import LocalMovesSampler
from .pricing import _Setup, price_trials
from .space import SearchSpace

__all__ = ["SAMPLERS", "STALE_AFTER", "make_sampler", "run", "signature"]

#: A RUNNING trial of another host (or of unknown owner) older than this [s]
#: is taken as abandoned and adopted by the next search call.
STALE_AFTER = 600.0

#: Names accepted by ``search(sampler=...)``.
SAMPLERS = ("tpe", "nsga2", "random", "grid")

OWNER_KEY = "search:owner"
ORIGIN_KEY = "search:origin"
SIGNATURE_KEY = "search:signature"
_HOST = socket.gethostname()
_LIVE_TOKENS: set = set()
_COUNTED = (TrialState.COMPLETE, TrialState.RUNNING)


def make_sampler(sampler, seed, space: SearchSpace, batch_size):
    """An optuna sampler from its name (or the sampler itself)."""
    if isinstance(sampler, optuna.samplers.BaseSampler):
        return sampler
    if sampler == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(2, batch_size))
    if sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if sampler == "grid":
        if not space.is_discrete:
            raise SpecError("sampler='grid' needs listed values on every axis, but the spec has "
                             "a continuous range (give it a step or num)")
        return _BatchGridSampler(space.grid(), seed=seed)
    raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)} or an optuna sampler, "
                     f"but got {sampler!r}")


class _BatchGridSampler(optuna.samplers.GridSampler):
    """optuna's GridSampler for ask/tell batches.

    Its ``after_trial`` calls ``study.stop()`` once the grid is exhausted,
    which optuna refuses outside ``study.optimize``; here the budget (the grid
    size) ends the search, so ``after_trial`` does nothing.
    """

    def after_trial(self, study, trial, state, values):
        return None


@contextlib.contextmanager
def quiet_optuna():
    """optuna's log at WARNING for the duration (it logs every told trial at INFO)."""
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(level)


def signature(setup: _Setup, space: SearchSpace) -> str:
    """What a stored study must match to be continued (callables are not compared)."""
    return json.dumps({
        "space": json.loads(space.signature()),
        "fixed": {k: v for k, v in setup.spec.fixed.items()},
        "workloads": sorted(setup.spec.workloads), "fleets": sorted(setup.spec.fleets),
        "objectives": [list(o) for o in setup.objectives],
        "limits": setup.limits, "max_accelerators": setup.spec.max_accelerators,
        "constraints": sorted(setup.constraints),
        # a calibrated study continues only with the same constants (no key when uncalibrated)
        **({"calibration": dict(setup.spec.calibration.solve_keywords())}
           if setup.spec.calibration is not None else {}),
        # the stored trials' values and constraints hold under the rules they were priced
        # by: the physics, the accelerator bounds and realizability (a key only where it
        # is not the default, so a study stored before these were keys still continues)
        **_rules(setup.spec),
    }, sort_keys=True, default=str)


def _rules(spec) -> dict:
    """The spec's rules a stored trial was priced and checked under, where not the defaults;
    and the megatron physics' constants where it prices (the shipped ones move with each
    refit, a calibration's with its profile; the mlsysim physics has none)."""
    rules = {"physics": list(spec.physics), "min_accelerators": spec.min_accelerators,
             "unbounded_cluster": spec.unbounded_cluster,
             "require_realizable": spec.require_realizable}
    defaults = {"physics": [physics_.DEFAULT_PHYSICS], "min_accelerators": None,
                "unbounded_cluster": False, "require_realizable": True}
    rules = {k: v for k, v in rules.items() if v != defaults[k]}
    if "megatron" in spec.physics:
        rules["megatron_constants"] = {**megatron.CONSTANTS,
                                       **physics_.calibrated(spec).get("megatron", {})}
    return rules


class _Owner:
    """This call's identity, written on every trial it asks."""

    def __init__(self):
        self.token = uuid.uuid4().hex[:12]
        self.id = f"{_HOST}:{os.getpid()}:{self.token}"

    def __enter__(self):
        _LIVE_TOKENS.add(self.token)
        return self

    def __exit__(self, *exc):
        _LIVE_TOKENS.discard(self.token)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_stale(trial) -> bool:
    """Whether a RUNNING trial's owner is gone (see :data:`STALE_AFTER`)."""
    owner = trial.user_attrs.get(OWNER_KEY)
    if isinstance(owner, str) and owner.count(":") >= 2:
        host, pid, token = owner.rsplit(":", 2)
        if host == _HOST and pid.isdigit():
            if int(pid) == os.getpid():
                return token not in _LIVE_TOKENS
            return not _pid_alive(int(pid))
    start = trial.datetime_start
    return start is None or (datetime.datetime.now() - start).total_seconds() > STALE_AFTER


def _n_counted(study) -> int:
    return len(study.get_trials(deepcopy=False, states=_COUNTED))


def _is_surplus(study, number: int, n_trials: int) -> bool:
    """Whether trial ``number`` would take the study past ``n_trials`` counted trials.

    Workers check the count and then ask, so two of them can both see room for the
    last trial. The storage numbers trials atomically, so the trials numbered below
    ``number`` that count (running or complete) say exactly whether this one fits;
    one that does not is told PRUNED, unpriced, and the study keeps exactly
    ``n_trials`` complete trials.
    """
    earlier = [t for t in study.get_trials(deepcopy=False, states=_COUNTED) if t.number < number]
    return len(earlier) >= n_trials


def _ask_batch(study, space: SearchSpace, size: int, n_trials: int, owner: str) -> list:
    """Up to ``size`` new trials (fewer if other workers fill the budget meanwhile)."""
    sampler = study.sampler
    if isinstance(sampler, LocalMovesSampler):
        sampler.begin_batch(study, size)
    batch = []
    for _ in range(size):
        if batch and _n_counted(study) >= n_trials:
            break
        trial = study.ask(space.distributions)
        if _is_surplus(study, trial.number, n_trials):
            study.tell(trial, state=TrialState.PRUNED)
            break
        trial.set_user_attr(OWNER_KEY, owner)
        if isinstance(sampler, LocalMovesSampler) and sampler.is_local(trial.number):
            trial.set_user_attr(ORIGIN_KEY, "local")
        batch.append(trial)
    return batch


def run(study, space: SearchSpace, setup: _Setup, *, n_trials, batch_size, progress) -> int:
    """Ask, price and tell batches until the study holds ``n_trials`` trials; new count."""
    bar = None
    if progress:
        from tqdm.auto import tqdm

        done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
        bar = tqdm(total=n_trials, initial=min(done, n_trials), desc=f"search {setup.spec.name}",
                   unit="trial")
    n_new = 0
    with _Owner() as owner:
        try:
            while True:
                n_new += _adopt(study, space, setup, bar)
                room = n_trials - _n_counted(study)
                if room <= 0:
                    break
                batch = _ask_batch(study, space, min(batch_size, room), n_trials, owner.id)
                if not batch:
                    break
                n_new += _tell(study, setup, space, batch)
                if bar is not None:
                    bar.update(len(batch))
        finally:
            if bar is not None:
                bar.close()
    return n_new


def _adopt(study, space, setup, bar) -> int:
    """Price RUNNING trials whose owner is gone; FAIL those missing parameters."""
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    stale = [t for t in running if _is_stale(t)]
    if not stale:
        return 0
    names = {p.name for p in space.params}
    whole = [t for t in stale if names <= set(t.params)]
    for t in stale:
        if not names <= set(t.params):
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
    n = _tell_adopted(study, setup, space, whole)
    if bar is not None:
        bar.update(n)
    return n


def _values(setup, values, i):
    return list(values[:, i]) if len(setup.objectives) > 1 else float(values[0, i])


def _tell(study, setup: _Setup, space: SearchSpace, batch: list) -> int:
    """Price trials this call asked (live ``Trial`` objects), set their constraints, tell."""
    if not batch:
        return 0
    values, constraints = price_trials(setup, space, [t.params for t in batch])
    for i, trial in enumerate(batch):
        for key, c in constraints[i].items():
            trial.set_constraint(key, c)
        study.tell(trial, _values(setup, values, i))
    return len(batch)


def _tell_adopted(study, setup: _Setup, space: SearchSpace, frozen: list) -> int:
    """Price RUNNING trials of a gone owner (``FrozenTrial`` s), set their constraints, tell."""
    if not frozen:
        return 0
    values, constraints = price_trials(setup, space, [t.params for t in frozen])
    running = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    told = 0
    for i, trial in enumerate(frozen):
        if trial.number not in running:
            continue  # another worker adopted it first
        try:
            live = _reopen(study, trial)
            for key, c in constraints[i].items():
                if key not in trial.constraints:
                    live.set_constraint(key, c)
            study.tell(trial.number, _values(setup, values, i), skip_if_finished=True)
            told += 1
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
    return told


def _reopen(study, trial) -> optuna.trial.Trial:
    """A live ``Trial`` for a RUNNING trial this process did not ask, to set its constraints.

    optuna 5 has no public way to set a constraint on such a trial:
    ``Study.tell`` takes no constraints, ``FrozenTrial.set_constraint`` changes
    only the copy, and re-creating the trial would renumber the study (resumed
    trials keep their numbers). ``optuna.trial.Trial(study, trial_id)`` is the
    public constructor, but the storage id it needs is only held privately by
    the ``FrozenTrial`` (``_trial_id``): the one private attribute used here.
    """
    return optuna.trial.Trial(study, trial._trial_id)
