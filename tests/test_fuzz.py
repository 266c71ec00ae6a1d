"""Fuzzing the edges: specs, solve inputs and user catalogs either work or are refused clearly.

Three targets, each fed bad and extreme inputs by hypothesis:

(a) the spec parser (``sweep.load_spec``): a valid spec with one bad value at
    one key (by category: wrong type, out of range, NaN/inf, huge, empty,
    duplicate, nested, misspelled key, ...), and fully random nested dicts. It
    returns a sane :class:`sweep.Spec` or raises :class:`sweep.SpecError` whose
    message names the key; never anything else.
(b) ``solver.solve``: random knob values (edge ints up to 2**64, NaN/inf floats,
    bools, strings, None, arrays that broadcast and that do not) on a few
    workloads and fleets. It returns outputs (no NaN in a float output where
    ``valid``; booleans are bools) or raises ``ValueError``/``TypeError`` naming
    the knob(s).
(c) the user catalog loader (``solver.catalog.load_file``) on TOML files written
    from valid entries with one bad value, key or reference, and random tables.
    It loads (and every loaded fleet and workload solves cleanly) or raises
    ``CatalogError`` naming the file and the table.

Every example is counted by category and outcome; set ``FUZZ_REPORT=<file>`` to
get the counts as JSON.
"""

from __future__ import annotations

import collections
import datetime
import json
import math
import os
import re
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import solver
import sweep
from solver import catalog
from solver.catalog import CatalogError
from solver.knobs import KNOBS, MAX_INTEGER
from sweep import cube as cube_
from sweep.spec import CONSTRAINT_KEYS, TOP_KEYS, SpecError



