"""Declared design spaces: one schema for Python dicts and TOML files.

A spec names the workload(s) and fleet(s), the swept axes (solve keyword ->
values), the fixed knob values, constraints and the outputs to keep::

    workload = "Llama3_70B"            # or a list: then "workload" is an axis
    fleet = "Training_1K"              # or a list: then "fleet" is an axis
    outputs = ["mfu", "step_latency_total", "memory_footprint"]   # optional
    catalog = "my_cluster.toml"        # optional: your own workloads and fleets
                                       # (solver.catalog.load_file), relative to the spec

    [axes]
    tp_size = { powers_of_two = 8 }            # 1, 2, 4, 8
    pp_size = { divisors_of = "layers" }       # divisors of the model's layer count
    microbatch_count = { from = 1, to = 64 }   # whole numbers 1..64 (step 1)
    efficiency = { from = 0.3, to = 0.6, num = 4 }
    precision = ["bf16", "fp8"]
    zero_stage = [0, 1, 2, 3]

    [fixed]
    batch_size = 1024
    overlap_comm = true

    [constraints]
    memory_limit = "72 GB"        # bytes, or a fraction of the accelerator's memory (0.9)
    max_accelerators = 512

Axis values: a list, or a helper table: ``powers_of_two = N`` (1..N),
``divisors_of = "fleet" | "layers" | N``, ``from``/``to`` with ``step`` (default 1
for whole numbers) or ``num`` (evenly spaced; ``log = true`` for geometric); one
form per axis, at most :data:`MAX_AXIS_VALUES` values. A ``from``/``to`` range of
floats with neither ``step`` nor ``num`` is continuous: a search samples it, a
sweep refuses it. Numbers must be finite; whole-number knobs take whole numbers
below 2**53 (``2.0`` is 2, ``2.5`` is refused); booleans are not numbers. Every
name is a ``solver.solve`` keyword, plus ``dp_size`` (the cluster is then sized by
the layout) and ``workload``/``fleet``.
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np

import solver
from solver import catalog
from solver.knobs import KNOBS
from solver.specs import Fleet, Workload
from solver.units import parse_quantity

__all__ = [
    "Axis",
    "Spec",
    "SpecError",
    "load_spec",
    "builtin_specs",
    "builtin_spec",
    "powers_of_two",
    "divisors",
    "TOP_KEYS",
    "CONSTRAINT_KEYS",
    "MAX_AXIS_VALUES",
]

TOP_KEYS = ("name", "workload", "fleet", "axes", "fixed", "constraints", "outputs", "catalog",
            "dtype", "description")
CONSTRAINT_KEYS = ("memory_limit", "max_accelerators")
_HELPER_KEYS = ("powers_of_two", "divisors_of", "from", "to", "step", "num", "log")
_DTYPES = ("float64", "float32")
#: Values one axis may list (a longer range is surely a typo in from/to/step/num).
MAX_AXIS_VALUES = 1_000_000
#: The data package the example specs are installed as (``configs/sweeps`` in the source tree).
SPECS_PACKAGE = "layout_sweep_configs.sweeps"
_SOURCE_SPECS = Path(__file__).resolve().parent.parent / "configs" / "sweeps"

#: Largest ``divisors_of`` (its divisors are found by trial division up to the square root).
_MAX_DIVISORS_OF = 10 ** 12


class SpecError(ValueError):
    """A spec that cannot be read: names where, what was expected and what came."""


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


def _suggest(name, choices):
    close = difflib.get_close_matches(str(name), list(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


@dataclass(frozen=True)
class Axis:
    """One swept dimension.

    ``values`` lists the grid points (``None`` for a continuous range, which only
    a search can use); ``low``/``high``/``log``/``step`` describe ranges to a search.
    ``kind`` is the knob's kind: ``int``, ``float``, ``bool``, ``precision``, or
    ``workload``/``fleet`` for the categorical model and cluster axes.
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


