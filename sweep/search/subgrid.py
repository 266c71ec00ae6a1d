"""Sampled search that prices whole sub-grids: optuna proposes starts, exhaustive refinement climbs.

Pricing a layout costs about a microsecond on an open mesh, while optuna's TPE
spends ~10 ms proposing one. So here optuna proposes only a few *starting*
layouts per round, and around each start the search prices whole sub-grids
exhaustively, one ``solver.solve`` call each:

1. A round asks the study for ``starts`` layouts (TPE, batched) and prices
   them; one more start is the best incumbent with a few axes redrawn at
   random (an iterated local search).
2. From each start, *block coordinate ascent*: the axes are shuffled and packed
   into groups whose full product is at most ``subgrid_points`` layouts; each
   group is priced as an open mesh with the other axes held at the incumbent,
   and the incumbent moves to the best admissible point of the mesh. A pass
   covers every axis; passes repeat (regrouped at random, so coupled axes such
   as TP and PP meet in one mesh) until two passes in a row improve nothing.
   A continuous axis is a line of :data:`FLOAT_POINTS` values over its range,
   plus a finer line around the incumbent.
3. Each refined layout is recorded in the study as an ordinary trial
   (enqueued, asked, its constraints set, told; ``user_attrs["search:origin"]
   = "refined"``), so optuna holds the proposals and the local optima: TPE
   learns from both, and the study can be stored, resumed, shared and shown
   by optuna-dashboard. The sub-grids themselves (millions of layouts) are
   not recorded.
4. The search stops by evidence: when the best has not improved for
   ``patience`` rounds, or when ``time_budget`` is spent. The evidence
   (best so far against layouts priced, how many refined restarts reached the
   best) is returned with the result.

Every constraint of the classic loop applies (a possible split, the memory
limit, the accelerator budget, extra constraints, and ``realizable`` when the
solver reports it); an inadmissible point is never an incumbent.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from optuna.trial import TrialState

from .loop import OWNER_KEY, ORIGIN_KEY, _Owner
from .pricing import _price, _Setup, price_trials
from .space import SearchSpace

__all__ = ["Evidence", "refine_search", "DEFAULT_PATIENCE", "DEFAULT_STARTS",
           "DEFAULT_SUBGRID_POINTS", "FLOAT_POINTS"]

#: Rounds without a better best after which the search stops.
DEFAULT_PATIENCE = 4
#: Layouts optuna proposes per round (one more start perturbs the incumbent).
DEFAULT_STARTS = 4
#: Largest sub-grid priced in one ``solve`` call [layouts].
DEFAULT_SUBGRID_POINTS = 1 << 15
#: Values of a continuous axis on one line of the refinement.
FLOAT_POINTS = 33

_LABELS = ("workload", "fleet")
_REL_TOL = 1e-12


#: A sub-grid search stops once it has priced this many times the space's size: the
#: sub-grids overlap, so past it the rounds mostly price layouts again (a sampled search
#: of a space of 61,440 had spent its whole 60 s budget on 83 million pricings).
COVER = 4


@dataclass
class Evidence:
    """Why a sampled search stopped, and how sure it is.

    Attributes
    ----------
    history : list of (int, float, float)
        ``(layouts priced, seconds, best value)`` each time the best improved
        (best as the study states it: the first objective, in its direction).
    rounds : int
        Rounds run (each: optuna's proposals, then refinement from each).
    restarts : int
        Refinements run (one per start).
    agree : int
        Refinements that ended at the best value.
    stale_rounds : int
        Rounds since the best last improved.
    stopped_by : str
        ``"patience"`` (no better best for ``patience`` rounds), ``"time"``, or
        ``"covered"`` (the pricings reached :data:`COVER` times the space's size: an
        exhaustive walk would have cost less, and more rounds would price the same
        layouts again).
    n_priced : int
        Layouts priced, sub-grids included.
    """

    history: list = field(default_factory=list)
    rounds: int = 0
    restarts: int = 0
    agree: int = 0
    stale_rounds: int = 0
    stopped_by: str = ""
    n_priced: int = 0
    patience: int = DEFAULT_PATIENCE

    def summary(self) -> str:
        """One line: what was priced, since when the best holds, how many restarts agree."""
        last = self.history[-1] if self.history else (0, 0.0, math.nan)
        why = {"patience": f"no better layout in the last {self.stale_rounds} rounds "
                           f"(patience {self.patience})",
               "covered": f"the pricings reached {COVER} times the space's size (sub-grids "
                          f"price a layout again; mode='exhaustive' prices each once)",
               }.get(self.stopped_by, "the time budget was spent")
        return (f"evidence: {self.n_priced:.3g} layout pricings in {self.rounds} rounds, "
                f"{self.restarts} refined restarts; best found after {last[0]:.3g} layouts "
                f"({last[1]:.3g} s), reached by {self.agree} of {self.restarts} restarts; "
                f"stopped: {why}")


class _Lines:
    """Each searched axis as an array of candidate values (a line of a continuous one)."""

    def __init__(self, space: SearchSpace):
        self.params = [p for p in space.params]
        self.values = {}
        for p in self.params:
            if p.encoding == "float":
                d = p.distribution
                grid = (np.geomspace(d.low, d.high, FLOAT_POINTS) if d.log
                        else np.linspace(d.low, d.high, FLOAT_POINTS))
                self.values[p.axis] = grid
            else:
                self.values[p.axis] = np.asarray(p.grid(), dtype=object)

    def line(self, p, current) -> np.ndarray:
        """Candidate values of ``p`` with the others held: its grid (and, if continuous,
        a finer line around ``current``)."""
        grid = self.values[p.axis]
        if p.encoding != "float":
            return grid
        d = p.distribution
        if d.log:
            ratio = (d.high / d.low) ** (1.0 / (FLOAT_POINTS - 1))
            fine = np.geomspace(max(d.low, current / ratio), min(d.high, current * ratio), 17)
        else:
            step = (d.high - d.low) / (FLOAT_POINTS - 1)
            fine = np.linspace(max(d.low, current - step), min(d.high, current + step), 17)
        return np.unique(np.concatenate([grid, fine, [current]]))


def _typed(values: np.ndarray) -> np.ndarray:
    """An object array of plain values as a numeric (or string) array for ``solve``."""
    return np.array(values.tolist())


class _Climber:
    """Block coordinate ascent of one objective over sub-grids priced in one call each."""

    def __init__(self, setup: _Setup, space: SearchSpace, rng, subgrid_points: int):
        self.setup, self.space, self.rng = setup, space, rng
        self.lines = _Lines(space)
        self.subgrid_points = subgrid_points
        self.sign = float(setup.signs[0])
        self.n_priced = 0

    def _groups(self, layout) -> list:
        """The axes shuffled and packed into groups of at most ``subgrid_points`` layouts."""
        groups, current, size = [], [], 1
        for i in self.rng.permutation(len(self.lines.params)):
            p = self.lines.params[i]
            n = len(self.lines.line(p, layout[p.axis]))
            if current and size * n > self.subgrid_points:
                groups.append(current)
                current, size = [], 1
            current.append(p)
            size *= n
        if current:
            groups.append(current)
        return groups

    def _best_of_mesh(self, layout, group):
        """The best admissible point of the open mesh of ``group``'s axes around ``layout``."""
        lines = [self.lines.line(p, layout[p.axis]) for p in group]
        labels = [(p, ln) for p, ln in zip(group, lines) if p.axis in _LABELS]
        numeric = [(p, ln) for p, ln in zip(group, lines) if p.axis not in _LABELS]
        ndim = len(numeric)
        best_score, best_layout = -math.inf, None
        least, least_layout = math.inf, None  # the least-violating point, while none is admissible
        label_choices = [[(p.axis, v) for v in ln] for p, ln in labels]
        for combo in _product(label_choices):
            fixed = {**layout, **dict(combo)}
            knobs = {k: v for k, v in fixed.items() if k not in _LABELS}
            for j, (p, ln) in enumerate(numeric):
                shape = [1] * ndim
                shape[j] = len(ln)
                knobs[p.axis] = _typed(ln).reshape(shape)
            priced = _price(self.setup, fixed["workload"], fixed["fleet"], knobs)
            shape = tuple(len(ln) for _, ln in numeric)
            self.n_priced += int(np.prod(shape, dtype=np.int64))
            score = np.where(np.broadcast_to(priced.feasible, shape),
                             self.sign * np.broadcast_to(priced.values[0], shape), -np.inf)
            flat = int(np.argmax(score)) if score.size else 0
            top = float(score.reshape(-1)[flat]) if score.size else -math.inf
            def at(flat_index):
                coords = np.unravel_index(flat_index, shape)
                return {**fixed, **{p.axis: ln[c].item() if hasattr(ln[c], "item") else ln[c]
                                    for (p, ln), c in zip(numeric, coords)}}

            if top > best_score:
                best_score, best_layout = top, at(flat)
            if best_layout is None and score.size:
                violation = _violation(priced, shape)
                low = int(np.argmin(violation))
                if violation.reshape(-1)[low] < least:
                    least, least_layout = float(violation.reshape(-1)[low]), at(low)
        if best_layout is None:
            return -math.inf, least_layout, least
        return best_score, best_layout, 0.0

    def climb(self, layout, score: float):
        """Refine ``layout`` (its signed score ``score``) until two passes improve nothing.

        From a start that is not admissible (score -inf), each mesh without an
        admissible point moves the incumbent to its least-violating point (the sum
        of the positive constraint values), so the climb walks towards the
        admissible region instead of stalling where it began.
        """
        idle, violation = 0, math.inf if not math.isfinite(score) else 0.0
        while idle < 2:
            improved = False
            for group in self._groups(layout):
                top, candidate, least = self._best_of_mesh(layout, group)
                if _better(top, score):
                    layout, score, violation, improved = candidate, top, 0.0, True
                elif not math.isfinite(score) and candidate is not None and least < violation:
                    layout, violation, improved = candidate, least, True
            idle = 0 if improved else idle + 1
        return layout, score


def _violation(priced, shape) -> np.ndarray:
    """How far each point of a priced mesh is from admissible: the positive constraint sum."""
    total = np.zeros(shape)
    for values in priced.constraints.values():
        total = total + np.maximum(np.nan_to_num(np.broadcast_to(values, shape), nan=1.0), 0.0)
    finite = np.isfinite(np.broadcast_to(priced.values[0], shape))
    return np.where(finite, total, total + 1.0)


def _better(a: float, b: float) -> bool:
    """Whether signed score ``a`` beats ``b`` by more than rounding (``b`` may be -inf)."""
    if not math.isfinite(b):
        return a > b
    return a > b + _REL_TOL * max(1.0, abs(b))


def _product(choices):
    if not choices:
        yield ()
        return
    head, *rest = choices
    for h in head:
        for r in _product(rest):
            yield (h, *r)


def _perturb(climber: _Climber, layout, rng, n_axes: int = 3) -> dict:
    """``layout`` with up to ``n_axes`` axes redrawn at random from their values."""
    params = climber.lines.params
    out = dict(layout)
    for i in rng.choice(len(params), size=min(n_axes, len(params)), replace=False):
        p = params[i]
        values = climber.lines.values[p.axis]
        v = values[rng.integers(len(values))]
        out[p.axis] = v.item() if hasattr(v, "item") else v
    return out


def _tell_layouts(study, setup, space, layouts, owner, origin) -> list:
    """Record layouts as trials (enqueued, asked, constrained, told); their signed scores."""
    for layout in layouts:
        study.enqueue_trial(space.encode(layout), skip_if_exists=False)
    trials = [study.ask(space.distributions) for _ in layouts]
    return _tell(study, setup, space, trials, owner, origin)


def _tell(study, setup, space, trials, owner, origin) -> list:
    values, constraints = price_trials(setup, space, [t.params for t in trials])
    scores = []
    for i, trial in enumerate(trials):
        trial.set_user_attr(OWNER_KEY, owner)
        if origin:
            trial.set_user_attr(ORIGIN_KEY, origin)
        for key, c in constraints[i].items():
            trial.set_constraint(key, c)
        study.tell(trial, float(values[0, i]))
        ok = all(c <= 0 for c in constraints[i].values())
        scores.append(float(setup.signs[0] * values[0, i]) if ok else -math.inf)
    return scores


def _stored_best(study, sign):
    """Signed best admissible value and layout parameters already in the study (resume)."""
    best, params = -math.inf, None
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.constraints and all(c <= 0 for c in t.constraints.values()):
            if sign * t.value > best:
                best, params = sign * t.value, t.params
    return best, params


def refine_search(study, space: SearchSpace, setup: _Setup, *, seed: Optional[int],
                  time_budget: float, patience: int = DEFAULT_PATIENCE,
                  starts: int = DEFAULT_STARTS,
                  subgrid_points: int = DEFAULT_SUBGRID_POINTS) -> Evidence:
    """Rounds of optuna proposals refined by sub-grid ascent, until the evidence says stop.

    Parameters
    ----------
    study : optuna.Study
        Single objective; resumed studies continue from their best trial.
    space : SearchSpace
    setup : _Setup
    seed : int, optional
        Seeds the grouping and perturbations (the study's sampler has its own).
    time_budget : float [s]
        Wall time after which no new round or restart begins (the first round
        and its first restart always run).
    patience : int
        Rounds without a better best after which the search stops.
    starts : int
        Layouts optuna proposes per round.
    subgrid_points : int
        Largest sub-grid priced in one call [layouts].

    Returns
    -------
    Evidence
    """
    began = time.perf_counter()
    rng = np.random.default_rng(seed)
    climber = _Climber(setup, space, rng, subgrid_points)
    evidence = Evidence(patience=patience)
    best, best_params = _stored_best(study, climber.sign)
    best_layout = space.decode(best_params) if best_params is not None else None
    finals: list = []

    def out_of_time():
        return time.perf_counter() - began >= time_budget

    def covered():  # (a small space, sampled as asked)
        return climber.n_priced >= COVER * space.size

    with _Owner() as owner:
        while evidence.stale_rounds < patience:
            if evidence.rounds and out_of_time():  # one round at least, whatever the budget
                evidence.stopped_by = "time"
                break
            if evidence.rounds and covered():
                evidence.stopped_by = "covered"
                break
            trials = [study.ask(space.distributions) for _ in range(starts)]
            scores = _tell(study, setup, space, trials, owner.id, None)
            climber.n_priced += len(trials)
            points = [(space.decode(t.params), s) for t, s in zip(trials, scores)]
            if best_layout is not None:
                kick = _perturb(climber, best_layout, rng)
                points.append((kick, _tell_layouts(study, setup, space, [kick], owner.id,
                                                   "perturbed")[0]))
                climber.n_priced += 1
            improved = False
            refined = []
            for layout, score in points:
                if refined and (out_of_time() or covered()):
                    break
                layout, score = climber.climb(layout, score)
                evidence.restarts += 1
                finals.append(score)
                refined.append(layout)
                if _better(score, best):
                    best, best_layout, improved = score, layout, True
                    evidence.history.append((climber.n_priced,
                                             time.perf_counter() - began,
                                             float(climber.sign * score)))
            distinct = {tuple(sorted((k, repr(v)) for k, v in r.items())): r for r in refined}
            if distinct:
                _tell_layouts(study, setup, space, list(distinct.values()), owner.id, "refined")
                climber.n_priced += len(distinct)
            evidence.rounds += 1
            # Patience counts only once something admissible is found: until then a round
            # without one is no evidence that the best has been reached.
            evidence.stale_rounds = (0 if improved or not math.isfinite(best)
                                     else evidence.stale_rounds + 1)
        else:
            evidence.stopped_by = "patience"
    evidence.n_priced = climber.n_priced
    evidence.agree = sum(1 for s in finals
                         if math.isfinite(best) and s >= best - _REL_TOL * max(1.0, abs(best)))
    return evidence
