"""The fused kernel of the mlsysim physics (solver.fused.mlsysim_kernel) against its numpy path.

Two implementations of one physics must not drift: on seeded random draws over
every catalog workload and a spread of fleets (catalog ones, and variants that
lack a fabric latency, an NVLink latency, a TDP or a host link, with one
accelerator per node, one node, on-chip SRAM and flash tiers), the kernel's
outputs equal the numpy path's bit for bit (NaN where the numpy path has NaN),
with the same dtypes; the draw is checked to reach every branch. Also: the
fused result equals the reference, mlsysim 0.3.0, at rtol 1e-9; ``engine``
picks the path as documented and falls back to numpy without numba.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest

import solver
from solver import catalog, fused
from solver.specs import Fabric, Fleet, Node

pytestmark = pytest.mark.skipif(not fused.NUMBA, reason="numba is not installed")

SEED = 20261201
N = 240  # configurations per workload and fleet
NAMES = ["fp32", "tf32", "bf16", "fp16", "FP16", "fp8", "Int8", "int4"]


def _fleets():
    """Catalog fleets and variants for the rare branches (each a solver spec)."""
    base = catalog.fleet("Training_1K")
    h100 = base.node.accelerator
    ib = base.fabric
    no_latency = Fabric("200G, latency unstated, 4:1", bandwidth=25e9, latency=None,
                        oversubscription=4.0)
    bare = dataclasses.replace(catalog.accelerator("MI300X"), nvlink_latency=None,
                               host_link_bandwidth=None, tdp=None)
    tiny = dataclasses.replace(h100, name="H100 with SRAM and flash tiers", sram_capacity=4e8,
                               sram_bandwidth=2e13, flash_bandwidth=1e12, memory_capacity=2e9)
    out = {name: catalog.fleet(name) for name in (
        "Training_1K", "Research_256", "Kempner_H100_384", "GB200_NVL72_8_MC", "Selene_MC",
        "Lab_64_A100")}
    out.update({
        "one_gpu_nodes": Fleet("64 one-GPU nodes", Node("1x H100", h100, 1, 450e9), 64,
                               dataclasses.replace(ib, oversubscription=2.0)),
        "one_node": dataclasses.replace(base, name="one node", count=1),
        "bare_mi300x": Fleet("MI300X, nothing stated", Node("8x MI300X", bare, 8, 448e9), 12,
                             no_latency),
        "four_gpu_nodes": Fleet("A100 4-GPU", Node("4x A100", catalog.accelerator("A100"), 4,
                                                   300e9), 6, ib),
        "tiers": Fleet("tiers", Node("2x tiers", tiny, 2, 1e9), 2, ib),
    })
    return out


FLEETS = _fleets()
WORKLOADS = {name: catalog.workload(name) for name in catalog.names("workloads")}


def _log_int(rng, low, high, n):
    return np.exp(rng.uniform(np.log(low), np.log(high), n)).round().astype(np.int64)


def _draw(rng, n, workload):
    """Every knob over its range, as flat arrays; splits often impossible, often one accelerator."""
    tp = rng.choice([1, 2, 3, 4, 8, 16, 32, 64], n)
    pp = rng.choice([1, 2, 4, 5, 8, 16], n)
    ep = rng.choice([1, 1, 2, 4, 8], n)
    alone = rng.random(n) < (0.5 if not workload.is_transformer else 0.15)
    tp, pp, ep = (np.where(alone, 1, d) for d in (tp, pp, ep))
    return {
        "batch_size": _log_int(rng, 1, 16384, n),
        "precision": rng.choice(NAMES, n),
        "efficiency": np.where(rng.random(n) < 0.2, 1.0, rng.uniform(0.01, 1.0, n)),
        "tp_size": tp, "pp_size": pp, "ep_size": ep,
        "v_stages": rng.integers(1, 5, n),
        "microbatch_count": _log_int(rng, 1, 256, n),
        "zero_stage": rng.integers(0, 4, n),
        "is_lora": rng.random(n) < 0.25,
        "activation_recomputation": rng.random(n) < 0.5,
        "overlap_comm": rng.random(n) < 0.5,
        "overlap_efficiency": rng.choice([0.0, 1.0, 0.37, 0.85], n),
        "congestion_factor": np.where(rng.random(n) < 0.5, 1.0, rng.uniform(1, 3, n)),
        "straggler_factor": np.where(rng.random(n) < 0.5, 1.0, rng.uniform(1, 1.6, n)),
        "moe_routing_imbalance_factor": np.where(rng.random(n) < 0.5, 1.0, rng.uniform(1, 2.5, n)),
        "gradient_accumulation_steps": rng.choice([1, 1, 2, 4, 7, 16], n),
        "seq_len": _log_int(rng, 1, 65536, n),
    }


def assert_same(fused_out, numpy_out, where=""):
    """Bitwise equal outputs (NaN where NaN), same names, order and dtypes."""
    assert list(fused_out) == list(numpy_out), where
    for name, expected in numpy_out.items():
        got = fused_out[name]
        expected = np.asarray(expected)
        assert got.dtype == expected.dtype and got.shape == expected.shape, (name, where)
        np.testing.assert_array_equal(got, expected, err_msg=f"{name} {where}", strict=True)


def _branches(workload, fleet, knobs, out, dp_given):
    """Which branches of the numpy path each configuration takes (for the coverage check)."""
    valid = out["valid"]
    tp, pp, ep = (np.where(valid, knobs[k], 1) for k in ("tp_size", "pp_size", "ep_size"))
    replica = tp * pp * ep
    dp = np.where(valid, np.nan_to_num(out["dp_size"]), 1).astype(np.int64)
    apn = fleet.node.accelerators_per_node
    rpn = np.maximum(1, apn // replica)
    spanned = -(-dp // rpn)
    v = valid
    hit = {
        "invalid split": ~v,
        "dp ring in node": v & (dp > 1) & (spanned == 1),
        "dp ring across nodes": v & (dp > 1) & (spanned > 1) & (rpn == 1),
        "dp hierarchical": v & (dp > 1) & (spanned > 1) & (rpn > 1),
        "tp across nodes": v & (tp > apn),
        "ep all-to-all": v & (ep > 1),
        "offload": v & ~out["feasible"],
        "idle ranks": out["idle_ranks"],
        "realizable": out["realizable"],
        "lora": v & knobs["is_lora"],
    }
    if not workload.is_transformer:
        hit["single accelerator"] = v & (replica == 1)
        hit["non-transformer sharded"] = v & (replica > 1)
    if workload.kind == "moe":
        hit["moe"] = v
    if dp_given:
        hit["dp_size given"] = v
    if fleet.node.accelerator.tdp is None:
        hit["no tdp"] = v
    if fleet.fabric.latency is None or fleet.node.accelerator.nvlink_latency is None:
        hit["latency fallback"] = v
    if fleet.node.accelerator.sram_capacity is not None:
        hit["sram or flash tier"] = v & (replica == 1) & out["feasible"] & (
            not workload.is_transformer)
    return {name: int(np.count_nonzero(mask)) for name, mask in hit.items()}


def test_fused_equals_numpy_bitwise_on_every_branch():
    rng = np.random.default_rng(SEED)
    coverage = collections.Counter()
    for fleet_key, fleet in FLEETS.items():
        names = (sorted(WORKLOADS) if fleet_key in ("Training_1K", "bare_mi300x", "tiers",
                                                     "one_gpu_nodes")
                 else sorted(rng.choice(sorted(WORKLOADS), 12, replace=False)))
        for wl_key in names:
            workload = WORKLOADS[wl_key]
            knobs = _draw(rng, N, workload)
            dp_given = rng.random() < 0.3
            if dp_given:
                knobs["dp_size"] = rng.choice([1, 2, 3, 4, 8, 16, 64], N)
            where = f"{wl_key} on {fleet_key}"
            ours = solver.solve(workload, fleet, engine="fused", **knobs)
            expected = solver.solve(workload, fleet, engine="numpy", **knobs)
            assert_same(ours, expected, where)
            coverage.update(_branches(workload, fleet, knobs, expected, dp_given))
    print("\nbranches:", dict(sorted(coverage.items())))
    for branch in ("invalid split", "dp ring in node", "dp ring across nodes", "dp hierarchical",
                   "tp across nodes", "ep all-to-all", "offload", "idle ranks", "realizable",
                   "lora", "single accelerator", "non-transformer sharded", "moe",
                   "dp_size given", "no tdp", "latency fallback", "sram or flash tier"):
        assert coverage[branch] >= 20, f"the draw reached '{branch}' only {coverage[branch]} times"


def test_fused_scalar_knobs_and_defaults_equal_numpy():
    """Scalars and defaulted knobs (their own specialization), a scalar precision, one point."""
    wl, fl = WORKLOADS["Mixtral_8x7B"], FLEETS["Training_1K"]
    rng = np.random.default_rng(SEED + 1)
    knobs = _draw(rng, 500, wl)
    partial = {k: knobs[k] for k in ("batch_size", "tp_size", "pp_size", "ep_size", "is_lora")}
    for extra in ({}, {"precision": "BF16", "seq_len": 8192, "zero_stage": 3}):
        assert_same(solver.solve(wl, fl, engine="fused", **partial, **extra),
                    solver.solve(wl, fl, engine="numpy", **partial, **extra), str(extra))
    point = dict(batch_size=1024, tp_size=8, pp_size=4, microbatch_count=16)
    assert_same(solver.solve(wl, fl, engine="fused", **point),
                solver.solve(wl, fl, engine="numpy", **point))


def test_fused_precision_inputs():
    """Names of any case, shorter names, Precisions objects and long string dtypes agree."""
    wl, fl = WORKLOADS["Llama3_8B"], FLEETS["Research_256"]
    for precision in (np.array(["fp8", "fp8", "fp8"]), np.array(["FP32", "tF32", "Bf16"]),
                      np.array(["fp16", "int4", "fp8"], dtype="<U9"),
                      np.array(["fp16", "int4", "fp8"], dtype=object),
                      solver.knobs.normalize({"precision": np.array(["int8", "fp32", "int8"])})[
                          "precision"]):
        ours = solver.solve(wl, fl, engine="fused", batch_size=[64, 128, 256], precision=precision)
        assert_same(ours, solver.solve(wl, fl, engine="numpy", batch_size=[64, 128, 256],
                                       precision=precision), repr(precision))


@pytest.mark.parametrize("knob, value, message", [
    ("batch_size", 0, "batch_size must be an integer >= 1"),
    ("efficiency", 1.5, "efficiency must be a number"),
    ("efficiency", np.nan, "efficiency must be finite"),
    ("zero_stage", 4, "zero_stage must be an integer"),
    ("tp_size", 2 ** 53, "tp_size must be below 2**53"),
    ("congestion_factor", 0.5, "congestion_factor must be a number"),
    ("precision", "fp64", "precision must be one of"),
    ("dp_size", 0, "dp_size must be an integer >= 1"),
])
def test_fused_refuses_what_numpy_refuses(knob, value, message):
    wl, fl = WORKLOADS["Llama3_8B"], FLEETS["Research_256"]
    knobs = _draw(np.random.default_rng(3), 64, wl)
    knobs["dp_size"] = np.full(64, 2)
    column = knobs[knob]
    column = column.astype(type(value)) if not isinstance(value, str) else column.astype("<U4")
    column[17] = value
    knobs[knob] = column
    for engine in ("fused", "numpy"):
        with pytest.raises(ValueError, match=message.replace("*", r"\*")):
            solver.solve(wl, fl, engine=engine, **knobs)


def test_engine_choice(monkeypatch):
    wl, fl = WORKLOADS["Llama3_8B"], FLEETS["Research_256"]
    calls = []
    from solver.fused import mlsysim_kernel

    real = mlsysim_kernel.run
    monkeypatch.setattr(mlsysim_kernel, "run", lambda *a: calls.append(a[-1]) or real(*a))
    big = np.arange(1, fused.FUSED_MIN_POINTS + 1)
    solver.solve(wl, fl, batch_size=big)                       # auto, flat and large: fused
    solver.solve(wl, fl, batch_size=big[:100])                 # auto, small: numpy
    solver.solve(wl, fl, batch_size=big[:, None], tp_size=[1, 2])   # auto, a mesh: numpy
    solver.solve(wl, fl, batch_size=big, engine="numpy")
    assert calls == [fused.FUSED_MIN_POINTS]
    with pytest.raises(ValueError, match="engine='fused' cannot price this call: it prices flat"):
        solver.solve(wl, fl, batch_size=big[:, None], tp_size=[1, 2], engine="fused")
    with pytest.raises(ValueError, match="engine must be one of"):
        solver.solve(wl, fl, engine="gpu")
    # solver.solve passes engine through to the model
    with pytest.raises(ValueError, match="engine='fused' cannot"):
        solver.solve(wl, fl, batch_size=[[1, 2]], engine="fused", physics="mlsysim")


def test_auto_falls_back_to_numpy_without_numba(monkeypatch):
    wl, fl = WORKLOADS["Llama3_8B"], FLEETS["Research_256"]
    knobs = _draw(np.random.default_rng(5), fused.FUSED_MIN_POINTS, wl)
    expected = solver.solve(wl, fl, engine="fused", **knobs)
    monkeypatch.setattr(fused, "NUMBA", False)
    from solver.fused import mlsysim_kernel

    monkeypatch.setattr(mlsysim_kernel, "run", lambda *a: pytest.fail("the kernel ran"))
    assert_same(solver.solve(wl, fl, **knobs), expected)
    with pytest.raises(ValueError, match="numba is not installed"):
        solver.solve(wl, fl, engine="fused", **knobs)


def test_fused_matches_reference():
    """The fused path against mlsysim 0.3.0 at rtol 1e-9, as tests/test_parity.py checks numpy."""
    from _reference import assert_matches, reference
    from test_parity import FLEETS as REF_FLEETS
    from test_parity import WORKLOADS as REF_WORKLOADS
    from test_parity import _draw as draw_one

    rng = np.random.default_rng(SEED + 2)
    draws = [draw_one(rng) for _ in range(200)]
    groups = collections.defaultdict(list)
    for i, (fleet_key, wl_key, _) in enumerate(draws):
        groups[fleet_key, wl_key].append(i)
    for (fleet_key, wl_key), rows in groups.items():
        fleet, model = REF_FLEETS[fleet_key], REF_WORKLOADS[wl_key]
        columns = {name: np.array([draws[i][2].get(name, solver.KNOBS[name].default)
                                   for i in rows])
                   for name in solver.knobs.REFERENCE_KNOBS if name != "topology_override"}
        ours = solver.solve(solver.from_mlsysim(model), solver.from_mlsysim(fleet),
                            engine="fused", **columns)
        for j, i in enumerate(rows):
            point = {name: value[j].item() for name, value in ours.items()}
            assert_matches(point, reference(model, fleet, **draws[i][2]),
                           where=f"{wl_key} on {fleet_key} {draws[i][2]}")


def test_sources_digest_is_current():
    """numba keys the cached kernel on its own file only: the digest recorded there must be
    that of the other sources it compiles in, or a stale cache could serve old code. On a
    failure, set the module's SOURCES_DIGEST to the value this test prints."""
    from solver.fused import mlsysim_kernel as module
    from solver.fused._numba import sources_digest
    actual = sources_digest(module.COMPILED_FROM)
    assert module.SOURCES_DIGEST == actual, (
        f"solver/fused/mlsysim_kernel.py: set SOURCES_DIGEST = {actual!r} (its other sources changed)")
