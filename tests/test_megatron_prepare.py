"""megatron.prepare: solve with its layouts fixed, priced under many sets of constants.

``prepare(w, f, **knobs)(**constants)`` must be ``solve(w, f, **knobs, **constants)``
bit for bit, on either engine, call after call (the fused path keeps its inputs between
calls), and refuse what solve refuses.
"""

import dataclasses

import numpy as np
import pytest

from solver import catalog, fused
from solver.physics import megatron as M


def _knobs(rng, n, dp_given):
    pick = lambda values: rng.choice(values, n)  # noqa: E731
    knobs = dict(batch_size=pick([64, 256, 1024]), seq_len=pick([2048, 4096, 8192]),
                 tp_size=pick([1, 2, 4, 8]), pp_size=pick([1, 2, 4]), cp_size=pick([1, 2]),
                 micro_batch_size=pick([1, 2]), v_stages=pick([1, 2]),
                 sequence_parallel=rng.random(n) < 0.5, recompute=pick(list(M.RECOMPUTE)),
                 zero_stage=pick([0, 1, 3]), precision=pick(["bf16", "fp8"]),
                 tp_comm_overlap=rng.random(n) < 0.5)
    if dp_given:
        knobs["dp_size"] = pick([1, 2, 8])
    return knobs


def _same(a, b):
    assert list(a) == list(b) == list(M.OUTPUTS)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


ENGINES = ["numpy", "auto"] + (["fused"] if fused.NUMBA else [])


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dp_given", [False, True])
def test_prepared_is_solve_call_after_call(engine, dp_given):
    wl, fl = catalog.workload("Mixtral_8x7B_MC"), catalog.fleet("HGX_H100_1K_MC")
    rng = np.random.default_rng(7 + dp_given)
    knobs = _knobs(rng, 40, dp_given)
    price = M.prepare(wl, fl, engine=engine, **knobs)
    steps = []
    for constants in ({}, {"gemm_scale": 0.6}, {"gemm_scale": 0.9, "overlap_efficiency": 0.2},
                      {}, {"step_overhead": 0.5, "scale_out_efficiency": 0.3}):
        got = price(**constants)
        _same(got, M.solve(wl, fl, engine=engine, **knobs, **constants))
        steps.append(got["step_latency_total"].copy())
    # the constants reach the physics, and the first call's result comes back unchanged
    assert not np.array_equal(steps[0], steps[1], equal_nan=True)
    np.testing.assert_array_equal(steps[0], steps[3])


def test_prepared_scalar_knobs_and_array_constants():
    """Scalar knobs give 0-d outputs as solve's; an array constant broadcasts (numpy path)
    and is refused by the fused engine as solve refuses it."""
    wl, fl = catalog.workload("Llama3_8B_MC"), catalog.fleet("HGX_H100_1K_MC")
    price = M.prepare(wl, fl, tp_size=2, batch_size=256)
    _same(price(), M.solve(wl, fl, tp_size=2, batch_size=256))
    scales = np.array([0.5, 0.7, 0.9])
    got = price(gemm_scale=scales)
    _same(got, M.solve(wl, fl, tp_size=2, batch_size=256, gemm_scale=scales))
    assert got["step_latency_total"].shape == (3,)
    assert np.all(np.diff(got["step_latency_total"]) < 0)  # faster GEMMs, shorter steps
    if fused.NUMBA:
        flat = M.prepare(wl, fl, engine="fused", tp_size=np.array([1, 2]))
        with pytest.raises(ValueError, match="engine='fused' cannot price this call"):
            flat(gemm_scale=np.array([0.5, 0.6]))


@pytest.mark.parametrize("engine", ENGINES)
def test_prepared_keeps_its_own_copy_of_the_knobs(engine):
    """Changing an array after prepare does not change (or bypass the checks of) the layouts."""
    wl, fl = catalog.workload("Llama3_8B_MC"), catalog.fleet("HGX_H100_1K_MC")
    tp = np.array([1, 2, 4, 8] * 1100, dtype=np.int64)  # big enough for the fast checks
    price = M.prepare(wl, fl, engine=engine, tp_size=tp, batch_size=512)
    before = price()["step_latency_total"].copy()
    tp[:] = 0  # no configuration can have it; prepare checked the old values
    np.testing.assert_array_equal(price()["step_latency_total"], before)
    assert np.isfinite(before).all()


