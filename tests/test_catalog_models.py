"""User models no one could build are refused at load, with file, entry, key, expected and got."""

from __future__ import annotations

import pytest

import solver
from solver.catalog import CatalogError

BASE = {"kind": "moe", "parameters": 47e9, "active_parameters": 13e9, "layers": 32,
        "hidden_dim": 4096, "heads": 32, "experts": 8, "active_experts_per_token": 2}


def _write(tmp_path, **fields):
    table = {**BASE, **fields}
    body = "\n".join(f"{k} = {v!r}".replace("'", '"') if isinstance(v, str) else f"{k} = {v!r}"
                     for k, v in table.items() if v is not None)
    path = tmp_path / "mine.toml"
    path.write_text(f"[workloads.Mine]\n{body}\n")
    return path


def test_a_consistent_model_loads(tmp_path):
    loaded = solver.catalog.load_file(_write(tmp_path))
    assert loaded["workloads"]["Mine"].experts == 8


@pytest.mark.parametrize("fields, key, expected, got", [
    ({"active_parameters": 60e9}, "active_parameters", "at most parameters (4.7e+10)", "60000000000.0"),
    ({"active_experts_per_token": 9}, "active_experts_per_token", "at most experts (8)", "9"),
    ({"heads": 24}, "heads", "a divisor of hidden_dim (4096)", "24"),
    ({"kv_heads": 5}, "kv_heads", "a divisor of heads (32)", "5"),
    ({"heads": 8192}, "heads", "at most hidden_dim (4096)", "8192"),
    ({"hidden_dim": 0}, "hidden_dim", ">= 1 for a layered model", "0"),
    ({"experts": 0, "active_experts_per_token": None}, "experts", ">= 1 for a mixture of experts",
     "0"),
])
def test_impossible_models_are_refused_naming_file_entry_key(tmp_path, fields, key, expected,
                                                              got):
    path = _write(tmp_path, **fields)
    with pytest.raises(CatalogError) as err:
        solver.catalog.load_file(path)
    message = str(err.value)
    assert str(path) in message and "workloads.Mine" in message
    assert f"{key} must be {expected}, but got {got}" in message


def test_top_k_without_experts_is_refused():
    with pytest.raises(ValueError, match="active_experts_per_token must be given only with "
                                         "experts, but got 2"):
        solver.Workload(name="x", kind="transformer", parameters=1e9, layers=2,
                        active_experts_per_token=2)


def test_every_catalog_workload_is_consistent():
    for name in solver.catalog.names("workloads"):
        solver.catalog.workload(name)  # raises if not


@pytest.mark.parametrize("name", sorted(n for n in solver.catalog.names("workloads") if n.endswith("_MC")))
def test_megatron_catalog_shapes_count_their_published_parameters(name):
    """Each workload's shape, as the megatron physics reads it, counts the parameters its
    source publishes (within 0.2 %; active ones within 2 % where it states them): a shape
    typo or an attention priced as another kind would show here (DeepSeek-V3 with its
    multi-head latent attention read as 128-wide multi-head attention counted 2.6 % more)."""
    from solver.physics.megatron import _Shape

    workload = solver.catalog.workload(name)
    total, active = _Shape(workload).parameter_counts()
    assert total == pytest.approx(workload.parameters, rel=2e-3)
    if workload.active_parameters:
        assert active == pytest.approx(workload.active_parameters, rel=2e-2)
