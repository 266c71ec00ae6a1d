"""The TOML catalog against mlsysim 0.3.0's registry, and its error messages."""

import dataclasses
import math
import textwrap

import pytest

from solver import catalog, specs
from solver.catalog import CatalogError
from solver.units import parse_quantity

KINDS = ("accelerators", "nodes", "fabrics", "fleets", "workloads")
MODEL_GROUPS = ("Language", "Vision", "Recommendation", "StateSpace", "GenerativeVision", "Embodied")


# ------------------------------------------------------------- parity

def _entries(group):
    return {n: getattr(group, n) for n in dir(group) if not n.startswith("_") and n != "list"}


@pytest.fixture(scope="module")
def registry():
    """{kind: {registry attribute name: mlsysim object}}."""
    from mlsysim.hardware.registry import Hardware
    from mlsysim.models.registry import Models
    from mlsysim.systems.registry import Systems

    workloads = {}
    for group in MODEL_GROUPS:
        workloads.update(_entries(getattr(Models, group)))
    return {
        "accelerators": {**_entries(Hardware.Cloud), **_entries(Hardware.Workstation)},
        "nodes": _entries(Systems.Nodes),
        "fabrics": _entries(Systems.Fabrics),
        "fleets": _entries(Systems.Clusters),
        "workloads": workloads,
    }


#: Fields the registry does not have, which the catalog may add to a registry entry: read by
#: the megatron physics only (the GPU architecture for hopper_gemm_scale, the measured GEMM
#: plateau), never by mlsysim's.
MEGATRON_ONLY_FIELDS = {"architecture", "gemm_efficiency"}


def _assert_same(ours, theirs, path):
    """Field-by-field: floats to rtol 1e-12, everything else (ints, strings, None-ness) exact."""
    if dataclasses.is_dataclass(ours):
        assert type(ours) is type(theirs), path
        for field in dataclasses.fields(ours):
            if field.name in MEGATRON_ONLY_FIELDS:
                continue
            _assert_same(getattr(ours, field.name), getattr(theirs, field.name), f"{path}.{field.name}")
    elif isinstance(ours, float) or isinstance(theirs, float):
        assert ours is not None and theirs is not None, f"{path}: {ours!r} vs {theirs!r}"
        assert math.isclose(ours, theirs, rel_tol=1e-12, abs_tol=0.0), f"{path}: {ours!r} vs {theirs!r}"
    elif hasattr(ours, "keys"):
        assert sorted(ours) == sorted(theirs), f"{path}: keys {sorted(ours)} vs {sorted(theirs)}"
        for key in ours:
            _assert_same(ours[key], theirs[key], f"{path}[{key!r}]")
    else:
        assert ours == theirs and type(ours) is type(theirs), f"{path}: {ours!r} vs {theirs!r}"


def _registry_names(kind):
    """names() without the extra catalog files' entries (those end in EXTRA_SUFFIX)."""
    return [n for n in catalog.names(kind) if not n.endswith(catalog.EXTRA_SUFFIX)]


@pytest.mark.parametrize("kind", KINDS)
def test_every_entry_matches_mlsysim_registry(kind, registry):
    from solver.adapters import from_mlsysim

    getter = getattr(catalog, kind[:-1])
    for name in _registry_names(kind):
        assert name in registry[kind], f"{kind} {name!r} is not in the mlsysim registry"
        _assert_same(getter(name), from_mlsysim(registry[kind][name]), f"{kind}.{name}")


@pytest.mark.parametrize("kind", KINDS)
def test_names_cover_every_registry_entry(kind, registry):
    assert set(_registry_names(kind)) == set(registry[kind])
    assert catalog.names(kind) == sorted(catalog.names(kind))


@pytest.mark.parametrize("kind", KINDS)
def test_names_list_the_extra_entries(kind):
    assert set(catalog.extra_names(kind)) <= set(catalog.names(kind))
    assert set(catalog.names(kind)) - set(_registry_names(kind)) == set(catalog.extra_names(kind))


def test_workload_kinds_follow_mlsysim_classes(registry):
    expected = {"SparseTransformerWorkload": "moe", "TransformerWorkload": "transformer",
                "CNNWorkload": "cnn", "SSMWorkload": "ssm", "DiffusionWorkload": "diffusion",
                "EmbodiedWorkload": "embodied", "Workload": "generic"}
    for name, obj in registry["workloads"].items():
        assert catalog.workload(name).kind == expected[type(obj).__name__], name


