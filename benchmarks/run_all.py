"""Every benchmark in one command, as one side-by-side table (and JSON).

    python benchmarks/run_all.py [--quick] [--json benchmarks/results/latest.json]

Runs, each in its own process (so peak memory is that benchmark's own):

1. ``bench_solver.py``: configurations/s of mlsysim 0.3.0 (one call each) and of
   ``solver.solve`` (one call on flat arrays), and their ratio;
2. ``bench_sweep.py``: grid throughput into an in-memory cube, the Calculon-sized
   GPT-3 space end to end, a ~10^8-configuration sweep streamed to disk with its
   peak RSS, and the ratio against the reference on the same space;
3. a scaling curve: ``sweep.run`` streamed to netCDF from 10^3 to 10^8
   configurations, wall time and peak RSS for each size;
4. ``bench_search.py``: the search regret table (share of the exhaustive optimum
   reached after N evaluations, over seeds) and search against sweep wall time;
   its quick version unless ``--full-search`` (about 25 minutes on 2 cores).

The README's performance table is this script's output.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _child(script, args, timeout, figures=True):
    """Run a benchmark script; its figures (--json), or its printed tables, or the failure."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        out = Path(tmp) / "figures.json"
        started = time.perf_counter()
        command = [sys.executable, str(HERE / script), *args]
        command += ["--json", str(out)] if figures else []
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})
        sys.stdout.write(proc.stdout)
        if proc.returncode != 0 or (figures and not out.exists()):
            sys.stdout.write(proc.stderr[-2000:])
            return {"failed": f"{script} exited {proc.returncode}"}
        result = json.loads(out.read_text()) if figures else {"printed": proc.stdout}
        result["wall_seconds"] = time.perf_counter() - started
        return result


