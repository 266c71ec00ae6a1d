"""The cube from its staged blocks: a netCDF4 file in one streaming pass, or a preview in memory.

The file follows xarray's encoding conventions (bools stored as ``int8`` with
the attribute ``dtype = "bool"``, strings as variable-length strings,
``_FillValue = NaN`` for float data variables) and CF's (:mod:`sweep.storage.cf`:
bools are flag variables, coordinates have no ``_FillValue``), so
``xr.open_dataset`` decodes it exactly like one :func:`sweep.storage.save` wrote. It says ``complete = 1`` only once its
last block is written.
"""

from __future__ import annotations

from pathlib import Path

import netCDF4
import numpy as np
import xarray as xr

from .. import cube as cube_
from . import cf
from ..cube import COMPLETE
from .staging import SMALL, layout_from_json, read_manifest, staged_blocks

__all__ = ["assemble", "preview", "compression", "COMPLEVEL"]

#: zlib compression level of every data variable.
COMPLEVEL = 4


def compression(complevel: int) -> dict:
    """netCDF4 (and xarray) encoding of zlib level ``complevel`` (0: none)."""
    return {"zlib": complevel > 0, "complevel": complevel, "shuffle": complevel > 0}


def _small(staging: Path) -> dict:
    with np.load(staging / SMALL) as small:
        return {name: small[name] for name in small.files}


def assemble(target: Path, staging: Path, cube_layout, *, chunk: tuple,
             complevel: int = COMPLEVEL) -> None:
    """Write the netCDF file ``target`` from the blocks staged in ``staging``.

    One block is in memory at a time; each full-size variable is chunked as
    ``chunk`` (one block, one chunk) and compressed at ``complevel``.
    """
    full = cube_layout.priced()
    ds = netCDF4.Dataset(target, "w", format="NETCDF4")
    try:
        _define(ds, cube_layout, _small(staging), chunk, complevel)
        for name in full:
            var = ds[name]
            if var.chunking() not in (None, "contiguous"):
                # Each chunk is written once, whole: a cache of one chunk is enough.
                chunk_bytes = int(np.prod(var.chunking())) * var.dtype.itemsize
                var.set_var_chunk_cache(size=chunk_bytes, nelems=7, preemption=1.0)
        for index, block in staged_blocks(staging):
            for name in full:
                _write(ds[name], index, block[name])
        ds.setncattr(COMPLETE, 1)  # last: the file says it is complete once it is
    finally:
        ds.close()


def _define(ds, cube_layout, small: dict, chunk: tuple, complevel: int) -> None:
    """Dimensions, coordinates, variables (the staged ``small`` ones written) and attributes.

    Every variable the blocks do not price (:meth:`sweep.cube.CubeLayout.priced`) is
    written here from ``small``, whatever dims it spans: ``n_accelerators`` spans every
    dim where each axis is a split knob, and no block writes it.
    """
    for dim, (values, attrs) in cube_layout.coords.items():
        ds.createDimension(dim, len(values))
        var = _create_variable(ds, dim, (dim,), values.dtype, attrs, None, 0, coordinate=True)
        _write(var, slice(None), values)
    priced = cube_layout.priced()
    for name, spec_var in cube_layout.variables.items():
        chunked = spec_var.dims == cube_layout.dims
        var = _create_variable(ds, name, spec_var.dims, spec_var.dtype, spec_var.attrs,
                               chunk if chunked else None, complevel if chunked else 0)
        if name not in priced:
            _write(var, Ellipsis, np.asarray(small[name], dtype=spec_var.dtype))
    ds.setncatts({**dict(cube_layout.attrs), COMPLETE: 0})
    ds.set_auto_maskandscale(False)


def _create_variable(ds, name, dims, dtype, attrs, chunk, complevel, coordinate=False):
    """A netCDF4 variable encoded the way xarray encodes ``dtype``, CF flags on bools.

    Float data variables get ``_FillValue = NaN``; a ``coordinate`` none.
    """
    attrs = dict(attrs)
    kwargs = {}
    if complevel and dims:
        kwargs.update(compression(complevel), chunksizes=chunk)
    if dtype == bool:
        stored = np.int8
        attrs["dtype"] = "bool"
        if not coordinate:
            attrs.update(cf.flag_attrs())
    elif dtype.kind in "US":
        stored = str
    else:
        stored = dtype
        if dtype.kind == "f" and not coordinate:
            kwargs["fill_value"] = np.nan
    var = ds.createVariable(name, stored, dims, **kwargs)
    var.setncatts(attrs)
    return var


def _write(var, index, value):
    value = np.asarray(value)
    if value.dtype == bool:
        value = np.ascontiguousarray(value).view(np.int8)
    elif value.dtype.kind in "US":
        value = value.astype(object)
    var[index] = value


def preview(staging: Path) -> xr.Dataset:
    """The blocks staged so far as an in-memory cube (``complete = 0``).

    Points not yet priced are NaN (False for booleans); unreadable block files
    are skipped (they may be being written).
    """
    manifest = read_manifest(staging)
    layout = layout_from_json(manifest["layout"])
    arrays = {name: np.full(layout.shape, np.nan if layout.variables[name].dtype.kind == "f"
                            else 0, layout.variables[name].dtype)
              for name in layout.priced()}
    arrays.update(_small(staging))
    done = 0
    for index, block in staged_blocks(staging, strict=False):
        for name in arrays:
            if name in block:
                arrays[name][index] = block[name]
        done += 1
    ds = cube_.to_dataset(layout, arrays)
    ds.attrs.update({COMPLETE: 0, "blocks_done": done, "blocks_total": int(manifest["n_blocks"])})
    return ds
