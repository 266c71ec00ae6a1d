"""Context parallelism's exchange kinds in the megatron physics (cp_comm_type, [42] of
solver.physics.megatron): the K/V ring ("p2p", Megatron's default), the all-gathers of K and
V ("all_gather") and Ulysses' all-to-alls of Q, K, V and the output ("a2a"). Held against
closed forms built from solver.network's collectives, the model's own limits (no CP: one
price), the rules Transformer Engine asserts, and the fused kernel (the same bits), on
seeded random layouts across the whole space."""

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from solver import catalog
from solver import network as net
from solver.physics import megatron as M

sys.path.insert(0, str(Path(__file__).parent))
from _megatron_steps import chain  # noqa: E402
from test_fused_megatron import _draw  # noqa: E402

FLEETS = ("HGX_H100_1K_MC", "GB200_NVL72_8_MC", "Selene_MC")
WORKLOADS = ("Llama3_8B_MC", "Llama3_70B_MC", "Mixtral_8x7B_MC", "GPT3_175B_MC")
KINDS = M.CP_COMM_TYPES


def _solve(workload, fleet, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return M.solve(catalog.workload(workload), catalog.fleet(fleet), engine="numpy", **kw)


def _same(a, b):
    for name in M.OUTPUTS:
        np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]), err_msg=name)


def test_the_choices_are_megatron_cores_names():
    assert KINDS == ("p2p", "all_gather", "a2a", "a2a+p2p")
    assert M.DEFAULTS["cp_comm_type"] == "p2p"
    with pytest.raises(ValueError, match="cp_comm_type must be one of 'p2p', 'all_gather', 'a2a', 'a2a[+]p2p'"):
        M.solve(catalog.workload("Llama3_8B_MC"), catalog.fleet("HGX_H100_1K_MC"),
                cp_size=2, cp_comm_type="allgather")


@pytest.mark.parametrize("workload", WORKLOADS + ("DeepSeek_V3_MC",))
def test_without_context_parallelism_the_kind_changes_nothing(workload):
    """At cp_size 1 there is no exchange: every output is the same bits whichever kind is
    named (random layouts of every other knob, three fleets)."""
    rng = np.random.default_rng(420)
    for fleet in FLEETS:
        k = {**_draw(rng, 1500, dp_given=True), "cp_size": 1, "cp_a2a_size": rng.choice([0, 1, 2], 1500)}
        ring = _solve(workload, fleet, **{**k, "cp_comm_type": "p2p"})
        assert np.asarray(ring["valid"]).any()
        for kind in KINDS[1:]:
            _same(_solve(workload, fleet, **{**k, "cp_comm_type": kind}), ring)


def _chain(workload, fleet, **knobs):
    """The steps up to the communication for one layout (scalars), and that layout's."""
    s = chain(workload, fleet, **knobs)
    return s.w, s.sp, s.hw, s.ly, s.cm


