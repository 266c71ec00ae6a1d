"""fp8_recipe in the megatron physics ([48] of solver.physics.megatron): Megatron-Core's
FP8 recipe, read under precision="fp8". Held to Transformer Engine's support matrix (MXFP8 on
Blackwell, FP8 blocks on Hopper and Blackwell), to Megatron-Core's refusal of "moe_act" and
"layernorm" recompute beside delayed scaling, to the precision-aware optimizer's master
weights under each recipe (tests/test_megatron_precision_aware_optimizer.py has the bytes),
and to changing nothing else: outside FP8 not read at all, and the fused kernel prices it
beside it, the same bits."""

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from solver import catalog
from solver.physics import megatron as M

sys.path.insert(0, str(Path(__file__).parent))
from _megatron_steps import engines_agree, solve, why  # noqa: E402
from test_fused_megatron import _draw  # noqa: E402

H100, B200, A100 = "HGX_H100_1K_MC", "DGX_B200_1K_MC", "Selene_MC"
KW = dict(batch_size=64, seq_len=4096, tp_size=2, pp_size=2, dp_size=4, sequence_parallel=True)


def _solve(workload, fleet, engine="numpy", **kw):
    return solve(workload, fleet, engine, **kw)


def _why(workload, fleet, **kw):
    return why(workload, fleet, **kw)


def test_the_accelerator_runs_the_recipe():
    """MXFP8 on Blackwell alone, FP8 blocks on Hopper and Blackwell, per-tensor FP8 (delayed and
    current scaling) wherever FP8 runs; an A100 runs no FP8 (the precision rule) and no block
    recipe either; outside FP8 the recipe is not read."""
    expect = {(H100, "delayed"): [], (H100, "tensorwise"): [], (H100, "blockwise"): [],
              (H100, "mxfp8"): ["fp8_recipe"],
              (B200, "delayed"): [], (B200, "tensorwise"): [], (B200, "blockwise"): [],
              (B200, "mxfp8"): [],
              (A100, "delayed"): ["precision"], (A100, "tensorwise"): ["precision"],
              (A100, "blockwise"): ["fp8_recipe", "precision"],
              (A100, "mxfp8"): ["fp8_recipe", "precision"]}
    for (fleet, recipe), broken in expect.items():
        assert _why("Llama3_8B_MC", fleet, **KW, precision="fp8", fp8_recipe=recipe) == broken, \
            (fleet, recipe)
        assert _why("Llama3_8B_MC", fleet, **KW, precision="bf16", fp8_recipe=recipe) == [], \
            (fleet, recipe)


def test_delayed_scaling_refuses_the_output_discarding_recomputes():
    """Megatron-Core: "Delayed scaling does not support moe_act and layernorm recompute for
    fp8"; the other recipes take them, and delayed scaling the other modules."""
    kw = dict(KW, ep_size=4, recompute="selective", precision="fp8")
    for modules in ("moe_act", "layernorm", "core_attn,moe_act,moe"):
        assert _why("Mixtral_8x7B_MC", H100, **kw, recompute_modules=modules) == [
            "recompute_fp8_recipe"], modules
        assert _why("Mixtral_8x7B_MC", H100, **kw, recompute_modules=modules,
                    fp8_recipe="blockwise") == [], modules
        assert _why("Mixtral_8x7B_MC", H100, **dict(kw, precision="bf16"),
                    recompute_modules=modules) == [], modules
    assert _why("Mixtral_8x7B_MC", H100, **kw, recompute_modules="core_attn,moe,mlp") == []
    # (outside selective recompute the modules are not read)
    assert _why("Mixtral_8x7B_MC", H100, **dict(kw, recompute="full"),
                recompute_modules="moe_act") == []


def test_the_recipe_prices_nothing_else():
    """Without the precision-aware optimizer, every output but realizable is the same bits under
    every recipe (the GEMMs, casts and activations are priced alike); outside FP8 realizable
    too."""
    for workload in ("Llama3_8B_MC", "Mixtral_8x7B_MC"):
        for precision in ("fp8", "bf16"):
            base = _solve(workload, H100, **KW, precision=precision)
            for recipe in M.CHOICES["fp8_recipe"][1:]:
                other = _solve(workload, H100, **KW, precision=precision, fp8_recipe=recipe)
                for name in M.OUTPUTS:
                    if name == "realizable" and precision == "fp8":
                        continue
                    assert np.array_equal(np.asarray(base[name]), np.asarray(other[name]),
                                          equal_nan=True), (workload, precision, recipe, name)


def test_bad_recipes_are_refused_by_name():
    for bad in ("nvfp4", "current", "custom"):
        with pytest.raises(ValueError, match="fp8_recipe must be one of 'delayed', 'tensorwise'"):
            _solve("Llama3_8B_MC", H100, precision="fp8", fp8_recipe=bad)


@pytest.mark.parametrize("fleet", [H100, B200])
def test_the_fused_kernel_prices_it_beside_it(fleet):
    pytest.importorskip("numba")
    rng = np.random.default_rng(480)
    n = 3 * 4096
    k = {**_draw(rng, n, dp_given=True),
         "fp8_recipe": rng.choice(list(M.CHOICES["fp8_recipe"]), n),
         "use_precision_aware_optimizer": rng.random(n) < 0.3,
         "fp8_param_gather": rng.random(n) < 0.3,
         "recompute_modules": rng.choice(["core_attn", "moe_act", "layernorm,mlp"], n)}
    numpy_ = engines_agree("Mixtral_8x7B_MC", fleet, **k)
    # the rules moved rows of both kinds on this draw
    fp8 = np.asarray(k["precision"]) == "fp8"
    valid = np.asarray(numpy_["valid"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        why = M.why_unrealizable(catalog.workload("Mixtral_8x7B_MC"), catalog.fleet(fleet), **k)
    assert np.any(np.broadcast_to(why.get("recompute_fp8_recipe", False), (n,)) & valid & fp8)
    assert np.any(np.broadcast_to(why.get("fp8_recipe", False), (n,)) & valid) == (fleet == H100)


def test_a_realizable_layout_keeps_its_rule_on_the_fused_engine():
    """One realizable FP8 layout under each recipe, many times over (a call the fused kernel
    takes): on an H100 the MXFP8 rows alone break a rule, on a B200 none, on both engines."""
    pytest.importorskip("numba")
    recipes = np.array(M.CHOICES["fp8_recipe"] * 2048)
    for fleet, broken in ((H100, "mxfp8"), (B200, None)):
        kw = dict(KW, precision="fp8", fp8_recipe=recipes)
        out = engines_agree("Llama3_8B_MC", fleet, **kw)
        assert np.array_equal(np.asarray(out["realizable"]), recipes != broken), fleet


def test_mxfp8_gathers_its_parameters_in_bf16():
    """fp8_param_gather under FSDP moves a byte a layer parameter under delayed scaling, and
    16 bits under MXFP8, where Megatron-Core gathers BF16 and casts on the copy: its data
    parallel time is that without the flag."""
    kw = dict(KW, pp_size=1, dp_size=8, zero_stage=3, precision="fp8")
    for recipe, same in (("delayed", False), ("mxfp8", True)):
        off = _solve("Llama3_8B_MC", B200, **kw, fp8_recipe=recipe)
        on = _solve("Llama3_8B_MC", B200, **kw, fp8_recipe=recipe, fp8_param_gather=True)
        assert bool(on["realizable"])
        a, b = (float(x["dp_communication_latency"]) for x in (off, on))
        assert (a == b) == same and b <= a, recipe

