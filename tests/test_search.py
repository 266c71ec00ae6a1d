"""Wiring of ``sweep.search``: constraints, seeds, resume, workers, exact mode, reference parity."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import optuna
import re

import pytest
from optuna.trial import TrialState

import solver
from sweep.spec import SpecError, load_spec
from sweep.search import (PENALTY, open_storage, reference_optimizer_space,
                          reproduce_reference_optimizer, resolve_memory_limit, search)

# These searches rank mfu over spaces with bf16 and fp8 on purpose; the warning that
# gives is asserted in test_search.py::test_utilization_objective_across_precisions_warns and
# test_analysis.py, not repeated in every report.
pytestmark = pytest.mark.filterwarnings("ignore::sweep.analysis.UtilizationWarning")

MAIN = str(Path(__file__).resolve().parents[1])
# The pricing module (``sweep.search`` the name is the function once sweep/__init__.py runs).
pricing_mod = importlib.import_module("sweep.search.pricing")

#: 4 x 5 x 6 x 4 x 2 x 2 x 6 = 11520 layouts; the cluster sized by dp_size.
SMALL = {
    "name": "small",
    "workload": "Llama3_70B",
    "fleet": "Training_1K",
    "axes": {
        "tp_size": {"powers_of_two": 8},
        "pp_size": [1, 2, 4, 8, 16],
        "microbatch_count": {"powers_of_two": 32},
        "zero_stage": [0, 1, 2, 3],
        "activation_recomputation": [False, True],
        "precision": ["bf16", "fp8"],
        "dp_size": {"powers_of_two": 32},
    },
    "fixed": {"batch_size": 512, "overlap_comm": True},
    "constraints": {"max_accelerators": 256},
}
LIMIT = "60 GB"


def _study_trials(study, *states):
    return study.get_trials(deepcopy=False, states=states or None)


# --------------------------------------------------------------------------- arguments


def test_memory_limit_forms():
    spec = load_spec(SMALL)
    fleet = spec.fleet_spec()
    capacity = fleet.node.accelerator.memory_capacity
    assert resolve_memory_limit(None, spec, fleet) == capacity
    assert resolve_memory_limit("72 GB", spec, fleet) == 72e9
    assert resolve_memory_limit(0.5, spec, fleet) == 0.5 * capacity
    assert resolve_memory_limit(6e10, spec, fleet) == 6e10
    with_constraint = load_spec({**SMALL, "constraints": {"memory_limit": 0.8}})
    assert resolve_memory_limit(None, with_constraint, fleet) == 0.8 * capacity
    assert resolve_memory_limit("50 GB", with_constraint, fleet) == 50e9
    for bad in (0, -1.0, True, float("nan"), [1]):
        with pytest.raises(ValueError, match="memory_limit: expected .* but got"):
            resolve_memory_limit(bad, spec, fleet)
    with pytest.raises(ValueError):
        resolve_memory_limit("72 parsecs", spec, fleet)


def test_bad_arguments_say_what_was_expected():
    with pytest.raises(ValueError, match="objective must be .* but got 'mfuu'"):
        search(SMALL, objective="mfuu", n_trials=1, mode="sampled")
    with pytest.raises(ValueError, match="direction of 'mfu' must be"):
        search(SMALL, direction="up", n_trials=1, mode="sampled")
    with pytest.raises(ValueError, match="no default direction"):
        search(SMALL, objective="dp_size", n_trials=1, mode="sampled")
    with pytest.raises(ValueError, match="sampler must be one of .* but got 'cma'"):
        search(SMALL, sampler="cma", n_trials=1, mode="sampled")
    with pytest.raises(ValueError, match="mode must be 'sample' or 'exact'"):
        search(SMALL, mode="all")
    with pytest.raises(ValueError, match="storage must be"):
        open_storage("results.txt")


# --------------------------------------------------------------------------- constraints


def test_best_respects_memory_limit_and_is_a_valid_split():
    result = search(SMALL, n_trials=192, seed=0, memory_limit=LIMIT, batch_size=64, mode="sampled")
    assert result.n_evaluated == 192 and result.best_params is not None
    spec = load_spec(SMALL)
    for entry in [{"params": result.best_params}] + result.top:
        p = dict(entry["params"])
        wl, fl = spec.workloads[p.pop("workload")], spec.fleets[p.pop("fleet")]
        out = solver.solve(wl, fl, **p)
        assert bool(out["valid"])
        assert float(out["memory_footprint"]) <= 60e9
        n_acc = p["tp_size"] * p["pp_size"] * p["dp_size"]
        assert n_acc <= 256 and n_acc % 8 == 0
    assert result.breakdown["memory_footprint"] <= result.breakdown["memory_limit"] == 60e9
    assert result.breakdown["mfu"] == pytest.approx(result.best_value, rel=1e-12)
    assert len({json.dumps(e["params"], sort_keys=True) for e in result.top}) == len(result.top)
    values = [e["values"]["mfu"] for e in result.top]
    assert values == sorted(values, reverse=True) and values[0] == result.best_value
    # Every trial carries the constraints; impossible splits are infeasible with a penalty.
    trials = _study_trials(result.study, TrialState.COMPLETE)
    invalid = [t for t in trials if t.constraints["split"] > 0]
    assert invalid, "the draw should include splits that are not whole nodes"
    for t in invalid:
        assert t.value == -PENALTY and t.constraints["memory"] > 0
    for t in trials:
        assert set(t.constraints) == {"split", "memory", "accelerators", "realizable"}
    summary = result.summary()
    assert "mfu" in summary and "GB" in summary and "bubble" in summary


def test_same_seed_same_trials_and_result():
    a = search(SMALL, n_trials=96, seed=7, memory_limit=LIMIT, batch_size=32, mode="sampled")
    b = search(SMALL, n_trials=96, seed=7, memory_limit=LIMIT, batch_size=32, mode="sampled")
    c = search(SMALL, n_trials=96, seed=8, memory_limit=LIMIT, batch_size=32, mode="sampled")
    params = [t.params for t in a.study.trials]
    assert params == [t.params for t in b.study.trials]
    assert [t.values for t in a.study.trials] == [t.values for t in b.study.trials]
    assert a.best_params == b.best_params and a.best_value == b.best_value
    assert params != [t.params for t in c.study.trials]


@pytest.mark.parametrize("sampler", ["nsga2", "random"])
def test_other_samplers(sampler):
    result = search(SMALL, n_trials=64, seed=1, sampler=sampler, memory_limit=LIMIT,
                    batch_size=32, mode="sampled")
    assert result.n_evaluated == 64 and result.best_params is not None
    assert result.breakdown["memory_footprint"] <= 60e9


def test_grid_sampler_visits_each_point_once():
    spec = {**SMALL, "axes": {"tp_size": [2, 4, 8], "pp_size": [1, 2, 4, 8],
                              "dp_size": [2, 4, 8]},
            "fixed": {**SMALL["fixed"], "zero_stage": 3, "microbatch_count": 16,
                      "activation_recomputation": True}}
    result = search(spec, sampler="grid", seed=0, memory_limit=LIMIT, batch_size=16,
                    mode="sampled")
    params = [tuple(sorted(t.params.items())) for t in result.study.trials]
    assert len(params) == len(set(params)) == 36 == result.n_evaluated
    exact = search(spec, mode="exact", memory_limit=LIMIT)
    assert result.best_params is not None
    assert result.best_value == exact.best_value and result.best_params == exact.best_params


def test_one_solve_per_workload_per_batch(monkeypatch):
    calls = []
    real = pricing_mod._price

    def spy(setup, w, f, knobs):
        calls.append((w, f, max((np.size(v) for v in knobs.values()), default=1)))
        return real(setup, w, f, knobs)

    monkeypatch.setattr(pricing_mod, "_price", spy)
    spec = {**SMALL, "workload": ["Llama3_70B", "Mixtral_8x7B"]}
    search(spec, n_trials=64, seed=2, sampler="random", batch_size=64, memory_limit=LIMIT, mode="sampled")
    first = calls[:2]
    assert {w for w, _, _ in first} == {"Llama3_70B", "Mixtral_8x7B"}
    assert sum(n for _, _, n in first) == 64


def test_continuous_axis_is_sampled_and_refused_by_exact():
    spec = {**SMALL, "axes": {**SMALL["axes"], "efficiency": {"from": 0.3, "to": 0.6}}}
    result = search(spec, n_trials=64, seed=0, memory_limit=LIMIT, mode="sampled")
    assert 0.3 <= result.best_params["efficiency"] <= 0.6
    with pytest.raises(SpecError, match="continuous"):
        search(spec, mode="exact")


def test_other_objectives_and_directions():
    fast = search(SMALL, objective="step_latency_total", n_trials=64, seed=0,
                  memory_limit=LIMIT, mode="sampled")
    assert fast.study.direction == optuna.study.StudyDirection.MINIMIZE
    values = [e["values"]["step_latency_total"] for e in fast.top]
    assert values == sorted(values)
    _, out, n_acc, feasible = _brute_force(SMALL, 60e9, 256)
    small = search(SMALL, objective="n_accelerators", mode="exact", memory_limit=LIMIT)
    assert small.best_value == small.breakdown["n_accelerators"] == n_acc[feasible].min()
    roomy = search(SMALL, objective="memory_headroom", mode="exact", memory_limit=LIMIT)
    assert roomy.best_value == pytest.approx(60e9 - roomy.breakdown["memory_footprint"])


# --------------------------------------------------------------------------- exact mode


def _brute_force(spec_dict, limit, max_acc):
    """Every point of the grid on np.meshgrid arrays, one solve call."""
    spec = load_spec(spec_dict)
    names = spec.dims
    mesh = np.meshgrid(*[np.array(a.values) for a in spec.axes], indexing="ij")
    knobs = {n: m.ravel() for n, m in zip(names, mesh)}
    out = solver.solve(spec.workload_spec(), spec.fleet_spec(), **spec.fixed, **knobs)
    n_acc = knobs["tp_size"] * knobs["pp_size"] * knobs["dp_size"]
    feasible = (out["valid"] & (out["memory_footprint"] <= limit) & (n_acc <= max_acc)
                & out["realizable"])  # admissible requires realizable by default
    return knobs, out, n_acc, feasible


def test_exact_equals_brute_force_argmax():
    knobs, out, _, feasible = _brute_force(SMALL, 60e9, 256)
    mfu = np.where(feasible, out["mfu"], -np.inf)
    order = np.lexsort((np.arange(mfu.size), -mfu))[:10]
    result = search(SMALL, mode="exact", memory_limit=LIMIT, k=10, block_points=1000)
    assert result.n_evaluated == mfu.size and result.n_admissible == int(feasible.sum())
    assert result.best_value == mfu[order[0]]
    for entry, i in zip(result.top, order):
        assert entry["values"]["mfu"] == mfu[i]
        for name in knobs:
            assert entry["params"][name] == knobs[name][i]
    # Minimizing: the same walk, the other end.
    step = np.where(feasible, out["step_latency_total"], np.inf)
    fastest = search(SMALL, mode="exact", objective="step_latency_total", memory_limit=LIMIT,
                     block_points=4096, n_jobs=2)
    assert fastest.best_value == step.min()
    assert fastest.best_params["tp_size"] == knobs["tp_size"][np.argmin(step)]


def _dominated_by_any(point, others):
    """point, others: rows of signed scores (larger is better)."""
    return bool(np.any(np.all(others >= point, axis=1) & np.any(others > point, axis=1)))


def test_multi_objective_returns_a_nondominated_set():
    objectives = {"effective_throughput": "maximize", "n_accelerators": "minimize"}
    signs = np.array([1.0, -1.0])
    exact = search(SMALL, objectives=objectives, mode="exact", memory_limit=LIMIT,
                   block_points=2000)
    _, out, n_acc, feasible = _brute_force(SMALL, 60e9, 256)
    everyone = np.stack([out["effective_throughput"][feasible], n_acc[feasible]], axis=1) * signs
    front = np.array([[e["values"]["effective_throughput"], e["values"]["n_accelerators"]]
                      for e in exact.best_trials]) * signs
    assert len(front) >= 2
    for row in front:
        assert not _dominated_by_any(row, everyone)
    brute_front = {tuple(r) for r in everyone if not _dominated_by_any(r, everyone)}
    assert brute_front == {tuple(r) for r in front}
    assert exact.best_value == tuple(front[0] * signs)

    sampled = search(SMALL, objectives=objectives, sampler="nsga2", n_trials=128, seed=0,
                     memory_limit=LIMIT, batch_size=32, mode="sampled")
    assert len(sampled.study.directions) == 2 and sampled.best_trials
    front = np.array([[e["values"]["effective_throughput"], e["values"]["n_accelerators"]]
                      for e in sampled.best_trials]) * signs
    feasible_trials = np.array([t.values for t in sampled.study.trials
                                if all(c <= 0 for c in t.constraints.values())]) * signs
    for row in front:
        assert not _dominated_by_any(row, feasible_trials)
        assert not _dominated_by_any(row, front)


# --------------------------------------------------------------------------- resume and workers


def test_resume_after_an_interruption_in_process(tmp_path, monkeypatch):
    journal = str(tmp_path / "study.jsonl")
    real = solver.solve
    calls = {"n": 0}

    def crash_on_third(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated crash")
        return real(*args, **kwargs)

    monkeypatch.setattr(solver, "solve", crash_on_third)
    with pytest.raises(RuntimeError, match="simulated crash"):
        search(SMALL, n_trials=80, seed=0, batch_size=16, storage=journal,
               study_name="resume", memory_limit=LIMIT, mode="sampled")
    monkeypatch.setattr(solver, "solve", real)
    study = optuna.load_study(study_name="resume", storage=open_storage(journal))
    done = {t.number: t.values for t in _study_trials(study, TrialState.COMPLETE)}
    running = {t.number: t.params for t in _study_trials(study, TrialState.RUNNING)}
    # Two batches told; the third asked (12 sampled + 4 local moves), never told.
    assert len(done) == 32 and 0 < len(running) <= 16

    result = search(SMALL, n_trials=80, seed=0, batch_size=16, storage=journal,
                    study_name="resume", memory_limit=LIMIT, mode="sampled")
    assert result.n_new == 48 and result.n_evaluated == 80
    trials = result.study.trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 80
    assert [t.number for t in trials] == list(range(80))
    for t in trials:
        if t.number in done:
            assert t.values == done[t.number]
        if t.number in running:  # adopted: priced with the parameters it was given
            assert t.params == running[t.number]
    # Same call again: the budget is the study's total, nothing to add.
    again = search(SMALL, n_trials=80, seed=0, batch_size=16, storage=journal,
                   study_name="resume", memory_limit=LIMIT, mode="sampled")
    assert again.n_new == 0 and again.n_evaluated == 80
    with pytest.raises(ValueError, match=r"created for another space or objectives: "
                                         r"fixed\.batch_size: stored 512, now 256; fixed\.overlap_comm: "
                                         r"stored True, now None; start a new"):
        search({**SMALL, "fixed": {"batch_size": 256}}, n_trials=80, storage=journal,
               study_name="resume", memory_limit=LIMIT, mode="sampled")


_CHILD = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, {main!r})
import solver
from sweep.search import search
spec = json.loads({spec!r})
marker, go = Path({marker!r}), Path({go!r})
real, calls = solver.solve, {{"n": 0}}
def solve(*args, **kwargs):
    calls["n"] += 1
    if calls["n"] == {hang_on}:
        marker.write_text("asked")
        time.sleep(600)
    return real(*args, **kwargs)
solver.solve = solve
Path({ready!r}).write_text("ready")  # imported: the parent starts every worker at once
while not go.exists():
    time.sleep(0.01)
result = search(spec, n_trials={n_trials}, seed={seed}, sampler={sampler!r}, batch_size={batch},
                storage={journal!r}, study_name="shared", memory_limit="60 GB", mode="sampled")
print(json.dumps({{"n_new": result.n_new}}))
"""