@pytest.mark.parametrize("rc", ["none", "selective", "full"])
def test_each_kind_is_its_collectives_in_closed_form(rc):
    """One layer's exchange, forward and backward, against the collectives Transformer
    Engine runs [42], built from solver.network: all_gather gathers K and V (two
    all-gathers of cp times the rank's K or V), and in the backward gathers them again and
    reduce-scatters their gradients; a2a exchanges Q, K, V and the output forward (four
    all-to-alls) and the output, its gradient, dQ, dK, dV backward (five). A recomputed
    core runs the forward's again. 16 bits; inside one NVLink domain (TP 2 x CP 4 of 8)."""
    kw = dict(batch_size=64, seq_len=32768, tp_size=2, cp_size=4, pp_size=1,
              sequence_parallel=True, micro_batch_size=1, recompute=rc)
    for workload in ("Llama3_8B_MC", "Llama3_70B_MC"):
        wl = catalog.workload(workload)
        w, sp, hw, ly, gather = _chain(workload, "HGX_H100_1K_MC", cp_comm_type="all_gather", **kw)
        *_, a2a = _chain(workload, "HGX_H100_1K_MC", cp_comm_type="a2a", **kw)
        assert hw.within(2 * 4, sp.n_acc)
        tokens = 32768 / 4
        head = 2.0 * tokens * (wl.hidden_dim / wl.heads)  # bytes of one head of the rank's tokens
        kv_t, heads_t = wl.kv_heads / 2, wl.heads / 2
        up = dict(bus_bandwidth=hw.up_bw, latency=hw.up_lat)
        lat = float(hw.call_lat)
        ag = net.all_gather_time(4 * kv_t * head, 4, **up) + lat
        rs = net.reduce_scatter_time(4 * kv_t * head, 4, **up) + lat
        again = rc != "none"
        np.testing.assert_allclose(gather.cp_layer_f, 2 * ag, rtol=1e-12)
        np.testing.assert_allclose(gather.cp_layer_b, 2 * ag + 2 * rs + again * 2 * ag, rtol=1e-12)
        np.testing.assert_allclose(gather.cp_total, gather.cp_layer_f + gather.cp_layer_b, rtol=1e-12)

        def x(heads):
            return net.all_to_all_time(heads * head, 4, **up) + lat
        forward = 2 * x(heads_t) + 2 * x(kv_t)
        np.testing.assert_allclose(a2a.cp_layer_f, forward, rtol=1e-12)
        np.testing.assert_allclose(a2a.cp_layer_b, 3 * x(heads_t) + 2 * x(kv_t) + again * forward,
                                   rtol=1e-12)
        # across the fabric: TP 8 fills a node, one CP rank a node, every peer far
        w8, sp8, hw8, ly8, gather8 = _chain(workload, "HGX_H100_1K_MC", cp_comm_type="all_gather",
                                            **{**kw, "tp_size": 8})
        *_, a2a8 = _chain(workload, "HGX_H100_1K_MC", cp_comm_type="a2a", **{**kw, "tp_size": 8})
        assert not hw8.within(8 * 4, sp8.n_acc)
        out = dict(bus_bandwidth=hw8.out_bw, latency=hw8.out_lat)
        kv8 = max(wl.kv_heads / 8, 1.0)
        ag8 = net.all_gather_time(4 * kv8 * head, 4, **out) + lat
        np.testing.assert_allclose(gather8.cp_layer_f, 2 * ag8, rtol=1e-12)
        np.testing.assert_allclose(
            a2a8.cp_layer_f, 2 * (net.all_to_all_time(wl.heads / 8 * head, 4, **out) + lat)
            + 2 * (net.all_to_all_time(kv8 * head, 4, **out) + lat), rtol=1e-12)
        # the ring: cp - 1 sends of K and V, three times that in all (four recomputed)
        *_, ring = _chain(workload, "HGX_H100_1K_MC", cp_comm_type="p2p", **kw)
        send = net.p2p_time(2 * kv_t * head, bandwidth=hw.up_bw, latency=hw.up_lat) + lat
        np.testing.assert_allclose(ring.cp_total, (3 + again) * 3 * send, rtol=1e-12)


def test_the_groups_outside_a_domain_cross_the_fabric():
    """TP 8 fills an HGX node, so a CP group of 4 has one rank a node: every exchange goes
    over the NICs (a fabric far slower than NVLink), and each kind's exchange costs more
    than inside one NVLink rack of 72 (GB200 NVL72), where the same group shares NVLink."""
    kw = dict(batch_size=64, seq_len=65536, tp_size=8, cp_size=4, sequence_parallel=True,
              micro_batch_size=1, dp_size=1)
    for kind in ("all_gather", "a2a"):
        *_, hgx = _chain("Llama3_70B_MC", "HGX_H100_1K_MC", cp_comm_type=kind, **kw)
        w, sp, hw, ly, nvl = _chain("Llama3_70B_MC", "GB200_NVL72_8_MC", cp_comm_type=kind, **kw)
        assert hw.within(32, sp.n_acc)
        assert float(hgx.cp_total) > 3 * float(nvl.cp_total), kind
    # a2a is refused there (8 KV heads over TP 8 leave one a rank), not unpriced
    out = _solve("Llama3_70B_MC", "HGX_H100_1K_MC", cp_comm_type="a2a", **kw)
    assert not bool(out["realizable"]) and float(out["cp_communication_latency"]) > 0


