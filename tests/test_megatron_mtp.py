"""Multi-token prediction (mtp_num_layers) in the megatron physics, against closed forms and
against the model's own layers: an MTP module is one more layer, a projection of 2h -> h with
three norms, and the output head again, on the last stage ([34] of solver.physics.megatron)."""

import dataclasses
import warnings

import numpy as np
import pytest

from solver import catalog, megatron_memory as mem
from solver.physics import megatron as M
from solver.physics import megatron_steps as _steps

DSV3 = catalog.workload("DeepSeek_V3_MC")
LLAMA = catalog.workload("Llama3_70B_MC")
FLEET = catalog.fleet("GB200_NVL72_8_MC")


def _solve(workload, engine="numpy", **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return M.solve(workload, FLEET, engine=engine, **kw)


@pytest.mark.parametrize("workload", [DSV3, LLAMA], ids=["DeepSeek-V3", "Llama3-70B"])
def test_mtp_model_flops_are_one_more_layer_its_projection_and_one_more_logits(workload):
    """Megatron-LM's count [34]: a layer of the last layer's kind (MoE for DeepSeek-V3),
    6 (3h + 2h^2) a token for the norms and projection, 6 h V a token for the logits. The
    layer is read off the model itself: the same workload with one more layer."""
    batch, s, pp = 1152, 4096, 1
    kw = dict(batch_size=batch, seq_len=s, tp_size=8, pp_size=pp, ep_size=8 if workload is DSV3 else 1,
              micro_batch_size=1, sequence_parallel=True)
    flops = {}
    for name, wl, mtp in (("base", workload, 0), ("mtp", workload, 1), ("mtp2", workload, 2),
                          ("layer", dataclasses.replace(workload, layers=workload.layers + 1), 0)):
        out = _solve(wl, mtp_num_layers=mtp, **kw)
        flops[name] = float(out["model_flops_per_accelerator"]) * float(out["step_latency_total"]) \
            * FLEET.total_accelerators
    h, vocab = workload.hidden_dim, workload.vocab_size
    projection_and_logits = 6.0 * batch * s * (3 * h + 2 * h * h + h * vocab)
    assert flops["mtp"] - flops["base"] == pytest.approx(
        flops["layer"] - flops["base"] + projection_and_logits, rel=1e-9)
    assert flops["mtp2"] - flops["base"] == pytest.approx(2 * (flops["mtp"] - flops["base"]), rel=1e-9)


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_mtp_weights_are_a_layer_the_projection_and_with_a_pipeline_an_embedding_copy(engine):
    """DeepSeek-V3, 9 stages, the last of 8 MoE layers (4, 7 x 7, 8: the largest weights,
    full recompute: the fewest activations), EP 64, ETP 1, TP 2, DDP weights: the MTP module
    adds on the last rank an MoE layer's weights (non-expert over TP but for MLA's
    duplicated ones, the norms and the router, experts over ETP x EP), the projection and
    norms over TP, and the
    embedding copy the last stage builds, over TP."""
    if engine == "fused":
        pytest.importorskip("numba")
    shape = M._Shape(DSV3)
    tp, ep = 2, 64
    kw = dict(batch_size=1152, seq_len=4096, tp_size=tp, pp_size=9, ep_size=ep, etp_size=1,
              micro_batch_size=1, sequence_parallel=True, zero_stage=0, precision="bf16",
              recompute="full", num_layers_in_first_pipeline_stage=4,
              num_layers_in_last_pipeline_stage=8)
    base, mtp = (_solve(DSV3, engine, mtp_num_layers=n, **kw) for n in (0, 1))
    h, vocab = 7168, 129280
    params = ((shape.moe_layer_nonexpert - shape.moe_dup + 2 * h * h + 3 * h) / tp + shape.moe_dup
              + 3 * h * 2048 * 256 / ep + vocab * h / tp)
    assert float(mtp["memory_weights"] - base["memory_weights"]) == pytest.approx(
        mem.WEIGHT_BYTES * params, rel=1e-12)


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_mtp_compute_is_a_layer_the_head_again_and_a_projection_on_the_curve(engine):
    """One stage: compute_latency = m (L + mtp)(layer f + b) + m (head (1 + mtp) + mtp x
    projection and norms). The layer's and the head's times are read off the model (one
    more layer; the split of compute between layers and head); the projection's is what is
    left, and lies between its GEMM at the peak and three times that plus the norms'
    bytes at the HBM's bandwidth."""
    if engine == "fused":
        pytest.importorskip("numba")
    mbs, s, tp, m = 1, 4096, 8, 64
    kw = dict(batch_size=m * mbs, seq_len=s, tp_size=tp, pp_size=1, dp_size=1, micro_batch_size=mbs,
              sequence_parallel=True, precision="bf16")
    base = float(_solve(LLAMA, engine, **kw)["compute_latency"])
    more = float(_solve(dataclasses.replace(LLAMA, layers=81), engine, **kw)["compute_latency"])
    mtp = float(_solve(LLAMA, engine, mtp_num_layers=1, **kw)["compute_latency"])
    layer = (more - base) / m
    head = base / m - 80 * layer
    projection = (mtp - base) / m - layer - head
    h = 8192
    ideal = 3 * 4.0 * mbs * s * h * h / tp / _steps._peak(FLEET.node.accelerator, "bf16")
    norms = 3 * 20.0 * mbs * s * h / tp / FLEET.node.accelerator.memory_bandwidth
    assert ideal < projection < 3 * ideal + 3 * norms
    # with a pipeline the step pays it on the heaviest stage: more than a stage's share
    piped = dict(kw, pp_size=4, batch_size=4 * m * mbs)
    step0 = float(_solve(LLAMA, engine, **piped)["step_latency_total"])
    step1 = float(_solve(LLAMA, engine, mtp_num_layers=1, **piped)["step_latency_total"])
    assert step1 - step0 > (step0 / 20) * 0.9  # 20 layers a stage: one more is ~ a 20th


def test_mtp_is_checked_and_zero_changes_nothing():
    kw = dict(batch_size=1024, seq_len=4096, tp_size=8, pp_size=4, micro_batch_size=1,
              sequence_parallel=True)
    default, zero = _solve(LLAMA, **kw), _solve(LLAMA, mtp_num_layers=0, **kw)
    for name in M.OUTPUTS:
        np.testing.assert_array_equal(default[name], zero[name])
    for bad in (-1, 64, 1.5):
        with pytest.raises(ValueError, match="mtp_num_layers must be"):
            _solve(LLAMA, mtp_num_layers=bad, **kw)