def _child(tmp_path, tag, *, seed, n_trials, batch, hang_on=-1, sampler="random"):
    script = tmp_path / f"child_{tag}.py"
    marker = tmp_path / f"marker_{tag}"
    script.write_text(_CHILD.format(main=MAIN, spec=json.dumps(SMALL), marker=str(marker),
                                    go=str(tmp_path / "go"), ready=str(tmp_path / f"ready_{tag}"),
                                    hang_on=hang_on, n_trials=n_trials,
                                    seed=seed, sampler=sampler, batch=batch,
                                    journal=str(tmp_path / "shared.jsonl")))
    env = {**os.environ, "PYTHONPATH": MAIN}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    return proc, marker


def test_resume_after_sigkill(tmp_path):
    proc, marker = _child(tmp_path, "killed", seed=1, n_trials=10**6, batch=16, hang_on=4)
    (tmp_path / "go").touch()
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "child never reached its fourth batch"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    journal = str(tmp_path / "shared.jsonl")
    study = optuna.load_study(study_name="shared", storage=open_storage(journal))
    done = {t.number: t.values for t in _study_trials(study, TrialState.COMPLETE)}
    zombies = {t.number: t.params for t in _study_trials(study, TrialState.RUNNING)}
    assert len(done) == 48 and len(zombies) == 16

    result = search(SMALL, n_trials=80, seed=5, sampler="random", batch_size=16,
                    storage=journal, study_name="shared", memory_limit=LIMIT, mode="sampled")
    assert result.n_evaluated == 80 and result.n_new == 32
    trials = result.study.trials
    assert len(trials) == 80 and all(t.state == TrialState.COMPLETE for t in trials)
    for t in trials:
        if t.number in done:
            assert t.values == done[t.number]
        if t.number in zombies:
            assert t.params == zombies[t.number]


