"""``python -m solver``: price the reference optimizer's layouts for a default model and fleet."""

from __future__ import annotations

import argparse

import numpy as np

from . import catalog, solve


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m solver", description=__doc__)
    parser.add_argument("--workload", default="Llama3_70B")
    parser.add_argument("--fleet", default="Training_1K")
    parser.add_argument("--batch-size", type=int, default=1024)
    args = parser.parse_args(argv)
    wl, fl = catalog.workload(args.workload), catalog.fleet(args.fleet)
    tp = np.array([1, 2, 4, 8])[:, None]
    pp = np.array([1, 2, 4, 8, 16, 32])[None, :]
    out = solve(wl, fl, batch_size=args.batch_size, tp_size=tp, pp_size=pp,
                microbatch_count=16, zero_stage=1, overlap_comm=True)
    print(f"{wl.name} on {fl.name} ({fl.total_accelerators} accelerators), "
          f"global batch {args.batch_size}")
    print(f"{'TP':>3} {'PP':>3} {'DP':>5} {'MFU':>7} {'step [s]':>10} {'memory [GB]':>12} fits")
    for i in range(tp.shape[0]):
        for j in range(pp.shape[1]):
            if not out["valid"][i, j]:
                continue
            print(f"{tp[i, 0]:>3} {pp[0, j]:>3} {out['dp_size'][i, j]:>5.0f} "
                  f"{out['mfu'][i, j]:>7.3f} {out['step_latency_total'][i, j]:>10.3f} "
                  f"{out['memory_footprint'][i, j] / 1e9:>12.1f} "
                  f"{'yes' if out['feasible'][i, j] else 'no'}")


if __name__ == "__main__":
    main()
