"""Flat batches: the numpy path, the fused kernel and the reference, in one run, against the memory floor.

    python benchmarks/bench_fused.py [--n 1000000] [--reference 300] [--repeat 3] [--rounds 3] [--pairs 21]

1. mlsysim physics, ``--n`` random flat configurations (``bench_solver.draw`` on
   Llama-3-70B / Training_1K): ``solve(engine="numpy")``, ``solve(engine="fused")``
   and mlsysim 0.3.0, one ``DistributedModel.solve`` call per configuration on
   ``--reference`` of them, timed in a spawned interpreter of its own
   (``bench_solver.time_reference_isolated``); ratios against the reference's rate.
   The reference and the fused call run in ``--rounds`` interleaved rounds (each
   side's best over all rounds is its figure; each round's ratio is reported too).
2. megatron physics, ``--n`` random flat layouts of Llama3_70B_MC on
   HGX_H100_1K_MC: numpy against ``engine="fused"`` (reported as not available
   where the megatron model takes no ``engine``); then ``--pairs`` adjacent calls of
   the two physics' fused kernels, mlsysim then megatron, whose median time ratio is
   the figure of megatron against mlsysim, on the threads a call takes and then on one
   thread each (each kernel's cost a core). Then the same draw of Mixtral_8x7B_MC with
   ``ep_size`` drawn from 1, 2, 4, 8: an MoE workload compiles a loop of its own (the
   dense one drops the expert terms), and this draw has about 5,200 distinct keys of the
   kernel's step memo (it keeps ``megatron_kernel.MEMO_KEYS``, 4,096; the rest are priced
   one by one).
3. an open-mesh grid (6.45M layouts, the mlsysim grid of ``bench_megatron.py``),
   numpy path (a grid is not flat): all outputs; with two outputs (``solve``
   has no output selection: it computes them all, and the two are then made
   full-size arrays).
4. the floor: bytes in + bytes out per configuration at this machine's
   memory bandwidth, measured with a large numpy copy.

Every timing is the best of ``--repeat`` runs, the reference's included (the
first fused call is made once before, so compiling or loading numba's cache is
not timed; it is reported). Writes
benchmarks/results/fused.json and fused.md.
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
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import solver  # noqa: E402
from solver import catalog, fused  # noqa: E402
from solver.fused import buffers  # noqa: E402
from solver.physics import megatron, mlsysim  # noqa: E402

from bench_megatron import mlsysim_grid  # noqa: E402
from bench_solver import draw, time_reference_isolated  # noqa: E402


def best(fn, repeat):
    """(best seconds, last result) of ``repeat`` calls."""
    seconds, out = np.inf, None
    for _ in range(repeat):
        out = None
        start = time.perf_counter()
        out = fn()
        seconds = min(seconds, time.perf_counter() - start)
    return seconds, out


def bandwidth(repeat):
    """Memory bandwidth [B/s]: bytes read + written by a 512 MB numpy copy."""
    a = np.random.default_rng(0).random(1 << 26)
    b = np.empty_like(a)
    b.fill(0.0)  # fault the pages in before timing
    seconds, _ = best(lambda: np.copyto(b, a), repeat + 2)
    return 2 * a.nbytes / seconds


def nbytes_per(values, n):
    """Bytes per configuration of arrays (scalars count nothing)."""
    total = 0
    for value in values:
        value = np.asarray(value) if not isinstance(value, solver.knobs.Precisions) else value.codes
        if value.size == n:
            total += value.nbytes
    return total / n


def megatron_draw(n, seed=1):
    rng = np.random.default_rng(seed)
    return {
        "precision": rng.choice(["bf16", "fp16", "fp8"], n),
        "tp_size": rng.choice([1, 2, 4, 8], n), "pp_size": rng.choice([1, 2, 4, 8], n),
        "cp_size": rng.choice([1, 2], n), "dp_size": rng.integers(1, 17, n),
        "micro_batch_size": rng.choice([1, 2, 4], n), "v_stages": rng.choice([1, 2, 5, 10], n),
        "sequence_parallel": rng.random(n) < 0.5,
        "recompute": rng.choice(["none", "selective", "full"], n),
        "zero_stage": rng.choice([0, 1, 3], n), "tp_comm_overlap": rng.random(n) < 0.5,
        "overlap_grad_reduce": rng.random(n) < 0.5,
        "batch_size": rng.integers(256, 4097, n),
    }


def megatron_normalization(mknobs, n, workload="Llama3_70B_MC"):
    """What megatron.solve(engine="fused") does to the knobs before its kernel: checks the
    bools, makes the pipeline-split flags set stages, spreads the scalars to arrays (the
    integer range checks and, for names of up to 9 characters, the names' matching are the
    kernel's)."""
    values = {name: default for name, default in megatron.DEFAULTS.items() if default is not None}
    values.update(mknobs, seq_len=8192)
    shape = megatron._Shape(catalog.workload(workload))
    k = megatron._account_stages(shape, megatron._normalize(values, fast=True, unchecked=[]))
    return megatron._fused_arrays(k, n)


def same(a, b):
    return all(np.array_equal(np.asarray(a[k]), np.asarray(b[k]), equal_nan=True) for k in a)


def row(label, n, seconds, ref_rate, floor_s=None):
    rate = n / seconds
    out = {"configurations": n, "seconds": seconds, "configs_per_s": rate}
    if ref_rate:
        out["ratio_to_reference"] = rate / ref_rate
    if floor_s:
        out["floor_seconds"] = floor_s
        out["times_floor"] = seconds / floor_s
    print(f"{label:<46} {seconds * 1e3:9.1f} ms {rate / 1e6:8.2f} M/s"
          + (f" {rate / ref_rate:10,.0f}x" if ref_rate else "")
          + (f"   {seconds / floor_s:4.1f}x floor" if floor_s else ""))
    return out


def with_env(name, value, fn):
    """``fn`` run with the environment variable ``name`` set to ``value``."""
    def run():
        old = os.environ.get(name)
        os.environ[name] = value
        try:
            return fn()
        finally:
            if old is None:
                del os.environ[name]
            else:
                os.environ[name] = old
    return run


def one_thread(fn):
    """``fn`` with the fused kernels held to one thread ($LAYOUT_SWEEP_THREADS=1)."""
    return with_env(fused.THREADS_ENV, "1", fn)


def fresh_outputs(fn):
    """``fn`` with the fused kernels' output cache off: every call faults in new output arrays.

    With the cache on (the default), ``best``'s calls after the first take the arrays the
    previous call returned, which ``best`` has dropped: the state of a loop over batches.
    """
    def run():
        buffers.release()
        return with_env(buffers.CACHE_ENV, "0", fn)()
    return run


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--reference", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds of the reference and the mlsysim fused kernel")
    ap.add_argument("--pairs", type=int, default=21,
                    help="adjacent calls of the mlsysim and the megatron fused kernels")
    args = ap.parse_args(argv)
    n, repeat = args.n, args.repeat
    res = {}

    # 1. mlsysim physics, flat
    wl, fl = catalog.workload("Llama3_70B"), catalog.fleet("Training_1K")
    knobs = draw(n, fl)
    # The reference and the fused kernel in interleaved rounds, so that a slow phase of
    # this VM (whole runs here differ by up to 1.5x) does not fall on one side only. The
    # reference: in an interpreter of its own (bench_solver.time_reference_isolated: in
    # this one, its objects slowed our calls). Each side's figure is its best over all.
    fused_warm = time.perf_counter()
    mlsysim.solve(wl, fl, engine="fused", **knobs)
    fused_warm = time.perf_counter() - fused_warm
    ref_rounds, fu_rounds = [], []
    for _ in range(args.rounds):
        fu_out = None  # (a result held into the next round would crowd the output cache)
        seconds, ref_steps = time_reference_isolated("Llama3_70B", "Training_1K", knobs,
                                                     args.reference, repeat)
        ref_rounds.append(seconds)
        fu_s, fu_out = best(lambda: mlsysim.solve(wl, fl, engine="fused", **knobs), repeat + 2)
        fu_rounds.append(fu_s)
    ref_s, fu_s = min(ref_rounds), min(fu_rounds)
    round_ratios = [(n / f) / (args.reference / r) for r, f in zip(ref_rounds, fu_rounds)]
    ref_rate = args.reference / ref_s
    print(f"{'mlsysim 0.3.0, one call per configuration':<46} {ref_s / args.reference * 1e6:9.1f} "
          f"us/config ({ref_rate:,.0f}/s, {args.reference} configurations)")
    print("  rounds (reference /s, fused ms, ratio): " + "; ".join(
        f"{args.reference / r:,.0f}, {f * 1e3:.1f}, {q:,.0f}x"
        for r, f, q in zip(ref_rounds, fu_rounds, round_ratios)))
    bw = bandwidth(repeat)
    res["memory_bandwidth_bytes_per_s"] = bw
    print(f"memory bandwidth (numpy copy, read + write): {bw / 1e9:.1f} GB/s")

    fu1_s, _ = best(one_thread(lambda: mlsysim.solve(wl, fl, engine="fused", **knobs)), repeat + 2)
    fu_fresh_s, _ = best(fresh_outputs(lambda: mlsysim.solve(wl, fl, engine="fused", **knobs)),
                         repeat + 2)
    fu_dtypes = [v.dtype for v in fu_out.values()]
    # Fresh output arrays are faulted in (the OS zeroes their pages) on first write, in
    # either path, unless malloc hands back pages it kept: measured in the fused runs' state.
    def touch_fresh_outputs():
        arrays = [np.empty(n, dtype=dtype) for dtype in fu_dtypes]
        for a in arrays:
            a.fill(1)
    touch_s, _ = best(touch_fresh_outputs, repeat + 2)
    np_s, np_out = best(lambda: mlsysim.solve(wl, fl, engine="numpy", **knobs), repeat)
    assert same(fu_out, np_out), "the fused path differs from the numpy path"
    del np_out
    worst = max(abs(fu_out["step_latency_total"][i] - r) / r
                for i, r in enumerate(ref_steps) if r is not None)
    assert all(not fu_out["valid"][i] for i, r in enumerate(ref_steps) if r is None), \
        "the reference refused a configuration the fused path calls valid"
    bytes_in = nbytes_per(knobs.values(), n)
    bytes_out = nbytes_per(fu_out.values(), n)
    del fu_out  # (the output cache keeps what fits: a result held here would crowd it)
    floor_s = n * (bytes_in + bytes_out) / bw
    norm_s, _ = best(lambda: solver.knobs.normalize(
        {k: v for k, v in knobs.items() if k != "precision"}, check_bounds=False), repeat)
    from solver.fused import mlsysim_kernel

    prec_s, _ = best(lambda: mlsysim_kernel.precision_input(knobs["precision"]), repeat)
    full_norm_s, _ = best(lambda: solver.knobs.normalize(knobs), repeat)
    res["mlsysim_flat"] = {
        "workload": wl.name, "fleet": fl.name,
        "reference": {"configurations": args.reference, "seconds": ref_s,
                      "configs_per_s": ref_rate},
        "rounds": [{"reference_configs_per_s": args.reference / r, "fused_seconds": f,
                    "ratio_to_reference": q}
                   for r, f, q in zip(ref_rounds, fu_rounds, round_ratios)],
        "numpy": row("mlsysim, flat, numpy path", n, np_s, ref_rate, floor_s),
        "fused": row(f"mlsysim, flat, fused kernel, {fused.threads()} threads", n, fu_s, ref_rate,
                     floor_s),
        "fused_one_thread": row("mlsysim, flat, fused kernel, 1 thread", n, fu1_s, ref_rate,
                                floor_s),
        "fused_fresh_outputs": row(f"mlsysim, flat, fused, {fused.threads()} thr, fresh outputs",
                                   n, fu_fresh_s, ref_rate, floor_s),
        "fused_first_call_seconds": fused_warm,
        "fresh_outputs_allocate_and_write_seconds": touch_s,
        "fused_bitwise_equal_numpy": True,
        "max_relative_error_step_latency_vs_reference": worst,
        "bytes_in_per_config": bytes_in, "bytes_out_per_config": bytes_out,
        "floor": row("  floor: bytes in + out at the bandwidth", n, floor_s, ref_rate),
        "normalization_seconds": {
            "fused_path_knob_conversion": norm_s, "fused_path_precision_view": prec_s,
            "numpy_path_normalize": full_norm_s},
    }
    print(f"  normalization: fused path {(norm_s + prec_s) * 1e3:.2f} ms "
          f"({(norm_s + prec_s) / fu_s:.1%} of the call; the range checks run in the kernel), "
          f"numpy path's normalize {full_norm_s * 1e3:.1f} ms; fresh outputs (allocate and "
          f"write once) {touch_s * 1e3:.1f} ms; "
          f"{bytes_in:.0f} B in + {bytes_out:.0f} B out per configuration")

    # 2. megatron physics, flat
    mwl, mfl = catalog.workload("Llama3_70B_MC"), catalog.fleet("HGX_H100_1K_MC")
    mknobs = megatron_draw(n)
    mg_np_s, mg_np = best(lambda: megatron.solve(mwl, mfl, seq_len=8192, engine="numpy", **mknobs),
                          repeat)
    mg_bytes = nbytes_per(mknobs.values(), n) + nbytes_per(mg_np.values(), n)
    mg_floor = n * mg_bytes / bw
    res["megatron_flat"] = {"workload": mwl.name, "fleet": mfl.name, "seq_len": 8192,
                            "numpy": row("megatron, flat, numpy path", n, mg_np_s, ref_rate,
                                         mg_floor),
                            "bytes_per_config": mg_bytes}
    try:
        megatron.solve(mwl, mfl, seq_len=8192, engine="fused", **mknobs)
    except TypeError as err:
        if "engine" not in str(err):
            raise
        res["megatron_flat"]["fused"] = "not available (megatron.solve takes no engine keyword)"
        print(f"{'megatron, flat, fused kernel':<46} {res['megatron_flat']['fused']}")
    else:
        mg_fu_s, mg_fu = best(lambda: megatron.solve(mwl, mfl, seq_len=8192, engine="fused",
                                                     **mknobs), repeat + 2)
        res["megatron_flat"]["fused"] = row(f"megatron, flat, fused kernel, {fused.threads()} "
                                            "threads", n, mg_fu_s, ref_rate, mg_floor)
        mg_fu1_s, _ = best(one_thread(lambda: megatron.solve(
            mwl, mfl, seq_len=8192, engine="fused", **mknobs)), repeat + 2)
        res["megatron_flat"]["fused_one_thread"] = row(
            "megatron, flat, fused kernel, 1 thread", n, mg_fu1_s, ref_rate, mg_floor)
        mg_fresh_s, _ = best(fresh_outputs(lambda: megatron.solve(
            mwl, mfl, seq_len=8192, engine="fused", **mknobs)), repeat + 2)
        res["megatron_flat"]["fused_fresh_outputs"] = row(
            f"megatron, flat, fused, {fused.threads()} thr, fresh outputs", n, mg_fresh_s,
            ref_rate, mg_floor)
        res["megatron_flat"]["fused_bitwise_equal_numpy"] = same(mg_fu, mg_np)
        mg_norm_s, _ = best(lambda: megatron_normalization(mknobs, n), repeat + 2)
        res["megatron_flat"]["normalization_seconds"] = mg_norm_s
        print(f"  normalization: {mg_norm_s * 1e3:.2f} ms ({mg_norm_s / mg_fu_s:.1%} of the call; "
              f"scalar knobs spread to arrays; the integer range checks and name matching run in the "
              f"kernel)")
        del mg_fu, mg_np
        # The two physics' fused kernels in adjacent calls, mlsysim then megatron, so that
        # the VM's slow phases (seconds long; rows timed minutes apart differ by up to 2x
        # here) fall on both sides of a pair: megatron's time over mlsysim's, per pair.
        # Then the same on one thread: each kernel's cost a core, which a VM's second core,
        # when another tenant holds it, does not move (reported beside, not instead).
        for suffix, wrap, label in (("", lambda fn: fn, f"{fused.threads()} threads"),
                                    ("_one_thread", one_thread, "1 thread")):
            pairs = []
            for _ in range(args.pairs):
                ml_s, _ = best(wrap(lambda: mlsysim.solve(wl, fl, engine="fused", **knobs)), 1)
                mg_s, _ = best(wrap(lambda: megatron.solve(mwl, mfl, seq_len=8192, engine="fused",
                                                           **mknobs)), 1)
                pairs.append({"mlsysim_seconds": ml_s, "megatron_seconds": mg_s,
                              "megatron_over_mlsysim": mg_s / ml_s})
            ratios = np.array([p["megatron_over_mlsysim"] for p in pairs])
            res["megatron_flat"]["pairs_against_mlsysim" + suffix] = pairs
            q = res["megatron_flat"]["megatron_over_mlsysim" + suffix] = {
                "median": float(np.median(ratios)), "q25": float(np.quantile(ratios, 0.25)),
                "q75": float(np.quantile(ratios, 0.75)),
                "best_over_best": min(p["megatron_seconds"] for p in pairs)
                / min(p["mlsysim_seconds"] for p in pairs)}
            print(f"  {len(pairs)} adjacent pairs ({label}), megatron / mlsysim time: median "
                  f"{q['median']:.2f}x (quartiles {q['q25']:.2f}x-{q['q75']:.2f}x), best over best "
                  f"{q['best_over_best']:.2f}x")
    res["megatron_flat"]["floor"] = row("  floor: bytes in + out at the bandwidth", n, mg_floor,
                                        ref_rate)

    # 2b. megatron physics, flat, an MoE workload: its kernel compiles a loop of its own
    # (the dense one drops the expert terms), which once went scalar unnoticed here
    if isinstance(res["megatron_flat"].get("fused"), dict):
        ewl = catalog.workload("Mixtral_8x7B_MC")
        eknobs = dict(mknobs, ep_size=np.random.default_rng(2).choice([1, 2, 4, 8], n))
        e_np_s, e_np = best(lambda: megatron.solve(ewl, mfl, seq_len=8192, engine="numpy",
                                                   **eknobs), repeat)
        e_floor = n * (nbytes_per(eknobs.values(), n) + nbytes_per(e_np.values(), n)) / bw
        e_fu_s, e_fu = best(lambda: megatron.solve(ewl, mfl, seq_len=8192, engine="fused",
                                                   **eknobs), repeat + 2)
        e_fu1_s, _ = best(one_thread(lambda: megatron.solve(
            ewl, mfl, seq_len=8192, engine="fused", **eknobs)), repeat + 2)
        res["megatron_moe_flat"] = {
            "workload": ewl.name, "fleet": mfl.name, "seq_len": 8192,
            "knobs": "the megatron draw, and ep_size drawn from 1, 2, 4, 8",
            "numpy": row("megatron MoE, flat, numpy path", n, e_np_s, ref_rate, e_floor),
            "fused": row(f"megatron MoE, flat, fused kernel, {fused.threads()} threads", n,
                         e_fu_s, ref_rate, e_floor),
            "fused_one_thread": row("megatron MoE, flat, fused kernel, 1 thread", n, e_fu1_s,
                                    ref_rate, e_floor),
            "fused_bitwise_equal_numpy": same(e_fu, e_np),
            "floor": row("  floor: bytes in + out at the bandwidth", n, e_floor, ref_rate)}
        del e_fu, e_np

    # 3. an open-mesh grid (numpy path: not flat)
    grid = mlsysim_grid()
    g_n = int(np.prod(np.broadcast_shapes(*(np.shape(v) for v in grid.values()))))
    wl_g = catalog.workload("Llama3_70B")
    g_all, g_out = best(lambda: solver.solve(wl_g, fl, seq_len=8192, **grid), repeat)
    two = ("step_latency_total", "memory_footprint")
    g_two, _ = best(lambda: {k: np.ascontiguousarray(v) for k, v in solver.solve(
        wl_g, fl, seq_len=8192, **grid).items() if k in two}, repeat)
    g_floor_all = g_n * (8 * 25 + 4) / bw  # outputs only: the inputs are the mesh's axes
    g_floor_two = g_n * 16 / bw
    res["grid"] = {
        "points": g_n, "workload": wl_g.name, "fleet": fl.name,
        "all_outputs": row("grid (open mesh), all outputs, numpy", g_n, g_all, ref_rate,
                           g_floor_all),
        "two_outputs": row("grid (open mesh), two outputs, numpy", g_n, g_two, ref_rate,
                           g_floor_two),
        "two_outputs_names": list(two),
        "note": ("solve has no output selection: the two-output run computes every output "
                 "and makes the two full-size arrays; the floors count output bytes only "
                 "(25 float64 + 4 bool, or 2 float64, per point)"),
    }
    del g_out

    try:
        import numba
        numba_version = numba.__version__
    except ImportError:
        numba_version = None
    res["meta"] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"uname": " ".join(platform.uname()),
                    "nproc": subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip(),
                    "python": platform.python_version(), "numpy": np.__version__,
                    "numba": numba_version, "numba_available": fused.NUMBA},
        "command": " ".join([Path(sys.executable).name] + sys.argv), "repeat": repeat,
        "threads": fused.threads(),
    }
    out_dir = ROOT / "benchmarks" / "results"
    out_dir.mkdir(exist_ok=True)
    (out_dir / "fused.json").write_text(json.dumps(res, indent=1) + "\n")
    (out_dir / "fused.md").write_text(markdown(res))
    print(f"wrote {out_dir / 'fused.json'} and fused.md")
    return res