def test_journal_workers_share_one_study(tmp_path):
    n_trials, workers = 96, 3
    procs = [_child(tmp_path, f"w{i}", seed=i, n_trials=n_trials, batch=8, sampler="tpe")[0]
             for i in range(workers)]
    # Go once every worker has imported (a fixed 0.5 s wait let one worker, imported first
    # on a loaded machine, price all 96 trials before the others began)
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready_w{i}").exists() for i in range(workers)):
        assert all(p.poll() is None for p in procs), [p.stderr.read() for p in procs]
        assert time.monotonic() < deadline, "a worker never finished importing"
        time.sleep(0.05)
    (tmp_path / "go").touch()
    reports = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        reports.append(json.loads(stdout.strip().splitlines()[-1]))
    study = optuna.load_study(study_name="shared",
                              storage=open_storage(str(tmp_path / "shared.jsonl")))
    trials = study.trials
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    # Exactly n_trials complete: a trial asked past the budget by a racing worker is
    # told PRUNED unpriced; none is running, failed or lost.
    assert len(complete) == n_trials
    assert all(t.state == TrialState.PRUNED for t in trials if t.state != TrialState.COMPLETE)
    assert len(trials) - n_trials < workers
    assert sum(r["n_new"] for r in reports) == len(complete)
    assert [t.number for t in trials] == list(range(len(trials)))
    owners = {t.user_attrs["search:owner"].rsplit(":", 1)[0] for t in complete}
    assert len(owners) >= 2


