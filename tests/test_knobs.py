"""Knob validation: every refused value raises ValueError naming the knob and the value.

A value no configuration could have is refused loudly (the "Raises" section of
``solver.solve``, solver/physics/__init__.py); an impossible *split* is reported
as valid=False instead (test_solve.py).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import solver
from solver import catalog

WL = catalog.workload("Llama3_8B")
FL = catalog.fleet("Lab_64_H100")

INT_KNOBS = ("batch_size", "tp_size", "pp_size", "ep_size", "v_stages", "microbatch_count",
             "gradient_accumulation_steps", "seq_len", "dp_size")
BOOL_KNOBS = ("is_lora", "activation_recomputation", "overlap_comm")

#: knob -> values it must refuse
BAD = {
    **{name: [0, -1, 2.5] for name in INT_KNOBS},
    "zero_stage": [4, -1, 2.5],
    "efficiency": [0, 0.0, -0.1, 1.5, math.nan, math.inf],
    "overlap_efficiency": [-0.1, 1.1],
    "congestion_factor": [0.5, 0.0],
    "straggler_factor": [0.5, 0.0],
    "moe_routing_imbalance_factor": [0.5, 0.0],
    "precision": ["fp12", 16, "fp16 ", ""],
    **{name: [2, "yes", -1, 0.5] for name in BOOL_KNOBS},
    "topology_override": ["mesh", "Ring"],
}

CASES = [(name, value) for name, values in BAD.items() for value in values]


def test_every_knob_has_refused_values():
    assert set(BAD) == set(solver.KNOBS)


def _tokens(value) -> set:
    """How the value may read in a message: repr for strings; a number as given or as a float
    (a float knob converts 0 to 0.0 before it checks it)."""
    if isinstance(value, str):
        return {repr(value)}
    return {str(value), str(float(value))}


def assert_names_value(message: str, name: str, value):
    assert name in message, message
    assert "got" in message, message
    after = message.split("got", 1)[1]
    # the value as a whole token (so "1" does not match inside "1.5" or "-1")
    assert any(re.search(rf"(?<![\w.\-]){re.escape(token)}(?![\w.])", after)
               for token in _tokens(value)), (message, _tokens(value))


@pytest.mark.parametrize("name, value", CASES, ids=[f"{n}={v!r}" for n, v in CASES])
def test_refused_scalar(name, value):
    with pytest.raises(ValueError) as info:
        solver.solve(WL, FL, **{name: value})
    assert_names_value(str(info.value), name, value)


#: knob -> (good values, the one bad value), for arrays holding one bad value
ONE_BAD = {
    **{name: ([4, 8, 16], -1) for name in INT_KNOBS},
    "tp_size": ([4, 2, 8], 0),
    "pp_size": ([2.0, 4.0, 8.0], 2.5),
    "zero_stage": ([0, 1, 3], 4),
    "efficiency": ([0.25, 0.5, 0.75], 1.5),
    "overlap_efficiency": ([0.25, 0.5, 0.75], 1.1),
    "congestion_factor": ([1.0, 2.0, 3.0], 0.5),
    "straggler_factor": ([1.0, 2.0, 3.0], 0.5),
    "moe_routing_imbalance_factor": ([1.0, 2.0, 3.0], 0.5),
    "precision": (["fp16", "bf16", "FP8"], "fp12"),
    **{name: ([0, 1, 1], 7) for name in BOOL_KNOBS},
}


@pytest.mark.parametrize("name", sorted(ONE_BAD))
@pytest.mark.parametrize("position", [0, 2])
def test_array_with_one_bad_value_reports_it(name, position):
    good, bad = ONE_BAD[name]
    values = list(good)
    values.insert(position, bad)
    array = np.array(values).reshape(2, 2)
    with pytest.raises(ValueError) as info:
        solver.solve(WL, FL, **{name: array})
    assert_names_value(str(info.value), name, bad)


def test_nan_in_array_is_reported():
    with pytest.raises(ValueError) as info:
        solver.solve(WL, FL, efficiency=np.array([0.5, np.nan, 0.7]))
    assert_names_value(str(info.value), "efficiency", math.nan)
    with pytest.raises(ValueError, match="tp_size"):
        solver.solve(WL, FL, tp_size=np.array([1.0, np.nan]))


@pytest.mark.parametrize("empty", [np.array([], dtype=str), np.array([], dtype=object), [],
                                   np.empty((0, 3), dtype="<U4")], ids=["str", "object", "list",
                                                                         "2d"])
def test_empty_precision_array_names_the_knob(empty):
    # Before: numpy's "cannot reshape array of size 0 into shape (0,newaxis)".
    with pytest.raises(ValueError, match=r"^precision must be a string or a non-empty array of "
                                         r"strings .*, but got an empty array"):
        solver.solve(WL, FL, precision=empty)


def test_bool_arrays_refused_for_numeric_knobs():
    with pytest.raises(ValueError, match="tp_size"):
        solver.solve(WL, FL, tp_size=np.array([True, False]))
    with pytest.raises(ValueError, match="efficiency"):
        solver.solve(WL, FL, efficiency=True)


def test_string_refused_for_numeric_knobs():
    with pytest.raises(ValueError, match="batch_size"):
        solver.solve(WL, FL, batch_size="64")
    with pytest.raises(ValueError, match="straggler_factor"):
        solver.solve(WL, FL, straggler_factor="1.0")


def test_message_says_what_was_expected():
    with pytest.raises(ValueError, match=r"tp_size must be an integer >= 1.*but got tp_size=0"):
        solver.solve(WL, FL, tp_size=0)
    with pytest.raises(ValueError, match=r"zero_stage .*<= 3.*but got zero_stage=4"):
        solver.solve(WL, FL, zero_stage=4)
    with pytest.raises(ValueError, match=r"precision must be one of fp32, tf32, bf16, fp16, fp8, int8, int4"):
        solver.solve(WL, FL, precision="fp12")


# ------------------------------------------------------------------ wrong types


class NotASpec:
    name = "Llama3_8B"


@pytest.mark.parametrize("workload", [None, NotASpec(), FL])
def test_non_spec_workload_is_type_error(workload):
    with pytest.raises(TypeError, match="workload"):
        solver.solve(workload, FL)


@pytest.mark.parametrize("fleet", [None, NotASpec(), WL, FL.node])
def test_non_spec_fleet_is_type_error(fleet):
    with pytest.raises(TypeError, match="fleet"):
        solver.solve(WL, fleet)


def test_type_error_points_to_the_converters():
    # (mlsysim objects themselves are not imported here: importing mlsysim takes ~10 s)
    with pytest.raises(TypeError, match=r"solver\.from_mlsysim.*but got NotASpec"):
        solver.solve(NotASpec(), FL)
    with pytest.raises(TypeError, match=r"solver\.catalog\.fleet.*but got Node"):
        solver.solve(WL, FL.node)


def test_catalog_names_are_looked_up_and_a_wrong_one_names_the_closest():
    """``solve("Llama3_8B", "Training_1K")`` is ``solve(catalog.workload(...), catalog.fleet(...))``
    (it had been a TypeError pointing to the lookup a newcomer then had to write)."""
    knobs = dict(batch_size=256, tp_size=np.array([1, 2, 8]), microbatch_count=8)
    by_name = solver.solve("Llama3_8B", "Training_1K", **knobs)
    by_spec = solver.solve(solver.catalog.workload("Llama3_8B"), solver.catalog.fleet("Training_1K"),
                           **knobs)
    for name in by_spec:
        np.testing.assert_array_equal(by_name[name], by_spec[name])
    with pytest.raises(solver.catalog.CatalogError, match="did you mean 'Llama3_8B'"):
        solver.solve("Llama3_8b", "Training_1K")
    with pytest.raises(solver.catalog.CatalogError, match="fleet"):
        solver.solve("Llama3_8B", "Training_1k_nope")


@pytest.mark.parametrize("kwargs", [dict(tensor_parallel=2), dict(tp=2), dict(dp=8),
                                    dict(Precision="fp16")])
def test_unknown_keyword_is_type_error(kwargs):
    with pytest.raises(TypeError):
        solver.solve(WL, FL, **kwargs)


# ------------------------------------------------------------------ accepted edge values

ACCEPTED = [
    dict(efficiency=1.0),
    dict(efficiency=1e-9),
    dict(efficiency=1),
    dict(overlap_efficiency=0.0, overlap_comm=True),
    dict(overlap_efficiency=1.0, overlap_comm=True),
    dict(overlap_efficiency=0, overlap_comm=1),
    dict(zero_stage=0),
    dict(zero_stage=3),
    dict(zero_stage=3.0),
    dict(tp_size=4.0),
    dict(tp_size=np.array([1.0, 2.0, 8.0])),
    dict(tp_size=np.int32(2), pp_size=np.uint8(2)),
    dict(batch_size=1, seq_len=1, microbatch_count=1, v_stages=1, gradient_accumulation_steps=1),
    dict(congestion_factor=1.0, straggler_factor=1.0, moe_routing_imbalance_factor=1.0),
    dict(congestion_factor=1, straggler_factor=100.0),
    dict(is_lora=0, activation_recomputation=1, overlap_comm=0),
    dict(is_lora=np.array([0, 1]), overlap_comm=np.array([1.0, 0.0])),
    dict(is_lora=np.True_, overlap_comm=[True, False]),
    dict(precision="FP8"),
    dict(precision=np.str_("int4")),
    dict(precision=np.array(["fp16", "Fp32"], dtype=object)),
    dict(topology_override=None),
    dict(topology_override="ring"),
    dict(topology_override="tree"),
]


@pytest.mark.parametrize("kwargs", ACCEPTED, ids=[repr(k) for k in ACCEPTED])
def test_accepted_edge_values(kwargs):
    out = solver.solve(WL, FL, **kwargs)
    assert np.all(out["valid"])
    assert np.all(np.isfinite(out["step_latency_total"]))


def _same(a, b):
    for name in solver.OUTPUTS:
        assert np.array_equal(a[name], b[name], equal_nan=a[name].dtype != bool), name


def test_whole_floats_equal_ints():
    _same(solver.solve(WL, FL, batch_size=256.0, tp_size=4.0, pp_size=2.0, microbatch_count=8.0,
                       zero_stage=2.0, seq_len=4096.0),
          solver.solve(WL, FL, batch_size=256, tp_size=4, pp_size=2, microbatch_count=8,
                       zero_stage=2, seq_len=4096))


def test_int_booleans_equal_bools():
    _same(solver.solve(WL, FL, batch_size=256, is_lora=1, activation_recomputation=0, overlap_comm=1),
          solver.solve(WL, FL, batch_size=256, is_lora=True, activation_recomputation=False,
                       overlap_comm=True))


def test_topology_override_changes_nothing():
    base = solver.solve(WL, FL, batch_size=256, tp_size=[1, 2, 4])
    for topology in ("ring", "tree"):
        _same(solver.solve(WL, FL, batch_size=256, tp_size=[1, 2, 4], topology_override=topology), base)


def test_knob_table_matches_solve_signature():
    import inspect
    # solver.solve dispatches (physics=, **knobs); the mlsysim model carries the signature
    # (and ``engine``, which picks the path, not a configuration).
    params = inspect.signature(solver.physics.mlsysim.solve).parameters
    keywords = [p for p in params if p not in ("workload", "fleet", "engine")]
    assert keywords == list(solver.KNOBS)
    for name in keywords:
        assert params[name].default == solver.KNOBS[name].default, name


def test_megatron_knob_table_matches_its_solve_signature():
    """The megatron model's solve takes its knobs by name, every one of KNOBS with its default
    (solve reads them back by those names: a knob in one and not the other would go unread)."""
    import inspect
    from solver.physics import megatron
    params = inspect.signature(megatron.solve).parameters
    keywords = [p for p in params if p not in ("workload", "fleet", "engine", "check_shape",
                                               "constants")]
    assert sorted(keywords) == sorted(megatron.KNOBS)
    for name in keywords:
        assert params[name].default == megatron.KNOBS[name].default, name


@pytest.mark.parametrize("physics", ["mlsysim", "megatron"])
def test_a_masked_array_with_masked_entries_is_refused_not_priced(physics):
    import solver
    from solver import catalog
    wl = catalog.workload("Llama3_70B_MC" if physics == "megatron" else "Llama3_70B")
    fl = catalog.fleet("HGX_H100_1K_MC" if physics == "megatron" else "Training_1K")
    tp = np.ma.masked_array([1, 2, 4, 8], mask=[False, True, False, False])
    with pytest.raises(ValueError, match=r"tp_size is a masked array .*tp_size\.compressed\(\)"):
        solver.solve(wl, fl, physics=physics, batch_size=1024, tp_size=tp)
    # no entry masked: the values are priced as a plain array's
    plain = solver.solve(wl, fl, physics=physics, batch_size=1024, tp_size=np.array([1, 2, 4, 8]))
    same = solver.solve(wl, fl, physics=physics, batch_size=1024,
                        tp_size=np.ma.masked_array([1, 2, 4, 8]))
    np.testing.assert_array_equal(np.asarray(same["step_latency_total"]),
                                  plain["step_latency_total"])
