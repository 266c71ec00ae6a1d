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

Two starting points, each calibrated with the default prior (``sweep.calibrate``),
without one (``prior_width=inf``, plain least squares), and with the default prior
and ``free="auto"`` (the free constants chosen by the training half's leave-one-out
error, :func:`sweep.calibration.select_free`):

- **shipped**: the shipped constants (in-sample for every H100 run, see above);
- **new cluster**: the constants fitted, as ``fidelity.py`` fits them, on the
  runs of every other system only (NAR21, KOR22, vTrain: all A100), so no
  H100 run has been seen -- what a user with a new kind of cluster starts from.
  No A100 run is in FP8, so ``fp8_gemm_scale`` is unseen there and starts at
  ``fidelity.PRIOR``'s value.

    python benchmarks/bench_calibrate.py          # results/bench_calibrate.{json,md}
    python benchmarks/bench_calibrate.py --loo    # also the plain fits' leave-one-out error
    python benchmarks/bench_calibrate.py --random-splits 10   # results/bench_calibrate_random.*

``--random-splits N`` calibrates the new-cluster start on N seeded random halves of
the H100 runs instead (each source's runs shuffled, then alternated, so every half
holds as many of each source as the fixed halves; both directions), with the default
prior and with ``free="auto"``: the spread of the held-out error over splits, where
the fixed halves give two values.

The prior fits are ``sweep.calibrate``'s defaults, leave-one-out included: its
warning that the fit predicts left-out runs worse than the start (see
:data:`sweep.calibration.core.LOO_WORSE_MARGIN`) is tallied against whether the
held-out half was in fact predicted worse.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
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
                    "tied_embeddings": w.tied_embeddings is not False,
                    "parameters": w.parameters, "fleet": "EOS_H100_MC",
                    **knobs, "step_time_s": float(r.measured)})
    return out


def write_measurements(path):
    """The H100 runs (:func:`records`) as a measurements CSV, one run a line, in file order."""
    import csv

    rows = records()
    columns = list(dict.fromkeys(key for row in rows for key in row))
    # the measurement last, after every knob some run states (the dropouts only some do)
    columns = [c for c in columns if c != "step_time_s"] + ["step_time_s"]
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("true" if v is True else "false" if v is False else v)
                             for k, v in row.items()})
    read_measurements(path)  # the file reads back as measurements
    print(f"wrote {len(rows)} runs to {path}")


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


def random_halves(rows, seed, sources=SOURCES):
    """:func:`halves` of each source's runs in a seeded random order."""
    rng = np.random.default_rng(seed)
    a, b = [], []
    for src in sources:
        idx = [i for i, row in enumerate(rows) if row["run_id"].split("-")[0] == src]
        order = [idx[j] for j in rng.permutation(len(idx))]
        a += order[0::2]
        b += order[1::2]
    return sorted(a), sorted(b)