def test_rdb_storage_resumes(tmp_path):
    url = f"sqlite:///{tmp_path / 'search.db'}"
    first = search(SMALL, n_trials=6, seed=0, batch_size=6, storage=url, memory_limit=LIMIT,
                   sampler="random", mode="sampled")
    second = search(SMALL, n_trials=12, seed=1, batch_size=6, storage=url, memory_limit=LIMIT,
                    sampler="random", mode="sampled")
    assert first.study.study_name == second.study.study_name
    assert first.n_new == 6 and second.n_new == 6 and second.n_evaluated == 12


# --------------------------------------------------------------------------- reference optimizer


SCENARIOS = [("Llama3_70B", "Training_1K", 1024), ("Mixtral_8x7B", "Training_1K", 1024),
             ("Llama3_70B", "Research_256", 256), ("Mixtral_8x7B", "Research_256", 256)]


def _reference(model, fleet, batch):
    from mlsysim.engine.solvers.distributed import ParallelismOptimizer
    from mlsysim.models.registry import Models
    from mlsysim.systems.registry import Systems

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ParallelismOptimizer().solve(getattr(Models.Language, model),
                                            getattr(Systems.Clusters, fleet), batch_size=batch)


@pytest.fixture(scope="module")
def references():
    return {s: _reference(*s) for s in SCENARIOS}


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: f"{s[0]}-{s[1]}")
def test_reference_optimizer_reproduced(scenario, references):
    ref = references[scenario]
    model, fleet, batch = scenario
    ours = reproduce_reference_optimizer(solver.catalog.workload(model),
                                         solver.catalog.fleet(fleet), batch)
    assert ours["best_config"] == ref.best_config
    assert ours["best_mfu"] == pytest.approx(float(ref.best_mfu), rel=1e-9, abs=0)
    assert ours["total_searched"] == ref.total_searched
    assert [c["config"] for c in ours["top_candidates"]] == [c["config"] for c in
                                                             ref.top_candidates]
    for mine, theirs in zip(ours["top_candidates"], ref.top_candidates):
        assert mine["mfu"] == pytest.approx(float(theirs["mfu"]), rel=1e-9, abs=0)
        assert mine["step_time"] == pytest.approx(theirs["step_time"].m_as("s"), rel=1e-9)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: f"{s[0]}-{s[1]}")
