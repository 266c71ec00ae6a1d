"""Cubes on disk: compressed netCDF4 files, written atomically, streamed by blocks.

* :func:`save` writes a cube (``zlib`` level :data:`COMPLEVEL`, byte shuffle) so
  that ``xr.load_dataset`` gives it back identical (bools come back as bools).
* :class:`StreamWriter` creates the file with every dim, coordinate and
  attribute up front and then writes each block into its region
  (``variable[index] = block``), so a sweep larger than memory never holds more
  than a few blocks. It follows xarray's encoding conventions (bools stored as
  ``int8`` with the attribute ``dtype = "bool"``, strings as variable-length
  strings, ``_FillValue = NaN`` for floats), so ``xr.open_dataset`` decodes the
  file exactly like one :func:`save` wrote.
* :func:`open_cube` opens a cube lazily (``chunks=`` for dask).

Every file is written as ``<path>.partial`` in the same directory and renamed
to ``path`` once complete. A streamed sweep that stops early leaves the partial
file with the count of blocks written; ``sweep.run(..., resume=True)`` goes on
from there.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Mapping, Optional

import netCDF4
import numpy as np
import xarray as xr

from . import grid
from .spec import Spec, SpecError

__all__ = ["save", "open_cube", "partial_path", "finished_cube", "StreamWriter", "COMPLEVEL",
           "ENGINE"]

#: zlib compression level of every data variable.
COMPLEVEL = 4
#: The netCDF engine (a declared dependency): compression and region writes.
ENGINE = "netcdf4"
#: Seconds between flushes of a streamed file.
SYNC_SECONDS = 5.0

_DONE = "sweep_partial_blocks_done"
_MAX_POINTS = "sweep_partial_max_points"


def partial_path(path) -> Path:
    """Where a file is written before it is complete: ``<path>.partial``."""
    path = Path(path)
    return path.with_name(path.name + ".partial")


def _compression(complevel: int) -> dict:
    return {"zlib": complevel > 0, "complevel": complevel, "shuffle": complevel > 0}


def save(cube: xr.Dataset, path, *, complevel: int = COMPLEVEL) -> Path:
    """Write ``cube`` to a compressed netCDF4 file, atomically.

    Parameters
    ----------
    cube : xarray.Dataset
    path : str or pathlib.Path
        The file; written as ``<path>.partial`` first, then renamed.
    complevel : int
        zlib level of the data variables (0 for none).

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    path = Path(path)
    tmp = partial_path(path)
    encoding = {name: _compression(complevel) for name, var in cube.data_vars.items()
                if var.ndim > 0}
    try:
        cube.to_netcdf(tmp, engine=ENGINE, format="NETCDF4", encoding=encoding)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    return path


def open_cube(path, *, chunks=None, **kwargs) -> xr.Dataset:
    """Open a cube file lazily (nothing is read until used).

    Parameters
    ----------
    path : str or pathlib.Path
    chunks : optional
        Passed to :func:`xarray.open_dataset`: ``{}`` or a dict of dim -> size
        gives dask arrays (needs dask).
    **kwargs
        More :func:`xarray.open_dataset` arguments.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no cube at {path}"
                                + (f" (an unfinished sweep is at {partial_path(path)})"
                                   if partial_path(path).exists() else ""))
    return xr.open_dataset(path, engine=ENGINE, chunks=chunks, **kwargs)


def finished_cube(path, spec: Spec) -> Optional[xr.Dataset]:
    """The cube at ``path`` if it holds a finished sweep of ``spec``, else None."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        with netCDF4.Dataset(path) as ds:
            same = "spec" in ds.ncattrs() and ds.getncattr("spec") == spec.to_json()
    except OSError:
        return None
    return open_cube(path) if same else None


