"""Sweep benchmarks on this machine, side by side with the reference.

Prints:

1. grid throughput into an in-memory cube (configurations per second; a few
   float32 outputs), with the rate of ``solver.solve`` alone on the same blocks;
2. the Calculon-sized GPT-3 space (``configs/sweeps/calculon_gpt3.toml``, about
   10 million layouts) end to end;
3. a sweep of about 100 million configurations streamed to a netCDF file, run
   in a subprocess whose peak RSS is read with ``resource.getrusage``;
4. the reference's rate (mlsysim 0.3.0 ``DistributedModel().solve``, one call
   per configuration) on random points of the same space, best of three passes
   after an untimed warm-up, and the ratio.

Usage::

    python benchmarks/bench_sweep.py [--quick] [--jobs 1 2] [--json results.json]

``--quick`` runs a small version of each (a 5-million-point stream).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import tomllib
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import solver  # noqa: E402
import sweep  # noqa: E402
from sweep import grid  # noqa: E402

CALCULON = ROOT / "configs" / "sweeps" / "calculon_gpt3.toml"
FEW_OUTPUTS = ["mfu", "step_latency_total"]


def _calculon(**changes) -> dict:
    with CALCULON.open("rb") as fh:
        raw = tomllib.load(fh)
    raw = copy.deepcopy(raw)
    for key, value in changes.items():
        if key == "axes":
            raw["axes"].update(value)
        else:
            raw[key] = value
    return raw


def _best_of(fn, repeat):
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def bench_throughput(jobs, repeat, quick):
    """Configurations per second into an in-memory cube, few float32 outputs."""
    raw = _calculon(outputs=FEW_OUTPUTS, dtype="float32")
    if quick:
        raw["axes"]["efficiency"] = {"from": 0.3, "to": 0.7, "num": 2}
    spec = sweep.load_spec(raw)
    blocks = list(grid.blocks(spec, sweep.evaluate.DEFAULT_MAX_POINTS))
    # (warn=False: a block with no realizable layout is no news here, as in sweep.run)
    solve_only = _best_of(lambda: [solver.solve(b.workload, b.fleet, warn=False, **b.knobs)
                                   for b in blocks], repeat)
    out = {"space": spec.size, "outputs": FEW_OUTPUTS, "dtype": "float32",
           "solver_only_configs_per_s": spec.size / solve_only, "run": {}}
    for n_jobs in jobs:
        sweep.run(spec, n_jobs=n_jobs)  # warm up (worker start-up is not throughput)
        seconds = _best_of(lambda: sweep.run(spec, n_jobs=n_jobs), repeat)
        out["run"][str(n_jobs)] = {"seconds": seconds, "configs_per_s": spec.size / seconds}
    return out


def bench_calculon(jobs, repeat):
    """The Calculon-sized GPT-3 space end to end (spec file to cube in memory)."""
    spec = sweep.load_spec(CALCULON)
    out = {"space": spec.size, "outputs": list(spec.outputs), "run": {}}
    for n_jobs in jobs:
        sweep.run(CALCULON, n_jobs=n_jobs)
        seconds = _best_of(lambda: sweep.run(CALCULON, n_jobs=n_jobs), repeat)
        out["run"][str(n_jobs)] = {"seconds": seconds, "configs_per_s": spec.size / seconds}
    return out


def _stream_child(path, raw_json, n_jobs):
    """Run in a subprocess: stream one sweep, print seconds and peak RSS as JSON."""
    raw = json.loads(raw_json)
    start = time.perf_counter()
    cube = sweep.run(raw, path=path, n_jobs=n_jobs)
    seconds = time.perf_counter() - start
    size = int(np.prod(list(cube.sizes.values())))
    cube.close()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kB
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps({"space": size, "seconds": seconds, "peak_rss_mb": rss,
                      "peak_rss_children_mb": children, "vm_hwm_mb": _vm_hwm_mb(),
                      "file_mb": Path(path).stat().st_size / 2**20}))


def _vm_hwm_mb():
    """Peak RSS of this process image from /proc (Linux), a check on getrusage."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def bench_stream(quick, n_jobs):
    """About 100 million configurations streamed to disk, peak RSS of the process."""
    efficiencies = 3 if quick else 50  # 10.3e6 / 5 per efficiency value
    raw = _calculon(outputs=FEW_OUTPUTS, dtype="float32",
                    axes={"efficiency": {"from": 0.2, "to": 0.8, "num": efficiencies}})
    if quick:
        raw["axes"]["microbatch_count"] = {"from": 1, "to": 64}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "stream.nc"
        done = subprocess.run([sys.executable, __file__, "--stream-child", str(path),
                               json.dumps(raw), str(n_jobs)],
                              capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["configs_per_s"] = result["space"] / result["seconds"]
    result["n_jobs"] = n_jobs
    return result


def _mlsysim_objects(spec):
    from mlsysim.models.registry import Models
    from mlsysim.systems.registry import Systems

    label = next(iter(spec.workloads))
    for group in ("Language", "Vision", "Recommendation", "StateSpace", "GenerativeVision",
                  "Embodied", "Tiny"):
        if hasattr(getattr(Models, group), label):
            model = getattr(getattr(Models, group), label)
            break
    else:
        raise LookupError(f"mlsysim has no model {label!r}")
    return model, getattr(Systems.Clusters, next(iter(spec.fleets)))


def bench_reference(points, seed=0, repeat=3):
    """mlsysim 0.3.0 DistributedModel().solve, one call per random point of the space.

    The best of ``repeat`` passes over the same points, after an untimed pass over the
    first ten (as every other timing here is a best of several, warmed up).
    """
    try:
        from mlsysim.engine.solvers.distributed import DistributedModel
    except ImportError:
        return {"skipped": "mlsysim is not installed"}
    spec = sweep.load_spec(CALCULON)
    model, fleet = _mlsysim_objects(spec)
    rng = np.random.default_rng(seed)
    reference = DistributedModel()
    draws = []
    for _ in range(points):
        coords = {a.name: a.values[rng.integers(len(a.values))] for a in spec.axes}
        draws.append(grid.point(spec, coords)[2])

    def one_pass(knob_list):
        priced = refused = 0
        for knobs in knob_list:
            try:
                reference.solve(model, fleet, **knobs)
                priced += 1
            except ValueError:  # an impossible split: the reference raises
                refused += 1
        return priced, refused

    best = np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one_pass(draws[:10])
        for _ in range(repeat):
            start = time.perf_counter()
            priced, refused = one_pass(draws)
            best = min(best, time.perf_counter() - start)
    return {"points": points, "priced": priced, "refused": refused, "seconds": best,
            "configs_per_s": points / best, "repeat": repeat}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small version of each")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2],
                        help="n_jobs values to time (default: 1 2)")
    parser.add_argument("--stream-jobs", type=int, default=1,
                        help="n_jobs of the streamed sweep (default 1: one process's RSS)")
    parser.add_argument("--json", type=Path, help="also save the results here")
    parser.add_argument("--stream-child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.stream_child:
        path, raw, n_jobs = args.stream_child
        _stream_child(path, raw, int(n_jobs))
        return

    repeat = 1 if args.quick else 3
    results = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                           "numpy": np.__version__, "solver": solver.__version__}}
    print(f"# sweep benchmarks ({'quick' if args.quick else 'full'}), {os.cpu_count()} CPUs")

    # The stream runs first: Linux carries a parent's peak RSS over fork and exec
    # into the child's ru_maxrss, so the parent must still be small.
    stream = bench_stream(args.quick, args.stream_jobs)

    r = results["throughput"] = bench_throughput(args.jobs, repeat, args.quick)
    print(f"grid -> in-memory cube, {r['space']:,} configs, {len(FEW_OUTPUTS)} float32 outputs:")
    print(f"  solver.solve alone on the same blocks: {r['solver_only_configs_per_s'] / 1e6:8.2f} M configs/s")
    for n_jobs, v in r["run"].items():
        print(f"  sweep.run n_jobs={n_jobs}: {v['seconds']:6.2f} s  {v['configs_per_s'] / 1e6:8.2f} M configs/s")

    r = results["calculon_gpt3"] = bench_calculon(args.jobs, repeat)
    print(f"Calculon GPT-3 space end to end, {r['space']:,} configs, {len(r['outputs'])} outputs:")
    for n_jobs, v in r["run"].items():
        print(f"  n_jobs={n_jobs}: {v['seconds']:6.2f} s  {v['configs_per_s'] / 1e6:8.2f} M configs/s")

    r = results["stream"] = stream
    print(f"streamed to netCDF, {r['space']:,} configs (n_jobs={r['n_jobs']}): {r['seconds']:.1f} s, "
          f"{r['configs_per_s'] / 1e6:.2f} M configs/s, peak RSS {r['peak_rss_mb']:.0f} MB "
          f"(getrusage; VmHWM {r['vm_hwm_mb'] or float('nan'):.0f} MB), "
          f"file {r['file_mb']:.0f} MB")

    r = results["reference"] = bench_reference(50 if args.quick else 200)
    if "skipped" in r:
        print(f"reference: skipped ({r['skipped']})")
    else:
        ours = max(v["configs_per_s"] for v in results["calculon_gpt3"]["run"].values())
        results["ratio_calculon_vs_reference"] = ours / r["configs_per_s"]
        print(f"reference mlsysim DistributedModel().solve, {r['points']} random points "
              f"({r['refused']} impossible splits): {r['configs_per_s']:.0f} configs/s")
        print(f"  ratio (Calculon sweep / reference): {results['ratio_calculon_vs_reference']:,.0f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
        print(f"saved {args.json}")


if __name__ == "__main__":
    main()