def test_wider_space_never_worse_than_reference(scenario, references):
    ref = references[scenario]
    model, fleet, batch = scenario
    space = reference_optimizer_space(model, fleet, batch)
    n_gpus = solver.catalog.fleet(fleet).total_accelerators
    moe = solver.catalog.workload(model).experts
    wider = {
        "workload": model, "fleet": fleet,
        "axes": {"tp_size": {"powers_of_two": 8},
                 "pp_size": {"powers_of_two": min(n_gpus, 512)},
                 "ep_size": [1, 2, 4, 8] if moe else [1, 2],
                 "microbatch_count": {"powers_of_two": batch},
                 "zero_stage": [0, 1, 2, 3], "activation_recomputation": [False, True],
                 "v_stages": [1, 2]},
        "fixed": {k: v for k, v in space.spec.fixed.items()
                  if k not in ("ep_size", "activation_recomputation")},
    }
    assert load_spec(wider).size >= 10_000
    best = search(wider, objective="scaling_efficiency", mode="exact", memory_limit=1.0)
    assert best.best_value * space.efficiency >= float(ref.best_mfu) * (1 - 1e-12)
    # On our own MFU too: the reference's layout, priced by us, is no better.
    ours = reproduce_reference_optimizer(model, fleet, batch)["result"]
    best_mfu = search(wider, objective="mfu", mode="exact", memory_limit=1.0)
    assert best_mfu.best_value >= ours.top[0]["values"]["mfu"]


# --------------------------------------------------------------------------- odds and ends


def test_local_moves_are_counted_trials_and_refine_is_checked():
    result = search(SMALL, n_trials=64, seed=0, memory_limit=LIMIT, mode="sampled")
    origins = [t.user_attrs.get("search:origin") for t in result.study.trials]
    assert origins.count("local") > 0 and len(origins) == result.n_evaluated == 64
    plain = search(SMALL, n_trials=32, seed=0, memory_limit=LIMIT, refine=0, mode="sampled")
    assert all("search:origin" not in t.user_attrs for t in plain.study.trials)
    with pytest.raises(ValueError, match=r"refine must be a share of the batch in \[0, 1\]"):
        search(SMALL, refine=1.5)
    with pytest.raises(ValueError, match="refine applies to a single objective"):
        search(SMALL, objectives=["mfu", "n_accelerators"], refine=0.5)


def test_journal_forms_open_the_same_file(tmp_path):
    from optuna.storages.journal import JournalStorage

    path = tmp_path / "a.log"
    for form in (str(path), f"journal://{path}", path):
        assert isinstance(open_storage(form), JournalStorage)
    from optuna.storages import RDBStorage

    assert isinstance(open_storage(f"sqlite:///{tmp_path}/x.db"), RDBStorage)  # opened here


def test_nothing_feasible_is_reported_not_raised():
    # The warning is the counts' reading (what each condition removed, what to relax).
    with pytest.warns(RuntimeWarning, match=r"no admissible trial among 16 points: valid split "
                      r"removed \d+, fits memory removed \d+, within the memory limit removed "
                      r"[1-9]"):
        result = search(SMALL, n_trials=16, seed=0, memory_limit="1 GB", mode="sampled")
    assert result.best_params is None and result.top == [] and result.n_admissible == 0
    # The summary counts what each condition removed from the 16 trials: here the 1 GB limit.
    text = result.summary()
    assert "no admissible trial among 16 points: valid split removed " in text
    removed = result.empty_counts["removed"]
    assert sum(removed.values()) == 16 and removed["within the memory limit"] > 0
    assert f"relax within the memory limit: {result.empty_counts['relaxed']['within the memory limit']}" in text
    # 16 trials of a larger space: more trials first, before relaxing the job
    assert result.space_size > 16
    assert result.why_empty().startswith(
        f"A sampled search saw 16 layouts of {result.space_size:,.0f}: more trials")