def test_prepare_refuses_what_solve_refuses():
    wl, fl = catalog.workload("Llama3_8B_MC"), catalog.fleet("HGX_H100_1K_MC")
    with pytest.raises(TypeError, match="unexpected keyword argument 'gemm_scale'.*callable"):
        M.prepare(wl, fl, gemm_scale=0.5)
    with pytest.raises(ValueError, match="tp_size"):
        M.prepare(wl, fl, tp_size=np.array([2, 0]))
    with pytest.raises(ValueError, match="recompute"):
        M.prepare(wl, fl, recompute="sometimes")
    with pytest.raises(ValueError, match="engine must be one of"):
        M.prepare(wl, fl, engine="gpu")
    with pytest.raises(TypeError, match="workload must be"):
        M.prepare("Llama3_8B_MC", fl)
    price = M.prepare(wl, fl, tp_size=np.array([1, 2, 4]))
    with pytest.raises(ValueError, match=r"gemm_scale must be a number in"):
        price(gemm_scale=-1.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'tp_size'"):
        price(tp_size=2)
    with pytest.raises(ValueError, match="must broadcast together"):
        price(gemm_scale=np.array([0.5, 0.6]))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("fleet_name", ["EOS_H100_MC", "GB200_NVL72_8_MC"])
def test_hopper_gemm_scale_multiplies_the_plateau_from_hopper_on(engine, fleet_name):
    # hopper_gemm_scale is gemm_scale again on a Hopper GPU and on a Blackwell one (the
    # catalog's architecture; carried over, no Blackwell run being in the fidelity data) and
    # nothing on an Ampere one: the A100 cluster prices the same whatever its value.
    rng = np.random.default_rng(14)
    knobs = _knobs(rng, 64, dp_given=True)
    wl = catalog.workload("Llama3_8B_MC")
    fleet = catalog.fleet(fleet_name)
    assert fleet.node.accelerator.architecture in ("hopper", "blackwell")
    price = M.prepare(wl, fleet, engine=engine, **knobs)
    a = price(gemm_scale=0.8, hopper_gemm_scale=0.75)
    b = price(gemm_scale=0.8 * 0.75, hopper_gemm_scale=1.0)
    for name in ("step_latency_total", "compute_latency", "mfu"):
        np.testing.assert_allclose(a[name], b[name], rtol=1e-12, err_msg=name)
    slower = price(gemm_scale=0.8, hopper_gemm_scale=0.5)["compute_latency"]
    ok = np.isfinite(a["compute_latency"])
    assert ok.any() and (slower[ok] > a["compute_latency"][ok]).all()
    ampere = catalog.fleet("Selene_MC")
    assert ampere.node.accelerator.architecture == "ampere"
    price = M.prepare(wl, ampere, engine=engine, **knobs)
    _same(price(hopper_gemm_scale=0.5), price(hopper_gemm_scale=1.2))


def _with_plateau(fleet, plateau):
    acc = dataclasses.replace(fleet.node.accelerator, gemm_efficiency={
        **fleet.node.accelerator.gemm_efficiency, "fp16": plateau, "bf16": plateau})
    return dataclasses.replace(fleet, node=dataclasses.replace(fleet.node, accelerator=acc))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("fleet_name", ["Selene_MC", "EOS_H100_MC", "DGX_B200_1K_MC"])
def test_gemm_plateau_replaces_the_catalogs_measured_plateau(engine, fleet_name):
    # gemm_plateau = 0 (shipped) takes each GPU's measured plateau from the catalog; set, it
    # is the plateau of every GPU and precision, as if the catalog stated it (profiles
    # fitted before the catalog's measured plateaus carry 0.95, the one they were fitted on).
    rng = np.random.default_rng(15)
    knobs = _knobs(rng, 96, dp_given=True)
    wl = catalog.workload("Llama3_8B_MC")
    fleet = catalog.fleet(fleet_name)
    plateau = fleet.node.accelerator.gemm_efficiency["bf16"]
    assert 0.7 < plateau < 0.9  # the measured ones (MAMF), not Calculon's 0.95
    shipped = M.prepare(wl, fleet, engine=engine, **knobs)
    assert M.CONSTANTS["gemm_plateau"] == 0.0
    _same(shipped(), shipped(gemm_plateau=0.0))
    stated = M.prepare(wl, _with_plateau(fleet, 0.95), engine=engine, **knobs)
    _same(shipped(gemm_plateau=0.95), stated())
    a, b = shipped(), shipped(gemm_plateau=0.95)
    ok = np.isfinite(a["compute_latency"])
    assert ok.any() and (b["compute_latency"][ok] < a["compute_latency"][ok]).all()
    with pytest.raises(ValueError, match=r"gemm_plateau must be a number in"):
        shipped(gemm_plateau=1.5)


def test_measured_plateaus_are_the_same_chips_in_both_catalog_files():
    # The registry entries read by the megatron physics take the MC entries' plateaus.
    pairs = {"A100": "A100_80GB_MC", "A100_40GB": "A100_40GB_MC", "H100": "H100_SXM_MC",
             "H200": "H200_MC", "B200": "B200_MC", "GB200_NVL72": "GB200_MC"}
    for registry, mc in pairs.items():
        a, b = catalog.accelerator(registry), catalog.accelerator(mc)
        assert a.gemm_efficiency["bf16"] == b.gemm_efficiency["bf16"] == b.gemm_efficiency["fp16"]
        assert a.architecture == b.architecture
    # newer GPUs reach less of their rated peak (the MAMF table's order)
    eff = {n: catalog.accelerator(n).gemm_efficiency["bf16"] for n in ("A100_80GB_MC", "H100_SXM_MC",
                                                                       "B200_MC", "GB200_MC")}
    assert eff["A100_80GB_MC"] > eff["H100_SXM_MC"] > eff["B200_MC"] > eff["GB200_MC"]
    # the predicted GEMM ratio of a Blackwell GPU over a Hopper one is the measured one
    h100, b200 = catalog.accelerator("H100_SXM_MC"), catalog.accelerator("B200_MC")
    ratio = (b200.precision_flops["bf16"] * eff["B200_MC"]) / (h100.precision_flops["bf16"] * eff["H100_SXM_MC"])
    assert ratio == pytest.approx(1745.0 / 794.5, rel=2e-4)


def test_catalog_architectures():
    arch = {name: catalog.accelerator(name).architecture
            for name in ("H100", "H100_PCIe", "H200", "H100_SXM_MC", "H200_MC", "A100", "A100_80GB_MC",
                         "B200", "B200_MC", "GB200_MC")}
    assert {n for n, a in arch.items() if a == "hopper"} == {"H100", "H100_PCIe", "H200", "H100_SXM_MC",
                                                             "H200_MC"}
    assert arch["A100"] == arch["A100_80GB_MC"] == "ampere" and arch["B200_MC"] == "blackwell"
