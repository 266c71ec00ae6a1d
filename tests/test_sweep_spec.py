"""Spec parsing (sweep.spec): dicts and TOML agree; every refusal says where, what and what came."""

from __future__ import annotations

import json
from pathlib import Path

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
     r"constraints\.max_accelerators: expected a whole number >= 1, but got 0"),
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
])
def test_refusals(change, match):
    with pytest.raises(SpecError, match=match):
        load_spec({**BASE, **change})


def test_refusal_names_the_toml_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('workload = "Llama3_70B"\nfleet = "Training_1K"\n[axes]\ntp_size = []\n')
    with pytest.raises(SpecError, match=rf"{path}: axes\.tp_size: expected at least one value"):
        load_spec(path)
    with pytest.raises(SpecError, match="no such spec file"):
        load_spec(tmp_path / "missing.toml")


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
