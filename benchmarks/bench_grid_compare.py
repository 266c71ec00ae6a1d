"""Grids before and after a change: the in-memory grid throughput of two revisions, interleaved.

    python benchmarks/bench_grid_compare.py --base REV [--rounds 3] [--repeat 3]

Checks out ``REV`` into a temporary git worktree and times ``bench_sweep``'s
grid throughput (the Calculon GPT-3 space, 10.3M points, 2 float32 outputs,
``sweep.run`` into an in-memory cube, and ``solver.solve`` alone on the same
blocks) in a fresh process per revision, alternating the two revisions
``--rounds`` times, so both see the same machine state; the best of each is
kept. On a VM whose speed drifts, a figure from this morning is no baseline.
Writes benchmarks/results/grid_compare.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CHILD = """
import json, sys
sys.path.insert(0, {root!r}); sys.path.insert(0, {root!r} + "/benchmarks")
import bench_sweep
r = bench_sweep.bench_throughput([1], {repeat}, False)
print(json.dumps({{"run": r["run"]["1"]["configs_per_s"], "solve": r["solver_only_configs_per_s"]}}))
"""


def _time(root: Path, repeat: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD.format(root=str(root), repeat=repeat)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the git revision to compare against")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    base = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.base],
                          capture_output=True, text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), base],
                       capture_output=True, check=True)
        try:
            rows = {head: [], base: []}
            for _ in range(args.rounds):
                rows[base].append(_time(tree, args.repeat))
                rows[head].append(_time(ROOT, args.repeat))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           capture_output=True)
    best = {rev: {k: max(r[k] for r in runs) for k in ("run", "solve")} for rev, runs in rows.items()}
    res = {"base": base, "head": head, "rounds": rows, "best_configs_per_s": best,
           "head_over_base": {k: best[head][k] / best[base][k] for k in ("run", "solve")},
           "meta": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "machine": {"uname": " ".join(platform.uname()),
                                "python": platform.python_version()},
                    "command": " ".join([Path(sys.executable).name] + sys.argv)}}
    out = ROOT / "benchmarks" / "results" / "grid_compare.json"
    out.write_text(json.dumps(res, indent=1) + "\n")
    for rev in (base, head):
        print(f"{rev}: sweep.run {best[rev]['run'] / 1e6:.2f} M/s, solve alone "
              f"{best[rev]['solve'] / 1e6:.2f} M/s")
    print(f"head / base: sweep.run {res['head_over_base']['run']:.3f}, solve "
          f"{res['head_over_base']['solve']:.3f}; wrote {out}")
    return res


if __name__ == "__main__":
    main()