def _fuzz(examples):
    return settings(max_examples=examples, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

#: (target, category) -> Counter of outcomes ("accepted", "refused", "crashed", "unclear").
COUNTS: dict = collections.defaultdict(collections.Counter)


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    out = os.environ.get("FUZZ_REPORT")
    if out:
        table = {f"{target}: {category}": dict(counter)
                 for (target, category), counter in sorted(COUNTS.items())}
        with open(out, "w") as fh:
            json.dump(table, fh, indent=1, sort_keys=True)


NAN, INF = float("nan"), float("inf")
BAD_VALUES = {
    "bool": [True, False],
    "string": ["two", "", "1e3", "bf16", "8"],
    "float where an integer is expected": [2.5, 0.5, 1e300, 7.000001],
    "zero or negative": [0, -1, -2.5, -(2 ** 63), -1e-300],
    "huge": [2 ** 53, 2 ** 63 - 1, 2 ** 64, 10 ** 30, 10 ** 400, 1e308],
    "nan or inf": [NAN, INF, -INF],
    "list where a scalar is expected": [[1, 2], [], [[1]], ["bf16"]],
    "nested table": [{"a": 1}, {"from": {"x": 1}}, {"powers_of_two": {"a": 1}}, {}],
    "None": [None],
    "date or time (TOML)": [datetime.date(1979, 5, 27), datetime.time(7, 32),
                            datetime.datetime(1979, 5, 27, 7, 32)],
}
NUMBER_KNOBS = [k for k, knob in KNOBS.items() if knob.kind in ("int", "float")]
BASE = {"workload": "Llama3_70B", "fleet": "Training_1K",
        "axes": {"tp_size": [1, 2, 8], "pp_size": [1, 4]},
        "fixed": {"batch_size": 1024}, "constraints": {"memory_limit": "72 GB"}}
# Scalar places of a spec (key path as messages name it, how to set it in BASE).
TOP_PLACES = ["workload", "fleet", "outputs", "dtype", "name", "description", "catalog",
              "axes", "fixed", "constraints", "constraints.memory_limit",
              "constraints.max_accelerators"]


def _misspell(draw, name):
    """A near miss of ``name``: a letter dropped, doubled or swapped, or the case changed."""
    how = draw(st.sampled_from(["drop", "double", "swap", "upper", "suffix"]))
    i = draw(st.integers(0, len(name) - 2))
    if how == "drop":
        return name[:i] + name[i + 1:]
    if how == "double":
        return name[:i] + name[i] + name[i:]
    if how == "swap":
        return name[:i] + name[i + 1] + name[i] + name[i + 2:]
    if how == "upper":
        return name.upper()
    return name + "s"


def _with(spec, path, value):
    """A deep copy of ``spec`` with ``value`` at the dotted ``path``."""
    spec = json.loads(json.dumps(spec))
    keys = path.split(".")
    where = spec
    for key in keys[:-1]:
        where = where.setdefault(key, {})
    where[keys[-1]] = value
    return spec


@st.composite
def spec_mutations(draw):
    """``(category, key the message must name, spec dict)``: BASE with one thing wrong."""
    kind = draw(st.sampled_from(["value"] * 8 + [
        "unknown key", "empty axis", "duplicate values", "conflicting or huge range helper",
        "every point invalid"]))
    if kind == "value":
        category = draw(st.sampled_from(sorted(BAD_VALUES)))
        value = draw(st.sampled_from(BAD_VALUES[category]))
        place = draw(st.sampled_from(["axis value", "axis", "helper", "fixed", "top"]))
        knob = draw(st.sampled_from(sorted(KNOBS)))
        if place == "axis value":
            good = [1, 2] if KNOBS[knob].kind in ("int", "float") else []
            return category, f"axes.{knob}", _with(BASE, f"axes.{knob}", good + [value])
        if place == "axis":
            return category, f"axes.{knob}", _with(BASE, f"axes.{knob}", value)
        if place == "helper":
            helper = draw(st.sampled_from(["powers_of_two", "divisors_of", "from", "to", "step",
                                           "num", "log"]))
            table = {"from": 1, "to": 8} if helper in ("from", "to", "step", "num", "log") else {}
            table[helper] = value
            knob = draw(st.sampled_from(NUMBER_KNOBS))
            return category, f"axes.{knob}", _with(BASE, f"axes.{knob}", table)
        if place == "fixed":
            knob = draw(st.sampled_from([k for k in KNOBS if k not in BASE["axes"]]))
            return category, f"fixed.{knob}", _with(BASE, f"fixed.{knob}", value)
        key = draw(st.sampled_from(TOP_PLACES))
        return category, key, _with(BASE, key, value)
    if kind == "unknown key":
        where = draw(st.sampled_from(["", "axes", "fixed", "constraints", "outputs", "helper"]))
        choices = {"": TOP_KEYS, "axes": list(KNOBS), "fixed": list(KNOBS),
                   "constraints": CONSTRAINT_KEYS, "outputs": list(solver.OUTPUTS),
                   "helper": ["powers_of_two", "divisors_of", "from", "to", "step", "num"]}[where]
        real = draw(st.sampled_from(sorted(choices)))
        wrong = _misspell(draw, real)
        if wrong in choices:
            wrong = wrong + "_x"
        if where == "":
            return kind, wrong, {**BASE, wrong: 1}
        if where == "outputs":
            return kind, f"outputs.{wrong}", {**BASE, "outputs": ["mfu", wrong]}
        if where == "helper":
            return kind, "axes.tp_size", _with(BASE, "axes.tp_size", {"from": 1, "to": 4, wrong: 2})
        value = 1 if where != "constraints" else "72 GB"
        return kind, f"{where}.{wrong}", _with(BASE, f"{where}.{wrong}", value)
    if kind == "empty axis":
        knob = draw(st.sampled_from(sorted(KNOBS)))
        return kind, f"axes.{knob}", _with(BASE, f"axes.{knob}", [])
    if kind == "duplicate values":
        values = {"int": [1, 2, 2], "float": [0.5, 0.5], "bool": [True, True],
                  "precision": ["bf16", "BF16"], "topology": ["ring", "ring"]}
        knob = draw(st.sampled_from(sorted(KNOBS)))
        dup = values[KNOBS[knob].kind]
        if knob == "zero_stage":
            dup = [0, 1, 1]
        if KNOBS[knob].kind == "float" and KNOBS[knob].low == 1.0:
            dup = [1.5, 1.5]
        which = draw(st.sampled_from(["axis", "workload", "fleet"]))
        if which == "workload":
            return kind, "workload", {**BASE, "workload": ["GPT3", "GPT3"]}
        if which == "fleet":
            return kind, "fleet", {**BASE, "fleet": ["Training_1K", "Training_1K"]}
        return kind, f"axes.{knob}", _with(BASE, f"axes.{knob}", dup)
    if kind == "conflicting or huge range helper":
        table = draw(st.sampled_from([
            {"powers_of_two": 8, "from": 1, "to": 4},
            {"divisors_of": 12, "powers_of_two": 8},
            {"from": 1, "to": 8, "step": 1, "num": 3},
            {"from": 1, "to": 10 ** 15},
            {"from": 1, "to": 2 ** 62, "step": 1},
            {"from": 1, "to": 9, "num": 10 ** 12},
            {"divisors_of": 2 ** 62},
            {"powers_of_two": 2 ** 62},
            {"from": 1, "to": 8, "step": 1e-300},
            {"from": -INF, "to": 8},
            {"from": 1, "to": NAN, "num": 3},
            {"from": 8, "to": 1},
            {"from": 0.0, "to": 1.0, "num": 4, "log": True},
        ]))
        knob = draw(st.sampled_from(["microbatch_count", "efficiency", "congestion_factor"]))
        return kind, f"axes.{knob}", _with(BASE, f"axes.{knob}", table)
    # Every point invalid: the spec parses; a sweep refuses it before pricing anything.
    return kind, "no point of the space is a valid split", _with(
        BASE, "axes", {"tp_size": [3, 5], "pp_size": [3, 7]})


def _sane(spec: sweep.Spec) -> None:
    """An accepted spec holds only values a configuration can have."""
    for axis in spec.axes:
        if axis.kind in ("workload", "fleet"):
            continue
        assert axis.values is None or len(axis.values) >= 1
        values = axis.values if axis.values is not None else (axis.low, axis.high)
        assert len(set(values)) == len(values), axis
        for value in values:
            if axis.kind in ("int", "float"):
                assert not isinstance(value, bool) and math.isfinite(value), (axis.name, value)
                assert abs(value) < MAX_INTEGER, (axis.name, value)
            solver.knobs.normalize({axis.name: value})
    solver.knobs.normalize(dict(spec.fixed))
    if spec.memory_limit is not None:
        assert math.isfinite(spec.memory_limit) and spec.memory_limit > 0
    if spec.memory_limit_fraction is not None:
        assert 0 < spec.memory_limit_fraction <= 1
    if spec.max_accelerators is not None:
        assert 1 <= spec.max_accelerators < MAX_INTEGER
    if not any(axis.is_continuous for axis in spec.axes):
        assert isinstance(spec.size, int) and spec.size >= 1
    assert isinstance(spec.name, str) and isinstance(spec.description, str)


def _clear(message: str, key: str) -> bool:
    return bool(message) and key in message and "<dict>" in message


@_fuzz(400)
@given(spec_mutations())
def test_spec_parser_refuses_clearly(case):
    category, key, raw = case
    counter = COUNTS["spec", category]
    try:
        spec = sweep.load_spec(raw)
        if category == "every point invalid":
            cube_.check_some_valid(spec)
    except SpecError as err:
        message = str(err)
        outcome = "refused" if _clear(message, key) else "unclear"
        counter[outcome] += 1
        assert outcome == "refused", f"{category}: {key!r} not named in: {message}"
        return
    except Exception as err:  # noqa: BLE001 - the point is to catch anything
        counter["crashed"] += 1
        raise AssertionError(f"{category} at {key}: {type(err).__name__}: {err}") from err
    counter["accepted"] += 1
    _sane(spec)


# Random nested dicts: real keys, misspellings and junk; valid and invalid values.
_names = st.sampled_from(list(TOP_KEYS) + list(KNOBS) + list(CONSTRAINT_KEYS)
                         + ["powers_of_two", "divisors_of", "from", "to", "step", "num", "log",
                            "mfu", "axess", "tp_sise", "fixd", "memory_limt", ""])
_scalars = st.one_of(
    st.integers(-(2 ** 64), 2 ** 64), st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(), st.text(max_size=6), st.none(),
    st.sampled_from(["Llama3_70B", "Training_1K", "GPT3", "Research_256", "bf16", "fp8", "ring",
                     "72 GB", "0.9", "nan GB", "1e400 GB", "-5 GB", "layers", "fleet",
                     "float32", datetime.date(2024, 1, 1)]))
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(_names, inner, max_size=4)), max_leaves=12)


