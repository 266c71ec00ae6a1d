"""A spec's axes as an optuna search space, and optuna parameters back as solve knobs.

Each swept axis becomes one optuna parameter; an axis with a single value is a
constant and is not searched. The encoding keeps what a sampler can exploit:

============================== ========================================== ==============
axis                           optuna distribution                        parameter name
============================== ========================================== ==============
bool, precision, workload,     ``CategoricalDistribution(values)``        the axis name
fleet
whole numbers evenly spaced    ``IntDistribution(low, high, step)``       the axis name
(``from``/``to``, ``[0,1,2,3]``)
any other listed numbers       ``CategoricalDistribution(sorted values)`` the axis name
(powers of two, divisors,      (``"ordered"``: local moves step to the
geometric ``num``, floats)     next value down or up)
continuous ``from``/``to``     ``FloatDistribution(low, high, log=log)``  the axis name
============================== ========================================== ==============

Every parameter holds the knob's value itself, under the knob's name, so a study
read back with ``optuna.load_study`` or shown by optuna-dashboard says
``tp_size = 8``. (Up to version 0.x of this package, ordered choices were stored
as positions, ``tp_size_index = 3``; such studies are refused with a message,
see :func:`index_encoded`.) An ``IntDistribution(log=True)`` would not do for
powers of two: optuna would also draw 3, 5, 6 and 7. :meth:`SearchSpace.decode`
turns a trial's parameters back into the axis values (plain Python values, as
the spec lists them).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from optuna.distributions import (BaseDistribution, CategoricalDistribution,
                                  FloatDistribution, IntDistribution)

from ..spec import Axis, Spec

__all__ = ["Param", "SearchSpace", "build_space", "index_encoded", "INDEX_SUFFIX", "FLOAT_MOVE"]

#: A coordinate move of a continuous parameter, as a share of its (log) range.
FLOAT_MOVE = 0.05

#: Suffix of the parameters of the former encoding (a position in the sorted values),
#: recognized only to refuse such stored studies with a clear message.
INDEX_SUFFIX = "_index"

_CATEGORICAL_KINDS = ("bool", "precision", "workload", "fleet", "topology", "physics", "choice")


@dataclass(frozen=True)
class Param:
    """One searched axis: its optuna name and distribution, and how to decode a draw.

    ``encoding`` is ``"categorical"`` (unordered choices), ``"ordered"``
    (categorical over the sorted numeric ``values``: moves go to the adjacent
    value), ``"int"`` (a whole number on a stepped range) or ``"float"`` (a
    continuous draw). The draw is always the value itself.
    """

    name: str
    axis: str
    encoding: str
    distribution: BaseDistribution
    values: Optional[tuple] = None

    def decode(self, raw):
        """The axis value of an optuna draw ``raw``."""
        if self.encoding == "int":
            return int(raw)
        if self.encoding == "float":
            return float(raw)
        return raw

    def encode(self, value):
        """The optuna draw that decodes to the axis value ``value``."""
        if self.values is not None and self.encoding != "int" and value not in self.values:
            raise ValueError(f"{self.axis}: expected one of the axis values "
                             f"{list(self.values)}, but got {value!r}")
        return value

    def moves(self, raw) -> list:
        """Draws one coordinate move away from ``raw`` (see :meth:`SearchSpace.neighbors`)."""
        d = self.distribution
        if self.encoding == "ordered":
            i = self.values.index(raw)
            return [self.values[j] for j in (i - 1, i + 1) if 0 <= j < len(self.values)]
        if isinstance(d, CategoricalDistribution):
            return [c for c in d.choices if c != raw]
        if isinstance(d, IntDistribution):
            return [v for v in (raw - d.step, raw + d.step) if d.low <= v <= d.high]
        if d.log:
            ratio = (d.high / d.low) ** FLOAT_MOVE
            candidates = (raw / ratio, raw * ratio)
        else:
            delta = (d.high - d.low) * FLOAT_MOVE
            candidates = (raw - delta, raw + delta)
        return [min(max(v, d.low), d.high) for v in candidates if v != raw]

    def grid(self) -> list:
        """Every draw of this parameter (for a grid sampler)."""
        d = self.distribution
        if self.encoding == "float":
            raise ValueError(f"axis {self.axis!r} is a continuous range: a grid needs listed "
                             f"values (give the range a step or num)")
        if isinstance(d, CategoricalDistribution):
            return list(d.choices)
        return list(range(d.low, d.high + 1, d.step))

    def __len__(self):
        d = self.distribution
        if self.encoding == "float":
            raise TypeError(f"axis {self.axis!r} is continuous and has no length")
        if isinstance(d, CategoricalDistribution):
            return len(d.choices)
        return (d.high - d.low) // d.step + 1


def _arithmetic_step(values) -> Optional[int]:
    """The common step of sorted whole numbers in arithmetic progression, else None."""
    if len(values) < 2 or not all(isinstance(v, int) for v in values):
        return None
    step = values[1] - values[0]
    if step <= 0 or any(b - a != step for a, b in zip(values, values[1:])):
        return None
    return step


def _param(axis: Axis) -> Param:
    if axis.is_continuous:
        return Param(axis.name, axis.name, "float",
                     FloatDistribution(float(axis.low), float(axis.high), log=bool(axis.log)))
    if axis.kind in _CATEGORICAL_KINDS:
        return Param(axis.name, axis.name, "categorical",
                     CategoricalDistribution(tuple(axis.values)), tuple(axis.values))
    values = tuple(sorted(axis.values))
    step = _arithmetic_step(values) if axis.kind == "int" else None
    if step is not None:
        return Param(axis.name, axis.name, "int",
                     IntDistribution(values[0], values[-1], step=step), values)
    return Param(axis.name, axis.name, "ordered", CategoricalDistribution(values), values)


@dataclass(frozen=True)
class SearchSpace:
    """The searched parameters of a spec, and the axes held constant.

    ``constants`` maps single-valued axes to their value; ``labels`` holds the
    workload and fleet labels when they are not searched.
    """

    spec: Spec
    params: tuple
    constants: Mapping[str, Any] = field(default_factory=dict)

    @property
    def distributions(self) -> dict:
        """optuna parameter name -> distribution (for ``study.ask``)."""
        return {p.name: p.distribution for p in self.params}

    @property
    def is_discrete(self) -> bool:
        return all(p.encoding != "float" for p in self.params)

    @property
    def size(self) -> float:
        """Number of distinct layouts (``math.inf`` with a continuous axis)."""
        if not self.is_discrete:
            return math.inf
        return math.prod(len(p) for p in self.params)

    def grid(self) -> dict:
        """optuna parameter name -> every draw, for ``optuna.samplers.GridSampler``."""
        return {p.name: p.grid() for p in self.params}

    def decode(self, raw: Mapping[str, Any]) -> dict:
        """A layout from a trial's parameters: axis -> value, plus workload and fleet labels.

        Raises
        ------
        KeyError
            If a parameter of the space is missing from ``raw``.
        """
        layout = {"workload": _only(self.spec.workloads), "fleet": _only(self.spec.fleets)}
        layout.update(self.constants)
        for p in self.params:
            if p.name not in raw:
                raise KeyError(f"trial parameters lack {p.name!r} (has {sorted(raw)})")
            layout[p.axis] = p.decode(raw[p.name])
        return layout

    def encode(self, layout: Mapping[str, Any]) -> dict:
        """The trial parameters of a layout (for ``study.enqueue_trial``)."""
        return {p.name: p.encode(layout[p.axis]) for p in self.params}

    def neighbors(self, raw: Mapping[str, Any], *, pairs: bool = False) -> list:
        """Trial parameters one coordinate move away from ``raw`` (two, with ``pairs``).

        An ordered or stepped parameter moves one step down or up; a
        categorical one takes each other choice; a continuous one moves by
        :data:`FLOAT_MOVE` of its range (of its log range with ``log``). With
        ``pairs``, every move of two parameters at once (such as TP halved and
        DP doubled, which keeps the cluster size).
        """
        moves = [(p.name, v) for p in self.params for v in p.moves(raw[p.name])]
        if not pairs:
            return [{**raw, name: v} for name, v in moves]
        return [{**raw, a: va, b: vb}
                for i, (a, va) in enumerate(moves) for b, vb in moves[i + 1:] if a != b]

    def signature(self) -> str:
        """JSON naming every parameter and its distribution: equal spaces, equal strings."""
        from optuna.distributions import distribution_to_json

        return json.dumps({
            "params": {p.name: json.loads(distribution_to_json(p.distribution))
                       for p in self.params},
            "constants": {k: _plain(v) for k, v in self.constants.items()},
        }, sort_keys=True)


def _plain(value):
    return value if isinstance(value, (bool, int, float, str, type(None))) else str(value)


def _only(entries):
    return next(iter(entries)) if len(entries) == 1 else None


def index_encoded(signature: str) -> list:
    """Parameters of a stored study signature in the former position encoding (``*_index``).

    Such a study holds positions in the sorted values (``tp_size_index = 3``),
    not the values; it cannot be continued with the value encoding.
    """
    try:
        params = json.loads(signature).get("space", {}).get("params", {})
    except (ValueError, AttributeError):
        return []
    return sorted(n for n in params if n.endswith(INDEX_SUFFIX))


def build_space(spec: Spec) -> SearchSpace:
    """The optuna search space of ``spec``'s axes (single-valued axes become constants)."""
    params, constants = [], {}
    for axis in spec.axes:
        if not axis.is_continuous and len(axis.values) == 1:
            constants[axis.name] = axis.values[0]
        elif axis.is_continuous and axis.low == axis.high:
            constants[axis.name] = float(axis.low)
        else:
            params.append(_param(axis))
    return SearchSpace(spec=spec, params=tuple(params), constants=constants)
