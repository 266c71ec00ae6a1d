"""Auto mode, the sub-grid sampled search, its evidence, and knob values stored in optuna."""

from __future__ import annotations

import json
import warnings

import numpy as np
import optuna
import pytest

import solver
from sweep.cli import main
from sweep.search import open_storage, search
from sweep.search.auto import Probe, duration, mode_name
from sweep.spec import load_spec

from test_search import LIMIT, SMALL, _brute_force

# These searches rank mfu over spaces with bf16 and fp8 on purpose; the warning that
# gives is asserted in test_search.py::test_utilization_objective_across_precisions_warns and
# test_analysis.py, not repeated in every report.
pytestmark = pytest.mark.filterwarnings("ignore::sweep.analysis.UtilizationWarning")

#: SMALL with wider axes: 8 x 10 x 64 x 4 x 2 x 2 x 8 x 3 = 1.97e6 layouts.
WIDE = {**SMALL, "name": "wide",
        "axes": {**SMALL["axes"], "tp_size": {"powers_of_two": 128},
                 "pp_size": {"divisors_of": "layers"},
                 "microbatch_count": {"from": 1, "to": 64}, "dp_size": {"powers_of_two": 128},
                 "v_stages": [1, 2, 4]},
        "constraints": {"max_accelerators": 512}}


def _check_admissible(params, limit=60e9, max_acc=256):
    p = dict(params)
    spec = load_spec(SMALL)
    out = solver.solve(spec.workloads[p.pop("workload")], spec.fleets[p.pop("fleet")], **p)
    assert bool(out["valid"])
    assert float(out["memory_footprint"]) <= limit
    assert p["tp_size"] * p["pp_size"] * p["dp_size"] <= max_acc
    if "realizable" in out:
        assert bool(out["realizable"])
    return out


def test_auto_is_the_default_and_exhaustive_on_a_small_space():
    knobs, out, _, feasible = _brute_force(SMALL, 60e9, 256)
    mfu = np.where(feasible, out["mfu"], -np.inf)
    result = search(SMALL, memory_limit=LIMIT)
    assert result.mode == "exact" and result.study is None
    assert result.reason.startswith("exhaustive: 1.15e+04 layouts, ")
    assert "within the time budget 60 s" in result.reason
    assert result.best_value == mfu.max() and result.n_evaluated == mfu.size
    assert result.best_params["tp_size"] == knobs["tp_size"][np.argmax(mfu)]
    assert "mode exhaustive:" in result.summary()


def test_auto_samples_when_the_walk_would_not_fit_the_budget():
    result = search(SMALL, memory_limit=LIMIT, time_budget=1e-4, seed=0)
    assert result.mode == "sample" and result.study is not None
    assert result.reason.startswith("sampled: 1.15e+04 layouts would take ")
    assert "time budget 0.0001 s" in result.reason
    # One round at least, whatever the budget: an admissible layout, and the evidence says why.
    _check_admissible(result.best_params)
    assert result.evidence.rounds == 1 and result.evidence.stopped_by == "time"
    with pytest.raises(ValueError, match="time_budget must be a positive, finite number"):
        search(SMALL, time_budget=0)
    with pytest.raises(ValueError, match="mode must be 'sample' or 'exact' .* but got 'fast'"):
        search(SMALL, mode="fast")


def test_continuous_axis_is_sampled_in_auto_mode():
    spec = {**SMALL, "axes": {**SMALL["axes"], "efficiency": {"from": 0.3, "to": 0.6}}}
    result = search(spec, memory_limit=LIMIT, seed=0, time_budget=20)
    assert result.reason.startswith("sampled: the continuous axis efficiency cannot be")
    assert 0.3 <= result.best_params["efficiency"] <= 0.6
    _check_admissible(result.best_params)


def test_forced_sampled_search_is_admissible_and_reaches_the_optimum():
    exact = search(SMALL, mode="exhaustive", memory_limit=LIMIT)
    result = search(SMALL, mode="sampled", memory_limit=LIMIT, seed=1)
    assert result.sampler == "tpe+subgrid" and result.evidence is not None
    for entry in [{"params": result.best_params}] + result.top:
        _check_admissible(entry["params"])
    assert result.best_value >= 0.99 * exact.best_value
    ev = result.evidence
    # a space this small is covered (COVER times its size priced) before patience runs out
    from sweep.search.subgrid import COVER

    assert ev.stopped_by == "covered" and ev.n_priced >= COVER * result.space_size
    assert 1 <= ev.agree <= ev.restarts and ev.n_priced == result.n_evaluated
    bests = [b for _, _, b in ev.history]
    assert bests == sorted(bests) and bests[-1] == result.best_value
    # optuna holds the proposals and the refined layouts, not the sub-grids.
    origins = {t.user_attrs.get("search:origin") for t in result.study.trials}
    assert "refined" in origins and len(result.study.trials) < ev.n_priced / 100
    assert "evidence:" in result.summary() and "reached by" in result.summary()