_plausible = st.sampled_from([1, 2, 4, 8, 64, 0.5, 0.9, 1.5, True, False, "bf16", "fp8", "ring",
                              0, -1, 2.5, NAN, "72 GB", 0.8, 512])
_loose = st.one_of(_plausible, _scalars)
_axis_values = st.one_of(
    st.lists(_loose, max_size=4),
    st.dictionaries(st.sampled_from(["powers_of_two", "divisors_of", "from", "to", "step", "num",
                                     "log", "form"]), _loose, max_size=3),
    _values)


@_fuzz(200)
@given(st.dictionaries(st.sampled_from(list(TOP_KEYS) + ["axess", "fixd", "output"]),
                       st.one_of(_loose, _values), max_size=4),
       st.sampled_from([{}, {"workload": "Llama3_70B", "fleet": "Training_1K"},
                        {"workload": ["GPT3", "Mixtral_8x7B"], "fleet": "Research_256"}]),
       st.dictionaries(st.sampled_from(list(KNOBS) + ["tp_sise"]), _axis_values, max_size=4),
       st.dictionaries(st.sampled_from(list(KNOBS)), _loose, max_size=3),
       st.dictionaries(st.sampled_from(list(CONSTRAINT_KEYS) + ["memory_limt"]), _loose,
                       max_size=2))
