"""Calibrate on half of one system's published runs, predict the other half.

The H100 runs of ``benchmarks/data/published_runs.csv`` (MLM24, NEMO2407,
NEMOLS, read by ``benchmarks/fidelity.py``) are written as a measurements CSV
(the format of :mod:`sweep.calibration.measurements`), split in two halves
(alternate runs of each source, in file order), calibrated on one half with
``sweep.calibrate`` (the default free constants) and scored on the other;
then the halves swap. The same is done within MLM24 and within NEMO2407 alone
(one operator's cluster and software stack, as a user would calibrate). The
uncalibrated model is the shipped constants (:data:`solver.physics.megatron.CONSTANTS`),
which were fitted on ALL the published runs, test halves included: it is an
in-sample baseline, harder to beat than a truly new cluster's.

Knobs a source does not state (microbatch, interleaving, recompute) are set
by fidelity.py's choice rule (the shipped model's fastest realizable layout
that fits memory), never by the measurement.

    python benchmarks/bench_calibrate.py     # results/bench_calibrate.{json,md}
"""

from __future__ import annotations

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
from solver.physics import megatron as M  # noqa: E402
from sweep.calibration import CalibrationWarning, predict, read_measurements  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SOURCES = ("MLM24", "NEMO2407", "NEMOLS")


def records():
    """The H100 runs as measurement records (one dict a run), in file order."""
    runs, _ = fidelity.load_runs()
    out = []
    for r in runs:
        if r.source not in SOURCES:
            continue
        knobs = {**r.knobs, **fidelity.chosen(r, M.CONSTANTS)}
        w = r.workload
        out.append({"run_id": r.run_id, "layers": w.layers, "hidden_dim": w.hidden_dim,
                    "heads": w.heads, "kv_heads": w.kv_heads, "ffn_hidden_dim": w.ffn_hidden_dim,
                    "vocab_size": w.vocab_size, "gated_mlp": w.gated_mlp,
                    "parameters": w.parameters, "fleet": "EOS_H100_MC",
                    **knobs, "step_time_s": float(r.measured)})
    return out


def halves(rows, sources=SOURCES):
    """Alternate runs of each of ``sources``: (half A indices, half B indices)."""
    a, b, seen = [], [], {}
    for i, row in enumerate(rows):
        src = row["run_id"].split("-")[0]
        if src not in sources:
            continue
        (a if seen.get(src, 0) % 2 == 0 else b).append(i)
        seen[src] = seen.get(src, 0) + 1
    return a, b


#: The experiments: all H100 runs, and each source alone (one operator's cluster and stack).
EXPERIMENTS = {"H100": SOURCES, "MLM24": ("MLM24",), "NEMO2407": ("NEMO2407",)}


def ape(pred, meas):
    return np.abs(np.asarray(pred) / np.asarray(meas) - 1.0) * 100.0


def main():
    t0 = time.time()
    rows = records()
    data = read_measurements(rows, name="published_runs.csv (H100)")
    results = {"splits": []}
    cases = [(f"{exp} {d}", pair if d == "A->B" else pair[::-1])
             for exp, srcs in EXPERIMENTS.items() for pair in [halves(rows, srcs)]
             for d in ("A->B", "B->A")]
    for name, (train, test) in cases:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CalibrationWarning)
            cal = sweep.calibrate(data.subset(train), loo=True)
        held_out = data.subset(test)
        meas = held_out.step_times
        cal_pred = predict(held_out, cal.constants)
        base_pred = predict(held_out, M.CONSTANTS)
        split = {"split": name, "train": [rows[i]["run_id"] for i in train],
                 "test": [rows[i]["run_id"] for i in test],
                 "constants": {n: cal.constants[n] for n in cal.profile.free},
                 "std": {n: cal.profile.uncertainty[n] for n in cal.profile.free},
                 "train_in_sample_mape": cal.in_sample_error, "train_loo_mape": cal.loo_error,
                 "test_calibrated_mape": float(np.mean(ape(cal_pred, meas))),
                 "test_calibrated_max": float(np.max(ape(cal_pred, meas))),
                 "test_uncalibrated_mape": float(np.mean(ape(base_pred, meas))),
                 "test_uncalibrated_max": float(np.max(ape(base_pred, meas))),
                 "warnings": [str(w.message) for w in caught],
                 "per_run": [{"run_id": r.run_id, "measured_s": float(m), "calibrated_s": float(c),
                              "uncalibrated_s": float(u)}
                             for r, m, c, u in zip(held_out.runs, meas, cal_pred, base_pred)]}
        results["splits"].append(split)
        print(f"{name}: calibrated {split['test_calibrated_mape']:.2f}% (max "
              f"{split['test_calibrated_max']:.1f}%), uncalibrated "
              f"{split['test_uncalibrated_mape']:.2f}% (max {split['test_uncalibrated_max']:.1f}%)")
    for exp in EXPERIMENTS:
        splits = [s for s in results["splits"] if s["split"].startswith(exp + " ")]
        results.setdefault("mean", {})[exp] = {
            "calibrated": float(np.mean([s["test_calibrated_mape"] for s in splits])),
            "uncalibrated": float(np.mean([s["test_uncalibrated_mape"] for s in splits]))}
    results["meta"] = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "machine": fidelity.machine(),
                       "command": " ".join([Path(sys.executable).name] + sys.argv),
                       "data_sha256": data.sha256, "seconds": round(time.time() - t0, 1),
                       "runs": len(rows), "goal": "calibrated held-out mean error <= 3 %"}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_calibrate.json").write_text(json.dumps(results, indent=1, default=float) + "\n")
    (RESULTS / "bench_calibrate.md").write_text(markdown(results))
    print(markdown(results))
    return results


def markdown(res):
    meta = res["meta"]
    out = ["# Calibration: fit on half of the H100 runs, predict the other half\n",
           f"- date: {meta['date']}", f"- machine: `{meta['machine']['uname']}`, nproc "
           f"{meta['machine']['nproc']}, python {meta['machine']['python']}, numpy "
           f"{meta['machine']['numpy']}", f"- command: `{meta['command']}`",
           f"- runs: {meta['runs']} (MLM24 + NEMO2407 + NEMOLS, H100), data sha256 "
           f"{meta['data_sha256'][:16]}, {meta['seconds']} s", "",
           "Mean (max) absolute percentage error of the step time on the held-out half. "
           "Uncalibrated = the shipped constants, fitted on all published runs (the held-out "
           "half included).", "",
           "| split | train in-sample | train LOO | held-out calibrated | held-out uncalibrated |",
           "|---|---|---|---|---|"]
    for s in res["splits"]:
        out.append(f"| {s['split']} | {s['train_in_sample_mape']:.2f} % | {s['train_loo_mape']:.2f} % "
                   f"| {s['test_calibrated_mape']:.2f} % ({s['test_calibrated_max']:.1f} %) "
                   f"| {s['test_uncalibrated_mape']:.2f} % ({s['test_uncalibrated_max']:.1f} %) |")
    for exp, m in res["mean"].items():
        out.append(f"| {exp} mean | | | {m['calibrated']:.2f} % | {m['uncalibrated']:.2f} % |")
    for s in res["splits"]:
        out += ["", f"Split {s['split']}: fitted constants (one standard deviation)", "",
                "| constant | fitted | std |", "|---|---|---|"]
        out += [f"| {n} | {v:.4g} | {s['std'][n]:.2g} |" for n, v in s["constants"].items()]
        if s["warnings"]:
            out += [""] + [f"- warning: {w}" for w in s["warnings"]]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