def test_from_mlsysim_refuses_other_types():
    from solver.adapters import from_mlsysim

    with pytest.raises(TypeError, match="got builtins.str"):
        from_mlsysim("H100")


# ------------------------------------------------------------ spot values

def test_spot_values_in_si():
    h100 = catalog.accelerator("H100")
    assert h100.memory_capacity == 80 * 2**30
    assert h100.memory_bandwidth == 3.35e12
    assert h100.precision_flops["int8"] == 1979e12
    assert h100.nvlink_latency == pytest.approx(500e-9)
    assert catalog.node("DGX_H100").intra_node_bandwidth == 450e9
    assert catalog.fabric("InfiniBand_NDR").bandwidth == 400e9 / 8
    assert catalog.fabric("InfiniBand_EDR").latency is None
    fleet = catalog.fleet("Training_1K")
    assert (fleet.count, fleet.total_accelerators) == (128, 1024)
    assert catalog.workload("Llama3_70B").name == "Llama-3.1-70B"


@pytest.mark.parametrize("text, dimension, value", [
    ("80 GiB", "bytes", 80 * 2**30), ("100 GB", "bytes", 1e11),
    ("3.35 TB/s", "bandwidth", 3.35e12), ("400 Gbps", "bandwidth", 5e10),
    ("989 TFLOP/s", "flops", 989e12), ("1979 TOPS", "flops", 1979e12),
    ("5 us", "time", 5e-6), ("5.0 µs", "time", 5e-6), ("500 ns", "time", 5e-7),
    ("0.01 ms", "time", 1e-5), ("700 W", "power", 700.0), ("1.2 kW", "power", 1200.0),
])
def test_parse_quantity(text, dimension, value):
    assert parse_quantity(text, dimension) == pytest.approx(value, rel=1e-15)


@pytest.mark.parametrize("text, dimension, hint", [
    ("80 GB", "time", "'GB' is a bytes unit"),
    ("80", "bytes", "a unit is required"),
    (80, "bytes", "bare number 80"),
    ("3 furlongs", "time", "unknown unit 'furlongs'"),
])
def test_parse_quantity_errors(text, dimension, hint):
    with pytest.raises(ValueError) as err:
        parse_quantity(text, dimension, where="f.toml: X.y")
    message = str(err.value)
    assert message.startswith("f.toml: X.y: expected a")
    assert hint in message
    assert f"units: {', '.join(['s', 'ms'])}" in message if dimension == "time" else "GiB" in message


# ---------------------------------------------------------------- lookups

@pytest.mark.parametrize("getter, wrong, right", [
    (catalog.workload, "Llama3_70b", "Llama3_70B"),
    (catalog.fleet, "Training_1k", "Training_1K"),
    (catalog.accelerator, "H10", "H100"),
    (catalog.fabric, "InfiniBand_NRD", "InfiniBand_NDR"),
    (catalog.node, "DGX-H100", "DGX_H100"),
])
def test_unknown_name_suggests_close_match(getter, wrong, right):
    with pytest.raises(CatalogError, match=f"did you mean '{right}'"):
        getter(wrong)


def test_unknown_kind():
    with pytest.raises(CatalogError, match="did you mean 'fleets'"):
        catalog.names("fleet")


# -------------------------------------------------------------- user files

USER_FILE = """
[fleets.MyFleet]
node = "DGX_H100"          # built-in
count = 16
fabric = "InfiniBand_NDR"  # built-in

[fleets.MyOtherFleet]
node = "MyNode"            # same file
count = 2
fabric = "MyFabric"

[nodes.MyNode]
accelerator = "MyChip"
accelerators_per_node = 4
intra_node_bandwidth = "200 GB/s"

[accelerators.MyChip]
name = "My Chip"
peak_flops = "500 TFLOP/s"
precision_flops = { fp8 = "1 PFLOP/s" }
memory_capacity = "96 GB"
memory_bandwidth = "4 TB/s"

[fabrics.MyFabric]
bandwidth = "800 Gbps"
latency = "2 us"

[workloads.MyModel]
name = "My 13B"
kind = "transformer"
parameters = 13e9
layers = 40
hidden_dim = 5120
heads = 40
"""