_SCALING_CHILD = r"""
import json, resource, sys, tempfile, time, os
import sweep
n = int(sys.argv[1])
base = 11 * 12 * 4 * 2  # tp divisors of 1024 x pp divisors of 96 x ZeRO x recomputation
spec = {"name": f"scale_{n}", "workload": "GPT3", "fleet": "Training_1K", "dtype": "float32",
        "outputs": ["mfu", "step_latency_total"],
        "axes": {"tp_size": {"divisors_of": "fleet"}, "pp_size": {"divisors_of": 96},
                 "zero_stage": [0, 1, 2, 3], "activation_recomputation": [False, True],
                 "efficiency": {"from": 0.3, "to": 0.7, "num": max(1, round(n / base))}},
        "fixed": {"batch_size": 1536, "microbatch_count": 64, "overlap_comm": True},
        "constraints": {"memory_limit": "72 GB"}}
with tempfile.TemporaryDirectory(prefix="scale-") as tmp:
    path = os.path.join(tmp, "cube.nc")
    start = time.perf_counter()
    cube = sweep.run(spec, path=path, progress=False)
    seconds = time.perf_counter() - start
    size = int(cube["mfu"].size)
    cube.close()
print(json.dumps({"configs": size, "seconds": seconds,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def scaling_curve(sizes, timeout):
    rows = []
    for n in sizes:
        proc = subprocess.run([sys.executable, "-c", _SCALING_CHILD, str(n)], cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        if proc.returncode != 0:
            rows.append({"target": n, "failed": proc.stderr[-500:]})
            print(f"  {n:>12,}: failed")
            continue
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        row["configs_per_s"] = row["configs"] / row["seconds"]
        rows.append(row)
        print(f"  {row['configs']:>12,} configs  {row['seconds']:8.2f} s  "
              f"{row['configs_per_s'] / 1e6:8.2f} M/s  peak RSS {row['peak_rss_mb']:7.0f} MB")
    return rows


def _get(d, *keys, default=float("nan")):
    for key in keys:
        if not isinstance(d, dict) or key not in d:
            return default
        d = d[key]
    return d


def table(results):
    """The side-by-side table, as Markdown (the README's performance table)."""
    s, w = results.get("solver", {}), results.get("sweep", {})
    lines = ["| measurement | reference (mlsysim 0.3.0) | ours | ratio |", "|---|---|---|---|"]
    ref = _get(s, "reference_configs_per_s")
    lines.append(f"| flat random configurations, one `solve` call ({_get(s, 'n', default=0):,}) "
                 f"| {ref:,.0f} /s | {_get(s, 'solve_configs_per_s'):,.0f} /s "
                 f"| {_get(s, 'ratio'):,.0f}x |")
    ref_grid = _get(w, "reference", "configs_per_s")
    tp = _get(w, "throughput", "run", default={})
    best_tp = max((v["configs_per_s"] for v in tp.values()), default=float("nan"))
    lines.append(f"| grid into an in-memory cube ({_get(w, 'throughput', 'space', default=0):,}) "
                 f"| {ref_grid:,.0f} /s | {best_tp:,.0f} /s | {best_tp / ref_grid:,.0f}x |")
    cal = _get(w, "calculon_gpt3", "run", default={})
    best_cal = min((v["seconds"] for v in cal.values()), default=float("nan"))
    space = _get(w, "calculon_gpt3", "space", default=0)
    lines.append(f"| Calculon-sized GPT-3 space end to end ({space:,}) "
                 f"| {space / ref_grid / 3600:,.1f} h (at its rate) | {best_cal:.2f} s "
                 f"| {space / ref_grid / best_cal:,.0f}x |")
    st = w.get("stream", {})
    lines.append(f"| streamed to netCDF ({_get(st, 'space', default=0):,}) | | "
                 f"{_get(st, 'seconds'):.1f} s, peak RSS {_get(st, 'peak_rss_mb'):.0f} MB | |")
    for row in results.get("scaling", []):
        if "configs" in row:
            lines.append(f"| scaling: {row['configs']:,} streamed | | {row['seconds']:.2f} s, "
                         f"peak RSS {row['peak_rss_mb']:.0f} MB | |")
    return "\n".join(lines)


def _machine() -> dict:
    """What this machine is: the facts a figure needs beside it."""
    import platform

    import numpy

    load = os.getloadavg()
    return {"uname": " ".join(platform.uname()), "cpus": os.cpu_count(),
            "python": platform.python_version(), "numpy": numpy.__version__,
            "load_average_at_start": [round(x, 2) for x in load],
            "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small versions of everything")
    parser.add_argument("--json", type=Path, help="save every figure here")
    parser.add_argument("--skip-search", action="store_true", help="leave out the regret table")
    parser.add_argument("--full-search", action="store_true",
                        help="the full regret benchmark (5 seeds, 2 spaces, ~25 minutes)")
    args = parser.parse_args(argv)
    quick = ["--quick"] if args.quick else []
    results = {"quick": args.quick, "search_mode": "skipped" if args.skip_search else (
                   "full" if args.full_search else "quick"),
               "command": " ".join(["python", "benchmarks/run_all.py", *(argv or sys.argv[1:])]),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "machine": _machine()}

    print("== solver.solve against the reference ==")
    n = ["--n", "100000", "--reference", "100"] if args.quick else []
    results["solver"] = _child("bench_solver.py", n, timeout=1800)
    print("\n== sweeps ==")
    results["sweep"] = _child("bench_sweep.py", quick + ["--jobs", "1"], timeout=3600)
    print("\n== scaling curve (sweep.run streamed to netCDF, 2 float32 outputs) ==")
    sizes = [10 ** k for k in range(3, 7 if args.quick else 9)]
    results["scaling"] = scaling_curve(sizes, timeout=3600)
    if not args.skip_search:
        print("\n== search regret ==")
        results["search"] = _child("bench_search.py", [] if args.full_search else ["--quick"],
                                   timeout=4 * 3600)
    print("\n== summary ==")
    summary = table(results)
    print(summary)
    results["table"] = summary
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2, default=str))
        print(f"saved {args.json}")
    return results


if __name__ == "__main__":
    main()