def test_spec_parser_on_random_dicts(raw, base, axes, fixed, constraints):
    counter = COUNTS["spec", "random nested dict"]
    raw = {**base, **raw}
    for key, value in (("axes", axes), ("fixed", fixed), ("constraints", constraints)):
        if value:
            raw.setdefault(key, value)
    try:
        spec = sweep.load_spec(raw)
    except SpecError as err:
        outcome = "refused" if str(err).startswith("<dict>: ") else "unclear"
        counter[outcome] += 1
        assert outcome == "refused", str(err)
        return
    except Exception as err:  # noqa: BLE001
        counter["crashed"] += 1
        raise AssertionError(f"{type(err).__name__}: {err} for {raw!r}") from err
    counter["accepted"] += 1
    _sane(spec)


# ------------------------------------------------------------------------------- solve

WORKLOADS = [catalog.workload(n) for n in ("Llama3_70B", "Mixtral_8x7B", "ResNet50",
                                           "Mamba_2_8B", "StableDiffusion_v1_5", "DLRM")]
FLEETS = [catalog.fleet(n) for n in ("Training_1K", "Research_256", "Mega_100K", "Lab_64_A100")]

KNOB_VALUES = {
    "int edge": [0, -1, 1, 2, 3, 8, 2 ** 31, 2 ** 52, 2 ** 53 - 1, 2 ** 53, 2 ** 62,
                 2 ** 63 - 1, 2 ** 63, 2 ** 64],
    "float edge": [NAN, INF, -INF, 0.0, -0.0, 5e-324, 1e-9, 0.5, 1.0, 1.5, 1e308],
    "bool": [True, False, np.True_],
    "string": ["bf16", "FP8", "fp4", "", "8"],
    "None": [None],
    "array": [np.array([1, 2, 4]), np.array([[1], [8]]), np.array([0.5, np.nan]),
              np.array([True, False]), np.array(["bf16", "fp8"]), np.array([], dtype=np.int64),
              np.array([], dtype=str), np.array(["bf16", "fp8"], dtype=object), ["bf16"],
              np.array(5), np.array([2 ** 63], dtype=np.uint64), np.array([1, "a"], dtype=object),
              np.arange(24).reshape(2, 3, 4) % 7 + 1, [1, 2, 4], [[1, 2], [3]]],
}