@dataclass(frozen=True)
class Spec:
    """A parsed, checked design space. Build it with :func:`load_spec`."""

    workloads: Mapping[str, Workload]
    fleets: Mapping[str, Fleet]
    axes: tuple
    fixed: Mapping[str, Any] = field(default_factory=dict)
    outputs: tuple = ()
    memory_limit: Optional[float] = None
    memory_limit_fraction: Optional[float] = None
    max_accelerators: Optional[int] = None
    dtype: str = "float64"
    name: str = "sweep"
    description: str = ""
    source: str = "<dict>"
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def dims(self) -> tuple:
        """Axis names, in cube order."""
        return tuple(a.name for a in self.axes)

    @property
    def shape(self) -> tuple:
        return tuple(len(a) for a in self.axes)

    @property
    def size(self) -> int:
        return math.prod(self.shape)  # exact: a Python int never wraps

    def axis(self, name: str) -> Axis:
        for a in self.axes:
            if a.name == name:
                return a
        raise KeyError(f"spec {self.name!r} has no axis {name!r}{_suggest(name, self.dims)}")

    def workload_spec(self, label=None) -> Workload:
        """The workload labelled ``label`` (the name the spec gave); the only one if None."""
        return _lookup(self.workloads, label, "workload")

    def fleet_spec(self, label=None) -> Fleet:
        """The fleet labelled ``label`` (the name the spec gave); the only one if None."""
        return _lookup(self.fleets, label, "fleet")

    def memory_limit_for(self, fleet: Fleet) -> float:
        """Per-accelerator memory limit [B] on ``fleet`` (its capacity when none is set)."""
        capacity = fleet.node.accelerator.memory_capacity
        if self.memory_limit is not None:
            return self.memory_limit
        if self.memory_limit_fraction is not None:
            return self.memory_limit_fraction * capacity
        return capacity

    def to_json(self) -> str:
        """The spec as given (names, not objects), as JSON: provenance for a cube."""
        return json.dumps(_jsonable(self.raw), sort_keys=True)


def _jsonable(value):
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (Workload, Fleet)):
        return value.name
    if isinstance(value, np.generic):
        return value.item()
    return value


def _lookup(entries, label, what):
    if label is None:
        if len(entries) != 1:
            raise SpecError(f"the spec has {len(entries)} {what}s; name one of "
                            f"{', '.join(entries)}")
        return next(iter(entries.values()))
    if label in entries:
        return entries[label]
    raise SpecError(f"the spec has no {what} {label!r}{_suggest(label, entries)}")


class _Reader:
    """Carries where we are (file and key) into every error message."""

    def __init__(self, source):
        self.source = source

    def fail(self, key, expected, got):
        raise SpecError(f"{self.source}: {key}: expected {expected}, but got {got!r}")

    def unknown(self, key, choices, where=""):
        place = f"{where}." if where else ""
        raise SpecError(f"{self.source}: {place}{key}: unknown key{_suggest(key, choices)} "
                        f"(expected one of {', '.join(choices)})")


def _value(reader, key, knob_name, value, bounds=True):
    """Check one knob value against the knob's kind; return it as a plain Python value.

    ``bounds=False`` leaves the knob's range to the caller (checked for a whole axis at once).
    """
    knob = KNOBS[knob_name]
    where = key
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
            solver.knobs.normalize({knob_name: value})
        except ValueError as err:
            raise SpecError(f"{reader.source}: {where}: {err}") from None
    return value


def _helper_values(reader, key, knob_name, table, workloads, fleets):
    unknown = [k for k in table if k not in _HELPER_KEYS]
    if unknown:
        reader.unknown(unknown[0], _HELPER_KEYS, where=key)
    kind = KNOBS[knob_name].kind
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


def _axis(reader, name, given, workloads, fleets):
    key = f"axes.{name}"
    if name in ("workload", "fleet"):
        reader.fail(key, f"a knob name (several {name}s are listed at the top, "
                         f"{name} = [...], and then form the {name} axis)", given)
    if name not in KNOBS:
        reader.unknown(name, list(KNOBS), where="axes")
    if isinstance(given, Mapping):
        parts = _helper_values(reader, key, name, given, workloads, fleets)
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
        kind = KNOBS[name].kind
        if isinstance(given, Mapping):  # made here from checked numbers: only convert
            values = [int(v) if kind == "int" else float(v) for v in values]
        else:
            values = [_value(reader, f"{key}[{i}]", name, v, bounds=False)
                      for i, v in enumerate(values)]
        if kind in ("int", "float"):  # the knob's range, for the whole axis at once
            try:
                solver.knobs.normalize({name: np.array(values)})
            except ValueError:
                for i, v in enumerate(values):  # name the first value out of range
                    _value(reader, f"{key}[{i}]", name, v)
                raise
        seen = {}
        for i, v in enumerate(values):
            if v in seen:
                reader.fail(key, "distinct values", f"{v!r} twice (at [{seen[v]}] and [{i}])")
            seen[v] = i
        parts["values"] = tuple(values)
    else:
        if KNOBS[name].kind != "float":
            reader.fail(key, "step or num for a whole-number knob", given)
        for bound in ("low", "high"):
            _value(reader, f"{key}.{'from' if bound == 'low' else 'to'}", name, parts[bound])
    return Axis(name=name, kind=KNOBS[name].kind, **parts)