def test_an_empty_exhaustive_search_says_which_condition_removed_the_layouts():
    """Exhaustive and empty: the summary is the count of what each condition removed (here
    whole microbatches: 576 accelerators, dp has a factor 9 that a batch of 1000 lacks), not
    a claim about memory."""
    spec = {"workload": "Llama3_8B_MC", "fleet": "GB200_NVL72_8_MC", "physics": "megatron",
            "axes": {"tp_size": [1, 2, 4], "pp_size": [1, 2, 4], "micro_batch_size": [1, 2]},
            "fixed": {"batch_size": 1000, "seq_len": 8192}}
    with pytest.warns(RuntimeWarning, match=r"realizable removed .*do not split batch_size "
                      r"\(1,000\) into whole microbatches") as caught:
        result = search(spec, mode="exhaustive")
    assert str(caught[0].message) == result.why_empty()  # the warning says which to relax
    assert result.n_admissible == 0 and result.empty_counts
    text = result.summary()
    assert "no admissible layout among 18 points: " in text and "memory limit (" not in text
    assert f"realizable removed {result.empty_counts['removed']['realizable']:,}" in text
    assert result.empty_counts["removed"]["realizable"] > 0
    # ... and why they are not realizable, as the cube of the same space says it, in one block
    # or in blocks of 5 points (the evidence merged across blocks).
    import sweep

    cube_why = sweep.analysis.admissible_counts(sweep.run(spec))["why"]["realizable"]
    assert "do not split batch_size (1,000) into whole microbatches" in cube_why
    assert result.empty_counts["why"]["realizable"] == cube_why and cube_why in text
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        blocks = search(spec, mode="exhaustive", block_points=5)
        sampled = search(spec, mode="sampled", n_trials=12, seed=0)
    assert blocks.empty_counts == result.empty_counts
    # A sampled search counts its trials the same way, and says why they are not realizable.
    counts = sampled.empty_counts
    assert sampled.n_admissible == 0 and counts["total"] == sampled.n_evaluated == 12
    assert sum(counts["removed"].values()) == 12
    trials = sampled.study.get_trials(deepcopy=False)
    assert counts["removed"]["valid split"] == sum(t.constraints["split"] > 0 for t in trials)
    assert counts["relaxed"]["realizable"] == counts["removed"]["realizable"] == 12
    assert counts["why"]["realizable"].startswith("12 of the 12 layouts it alone removes do not "
                                                  "split batch_size (1,000) into whole microbatches")
    assert "no admissible trial among 12 points: " in sampled.summary()


def test_an_empty_search_counts_fits_memory_apart_from_the_memory_limit():
    """A search with nothing admissible had folded "fits memory" (feasible) into "within the
    memory limit" and advised relaxing a limit that gives back no layout that does not fit the
    accelerator. It counts them apart, as the cube's analysis (sweep top) does."""
    import sweep

    spec = {"workload": "Llama3_70B_MC", "fleet": "HGX_H100_1K_MC", "physics": "megatron",
            "axes": {"tp_size": [1, 2, 4, 8], "pp_size": [1, 2, 4]},
            "fixed": {"batch_size": 1024, "seq_len": 4096},
            "constraints": {"memory_limit": "20 GB"}}
    cube = sweep.run(spec)
    cube_counts = sweep.analysis.admissible_counts(cube)
    fits = int(cube["feasible"].sum())
    assert 0 < fits < cube.admissible.size and not cube["admissible"].any()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = search(spec, mode="exhaustive", progress=False)
        sampled = search(spec, mode="sampled", n_trials=24, seed=0, progress=False)
    counts = result.empty_counts
    assert counts["removed"] == cube_counts["removed"] and counts["relaxed"] == cube_counts["relaxed"]
    assert counts["removed"]["fits memory"] == cube.admissible.size - fits
    assert counts["removed"]["within the memory limit"] == counts["relaxed"]["within the memory limit"] == fits
    assert (f"fits memory removed {cube.admissible.size - fits}, within the memory limit removed "
            f"{fits}, realizable removed 0; relax within the memory limit: {fits} layouts pass "
            f"every other condition") in result.summary()
    # a sampled search counts its trials so, each trial's layout read from the cube
    trials = sampled.study.get_trials(deepcopy=False)
    unfit = sum(not bool(cube["feasible"].sel(tp_size=t.params["tp_size"],
                                              pp_size=t.params["pp_size"])) for t in trials)
    assert sampled.empty_counts["total"] == len(trials) == 24
    assert sampled.empty_counts["removed"]["fits memory"] == unfit
    assert sampled.empty_counts["removed"]["within the memory limit"] == 24 - unfit
    # where no layout fits, relaxing the memory limit cannot help, and it is not advised
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        none_fit = search({**spec, "axes": {"tp_size": [1, 2], "pp_size": [1, 2]}},
                          mode="exhaustive", progress=False)
    text = none_fit.summary()
    assert none_fit.empty_counts["removed"]["fits memory"] == 4
    assert "relax within the memory limit" not in text
    assert "no limit relaxed alone gives a point: widen the axes" in text