def test_sampled_seeds_reproduce():
    a = search(WIDE, mode="sampled", memory_limit=LIMIT, seed=3, time_budget=120)
    b = search(WIDE, mode="sampled", memory_limit=LIMIT, seed=3, time_budget=120)
    c = search(WIDE, mode="sampled", memory_limit=LIMIT, seed=4, time_budget=120)
    assert [t.params for t in a.study.trials] == [t.params for t in b.study.trials]
    assert a.best_params == b.best_params and a.best_value == b.best_value
    assert [t.params for t in a.study.trials] != [t.params for t in c.study.trials]
    _check_admissible(a.best_params, max_acc=512)


def test_realizable_is_a_constraint_when_the_solver_reports_it(monkeypatch):
    real = solver.solve

    def with_realizable(workload, fleet, **knobs):
        out = dict(real(workload, fleet, **knobs))
        out["realizable"] = np.broadcast_to(np.asarray(knobs["microbatch_count"]) <= 4,
                                            np.shape(out["valid"]))
        return out

    monkeypatch.setattr(solver, "solve", with_realizable)
    free = search(SMALL, mode="exhaustive", memory_limit=LIMIT)
    assert free.best_params["microbatch_count"] <= 4
    sampled = search(SMALL, mode="sampled", memory_limit=LIMIT, seed=0)
    assert sampled.best_params["microbatch_count"] <= 4
    assert sampled.best_value == pytest.approx(free.best_value, rel=1e-12)
    trial = sampled.study.trials[0]
    assert set(trial.constraints) == {"split", "memory", "accelerators", "realizable"}


def test_optuna_stores_knob_values(tmp_path):
    journal = str(tmp_path / "study.jsonl")
    search(SMALL, mode="sampled", memory_limit=LIMIT, seed=0, storage=journal,
           study_name="values")
    study = optuna.load_study(study_name="values", storage=open_storage(journal))
    trial = study.trials[0]
    assert not any(name.endswith("_index") for name in trial.params)
    assert trial.params["tp_size"] in (1, 2, 4, 8) and trial.params["dp_size"] in (1, 2, 4, 8,
                                                                                    16, 32)
    assert trial.distributions["tp_size"] == optuna.distributions.CategoricalDistribution(
        (1, 2, 4, 8))
    best = study.best_trial
    assert best.params["tp_size"] * best.params["pp_size"] * best.params["dp_size"] <= 256
    # Resume: the same call continues the study (its trials kept).
    n = len(study.trials)
    again = search(SMALL, mode="sampled", memory_limit=LIMIT, seed=1, storage=journal,
                   study_name="values")
    assert len(again.study.trials) > n


def test_a_study_of_the_index_encoding_is_refused_with_the_fix(tmp_path):
    journal = str(tmp_path / "old.jsonl")
    with warnings.catch_warnings():  # 4 trials may find no admissible layout: not the point
        warnings.simplefilter("ignore", RuntimeWarning)
        search(SMALL, mode="sampled", n_trials=4, memory_limit=LIMIT, seed=0, storage=journal,
               study_name="old")
    study = optuna.load_study(study_name="old", storage=open_storage(journal))
    sig = json.loads(study.user_attrs["search:signature"])
    sig["space"]["params"]["tp_size_index"] = sig["space"]["params"].pop("tp_size")
    study.set_user_attr("search:signature", json.dumps(sig, sort_keys=True))
    with pytest.raises(ValueError, match=r"former position encoding \(tp_size_index.*"
                                         r"start a new study"):
        search(SMALL, mode="sampled", n_trials=8, memory_limit=LIMIT, storage=journal,
               study_name="old")


