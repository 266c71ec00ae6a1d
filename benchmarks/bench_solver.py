"""Configurations per second: mlsysim 0.3.0 (one call each) against ``solver.solve`` (one call).

Draws N random configurations of every knob for one workload and fleet, prices
the first few hundred with the reference, one ``DistributedModel.solve`` call
each (in a spawned interpreter of its own, see :func:`time_reference_isolated`), and all N with one ``solver.solve`` call on flat arrays, then prints both
rates and their ratio (and checks the two agree on the shared points).

    python benchmarks/bench_solver.py                 # 1,000,000 configurations
    python benchmarks/bench_solver.py --n 100000 --reference 100 --json out.json

Needs the test extra (mlsysim) for the reference side.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import time
import warnings

import numpy as np

import solver


def draw(n, fleet, seed=0):
    """N random configurations over every knob, every one a possible split of the fleet.

    Impossible splits are left out: the reference refuses them before pricing
    anything, so timing them would flatter its rate.
    """
    rng = np.random.default_rng(seed)
    total = fleet.total_accelerators
    divisors = np.array([d for d in range(1, total + 1) if total % d == 0])
    tp = rng.choice(divisors[divisors <= 64], n)
    pp = rng.choice([1, 2, 4, 8, 16, 32], n)
    ep = rng.choice([1, 1, 1, 2, 4], n)
    # Shrink PP, then EP, until TP*PP*EP divides the fleet: once both are 1 it does, since
    # TP is a divisor (e.g. Kempner_H100_384 with tp=64, ep=4 needs ep halved to 2).
    for degree in (pp, ep):
        while True:
            bad = (total % (tp * pp * ep) != 0) & (degree > 1)
            if not bad.any():
                break
            degree[bad] //= 2
    assert (total % (tp * pp * ep) == 0).all()
    return {
        "batch_size": np.exp(rng.uniform(0, np.log(8192), n)).astype(np.int64),
        "precision": rng.choice(["fp32", "bf16", "fp16", "fp8", "int8"], n),
        "efficiency": rng.uniform(0.2, 1.0, n),
        "tp_size": tp, "pp_size": pp, "ep_size": ep,
        "v_stages": rng.integers(1, 5, n),
        "microbatch_count": rng.integers(1, 129, n),
        "zero_stage": rng.integers(0, 4, n),
        "is_lora": rng.random(n) < 0.2,
        "activation_recomputation": rng.random(n) < 0.5,
        "overlap_comm": rng.random(n) < 0.5,
        "overlap_efficiency": rng.uniform(0, 1, n),
        "congestion_factor": rng.uniform(1, 2, n),
        "straggler_factor": rng.uniform(1, 1.3, n),
        "moe_routing_imbalance_factor": rng.uniform(1, 2, n),
        "gradient_accumulation_steps": rng.integers(1, 9, n),
        "seq_len": np.exp(rng.uniform(np.log(128), np.log(32768), n)).astype(np.int64),
    }


def time_ours(workload, fleet, knobs, repeats):
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        out = solver.solve(workload, fleet, **knobs)
        best = min(best, time.perf_counter() - start)
    return best, out


def time_reference(workload_name, fleet_name, knobs, count):
    from mlsysim.engine.solvers.distributed import DistributedModel
    from mlsysim.models.registry import Models
    from mlsysim.systems.registry import Systems

    model = next(getattr(getattr(Models, g), workload_name)
                 for g in ("Language", "Vision", "Recommendation", "StateSpace",
                           "GenerativeVision", "Embodied")
                 if hasattr(getattr(Models, g), workload_name))
    fleet = getattr(Systems.Clusters, fleet_name)
    reference = DistributedModel()
    rows = [{k: v[i].item() for k, v in knobs.items()} for i in range(count)]
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        for row in rows:
            try:
                results.append(reference.solve(model, fleet, **row))
            except ValueError:
                results.append(None)
        elapsed = time.perf_counter() - start
    return elapsed, results


def _reference_child(workload_name, fleet_name, rows, repeat):
    """In a fresh interpreter: the best of ``repeat`` timings of the reference on ``rows``,
    and each configuration's step time [s] (None where the reference refused it)."""
    knobs = {k: np.array([row[k] for row in rows]) for k in rows[0]}
    time_reference(workload_name, fleet_name, knobs, min(len(rows), 10))  # warm, untimed
    best, results = np.inf, None
    for _ in range(repeat):
        seconds, results = time_reference(workload_name, fleet_name, knobs, len(rows))
        best = min(best, seconds)
    return best, [None if r is None else r.step_latency_total.m_as("second") for r in results]