@pytest.mark.parametrize("workload", WORKLOADS)
def test_hierarchical_cp_is_the_ring_or_the_all_to_all_at_its_ends(workload):
    """a2a+p2p with an all-to-all group of one rank is TE's plain ring, and with the whole CP
    group one all-to-all group is plain a2a: every output the same bits (random layouts of
    every other knob, CP 2 to 8, three fleets; no MLA here, which runs a2a+p2p but not a2a)."""
    rng = np.random.default_rng(423)
    for fleet in FLEETS:
        k = {**_draw(rng, 1500, dp_given=True), "cp_size": rng.choice([2, 4, 8], 1500)}
        ring = _solve(workload, fleet, **{**k, "cp_comm_type": "p2p"})
        assert np.asarray(ring["valid"]).sum() > 100
        _same(_solve(workload, fleet, **{**k, "cp_comm_type": "a2a+p2p", "cp_a2a_size": 1}), ring)
        a2a = _solve(workload, fleet, **{**k, "cp_comm_type": "a2a"})
        _same(_solve(workload, fleet, **{**k, "cp_comm_type": "a2a+p2p",
                                         "cp_a2a_size": k["cp_size"]}), a2a)


@pytest.mark.parametrize("rc", ["none", "full"])
def test_hierarchical_cp_in_closed_form(rc):
    """Llama 3 8B at CP 16 over two HGX nodes, in all-to-all groups of 8 (one a node, as
    Megatron-Bridge's hierarchical CP puts a2a "on intra-node links"): the four and five
    all-to-alls over NVLink, then a ring of two groups over the fabric, one send a direction
    (three in all, four recomputed) of the rank's K and V, as large as without the groups."""
    kw = dict(batch_size=32, seq_len=32768, tp_size=1, cp_size=16, dp_size=1, micro_batch_size=1,
              recompute=rc)
    wl = catalog.workload("Llama3_8B_MC")
    w, sp, hw, ly, cm = _chain("Llama3_8B_MC", "HGX_H100_1K_MC", cp_comm_type="a2a+p2p",
                               cp_a2a_size=8, **kw)
    assert not hw.within(16, sp.n_acc)
    head = 2.0 * 32768 / 16 * (wl.hidden_dim / wl.heads)
    lat = float(hw.call_lat)
    up = dict(bus_bandwidth=hw.up_bw, latency=hw.up_lat)

    def x(heads):
        return net.all_to_all_time(heads * head, 8, **up) + lat
    again = rc != "none"
    forward = 2 * x(wl.heads) + 2 * x(wl.kv_heads)
    backward = 3 * x(wl.heads) + 2 * x(wl.kv_heads) + again * forward
    send = net.p2p_time(2 * wl.kv_heads * head, bandwidth=hw.out_bw, latency=hw.out_lat) + lat
    np.testing.assert_allclose(cm.cp_total, forward + backward + (3 + again) * send, rtol=1e-12)
    # the ring's part is exposed only where the attention is shorter than its send
    assert forward <= float(cm.cp_layer_f) <= forward + send
    out = _solve("Llama3_8B_MC", "HGX_H100_1K_MC", cp_comm_type="a2a+p2p", cp_a2a_size=8, **kw)
    assert bool(out["realizable"])
    ring = _solve("Llama3_8B_MC", "HGX_H100_1K_MC", cp_comm_type="p2p", **kw)
    assert float(out["step_latency_total"]) < float(ring["step_latency_total"])
    # one all-to-all group of 16 (plain a2a, refused: 8 KV heads) is slower too
    whole = _solve("Llama3_8B_MC", "HGX_H100_1K_MC", cp_comm_type="a2a+p2p", cp_a2a_size=16, **kw)
    assert float(out["step_latency_total"]) < float(whole["step_latency_total"])
    assert not bool(whole["realizable"])


