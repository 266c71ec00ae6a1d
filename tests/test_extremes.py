"""Numbers at the edges: products of degrees never wrap, huge counts stay finite."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import solver

WL = solver.catalog.workload("Llama3_70B")
FL = solver.catalog.fleet("Training_1K")


@pytest.fixture(autouse=True)
def _warnings_are_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a wrapped or divided-by-zero integer warns
        # these layouts are invalid or unrealizable by design: solve says so, and that is
        # no failure here (test_unrealizable.py holds the warning)
        warnings.simplefilter("ignore", solver.physics.UnrealizableWarning)
        yield


@pytest.mark.parametrize("knobs", [
    dict(tp_size=2 ** 52 + 1, pp_size=8),            # product past int64 and float64 exactness
    dict(tp_size=2 ** 32 + 1, pp_size=2 ** 32 - 1),  # product wraps to a small number in int64
    dict(tp_size=2 ** 32, pp_size=2 ** 32),          # product wraps to 0 in int64
    dict(tp_size=2 ** 31, pp_size=2 ** 31, ep_size=2 ** 31),
])
def test_huge_splits_are_invalid_not_wrapped(knobs):
    out = solver.solve(WL, FL, batch_size=1024, **knobs)
    assert not out["valid"]
    assert np.isnan(out["step_latency_total"]) and np.isnan(out["dp_size"])


def test_cluster_sized_past_float_exactness_is_invalid():
    out = solver.solve(WL, FL, tp_size=2 ** 40, dp_size=2 ** 40)
    assert not out["valid"]
    out = solver.solve(WL, FL, tp_size=8, dp_size=np.array([2 ** 20, 2 ** 50]))
    np.testing.assert_array_equal(out["valid"], [True, False])


def test_token_products_do_not_wrap():
    # local_batch * seq_len = 2**37 * 2**20 = 2**57 tokens: fine in float, wraps nothing.
    out = solver.solve(WL, FL, batch_size=2 ** 50, seq_len=2 ** 20, tp_size=8)
    local_batch = 2 ** 50 // 128
    message = local_batch * 2 ** 20 * 8192 * 2.0
    ring = 2 * 7 / 8 * message / 450e9 + 2 * 7 * 500e-9
    expected = ring * 4 * 80
    assert out["tp_communication_latency"] == pytest.approx(expected, rel=1e-12)


def test_largest_fleet_and_model_stay_finite():
    big = solver.catalog.fleet("Mega_100K")  # 100,000 accelerators
    gpt4 = solver.catalog.workload("GPT4")   # 1.76e12 parameters, MoE
    out = solver.solve(gpt4, big, batch_size=2 ** 40, seq_len=2 ** 24, tp_size=8, pp_size=4,
                       ep_size=5, microbatch_count=2 ** 40, gradient_accumulation_steps=2 ** 40,
                       v_stages=2 ** 40, zero_stage=3)
    assert out["valid"]
    for name, value in out.items():
        if value.dtype != bool:
            assert np.isfinite(value), name
    assert out["dp_size"] == 100_000 / 160


def test_hundred_thousand_gpu_fleet_built_by_dp_size():
    # 100,000 one-GPU nodes... sized through dp_size on a one-GPU node.
    node = solver.Node("1x H100", solver.catalog.accelerator("H100"), 1, 450e9)
    fleet = solver.Fleet("one-GPU nodes", node, 1, solver.catalog.fabric("InfiniBand_NDR"))
    out = solver.solve(WL, fleet, batch_size=2 ** 20, tp_size=1, pp_size=8, dp_size=12_500)
    assert out["valid"] and np.isfinite(out["step_latency_total"])


def test_integer_knobs_past_2_53_are_refused():
    with pytest.raises(ValueError, match=r"tp_size must be below 2\*\*53.*9007199254740992"):
        solver.solve(WL, FL, tp_size=2 ** 53)
    with pytest.raises(ValueError, match="seq_len must be below 2"):
        solver.solve(WL, FL, seq_len=np.array([2048, 2 ** 60]))


def test_refusal_reports_plain_python_values():
    with pytest.raises(ValueError) as err:
        solver.solve(WL, FL, tp_size=np.array([1, 0]))
    assert "tp_size=0" in str(err.value) and "np.int64" not in str(err.value)


def test_largest_fleet_a_catalog_accepts_stays_finite():
    # 2**49 nodes of 8: 2**52 accelerators, the most solver.catalog.load_file accepts, with the
    # largest catalog model and knobs at their limits: no overflow, no NaN where valid.
    huge = solver.catalog.fleet("Mega_100K").with_count(2 ** 49)
    assert huge.total_accelerators == 2 ** 52
    gpt4 = solver.catalog.workload("GPT4")
    out = solver.solve(gpt4, huge, batch_size=2 ** 52, seq_len=2 ** 24, tp_size=8,
                       pp_size=np.array([1, 4, 2 ** 10]), ep_size=np.array([[1], [16]]),
                       microbatch_count=2 ** 40, gradient_accumulation_steps=2 ** 40,
                       v_stages=2 ** 40, zero_stage=3, efficiency=1e-9,
                       precision=np.array(["fp32", "int4"])[:, None, None])
    assert out["valid"].all()
    for name, value in out.items():
        if value.dtype != bool:
            assert np.isfinite(value).all(), name


@pytest.mark.parametrize("field, value", [
    ("parameters", 1e30),   # the largest model a catalog file accepts (solver.catalog.MAGNITUDE)
])
def test_largest_model_a_catalog_accepts_stays_finite(field, value):
    import dataclasses

    model = dataclasses.replace(WL, **{field: value})
    out = solver.solve(model, solver.catalog.fleet("Mega_100K"), tp_size=8, pp_size=4,
                       batch_size=2 ** 40, seq_len=2 ** 20)
    assert out["valid"]
    for name, v in out.items():
        if v.dtype != bool:
            assert np.isfinite(v), name


def test_factor_knobs_are_bounded_so_no_term_overflows():
    # Past MAX_FACTOR a slow-down factor is refused; at the bound every output is finite.
    with pytest.raises(ValueError, match="moe_routing_imbalance_factor must be a number"):
        solver.solve(WL, FL, tp_size=8, moe_routing_imbalance_factor=1e308)
    out = solver.solve(WL, FL, tp_size=8, ep_size=2, moe_routing_imbalance_factor=1e6,
                       congestion_factor=1e6, straggler_factor=1e6)
    assert out["valid"]
    assert all(np.isfinite(v) for k, v in out.items() if v.dtype != bool)
