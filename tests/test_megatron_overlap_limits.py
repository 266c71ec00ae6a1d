"""What the TP overlap, the CP ring and TP's replicated weights can and cannot do (megatron
physics, [37] and [31] of solver.physics.megatron): an audit of 2026-12-06 found the TP
overlap hiding traffic several times longer than the GEMMs beside it, and over the fabric,
the CP ring hidden behind the whole attention core where only one step's share is beside
each send, and the router priced on every token and split over TP."""

import numpy as np
import pytest

from solver import catalog
from solver.megatron_memory import state_bytes
from solver.physics import megatron as M

HGX = catalog.fleet("HGX_H100_1K_MC")
NVL72 = catalog.fleet("GB200_NVL72_8_MC")
LLAMA8 = catalog.workload("Llama3_8B_MC")
ENGINES = ["numpy", "fused"]


@pytest.mark.parametrize("engine", ENGINES)
def test_tp_comm_overlap_needs_the_tp_group_inside_an_nvlink_domain(engine):
    # Transformer Engine's userbuffers reach one NVLink domain: TP 16 on nodes of 8 cannot
    # overlap (it had been priced realizable, 21.2 s -> 9.6 s for GPT-3 175B), TP 8 can.
    gpt = catalog.workload("GPT3_175B_MC")
    k = dict(batch_size=1024, seq_len=2048, tp_size=np.array([8, 16]), pp_size=8,
             sequence_parallel=True, tp_comm_overlap=True, v_stages=1)
    out = M.solve(gpt, HGX, engine=engine, **k)
    assert list(out["realizable"]) == [True, False]
    why = M.why_unrealizable(gpt, HGX, **k)
    assert list(why) == ["tp_comm_overlap_domain"] and list(why["tp_comm_overlap_domain"]) == [False, True]
    # without the overlap TP 16 is realizable (priced over the fabric)
    off = M.solve(gpt, HGX, engine=engine, **{**k, "tp_comm_overlap": False})
    assert list(off["realizable"]) == [True, True]
    # inside one NVL72 rack a TP group of 8 overlaps, one of 16 straddles racks and does not
    rack = M.solve(gpt, NVL72, engine=engine, **{**k, "pp_size": 1, "batch_size": 1152})
    assert list(rack["realizable"]) == [True, False]


