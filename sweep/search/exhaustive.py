"""Exact mode: price every layout of the grid in blocks, keep the top k and the Pareto front.

The true optimum under the same constraints as a sampled search, in the same
:class:`~sweep.search.result.SearchResult` shape. Blocks come from
:func:`sweep.grid.blocks`; each is reduced to its k best admissible points (or
its Pareto set) where it is priced, so only survivors travel between
processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .. import grid as grid_
from ..analysis.empty import (FEASIBLE, LIMIT, VALID, batch_split_knobs, megatron_rules,
                              merge_evidence, realizable_evidence, realizable_text)
from .pricing import _price, _Setup
from .result import SearchResult, finish_result, front_indices

__all__ = ["exact"]


@dataclass
class _Reduced:
    scores: np.ndarray      # (n, n_objectives), larger is better
    index: np.ndarray       # flat grid index (C order over spec.shape)
    n_valid: int = 0
    n_admissible: int = 0
    n_points: int = 0
    removed: dict = field(default_factory=dict)   # constraint -> points it removed, in order
    relaxed: dict = field(default_factory=dict)   # constraint -> points passing every other
    #: sweep.analysis.empty.realizable_evidence of the points only "realizable" removed
    realizable: Optional[dict] = None


def _top(scores, index, k):
    """The k best rows of a single-objective score (ties: lowest grid index first)."""
    s = scores[:, 0]
    if len(s) > k:
        threshold = np.partition(s, len(s) - k)[len(s) - k]
        keep = s >= threshold
        s, index, scores = s[keep], index[keep], scores[keep]
    order = np.lexsort((index, -s))[:k]
    return scores[order], index[order]


def _reduce_block(setup: _Setup, block, k: int) -> _Reduced:
    """Price one block; keep its k best admissible points (or its Pareto set)."""
    spec = setup.spec
    n_obj = len(setup.objectives)
    priced = _price(setup, block.workload_label, block.fleet_label,
                    {**block.knobs, "physics": block.physics})
    shape = block.shape
    local = np.flatnonzero(np.broadcast_to(priced.feasible, shape))
    n_admissible = len(local)
    scores = (np.broadcast_to(priced.values, (n_obj, *shape)).reshape(n_obj, -1)[:, local].T
              * setup.signs)
    # Reduce on block-local indices (their C order is the grid's within a block), then
    # convert only the survivors to grid indices.
    if n_obj == 1:
        scores, local = _top(scores, local, k)
    else:
        keep = front_indices(scores, local)
        scores, local = scores[keep], local[keep]
    starts = [s.start for s in block.index]
    coords = np.unravel_index(local, shape)
    index = np.asarray(np.ravel_multi_index(tuple(c + s for c, s in zip(coords, starts)),
                                            spec.shape), dtype=np.int64)
    removed, relaxed = _counts(priced, shape)
    return _Reduced(scores, index, n_valid=int(np.broadcast_to(priced.valid, shape).sum()),
                    n_admissible=n_admissible, n_points=int(np.prod(shape)),
                    removed=removed, relaxed=relaxed,
                    realizable=_realizable(priced, shape) if relaxed.get("realizable") else None)


def _realizable(priced, shape) -> Optional[dict]:
    """Why the points only "realizable" removes in a block are not realizable (the
    evidence :func:`sweep.analysis.empty.realizable_text` reads); None if it cannot say."""
    out, knobs = priced.outputs, priced.knobs
    if "dp_size" not in out or "batch_size" not in knobs:
        return None
    others = np.ones(shape, bool)
    for name, values in priced.constraints.items():
        if name != "realizable":
            others &= ~(np.nan_to_num(np.broadcast_to(values, shape), nan=1.0) > 0)
    blocked = others & (np.broadcast_to(priced.constraints["realizable"], shape) > 0)
    megatron = knobs.get("physics") == "megatron"
    divisor = np.asarray(out["dp_size"], np.float64)
    for name, default in batch_split_knobs(megatron).items():
        divisor = divisor * np.asarray(knobs.get(name, default), np.float64)
    batch = np.asarray(knobs["batch_size"])
    evidence = realizable_evidence(blocked, np.asarray(out["dp_size"]), divisor, batch,
                                   megatron=megatron, scalar_batch=batch.ndim == 0)
    if megatron and priced.workload is not None:
        rules = megatron_rules(priced.workload, priced.fleet, knobs, blocked)
        if rules is not None:
            evidence["rules"] = rules
    return evidence


#: The explanation's names of the pricing constraints (sweep.analysis.empty's words).
_CONDITION_NAMES = {"split": VALID, "memory": LIMIT,
                    "accelerators": "accelerator budget", "min_accelerators":
                    "accelerator minimum", "realizable": "realizable"}


def _counts(priced, shape) -> tuple:
    """``(removed, relaxed)`` of one block, as :func:`sweep.analysis.explain_empty` reads them.

    The conditions are the pricing constraints in their order, with "fits memory" (the
    solver's ``feasible``, where ``priced.outputs`` has it) counted on its own before the
    memory limit, as a cube's analysis counts it: the limit is at most the accelerator's
    memory, so the ``memory`` constraint holds both, and relaxing the limit gives back only
    the layouts that fit.
    """
    feasible = getattr(priced, "outputs", {}).get("feasible")
    ok = {}
    for name, values in priced.constraints.items():
        if name == "memory" and feasible is not None:
            ok[FEASIBLE] = np.broadcast_to(np.asarray(feasible, bool), shape)
        ok[_CONDITION_NAMES.get(name, f"constraint {name}")] = \
            ~(np.nan_to_num(np.broadcast_to(values, shape), nan=1.0) > 0)
    removed, relaxed, kept = {}, {}, np.ones(shape, bool)
    for name, passes in ok.items():
        removed[name] = int((kept & ~passes).sum())
        kept &= passes
        others = np.ones(shape, bool)
        for other, also in ok.items():
            if other != name:
                others &= also
        relaxed[name] = int(others.sum())
    return removed, relaxed


def _merge(acc: _Reduced, part: _Reduced, k, n_obj) -> _Reduced:
    scores = np.concatenate([acc.scores, part.scores])
    index = np.concatenate([acc.index, part.index])
    if n_obj == 1:
        acc.scores, acc.index = _top(scores, index, k)
    else:
        keep = front_indices(scores, index)
        acc.scores, acc.index = scores[keep], index[keep]
    acc.n_valid += part.n_valid
    acc.n_admissible += part.n_admissible
    acc.n_points += part.n_points
    for mine, theirs in ((acc.removed, part.removed), (acc.relaxed, part.relaxed)):
        for name, n in theirs.items():
            mine[name] = mine.get(name, 0) + n
    acc.realizable = merge_evidence(acc.realizable, part.realizable)
    return acc


def _parts(setup, blocks, k, n_jobs):
    if n_jobs == 1:
        return (_reduce_block(setup, b, k) for b in blocks)
    from joblib import Parallel, delayed

    return Parallel(n_jobs=n_jobs, return_as="generator_unordered")(
        delayed(_reduce_block)(setup, b, k) for b in blocks)


def exact(setup: _Setup, *, k, block_points, n_jobs, progress, started, probe=None,
          reason: str = "") -> SearchResult:
    """Price every grid point of ``setup.spec`` in blocks of ``block_points``; the best k.

    ``probe(n_priced, size)``, if given, is called after each block; when it
    returns False the walk stops and ``exact`` returns None (auto mode found
    the whole walk too slow for its time budget).
    """
    spec = setup.spec
    n_obj = len(setup.objectives)
    total = _Reduced(np.zeros((0, n_obj)), np.zeros(0, dtype=np.int64))
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=spec.size, desc=f"exact {spec.name}", unit="layout", unit_scale=True)
    try:
        for part in _parts(setup, grid_.blocks(spec, block_points), k, n_jobs):
            total = _merge(total, part, k, n_obj)
            if bar is not None:
                bar.update(part.n_points)
            if probe is not None and not probe(total.n_points, spec.size):
                return None
    finally:
        if bar is not None:
            bar.close()
    order = np.lexsort([total.index] + [-total.scores[:, j] for j in reversed(range(n_obj))])
    items = []
    for i in order:
        coords = np.unravel_index(int(total.index[i]), spec.shape)
        layout = {"workload": next(iter(spec.workloads)) if len(spec.workloads) == 1 else None,
                  "fleet": next(iter(spec.fleets)) if len(spec.fleets) == 1 else None}
        for axis, c in zip(spec.axes, coords):
            layout[axis.name] = axis.values[int(c)]
        items.append((layout, tuple(total.scores[i] * setup.signs), None))
    pareto = items[:1] if n_obj == 1 else items
    counts = {"total": total.n_points, "removed": total.removed, "relaxed": total.relaxed}
    why = realizable_text(total.realizable) if not total.n_admissible else None
    if why:
        counts["why"] = {"realizable": why}
    return finish_result(setup, items, pareto, study=None, n_evaluated=total.n_points,
                         n_new=total.n_points, n_admissible=total.n_admissible, mode="exact",
                         sampler="exhaustive", space_size=spec.size, k=k, started=started,
                         reason=reason, empty_counts=counts)