@st.composite
def knob_sets(draw):
    category = draw(st.sampled_from(sorted(KNOB_VALUES) + ["arrays that do not broadcast"]))
    if category == "arrays that do not broadcast":
        a, b = draw(st.lists(st.sampled_from(NUMBER_KNOBS), min_size=2, max_size=2, unique=True))
        return category, {a: np.ones(2, dtype=np.int64), b: np.ones(3, dtype=np.int64)}
    names = draw(st.lists(st.sampled_from(sorted(KNOBS)), min_size=1, max_size=3, unique=True))
    return category, {name: draw(st.sampled_from(KNOB_VALUES[category])) for name in names}


def _check_outputs(out):
    valid = out["valid"]
    assert valid.dtype == bool
    shape = valid.shape
    for name, value in out.items():
        assert value.shape == shape, name
        if solver.OUTPUTS[name].is_boolean:
            assert value.dtype == bool, name
        else:
            assert value.dtype == np.float64, name
            assert not np.isnan(value[valid]).any(), f"NaN in {name} where valid"


@_fuzz(400)
@given(knob_sets(), st.sampled_from(WORKLOADS), st.sampled_from(FLEETS))
def test_solve_refuses_clearly_or_prices_cleanly(case, workload, fleet):
    category, knobs = case
    counter = COUNTS["solve", category]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # an overflow or invalid operation is a failure too
            warnings.simplefilter("ignore", solver.physics.UnrealizableWarning)  # drawn so
            out = solver.solve(workload, fleet, **knobs)
    except (ValueError, TypeError) as err:
        message = str(err)
        named = [k for k in knobs if k in message]
        if category == "arrays that do not broadcast":
            clear = len(named) == 2 and "shape" in message
        else:
            clear = bool(named)
        counter["refused" if clear else "unclear"] += 1
        assert clear, f"{knobs!r}: {message}"
        return
    except Exception as err:  # noqa: BLE001 - an overflow warning (RuntimeWarning) included
        counter["crashed"] += 1
        raise AssertionError(f"{knobs!r}: {type(err).__name__}: {err}") from err
    counter["accepted"] += 1
    _check_outputs(out)


# ----------------------------------------------------------------------------- catalog

VALID_CATALOG = {
    "accelerators": {"X1": {"peak_flops": "500 TFLOP/s", "memory_capacity": "96 GiB",
                            "memory_bandwidth": "4 TB/s", "tdp": "800 W",
                            "precision_flops": {"fp8": "1000 TFLOP/s"}}},
    "nodes": {"X1_box": {"accelerator": "X1", "accelerators_per_node": 8,
                         "intra_node_bandwidth": "450 GB/s"}},
    "fabrics": {"Net": {"bandwidth": "400 Gbps", "latency": "5 us", "oversubscription": 1.0}},
    "fleets": {"Pod": {"node": "X1_box", "count": 16, "fabric": "Net"},
               "Builtin_node_pod": {"node": "DGX_H100", "count": 4, "fabric": "InfiniBand_NDR"}},
    "workloads": {"Tiny": {"kind": "transformer", "parameters": 1.0e9, "layers": 16,
                           "hidden_dim": 2048, "heads": 16}},
}


def _toml_key(key):
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(
            value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def _toml(data: dict) -> str:
    """A small TOML writer: top-level tables of tables (or plain values)."""
    lines = []
    for top, value in data.items():
        if not isinstance(value, dict):
            lines.append(f"{_toml_key(top)} = {_toml_value(value)}")
    for top, value in data.items():
        if not isinstance(value, dict):
            continue
        for key, entry in value.items():
            if isinstance(entry, dict):
                lines.append(f"[{_toml_key(top)}.{_toml_key(key)}]")
                lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in entry.items()]
            else:
                lines.append(f"[{_toml_key(top)}]")
                lines.append(f"{_toml_key(key)} = {_toml_value(entry)}")
    return "\n".join(lines) + "\n"


TOML_BAD = {k: [v for v in vs if not (isinstance(v, int) and not isinstance(v, bool)
                                      and abs(v) >= 2 ** 63) and v is not None]
            for k, vs in BAD_VALUES.items() if k != "None"}
