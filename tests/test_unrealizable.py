"""``solver.solve`` warns when no configuration of a call is realizable, naming the rules.

A single layout that breaks a rule (405B's 126 layers on 8 x 2 chunks, a batch that does not
split into whole microbatches) had been priced without a word: its numbers came back beside a
``realizable`` of False that a caller reading ``step_latency_total`` need not look at.
"""

import warnings

import numpy as np
import pytest

import solver
import sweep
from solver.physics import UnrealizableWarning
from solver.physics import megatron_steps as steps

CAT = solver.catalog
L405, NVL72 = CAT.workload("Llama3_405B_MC"), CAT.fleet("GB200_NVL72_8_MC")


def _quiet(call):
    """``call()`` with every warning an error (none may fire)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return call()


def test_one_unrealizable_megatron_layout_warns_with_its_rule_and_keeps_its_numbers():
    knobs = dict(physics="megatron", batch_size=256, seq_len=8192, tp_size=8, pp_size=8,
                 v_stages=2, cp_size=2, dp_size=4, sequence_parallel=True)
    with pytest.warns(UnrealizableWarning) as caught:
        out = solver.solve(L405, NVL72, **knobs)
    message = str(caught[0].message)
    assert len(caught) == 1 and caught[0].filename == __file__  # points at the caller
    assert message.startswith("the layout is not realizable (physics='megatron')")
    # 126 layers over 8 stages of 2 chunks: the one rule broken, in its own words
    assert f"rule 'layers': {steps.REALIZABLE_CONDITIONS['layers']}" in message
    assert "whole_microbatches" not in message and "warn=False" in message
    assert not out["realizable"] and out["valid"]
    silent = _quiet(lambda: solver.solve(L405, NVL72, warn=False, **knobs))
    for name, value in out.items():  # the warning changes no output
        np.testing.assert_array_equal(value, silent[name], err_msg=name)
    assert np.isfinite(out["step_latency_total"]) and out["step_latency_total"] > 0


def test_a_call_of_many_configurations_counts_each_rule():
    # batches 1-3 on 72 x 8 / (8 * 1) = 72 DP ranks: none whole; tp 16 does not divide 8 KV heads
    with pytest.warns(UnrealizableWarning) as caught:
        out = solver.solve(L405, NVL72, physics="megatron", batch_size=[1, 2, 3],
                           tp_size=[[8], [16]])
    message = str(caught[0].message)
    assert message.startswith("none of the 6 configurations of this solve call is realizable")
    assert "rule 'whole_microbatches' (6 of 6)" in message
    assert f"rule 'kv_heads' (3 of 6): {steps.REALIZABLE_CONDITIONS['kv_heads']}" in message
    assert out["realizable"].shape == (2, 3) and not out["realizable"].any()


def test_mlsysim_names_an_impossible_split_and_a_partial_microbatch():
    wl, fl = CAT.workload("Llama3_70B"), CAT.fleet("Training_1K")
    # tp 3 does not divide 1024 GPUs (NaN); tp 8: 128 replicas do not divide a batch of 1000
    with pytest.warns(UnrealizableWarning) as caught:
        out = solver.solve(wl, fl, batch_size=1000, tp_size=[8, 3])
    message = str(caught[0].message)
    assert "(physics='mlsysim')" in message
    assert "rule 'valid' (1 of 2)" in message and "rule 'whole_microbatches' (1 of 2)" in message
    assert np.isnan(out["step_latency_total"][1]) and np.isfinite(out["step_latency_total"][0])
    # the exact model's numbers are the reference's, warning or not
    silent = _quiet(lambda: solver.solve(wl, fl, batch_size=1000, tp_size=[8, 3],
                                         warn=False))
    np.testing.assert_array_equal(out["mfu"], silent["mfu"])


def test_no_warning_while_one_configuration_is_realizable_or_there_is_none():
    wl, fl = CAT.workload("Llama3_70B"), CAT.fleet("Training_1K")
    # tp 3 does not divide 1024 GPUs; tp 8 leaves 128 replicas, which split 1024 sequences
    out = _quiet(lambda: solver.solve(wl, fl, batch_size=1024, tp_size=[8, 3]))
    assert list(out["realizable"]) == [True, False]
    mixed = _quiet(lambda: solver.solve(L405, NVL72, physics="megatron", batch_size=[1, 576]))
    assert list(mixed["realizable"]) == [False, True]
    empty = _quiet(lambda: solver.solve(wl, fl, batch_size=np.array([], dtype=int)))
    assert empty["realizable"].size == 0


def test_sweeps_and_searches_mask_by_themselves_and_stay_quiet():
    # every layout of this spec is unrealizable (126 layers on 4 or 8 stages of 2 chunks)
    spec = {"workload": "Llama3_405B_MC", "fleet": "GB200_NVL72_8_MC", "physics": "megatron",
            "axes": {"pp_size": [4, 8], "tp_size": [4, 8]},
            "fixed": {"batch_size": 1024, "v_stages": 2, "seq_len": 8192}}
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnrealizableWarning)
        cube = sweep.run(spec)
        result = sweep.search(spec, seed=0)
    assert not cube["realizable"].any()
    assert result.best_params is None


def test_mlsysim_names_an_uneven_split_not_the_microbatches():
    """TP 3 does not divide Llama 3 8B's 32 heads; 768 sequences split over 192 replicas.
    The message had blamed whole microbatches, which hold."""
    with pytest.warns(UnrealizableWarning) as caught:
        solver.solve(CAT.workload("Llama3_8B"), NVL72, tp_size=3, pp_size=1, batch_size=768,
                     microbatch_count=1)
    message = str(caught[0].message)
    assert "it breaks rule 'even_splits': tp_size divides the heads" in message
    assert "whole_microbatches" not in message


def test_a_large_call_says_so_without_pricing_its_split_again():
    """Counting each rule re-prices the split on the numpy path: past 65,536 configurations
    the message names where to look instead."""
    n = solver.physics.RULES_COUNTED_UP_TO + 1
    with pytest.warns(UnrealizableWarning) as caught:
        solver.solve(L405, NVL72, physics="megatron", batch_size=256, tp_size=8,
                     pp_size=np.full(n, 5))  # 126 layers on 5 stages
    message = str(caught[0].message)
    assert message.startswith(f"none of the {n:,} configurations of this solve call")
    assert "why_unrealizable(workload, fleet, **knobs) names the rules" in message
    assert "rule '" not in message


def test_an_empty_megatron_answer_counts_the_rules_its_layouts_break():
    # It had recited the whole rulebook: FP8 on an A100 (no FP8 peak) and tp_comm_overlap
    # with TP 16 on nodes of 8 are named, with how many layouts break each.
    from sweep.analysis.empty import admissible_counts
    a100 = sweep.run({"workload": "Llama3_8B_MC", "fleet": "Selene_MC", "physics": "megatron",
                      "axes": {"tp_size": [1, 2, 4, 8], "pp_size": [1, 2, 4]},
                      "fixed": {"batch_size": 1024, "seq_len": 4096, "precision": "fp8",
                                "sequence_parallel": True}})
    why = admissible_counts(a100)["why"]["realizable"]
    assert f"precision, by 12: {steps.REALIZABLE_CONDITIONS['precision']}" in why
    assert "the megatron model's rules:" not in why  # (the rulebook)
    # every layout is FP8 on an A100: no batch size would make one realizable
    assert "would split" not in why
    wide = sweep.run({"workload": "GPT3_175B_MC", "fleet": "HGX_H100_1K_MC", "physics": "megatron",
                      "axes": {"tp_size": [16, 32], "pp_size": [8, 16]},
                      "fixed": {"batch_size": 1024, "seq_len": 2048, "sequence_parallel": True,
                                "tp_comm_overlap": True}})
    why = admissible_counts(wide)["why"]["realizable"]
    assert "tp_comm_overlap_domain, by 4:" in why
    # a mixed cube's megatron slice, as `top --select physics=megatron` takes it
    mixed = sweep.run({"workload": "Llama3_8B_MC", "fleet": "Selene_MC",
                       "physics": ["mlsysim", "megatron"],
                       "axes": {"tp_size": [1, 2, 4, 8], "pp_size": [1, 2, 4], "precision": ["fp8"]},
                       "fixed": {"batch_size": 1024, "seq_len": 4096, "sequence_parallel": True}})
    why = admissible_counts(mixed.isel(physics=[1]))["why"]["realizable"]
    assert "precision, by 12" in why


def test_an_empty_megatron_search_counts_the_rules_its_layouts_break():
    # The exhaustive walk asks the rules of each block's blocked layouts and adds them up.
    spec = {"workload": "Llama3_8B_MC", "fleet": "Selene_MC", "physics": "megatron",
            "axes": {"tp_size": [1, 2, 4, 8], "pp_size": [1, 2, 4]},
            "fixed": {"batch_size": 1024, "seq_len": 4096, "precision": "fp8",
                      "sequence_parallel": True}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = sweep.search(spec, mode="exhaustive", block_points=5)  # three blocks
    why = result.why_empty()
    assert f"precision, by 12: {steps.REALIZABLE_CONDITIONS['precision']}" in why
    assert "would split" not in why
