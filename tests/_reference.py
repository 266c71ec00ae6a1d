"""The test oracle: mlsysim 0.3.0 ``DistributedModel.solve``, one configuration per call.

Its results are read into the names and SI units of ``solver.OUTPUTS``. The
memory breakdown the reference computes but does not return is read from the
reference's own ``TrainingMemoryModel`` (transformers), called with the same
arguments ``_replica_profile`` passes it.
"""

from __future__ import annotations

import math
import warnings

try:
    import mlsysim  # noqa: F401
except ImportError as err:  # a hard failure: the parity tests must not skip silently
    raise ImportError(
        "the parity tests need the reference, mlsysim 0.3.0, and it is not installed: "
        "install the test extra (pip install -e '.[test]'); they fail rather than skip "
        f"without it ({err})") from err

from mlsysim.engine.solvers.distributed import DistributedModel, _LORA_RANK  # noqa: E402
from mlsysim.engine.solvers.training import TrainingMemoryModel  # noqa: E402
from mlsysim.models.types import TransformerWorkload  # noqa: E402

_MODEL = DistributedModel()


def _s(q):
    return float(q.m_as("second"))


def reference(model, fleet, **knobs):
    """Reference outputs of one configuration, keyed like ``solver.OUTPUTS``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            r = _MODEL.solve(model, fleet, **knobs)
        except ValueError as err:
            if "Infeasible 4D Parallelism" in str(err):
                return {"valid": False}
            raise
    p = r.node_profile
    dp = r.parallelism["dp"]
    out = {
        "valid": True,
        "dp_size": float(dp),
        "idle_ranks": knobs.get("batch_size", 1) < dp,
        "step_latency_total": _s(r.step_latency_total),
        "scaling_efficiency": float(r.scaling_efficiency),
        "effective_throughput": float(r.effective_throughput.m_as("1/second")),
        "mfu": float(p.mfu * r.scaling_efficiency),
        "dp_communication_latency": _s(r.dp_communication_latency),
        "tp_communication_latency": _s(r.tp_communication_latency),
        "ep_communication_latency": _s(r.ep_communication_latency),
        "communication_latency": _s(r.communication_latency),
        "pipeline_bubble_latency": _s(r.pipeline_bubble_latency),
        "bubble_fraction": float(r.bubble_fraction),
        "node_latency": _s(p.latency),
        "node_latency_compute": _s(p.latency_compute),
        "node_latency_memory": _s(p.latency_memory),
        "node_latency_overhead": _s(p.latency_overhead),
        "node_throughput": float(p.throughput.m_as("1/second")),
        "node_mfu": float(p.mfu),
        "node_hfu": float(p.hfu),
        "node_energy": float(p.energy.m_as("joule")),
        "memory_footprint": float(p.memory_footprint.m_as("byte")),
        "feasible": bool(p.feasible),
    }
    if isinstance(model, TransformerWorkload):
        out.update(_transformer_memory(model, fleet, dp, **knobs))
    return out


def _transformer_memory(model, fleet, dp, batch_size=1, precision="fp16", tp_size=1, pp_size=1,
                        ep_size=1, microbatch_count=1, zero_stage=0, is_lora=False,
                        activation_recomputation=False, gradient_accumulation_steps=1,
                        seq_len=2048, **_):
    """The breakdown ``_replica_profile`` gets from TrainingMemoryModel, in bytes."""
    local_batch = max(1, batch_size // dp)
    trainable = 1.0
    if is_lora:
        lora = 2 * _LORA_RANK * (model.hidden_dim or 4096) * 4 * model.layers
        trainable = min(lora / model.parameters.m_as("count"), 1.0)
    in_flight = max(1, microbatch_count // pp_size) if pp_size > 1 else 1
    m = TrainingMemoryModel().solve(
        model, fleet.node.accelerator, batch_size=local_batch * dp, seq_len=seq_len,
        precision=precision,
        activation_checkpointing="full" if activation_recomputation else "selective",
        tp_size=tp_size, pp_size=pp_size, dp_size=dp, ep_size=ep_size, zero_stage=zero_stage,
        gradient_accumulation_steps=gradient_accumulation_steps * in_flight,
        trainable_fraction=trainable)
    return {
        "memory_weights": float(m.weights.m_as("byte")),
        "memory_gradients": float(m.gradients.m_as("byte")),
        "memory_optimizer_state": float(m.optimizer_state.m_as("byte")),
        "memory_activations": float(m.activations.m_as("byte")),
        "memory_communication_buffers": float(m.communication_buffers.m_as("byte")),
    }


def assert_matches(ours, ref, *, rtol=1e-9, where=""):
    """Compare one configuration's outputs; returns the largest relative error seen."""
    worst = 0.0
    assert bool(ours["valid"]) == ref["valid"], f"valid differs {where}"
    if not ref["valid"]:
        for name, value in ours.items():
            if isinstance(value, float):
                assert math.isnan(value), f"{name} should be NaN for an invalid split {where}"
            else:
                assert value is False, f"{name} should be False for an invalid split {where}"
        return worst
    for name, expected in ref.items():
        got = ours[name]
        if isinstance(expected, bool):
            assert bool(got) == expected, f"{name}: got {got}, reference {expected} {where}"
            continue
        if expected == got:
            continue
        err = abs(got - expected) / max(abs(expected), 1e-300)
        worst = max(worst, err)
        assert err <= rtol, f"{name}: got {got!r}, reference {expected!r} (rel err {err:.2e}) {where}"
    return worst
