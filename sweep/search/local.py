"""Local moves as a sampler wrapper: some trials are neighbours of the best, the rest the sampler's.

:class:`LocalMovesSampler` wraps an optuna sampler in the manner of optuna's
``PartialFixedSampler``. Trials come in batches; for a share of each batch
(``refine``) it proposes untried layouts one or two coordinate steps from the
best admissible trials instead of asking the inner sampler: a hill climb
restarted whenever the sampler finds better. The moves of a batch are chosen
when the batch begins (from the study as it stands, so the inner sampler's
trials of the same batch do not change them) and take the batch's last places,
so the inner sampler proposes first and sees the same history as without the
wrapper. They are ordinary trials, asked and told like the others; the search
marks them ``user_attrs["search:origin"] = "local"``.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np
from optuna.samplers import BaseSampler
from optuna.trial import TrialState

from .result import admissible

__all__ = ["LocalMovesSampler", "DEFAULT_REFINE", "LOCAL_INCUMBENTS"]

#: Share of each batch spent on local moves around the best trials (TPE, one objective).
DEFAULT_REFINE = 0.25

#: Local moves are drawn around this many of the best admissible trials.
LOCAL_INCUMBENTS = 8


def _params_key(params: Mapping[str, Any]) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in params.items()))


def local_moves(study, space, sign: float, n: int, rng, incumbents: int = LOCAL_INCUMBENTS):
    """Up to ``n`` untried trial parameters one or two coordinate moves from the best trials.

    The best admissible trial's single moves come first (in a random order),
    then its pair moves, then the next best trial's. ``sign`` is +1 when the
    (single) objective is maximized, -1 when minimized.
    """
    trials = study.get_trials(deepcopy=False)
    seen = {_params_key(t.params) for t in trials}
    good = [t for t in trials if t.state == TrialState.COMPLETE and admissible(t)]
    good.sort(key=lambda t: (-sign * t.value, t.number))
    chosen: list = []
    for incumbent in good[:incumbents]:
        for pairs in (False, True):  # single moves first, then moves of two parameters
            moves = [m for m in space.neighbors(incumbent.params, pairs=pairs)
                     if _params_key(m) not in seen]
            for i in rng.permutation(len(moves)):
                key = _params_key(moves[i])
                if key not in seen:
                    seen.add(key)
                    chosen.append(moves[i])
                    if len(chosen) == n:
                        return chosen
    return chosen


class LocalMovesSampler(BaseSampler):
    """A sampler that spends a share of each batch on neighbours of the best admissible trials.

    Parameters
    ----------
    inner : optuna.samplers.BaseSampler
        Proposes every trial that is not a local move.
    space : sweep.search.space.SearchSpace
        The searched parameters (their neighbours).
    refine : float
        Share of a batch in [0, 1]: ``round(refine * batch_size)`` local moves.
    batch_size : int
        Trials per batch, unless :meth:`begin_batch` says otherwise.
    sign : float
        +1 if the single objective is maximized, -1 if minimized.
    seed : int, optional
        Seeds the order in which moves are tried.
    """

    def __init__(self, inner: BaseSampler, space, *, refine: float, batch_size: int,
                 sign: float = 1.0, seed: Optional[int] = None) -> None:
        self.inner = inner
        self._space = space
        self._refine = float(refine)
        self._batch_size = int(batch_size)
        self._sign = float(sign)
        self._rng = np.random.default_rng(seed)
        self._size = 0          # trials of the current batch
        self._position = 0      # trials of it asked so far
        self._queue: list = []  # its local moves, served at its last places
        self._local: dict = {}  # trial number -> parameters, for this batch's local trials

    def begin_batch(self, study, size: Optional[int] = None) -> None:
        """The next ``size`` trials form one batch; choose its local moves now."""
        size = self._batch_size if size is None else int(size)
        n_local = min(size, int(round(self._refine * self._batch_size)))
        self._queue = (local_moves(study, self._space, self._sign, n_local, self._rng)
                       if n_local else [])
        self._size, self._position, self._local = size, 0, {}

    def is_local(self, number: int) -> bool:
        """Whether trial ``number`` of the current batch is a local move."""
        return number in self._local

    # optuna's sampler interface

    def before_trial(self, study, trial) -> None:
        if self._position >= self._size:
            self.begin_batch(study)
        position = self._position
        self._position += 1
        first_local = self._size - len(self._queue)
        if position >= first_local:
            self._local[trial.number] = self._queue[position - first_local]
            return
        self.inner.before_trial(study, trial)

    def infer_relative_search_space(self, study, trial) -> dict:
        if trial.number in self._local:
            return {}
        return self.inner.infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial, search_space) -> dict:
        if trial.number in self._local:
            return {}
        return self.inner.sample_relative(study, trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):
        move = self._local.get(trial.number)
        if move is not None and param_name in move:
            return move[param_name]
        return self.inner.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study, trial, state, values) -> None:
        if trial.number not in self._local:
            self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()
        self._rng = np.random.default_rng()
