"""The expert tensor-parallel degree (``etp_size``, Megatron-Core's
``expert_tensor_parallel_size``): its default, the expert grid it sets, and the terms it
moves, against values written out here."""

import warnings

import numpy as np
import pytest

from solver import catalog
from solver.physics import megatron as M
from sweep.spec import SpecError, load_spec

MIXTRAL = catalog.workload("Mixtral_8x7B_MC")
H100 = catalog.fleet("HGX_H100_1K_MC")
ENGINES = ["numpy", "fused"]


def _solve(engine, workload=MIXTRAL, fleet=H100, **knobs):
    if engine == "fused":
        pytest.importorskip("numba")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return M.solve(workload, fleet, engine=engine, **knobs)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_default_is_the_dense_tp(engine):
    rng = np.random.default_rng(5)
    n = 2000
    knobs = dict(batch_size=rng.choice([256, 512, 1024], n), seq_len=4096,
                 tp_size=rng.choice([1, 2, 4, 8], n), pp_size=rng.choice([1, 2, 4], n),
                 ep_size=rng.choice([1, 2, 4, 8], n), sequence_parallel=True,
                 recompute=rng.choice(["none", "full"], n), zero_stage=rng.choice([0, 1], n))
    default, given = _solve(engine, **knobs), _solve(engine, etp_size=knobs["tp_size"], **knobs)
    assert default["valid"].any()
    for name in M.OUTPUTS:
        np.testing.assert_array_equal(default[name], given[name], err_msg=name)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_expert_grid_must_tile_the_ranks(engine):
    """etp x ep x pp must divide the world (Megatron-Core's parallel_state raises otherwise):
    at tp 2 and dp 4, 8 ranks a stage hold etp x ep = 8, not 16."""
    out = _solve(engine, batch_size=64, seq_len=4096, tp_size=2, dp_size=4, ep_size=4,
                 sequence_parallel=True, etp_size=np.array([1, 2, 4]))
    assert out["valid"].tolist() == [True, True, False]


@pytest.mark.parametrize("engine", ENGINES)
def test_an_experts_width_splits_evenly_over_its_tp(engine):
    """Qwen3-30B-A3B's experts are 768 wide: 3 ranks split them, 5 cannot."""
    out = _solve(engine, workload=catalog.workload("Qwen3_30B_A3B_MC"), batch_size=60,
                 seq_len=4096, tp_size=1, dp_size=15, ep_size=1, etp_size=np.array([3, 5]))
    assert out["valid"].tolist() == [True, True]
    assert out["realizable"].tolist() == [True, False]


@pytest.mark.parametrize("engine", ENGINES)
def test_experts_split_over_etp_hold_their_share_of_the_weights(engine):
    """At tp 2, Mixtral's experts on etp 1 hold whole experts: 2 bytes x 8 experts / ep 8 x
    32 layers x 3 x 4096 x 14336 more weight bytes than on etp 2, half of them."""
    out = _solve(engine, batch_size=512, seq_len=4096, tp_size=2, ep_size=8,
                 sequence_parallel=True, etp_size=np.array([1, 2]))
    assert out["valid"].all()
    expert_weights = 2 * 8 / 8 * 32 * 3 * 4096 * 14336
    diff = out["memory_weights"][0] - out["memory_weights"][1]
    assert diff == pytest.approx(expert_weights / 2, rel=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_dispatcher_gathers_over_the_expert_tp_group_only(engine):
    """Without EP the dispatcher's one exchange is its all-gather and reduce-scatter of the
    routed copies over the expert TP group: none on etp 1, at tp 2 as at etp 2."""
    out = _solve(engine, batch_size=512, seq_len=4096, tp_size=2, ep_size=1,
                 sequence_parallel=True, etp_size=np.array([1, 2]))
    assert out["valid"].all()
    assert out["ep_communication_latency"][0] == 0.0
    assert out["ep_communication_latency"][1] > 0.0


def test_a_sweep_over_etp_refuses_a_space_with_no_valid_expert_grid(tmp_path):
    path = tmp_path / "etp.toml"
    path.write_text('name = "etp"\nworkload = "Mixtral_8x7B_MC"\nfleet = "HGX_H100_1K_MC"\n'
                    'physics = "megatron"\n[fixed]\nbatch_size = 1024\ntp_size = 1\nep_size = 8\n'
                    '[axes]\netp_size = [3, 5]\n')
    from sweep.cube import check_some_valid
    with pytest.raises(SpecError, match="etp_size \\* ep_size to divide"):
        check_some_valid(load_spec(path))


def test_the_moe_example_spec_sweeps_the_experts_tp():
    import sweep
    spec = load_spec("megatron_moe")
    assert spec.physics == ("megatron",) and "etp_size" in spec.dims
    cube = sweep.run(spec, progress=False)
    assert cube.sizes["etp_size"] == 4 and bool(cube["admissible"].any())
    # every etp value is valid somewhere, and the grid rule leaves some splits invalid
    valid = cube["valid"].any([d for d in cube.dims if d != "etp_size"])
    assert bool(valid.all()) and not bool(cube["valid"].all())