def _resolve_many(reader, key, given, what, extra):
    """Workload or fleet names (or spec objects) -> {label: spec}, labels as given."""
    items = given if isinstance(given, (list, tuple)) else [given]
    if not items:
        reader.fail(key, f"a {what} name or a list of names", given)
    spec_type = Workload if what == "workload" else Fleet
    out = {}
    for i, item in enumerate(items):
        where = key if len(items) == 1 and not isinstance(given, (list, tuple)) else f"{key}[{i}]"
        if isinstance(item, spec_type):
            label, value = item.name, item
        elif isinstance(item, str):
            label = item
            if item in extra:
                value = extra[item]
            else:
                try:
                    value = getattr(catalog, what)(item)
                except catalog.CatalogError as err:
                    hint = ("" if extra else "; your own entries go in a catalog TOML file "
                            "named by the spec key catalog = \"my_cluster.toml\"")
                    raise SpecError(f"{reader.source}: {where}: {err}{hint}") from None
        else:
            reader.fail(where, f"a {what} name (see `python -m sweep catalog`)", item)
        if label in out:
            reader.fail(key, f"distinct {what}s", f"{label!r} twice")
        out[label] = value
    return out


def _specs_dir():
    return catalog.resource_dir(SPECS_PACKAGE, _SOURCE_SPECS)


def builtin_specs() -> list[str]:
    """Names of the example specs installed with the package (``"default"``, ...)."""
    return sorted(entry.name[:-5] for entry in _specs_dir().iterdir()
                  if entry.name.endswith(".toml"))


def builtin_spec(name: str):
    """The installed example spec ``name`` (``"default"`` or ``"default.toml"``), a traversable.

    Raises
    ------
    SpecError
        If there is no such spec; the close matches are named.
    """
    stem = name[:-5] if name.endswith(".toml") else name
    if stem not in builtin_specs():
        raise SpecError(f"no built-in spec {name!r} (built-in: {', '.join(builtin_specs())})"
                        f"{_suggest(stem, builtin_specs())}")
    return _specs_dir() / f"{stem}.toml"


def _builtin_for(path: Path):
    """The built-in spec a missing relative ``path`` names, if any.

    ``"default"``, ``"default.toml"`` and ``"configs/sweeps/default.toml"`` (the
    README's spelling, from any folder) name the installed example spec.
    """
    if path.is_absolute():
        return None
    parts = path.parts
    if len(parts) == 1 or parts[-3:-1] == ("configs", "sweeps") and len(parts) == 3:
        stem = path.name[:-5] if path.name.endswith(".toml") else path.name
        if stem in builtin_specs():
            return _specs_dir() / f"{stem}.toml"
    return None


def load_spec(spec, *, source: Optional[str] = None) -> Spec:
    """Read and check a spec from a dict, a TOML file path, or a :class:`Spec`.

    A relative path that does not exist but names a built-in example spec
    (``"default"``, ``"search_llama70b.toml"``, ``"configs/sweeps/default.toml"``)
    reads the copy installed with the package (see :func:`builtin_specs`).

    Raises
    ------
    SpecError
        Naming the file and key, what was expected and what came.
    """
    if isinstance(spec, Spec):
        return spec
    if isinstance(spec, (str, Path)):
        path = Path(spec)
        builtin = None if path.exists() else _builtin_for(path)
        if builtin is not None:
            raw = catalog.read_toml(builtin, f"configs/sweeps/{builtin.name}", error=SpecError,
                                    what="spec file")
            return _parse(raw, source or f"configs/sweeps/{builtin.name}", base=Path.cwd())
        raw = catalog.read_toml(path, str(path), error=SpecError, what="spec file")
        return _parse(raw, source or str(path), base=path.parent)
    if isinstance(spec, Mapping):
        return _parse(dict(spec), source or "<dict>", base=Path.cwd())
    raise SpecError(f"a spec is a dict, a TOML path or a Spec, but got {type(spec).__name__}")


