"""Spec parsing (sweep.spec): dicts and TOML agree; every refusal says where, what and what came."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import sweep
from sweep import SpecError, divisors, load_spec, powers_of_two

CONFIGS = Path(__file__).resolve().parent.parent / "configs" / "sweeps"
BASE = {"workload": "Llama3_70B", "fleet": "Training_1K"}

TOML = """
name = "small"
workload = "Llama3_70B"
fleet = "Training_1K"
dtype = "float32"
outputs = ["mfu", "memory_footprint"]

[axes]
tp_size = { powers_of_two = 8 }
pp_size = { divisors_of = "layers" }
microbatch_count = { from = 1, to = 8 }
efficiency = { from = 0.3, to = 0.6, num = 4 }
precision = ["bf16", "fp8"]
activation_recomputation = [false, true]

[fixed]
batch_size = 1024
overlap_comm = true

[constraints]
memory_limit = "72 GB"
max_accelerators = 512
"""

DICT = {
    "name": "small",
    "workload": "Llama3_70B",
    "fleet": "Training_1K",
    "dtype": "float32",
    "outputs": ["mfu", "memory_footprint"],
    "axes": {
        "tp_size": {"powers_of_two": 8},
        "pp_size": {"divisors_of": "layers"},
        "microbatch_count": {"from": 1, "to": 8},
        "efficiency": {"from": 0.3, "to": 0.6, "num": 4},
        "precision": ["bf16", "fp8"],
        "activation_recomputation": [False, True],
    },
    "fixed": {"batch_size": 1024, "overlap_comm": True},
    "constraints": {"memory_limit": "72 GB", "max_accelerators": 512},
}


def _same(a, b):
    assert a.dims == b.dims
    assert a.shape == b.shape
    assert [ax.values for ax in a.axes] == [ax.values for ax in b.axes]
    assert dict(a.fixed) == dict(b.fixed)
    assert a.outputs == b.outputs
    assert (a.memory_limit, a.memory_limit_fraction, a.max_accelerators, a.dtype, a.name) == \
        (b.memory_limit, b.memory_limit_fraction, b.max_accelerators, b.dtype, b.name)
    assert json.loads(a.to_json()) == json.loads(b.to_json())


def test_dict_and_toml_agree(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(TOML)
    from_toml, from_dict = load_spec(path), load_spec(DICT)
    _same(from_toml, from_dict)
    assert from_toml.source == str(path)
    assert from_dict.shape == (4, 10, 8, 4, 2, 2)
    assert from_dict.axis("pp_size").values == (1, 2, 4, 5, 8, 10, 16, 20, 40, 80)
    assert from_dict.memory_limit == 72e9
    assert load_spec(from_dict) is from_dict


def test_helpers():
    assert powers_of_two(8) == [1, 2, 4, 8]
    assert powers_of_two(64, low=4) == [4, 8, 16, 32, 64]
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    assert divisors(1) == [1]


@pytest.mark.parametrize("name, size", [("default", 1_000_000), ("calculon_gpt3", 9_000_000),
                                        ("cluster_size", 10_000)])
def test_shipped_configs_parse(name, size):
    spec = load_spec(CONFIGS / f"{name}.toml")
    assert spec.size >= size
    assert all(not axis.is_continuous for axis in spec.axes)
    if name == "calculon_gpt3":
        assert spec.size <= 11_000_000
        assert spec.workload_spec().layers == 96 and spec.fleet_spec().total_accelerators == 1024
    if name == "cluster_size":
        assert "dp_size" in spec.dims and spec.max_accelerators


def test_workload_and_fleet_lists_become_axes():
    spec = load_spec({"workload": ["Llama3_70B", "GPT3"], "fleet": ["Training_1K", "Research_256"],
                      "axes": {"tp_size": [1, 8]}})
    assert spec.dims == ("workload", "fleet", "tp_size")
    assert spec.axis("fleet").values == ("Training_1K", "Research_256")


@pytest.mark.parametrize("change, match", [
    # unknown keys, with a suggestion
    ({"axess": {}}, r"axess: unknown key; did you mean 'axes'\?"),
    ({"axes": {"tp_sise": [1, 2]}}, r"axes\.tp_sise: unknown key; did you mean 'tp_size'\?"),
    ({"fixed": {"batchsize": 4}}, r"fixed\.batchsize: unknown key; did you mean 'batch_size'\?"),
    ({"outputs": ["mfuu"]}, r"outputs\.mfuu: unknown key; did you mean 'mfu'\?"),
    ({"constraints": {"memory_limt": "72 GB"}},
     r"constraints\.memory_limt: unknown key; did you mean 'memory_limit'\?"),
    ({"workload": "Llama3_70"}, r"workload: unknown workload 'Llama3_70'; did you mean"),
    # wrong types
    ({"axes": {"tp_size": [1, "two"]}}, r"axes\.tp_size\[1\]: expected a whole number, but got 'two'"),
    ({"axes": {"overlap_comm": [0, 1]}}, r"axes\.overlap_comm\[0\]: expected true or false, but got 0"),
    ({"fixed": {"batch_size": "big"}}, r"fixed\.batch_size: expected a whole number, but got 'big'"),
    ({"axes": {"tp_size": 8}}, r"axes\.tp_size: expected a list of values or a helper table"),
    ({"dtype": "float16"}, r"dtype: expected float64 or float32, but got 'float16'"),
    ({"constraints": {"max_accelerators": 0}},
     r"constraints\.max_accelerators: expected a whole number from 1 to 2\*\*53 - 1 or \"none\", but got 0"),
    # out of range
    ({"axes": {"zero_stage": [0, 4]}}, r"axes\.zero_stage\[1\]: zero_stage must be .* but got zero_stage=4"),
    ({"fixed": {"efficiency": 1.5}}, r"fixed\.efficiency: efficiency must be .* but got efficiency=1\.5"),
    ({"axes": {"tp_size": [0, 1]}}, r"axes\.tp_size\[0\]: tp_size must be an integer >= 1"),
    # empty axis, duplicate values
    ({"axes": {"tp_size": []}}, r"axes\.tp_size: expected at least one value, but got \[\]"),
    ({"axes": {"tp_size": [1, 2, 2]}}, r"axes\.tp_size: expected distinct values, but got '2 twice"),
    # a knob both fixed and an axis
    ({"axes": {"tp_size": [1, 2]}, "fixed": {"tp_size": 2}},
     r"fixed\.tp_size: expected a knob that is not also an axis, but got 2"),
    # powers_of_two takes the largest value, not a count (6 had quietly given 1, 2, 4)
    ({"axes": {"tp_size": {"powers_of_two": 6}}},
     r"axes\.tp_size\.powers_of_two: expected the largest power of two of the axis \(1, 2, "
     r"\.\.\., N; 4 gives 1, 2, 4\), but got 6"),
    # a minimum of accelerators the fleet cannot reach (it had run, with nothing admissible)
    ({"constraints": {"min_accelerators": 2048}},
     r"constraints\.min_accelerators: expected at most the 1,024 accelerators fleet "
     r"'Training_1K' has \(the layouts take the fleet's size; make dp_size an axis"),
    ({"axes": {"dp_size": [1, 2]}, "constraints": {"min_accelerators": 64, "max_accelerators": 32}},
     r"constraints\.min_accelerators: expected at most max_accelerators \(32\)"),
    # a helper table makes numbers: a switch lists its values (it had run, and crashed in
    # the sweep with a traceback; for a choice knob of the megatron physics too, below)
    ({"axes": {"overlap_comm": {"from": 0, "to": 3, "step": 1}}},
     r"axes\.overlap_comm: expected a list of values \(true, false\): a bool knob takes no "
     r"helper table"),
])
def test_refusals(change, match):
    with pytest.raises(SpecError, match=match):
        load_spec({**BASE, **change})


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("change, match", [
    # booleans where numbers are expected, and the reverse
    ({"fixed": {"batch_size": True}}, r"fixed\.batch_size: expected a whole number, but got True"),
    ({"axes": {"efficiency": [0.5, False]}},
     r"axes\.efficiency\[1\]: expected a number, but got False"),
    ({"fixed": {"is_lora": 1}}, r"fixed\.is_lora: expected true or false, but got 1"),
    # floats where whole numbers are expected (2.0 is 2; 2.5 is not)
    ({"fixed": {"tp_size": 2.5}}, r"fixed\.tp_size: expected a whole number, but got 2\.5"),
    ({"axes": {"pp_size": {"from": 1.5, "to": 8}}},
     r"axes\.pp_size: expected whole-number from and step for an integer knob"),
    # negative and zero counts
    ({"fixed": {"microbatch_count": -4}},
     r"fixed\.microbatch_count: microbatch_count must be an integer >= 1 .* but got "
     r"microbatch_count=-4"),
    ({"axes": {"dp_size": [0, 8]}}, r"axes\.dp_size\[0\]: dp_size must be an integer >= 1"),
    # NaN, inf and numbers too large to be exact
    ({"fixed": {"efficiency": NAN}}, r"fixed\.efficiency: expected a finite number, but got nan"),
    ({"axes": {"congestion_factor": [1.0, INF]}},
     r"axes\.congestion_factor\[1\]: expected a finite number, but got inf"),
    ({"axes": {"tp_size": [1, NAN]}}, r"axes\.tp_size\[1\]: expected a whole number, but got nan"),
    ({"fixed": {"batch_size": 2 ** 63}},
     r"fixed\.batch_size: expected a whole number below 2\*\*53, but got 9223372036854775808"),
    ({"fixed": {"congestion_factor": 10 ** 400}}, r"fixed\.congestion_factor: expected a finite number"),
    ({"axes": {"efficiency": {"from": -INF, "to": 0.9}}},
     r"axes\.efficiency\.from: expected a finite number, but got -inf"),
    ({"constraints": {"memory_limit": NAN}}, r"constraints\.memory_limit: expected a size"),
    ({"constraints": {"memory_limit": "1e400 GB"}},
     r"constraints\.memory_limit: expected a finite size > 0 such as '72 GB', but got '1e400 GB'"),
    ({"constraints": {"memory_limit": "-5 GB"}}, r"constraints\.memory_limit: expected a finite size > 0"),
    ({"constraints": {"max_accelerators": 2 ** 60}},
     r"constraints\.max_accelerators: expected a whole number from 1 to 2\*\*53 - 1"),
    # strings where numbers are expected, lists where scalars are, nested tables
    ({"fixed": {"seq_len": "2048"}}, r"fixed\.seq_len: expected a whole number, but got '2048'"),
    ({"fixed": {"seq_len": [2048]}}, r"fixed\.seq_len: expected a whole number, but got \[2048\]"),
    ({"fixed": {"precision": ["bf16"]}}, r"fixed\.precision: expected a precision name"),
    ({"axes": {"tp_size": [[1, 2]]}}, r"axes\.tp_size\[0\]: expected a whole number, but got \[1, 2\]"),
    ({"axes": {"tp_size": {"powers_of_two": {"n": 8}}}},
     r"axes\.tp_size\.powers_of_two: expected a whole number from 1 to 2\*\*53 - 1, but got \{'n': 8\}"),
    ({"axes": {"tp_size": {"from": 1, "to": {"x": 8}}}},
     r"axes\.tp_size\.to: expected a number, but got \{'x': 8\}"),
    ({"axes": {"tp_size": "8"}}, r"axes\.tp_size: expected a list of values or a helper table"),
    ({"axes": [1, 2]}, r"axes: expected a table of knob = values, but got \[1, 2\]"),
    ({"outputs": ["mfu", {"a": 1}]}, r"outputs: expected a list of output names \(strings\)"),
    ({"description": ["x"]}, r"description: expected a string, but got \['x'\]"),
    ({"catalog": 5}, r"catalog: expected the path of a catalog TOML file \(a string\), but got 5"),
    # helper tables: one form, bounded
    ({"axes": {"tp_size": {"powers_of_two": 8, "from": 1, "to": 4}}},
     r"axes\.tp_size: expected one form: powers_of_two, divisors_of, or from and to"),
    ({"axes": {"efficiency": {"from": 0.1, "to": 0.9, "step": 0.1, "num": 9}}},
     r"axes\.efficiency: expected one form: .*not both"),
    ({"axes": {"microbatch_count": {"from": 1, "to": 10 ** 15}}},
     r"axes\.microbatch_count: expected at most 1,000,000 values, "
     r"but got \"1,000,000,000,000,000 values from \{'from': 1, 'to': 1000000000000000\}"),
    ({"axes": {"efficiency": {"from": 0.1, "to": 0.9, "num": 10 ** 12}}},
     r"axes\.efficiency\.num: expected a whole number from 1 to 1,000,000"),
    ({"axes": {"tp_size": {"divisors_of": 2 ** 62}}},
     r"axes\.tp_size\.divisors_of: expected 'fleet', 'layers' or a whole number from 1 to 10\*\*12"),
    ({"axes": {"tp_size": {"from": 1, "to": 8, "step": 0}}},
     r"axes\.tp_size\.step: expected a finite number > 0, but got 0"),
    # duplicates after normalization, and the categorical axes
    ({"axes": {"precision": ["bf16", "BF16"]}},
     r"axes\.precision: expected distinct values, but got \"'bf16' twice"),
    ({"axes": {"efficiency": [0.5, 0.50]}}, r"axes\.efficiency: expected distinct values"),
    ({"outputs": ["mfu", "mfu"]}, r"outputs: expected distinct output names, but got 'mfu more than once'"),
    ({"workload": ["GPT3", "GPT3"]}, r"workload: expected distinct workloads, but got \"'GPT3' twice"),
    ({"fleet": []}, r"fleet: expected a fleet name or a list of names, but got \[\]"),
    ({"axes": {"workload": ["GPT3"]}},
     r"axes\.workload: expected a knob name \(several workloads are listed at the top"),
])
def test_refusals_at_the_edges(change, match):
    with pytest.raises(SpecError, match=match):
        load_spec({**BASE, **change})


def test_toml_values_at_the_edges(tmp_path):
    # What TOML itself can say: nan, inf, dates, 64-bit integers, nested inline tables.
    for line, match in [
        ("tp_size = [1, nan]", r"axes\.tp_size\[1\]: expected a whole number, but got nan"),
        ("efficiency = [0.5, inf]", r"axes\.efficiency\[1\]: expected a finite number"),
        ("tp_size = [1979-05-27]", r"axes\.tp_size\[0\]: expected a whole number, but got "
                                   r"datetime\.date\(1979, 5, 27\)"),
        ("seq_len = [9223372036854775807]",
         r"axes\.seq_len\[0\]: expected a whole number below 2\*\*53"),
        ("tp_size = { from = 1, to = { n = 8 } }", r"axes\.tp_size\.to: expected a number"),
        ("overlap_comm = [1, 0]", r"axes\.overlap_comm\[0\]: expected true or false, but got 1"),
    ]:
        path = tmp_path / "edge.toml"
        path.write_text(f'workload = "Llama3_70B"\nfleet = "Training_1K"\n[axes]\n{line}\n')
        with pytest.raises(SpecError, match=rf"^{path}: {match}"):
            load_spec(path)
    with pytest.raises(SpecError, match="cannot read the spec file"):
        load_spec(tmp_path)  # a directory
    (tmp_path / "latin1.toml").write_bytes(b'workload = "caf\xe9"\n')
    with pytest.raises(SpecError, match="not valid TOML"):
        load_spec(tmp_path / "latin1.toml")


def test_accepted_edges():
    # Whole floats are whole numbers; the largest exact counts pass; a huge space has an exact size.
    spec = load_spec({**BASE, "fixed": {"tp_size": 8.0, "batch_size": 2 ** 53 - 1},
                      "axes": {"microbatch_count": {"from": 1, "to": 1_000_000}},
                      "constraints": {"max_accelerators": 2 ** 53 - 1}})
    assert spec.fixed["tp_size"] == 8 and isinstance(spec.fixed["tp_size"], int)
    wide = {name: list(range(1, 1001)) for name in ("tp_size", "pp_size", "ep_size", "v_stages",
                                                     "microbatch_count", "seq_len", "batch_size")}
    assert load_spec({**BASE, "axes": wide}).size == 1000 ** 7  # past int64: exact, not wrapped


def test_refusal_names_the_toml_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('workload = "Llama3_70B"\nfleet = "Training_1K"\n[axes]\ntp_size = []\n')
    with pytest.raises(SpecError, match=rf"{path}: axes\.tp_size: expected at least one value"):
        load_spec(path)
    with pytest.raises(SpecError, match="no such spec file"):
        load_spec(tmp_path / "missing.toml")


@pytest.mark.parametrize("name,closest", [("megatron_mo", "megatron_moe"), ("defalt", "default"),
                                          ("configs/sweeps/defaults.toml", "default")])
def test_a_misspelled_spec_name_names_the_built_in_specs_and_the_closest(name, closest, tmp_path,
                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)  # no such file here: the name is read as a built-in spec's
    with pytest.raises(SpecError, match=rf"no such spec file \(built-in specs: .*default.*\); "
                                        rf"did you mean '{closest}'\?"):
        load_spec(name)


def test_continuous_axis_is_refused_by_a_sweep():
    spec = load_spec({**BASE, "axes": {"efficiency": {"from": 0.3, "to": 0.6}}})
    assert spec.axis("efficiency").is_continuous  # a search may sample it
    with pytest.raises(SpecError, match=r"axes\.efficiency: a sweep needs listed values"):
        sweep.run(spec)


def test_space_without_a_valid_split_is_refused():
    with pytest.raises(SpecError, match=r"no point of the space is a valid split: expected "
                                        r"tp_size \* pp_size \* ep_size to divide the fleet's "
                                        r"accelerators: 1024 \(Training_1K\), but the axes give "
                                        r"tp_size \* pp_size \* ep_size in \{9, 15\}"):
        sweep.run({**BASE, "axes": {"tp_size": [3, 5], "pp_size": [3]}})
    with pytest.raises(SpecError, match=r"whole nodes of 8 \(Training_1K\)"):
        sweep.run({**BASE, "axes": {"tp_size": [3, 5], "dp_size": [1, 3]}})


def test_memory_limit_goes_through_the_one_parser():
    from sweep.limits import MemoryLimit

    base = {"workload": "GPT3", "fleet": "Training_1K", "axes": {"tp_size": [1, 2]}}
    fleet = load_spec(base).fleet_spec()
    capacity = fleet.node.accelerator.memory_capacity
    for given, limit, bytes_ in (("72 GB", MemoryLimit(size=72e9), 72e9),
                                 ("64 GiB", MemoryLimit(size=64 * 2.0 ** 30), 64 * 2.0 ** 30),
                                 (0.5, MemoryLimit(fraction=0.5), 0.5 * capacity),
                                 (7.2e10, MemoryLimit(size=7.2e10), 7.2e10),
                                 (None, None, capacity)):
        spec = load_spec({**base, "constraints": {} if given is None else {"memory_limit": given}})
        assert spec.limit == limit and spec.memory_limit_for(fleet) == bytes_
    # A bare number in (1, 1e6) is far more likely to mean GB than bytes: refused, with a hint.
    with pytest.raises(SpecError, match=r"<dict>: constraints\.memory_limit: expected .* but got "
                                        r"80 \(did you mean '80 GB' or the fraction 0\.8\?\)"):
        load_spec({**base, "constraints": {"memory_limit": 80}})
    with pytest.raises(SpecError, match=r"constraints\.memory_limit: expected a bytes quantity"):
        load_spec({**base, "constraints": {"memory_limit": "72 parsecs"}})


def test_physics_asked_for_over_a_spec_of_the_other_model_says_where_it_came_from():
    with pytest.raises(SpecError, match=r"axes\.microbatch_count: expected a knob of the physics "
                                        r"megatron.*; the physics 'megatron' was asked for in "
                                        r"place of the spec's own 'mlsysim' \(--physics"):
        load_spec("default", physics="megatron")


def test_the_readme_spec_runs_as_written(tmp_path):
    """The README's example spec, copied as it stands: it loads, a search finds a layout
    within its limits, and run refuses its continuous axis with a message saying so."""
    import re
    from pathlib import Path

    from sweep.search import search

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = re.search(r"## Specs\n\nOne schema.*?```toml\n(.*?)```", readme, re.S).group(1)
    path = tmp_path / "spec.toml"
    path.write_text(block)
    spec = load_spec(path)
    names = {axis.name for axis in spec.axes}
    assert spec.physics == ("mlsysim",) and {"efficiency", "dp_size"} <= names
    import sweep.analysis  # its comment: a search over efficiency, an assumption, says so
    with pytest.warns(sweep.analysis.JobMixWarning, match=r"axes include efficiency \(it "
                                                         r"describes what the model assumes"):
        result = search(path, seed=0, progress=False)
    best = result.best_params
    n = best["tp_size"] * best["pp_size"] * best["dp_size"]
    assert 64 <= n <= 512 and result.best_value > 0.3
    with pytest.raises(Exception, match="continuous"):
        sweep.run(path)


def test_a_workload_that_is_no_transformer_is_refused_under_megatron(tmp_path):
    """The megatron physics prices transformers only: a spec pricing a CNN, an SSM or a model
    of no stated kind with it is refused at load, naming the entry and its kind (it had
    failed the sweep with the solver's traceback, or priced a CNN as a transformer)."""
    base = {"fleet": "HGX_H100_1K_MC", "axes": {"tp_size": [1, 8]},
            "fixed": {"batch_size": 1024, "seq_len": 4096}}
    one = {**base, "workload": "ResNet50", "physics": "megatron"}
    with pytest.raises(SpecError, match=r"^<dict>: workload: expected a transformer \(kind "
                                        r"'transformer' or 'moe'\) under physics = \"megatron\", "
                                        r"but got 'ResNet50', of kind 'cnn': the megatron physics "
                                        r"prices transformers only; price it with physics = "
                                        r"\"mlsysim\"$"):
        load_spec(one)
    mixed = {**base, "workload": ["Llama3_70B_MC", "Mamba_2_8B"],
             "physics": ["mlsysim", "megatron"]}
    with pytest.raises(SpecError, match=r"workload\[1\]: expected a transformer .* under physics "
                                        r"= \[\"mlsysim\", \"megatron\"\], but got 'Mamba_2_8B', "
                                        r"of kind 'ssm'"):
        load_spec(mixed)
    # --physics megatron over an mlsysim spec of a CNN: the same refusal
    path = tmp_path / "cnn.toml"
    path.write_text('workload = "ResNet50"\nfleet = "HGX_H100_1K_MC"\n[axes]\ntp_size = [1, 8]\n'
                    '[fixed]\nbatch_size = 1024\n')
    assert load_spec(path).workloads["ResNet50"].kind == "cnn"  # mlsysim prices it
    with pytest.raises(SpecError, match=r"cnn\.toml: workload: expected a transformer .* but "
                                        r"got 'ResNet50', of kind 'cnn'"):
        load_spec(path, physics="megatron")
    # under mlsysim alone, and for transformers and MoE under megatron, nothing changes
    assert load_spec({**mixed, "physics": "mlsysim"}).physics == ("mlsysim",)
    spec = load_spec({**base, "workload": ["Llama3_70B_MC", "Mixtral_8x7B_MC"],
                      "physics": "megatron"})
    assert [w.kind for w in spec.workloads.values()] == ["transformer", "moe"]


def test_mlsysim_precisions_the_accelerator_lacks_are_warned_of():
    # mlsysim 0.3.0 prices FP8 on an A100 at its headline peak and calls it realizable (so
    # does this model, exact to it): an audit found such layouts ranked without a word.
    import warnings

    import sweep
    spec = {"workload": "Llama3_70B_MC", "fleet": ["Selene_MC", "HGX_H100_1K_MC"],
            "axes": {"precision": ["bf16", "fp8"], "tp_size": [1, 2]},
            "fixed": {"batch_size": 1024}}
    with pytest.warns(sweep.PrecisionWarning) as caught:
        sweep.load_spec(spec)
    messages = [str(w.message) for w in caught if issubclass(w.category, sweep.PrecisionWarning)]
    assert len(messages) == 1 and "fp8 on fleet 'Selene_MC'" in messages[0]
    assert "A100" in messages[0] and "312 TFLOP/s" in messages[0]
    # the H100 has FP8; the megatron physics refuses it itself (realizable False): no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", sweep.PrecisionWarning)
        sweep.load_spec({**spec, "fleet": "HGX_H100_1K_MC"})
        sweep.load_spec({**spec, "fleet": "Selene_MC", "physics": "megatron"})


def test_a_choice_knob_takes_no_helper_table_and_an_array_axis_is_a_list():
    """A choice knob's axis lists its values (a helper table had passed the checks and crashed
    the sweep); an axis given as a numpy array is kept as its list (the spec's JSON record
    had refused it)."""
    base = {"workload": "Llama3_8B_MC", "fleet": "HGX_H100_1K_MC", "physics": "megatron",
            "fixed": {"batch_size": 512}}
    with pytest.raises(SpecError, match=r"axes\.exp_avg_dtype: expected a list of values "
                                        r"\(one of 'fp32', 'fp16', 'bf16', 'fp8'\): a choice knob"):
        load_spec({**base, "axes": {"exp_avg_dtype": {"powers_of_two": 4}}})
    # (recompute_modules' 127 sets by its seven modules, not listed one by one)
    with pytest.raises(SpecError, match=r"axes\.recompute_modules: expected a list of values "
                                        r"\(one or more of 'core_attn', .*'shared_experts' "
                                        r"joined by ',' or '\+'\): a choice knob"):
        load_spec({**base, "axes": {"recompute_modules": {"powers_of_two": 4}}})
    spec = load_spec({**base, "axes": {"exp_avg_dtype": np.array(["fp32", "bf16"]),
                                       "tp_size": np.array([1, 2])}})
    assert spec.axis("exp_avg_dtype").values == ("fp32", "bf16")
    assert '"exp_avg_dtype": ["fp32", "bf16"]' in spec.to_json()


def test_recompute_modules_in_any_order_and_refused_by_name():
    """megatron's recompute_modules takes its modules in any order ("," or "+"), as solve does;
    a name Megatron-Core does not have is refused, naming it."""
    base = {"workload": "Mixtral_8x7B_MC", "fleet": "HGX_H100_1K_MC", "physics": "megatron",
            "fixed": {"batch_size": 512, "recompute": "selective"}}
    spec = load_spec({**base, "axes": {"recompute_modules": ["layernorm,moe_act", " moe_act",
                                                             "core_attn+layernorm"]}})
    assert spec.axis("recompute_modules").values == ("moe_act,layernorm", "moe_act",
                                                     "core_attn,layernorm")
    with pytest.raises(SpecError, match=r"axes\.recompute_modules\[0\]: .*'mlps'"):
        load_spec({**base, "axes": {"recompute_modules": ["mlps"]}})
    with pytest.raises(SpecError, match=r"expected distinct values"):
        load_spec({**base, "axes": {"recompute_modules": ["moe_act,layernorm", "layernorm+moe_act"]}})