def time_reference_isolated(workload_name, fleet_name, knobs, count, repeat=1):
    """:func:`time_reference` in a spawned interpreter of its own, best of ``repeat``.

    Returns (seconds, step times [s] or None per configuration). Each side is then
    timed on a heap of its own: in one process, the reference's ~10^5 small objects
    left on the heap made glibc fault fresh pages for the next flat call's outputs
    (1,300 page faults and 38-46 ms a call against none and 27-29 ms, mlsysim fused
    path, 1M configurations), and big arrays held or copied before the reference slowed
    its small-object Python (113/s against 195/s alone).
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    rows = [{k: v[i].item() for k, v in knobs.items()} for i in range(count)]
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_reference_child, workload_name, fleet_name, rows, repeat).result()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="Llama3_70B")
    parser.add_argument("--fleet", default="Training_1K")
    parser.add_argument("--n", type=int, default=1_000_000, help="configurations for solve")
    parser.add_argument("--reference", type=int, default=300,
                        help="configurations for the reference (one call each)")
    parser.add_argument("--repeats", type=int, default=5, help="solve timings; the best is kept")
    parser.add_argument("--reference-repeats", type=int, default=3,
                        help="reference timings (after an untimed warm-up); the best is kept")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)

    workload = solver.catalog.workload(args.workload)
    fleet = solver.catalog.fleet(args.fleet)
    knobs = draw(args.n, fleet)
    ours_s, out = time_ours(workload, fleet, knobs, args.repeats)
    ours_rate = args.n / ours_s
    figures = {
        "workload": args.workload, "fleet": args.fleet, "n": args.n,
        "solve_seconds": ours_s, "solve_configs_per_s": ours_rate,
        "machine": f"{platform.machine()}, {platform.python_version()}, numpy {np.__version__}",
    }
    print(f"solver.solve: {args.n:,} configurations in one call: {ours_s * 1e3:.0f} ms "
          f"= {ours_rate:,.0f} configurations/s (best of {args.repeats})")
    if importlib.util.find_spec("mlsysim") is None:
        print("mlsysim is not installed (pip install -e '.[test]'): no reference timing")
    else:
        ref_s, results = time_reference_isolated(args.workload, args.fleet, knobs, args.reference,
                                                 args.reference_repeats)
        ref_rate = args.reference / ref_s
        worst = 0.0
        for i, ref_value in enumerate(results):
            if ref_value is None:
                assert not out["valid"][i]
                continue
            worst = max(worst, abs(out["step_latency_total"][i] - ref_value) / ref_value)
        figures.update(reference_calls=args.reference, reference_seconds=ref_s,
                       reference_configs_per_s=ref_rate, ratio=ours_rate / ref_rate,
                       max_relative_error_step_latency=worst)
        print(f"mlsysim 0.3.0: {args.reference} configurations, one call each: {ref_s:.2f} s "
              f"= {ref_rate:,.0f} configurations/s")
        print(f"ratio: {ours_rate / ref_rate:,.0f}x   (largest relative difference in "
              f"step_latency_total on the shared points: {worst:.1e})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=2)
    return figures


if __name__ == "__main__":
    main()
