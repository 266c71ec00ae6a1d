"""Axes of a spec: the swept values of one knob, as a list or a helper table, checked.

An axis is a list of values, or a helper table: ``powers_of_two = N`` (1..N),
``divisors_of = "fleet" | "layers" | N``, ``from``/``to`` with ``step`` (default 1
for whole numbers) or ``num`` (evenly spaced; ``log = true`` for geometric); one
form per axis, at most :data:`MAX_AXIS_VALUES` values. A ``from``/``to`` range of
floats with neither ``step`` nor ``num`` is continuous: a search samples it, a
sweep refuses it. Numbers must be finite; whole-number knobs take whole numbers
below 2**53 (``2.0`` is 2, ``2.5`` is refused); booleans are not numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional

import numpy as np

import solver

from . import physics as physics_
from ._reader import SpecError

__all__ = ["Axis", "powers_of_two", "divisors", "parse_axis", "knob_value", "knob_of",
           "MAX_AXIS_VALUES"]

_DEFAULT_MODELS = (physics_.DEFAULT_PHYSICS,)

_HELPER_KEYS = ("powers_of_two", "divisors_of", "from", "to", "step", "num", "log")
#: Values one axis may list (a longer range is surely a typo in from/to/step/num).
MAX_AXIS_VALUES = 1_000_000
#: Largest ``divisors_of`` (its divisors are found by trial division up to the square root).
_MAX_DIVISORS_OF = 10 ** 12


def powers_of_two(high: int, low: int = 1) -> list[int]:
    """Powers of two from ``low`` to ``high`` inclusive: ``powers_of_two(8) == [1, 2, 4, 8]``."""
    out, value = [], 1
    while value <= high:
        if value >= low:
            out.append(value)
        value *= 2
    return out


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n`` in increasing order."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@dataclass(frozen=True)
class Axis:
    """One swept dimension.

    ``values`` lists the grid points (``None`` for a continuous range, which only
    a search can use); ``low``/``high``/``log``/``step`` describe ranges to a search.
    ``kind`` is the knob's kind: ``int``, ``float``, ``bool``, ``precision``,
    ``choice`` (a named choice of the megatron physics: ``recompute``, its
    ``precision``), or ``workload``/``fleet``/``physics`` for the categorical
    model, cluster and physics-model axes.
    """

    name: str
    kind: str
    values: Optional[tuple] = None
    low: Optional[float] = None
    high: Optional[float] = None
    log: bool = False
    step: Optional[float] = None

    @property
    def is_continuous(self) -> bool:
        return self.values is None

    def __len__(self):
        if self.values is None:
            raise TypeError(f"axis {self.name!r} is a continuous range and has no length")
        return len(self.values)


def knob_of(reader, name, models=_DEFAULT_MODELS, where="axes"):
    """The :class:`solver.knobs.Knob` ``name`` of the first of ``models`` that takes it.

    Raises
    ------
    SpecError
        For a knob none of the models takes (naming the model that does, if any).
    """
    for model in models:
        if name in physics_.knobs_of(model):
            return physics_.knobs_of(model)[name]
    others = [m for m in physics_.MODELS if m not in models and name in physics_.knobs_of(m)]
    if others:
        raise SpecError(f"{reader.where(f'{where}.{name}')}: expected a knob of the physics "
                        f"{', '.join(models)}, but got {name!r}, a knob of {', '.join(others)} "
                        f"(set physics = {others[0]!r} or a list of models)"
                        f"{getattr(reader, 'physics_note', '')}")
    reader.unknown(name, list(physics_.union_knobs(models)), where=where)


def knob_value(reader, key, knob_name, value, bounds=True, models=_DEFAULT_MODELS):
    """Check one knob value (at ``key``) for every one of ``models`` that takes the knob.

    Returns the value as a plain Python value (the first model's spelling).
    ``bounds=False`` leaves the knob's range to the caller (checked for a whole
    axis at once).
    """
    takers = [m for m in models if knob_name in physics_.knobs_of(m)]
    first = None
    for model in takers:
        checked = _knob_value(reader, key, model, knob_name, value, bounds)
        first = checked if first is None else first
    return first


def _knob_value(reader, key, model, knob_name, value, bounds):
    """:func:`knob_value` for one model."""
    knob = physics_.knobs_of(model)[knob_name]
    where = key
    if knob.kind == "choice":
        expected = f"{physics_.choices_text(model, knob_name)} (physics {model!r})"
        if not isinstance(value, str):
            reader.fail(where, expected, value)
        try:  # (megatron's recompute_modules takes its modules in any order)
            value = physics_.canonical(model, knob_name, value)
        except ValueError:
            reader.fail(where, expected, value)
        if value not in physics_.choices(model, knob_name):
            reader.fail(where, expected, value)
        return value
    if knob.kind == "precision":
        if not isinstance(value, str):
            reader.fail(where, "a precision name such as 'bf16'", value)
        try:
            return solver.knobs.canonical_precision(value)
        except ValueError:
            reader.fail(where, f"one of {', '.join(solver.PRECISION_BYTES)}", value)
    if knob.kind == "topology":
        if value not in ("ring", "tree"):
            reader.fail(where, "'ring' or 'tree'", value)
        return value
    if knob.kind == "bool":
        if not isinstance(value, (bool, np.bool_)):
            reader.fail(where, "true or false", value)
        return bool(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(
            value, (int, float, np.integer, np.floating)):
        reader.fail(where, "a whole number" if knob.kind == "int" else "a number", value)
    if knob.kind == "int":
        if isinstance(value, (float, np.floating)) and not (
                math.isfinite(value) and float(value).is_integer()):
            reader.fail(where, "a whole number", value)
        value = int(value)
        if abs(value) >= solver.knobs.MAX_INTEGER:
            reader.fail(where, "a whole number below 2**53", value)
    else:
        if not _finite(value):
            reader.fail(where, "a finite number", value)
        value = float(value)
    if bounds:
        try:
            physics_.convert(model, knob_name, value)
        except ValueError as err:
            raise SpecError(f"{reader.where(where)}: {err}") from None
    return value


def _helper_values(reader, key, kind, table, workloads, fleets):
    unknown = [k for k in table if k not in _HELPER_KEYS]
    if unknown:
        reader.unknown(unknown[0], _HELPER_KEYS, where=key)
    forms = [k for k in ("powers_of_two", "divisors_of") if k in table]
    ranged = [k for k in ("from", "to", "step", "num", "log") if k in table]
    if len(forms) > 1 or (forms and ranged) or ("step" in table and "num" in table):
        reader.fail(key, "one form: powers_of_two, divisors_of, or from and to (with step "
                         "or num, not both)", table)
    if "powers_of_two" in table:
        high = table["powers_of_two"]
        if (isinstance(high, bool) or not isinstance(high, int) or high < 1
                or high >= solver.knobs.MAX_INTEGER):
            reader.fail(f"{key}.powers_of_two", "a whole number from 1 to 2**53 - 1", high)
        if high & (high - 1):  # the largest value, not a count: 6 would quietly mean 1, 2, 4
            below = 1 << (high.bit_length() - 1)
            reader.fail(f"{key}.powers_of_two", f"the largest power of two of the axis (1, 2, "
                        f"..., N; {below} gives {', '.join(map(str, powers_of_two(below)))})",
                        high)
        return {"values": powers_of_two(high)}
    if "divisors_of" in table:
        of = table["divisors_of"]
        if of == "fleet":
            if len(fleets) != 1:
                reader.fail(f"{key}.divisors_of", "one fleet (the spec names several)", of)
            n = next(iter(fleets.values())).total_accelerators
        elif of == "layers":
            layers = [w.layers for w in workloads.values()]
            if len(layers) != 1 or not layers[0]:
                reader.fail(f"{key}.divisors_of", "one workload with a layer count", of)
            n = layers[0]
        elif isinstance(of, int) and not isinstance(of, bool) and 1 <= of <= _MAX_DIVISORS_OF:
            n = of
        else:
            reader.fail(f"{key}.divisors_of", "'fleet', 'layers' or a whole number from 1 to "
                                              "10**12", of)
        return {"values": divisors(n)}
    if "from" not in table or "to" not in table:
        reader.fail(key, "a list of values, or a table with powers_of_two, divisors_of, "
                         "or from and to", table)
    low, high = table["from"], table["to"]
    for name, v in (("from", low), ("to", high)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            reader.fail(f"{key}.{name}", "a number", v)
        if not _finite(v):
            reader.fail(f"{key}.{name}", "a finite number", v)
    if high < low:
        reader.fail(f"{key}.to", f"a number >= from ({low})", high)
    log = table.get("log", False)
    if not isinstance(log, bool):
        reader.fail(f"{key}.log", "true or false", log)
    if log and low <= 0:
        reader.fail(f"{key}.from", "a number > 0 with log = true", low)
    if "num" in table:
        num = table["num"]
        if isinstance(num, bool) or not isinstance(num, int) or not 1 <= num <= MAX_AXIS_VALUES:
            reader.fail(f"{key}.num", f"a whole number from 1 to {MAX_AXIS_VALUES:,}", num)
        values = (np.geomspace if log else np.linspace)(low, high, num)
        if kind == "int":
            values = np.unique(np.round(values).astype(np.int64))
        return {"values": [v.item() for v in values], "low": low, "high": high, "log": log}
    if kind == "int" or "step" in table:
        step = table.get("step", 1)
        if (isinstance(step, bool) or not isinstance(step, (int, float)) or not _finite(step)
                or step <= 0):
            reader.fail(f"{key}.step", "a finite number > 0", step)
        try:
            count = int(math.floor((high - low) / step + 1e-9)) + 1
        except OverflowError:
            count = math.inf
        if count > MAX_AXIS_VALUES:
            reader.fail(key, f"at most {MAX_AXIS_VALUES:,} values",
                        f"{count:,} values from {table!r}" if count < math.inf else table)
        values = [low + i * step for i in range(count)]
        if kind == "int":
            if not all(float(v).is_integer() for v in (low, step)):
                reader.fail(key, "whole-number from and step for an integer knob", table)
            values = [int(v) for v in values]
        return {"values": values, "low": low, "high": high, "log": log, "step": step}
    return {"values": None, "low": float(low), "high": float(high), "log": log}


def _finite(value) -> bool:
    """A number that is finite as a float (a huge int overflows: not finite)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def parse_axis(reader, name, given, workloads, fleets, models=_DEFAULT_MODELS) -> Axis:
    """The axis ``axes.<name> = given``, checked (``reader`` names the file in errors).

    Its values are checked for every one of the spec's physics ``models`` that
    takes the knob; a knob none of them takes is refused.
    """
    key = f"axes.{name}"
    if name in ("workload", "fleet", "physics"):
        reader.fail(key, f"a knob name (several {name}s are listed at the top, "
                         f"{name} = [...], and then form the {name} axis)", given)
    knob = knob_of(reader, name, models)
    kind = knob.kind
    if isinstance(given, Mapping) and kind in ("choice", "bool"):
        # (the helper tables make numbers: a choice or a switch lists its values)
        taker = next(m for m in models if name in physics_.knobs_of(m))
        values = physics_.choices_text(taker, name) if kind == "choice" else "true, false"
        reader.fail(key, f"a list of values ({values}): a {kind} knob takes no helper table",
                    given)
    if isinstance(given, Mapping):
        parts = _helper_values(reader, key, kind, given, workloads, fleets)
    elif isinstance(given, (list, tuple, np.ndarray)):
        parts = {"values": list(given)}
        if len(given) > MAX_AXIS_VALUES:
            reader.fail(key, f"at most {MAX_AXIS_VALUES:,} values", f"{len(given):,} values")
    else:
        reader.fail(key, "a list of values or a helper table (e.g. { powers_of_two = 8 })", given)
    values = parts["values"]
    if values is not None:
        if len(values) == 0:
            reader.fail(key, "at least one value", given)
        if isinstance(given, Mapping):  # made here from checked numbers: only convert
            values = [int(v) if kind == "int" else float(v) for v in values]
        else:
            values = [knob_value(reader, f"{key}[{i}]", name, v, bounds=False, models=models)
                      for i, v in enumerate(values)]
        if kind in ("int", "float"):  # the knob's range, for the whole axis at once
            try:
                for model in models:
                    if name in physics_.knobs_of(model):
                        physics_.convert(model, name, np.array(values))
            except ValueError:
                for i, v in enumerate(values):  # name the first value out of range
                    knob_value(reader, f"{key}[{i}]", name, v, models=models)
                raise
        seen = {}
        for i, v in enumerate(values):
            if v in seen:
                reader.fail(key, "distinct values", f"{v!r} twice (at [{seen[v]}] and [{i}])")
            seen[v] = i
        parts["values"] = tuple(values)
    else:
        if kind != "float":
            reader.fail(key, "step or num for a whole-number knob", given)
        for bound in ("low", "high"):
            knob_value(reader, f"{key}.{'from' if bound == 'low' else 'to'}", name, parts[bound],
                       models=models)
    return Axis(name=name, kind=kind, **parts)