def test_multi_objective_summary_and_exact_top():
    result = search(SMALL, objectives={"effective_throughput": "maximize",
                                       "n_accelerators": "minimize"},
                    mode="exact", memory_limit=LIMIT, k=3)
    assert len(result.top) == min(3, len(result.best_trials))
    assert isinstance(result.best_value, tuple) and len(result.best_value) == 2
    assert "Pareto" in result.summary()


def test_deprecated_spellings_warn_and_still_work():
    with pytest.warns(DeprecationWarning, match="use k="):
        old = search(SMALL, mode="exact", memory_limit=LIMIT, top_k=3, block_points=4096)
    with pytest.warns(DeprecationWarning, match="use block_points="):
        new = search(SMALL, mode="exact", memory_limit=LIMIT, k=3, max_points=4096)
    assert old.top == new.top and len(new.top) == 3
    with pytest.warns(DeprecationWarning, match="n_admissible"):
        assert new.n_feasible == new.n_admissible > 0
    with pytest.warns(DeprecationWarning, match="is deprecated: use 'm"):
        multi = search(SMALL, objectives={"mfu": "max", "n_accelerators": "min"}, mode="exact",
                       memory_limit=LIMIT, k=2)
    assert multi.objectives == (("mfu", "maximize"), ("n_accelerators", "minimize"))
    assert multi.pareto == multi.best_trials and multi.best_values == multi.best_value
    assert search(SMALL, mode="sampled", n_trials=16, seed=0, memory_limit=LIMIT).mode == "sample"


def test_local_moves_sampler_wraps_the_inner_sampler():
    """The local trials take the batch's last places; the inner sampler proposes the others."""
    result = search(SMALL, n_trials=64, seed=3, memory_limit=LIMIT, batch_size=16, mode="sampled")
    assert isinstance(result.study.sampler, search_mod_attr("LocalMovesSampler"))
    trials = result.study.trials
    for start in range(16, 64, 16):
        origins = [t.user_attrs.get("search:origin") for t in trials[start:start + 16]]
        assert origins == [None] * 12 + ["local"] * 4
    seen = [tuple(sorted(t.params.items())) for t in trials if
            t.user_attrs.get("search:origin") == "local"]
    assert len(seen) == len(set(seen))  # untried layouts, each once


def test_a_search_across_jobs_warns():
    """A seq_len (or workload, fleet, batch_size) axis is the job, not a layout choice: a
    search over it finds the best over jobs, so it warns and says to search one job; a
    search of one job does not."""
    from sweep.analysis import JobMixWarning
    jobs = dict(SMALL, axes=dict(SMALL["axes"], seq_len=[2048, 8192]))
    with pytest.warns(JobMixWarning, match=r"the search's axes include seq_len \(it describes "
                                           r"the job, not a choice between layouts\)"):
        search(jobs, mode="exhaustive")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        search(SMALL, mode="exhaustive")
    assert not [w for w in caught if issubclass(w.category, JobMixWarning)]


def search_mod_attr(name):
    return getattr(importlib.import_module("sweep.search"), name)


def test_utilization_objective_across_precisions_warns():
    """MFU divides by each precision's own peak: searching it along a precision axis of
    mixed widths warns (and says what ranks speed); speed objectives, or precisions of one
    width, do not."""
    from sweep.analysis import UtilizationWarning
    with pytest.warns(UtilizationWarning, match="objective 'mfu' is measured against each "
                                                "precision's own peak.*effective_throughput"):
        search(SMALL, mode="exhaustive")
    same_width = dict(SMALL, axes=dict(SMALL["axes"], precision=["bf16", "fp16"]))
    for spec, objective in ((SMALL, "effective_throughput"), (same_width, "mfu")):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            search(spec, mode="exhaustive", objective=objective)
        assert not [w for w in caught if "own peak" in str(w.message)], (objective, spec["axes"])


#: 4 x 6 x 6 x 3 = 432 layouts of Llama3_70B, the cluster sized by dp_size (64-1536 GPUs).
RULES = {"name": "rules", "workload": "Llama3_70B", "fleet": "Training_1K",
         "axes": {"tp_size": [1, 2, 4, 8], "pp_size": [1, 2, 4, 5, 8, 10],
                  "dp_size": [1, 2, 4, 8, 16, 32], "zero_stage": [0, 1, 3]},
         "fixed": {"batch_size": 256, "seq_len": 4096, "microbatch_count": 8},
         "constraints": {"memory_limit": "40 GB"}}


