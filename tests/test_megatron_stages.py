"""Set first and last pipeline stages (num_layers_in_first/last_pipeline_stage, [13] of
solver.physics.megatron): which splits Megatron-Core runs, and what the stage that paces the
pipeline is, against the model's own terms on both engines."""

import warnings

import numpy as np
import pytest

from solver import catalog
from solver.physics import megatron as M

L405 = catalog.workload("Llama3_405B_MC")  # 126 layers, as Llama 3 405B trained on 16 stages [14]
DSV3 = catalog.workload("DeepSeek_V3_MC")  # 61 layers, 3 of them dense
FLEET = catalog.fleet("HGX_H100_1K_MC")
KW = dict(batch_size=1024, seq_len=8192, tp_size=8, pp_size=16, micro_batch_size=1,
          sequence_parallel=True, recompute="none")
TERMS = ("compute_latency", "tp_communication_latency", "cp_communication_latency",
         "ep_communication_latency", "pp_communication_latency", "dp_communication_latency",
         "pipeline_bubble_latency", "optimizer_latency")


def _solve(workload, engine="numpy", first=0, last=0, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return M.solve(workload, FLEET, engine=engine, num_layers_in_first_pipeline_stage=first,
                       num_layers_in_last_pipeline_stage=last, **{**KW, **kw})


def _f(out, name):
    return float(np.asarray(out[name]))


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_llama3_405b_on_16_stages_paced_by_a_middle_stage_without_the_head(engine):
    """126 layers on 16 stages: the even split prices ceil(126 / 16) = 8 layers with the LM
    head on the same stage; Meta's 7, 8 x 14, 7 [14] leaves the head on a stage of 7, so an
    8-layer middle stage paces the pipeline and the head's time leaves the paced stage.
    Only the set stages are realizable: Megatron-LM refuses 126 layers on 16 stages unless
    the first or the last stage's layers are set [13]."""
    even, set_ = _solve(L405, engine), _solve(L405, engine, first=7, last=7)
    assert not bool(even["realizable"]) and bool(set_["realizable"])
    assert bool(even["valid"])  # priced all the same, on its heaviest stage
    m = _f(even, "microbatch_count")
    head = (_f(even, "compute_latency") - _f(set_, "compute_latency")) / m
    assert head > 0
    # the same 8 layers pace both, so every per-layer term of the paced stage is the same
    for name in ("tp_communication_latency", "cp_communication_latency", "ep_communication_latency"):
        assert _f(set_, name) == _f(even, name), name
    assert _f(set_, "step_latency_total") < _f(even, "step_latency_total")
    # the bubble is the other stages' times: 7 + 8 x 14 + 7 layers and the head less the
    # paced stage's 8, not 15 stages of 8
    assert _f(set_, "pipeline_bubble_latency") < _f(even, "pipeline_bubble_latency")
    # the terms never add up to more than the step (the rest: fixed overhead, launch floor)
    for out in (even, set_):
        assert sum(_f(out, t) for t in TERMS) <= _f(out, "step_latency_total")
    # 6, 8 x 14, 8 puts the head on a stage of 8: paced by it, as the even split
    assert _f(_solve(L405, engine, first=6, last=8), "compute_latency") == _f(even, "compute_latency")


@pytest.mark.parametrize("first, last, v, realizable", [
    (7, 7, 1, True),      # 112 over 14 middle stages: 8 each
    (8, 8, 1, False),     # 110 over 14: not whole
    (6, 8, 2, True),      # 112 over 14, and 6, 8, 8 each divisible by 2 chunks
    (7, 7, 2, False),     # 7 layers in 2 chunks
    (7, 0, 1, False),     # 119 over 15 stages: not whole
    (126, 0, 1, False),   # nothing left for the 15 stages after it
    (100, 100, 1, False),  # more layers than the model has
])
def test_which_set_stages_megatron_core_runs(first, last, v, realizable):
    out = _solve(L405, first=first, last=last, v_stages=v)
    assert bool(out["realizable"]) is realizable
    assert bool(out["valid"])


def test_two_stages_both_set_need_every_layer_and_a_pipeline():
    kw = dict(pp_size=2, tp_size=8)
    assert bool(_solve(L405, first=60, last=66, **kw)["realizable"])
    assert not bool(_solve(L405, first=60, last=60, **kw)["realizable"])
    # one stage: the knobs have no stage to set
    one = _solve(L405, first=7, last=7, pp_size=1, tp_size=8, batch_size=64)
    assert not bool(one["realizable"])


@pytest.mark.parametrize("first, last, kw", [
    (60, 60, {"pp_size": 2}),   # 6 layers left and no stage between
    (100, 100, {}),             # more than the model
    (7, 7, {"pp_size": 1, "batch_size": 64}),  # no pipeline
])
@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_a_split_no_stage_can_hold_is_priced_as_the_even_one(first, last, kw, engine):
    """Where the set stages cannot hold the model (not realizable), the layouts are priced as
    the even split, never as a stage shorter than its share of the model's work."""
    odd, even = _solve(L405, engine, first=first, last=last, **kw), _solve(L405, engine, **kw)
    for name in M.OUTPUTS:
        if name != "realizable":
            assert np.array_equal(np.asarray(odd[name]), np.asarray(even[name]), equal_nan=True), name


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_deepseek_v3_mtp_rebalanced_onto_a_shorter_last_stage(engine):
    """DeepSeek-V3's 61 layers and one MTP module on 8 stages: the even split prices 8 layers,
    the head and the module on one stage; 7, 8 x 6, 6 gives the last stage two layers fewer
    for the module and the head, and a middle stage of 8 MoE layers paces the pipeline."""
    kw = dict(pp_size=8, ep_size=8, tp_size=4, mtp_num_layers=1, batch_size=512, seq_len=4096)
    even, set_ = _solve(DSV3, engine, **kw), _solve(DSV3, engine, first=7, last=6, **kw)
    # (61 layers on 8 stages run only with a stage set: Megatron-LM's validate_args [13])
    assert bool(set_["realizable"]) and not bool(even["realizable"])
    assert _f(set_, "step_latency_total") < _f(even, "step_latency_total")
    # the module's and the heads' time left the paced stage
    assert _f(set_, "compute_latency") < _f(even, "compute_latency")
    # the MTP module's FLOPs count alike
    assert _f(set_, "model_flops_per_accelerator") * _f(set_, "step_latency_total") == pytest.approx(
        _f(even, "model_flops_per_accelerator") * _f(even, "step_latency_total"), rel=1e-12)


@pytest.mark.parametrize("bad", [-1, 4096])
def test_stage_layers_out_of_range_are_refused(bad):
    for name in ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"):
        for engine in ("numpy", "fused"):
            with pytest.raises(ValueError, match=name):
                M.solve(L405, FLEET, engine=engine, **KW, **{name: np.full(3, bad)})


@pytest.mark.parametrize("name", ["Llama3_8B_MC", "Llama3_70B_MC", "Mixtral_8x7B_MC",
                                  "DeepSeek_V3_MC"])
def test_the_step_is_its_terms_the_launch_time_and_the_fixed_overhead(name):
    """launch_latency is the host's launch time a layer's GPU work does not hide: with the
    other terms and the fixed per-step overhead it makes up the step, on random layouts
    (the draw of tests/test_fused_megatron.py: every knob, stages set and not)."""
    from test_fused_megatron import _draw

    rng = np.random.default_rng(7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = M.solve(catalog.workload(name), FLEET, **_draw(rng, 4000, dp_given=True))
    ok = np.asarray(out["valid"])
    assert ok.sum() > 500
    terms = sum(np.asarray(out[t])[ok] for t in TERMS + ("launch_latency",))
    step = np.asarray(out["step_latency_total"])[ok]
    np.testing.assert_allclose(terms + M.CONSTANTS["step_overhead"], step, rtol=1e-9)
    launch = np.asarray(out["launch_latency"])[ok]
    assert (launch >= 0).all() and (launch == 0).any()
    if name == "Llama3_8B_MC":  # small layers on small microbatches are launch-bound
        assert (launch > 0).any()


EMB, LOSS = "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"
ALL_OUT = tuple(M.OUTPUTS)


def _same_but_realizable(a, b):
    for name in ALL_OUT:
        if name != "realizable":
            np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]), err_msg=name)


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_embedding_and_loss_in_the_split_run_405b_on_8_interleaved_stages(engine):
    """Llama 3.1 405B's 126 layers + embedding + loss = 128 on 8 stages of 8 chunks [36]:
    stages of 15, 16 x 6, 15 layers, interleaved, which Megatron-Core runs. Set as stages
    (15 and 15) the interleaved split is refused (15 is no multiple of 8 [13]); the flags
    price the same stages and are realizable. Without them, ceil(126 / 8) = 16 layers and
    the LM head sit on the last stage, which then paces the pipeline: slower."""
    kw = dict(pp_size=8, v_stages=8, dp_size=16)
    flags = _solve(L405, engine, **kw, **{EMB: True, LOSS: True})
    set_ = _solve(L405, engine, first=15, last=15, **kw)
    even = _solve(L405, engine, **kw)
    assert bool(flags["realizable"]) and not bool(set_["realizable"]) and not bool(even["realizable"])
    _same_but_realizable(flags, set_)
    assert _f(flags, "step_latency_total") < _f(even, "step_latency_total")
    assert not M.why_unrealizable(L405, FLEET, **{**KW, **kw, EMB: True, LOSS: True})
    assert set(M.why_unrealizable(L405, FLEET, **{**KW, **kw})) == {"layers"}
    # not interleaved, the flags are the set stages exactly, realizable included
    plain = _solve(L405, engine, pp_size=8, dp_size=16, **{EMB: True, LOSS: True})
    for name in ALL_OUT:
        np.testing.assert_array_equal(np.asarray(plain[name]),
                                      np.asarray(_solve(L405, engine, first=15, last=15, pp_size=8,
                                                        dp_size=16)[name]), err_msg=name)