def test_cp_a2a_size_is_read_under_the_hierarchical_kind_only():
    """Under the other kinds cp_a2a_size changes nothing, at any CP degree (random layouts of
    every knob, sizes past the CP degree and not dividing it too); out of its range it is
    refused by name on either engine."""
    rng = np.random.default_rng(424)
    n = 3 * 4096
    k = {**_draw(rng, n, dp_given=True), "cp_size": rng.choice([1, 2, 4, 8, 16], n)}
    for kind in KINDS[:3]:
        unset = _solve("Mixtral_8x7B_MC", "GB200_NVL72_8_MC", **{**k, "cp_comm_type": kind})
        for size in (1, 3, rng.choice([2, 4, 8, 4095], n)):
            _same(_solve("Mixtral_8x7B_MC", "GB200_NVL72_8_MC",
                         **{**k, "cp_comm_type": kind, "cp_a2a_size": size}), unset)
    wl, fl = catalog.workload("Llama3_8B_MC"), catalog.fleet("HGX_H100_1K_MC")
    for engine in ("numpy", "auto"):
        for bad in (-1, 4096, np.full(n, 4096, dtype=np.int64)):
            with pytest.raises(ValueError, match="cp_a2a_size"):
                M.solve(wl, fl, cp_size=2, cp_comm_type="a2a+p2p", cp_a2a_size=bad,
                        seq_len=np.full(n, 4096), engine=engine)


def test_only_the_ring_hides_behind_the_attention():
    """Megatron-Bridge's table [42]: p2p overlaps, all_gather and a2a do not. At 128k tokens
    on one NVLink domain the ring's sends hide whole behind the attention (nothing exposed),
    while the other two are exposed whole: their cp_communication_latency is their traffic."""
    kw = dict(batch_size=16, seq_len=131072, tp_size=1, cp_size=8, micro_batch_size=1,
              recompute="selective", dp_size=1)
    out = {kind: _solve("Llama3_8B_MC", "HGX_H100_1K_MC", cp_comm_type=kind, **kw)
           for kind in KINDS[:3]}
    assert all(bool(o["realizable"]) for o in out.values())
    assert float(out["p2p"]["cp_communication_latency"]) == 0.0
    for kind in KINDS[1:3]:
        *_, cm = _chain("Llama3_8B_MC", "HGX_H100_1K_MC", cp_comm_type=kind, **kw)
        o = out[kind]
        # the one stage's 32 layers, 16 microbatches, exposed whole
        np.testing.assert_allclose(float(o["cp_communication_latency"]),
                                   32 * 16 * float(cm.cp_layer), rtol=1e-9)
        assert float(o["step_latency_total"]) > float(out["p2p"]["step_latency_total"])