def _write(tmp_path, text, name="mine.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_load_file_builds_on_the_shipped_megatron_entries(tmp_path):
    """A user's fleet or node may name the catalog's _MC entries (megatron.toml), not only
    the registry's: 16 DGX H100 of 81,559 MiB (what the device reports), not mlsysim's H100 of
    80 GiB."""
    loaded = catalog.load_file(_write(tmp_path, """
        [nodes.MyNode]
        accelerator = "H100_SXM_MC"
        accelerators_per_node = 4
        intra_node_bandwidth = "450 GB/s"
        [fleets.MyMC]
        node = "DGX_H100_MC"
        count = 16
        fabric = "InfiniBand_NDR"
        source = "test"
        """))
    assert loaded["fleets"]["MyMC"].node == catalog.node("DGX_H100_MC")
    assert loaded["fleets"]["MyMC"].total_accelerators == 128
    assert loaded["nodes"]["MyNode"].accelerator == catalog.accelerator("H100_SXM_MC")
    assert catalog.accelerator("H100_SXM_MC").memory_capacity == 81559 * 2**20


def test_load_file(tmp_path):
    loaded = catalog.load_file(_write(tmp_path, USER_FILE))
    assert set(loaded) == set(KINDS)
    fleet = loaded["fleets"]["MyFleet"]
    assert fleet.node == catalog.node("DGX_H100")
    assert fleet.fabric == catalog.fabric("InfiniBand_NDR")
    assert (fleet.name, fleet.total_accelerators) == ("MyFleet", 128)
    other = loaded["fleets"]["MyOtherFleet"]
    assert other.node.accelerator.name == "My Chip"
    assert other.node.accelerator.peak_for("fp8") == 1e15
    assert other.node.accelerator.memory_capacity == 96e9
    assert other.fabric == specs.Fabric(name="MyFabric", bandwidth=1e11, latency=2e-6)
    assert loaded["workloads"]["MyModel"] == specs.Workload(
        name="My 13B", kind="transformer", parameters=13e9, layers=40, hidden_dim=5120, heads=40)


def _assert_refused(tmp_path, table, needle):
    """load_file refuses the table with a message starting with the file's path."""
    path = _write(tmp_path, table)
    with pytest.raises(CatalogError) as err:
        catalog.load_file(path)
    message = str(err.value)
    assert message.startswith(f"{path}: "), message
    assert needle in message, message


@pytest.mark.parametrize("table, needle", [
    # unknown key
    ('[fleets.F]\nnode = "DGX_H100"\ncount = 2\nfabric = "InfiniBand_NDR"\nnodes = 3\n',
     "fleets.F: unknown key 'nodes'; did you mean 'node'?"),
    # wrong type
    ('[fleets.F]\nnode = "DGX_H100"\ncount = "2"\nfabric = "InfiniBand_NDR"\n',
     "fleets.F.count: expected an integer, but got string '2'"),
    # bad unit
    ('[accelerators.A]\npeak_flops = "1 PFLOP/s"\nmemory_capacity = "80 GiB/s"\n'
     'memory_bandwidth = "3 TB/s"\n',
     "accelerators.A.memory_capacity: expected a bytes quantity"),
    # a bare number where a quantity is needed
    ('[fabrics.X]\nbandwidth = 400\n', "fabrics.X.bandwidth: expected a bandwidth quantity"),
    # missing required key
    ('[accelerators.A]\npeak_flops = "1 PFLOP/s"\nmemory_capacity = "80 GiB"\n',
     "accelerators.A: missing required key 'memory_bandwidth'"),
    # unknown reference
    ('[nodes.N]\naccelerator = "H-100"\naccelerators_per_node = 8\nintra_node_bandwidth = "1 TB/s"\n',
     "nodes.N.accelerator: unknown accelerator 'H-100'; did you mean 'H100'"),
    # unknown top-level table
    ('[fleet.F]\ncount = 1\n', "unknown table [fleet]"),
    # a spec-level check, located
    ('[workloads.W]\nkind = "transformer"\nparameters = 1e9\n', "workloads.W: Workload 'W'"),
    ('[workloads.W]\nkind = "rnn"\nparameters = 1e9\n', "kind must be one of"),
])
def test_load_file_errors_name_file_table_and_key(tmp_path, table, needle):
    _assert_refused(tmp_path, table, needle)


_FLEET = '[fleets.F]\nnode = "DGX_H100"\nfabric = "InfiniBand_NDR"\n'
_FABRIC = '[fabrics.X]\n'
_MODEL = '[workloads.W]\nkind = "transformer"\nlayers = 8\n'


@pytest.mark.parametrize("table, needle", [
    # a fleet of no (or negative) nodes
    (_FLEET + "count = 0\n", "fleets.F: Fleet 'F': count must be an integer >= 1, but got 0"),
    (_FLEET + "count = -8\n", "count must be an integer >= 1, but got -8"),
    # booleans, floats, lists and tables where an integer is expected
    (_FLEET + "count = true\n", "fleets.F.count: expected an integer, but got boolean True"),
    (_FLEET + "count = 2.5\n", "fleets.F.count: expected an integer, but got number 2.5"),
    (_FLEET + "count = [16]\n", "fleets.F.count: expected an integer, but got array [16]"),
    (_FLEET + "count = { n = 16 }\n", "fleets.F.count: expected an integer, but got table"),
    # counts that float64 cannot hold exactly
    (_FLEET + "count = 9223372036854775807\n", "fleets.F.count: expected an integer below 2**53"),
    (_FLEET + "count = 1125899906842624\n",  # 2**50 nodes of 8: 2**53 accelerators
     "fleets.F: expected fewer than 2**53 accelerators in all"),
    # NaN, inf and booleans where a number is expected
    (_FABRIC + 'bandwidth = "1 Gbps"\noversubscription = nan\n',
     "fabrics.X.oversubscription: expected a finite number, but got number nan"),
    (_FABRIC + 'bandwidth = "1 Gbps"\noversubscription = inf\n', "expected a finite number"),
    (_FABRIC + 'bandwidth = "1 Gbps"\noversubscription = true\n',
     "fabrics.X.oversubscription: expected a plain number, but got boolean True"),
    (_MODEL + "parameters = -inf\n", "workloads.W.parameters: expected a finite number"),
    (_MODEL + "parameters = 0\n", "parameters must be > 0, but got 0.0"),
    # quantities out of range
    (_FABRIC + 'bandwidth = "1e400 Gbps"\n',
     "fabrics.X.bandwidth: expected a finite bandwidth quantity, but got string '1e400 Gbps'"),
    (_FABRIC + 'bandwidth = "-5 Gbps"\n', "bandwidth must be > 0"),
    (_FABRIC + 'bandwidth = "nan Gbps"\n', "fabrics.X.bandwidth: expected a bandwidth quantity"),
    (_FABRIC + 'bandwidth = "1 Gbps"\nlatency = "-1 us"\n', "latency must be >= 0"),
    # magnitudes the model's float64 arithmetic would overflow or underflow on
    (_FABRIC + 'bandwidth = "1e-290 Gbps"\n',
     "fabrics.X.bandwidth: expected a bandwidth quantity of magnitude 1e-30 to 1e+30 (SI units) "
     "or 0, but got string '1e-290 Gbps'"),
    (_MODEL + "parameters = 1e300\n",
     "workloads.W.parameters: expected a number of magnitude 1e-30 to 1e+30"),
])
def test_load_file_refuses_values_at_the_edges(tmp_path, table, needle):
    _assert_refused(tmp_path, table, needle)


def test_load_file_unreadable(tmp_path):
    with pytest.raises(CatalogError, match="cannot read the file"):
        catalog.load_file(tmp_path)  # a directory
    path = tmp_path / "latin1.toml"
    path.write_bytes(b"[fleets.F]\nname = \"caf\xe9\"\n")
    with pytest.raises(CatalogError, match="not valid TOML"):
        catalog.load_file(path)
    with pytest.raises(CatalogError, match="no such file"):
        catalog.load_file(tmp_path / "missing.toml")


def test_load_file_bad_toml(tmp_path):
    path = _write(tmp_path, "[fleets.F\n")
    with pytest.raises(CatalogError, match="not valid TOML"):
        catalog.load_file(path)


def test_catalog_dir_override(tmp_path, monkeypatch):
    for kind in KINDS:
        (tmp_path / f"{kind}.toml").write_text("")
    (tmp_path / "fabrics.toml").write_text('[Slow]\nbandwidth = "1 Gbps"\nlatency = "1 ms"\n')
    monkeypatch.setenv("SOLVER_CATALOG_DIR", str(tmp_path))
    catalog._builtin.cache_clear()
    try:
        assert catalog.names("fabrics") == ["Slow"]
        assert catalog.fabric("Slow").bandwidth == 1.25e8
        (tmp_path / "nodes.toml").write_text('[N]\naccelerator = "H100"\n')
        catalog._builtin.cache_clear()
        with pytest.raises(CatalogError, match=f"{tmp_path / 'nodes.toml'}: N: missing required"):
            catalog.names("nodes")
    finally:
        monkeypatch.delenv("SOLVER_CATALOG_DIR")
        catalog._builtin.cache_clear()
