"""The benchmarks' own helpers: they must end, and draw what they say they draw."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import solver

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _module(name):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("fleet_name", solver.catalog.names("fleets"))
def test_solver_benchmark_draws_possible_splits_on_every_fleet(fleet_name):
    # Kempner_H100_384 with tp=64, ep=4 used to loop forever: 64*4 does not divide 384.
    fleet = solver.catalog.fleet(fleet_name)
    knobs = _module("bench_solver").draw(20_000, fleet, seed=1)
    product = knobs["tp_size"] * knobs["pp_size"] * knobs["ep_size"]
    assert (fleet.total_accelerators % product == 0).all()
    assert len(np.unique(knobs["tp_size"])) > 1
