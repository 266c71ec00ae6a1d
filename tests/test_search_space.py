"""``sweep.search.space``: a spec's axes as optuna distributions, and draws back as knobs."""

from __future__ import annotations

import math

from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from sweep.search.space import build_space
from sweep.spec import load_spec


def test_axes_map_to_optuna_distributions():
    spec = load_spec({
        "workload": "Llama3_70B", "fleet": "Training_1K",
        "axes": {"tp_size": {"powers_of_two": 8}, "zero_stage": [0, 1, 2, 3],
                 "microbatch_count": {"from": 2, "to": 10, "step": 2},
                 "efficiency": {"from": 0.1, "to": 0.6, "log": True},
                 "overlap_efficiency": {"from": 0.5, "to": 0.9},
                 "precision": ["bf16", "fp8"], "overlap_comm": [True, False],
                 "ep_size": [1]},
    })
    space = build_space(spec)
    d = space.distributions
    assert d["tp_size"] == CategoricalDistribution((1, 2, 4, 8))  # the values themselves
    assert d["zero_stage"] == IntDistribution(0, 3)
    assert d["microbatch_count"] == IntDistribution(2, 10, step=2)
    assert d["efficiency"] == FloatDistribution(0.1, 0.6, log=True)
    assert d["overlap_efficiency"] == FloatDistribution(0.5, 0.9)
    assert d["precision"] == CategoricalDistribution(("bf16", "fp8"))
    assert d["overlap_comm"] == CategoricalDistribution((True, False))
    assert "ep_size" not in d and space.constants == {"ep_size": 1}
    layout = space.decode({"tp_size": 4, "zero_stage": 3, "microbatch_count": 6,
                           "efficiency": 0.2, "overlap_efficiency": 0.7, "precision": "fp8",
                           "overlap_comm": False})
    assert layout["tp_size"] == 4 and layout["ep_size"] == 1 and layout["workload"] == "Llama3_70B"
    assert space.encode(layout)["tp_size"] == 4
    assert math.isinf(space.size)