@pytest.mark.parametrize("engine", ENGINES)
def test_tp_comm_overlap_hides_no_more_than_the_gemms_beside_it(engine):
    # Short sequences of a small model on TP 8: the TP collectives outlast the GEMMs, so the
    # overlap hides overlap_efficiency of the GEMMs' time, not of the traffic's.
    eta = M.CONSTANTS["overlap_efficiency"]
    k = dict(batch_size=64, seq_len=256, tp_size=8, pp_size=1, dp_size=8,
             sequence_parallel=True, recompute="none", flash_attention=True)
    on = M.solve(LLAMA8, HGX, engine=engine, tp_comm_overlap=True, **k)
    off = M.solve(LLAMA8, HGX, engine=engine, tp_comm_overlap=False, **k)
    traffic = float(off["tp_communication_latency"])
    hidden = traffic - float(on["tp_communication_latency"])
    assert bool(on["realizable"]) and hidden > 0.0
    # the bound binds: less than overlap_efficiency of the traffic hides ...
    assert hidden < 0.9 * eta * traffic
    # ... and never more than overlap_efficiency of the compute beside it
    assert hidden <= eta * float(on["compute_latency"]) * (1 + 1e-12)
    # exactly: eta x (min(forward traffic, G) + min(backward traffic, 2 G)) a layer and
    # microbatch, G the forward GEMMs of the TP-communicating layers ([37]; no recompute)
    from solver.physics import megatron_steps as steps
    w = M._Shape(LLAMA8)
    kn = M._account_stages(w, M._normalize(M._knob_values({**k, "tp_comm_overlap": True}, "t")))
    sp = steps.split(w, HGX, kn)
    hw = steps.hardware(HGX, M.CONSTANTS, kn["precision"])
    ly = steps.layer_times(w, kn, M.CONSTANTS, sp, hw)
    cm = steps.communication(w, kn, M.CONSTANTS, sp, hw, ly)
    gemms, half = float(ly.t_tp_gemms_f), float(cm.tp_total) / 2
    per_layer = eta * (min(half, gemms) + min(half, 2 * gemms))
    assert gemms < half  # the traffic outlasts the GEMMs: the bound binds
    assert hidden == pytest.approx(float(sp.m) * LLAMA8.layers * per_layer, rel=1e-9)
    # where the GEMMs are long (16k tokens) the whole share hides, as before
    k8 = {**k, "seq_len": 16384}
    on8 = M.solve(LLAMA8, HGX, engine=engine, tp_comm_overlap=True, **k8)
    off8 = M.solve(LLAMA8, HGX, engine=engine, tp_comm_overlap=False, **k8)
    assert float(on8["tp_communication_latency"]) == pytest.approx(
        (1 - eta) * float(off8["tp_communication_latency"]), rel=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_cp_ring_hides_each_step_behind_its_share_of_the_attention(engine):
    # Llama3-8B, TP 8 x CP 2 at 8k tokens: the one K/V send outlasts half the attention
    # core beside it, though not the whole core (which the model had hidden it behind: 0).
    k = dict(batch_size=64, seq_len=8192, tp_size=8, cp_size=2, pp_size=1, dp_size=4,
             sequence_parallel=True, flash_attention=True)
    out = {rc: M.solve(LLAMA8, HGX, engine=engine, recompute=rc, **k)
           for rc in ("none", "selective", "full")}
    assert all(bool(o["realizable"]) for o in out.values())
    none, sel, full = (float(out[rc]["cp_communication_latency"]) for rc in ("none", "selective", "full"))
    assert none > 0.0
    # a recomputed core runs its ring again, selective as full: the same forward ring more
    assert sel == pytest.approx(full, rel=1e-12) and sel > none
    # at CP 1 there is no ring
    one = M.solve(LLAMA8, HGX, engine=engine, recompute="selective", **{**k, "cp_size": 1, "dp_size": 8})
    assert float(one["cp_communication_latency"]) == 0.0


@pytest.mark.parametrize("name", ["Llama3_8B_MC", "Qwen3_30B_A3B_MC"])
def test_norms_and_router_weights_are_whole_on_every_tp_rank(name):
    # The weights a rank holds at TP t are A / t + D: D the layers' norms (2h each) and, in
    # an MoE layer, the router (experts x h), which every TP rank holds whole.
    w = catalog.workload(name)
    shape = M._Shape(w)
    k = dict(batch_size=256, seq_len=4096, pp_size=1, dp_size=8, zero_stage=0,
             sequence_parallel=True)
    weights = {t: float(M.solve(w, HGX, tp_size=t, **k)["memory_weights"]) for t in (2, 4)}
    per_param = state_bytes(8, 0)[0]
    replicated = (4 * weights[4] - 2 * weights[2]) / (4 - 2) / per_param
    h = shape.hidden
    # less the two (untied) embedding matrices', whose vocabulary Megatron pads to a multiple
    # of 128 x TP [41], so that they are not A / t either: 2 E(4) - E(2), a rank's entries
    # at TP 2 and 4 (Llama 3's 128,256: 64,128 and 32,128; Qwen3's 151,936: 76,032, 38,016)
    per_rank = {"Llama3_8B_MC": {2: 64_128, 4: 32_128}, "Qwen3_30B_A3B_MC": {2: 76_032, 4: 38_016}}
    emb = {t: per_rank[name][t] * h * 2 for t in (2, 4)}
    replicated -= 2 * emb[4] - emb[2]
    expected = shape.layers * 2 * h + (shape.moe_layers * h * shape.experts if shape.moe else 0)
    assert replicated == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_recomputed_layer_holds_its_forward_while_its_backward_runs(engine):
    # Selective recompute without a fused attention: the backward recomputes a layer's
    # s x s scores and holds them, one layer of one microbatch, beside the checkpoints (10.7
    # GB for Llama3-8B at 8k tokens, TP 1), where the model had counted none. On the one
    # rank of a job without a pipeline that replaces the logits (4.2 GB), freed before.
    from solver.megatron_memory import logits_bytes
    k = dict(batch_size=64, seq_len=8192, tp_size=1, pp_size=1, dp_size=8, micro_batch_size=1)
    act = {(rc, fa): float(M.solve(LLAMA8, HGX, engine=engine, recompute=rc, flash_attention=fa,
                                   **k)["memory_activations"])
           for rc in ("none", "selective") for fa in (True, False)}
    scores = (act["none", False] - act["none", True]) / LLAMA8.layers  # one layer's, stored without recompute
    # the logits and, beside them, the final norm's and the output layer's inputs (4 s h)
    logits = float(logits_bytes(1, 8192, LLAMA8.vocab_size, tp_size=1)) + 4.0 * 8192 * LLAMA8.hidden_dim
    assert scores > logits > 0
    assert act["selective", False] - act["selective", True] == pytest.approx(scores - logits, rel=1e-9)
    # full recompute: every layer's input (2 s b h, the checkpoint) and one layer's whole
    # forward again beside them, where the logits were: L ckpt + max(whole - ckpt, logits)
    layers = LLAMA8.layers
    ckpt = 2.0 * 8192 * LLAMA8.hidden_dim
    mask = 8192.0 * LLAMA8.hidden_dim  # the embedding dropout's mask, a byte an element
    for flash in (True, False):
        whole = (act["none", flash] - logits - mask) / layers  # (no recompute: L whole + logits)
        full = float(M.solve(LLAMA8, HGX, engine=engine, recompute="full", flash_attention=flash,
                             **k)["memory_activations"])
        assert full == pytest.approx(layers * ckpt + mask + max(whole - ckpt, logits), rel=1e-9)


def test_why_unrealizable_takes_catalog_keys_as_solve_does():
    k = dict(batch_size=1024, seq_len=2048, tp_size=np.array([8, 16]), pp_size=8,
             sequence_parallel=True, tp_comm_overlap=True)
    by_key = M.why_unrealizable("GPT3_175B_MC", "HGX_H100_1K_MC", **k)
    by_spec = M.why_unrealizable(catalog.workload("GPT3_175B_MC"), HGX, **k)
    assert list(by_key) == list(by_spec) == ["tp_comm_overlap_domain"]
    assert np.array_equal(by_key["tp_comm_overlap_domain"], by_spec["tp_comm_overlap_domain"])
    with pytest.raises(catalog.CatalogError):
        M.why_unrealizable("GPT3_175B_MCX", "HGX_H100_1K_MC", **k)
