"""One optuna study on a real PostgreSQL server, shared by worker processes, one of them killed.

The README promises that an RDB URL lets machines share a search. Three worker
processes search one study on a PostgreSQL server (started by the fixture on
127.0.0.1); one is SIGKILLed while it holds RUNNING trials and is started again.
The study must end with exactly ``n_trials`` complete trials: none lost (the
killed worker's trials are adopted and priced) and none counted twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

from _postgres import postgres_url  # noqa: F401  (the fixture)

MAIN = str(Path(__file__).resolve().parents[1])

SPEC = {
    "name": "pg",
    "workload": "Llama3_70B",
    "fleet": "Training_1K",
    "axes": {"tp_size": {"powers_of_two": 8}, "pp_size": [1, 2, 4, 8, 16],
             "microbatch_count": {"powers_of_two": 32}, "zero_stage": [0, 1, 2, 3],
             "dp_size": {"powers_of_two": 32}},
    "fixed": {"batch_size": 512},
    "constraints": {"max_accelerators": 256, "memory_limit": "60 GB"},
}

_WORKER = """
import json, sys, time
from pathlib import Path
import solver
import sweep
spec, marker, hang_on = json.loads({spec!r}), Path({marker!r}), {hang_on}
real, calls = solver.solve, {{"n": 0}}
def solve(*args, **kwargs):
    calls["n"] += 1
    if calls["n"] == hang_on:
        marker.write_text("holding RUNNING trials")
        time.sleep(600)
    return real(*args, **kwargs)
solver.solve = solve
result = sweep.search(spec, n_trials={n_trials}, seed={seed}, sampler="random", batch_size=8,
                      storage={url!r}, study_name="shared", mode="sample")
print(json.dumps({{"n_new": result.n_new, "n_evaluated": result.n_evaluated}}))
"""


def _worker(tmp_path, url, tag, *, seed, n_trials, hang_on=-1):
    script = tmp_path / f"worker_{tag}.py"
    marker = tmp_path / f"marker_{tag}"
    script.write_text(_WORKER.format(spec=json.dumps(SPEC), marker=str(marker), hang_on=hang_on,
                                     n_trials=n_trials, seed=seed, url=url))
    env = {**os.environ, "PYTHONPATH": MAIN}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    return proc, marker


def test_three_workers_one_killed_end_with_exactly_n_trials(tmp_path, postgres_url):  # noqa: F811
    n_trials = 120
    victim, marker = _worker(tmp_path, postgres_url, "victim", seed=0, n_trials=n_trials,
                             hang_on=3)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert victim.poll() is None, victim.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the victim never reached its third batch"
        time.sleep(0.05)
    others = [_worker(tmp_path, postgres_url, f"w{i}", seed=i, n_trials=n_trials)[0]
              for i in (1, 2)]
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    study = optuna.load_study(study_name="shared", storage=postgres_url)
    held = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING]
    restarted, _ = _worker(tmp_path, postgres_url, "restarted", seed=3, n_trials=n_trials)
    reports = []
    for proc in (*others, restarted):
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
        reports.append(json.loads(stdout.strip().splitlines()[-1]))

    trials = optuna.load_study(study_name="shared", storage=postgres_url).trials
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == n_trials, {s: sum(t.state == s for t in trials) for s in TrialState}
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    assert len({t.number for t in complete}) == n_trials  # none counted twice
    # Each worker stops once the study holds n_trials (its own and the others'); the last to
    # stop sees them all complete.
    assert max(r["n_evaluated"] for r in reports) == n_trials, reports
    assert sum(r["n_new"] for r in reports) <= n_trials
    # The victim held trials when it died; each was priced by a survivor, not lost.
    assert held
    by_number = {t.number: t for t in trials}
    assert all(by_number[t.number].state == TrialState.COMPLETE for t in held)
