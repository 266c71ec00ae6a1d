"""How fast does ``sweep.search`` find the best layout, and what does it save over a sweep?

1. Regret: on spaces of >= 10^6 layouts whose optimum is known (computed by
   ``search(mode="exact")``), the best feasible MFU found after N evaluations
   (N = 100, 300, 1000, 3000) over 5 seeds, as a fraction of the optimum, for
   TPE with local moves (the default), plain TPE (``refine=0``) and random
   sampling.
2. Wall time: the search against an exhaustive sweep on a space of > 10^8
   layouts (``configs/sweeps/search_llama70b.toml``, 2.6e9). ``--quick``
   estimates the sweep's time from its rate measured on blocks spread over the
   grid; the full run also sweeps it (2 processes, a few minutes) and reports
   the search's regret against the true optimum.

Run from the repository root::

    PYTHONPATH=. python benchmarks/bench_search.py           # ~25 minutes on 2 cores
    PYTHONPATH=. python benchmarks/bench_search.py --quick   # ~1 minute

Not a test: it prints tables and asserts nothing.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from joblib import Parallel, delayed

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sweep import grid  # noqa: E402
from sweep.search import resolve_memory_limit, search  # noqa: E402
from sweep.search.exhaustive import _reduce_block  # noqa: E402
from sweep.search.pricing import _Setup  # noqa: E402
from sweep.spec import load_spec  # noqa: E402

CHECKPOINTS = (100, 300, 1000, 3000)

#: Llama-3 70B, the cluster sized by the layout: 3.9e6 layouts.
LLAMA = {
    "name": "llama70b_dp", "workload": "Llama3_70B", "fleet": "Training_1K",
    "axes": {"tp_size": {"powers_of_two": 8}, "pp_size": {"divisors_of": "layers"},
             "microbatch_count": {"from": 1, "to": 64}, "zero_stage": [0, 1, 2, 3],
             "activation_recomputation": [False, True], "precision": ["bf16", "fp8"],
             "dp_size": {"powers_of_two": 128}, "v_stages": [1, 2, 4],
             "overlap_comm": [False, True], "seq_len": [2048, 4096]},
    "fixed": {"batch_size": 1024},
    "constraints": {"max_accelerators": 1024, "memory_limit": 0.9},
}

#: Mixtral 8x7B on the fixed 1024-GPU cluster, expert parallel: 2.4e6 layouts.
MIXTRAL = {
    "name": "mixtral_ep", "workload": "Mixtral_8x7B", "fleet": "Training_1K",
    "axes": {"tp_size": {"powers_of_two": 8}, "pp_size": {"powers_of_two": 32},
             "ep_size": [1, 2, 4, 8], "microbatch_count": {"from": 1, "to": 128},
             "zero_stage": [0, 1, 2, 3], "activation_recomputation": [False, True],
             "precision": ["bf16", "fp8"], "v_stages": [1, 2],
             "gradient_accumulation_steps": [1, 2, 4]},
    "fixed": {"batch_size": 1024, "overlap_comm": True},
    "constraints": {"memory_limit": 0.9},
}

BIG = ROOT / "configs" / "sweeps" / "search_llama70b.toml"


def _best_so_far(study):
    """Best feasible value after each trial, and seconds since the search began."""
    trials = sorted(study.trials, key=lambda t: t.number)
    values = [t.value if t.constraints and all(c <= 0 for c in t.constraints.values())
              else -np.inf for t in trials]
    first = min(t.datetime_start for t in trials)
    seconds = np.array([(t.datetime_complete - first).total_seconds() for t in trials])
    return np.maximum.accumulate(values), np.maximum.accumulate(seconds)


def _run(spec, sampler, refine, seed, n):
    """(best so far, seconds so far, wall time) of one seeded search."""
    warnings.simplefilter("ignore")
    started = time.perf_counter()
    result = search(spec, n_trials=n, seed=seed, sampler=sampler, refine=refine)
    best, seconds = _best_so_far(result.study)
    return best, seconds, time.perf_counter() - started


def regret(spec, seeds, n_max, methods, n_jobs):
    started = time.perf_counter()
    exact = search(spec, mode="exact", n_jobs=n_jobs)
    t_exact = time.perf_counter() - started
    size = load_spec(spec).size
    print(f"\n## {spec['name']}: {size:.3g} layouts, {exact.n_admissible:.3g} feasible; "
          f"exhaustive optimum mfu = {exact.best_value:.6f} in {t_exact:.1f} s "
          f"({size / t_exact / 1e6:.2f} M layouts/s, {n_jobs} processes)")
    tasks = [(label, sampler, refine, seed, n)
             for label, sampler, refine, n in methods for seed in seeds]
    runs = Parallel(n_jobs=n_jobs)(delayed(_run)(spec, sampler, refine, seed, min(n, n_max))
                                   for _, sampler, refine, seed, n in tasks)
    checkpoints = [c for c in CHECKPOINTS if c <= n_max]
    print(f"best mfu found / optimum after N evaluations, over seeds {list(seeds)} "
          f"(mean, worst; share of seeds >= 99 %) [mean seconds to reach N]")
    header = "| method | " + " | ".join(f"N={c}" for c in checkpoints) + " |"
    print(header)
    print("|" + "---|" * (len(checkpoints) + 1))
    for label, _, _, n in methods:
        mine = [r for (lab, *_), r in zip(tasks, runs) if lab == label]
        cells = []
        for c in checkpoints:
            if c > min(n, n_max):
                cells.append("")
                continue
            fractions = np.array([best[c - 1] / exact.best_value for best, _, _ in mine])
            fractions = np.where(np.isfinite(fractions), fractions, 0.0)
            seconds = np.mean([s[c - 1] for _, s, _ in mine])
            cells.append(f"{fractions.mean():.4f}, {fractions.min():.4f}; "
                         f"{(fractions >= 0.99).mean():.0%} [{seconds:.1f} s]")
        print(f"| {label} | " + " | ".join(cells) + " |")
    return exact


def sweep_rate(spec, n_blocks, max_points=1 << 18):
    """Exhaustive rate [layouts/s] of exact mode on blocks spread over the grid, one process."""
    spec = load_spec(spec)
    limits = {k: resolve_memory_limit(None, spec, f) for k, f in spec.fleets.items()}
    setup = _Setup(spec=spec, objectives=(("mfu", "maximize"),), limits=limits)
    stride = max(1, math.ceil(spec.size / max_points / n_blocks))
    points, seconds = 0, 0.0
    for block in itertools.islice(grid.blocks(spec, max_points), 0, None, stride):
        started = time.perf_counter()
        points += _reduce_block(setup, block, 10).n_points
        seconds += time.perf_counter() - started
    return points / seconds, points


def wall_time(quick, n_jobs):
    spec = load_spec(BIG)
    rate, measured = sweep_rate(spec, 8 if quick else 40)
    estimate = spec.size / rate
    print(f"\n## wall time on {BIG.name}: {spec.size:.3g} layouts")
    print(f"exhaustive sweep: {rate / 1e6:.2f} M layouts/s measured on {measured:.3g} layouts "
          f"spread over the grid (one process): ESTIMATED {estimate:.0f} s on one process "
          f"for the whole space")
    seeds = range(1) if quick else range(3)
    n = 1000 if quick else 3000
    runs = Parallel(n_jobs=n_jobs)(delayed(_run)(BIG, "tpe", None, seed, n) for seed in seeds)
    if quick:
        for seed, (best, _, t) in enumerate(runs):
            print(f"search (TPE + local moves, seed {seed}): {n} evaluations in {t:.1f} s, best "
                  f"mfu {best[-1]:.6f}; the estimated sweep takes {estimate / t:.0f}x as long "
                  f"(sweep not run: --quick)")
        return
    started = time.perf_counter()
    exact = search(spec, mode="exact", n_jobs=n_jobs, block_points=1 << 20)
    t_exact = time.perf_counter() - started
    print(f"exhaustive sweep RUN: {t_exact:.0f} s on {n_jobs} processes "
          f"({spec.size / t_exact / 1e6:.2f} M layouts/s), {exact.n_admissible:.3g} feasible, "
          f"optimum mfu {exact.best_value:.6f}")
    print("search / optimum after N evaluations [seconds to reach N; sweep time / that]")
    print("| seed | " + " | ".join(f"N={c}" for c in CHECKPOINTS) + " |")
    print("|---|" + "---|" * len(CHECKPOINTS))
    for seed, (best, seconds, _) in enumerate(runs):
        cells = " | ".join(f"{best[c - 1] / exact.best_value:.4f} [{seconds[c - 1]:.0f} s; "
                           f"{t_exact / seconds[c - 1]:.0f}x]" for c in CHECKPOINTS)
        print(f"| {seed} | {cells} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="one space, 3 seeds, up to 1000 evaluations; no sub-space sweep")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.quick:
        seeds, n_max, spaces = range(3), 1000, [LLAMA]
        methods = [("tpe + local moves (default)", "tpe", None, 1000),
                   ("random", "random", None, 1000)]
    else:
        seeds, n_max, spaces = range(5), 3000, [LLAMA, MIXTRAL]
        methods = [("tpe + local moves (default)", "tpe", None, 3000),
                   ("tpe, refine=0", "tpe", 0.0, 1000),
                   ("random", "random", None, 3000)]
    print(f"# bench_search ({'quick' if args.quick else 'full'}), {args.jobs} processes")
    for spec in spaces:
        regret(spec, seeds, n_max, methods, args.jobs)
    wall_time(args.quick, args.jobs)
    print(f"\n(total {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