def _parse(raw, source, base):
    reader = _Reader(source)
    for key in raw:
        if key not in TOP_KEYS:
            reader.unknown(key, TOP_KEYS)
    for key in ("workload", "fleet"):
        if key not in raw:
            reader.fail(key, f"a {key} name (required)", None)

    extra_workloads, extra_fleets = {}, {}
    if "catalog" in raw:
        if not isinstance(raw["catalog"], str) or not raw["catalog"]:
            reader.fail("catalog", "the path of a catalog TOML file (a string)", raw["catalog"])
        path = Path(raw["catalog"])
        path = path if path.is_absolute() else base / path
        try:
            loaded = catalog.load_file(path)
        except catalog.CatalogError as err:
            raise SpecError(f"{source}: catalog: {err}") from None
        extra_workloads, extra_fleets = loaded.get("workloads", {}), loaded.get("fleets", {})

    workloads = _resolve_many(reader, "workload", raw["workload"], "workload", extra_workloads)
    fleets = _resolve_many(reader, "fleet", raw["fleet"], "fleet", extra_fleets)

    axes_raw = raw.get("axes", {})
    if not isinstance(axes_raw, Mapping):
        reader.fail("axes", "a table of knob = values", axes_raw)
    axes = []
    for key, values, specs_ in (("workload", raw["workload"], workloads),
                                ("fleet", raw["fleet"], fleets)):
        if isinstance(values, (list, tuple)) and len(specs_) > 1:
            axes.append(Axis(name=key, kind=key, values=tuple(specs_)))
    axes += [_axis(reader, name, given, workloads, fleets) for name, given in axes_raw.items()]

    fixed_raw = raw.get("fixed", {})
    if not isinstance(fixed_raw, Mapping):
        reader.fail("fixed", "a table of knob = value", fixed_raw)
    fixed = {}
    for name, value in fixed_raw.items():
        if name not in KNOBS:
            reader.unknown(name, list(KNOBS), where="fixed")
        if name in axes_raw:
            reader.fail(f"fixed.{name}", "a knob that is not also an axis", value)
        fixed[name] = _value(reader, f"fixed.{name}", name, value)

    outputs = raw.get("outputs", list(solver.OUTPUTS))
    if not isinstance(outputs, (list, tuple)) or not outputs:
        reader.fail("outputs", "a non-empty list of output names", outputs)
    for name in outputs:
        if not isinstance(name, str):
            reader.fail("outputs", "a list of output names (strings)", outputs)
        if name not in solver.OUTPUTS:
            reader.unknown(name, list(solver.OUTPUTS), where="outputs")
    if len(set(outputs)) != len(outputs):
        twice = sorted({n for n in outputs if outputs.count(n) > 1})
        reader.fail("outputs", "distinct output names", f"{', '.join(twice)} more than once")

    constraints = raw.get("constraints", {})
    if not isinstance(constraints, Mapping):
        reader.fail("constraints", "a table", constraints)
    for key in constraints:
        if key not in CONSTRAINT_KEYS:
            reader.unknown(key, CONSTRAINT_KEYS, where="constraints")
    memory_limit = fraction = None
    if "memory_limit" in constraints:
        memory_limit, fraction = _memory_limit(reader, constraints["memory_limit"])
    max_acc = constraints.get("max_accelerators")
    if max_acc is not None and (isinstance(max_acc, bool) or not isinstance(max_acc, int)
                                or not 1 <= max_acc < solver.knobs.MAX_INTEGER):
        reader.fail("constraints.max_accelerators", "a whole number from 1 to 2**53 - 1",
                    max_acc)

    dtype = raw.get("dtype", "float64")
    if dtype not in _DTYPES:
        reader.fail("dtype", " or ".join(_DTYPES), dtype)
    name = raw.get("name", Path(source).stem if source != "<dict>" else "sweep")
    if not isinstance(name, str):
        reader.fail("name", "a string", name)
    description = raw.get("description", "")
    if not isinstance(description, str):
        reader.fail("description", "a string", description)
    return Spec(workloads=workloads, fleets=fleets, axes=tuple(axes), fixed=fixed,
                outputs=tuple(outputs), memory_limit=memory_limit,
                memory_limit_fraction=fraction, max_accelerators=max_acc, dtype=dtype,
                name=name, description=description, source=source,
                raw=raw)


def _memory_limit(reader, value):
    """A limit in bytes ("72 GB", 7.2e10) or a fraction of capacity (0 < x <= 1)."""
    key = "constraints.memory_limit"
    expected = "a size such as '72 GB', bytes, or a fraction of capacity in (0, 1]"
    if isinstance(value, str):
        try:
            size = parse_quantity(value, "bytes", where=f"{reader.source}: {key}")
        except OverflowError:
            size = math.inf
        except ValueError as err:
            raise SpecError(str(err)) from None
        if not (math.isfinite(size) and size > 0):
            reader.fail(key, "a finite size > 0 such as '72 GB'", value)
        return size, None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value) \
            or value <= 0:
        reader.fail(key, expected, value)
    return (None, float(value)) if value <= 1 else (float(value), None)
