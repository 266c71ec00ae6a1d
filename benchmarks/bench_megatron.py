"""Speed: a 1e7-layout open-mesh grid priced by the megatron model and by the mlsysim model.

    python benchmarks/bench_megatron.py [--repeat 3]

Both models price Llama-3.1-70B on a 1,024-GPU H100 fleet; each grid is an open
mesh (each axis long on its own dimension). The mlsysim grid has the same
number of points over its own knobs. Writes benchmarks/results/megatron_speed.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import solver  # noqa: E402
from solver import catalog  # noqa: E402
from solver.physics import megatron as M  # noqa: E402


def mesh(**axes):
    """Open mesh: axis i long on dimension i, length 1 elsewhere."""
    n = len(axes)
    out = {}
    for i, (name, values) in enumerate(axes.items()):
        shape = [1] * n
        shape[i] = len(values)
        out[name] = np.asarray(values).reshape(shape)
    return out


def megatron_grid():
    # 9,676,800 layouts
    return mesh(precision=np.array(["bf16", "fp16", "fp8"]), flash_attention=[False, True],
                tp_size=[1, 2, 4, 8], pp_size=[1, 2, 4, 8], cp_size=[1, 2],
                dp_size=[1, 2, 4, 8, 16], micro_batch_size=[1, 2, 4, 8, 16],
                v_stages=[1, 2, 5, 10], sequence_parallel=[False, True],
                recompute=np.array(["none", "selective", "full"]), zero_stage=[0, 1, 3],
                tp_comm_overlap=[False, True], overlap_grad_reduce=[False, True],
                batch_size=[256, 512, 1024, 2048, 4096, 8192, 16384])


def mlsysim_grid():
    # 6,451,200 layouts (mlsysim has fewer knobs; per-point times are compared)
    return mesh(overlap_efficiency=[0.5, 0.85], congestion_factor=[1.0, 1.5],
                tp_size=[1, 2, 4, 8], pp_size=[1, 2, 4, 8], ep_size=[1, 2],
                dp_size=[1, 2, 4, 8, 16], microbatch_count=[1, 2, 4, 8, 16],
                v_stages=[1, 2, 5, 10], activation_recomputation=[False, True],
                precision=np.array(["fp16", "bf16", "fp8"]), zero_stage=[0, 1, 3],
                overlap_comm=[False, True], is_lora=[False, True],
                batch_size=[256, 512, 1024, 2048, 4096, 8192, 16384])


def size(grid):
    return int(np.prod(np.broadcast_shapes(*(np.shape(v) for v in grid.values()))))


def timed(fn, repeat):
    best = np.inf
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
        del out
    return best


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    wl, fl = catalog.workload("Llama3_70B_MC"), catalog.fleet("HGX_H100_1K_MC")
    wl_ref, fl_ref = catalog.workload("Llama3_70B"), catalog.fleet("Training_1K")
    g_meg, g_ref = megatron_grid(), mlsysim_grid()
    t_meg = timed(lambda: M.solve(wl, fl, seq_len=8192, **g_meg), args.repeat)
    t_ref = timed(lambda: solver.solve(wl_ref, fl_ref, seq_len=8192, **g_ref), args.repeat)
    res = {
        "megatron": {"points": size(g_meg), "seconds": t_meg, "points_per_second": size(g_meg) / t_meg},
        "mlsysim": {"points": size(g_ref), "seconds": t_ref, "points_per_second": size(g_ref) / t_ref},
    }
    res["ratio_time_per_point_megatron_over_mlsysim"] = (t_meg / size(g_meg)) / (t_ref / size(g_ref))
    res["meta"] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"uname": " ".join(platform.uname()),
                    "nproc": subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip(),
                    "python": platform.python_version(), "numpy": np.__version__},
        "command": " ".join([Path(sys.executable).name] + sys.argv), "repeat": args.repeat,
        "workloads": [wl.name, wl_ref.name], "fleets": [fl.name, fl_ref.name]}
    out = ROOT / "benchmarks" / "results" / "megatron_speed.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