class StreamWriter:
    """A cube file written block by block.

    Parameters
    ----------
    path : str or pathlib.Path
        The final file; the writer works on ``<path>.partial``.
    cube_layout : sweep.cube.CubeLayout
        Dims, coordinates, variables and attributes of the file.
    spec : Spec
        The sweep (its JSON keys a partial file to its spec for resuming).
    max_points : int
        Points per block; sets the HDF5 chunk shape (one block, one chunk).
    resume : bool
        Reopen an existing partial file of the same spec instead of starting anew.
    small : mapping, optional
        Values of variables that are not full-size (written at creation).
    complevel : int
        zlib level of the data variables.
    """

    def __init__(self, path, cube_layout, *, spec: Spec, max_points: int, resume: bool = False,
                 small: Optional[Mapping] = None, complevel: int = COMPLEVEL):
        self.path = Path(path)
        self.partial = partial_path(self.path)
        self._last_sync = time.monotonic()
        if resume and self.partial.exists():
            self._ds = netCDF4.Dataset(self.partial, "a")
            attrs = self._ds.ncattrs()
            if (_DONE not in attrs or "spec" not in attrs
                    or self._ds.getncattr("spec") != spec.to_json()):
                self._ds.close()
                raise SpecError(f"cannot resume from {self.partial}: it is not an unfinished "
                                f"sweep of spec {spec.name!r} (delete it, or run with "
                                f"resume=False)")
            self.blocks_done = int(self._ds.getncattr(_DONE))
            self.max_points = int(self._ds.getncattr(_MAX_POINTS))
        else:
            self.blocks_done, self.max_points = 0, int(max_points)
            chunk = next(grid.blocks(spec, max_points)).shape
            self._ds = self._create(cube_layout, chunk, dict(small or {}), complevel)
        self._ds.set_auto_maskandscale(False)
        for var in self._ds.variables.values():
            # Each chunk is written once, whole: a cache of one chunk is enough (netCDF's
            # default, up to 64 MB per variable, would only hold written chunks).
            if var.chunking() not in (None, "contiguous"):
                chunk_bytes = int(np.prod(var.chunking())) * var.dtype.itemsize
                var.set_var_chunk_cache(size=chunk_bytes, nelems=7, preemption=1.0)

    def _create(self, cube_layout, chunk, small, complevel):
        ds = netCDF4.Dataset(self.partial, "w", format="NETCDF4")
        try:
            for dim, (values, attrs) in cube_layout.coords.items():
                ds.createDimension(dim, len(values))
                var = _create_variable(ds, dim, (dim,), values.dtype, attrs, None, 0)
                _write(var, slice(None), values)
            for name, spec_var in cube_layout.variables.items():
                full = spec_var.dims == cube_layout.dims
                var = _create_variable(ds, name, spec_var.dims, spec_var.dtype, spec_var.attrs,
                                       chunk if full else None, complevel if full else 0)
                if not full:
                    _write(var, Ellipsis, np.asarray(small[name], dtype=spec_var.dtype))
            ds.setncatts(dict(cube_layout.attrs))
            ds.setncattr(_DONE, 0)
            ds.setncattr(_MAX_POINTS, self.max_points)
        except BaseException:
            ds.close()
            self.partial.unlink(missing_ok=True)
            raise
        return ds

    def write(self, index: tuple, values: Mapping) -> None:
        """Write each variable's block at ``index`` (a tuple of slices)."""
        for name, value in values.items():
            _write(self._ds[name], index, value)

    def checkpoint(self, blocks_done: int) -> None:
        """Record that the first ``blocks_done`` blocks are written (flushed now and then)."""
        self.blocks_done = blocks_done
        self._ds.setncattr(_DONE, blocks_done)
        if time.monotonic() - self._last_sync > SYNC_SECONDS:
            self._ds.sync()
            self._last_sync = time.monotonic()

    def close(self) -> None:
        """Close the partial file, leaving it to be resumed."""
        if self._ds.isopen():
            self._ds.close()

    def finalize(self) -> Path:
        """Drop the bookkeeping, close, and rename the partial file to ``path``."""
        self._ds.sync()  # netCDF-C keeps an attribute changed since the last sync if deleted now
        self._ds.delncattr(_DONE)
        self._ds.delncattr(_MAX_POINTS)
        self.close()
        os.replace(self.partial, self.path)
        return self.path


def _create_variable(ds, name, dims, dtype, attrs, chunk, complevel):
    """A netCDF4 variable encoded the way xarray encodes ``dtype``."""
    attrs = dict(attrs)
    kwargs = {}
    if complevel and dims:
        kwargs.update(_compression(complevel), chunksizes=chunk)
    if dtype == bool:
        stored = np.int8
        attrs["dtype"] = "bool"
    elif dtype.kind in "US":
        stored = str
    else:
        stored = dtype
        if dtype.kind == "f":
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
