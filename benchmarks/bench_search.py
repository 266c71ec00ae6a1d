"""Is ``sweep.search`` right by default? Share of the optimum and wall time, DEFAULT settings.

1. Known optimum: spaces of 1e6-1e9 layouts (dense and MoE with EP up to 64, a
   cluster sized by ``dp_size`` under an accelerator budget, precision and
   sequence length as axes, a finely listed efficiency). The optimum comes
   from ``search(mode="exhaustive")`` (timed); then ``search(spec, seed=s)``
   with every default (``mode="auto"``, 60 s budget) for each seed: the share
   of the optimum reached, the wall time, and the mode auto chose.
2. Beyond enumeration: 2 spaces of 1e11-1e13 layouts: the default sampled
   search (5 seeds) against the best of a long run (10x the time budget,
   no patience limit).
3. Multi-objective: on a small space auto gives the exact Pareto front; the
   sampled front (NSGA-II, classic loop) is compared with it.

Run from the repository root::

    PYTHONPATH=. python benchmarks/bench_search.py --example # search_llama70b, ~6 min
    PYTHONPATH=. python benchmarks/bench_search.py --quick   # a few minutes
    PYTHONPATH=. python benchmarks/bench_search.py           # about an hour on 2 loaded cores

Results: printed, and saved as JSON (date, machine, command line, per-space
rows) under ``benchmarks/results/bench_search[_quick]_<date>.json`` (``--example``:
``bench_search_example.json``; ``--out`` names another). Not a
test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sweep.search import search  # noqa: E402
from sweep.spec import load_spec  # noqa: E402

_P2 = "powers_of_two"
_BASE = {"zero_stage": [0, 1, 2, 3], "activation_recomputation": [False, True],
         "precision": ["bf16", "fp8"]}

#: Spaces with a known optimum (1e6-1e9 layouts).
KNOWN = [
    {"name": "llama70b_dp", "workload": "Llama3_70B", "fleet": "Training_1K",
     "axes": {"tp_size": {_P2: 8}, "pp_size": {"divisors_of": "layers"},
              "microbatch_count": {"from": 1, "to": 64}, **_BASE,
              "dp_size": {_P2: 128}, "v_stages": [1, 2, 4], "overlap_comm": [False, True],
              "seq_len": [2048, 4096]},
     "fixed": {"batch_size": 1024},
     "constraints": {"max_accelerators": 1024, "memory_limit": 0.9}},
    {"name": "mixtral_ep", "workload": "Mixtral_8x7B", "fleet": "Training_1K",
     "axes": {"tp_size": {_P2: 8}, "pp_size": {_P2: 32}, "ep_size": [1, 2, 4, 8],
              "microbatch_count": {"from": 1, "to": 128}, **_BASE, "v_stages": [1, 2],
              "gradient_accumulation_steps": [1, 2, 4]},
     "fixed": {"batch_size": 1024, "overlap_comm": True},
     "constraints": {"memory_limit": 0.9}},
    {"name": "deepseek_ep64", "workload": "DeepSeek_V3", "fleet": "Training_1K",
     "axes": {"tp_size": {_P2: 8}, "pp_size": {_P2: 64}, "ep_size": {_P2: 64},
              "microbatch_count": {_P2: 256}, **_BASE, "v_stages": [1, 2],
              "overlap_comm": [False, True], "seq_len": [2048, 4096, 8192],
              "gradient_accumulation_steps": [1, 2, 4]},
     "fixed": {"batch_size": 2048},
     "constraints": {"memory_limit": 0.9}},
    {"name": "llama405b_fixed", "workload": "Llama3_405B", "fleet": "Training_1K",
     "axes": {"tp_size": {_P2: 16}, "pp_size": {"divisors_of": "layers"},
              "microbatch_count": {"from": 1, "to": 256}, **_BASE, "v_stages": [1, 2, 3],
              "seq_len": [4096, 8192], "gradient_accumulation_steps": [1, 2]},
     "fixed": {"batch_size": 2048, "overlap_comm": True},
     "constraints": {"memory_limit": 0.9}},
    {"name": "gpt3_efficiency", "workload": "GPT3", "fleet": "Training_1K",
     "axes": {"tp_size": {_P2: 8}, "pp_size": {"divisors_of": "layers"},
              "microbatch_count": {_P2: 128}, **_BASE, "dp_size": {_P2: 256},
              "efficiency": {"from": 0.3, "to": 0.6, "num": 31}},
     "fixed": {"batch_size": 1536, "overlap_comm": True},
     "constraints": {"max_accelerators": 2048, "memory_limit": 0.9}},
    {"name": "llama8b_seq", "workload": "Llama3_8B", "fleet": "Training_1K",
     "axes": {"tp_size": {_P2: 8}, "pp_size": {"divisors_of": "layers"},
              "microbatch_count": {"from": 1, "to": 64}, **_BASE, "dp_size": {_P2: 256},
              "seq_len": [2048, 4096, 8192, 16384], "overlap_comm": [False, True]},
     "fixed": {"batch_size": 512},
     "constraints": {"max_accelerators": 512, "memory_limit": 0.9}},
    {"name": "mixtral_dp", "workload": "Mixtral_8x7B", "fleet": "Training_1K",
     "axes": {"tp_size": {_P2: 8}, "pp_size": {_P2: 32}, "ep_size": [1, 2, 4, 8],
              "microbatch_count": {_P2: 128}, **_BASE, "dp_size": {_P2: 128},
              "seq_len": [2048, 4096], "overlap_efficiency": [0.5, 0.7, 0.9],
              "gradient_accumulation_steps": [1, 2]},
     "fixed": {"batch_size": 1024, "overlap_comm": True},
     "constraints": {"max_accelerators": 1024, "memory_limit": 0.9}},
    {"name": "llama70b_wide", "workload": "Llama3_70B", "fleet": "Training_1K",
     "axes": {"tp_size": {_P2: 64}, "pp_size": {"divisors_of": "layers"},
              "microbatch_count": {"from": 1, "to": 256}, **_BASE, "v_stages": [1, 2, 4],
              "seq_len": [2048, 4096, 8192], "dp_size": {_P2: 128},
              "overlap_comm": [False, True], "gradient_accumulation_steps": [1, 2, 4, 8],
              "overlap_efficiency": [0.5, 0.7, 0.9]},
     "fixed": {"batch_size": 1024},
     "constraints": {"max_accelerators": 1024, "memory_limit": 0.9}},
]

#: Spaces beyond enumeration (1e11-1e13 layouts).
HUGE = [
    {"name": "llama405b_huge", "workload": "Llama3_405B", "fleet": "Training_1K",
     "axes": {"tp_size": {_P2: 64}, "pp_size": {"divisors_of": "layers"},
              "microbatch_count": {"from": 1, "to": 512}, **_BASE, "v_stages": [1, 2, 3, 6],
              "seq_len": [2048, 4096, 8192], "dp_size": {"from": 1, "to": 256},
              "overlap_comm": [False, True], "gradient_accumulation_steps": [1, 2, 4, 8],
              "efficiency": {"from": 0.3, "to": 0.6, "num": 16}},
     "fixed": {"batch_size": 2048},
     "constraints": {"max_accelerators": 4096, "memory_limit": 0.9}},
    {"name": "deepseek_huge", "workload": "DeepSeek_V3", "fleet": "Training_1K",
     "axes": {"tp_size": {_P2: 16}, "pp_size": {_P2: 64}, "ep_size": {_P2: 64},
              "microbatch_count": {"from": 1, "to": 256}, **_BASE, "v_stages": [1, 2, 4],
              "seq_len": [2048, 4096, 8192], "dp_size": {_P2: 256},
              "overlap_comm": [False, True], "gradient_accumulation_steps": [1, 2, 4, 8],
              "overlap_efficiency": [0.5, 0.6, 0.7, 0.8, 0.9],
              "efficiency": {"from": 0.3, "to": 0.6, "num": 32}},
     "fixed": {"batch_size": 4096},
     "constraints": {"max_accelerators": 8192, "memory_limit": 0.9}},
]

#: Objectives of the multi-objective comparison.
PARETO = {"effective_throughput": "maximize", "n_accelerators": "minimize"}


def machine() -> dict:
    """Facts of the machine and software the numbers were measured on."""
    return {"uname": " ".join(platform.uname()), "nproc": os.cpu_count(),
            "python": sys.version.split()[0], "numpy": np.__version__,
            "optuna": __import__("optuna").__version__,
            "load_average": list(os.getloadavg()),
            "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True,
                                     capture_output=True).stdout.strip()}


def known_optimum(spec, seeds, n_jobs):
    """The exhaustive optimum, then the default search per seed: share and wall time."""
    started = time.perf_counter()
    exact = search(spec, mode="exhaustive", n_jobs=n_jobs)
    t_exact = time.perf_counter() - started
    rows = []
    for seed in seeds:
        started = time.perf_counter()
        result = search(spec, seed=seed)
        rows.append({"seed": seed, "share": result.best_value / exact.best_value,
                     "seconds": time.perf_counter() - started, "mode": result.mode,
                     "reason": result.reason,
                     "evidence": result.evidence.summary() if result.evidence else None})
    return {"space": spec["name"], "layouts": load_spec(spec).size,
            "optimum": exact.best_value, "exhaustive_seconds": t_exact,
            "exhaustive_processes": n_jobs, "runs": rows,
            "worst_share": min(r["share"] for r in rows),
            "max_seconds": max(r["seconds"] for r in rows)}


def beyond(spec, seeds, long_factor):
    """Default sampled search per seed against one long run (``long_factor`` x the budget)."""
    rows = []
    for seed in seeds:
        started = time.perf_counter()
        result = search(spec, seed=seed)
        rows.append({"seed": seed, "best": result.best_value,
                     "seconds": time.perf_counter() - started, "reason": result.reason,
                     "evidence": result.evidence.summary()})
    started = time.perf_counter()
    long = search(spec, seed=10_000, mode="sampled", time_budget=60.0 * long_factor,
                  patience=10 ** 6)
    reference = max([long.best_value] + [r["best"] for r in rows])
    for r in rows:
        r["share"] = r["best"] / reference
    return {"space": spec["name"], "layouts": load_spec(spec).size,
            "long_run_best": long.best_value, "long_run_seconds": time.perf_counter() - started,
            "reference": reference, "runs": rows, "worst_share": min(r["share"] for r in rows)}


def pareto(spec, seeds):
    """Exact front (auto) and sampled fronts (NSGA-II): share of the exact front found."""
    exact = search(spec, objectives=PARETO)
    front = {tuple(round(e["values"][n], 12) for n in PARETO) for e in exact.best_trials}
    rows = []
    for seed in seeds:
        sampled = search(spec, objectives=PARETO, mode="sampled", sampler="nsga2",
                         n_trials=2000, batch_size=100, seed=seed)
        found = {tuple(round(e["values"][n], 12) for n in PARETO) for e in sampled.best_trials}
        rows.append({"seed": seed, "front": len(found), "on_exact_front": len(found & front),
                     "seconds": sampled.elapsed})
    return {"space": spec["name"], "layouts": load_spec(spec).size, "mode": exact.reason,
            "exact_front": len(front), "exact_seconds": exact.elapsed, "sampled": rows}


def example(seeds):
    """The built-in spec ``search_llama70b`` (the README's search): its optimum by the
    exhaustive walk, then per seed the default search (auto) and the sampled search."""
    spec = dict(load_spec("search_llama70b").raw)
    row = known_optimum(spec, seeds, 1)
    row["sampled"] = []
    for seed in seeds:
        started = time.perf_counter()
        result = search(spec, seed=seed, mode="sampled")
        row["sampled"].append({"seed": seed, "share": result.best_value / row["optimum"],
                               "seconds": time.perf_counter() - started,
                               "reason": result.reason})
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="3 known spaces, 2 seeds, one huge space with a 3x long run")
    parser.add_argument("--jobs", type=int, default=1, help="processes of the exhaustive walks")
    parser.add_argument("--out", "--json", type=Path, default=None, help="JSON file to write")
    parser.add_argument("--seeds", type=int, default=None,
                        help="seeds per space (default: 5, or 2 with --quick)")
    parser.add_argument("--long-factor", type=int, default=None,
                        help="huge spaces: the long run's budget in default budgets "
                             "(default: 10, or 3 with --quick)")
    parser.add_argument("--example", action="store_true",
                        help="only the built-in spec search_llama70b: exhaustive, then the "
                             "default and the sampled search per seed")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    if args.example:
        out = args.out or ROOT / "benchmarks" / "results" / "bench_search_example.json"
        row = example(range(args.seeds or 5))
        out.write_text(json.dumps({
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": " ".join([Path(sys.executable).name] + sys.argv),
            "machine": machine(), "example": row}, indent=1, default=str))
        print(f"{row['space']}: {row['layouts']:.3g} layouts, exhaustive "
              f"{row['exhaustive_seconds']:.1f} s; default: worst share {row['worst_share']:.4f}, "
              f"max {row['max_seconds']:.1f} s ({row['runs'][0]['reason']}); sampled: worst share "
              f"{min(r['share'] for r in row['sampled']):.4f}, max "
              f"{max(r['seconds'] for r in row['sampled']):.1f} s")
        print(f"saved {out}")
        return
    if args.quick:
        seeds, known, huge, long_factor = range(2), KNOWN[:2] + KNOWN[2:3], HUGE[:1], 3
    else:
        seeds, known, huge, long_factor = range(5), KNOWN, HUGE, 10
    seeds = range(args.seeds) if args.seeds else seeds
    long_factor = args.long_factor or long_factor
    stamp = datetime.datetime.now().strftime("%Y-%m-%d")
    out = args.out or ROOT / "benchmarks" / "results" / (
        f"bench_search{'_quick' if args.quick else ''}_{stamp}.json")
    report = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
              "command": " ".join([Path(sys.executable).name] + sys.argv),
              "machine": machine(), "known": [], "beyond": [], "pareto": None}

    def save():
        out.write_text(json.dumps(report, indent=1, default=str))

    for spec in known:
        row = known_optimum(spec, seeds, args.jobs)
        report["known"].append(row)
        print(f"{row['space']}: {row['layouts']:.3g} layouts, exhaustive "
              f"{row['exhaustive_seconds']:.1f} s; default: worst share "
              f"{row['worst_share']:.4f}, max {row['max_seconds']:.1f} s; "
              f"{row['runs'][0]['reason']}", flush=True)
        save()
    for spec in huge:
        row = beyond(spec, seeds, long_factor)
        report["beyond"].append(row)
        print(f"{row['space']}: {row['layouts']:.3g} layouts; worst share {row['worst_share']:.4f}"
              f" of the best of a {long_factor}x run; max "
              f"{max(r['seconds'] for r in row['runs']):.1f} s", flush=True)
        save()
    small = {**KNOWN[0], "name": "llama70b_small",
             "axes": {**KNOWN[0]["axes"], "microbatch_count": {_P2: 64}, "v_stages": [1, 2]}}
    report["pareto"] = pareto(small, seeds)
    print(f"pareto: {json.dumps(report['pareto'])}")
    save()
    print(f"saved {out}")


if __name__ == "__main__":
    main()
