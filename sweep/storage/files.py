"""Whole cubes as files: :func:`save` (atomic) and :func:`open_cube` (lazy, refuses unfinished)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import netCDF4
import xarray as xr

from ..cube import COMPLETE
from ..spec import Spec
from . import cf
from .assemble import COMPLEVEL, compression, preview
from .atomic import aside, partial_path, replace, writable_file
from .staging import MANIFEST, IncompleteCubeError, staged_progress

__all__ = ["save", "open_cube", "finished_cube", "ENGINE"]

#: The netCDF engine (a declared dependency): compression and region writes.
ENGINE = "netcdf4"


def save(cube: xr.Dataset, path, *, complevel: int = COMPLEVEL) -> Path:
    """Write ``cube`` to a compressed netCDF4 file, atomically, CF-encoded (:mod:`sweep.storage.cf`).

    Parameters
    ----------
    cube : xarray.Dataset
    path : str or pathlib.Path
        The file; written as ``<path>.tmp-<pid>-<random>`` first, flushed to
        disk, then renamed (a reader never sees half a file).
    complevel : int
        zlib level of the data variables (0 for none).

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    path = writable_file(path)
    tmp = aside(path, token=True)
    encoding = {name: compression(complevel) for name, var in cube.data_vars.items()
                if var.ndim > 0}
    cube, encoding = cf.encode(cube, encoding)  # int8 CF flags on bools, no _FillValue on coords
    try:
        cube.to_netcdf(tmp, engine=ENGINE, format="NETCDF4", encoding=encoding)
        replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _is_complete(attrs) -> bool:
    flag = attrs.get(COMPLETE)
    try:
        return flag is not None and int(flag) == 1
    except (TypeError, ValueError):
        return False


def open_cube(path, *, chunks=None, allow_partial: bool = False, **kwargs) -> xr.Dataset:
    """Open a finished cube file lazily (nothing is read until used).

    Parameters
    ----------
    path : str or pathlib.Path
        A cube file (or the staging directory of an unfinished sweep, with
        ``allow_partial=True``).
    chunks : optional
        Passed to :func:`xarray.open_dataset`: ``{}`` or a dict of dim -> size
        gives dask arrays (needs dask).
    allow_partial : bool
        Open a cube that is not finished instead of refusing it: a file without
        ``complete = 1``, or the blocks staged so far by an interrupted or
        running sweep (read into memory; points not yet priced are NaN, False
        for booleans, so never admissible). The dataset then has
        ``complete = 0`` (and ``blocks_done``/``blocks_total`` for a staged sweep).
    **kwargs
        More :func:`xarray.open_dataset` arguments.

    Raises
    ------
    FileNotFoundError
        If there is neither a cube nor a staged sweep at ``path``.
    IncompleteCubeError
        If the cube is not finished and ``allow_partial`` is False.
    """
    path = Path(path)
    if path.is_dir() and (path / MANIFEST).exists():  # the staging directory itself
        staging, path = path, path.with_name(path.name.removesuffix(".partial"))
        if allow_partial:
            return preview(staging)
        raise IncompleteCubeError(_unfinished_message(path, staging))
    staging = partial_path(path)
    if not path.exists():
        if staging.is_dir():
            if allow_partial:
                try:
                    return preview(staging)
                except FileNotFoundError:
                    if not path.exists():  # else: finished while we read
                        raise
            else:
                raise IncompleteCubeError(_unfinished_message(path, staging))
        else:
            raise FileNotFoundError(f"no cube at {path}")
    ds = xr.open_dataset(path, engine=ENGINE, chunks=chunks, **kwargs)
    if not _is_complete(ds.attrs):
        if not allow_partial:
            ds.close()
            staged = (f"; an unfinished sweep is staged at {staging} (resume it with "
                      f"sweep.run(spec, path=..., resume=True) or --resume)"
                      if staging.is_dir() else "")
            raise IncompleteCubeError(
                f"{path} is not a finished cube: expected the attribute {COMPLETE} = 1 that "
                f"sweep.run and sweep.save write to a finished sweep, but got "
                f"{COMPLETE} = {ds.attrs.get(COMPLETE, 'missing')}{staged}; pass "
                f"allow_partial=True to open it anyway")
        ds.attrs[COMPLETE] = 0
    return ds


def _unfinished_message(path, staging) -> str:
    try:
        done, total = staged_progress(staging)
        progress = f" ({done} of {total} blocks done)"
    except (OSError, ValueError):
        progress = ""
    return (f"no finished cube at {path}: only an unfinished sweep staged at {staging}"
            f"{progress}; resume it (sweep.run(spec, path={str(path)!r}, resume=True), or "
            f"--resume on the command line), or pass allow_partial=True to open the points "
            f"priced so far")


def finished_cube(path, spec: Spec) -> Optional[xr.Dataset]:
    """The cube at ``path`` if it holds a finished sweep of ``spec``, else None."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        with netCDF4.Dataset(path) as ds:
            attrs = {name: ds.getncattr(name) for name in ds.ncattrs()}
    except OSError:
        return None
    if attrs.get("spec") != spec.to_json() or not _is_complete(attrs):
        return None
    return open_cube(path)