def markdown(res):
    m = res["meta"]
    lines = [
        "# Flat batches: numpy path, fused kernel, reference",
        "",
        f"{m['date']}; {m['machine']['uname']}; {m['machine']['nproc']} cores; Python "
        f"{m['machine']['python']}, numpy {m['machine']['numpy']}, numba {m['machine']['numba']}; "
        f"`{m['command']}` (best of {m['repeat']}+).",
        f"Memory bandwidth (numpy copy, read + write): {res['memory_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s.",
        "",
        "| run | configurations | time | configs/s | x reference | x floor |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    ref = res["mlsysim_flat"]["reference"]
    lines.append(f"| mlsysim 0.3.0, one call per configuration | {ref['configurations']:,} | "
                 f"{ref['seconds']:.2f} s | {ref['configs_per_s']:,.0f} | 1 | |")

    def add(label, r):
        if isinstance(r, str):
            lines.append(f"| {label} | | {r} | | | |")
            return
        lines.append(f"| {label} | {r['configurations']:,} | {r['seconds'] * 1e3:.1f} ms | "
                     f"{r['configs_per_s']:,.0f} | {r.get('ratio_to_reference', 0):,.0f} | "
                     f"{r.get('times_floor', 1.0):.1f} |")

    add("mlsysim, flat, numpy path", res["mlsysim_flat"]["numpy"])
    add(f"mlsysim, flat, fused kernel, {m['threads']} threads", res["mlsysim_flat"]["fused"])
    add("mlsysim, flat, fused kernel, 1 thread", res["mlsysim_flat"]["fused_one_thread"])
    if "fused_fresh_outputs" in res["mlsysim_flat"]:
        add(f"mlsysim, flat, fused kernel, {m['threads']} threads, fresh output arrays",
            res["mlsysim_flat"]["fused_fresh_outputs"])
    add("mlsysim, flat, floor (bytes in + out)", res["mlsysim_flat"]["floor"])
    add("megatron, flat, numpy path", res["megatron_flat"]["numpy"])
    add(f"megatron, flat, fused kernel, {m['threads']} threads", res["megatron_flat"]["fused"])
    if "fused_one_thread" in res["megatron_flat"]:
        add("megatron, flat, fused kernel, 1 thread", res["megatron_flat"]["fused_one_thread"])
    if "fused_fresh_outputs" in res["megatron_flat"]:
        add(f"megatron, flat, fused kernel, {m['threads']} threads, fresh output arrays",
            res["megatron_flat"]["fused_fresh_outputs"])
    add("megatron, flat, floor (bytes in + out)", res["megatron_flat"]["floor"])
    if "megatron_moe_flat" in res:
        e = res["megatron_moe_flat"]
        add(f"megatron, {e['workload']} (MoE), flat, numpy path", e["numpy"])
        add(f"megatron, {e['workload']} (MoE), flat, fused kernel, {m['threads']} threads",
            e["fused"])
        add(f"megatron, {e['workload']} (MoE), flat, fused kernel, 1 thread",
            e["fused_one_thread"])
        add(f"megatron, {e['workload']} (MoE), flat, floor (bytes in + out)", e["floor"])
    add("grid (open mesh), all outputs, numpy", res["grid"]["all_outputs"])
    add("grid (open mesh), two outputs, numpy", res["grid"]["two_outputs"])
    f = res["mlsysim_flat"]
    if "rounds" in res["mlsysim_flat"]:
        lines += ["", "Interleaved rounds of the reference and the mlsysim fused kernel "
                  "(2 threads, reused outputs): " + "; ".join(
                      f"{r['reference_configs_per_s']:,.0f}/s and {r['fused_seconds'] * 1e3:.1f} ms, "
                      f"{r['ratio_to_reference']:,.0f}x" for r in res["mlsysim_flat"]["rounds"])
                  + ". The table takes each side's best."]
    for suffix, opening in (
            ("", f"The two fused kernels in {{n}} adjacent pairs of calls ({m['threads']} threads, "
                 "reused outputs), mlsysim then megatron: megatron took"),
            ("_one_thread", "The same {n} pairs on one thread each (each kernel's cost a core, which "
                            "the second core's availability does not move): megatron took")):
        if "pairs_against_mlsysim" + suffix not in res["megatron_flat"]:
            continue
        pairs = res["megatron_flat"]["pairs_against_mlsysim" + suffix]
        q = res["megatron_flat"]["megatron_over_mlsysim" + suffix]
        lines += ["", opening.format(n=len(pairs)) + f" **{q['median']:.2f}x** mlsysim's time "
                  f"(median of the pairs; quartiles {q['q25']:.2f}x-{q['q75']:.2f}x; best over best "
                  f"{q['best_over_best']:.2f}x). Pairs (ms): " + "; ".join(
                      f"{p['mlsysim_seconds'] * 1e3:.1f}/{p['megatron_seconds'] * 1e3:.1f}"
                      for p in pairs) + "."]
    mg = res["megatron_flat"]
    if "normalization_seconds" in mg and isinstance(mg.get("fused"), dict):
        norm = f["normalization_seconds"]
        ml_norm = norm["fused_path_knob_conversion"] + norm["fused_path_precision_view"]
        lines += ["", "Input normalization before the kernels (best of repeated calls): mlsysim "
                  f"{ml_norm * 1e3:.2f} ms, {ml_norm / f['fused']['seconds']:.1%} of its fused "
                  "call (knob conversion and the precision names' view; range checks and name "
                  f"decoding run in the kernel); megatron {mg['normalization_seconds'] * 1e3:.2f} ms, "
                  f"{mg['normalization_seconds'] / mg['fused']['seconds']:.1%} of its fused call "
                  "(bool checks, scalar knobs spread to arrays; the integer range checks and the "
                  "names' matching run in the kernel). The numpy path's normalize (mlsysim): "
                  f"{norm['numpy_path_normalize'] * 1e3:.1f} ms."]
    lines += ["", "The reference is timed in a spawned interpreter of its own "
              "(`bench_solver.time_reference_isolated`), so neither side runs on a heap the "
              "other left behind.", "",
              "Fused rows are best of repeated calls, each dropping the last result first: "
              "from the second call on, the kernels write into the output arrays the last "
              "call returned (`solver.fused.buffers`), the state of a loop over batches. "
              "The \"fresh output arrays\" rows turn that cache off "
              "(`LAYOUT_SWEEP_BUFFER_CACHE=0`): every call faults in new pages, as a first "
              "call or one made while earlier results are still held does.", "", f"mlsysim flat: first fused call (numba cache load) "
              f"{f['fused_first_call_seconds']:.2f} s; allocating and writing fresh output "
              f"arrays alone {f['fresh_outputs_allocate_and_write_seconds'] * 1e3:.1f} ms; "
              f"{f['bytes_in_per_config']:.0f} B in + "
              f"{f['bytes_out_per_config']:.0f} B out per configuration; fused equals numpy bit "
              f"for bit; largest relative difference in step_latency_total against the "
              f"reference {f['max_relative_error_step_latency_vs_reference']:.1e}. Grid: "
              f"{res['grid']['note']}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