def test_probe_and_helpers():
    assert mode_name("exact") == "exhaustive" and mode_name("sample") == "sampled"
    assert duration(1.7) == "1.7 s" and duration(8640) == "2.4 h"
    probe = Probe(60.0, probe_seconds=0.0)
    assert probe(10, 10 ** 12) is False and probe.estimate > 60
    fits = Probe(60.0, probe_seconds=0.0)
    assert fits(10 ** 6, 10 ** 6) is True and fits.decided


def test_cli_mode_and_time_budget(tmp_path, capsys):
    path = tmp_path / "small.toml"
    path.write_text('name = "small"\nworkload = "Llama3_70B"\nfleet = "Training_1K"\n'
                    '[axes]\ntp_size = { powers_of_two = 8 }\npp_size = [1, 2, 4, 8]\n'
                    'dp_size = { powers_of_two = 32 }\n[fixed]\nbatch_size = 512\n')
    assert main(["search", str(path)]) == 0
    out = capsys.readouterr().out
    assert "search [exhaustive]" in out and "mode exhaustive: 96 layouts" in out
    assert main(["search", str(path), "--mode", "sampled", "--seed", "0",
                 "--time-budget", "30"]) == 0
    out = capsys.readouterr().out
    assert "search [tpe+subgrid]" in out and "evidence:" in out
    assert main(["search", str(path), "--time-budget", "0.00001", "--seed", "0"]) == 0
    assert "mode sampled: 96 layouts would take" in capsys.readouterr().out
    assert main(["search", str(path), "--time-budget", "-1"]) != 0
    assert "expected a positive number of seconds, but got '-1'" in capsys.readouterr().err


#: 2.7e11 layouts where a random start is almost never realizable (2048 sequences over
#: up to 256 replicas and 512 microbatches), so a climb must walk into the admissible region.
HUGE = {"name": "huge", "workload": "Llama3_405B", "fleet": "Training_1K",
        "axes": {"tp_size": {"powers_of_two": 64}, "pp_size": {"divisors_of": "layers"},
                 "microbatch_count": {"from": 1, "to": 512}, "zero_stage": [0, 1, 2, 3],
                 "activation_recomputation": [False, True], "v_stages": [1, 2, 3, 6],
                 "seq_len": [2048, 4096, 8192], "dp_size": {"from": 1, "to": 256},
                 "gradient_accumulation_steps": [1, 2, 4, 8]},
        "fixed": {"batch_size": 2048},
        "constraints": {"max_accelerators": 4096, "memory_limit": 0.9}}


def test_sampled_search_walks_from_inadmissible_starts_to_a_realizable_best():
    # It stopped with no answer after 4 rounds when every start was unrealizable.
    result = search(HUGE, seed=1)
    assert result.mode == "sample" and result.best_value is not None
    assert result.evidence.agree >= 1
    spec = load_spec(HUGE)
    wl, fl = spec.workload_spec(), spec.fleet_spec()
    layout = {k: v for k, v in result.best_params.items() if k not in ("workload", "fleet")}
    out = solver.solve(wl, fl, **{"batch_size": 2048, **layout})
    assert bool(out["valid"]) and bool(out["realizable"])
    assert out["memory_footprint"] <= 0.9 * fl.node.accelerator.memory_capacity
    assert abs(float(out["mfu"]) - result.best_value) < 1e-12


def test_a_sampled_search_of_a_small_space_stops_when_it_has_covered_it():
    """Sub-grids overlap: a sampled search of 61,440 layouts (asked for) had reported
    "1,171,591 layouts evaluated (1,171,591 new) of a space of 6.14e+04", and with a limit
    nothing met spent its whole 60 s budget pricing the same layouts again. It now stops at
    COVER times the space's size and counts pricings as pricings."""
    from sweep.search.subgrid import COVER

    exact = search("cluster_size", mode="exhaustive")
    result = search("cluster_size", mode="sampled", seed=0)
    assert result.best_value == exact.best_value
    assert result.evidence.stopped_by == "covered"
    # a round's last climb may pass the mark: 4.09-4.48x the space over seeds 0-2
    assert COVER * exact.space_size <= result.n_evaluated < (COVER + 1) * exact.space_size
    text = result.summary()
    assert "layout pricings" in text and "a layout priced again counts again" in text
    assert "trials recorded" in text and "layouts evaluated" not in text
    none = search("cluster_size", mode="sampled", seed=0, memory_limit="1e3 MB", time_budget=60)
    assert none.best_params is None and none.evidence.stopped_by == "covered"
    assert none.n_evaluated < (COVER + 1) * exact.space_size