def test_transformer_engines_rules():
    """a2a needs CP to divide each TP rank's heads and KV heads ("The number of attention
    heads needs to be divisible by CP size!"); MLA runs CP with the ring only ("MLA CP
    currently only support KV P2P!") [42]. Neither rule binds at cp_size 1."""
    kw = dict(batch_size=64, seq_len=8192, sequence_parallel=True, micro_batch_size=1, dp_size=2)
    wl, fl = catalog.workload("Llama3_70B_MC"), catalog.fleet("HGX_H100_1K_MC")  # 64 heads, 8 KV
    assert bool(_solve("Llama3_70B_MC", "HGX_H100_1K_MC", tp_size=2, cp_size=4,
                       cp_comm_type="a2a", **kw)["realizable"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        why = M.why_unrealizable(wl, fl, tp_size=2, cp_size=8, cp_comm_type="a2a", **kw)
        assert sorted(why) == ["cp_a2a_heads"]
        assert M.why_unrealizable(wl, fl, tp_size=2, cp_size=8, cp_comm_type="all_gather", **kw) == {}
        ds, dkw = catalog.workload("DeepSeek_V3_MC"), dict(kw, ep_size=8, etp_size=1, tp_size=2,
                                                          dp_size=4)
        for kind in KINDS[1:3]:
            assert sorted(M.why_unrealizable(ds, fl, cp_size=2, cp_comm_type=kind, **dkw)) == [
                "cp_comm_mla"]
            assert M.why_unrealizable(ds, fl, cp_size=1, cp_comm_type=kind, **dkw) == {}
        assert M.why_unrealizable(ds, fl, cp_size=2, cp_comm_type="p2p", **dkw) == {}
        # hierarchical CP: its all-to-all group set, dividing CP and the heads; MLA may run
        # it where a ring is left (one group of all the CP ranks is TE's a2a, refused)
        assert M.why_unrealizable(ds, fl, cp_size=4, cp_comm_type="a2a+p2p", cp_a2a_size=2,
                                  **dkw) == {}
        assert sorted(M.why_unrealizable(ds, fl, cp_size=4, cp_comm_type="a2a+p2p",
                                         cp_a2a_size=4, **dkw)) == ["cp_comm_mla"]
        for size in (0, 3, 16):  # not set; not dividing cp_size 8; past each rank's 8 heads
            assert sorted(M.why_unrealizable(wl, fl, tp_size=1, cp_size=8 if size != 16 else 16,
                                             cp_comm_type="a2a+p2p", cp_a2a_size=size,
                                             **kw)) == ["cp_hierarchy"], size
        assert M.why_unrealizable(wl, fl, tp_size=1, cp_size=8, cp_comm_type="a2a+p2p",
                                  cp_a2a_size=4, **kw) == {}


@pytest.mark.parametrize("workload", WORKLOADS)
def test_all_gather_holds_the_gathered_keys_and_values(workload):
    """all_gather's backward holds K and V gathered whole again, the chunks' gradients
    (the second chunk's spanning the sequence on CP rank 0) and the full-length ones: 3 cp
    times the rank's K and V, 12 mbs s kv_t d bytes whatever the CP degree, on top of the
    ring's buffers; a2a holds what the ring holds (random layouts with
    cp_size > 1 of every other knob; K/V heads kv / tp, at least one)."""
    rng = np.random.default_rng(421)
    wl = catalog.workload(workload)
    for fleet in FLEETS:
        k = {**_draw(rng, 1500, dp_given=True), "cp_size": rng.choice([2, 4, 8], 1500)}
        ring = _solve(workload, fleet, **{**k, "cp_comm_type": "p2p"})
        ok = np.asarray(ring["valid"])
        assert ok.sum() > 100
        kv_t = np.maximum((wl.kv_heads or wl.heads) / k["tp_size"], 1.0)
        extra = 12.0 * k["micro_batch_size"] * k["seq_len"] * kv_t * (wl.hidden_dim / wl.heads)
        gather = _solve(workload, fleet, **{**k, "cp_comm_type": "all_gather"})
        got = np.asarray(gather["memory_communication_buffers"]) - np.asarray(
            ring["memory_communication_buffers"])
        np.testing.assert_allclose(got[ok], extra[ok], rtol=1e-9)
        assert np.all(np.asarray(gather["memory_footprint"])[ok]
                      >= np.asarray(ring["memory_footprint"])[ok])
        a2a = _solve(workload, fleet, **{**k, "cp_comm_type": "a2a"})
        for name in ("memory_footprint", "memory_activations", "memory_communication_buffers"):
            np.testing.assert_array_equal(np.asarray(a2a[name]), np.asarray(ring[name]))


@pytest.mark.parametrize("workload", ("Llama3_70B_MC", "Mixtral_8x7B_MC", "DeepSeek_V3_MC"))
def test_the_fused_kernel_prices_the_other_kinds_beside_it(workload):
    """The fused kernel prices the ring; a flat batch's other kinds at cp_size > 1 are
    priced on the numpy path in the same call, the same bits as engine="numpy" (names as
    an array and as a list, every other knob random)."""
    pytest.importorskip("numba")
    rng = np.random.default_rng(422)
    n = 3 * 4096
    # (the ring half the time: the kernel's own rows, the rest priced beside it)
    k = {**_draw(rng, n, dp_given=True), "cp_size": rng.choice([1, 2, 4, 8], n),
         "cp_comm_type": rng.choice(list(KINDS), n, p=[0.5, 0.5 / 3, 0.5 / 3, 0.5 / 3]),
         "cp_a2a_size": rng.choice([0, 1, 2, 4], n)}
    numpy_ = _solve(workload, "HGX_H100_1K_MC", **k)
    for names in (k["cp_comm_type"], list(k["cp_comm_type"])):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fused = M.solve(catalog.workload(workload), catalog.fleet("HGX_H100_1K_MC"),
                            engine="fused", **dict(k, cp_comm_type=names))
        _same(fused, numpy_)
    other = (np.asarray(k["cp_comm_type"]) != "p2p") & (k["cp_size"] > 1)
    assert np.asarray(numpy_["valid"])[other].sum() > 100


def test_a_cube_sweeps_cp_comm_type_as_an_axis():
    from sweep.evaluate import run
    from sweep.spec import load_spec

    spec = load_spec({"workload": "Llama3_8B_MC", "fleet": "HGX_H100_1K_MC", "physics": "megatron",
                      "fixed": {"batch_size": 64, "seq_len": 131072, "tp_size": 1,
                                "micro_batch_size": 1, "recompute": "selective"},
                      "axes": {"cp_size": [1, 8], "cp_comm_type": ["p2p", "all_gather", "a2a"]}})
    cube = run(spec)
    assert "cp_comm_type" in cube.dims
    assert list(cube["cp_comm_type"].values) == ["p2p", "all_gather", "a2a"]
    assert cube["cp_comm_type"].attrs["long_name"] == M.KNOBS["cp_comm_type"].why
    step = cube["step_latency_total"]
    one = step.sel(cp_size=1).values.ravel()
    assert np.all(one == one[0])  # no CP: one price
    eight = step.sel(cp_size=8)
    assert float(eight.sel(cp_comm_type="p2p")) < float(eight.sel(cp_comm_type="all_gather"))
    assert float(eight.sel(cp_comm_type="p2p")) < float(eight.sel(cp_comm_type="a2a"))


def test_a_measurements_file_states_the_kind_per_run(tmp_path):
    """The calibration CSV reads a cp_comm_type column (names in any case, blank: the ring)
    and refuses a name Megatron-Core's TE would not take, naming line and column."""
    from sweep.calibration import MeasurementError, read_measurements
    header = "run_id,workload,fleet,batch_size,seq_len,tp_size,cp_size,dp_size,cp_comm_type,step_time_s"
    path = tmp_path / "runs.csv"
    path.write_text("\n".join([header, "a,Llama3_8B_MC,EOS_H100_MC,16,65536,1,8,1,A2A,31.0",
                               "b,Llama3_8B_MC,EOS_H100_MC,16,65536,1,8,1,,30.0",
                               "c,Llama3_8B_MC,EOS_H100_MC,16,65536,1,8,1,all_gather,32.0"]) + "\n")
    data = read_measurements(path)
    assert [r.knobs["cp_comm_type"] for r in data.runs] == ["a2a", "p2p", "all_gather"]
    path.write_text(header + "\na,Llama3_8B_MC,EOS_H100_MC,16,65536,1,8,1,allgather,31.0\n")
    with pytest.raises(MeasurementError, match=r"line 2.*cp_comm_type.*all_gather"):
        read_measurements(path)