def random_splits(n, t0):
    """The new-cluster start calibrated on ``n`` seeded random halves (both directions)."""
    rows = records()
    data = read_measurements(rows, name="published_runs.csv (H100)")
    start = new_cluster_start()
    out = []
    for seed in range(n):
        a, b = random_halves(rows, seed)
        for direction, (train, test) in (("A->B", (a, b)), ("B->A", (b, a))):
            held_out = data.subset(test)
            meas = held_out.step_times
            row = {"seed": seed, "direction": direction,
                   "train": [rows[i]["run_id"] for i in train],
                   "uncalibrated": float(np.mean(ape(predict(held_out, start), meas)))}
            for label, free in (("prior", None), ("auto", "auto")):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", CalibrationWarning)
                    cal = sweep.calibrate(data.subset(train), start=start, free=free)
                row[label] = float(np.mean(ape(predict(held_out, cal.constants), meas)))
                if free == "auto":
                    row["auto_free"] = list(cal.profile.free)
            out.append(row)
            print(f"seed {seed} {direction}: prior {row['prior']:.2f}%, auto {row['auto']:.2f}% "
                  f"({', '.join(row['auto_free']) or 'none'}), uncalibrated "
                  f"{row['uncalibrated']:.2f}%", flush=True)
    summary = {}
    for label in ("prior", "auto", "uncalibrated"):
        v = np.array([r[label] for r in out])
        summary[label] = {"mean": float(v.mean()), "median": float(np.median(v)),
                          "q25": float(np.percentile(v, 25)), "q75": float(np.percentile(v, 75)),
                          "max": float(v.max()), "at_most_3": int((v <= 3.0).sum())}
    res = {"splits": out, "summary": summary,
           "meta": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "machine": fidelity.machine(),
                    "command": " ".join([Path(sys.executable).name] + sys.argv),
                    "data_sha256": data.sha256, "seconds": round(time.time() - t0, 1),
                    "runs": len(rows), "seeds": n}}
    meta = res["meta"]
    md = ["# Calibration on random halves of the H100 runs (start: new cluster)\n",
          f"- date: {meta['date']}", f"- machine: `{meta['machine']['uname']}`, nproc "
          f"{meta['machine']['nproc']}, python {meta['machine']['python']}",
          f"- command: `{meta['command']}`",
          f"- runs: {meta['runs']} (MLM24 + NEMO2407 + NEMOLS, H100), data sha256 "
          f"{meta['data_sha256'][:16]}, {meta['seconds']} s", "",
          f"{n} seeded random halves (each source's runs shuffled, then alternated), both "
          f"directions: {len(out)} calibrations of the new-cluster start (fitted on the A100 "
          "runs only), each scored on its held-out half: mean absolute percentage error of the "
          "step time. *prior*: `sweep.calibrate`'s default; *auto*: `free=\"auto\"`.", "",
          "| | mean | median | quartiles | max | splits <= 3 % |", "|---|---|---|---|---|---|"]
    for label in ("prior", "auto", "uncalibrated"):
        m = summary[label]
        md.append(f"| {label} | {m['mean']:.3f} % | {m['median']:.3f} % | {m['q25']:.2f}-"
                  f"{m['q75']:.2f} % | {m['max']:.2f} % | {m['at_most_3']} of {len(out)} |")
    md += ["", "| seed | direction | prior | auto [chosen] | uncalibrated |", "|---|---|---|---|---|"]
    for r in out:
        md.append(f"| {r['seed']} | {r['direction']} | {r['prior']:.2f} % | {r['auto']:.2f} % "
                  f"[{', '.join(r['auto_free']) or 'none'}] | {r['uncalibrated']:.2f} % |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_calibrate_random.json").write_text(json.dumps(res, indent=1) + "\n")
    (RESULTS / "bench_calibrate_random.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return res


def ape(pred, meas):
    return np.abs(np.asarray(pred) / np.asarray(meas) - 1.0) * 100.0


def new_cluster_start():
    """The constants fitted on every non-H100 run (fidelity.py's fit), FP8 scale at its prior."""
    runs, _ = fidelity.load_runs()
    others = [r for r in runs if r.source not in SOURCES]
    assert not any(r.knobs["precision"] in ("fp8", "fp4") for r in others)
    return {**fidelity.fit_megatron(others), "fp8_gemm_scale": fidelity.PRIOR["fp8_gemm_scale"]}


#: (label, prior_width, free) of each calibration compared.
FITS = (("prior", None, None), ("plain", math.inf, None), ("auto", None, "auto"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loo", action="store_true", help="also the plain fits' leave-one-out error")
    ap.add_argument("--write-measurements", type=Path, metavar="CSV",
                    help="only write the H100 runs as a measurements CSV (the file "
                         "notebooks/04_megatron.ipynb calibrates on) and stop")
    ap.add_argument("--random-splits", type=int, default=0, metavar="N",
                    help="instead: the new-cluster start on N seeded random halves "
                         "(results/bench_calibrate_random.{json,md})")
    args = ap.parse_args(argv)
    if args.random_splits:
        return random_splits(args.random_splits, time.time())
    if args.write_measurements:
        write_measurements(args.write_measurements)
        return None
    t0 = time.time()
    rows = records()
    data = read_measurements(rows, name="published_runs.csv (H100)")
    starts = {"shipped": dict(M.CONSTANTS), "new cluster": new_cluster_start()}
    results = {"splits": [], "starts": starts}
    cases = [(f"{exp} {d}", pair if d == "A->B" else pair[::-1])
             for exp, srcs in EXPERIMENTS.items() for pair in [halves(rows, srcs)]
             for d in ("A->B", "B->A")]
    for start_name, start in starts.items():
        for name, (train, test) in cases:
            held_out = data.subset(test)
            meas = held_out.step_times
            base_pred = predict(held_out, start)
            split = {"start": start_name, "split": name,
                     "train": [rows[i]["run_id"] for i in train],
                     "test": [rows[i]["run_id"] for i in test],
                     "test_uncalibrated_mape": float(np.mean(ape(base_pred, meas))),
                     "test_uncalibrated_max": float(np.max(ape(base_pred, meas))), "fits": {}}
            for label, width, free in FITS:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always", CalibrationWarning)
                    loo = args.loo or width is None
                    cal = sweep.calibrate(data.subset(train), start=start, prior_width=width,
                                          loo=loo, free=free)
                cal_pred = predict(held_out, cal.constants)
                split["fits"][label] = {
                    "constants": {n: cal.constants[n] for n in cal.profile.free},
                    "std": {n: cal.profile.uncertainty[n] for n in cal.profile.free},
                    "train_in_sample_mape": cal.in_sample_error,
                    "train_loo_mape": cal.loo_error if loo else None,
                    "train_uncalibrated_mape": cal.uncalibrated_error,
                    "loo_warned": any(str(w.message).startswith("leave-one-out:") for w in caught),
                    "test_mape": float(np.mean(ape(cal_pred, meas))),
                    "test_max": float(np.max(ape(cal_pred, meas))),
                    "selection": [{"free": list(c), "loo_mape": e} for c, e in cal.selection],
                    "warnings": [str(w.message) for w in caught],
                    "per_run": [{"run_id": r.run_id, "measured_s": float(m), "calibrated_s": float(c),
                                 "uncalibrated_s": float(u)}
                                for r, m, c, u in zip(held_out.runs, meas, cal_pred, base_pred)]}
            results["splits"].append(split)
            f = split["fits"]
            print(f"{start_name} / {name}: prior {f['prior']['test_mape']:.2f}% (max "
                  f"{f['prior']['test_max']:.1f}%), plain {f['plain']['test_mape']:.2f}%, "
                  f"auto {f['auto']['test_mape']:.2f}% ({', '.join(cal.profile.free) or 'none'}), "
                  f"uncalibrated {split['test_uncalibrated_mape']:.2f}%", flush=True)
    results["mean"] = {}
    for start_name in starts:
        for exp in list(EXPERIMENTS) + ["all"]:
            splits = [s for s in results["splits"] if s["start"] == start_name
                      and (exp == "all" or s["split"].startswith(exp + " "))]
            results["mean"][f"{start_name} / {exp}"] = {
                **{label: float(np.mean([s["fits"][label]["test_mape"] for s in splits]))
                   for label, _, _ in FITS},
                "worst_prior": float(np.max([s["fits"]["prior"]["test_max"] for s in splits])),
                "uncalibrated": float(np.mean([s["test_uncalibrated_mape"] for s in splits]))}
    fits = [(s["fits"]["prior"], s) for s in results["splits"]]
    worse = [p["test_mape"] > s["test_uncalibrated_mape"] for p, s in fits]
    warned = [p["loo_warned"] for p, _ in fits]
    results["loo_warning"] = {
        "fits": len(fits), "worse_than_start": int(sum(worse)),
        "warned_and_worse": int(sum(a and b for a, b in zip(warned, worse))),
        "warned_not_worse": int(sum(a and not b for a, b in zip(warned, worse))),
        "worse_not_warned": int(sum(b and not a for a, b in zip(warned, worse)))}
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
           "Start *shipped*: the shipped constants, fitted on all published runs (the held-out "
           "half included: an in-sample baseline). Start *new cluster*: fitted on the A100 "
           "runs only (no H100 run seen). *prior*: `sweep.calibrate`'s default (a Gaussian prior "
           "on each log constant around the start); *plain*: `prior_width=inf`; *auto*: "
           "`free=\"auto\"` (the default prior; the free constants chosen by the training "
           "half's leave-one-out error, `sweep.calibration.select_free`; chosen in brackets). "
           "Train LOO: the prior fit's leave-one-out error on its own half, beside the start's "
           "error there; (!) marks the fits whose leave-one-out warning fired (the fit predicts "
           "a left-out run worse than the start).", "",
           "| start | split | train in-sample (prior) | train LOO (prior) / start | held-out prior "
           "| held-out plain | held-out auto [chosen] | held-out uncalibrated |",
           "|---|---|---|---|---|---|---|---|"]
    for s in res["splits"]:
        p, q, a = s["fits"]["prior"], s["fits"]["plain"], s["fits"]["auto"]
        chosen = ", ".join(a["selection"][-1]["free"]) or "none"
        out.append(f"| {s['start']} | {s['split']} | {p['train_in_sample_mape']:.2f} % "
                   f"| {p['train_loo_mape']:.2f} % / {p['train_uncalibrated_mape']:.2f} % "
                   f"| {p['test_mape']:.2f} % ({p['test_max']:.1f} %){' (!)' if p['loo_warned'] else ''} "
                   f"| {q['test_mape']:.2f} % ({q['test_max']:.1f} %) "
                   f"| {a['test_mape']:.2f} % ({a['test_max']:.1f} %) [{chosen}] "
                   f"| {s['test_uncalibrated_mape']:.2f} % ({s['test_uncalibrated_max']:.1f} %) |")
    out += ["", "Means over the splits (worst single run of the prior fits):", "",
            "| start / runs | prior | plain | auto | uncalibrated | worst run (prior) |",
            "|---|---|---|---|---|---|"]
    for key, m in res["mean"].items():
        out.append(f"| {key} | {m['prior']:.3f} % | {m['plain']:.3f} % | {m['auto']:.3f} % "
                   f"| {m['uncalibrated']:.3f} % "
                   f"| {m['worst_prior']:.1f} % |")
    lw = res["loo_warning"]
    out += ["", f"Leave-one-out warning: {lw['worse_than_start']} of the {lw['fits']} prior fits "
            f"predicted their held-out half worse than their start; the warning fired on "
            f"{lw['warned_and_worse']} of those, and on {lw['warned_not_worse']} fits that did not "
            f"({lw['worse_not_warned']} worse fits without it)."]
    for s in res["splits"]:
        p = s["fits"]["prior"]
        out += ["", f"Start {s['start']}, split {s['split']}, prior fit: constants (one standard "
                "deviation)", "", "| constant | fitted | std |", "|---|---|---|"]
        out += [f"| {n} | {v:.4g} | {p['std'][n]:.2g} |" for n, v in p["constants"].items()]
        if p["warnings"]:
            out += [""] + [f"- warning: {w}" for w in p["warnings"]]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
