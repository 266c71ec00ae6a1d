"""The cube files follow the CF conventions (issue #11.11), checked with UDUNITS-2 (cf-units).

Both writers -- :func:`sweep.save` (xarray) and a sweep streamed to a file
(netCDF4) -- are read back raw with netCDF4 and checked: every ``units``
parses with UDUNITS-2 (``cf_units.Unit``), memory is in ``byte``, boolean data
variables are int8 flag variables (``flag_values = [0, 1]`` of the variable's
type, one ``flag_meanings`` word per value), coordinates have no
``_FillValue``, and :func:`sweep.open_cube` still gives bools.
"""

from __future__ import annotations

import cf_units
import netCDF4
import numpy as np
import pytest
import xarray as xr

import solver
import sweep
from solver.outputs import DERIVED, MEGATRON_ONLY, OUTPUTS

SPEC = {
    "workload": ["Llama3_70B", "Mixtral_8x7B"], "fleet": "Training_1K",
    "axes": {"tp_size": [1, 8], "pp_size": [1, 3, 4], "efficiency": [0.4, 0.5],
             "activation_recomputation": [False, True], "precision": ["bf16", "fp8"]},
    "fixed": {"batch_size": 1024},
}


@pytest.fixture(scope="module", params=["save", "streamed"])
def cube_file(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("cf") / f"{request.param}.nc"
    if request.param == "save":
        sweep.save(sweep.run(SPEC), path)
    else:
        sweep.run(SPEC, path=path, block_points=50).close()
    return path


def test_registry_units_are_udunits():
    from solver.physics import megatron
    for name, output in {**OUTPUTS, **DERIVED, **MEGATRON_ONLY}.items():
        unit = cf_units.Unit(output.units)  # raises ValueError for "B"
        if name.startswith("memory_"):
            assert output.units == "byte" and unit == cf_units.Unit("byte"), name
            assert unit.convert(1.0, "bit") == 8.0
    for name, (units, _) in megatron.OUTPUTS.items():  # the model's own table says the same
        cf_units.Unit(units)
        if name in MEGATRON_ONLY:
            assert units == MEGATRON_ONLY[name].units, name
    with pytest.raises(ValueError):
        cf_units.Unit("B")  # what the cubes said before


def test_every_units_attribute_parses(cube_file):
    with netCDF4.Dataset(cube_file) as ds:
        assert ds.getncattr("Conventions") == "CF-1.8"
        checked = 0
        for name, var in ds.variables.items():
            if "units" in var.ncattrs():
                cf_units.Unit(var.getncattr("units"))
                checked += 1
            elif var.dtype is not str:  # strings (workload, precision) have no units
                assert "flag_meanings" in var.ncattrs(), f"{name}: numbers without units"
        assert checked >= len(OUTPUTS)
        assert ds["memory_footprint"].getncattr("units") == "byte"
        assert ds["step_latency_total"].getncattr("units") == "s"


def test_booleans_are_flag_variables(cube_file):
    with netCDF4.Dataset(cube_file) as ds:
        flags = [n for n, v in ds.variables.items() if "flag_values" in v.ncattrs()]
        assert set(flags) == {"valid", "feasible", "idle_ranks", "realizable",
                              "within_memory_limit", "admissible"}
        for name in flags:
            var = ds[name]
            values = var.getncattr("flag_values")
            assert var.dtype == np.int8 and values.dtype == np.int8, name
            assert values.tolist() == [0, 1], name
            meanings = var.getncattr("flag_meanings").split()
            assert meanings == ["false", "true"] and len(meanings) == len(values), name
            data = var[...]
            assert set(np.unique(np.asarray(data))) <= {0, 1}, name
            assert "_FillValue" not in var.ncattrs(), name


def test_coordinates_have_no_fill_value_and_floats_keep_nan(cube_file):
    with netCDF4.Dataset(cube_file) as ds:
        for dim in ds.dimensions:
            var = ds[dim]
            assert "_FillValue" not in var.ncattrs(), dim
            if var.dtype is not str:
                assert var.getncattr("units") == "1", dim
        assert ds["efficiency"].dtype == np.float64
        assert np.isnan(ds["mfu"].getncattr("_FillValue"))  # NaN: an impossible split (pp 3)
        assert "flag_values" not in ds["activation_recomputation"].ncattrs()


def test_read_back_as_bools_and_identical(cube_file):
    back = sweep.open_cube(cube_file)
    for name in ("valid", "feasible", "realizable", "admissible", "activation_recomputation"):
        assert back[name].dtype == bool, name
    assert back["admissible"].attrs["flag_meanings"] == "false true"
    assert not bool(back["valid"].sel(pp_size=3).any())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SOURCE_DATE_EPOCH", str(_epoch(back)))
        again = sweep.run(SPEC)
    xr.testing.assert_identical(again, back.load())
    back.close()


def _epoch(cube) -> int:
    import datetime

    return int(datetime.datetime.fromisoformat(cube.attrs["date_created"]).timestamp())


def test_units_of_printed_sizes_accept_byte(tmp_path, capsys):
    from sweep.cli.format import _format_value, _value_column

    assert _value_column("memory_weights", "byte")[0] == "memory_weights [GB]"
    assert _format_value("memory_weights", 2.5e9, "byte") == "2.5"
    assert solver.outputs.is_bytes("byte") and solver.outputs.is_bytes("B")
    assert not solver.outputs.is_bytes("s")