TOML_BAD["quantity string"] = ["-5 GB", "0 W", "1e400 GB", "nan GB", "5", "5 parsecs", "5 GB/s",
                               "99999999999999999999999999999999 GB", "1e-300 TFLOP/s",
                               "1e-300 GB/s", "1e300 W"]


@st.composite
def catalog_mutations(draw):
    data = json.loads(json.dumps(VALID_CATALOG))
    kind = draw(st.sampled_from(["value"] * 6 + [
        "unknown key", "missing key", "unknown reference", "junk table", "fleet count 0",
        "huge fleet"]))
    section = draw(st.sampled_from(sorted(data)))
    entry = next(iter(data[section]))
    table = f"{section}.{entry}"
    if kind == "value":
        category = draw(st.sampled_from(sorted(TOML_BAD)))
        field = draw(st.sampled_from(sorted(catalog._SCHEMA[section])))
        data[section][entry][field] = draw(st.sampled_from(TOML_BAD[category]))
        return f"value: {category}", table, data
    if kind == "unknown key":
        real = draw(st.sampled_from(sorted(catalog._SCHEMA[section])))
        wrong = _misspell(draw, real)
        if wrong in catalog._SCHEMA[section]:
            wrong += "_x"
        data[section][entry][wrong] = 1
        return kind, table, data
    if kind == "missing key":
        required = [f for f, spec in catalog._SCHEMA[section].items() if spec.required]
        field = draw(st.sampled_from(required))
        data[section][entry].pop(field, None)
        return kind, table, data
    if kind == "unknown reference":
        section, field = draw(st.sampled_from([("nodes", "accelerator"), ("fleets", "node"),
                                               ("fleets", "fabric")]))
        entry = next(iter(data[section]))
        data[section][entry][field] = draw(st.sampled_from(["H1OO", "X2", "DGX_H10", ""]))
        return kind, f"{section}.{entry}", data
    if kind == "junk table":
        junk = draw(st.sampled_from([{"fleet": {"A": {"count": 1}}}, {"fleets": 5},
                                     {"fleets": {"A": 5}}, {"workloads": {"W": {"kind": "llm"}}},
                                     {"workloads": {"W": {"kind": "moe", "parameters": 1e9}}},
                                     {"accelerators": {"A": {}}}, {"title": "x"}]))
        return kind, "", {**data, **junk}
    if kind == "fleet count 0":
        data["fleets"]["Pod"]["count"] = draw(st.sampled_from([0, -8]))
        return kind, "fleets.Pod", data
    # 2**49 nodes of 8 is the largest fleet accepted (2**52 accelerators).
    data["fleets"]["Pod"]["count"] = draw(st.sampled_from([2 ** 40, 2 ** 49, 2 ** 50, 2 ** 62]))
    return kind, "fleets.Pod", data


@_fuzz(300)
@given(catalog_mutations())
def test_catalog_loader_refuses_clearly(tmp_path_factory, case):
    category, table, data = case
    counter = COUNTS["catalog", category]
    path = tmp_path_factory.mktemp("catalog") / "mine.toml"
    path.write_text(_toml(data))
    try:
        loaded = catalog.load_file(path)
    except CatalogError as err:
        message = str(err)
        clear = str(path) in message and (table in message or not table)
        counter["refused" if clear else "unclear"] += 1
        assert clear, f"{category}: {table!r} not named in: {message}"
        return
    except Exception as err:  # noqa: BLE001
        counter["crashed"] += 1
        raise AssertionError(f"{category}: {type(err).__name__}: {err}\n{_toml(data)}") from err
    counter["accepted"] += 1
    # Whatever loads prices cleanly: no NaN where valid, no overflow warning.
    for fleet in loaded["fleets"].values():
        assert fleet.total_accelerators < MAX_INTEGER
        for workload in list(loaded["workloads"].values()) + [WORKLOADS[0]]:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                warnings.simplefilter("ignore", solver.physics.UnrealizableWarning)
                out = solver.solve(workload, fleet, tp_size=np.array([1, 8]),
                                   pp_size=np.array([[1], [4]]), batch_size=1024)
            _check_outputs(out)
