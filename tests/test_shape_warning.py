"""The megatron physics says when the shape it prices is not the model a workload declares.

It counts from the shape, filling omitted fields with Megatron's defaults, where the mlsysim
physics prices the declared ``parameters``: the catalog's ``Llama3_70B`` (written for mlsysim:
no KV heads, FFN width or vocabulary) was priced as a 64.8B model under physics="megatron",
``DeepSeek_V3`` as 6.4T, and a catalog entry with ``parameters`` 10x its shape's without a word.
"""

import dataclasses
import warnings

import numpy as np
import pytest

import solver
from solver.physics import megatron as M
from solver.physics.megatron import ShapeWarning

CAT = solver.catalog
FL = CAT.fleet("HGX_H100_1K_MC")
KW = dict(physics="megatron", batch_size=1024, seq_len=8192, tp_size=8, pp_size=4,
          sequence_parallel=True)


def test_an_mlsysim_entry_under_megatron_names_its_defaults_and_the_full_entry():
    with pytest.warns(ShapeWarning) as caught:
        solver.solve(CAT.workload("Llama3_70B"), FL, **KW)
    message = str(caught[0].message)
    assert "prices the 64.8B parameters of its shape, 0.92x its declared 70.6B" in message
    assert "kv_heads, ffn_hidden_dim, vocab_size, gated_mlp are not given" in message
    assert message.endswith("the catalog's 'Llama3_70B_MC' has the full shape")
    assert caught[0].filename == __file__  # points at the call
    with pytest.warns(ShapeWarning, match=r"6431\.8B parameters of its shape, 9\.59x its declared "
                                          r"671\.0B.*moe_ffn_hidden_dim.*'DeepSeek_V3_MC'"):
        M.solve(CAT.workload("DeepSeek_V3"), FL, batch_size=1024)


@pytest.mark.parametrize("name", [n for n in CAT.names("workloads") if n.endswith("_MC")])
def test_full_shapes_are_priced_without_a_word(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ShapeWarning)
        out = solver.solve(CAT.workload(name), FL, physics="megatron", batch_size=1024)
    assert np.isfinite(out["model_flops_per_accelerator"])


def test_a_full_shape_whose_declared_count_is_off_10x():
    l8 = CAT.workload("Llama3_8B_MC")
    slip = dataclasses.replace(l8, parameters=80.3e9)
    with pytest.warns(ShapeWarning, match=r"8\.0B parameters of its shape, 0\.10x its declared "
                                          r"80\.3B.*every shape field is given"):
        M.solve(slip, FL, batch_size=1024)
    # within 2x a full shape is its own count (embedding conventions differ): no word
    with warnings.catch_warnings():
        warnings.simplefilter("error", ShapeWarning)
        M.solve(dataclasses.replace(l8, parameters=1.5 * l8.parameters), FL, batch_size=1024)


def test_no_word_without_a_shape_or_under_the_mlsysim_physics():
    no_shape = dataclasses.replace(CAT.workload("Llama3_70B"), hidden_dim=None, heads=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ShapeWarning)
        M.solve(no_shape, FL, batch_size=1024)  # 12 L h^2 = N: the declared count, by design
        solver.solve(CAT.workload("Llama3_70B"), FL, batch_size=1024)  # mlsysim: declared


def test_counting_a_shape_is_quiet_and_every_entry_point_warns(tmp_path):
    """A calibration file's shape is counted with a placeholder count (its parameters come
    from the count): no warning there (the first version warned "1476493312x its declared
    0M" in notebook 04). solve, prepare and why_unrealizable each say it."""
    from sweep.calibration import read_measurements

    path = tmp_path / "runs.csv"
    path.write_text("layers,hidden_dim,heads,node,num_gpus,tp_size,batch_size,seq_len,step_time_s\n"
                    "24,2048,16,DGX_H100_MC,8,1,64,4096,1.0\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ShapeWarning)
        read_measurements(path)
    wl = CAT.workload("Llama3_70B")
    for call in (lambda: M.prepare(wl, FL, batch_size=1024),
                 lambda: M.why_unrealizable(wl, FL, batch_size=1024)):
        with pytest.warns(ShapeWarning, match="0.92x its declared 70.6B") as caught:
            call()
        assert caught[0].filename == __file__


def _caught(call):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    return result, caught


def test_a_sweep_a_search_and_a_calibration_say_it_once_at_the_call(tmp_path):
    """The blocks, the validity check and the trials each priced the workload: the warning
    came two or more times, from sweep/evaluate.py and sweep/cube.py; a calibration's fit
    said it once an iteration."""
    import sweep

    spec = {"workload": "Llama3_70B", "fleet": "HGX_H100_1K_MC", "physics": "megatron",
            "axes": {"pp_size": [4, 8], "tp_size": [4, 8]},
            "fixed": {"batch_size": 1024, "seq_len": 4096, "dp_size": 4}}
    for call in (lambda: sweep.run(spec), lambda: sweep.search(spec, progress=False)):
        _, caught = _caught(call)
        shape = [w for w in caught if issubclass(w.category, ShapeWarning)]
        assert len(shape) == 1 and shape[0].filename == __file__
        assert not [w for w in caught if issubclass(w.category, solver.physics.UnrealizableWarning)]
    runs = tmp_path / "runs.csv"
    runs.write_text("run_id,workload,fleet,batch_size,seq_len,tp_size,pp_size,dp_size,step_time_s\n"
                    "a,Llama3_70B,EOS_H100_MC,512,4096,8,4,2,30\n"
                    "b,Llama3_70B,EOS_H100_MC,512,4096,8,2,4,31\n")
    _, caught = _caught(lambda: sweep.calibrate(runs, free=["gemm_scale"], loo=False))
    shape = [w for w in caught if issubclass(w.category, ShapeWarning)]
    assert len(shape) == 1 and "'Llama3_70B_MC' has the full shape" in str(shape[0].message)


def test_an_unrealizable_call_says_each_thing_once():
    """Building the unrealizable message ran the shape check again: two ShapeWarnings."""
    _, caught = _caught(lambda: solver.solve(CAT.workload("Llama3_70B"), FL, physics="megatron",
                                             pp_size=3, batch_size=1024, dp_size=4))
    kinds = [w.category for w in caught]
    assert kinds.count(ShapeWarning) == 1
    assert kinds.count(solver.physics.UnrealizableWarning) == 1
    assert all(w.filename == __file__ for w in caught)