@pytest.mark.parametrize("rule", ["min_accelerators", "require_realizable", "physics"])
def test_a_stored_study_is_not_continued_under_other_rules(tmp_path, rule):
    """A study's trials are ranked by the rules they were priced under: a search with
    another minimum cluster, realizability rule or physics model must not continue it
    (an audit had a search with min_accelerators = 512 report the stored 64-GPU best,
    an mlsysim search report megatron's layouts, over its memory limit). The default study
    name differs, and a named study is refused, naming the rule."""
    journal = str(tmp_path / "s.journal")
    base, other = dict(RULES), dict(RULES)
    if rule == "min_accelerators":
        other["constraints"] = {**RULES["constraints"], "min_accelerators": 512}
    elif rule == "require_realizable":
        base["constraints"] = {**RULES["constraints"], "require_realizable": False}
        base["fixed"] = {**RULES["fixed"], "batch_size": 96}
        other["fixed"] = base["fixed"]
    else:
        base = {**RULES, "workload": "Llama3_70B_MC", "fleet": "HGX_H100_1K_MC",
                "physics": "megatron", "fixed": {"batch_size": 256, "seq_len": 4096}}
        other = {**base, "physics": "mlsysim"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = search(base, n_trials=200, seed=0, storage=journal, mode="sampled")
        truth = search(other, mode="exhaustive")
        again = search(other, n_trials=200, seed=0, storage=journal, mode="sampled")
        assert again.study.study_name != first.study.study_name and again.n_new == 200
        if truth.best_value is None:
            assert again.best_value is None
        else:
            assert again.best_value <= truth.best_value
            assert again.breakdown["n_accelerators"] >= (512 if rule == "min_accelerators" else 1)
            p = dict(again.best_params)
            out = solver.solve(solver.catalog.workload(p.pop("workload")),
                               solver.catalog.fleet(p.pop("fleet")), warn=False, **p)
            assert bool(out["realizable"]) and float(out["mfu"]) == again.best_value
        with pytest.raises(ValueError, match=f"created for another space or objectives: .*{rule}: stored "):
            search(other, n_trials=200, seed=0, storage=journal, mode="sampled",
                   study_name=first.study.study_name)


def test_best_params_price_the_best_layout_again_with_a_physics_axis_and_a_calibration(tmp_path):
    """``solver.solve(wl, fl, **best_params)`` gives ``best_value``: over a physics axis
    best_params holds only the knobs its model takes (an audit found the megatron knob
    micro_batch_size in an mlsysim best, which solve refuses), and with a calibration the
    profile's constants too (the audit's re-pricing without them: 0.385 for 0.350)."""
    from sweep.calibration import Profile
    both = {"name": "both", "workload": "Llama3_70B_MC", "fleet": "HGX_H100_1K_MC",
            "physics": ["mlsysim", "megatron"],
            "axes": {"tp_size": [4, 8], "pp_size": [4, 8], "micro_batch_size": [1, 2],
                     "microbatch_count": [32, 64]},
            "fixed": {"batch_size": 1024, "seq_len": 4096}}
    profile = Profile(physics="megatron", constants={"hopper_gemm_scale": 0.6})
    alone = {**both, "physics": "megatron",
             "axes": {k: v for k, v in both["axes"].items() if k != "microbatch_count"}}
    for spec, kw in ((both, {}), (alone, {"calibration": profile})):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = search(spec, mode="exhaustive", **kw)
        for entry in result.top:
            p = dict(entry["params"])
            physics = p.get("physics", "mlsysim")
            assert ("micro_batch_size" in p) == (physics == "megatron")
            assert ("microbatch_count" in p) == (physics == "mlsysim")
            assert (p.get("hopper_gemm_scale") == 0.6) == ("calibration" in kw)
            out = solver.solve(solver.catalog.workload(p.pop("workload")),
                               solver.catalog.fleet(p.pop("fleet")), warn=False, **p)
            assert float(out["mfu"]) == entry["values"]["mfu"]
        assert result.best_params == result.top[0]["params"]
        # the summary's layout line leaves the profile's constants out, of its physics only
        assert result.constants_of({"physics": "megatron"}) == (
            ("hopper_gemm_scale",) if "calibration" in kw else ())
        assert result.constants_of({}) == ()  # an mlsysim layout: its knobs stay


def test_a_stored_megatron_study_is_not_continued_under_other_constants(tmp_path, monkeypatch):
    """The megatron physics' shipped constants move with each refit: a study priced under
    one set must not continue under another (a review had a stored study report 0.2507
    after a change of gemm_k_overhead that priced its best at 0.0819). An mlsysim study's
    signature is as before (it has no fitted constants)."""
    from solver.physics import megatron
    journal = str(tmp_path / "s.journal")
    spec = {"name": "consts", "workload": "Llama3_70B_MC", "fleet": "HGX_H100_1K_MC",
            "physics": "megatron", "axes": {"tp_size": [2, 4, 8], "pp_size": [1, 2, 4]},
            "fixed": {"batch_size": 256, "seq_len": 4096}}
    first = search(spec, n_trials=9, seed=0, storage=journal, mode="sampled")
    stored = megatron.CONSTANTS["gemm_k_overhead"]
    monkeypatch.setitem(megatron.CONSTANTS, "gemm_k_overhead", 4096.0)
    again = search(spec, n_trials=9, seed=0, storage=journal, mode="sampled")
    assert again.study.study_name != first.study.study_name and again.n_new == 9
    assert again.best_value < first.best_value  # longer tiles: a slower best
    with pytest.raises(ValueError, match=re.escape(
            f"megatron_constants.gemm_k_overhead: stored {stored}, now 4096.0")):
        search(spec, n_trials=9, seed=0, storage=journal, mode="sampled",
               study_name=first.study.study_name)