@pytest.mark.parametrize("engine", ["numpy", "fused"])
def test_the_split_rule_of_the_flags(engine):
    """Megatron-Core's __post_init__ [36]: the layers plus one for each flag split into
    pp_size equal stages, each a multiple of v_stages; where it fails the layout is priced
    as the even split, not realizable. One flag moves one stage; without a pipeline the flags
    change nothing, and with a stage's layers set Megatron-Core refuses them."""
    L70 = catalog.workload("Llama3_70B_MC")  # 80 layers
    # the embedding alone: 81 on 3 stages of 27, the first holding 26
    one = _solve(L70, engine, pp_size=3, dp_size=8, **{EMB: True})
    assert bool(one["realizable"])
    _same_but_realizable(one, _solve(L70, engine, first=26, pp_size=3, dp_size=8))
    # both: 82 "layers". 2 stages of 41 (40 layers each); 41 stages of 2 (1, 2 x 39, 1);
    # refused: 4 stages (82 % 4), 2 interleaved (41 % 2), 82 stages (the ends of no layer,
    # which this model does not price as stages); refused, they are priced as without them
    for pp, v, ok in ((2, 1, True), (41, 1, True), (4, 1, False), (2, 2, False), (82, 1, False)):
        kw = dict(pp_size=pp, v_stages=v, dp_size=8)
        out = _solve(L70, engine, **kw, **{EMB: True, LOSS: True})
        assert bool(out["realizable"]) is ok, (pp, v)
        if ok:
            share = 82 // pp
            _same_but_realizable(out, _solve(L70, engine, first=share - 1, last=share - 1, **kw))
        else:
            _same_but_realizable(out, _solve(L70, engine, **kw))
            assert "layers" in M.why_unrealizable(L70, FLEET, **{**KW, **kw, EMB: True, LOSS: True})
    # without a pipeline, nothing changes
    flags = _solve(L70, engine, pp_size=1, dp_size=8, **{EMB: True, LOSS: True})
    plain = _solve(L70, engine, pp_size=1, dp_size=8)
    for name in ALL_OUT:
        np.testing.assert_array_equal(np.asarray(flags[name]), np.asarray(plain[name]),
                                      err_msg=name)
    # with a stage's layers set too, Megatron-Core's __post_init__ refuses it ("cannot be set
    # at the same time"): priced as the set stages, not realizable, the rule named
    for flag in (EMB, LOSS):
        kw = dict(pp_size=4, dp_size=8)
        both = _solve(L70, engine, first=18, last=22, **kw, **{flag: True})
        set_ = _solve(L70, engine, first=18, last=22, **kw)
        assert bool(set_["realizable"]) and not bool(both["realizable"])
        _same_but_realizable(both, set_)
        assert set(M.why_unrealizable(L70, FLEET, **{**KW, **kw, flag: True,
                                                   "num_layers_in_first_pipeline_stage": 18,
                                                   "num_layers_in_last_pipeline_stage": 22})) == {"layers"}
