"""Calibrate on a few of vTrain's measured layouts, rank the rest: a new software stack.

``benchmarks/fidelity.py``'s leave-one-source-out fit without vTrain ranks vTrain's 1,440
single-node layouts with a Kendall tau of only 0.50-0.74 (`results/fidelity.md`): vTrain's software stack (2022
Megatron-DeepSpeed on 8 A100s) spends some 3.5 ms of host time per layer and microbatch
launching kernels, a floor under its small models' steps (the megatron model's
``layer_overhead``), and no published run is small enough to show it. A user who meets a
new stack measures a few layouts and calibrates (``sweep.calibrate``); this benchmark does
just that, through the package's own path:

- start: the constants ``fidelity.py`` fits on every source but vTrain (its LOSO fold);
- for each ``k`` and seed: ``k`` layouts drawn at random (seeded) from the 1,440, written as
  measurement records (``sweep.calibration.read_measurements``; node
  ``DGX_A100_40GB_MC``), calibrated with ``sweep.calibrate``'s defaults;
- scored on the other ``1,440 - k`` layouts: mean and max absolute percentage error of
  the step time, and Kendall tau per model shape (fidelity.py's 8 groups).

Beside the default calibration, the same draws calibrated with ``free=DEFAULT_FREE`` (the
free constants without the launch floor: what ``sweep.calibrate`` fitted before the floor
joined them), and the start uncalibrated.

    python benchmarks/bench_calibrate_vtrain.py    # results/bench_calibrate_vtrain.{json,md}
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import fidelity  # noqa: E402
import sweep  # noqa: E402
from sweep.calibration import DEFAULT_FREE, CalibrationWarning, predict, read_measurements  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
#: Layouts measured per calibration, and seeds per count.
SIZES = (5, 10, 20)
SEEDS = 5


def records(runs):
    """vTrain's layouts as measurement records, one a layout, and each one's model shape."""
    out, groups = [], []
    for r in runs:
        if r.source != "VTRAIN":
            continue
        w = r.workload
        # every knob fidelity.load_runs gives the layouts, one value per layout
        knobs = {n: np.broadcast_to(np.asarray(v), r.measured.shape) for n, v in r.knobs.items()}
        for j, step in enumerate(r.measured):
            out.append({"run_id": f"{r.run_id}-{j}", "layers": w.layers, "hidden_dim": w.hidden_dim,
                        "heads": w.heads, "vocab_size": w.vocab_size, "parameters": w.parameters,
                        "node": fidelity.VTRAIN_NODE, "fabric": "InfiniBand_HDR",
                        **{n: v[j].item() for n, v in knobs.items()}, "step_time_s": float(step)})
            groups.append(r.group)
    return out, np.array(groups)


def scores(pred, meas, groups):
    """Mean and max APE [%] and Kendall tau per model shape."""
    e = fidelity.ape(pred, meas)
    taus = [fidelity.kendall(pred[groups == g], meas[groups == g]) for g in np.unique(groups)]
    return {"mean_ape": float(np.mean(e)), "max_ape": float(np.max(e)), "kendall_tau": taus}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=SEEDS, help=f"draws per size (default {SEEDS})")
    args = ap.parse_args(argv)
    t0 = time.time()
    runs, _ = fidelity.load_runs()
    start = fidelity.fit_megatron([r for r in runs if r.source != "VTRAIN"])
    rows, groups = records(runs)
    data = read_measurements(rows, name="vtrain_single_node.csv")
    meas = data.step_times
    uncal = predict(data, start)
    # the records price as fidelity.py prices the layouts (the same bits, or the benchmark lies)
    ref = np.concatenate([np.ravel(fidelity.megatron_predict(r, start)) for r in runs
                          if r.source == "VTRAIN"])
    assert np.array_equal(uncal, ref), "vTrain records priced unlike fidelity.py"
    results = {"start": start, "uncalibrated": scores(uncal, meas, groups), "draws": []}
    cases = (("default", None), ("without launch floor", DEFAULT_FREE))
    for k in SIZES:
        for seed in range(args.seeds):
            train = np.sort(np.random.default_rng(seed).choice(len(rows), k, replace=False))
            test = np.setdiff1d(np.arange(len(rows)), train)
            draw = {"k": k, "seed": seed, "train": [rows[i]["run_id"] for i in train]}
            for label, free in cases:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always", CalibrationWarning)
                    cal = sweep.calibrate(data.subset(train), start=start, free=free)
                pred = predict(data.subset(test), cal.constants)
                draw[label] = {**scores(pred, meas[test], groups[test]),
                               "free": list(cal.profile.free),
                               "constants": {n: cal.constants[n] for n in cal.profile.free},
                               "loo_warned": any(str(w.message).startswith("leave-one-out:")
                                                 for w in caught),
                               "warnings": [str(w.message) for w in caught]}
            results["draws"].append(draw)
            d, o = draw["default"], draw["without launch floor"]
            print(f"k={k} seed {seed}: default {d['mean_ape']:.1f}% tau {min(d['kendall_tau']):.3f}-"
                  f"{max(d['kendall_tau']):.3f} (floor {cal_floor(d)}); without floor "
                  f"{o['mean_ape']:.1f}% tau {min(o['kendall_tau']):.3f}-{max(o['kendall_tau']):.3f}",
                  flush=True)
    results["meta"] = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "machine": fidelity.machine(),
                       "command": " ".join([Path(sys.executable).name] + sys.argv),
                       "data_sha256": data.sha256, "seconds": round(time.time() - t0, 1),
                       "layouts": len(rows), "seeds": args.seeds}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_calibrate_vtrain.json").write_text(json.dumps(results, indent=1) + "\n")
    (RESULTS / "bench_calibrate_vtrain.md").write_text(markdown(results))
    print(markdown(results))
    return results


def cal_floor(fit):
    value = fit["constants"].get("layer_overhead")
    return "held" if value is None else f"{value * 1e3:.3f} ms"


def markdown(res):
    meta, u = res["meta"], res["uncalibrated"]
    out = ["# Calibration on a few vTrain layouts: the rest ranked\n",
           f"- date: {meta['date']}", f"- machine: `{meta['machine']['uname']}`, nproc "
           f"{meta['machine']['nproc']}, python {meta['machine']['python']}, numpy "
           f"{meta['machine']['numpy']}", f"- command: `{meta['command']}`",
           f"- layouts: {meta['layouts']} (vTrain, one 8x A100 node), data sha256 "
           f"{meta['data_sha256'][:16]}, {meta['seconds']} s", "",
           "Start: `fidelity.py`'s fit on every source but vTrain (launch floor "
           f"{res['start']['layer_overhead'] * 1e3:.3f} ms). Each row: k layouts drawn at random "
           f"({meta['seeds']} seeds), calibrated with `sweep.calibrate`; the other layouts "
           "scored: mean / max absolute percentage error of the step time, and the least and "
           "largest Kendall tau over the 8 model shapes. *default*: `sweep.calibrate`'s "
           "defaults (the launch floor free where the runs see it, fitted from the start and "
           "from 1 ms); *without launch floor*: `free=DEFAULT_FREE`, the launch floor held "
           "at the start's. (!) marks a fit whose leave-one-out warning fired.", "",
           f"Uncalibrated (the start): {u['mean_ape']:.1f} / {u['max_ape']:.1f} %, tau "
           f"{min(u['kendall_tau']):.3f}-{max(u['kendall_tau']):.3f}.", "",
           "| k | seed | default: error | default: tau | default: launch floor | without launch "
           "floor: error | without: tau |", "|---|---|---|---|---|---|---|"]
    for d in res["draws"]:
        a, b = d["default"], d["without launch floor"]
        out.append(f"| {d['k']} | {d['seed']} | {a['mean_ape']:.1f} / {a['max_ape']:.1f} %"
                   f"{' (!)' if a['loo_warned'] else ''} | {min(a['kendall_tau']):.3f}-"
                   f"{max(a['kendall_tau']):.3f} | {cal_floor(a)} | {b['mean_ape']:.1f} / "
                   f"{b['max_ape']:.1f} %{' (!)' if b['loo_warned'] else ''} | "
                   f"{min(b['kendall_tau']):.3f}-{max(b['kendall_tau']):.3f} |")
    out += ["", "Over the draws of each k (mean of the mean errors; least tau of any shape in any draw):",
            "", "| k | default: error | default: least tau | without launch floor: error | "
            "without: least tau |", "|---|---|---|---|---|"]
    for k in sorted({d["k"] for d in res["draws"]}):
        ds = [d for d in res["draws"] if d["k"] == k]
        row = [f"| {k}"]
        for label in ("default", "without launch floor"):
            row.append(f"{np.mean([d[label]['mean_ape'] for d in ds]):.1f} %")
            row.append(f"{min(min(d[label]['kendall_tau']) for d in ds):.3f}")
        out.append(" | ".join(row) + " |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
