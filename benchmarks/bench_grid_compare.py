"""Grids before and after a change: the in-memory grid throughput of two revisions, interleaved.

    python benchmarks/bench_grid_compare.py --base REV [--rounds 3] [--repeat 3]
    python benchmarks/bench_grid_compare.py --base REV --case megatron_flat[_staged] [--out NAME]

Checks out ``REV`` into a temporary git worktree and times ``bench_sweep``'s
grid throughput (the Calculon GPT-3 space, 10.3M points, 2 float32 outputs,
``sweep.run`` into an in-memory cube, and ``solver.solve`` alone on the same
blocks) in a fresh process per revision, alternating the two revisions
``--rounds`` times, so both see the same machine state; the best of each is
kept. On a VM whose speed drifts, a figure from this morning is no baseline.
Writes benchmarks/results/grid_compare.json.

``--case megatron_flat`` times instead the megatron fused kernel on ``bench_fused``'s
million random flat layouts of Llama3_70B_MC (``megatron.solve(engine="fused")``, best of
``--repeat`` calls after a warm-up that compiles it) and writes
benchmarks/results/grid_compare_megatron_flat.json; ``--case megatron_flat_staged`` the
same draw with ``num_layers_in_first_pipeline_stage`` drawn from 0, 4, 6 and 8
(grid_compare_megatron_flat_staged.json).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Each revision reads its own configs/ (the data package ``layout_sweep_configs``, which an
#: editable install maps onto the working tree's configs/ whatever sys.path says).
_PRELUDE = """
import importlib.util, json, sys
sys.path.insert(0, {root!r}); sys.path.insert(0, {root!r} + "/benchmarks")
_spec = importlib.util.spec_from_file_location(
    "layout_sweep_configs", {root!r} + "/configs/__init__.py",
    submodule_search_locations=[{root!r} + "/configs"])
_configs = importlib.util.module_from_spec(_spec)
sys.modules["layout_sweep_configs"] = _configs
_spec.loader.exec_module(_configs)
"""

_CHILD = _PRELUDE + """
import bench_sweep
r = bench_sweep.bench_throughput([1], {repeat}, False)
print(json.dumps({{"run": r["run"]["1"]["configs_per_s"], "solve": r["solver_only_configs_per_s"]}}))
"""

_CHILD_MEGATRON = _PRELUDE + """
from bench_fused import best, megatron_draw
from solver import catalog
from solver.physics import megatron
wl, fl, n = catalog.workload("Llama3_70B_MC"), catalog.fleet("HGX_H100_1K_MC"), 1_000_000
knobs = megatron_draw(n)
{staged}call = lambda: megatron.solve(wl, fl, seq_len=8192, engine="fused", **knobs)
call()
print(json.dumps({{"solve": n / best(call, {repeat})[0]}}))
"""

#: the same draw with the first stage's layers set (0 in a quarter of the layouts): every
#: block of the kernel then takes its loop of any stages
_STAGED = """import numpy as np
knobs["num_layers_in_first_pipeline_stage"] = np.random.default_rng(3).choice([0, 4, 6, 8], n)
"""

CASES = {"grid": (_CHILD, ("run", "solve"), "grid_compare.json"),
         "megatron_flat": (_CHILD_MEGATRON.replace("{staged}", ""), ("solve",),
                           "grid_compare_megatron_flat.json"),
         "megatron_flat_staged": (_CHILD_MEGATRON.replace("{staged}", _STAGED), ("solve",),
                                  "grid_compare_megatron_flat_staged.json")}


def _time(root: Path, repeat: int, child: str = _CHILD) -> dict:
    out = subprocess.run([sys.executable, "-c", child.format(root=str(root), repeat=repeat)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the git revision to compare against")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--case", choices=sorted(CASES), default="grid")
    ap.add_argument("--out", help="file name under benchmarks/results/ to write (default: the "
                                  "case's; another keeps the case's file as committed)")
    args = ap.parse_args(argv)
    child, keys, out_name = CASES[args.case]
    out_name = args.out or out_name
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    base = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.base],
                          capture_output=True, text=True, check=True).stdout.strip()
    # The head side runs the working tree: name uncommitted changes, so that a comparison
    # of them against HEAD keeps two rows instead of pooling both into one.
    if subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                      capture_output=True, text=True, check=True).stdout.strip():
        head += "+dirty"
    if head == base:
        ap.error(f"--base {args.base} is the working tree itself ({head})")
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), base],
                       capture_output=True, check=True)
        try:
            rows = {head: [], base: []}
            for _ in range(args.rounds):
                rows[base].append(_time(tree, args.repeat, child))
                rows[head].append(_time(ROOT, args.repeat, child))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           capture_output=True)
    best = {rev: {k: max(r[k] for r in runs) for k in keys} for rev, runs in rows.items()}
    res = {"case": args.case, "base": base, "head": head, "rounds": rows,
           "best_configs_per_s": best,
           "head_over_base": {k: best[head][k] / best[base][k] for k in keys},
           "meta": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "machine": {"uname": " ".join(platform.uname()),
                                "python": platform.python_version()},
                    "command": " ".join([Path(sys.executable).name] + sys.argv),
                    "threads": os.environ.get("LAYOUT_SWEEP_THREADS", "the usable cores")}}
    out = ROOT / "benchmarks" / "results" / out_name
    out.write_text(json.dumps(res, indent=1) + "\n")
    for rev in (base, head):
        print(f"{rev}: " + ", ".join(f"{k} {best[rev][k] / 1e6:.2f} M/s" for k in keys))
    print("head / base: " + ", ".join(f"{k} {res['head_over_base'][k]:.3f}" for k in keys)
          + f"; wrote {out}")
    return res


if __name__ == "__main__":
    main()
