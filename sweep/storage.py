"""Cubes on disk: compressed netCDF4 files, written atomically; streamed sweeps that survive kills.

* :func:`save` writes a cube (``zlib`` level :data:`COMPLEVEL`, byte shuffle) so
  that ``xr.load_dataset`` gives it back identical (bools come back as bools).
* A streamed sweep (``sweep.run(spec, path=...)``) stages its work in the
  directory ``<path>.partial/`` (:func:`partial_path`), through a
  :class:`StreamWriter`:

  ``manifest.json``
      The spec (JSON), the block partition (``max_points``, block count) and
      the cube's layout (dims, coordinates, variables, attributes).
  ``small.npz``
      The variables that are not full size (``n_accelerators``).
  ``blocks-000120-000135.npz``
      Finished blocks 120 to 134 (each block's index and its variables),
      written under a temporary name, flushed to disk and renamed: a staged
      file is whole or absent, so finished blocks survive any interruption,
      ``SIGKILL`` included. Blocks are gathered for at most
      :data:`STAGE_SECONDS` or :data:`STAGE_BYTES` before being written.
  ``lock``
      Held (``flock``) by the process writing; a second writer is refused.

  Once every block is staged, the netCDF file is assembled in one streaming
  pass (one block in memory at a time) at ``<path>.tmp-<pid>``, renamed to
  ``path`` (atomic) and the staging directory removed. A sweep stopped at any
  point goes on with ``sweep.run(spec, path=path, resume=True)``: only the
  missing blocks are priced (a stop during assembly only repeats the
  assembly), and the cube is identical to an uninterrupted run's. A resume
  with another spec, block partition or catalog facts is refused.
* The netCDF file follows xarray's encoding conventions (bools stored as
  ``int8`` with the attribute ``dtype = "bool"``, strings as variable-length
  strings, ``_FillValue = NaN`` for floats), so ``xr.open_dataset`` decodes it
  exactly like one :func:`save` wrote.
* A finished cube carries the attribute ``complete = 1``. :func:`open_cube`
  refuses a file without it, or a path where only a staged sweep is, unless
  ``allow_partial=True`` (the dataset then says ``complete = 0``, and the
  analyses of :mod:`sweep.analysis` refuse it unless asked too).

Every write to a final path is atomic: written aside, flushed, then renamed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
import zipfile
from pathlib import Path
from typing import Mapping, Optional

import netCDF4
import numpy as np
import xarray as xr

from . import cube as cube_
from . import grid
from .cube import COMPLETE
from .spec import Spec, SpecError

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no lock (one writer per path is then up to you)
    fcntl = None

__all__ = ["save", "open_cube", "partial_path", "finished_cube", "staged_progress",
           "discard_staged",
           "StreamWriter", "IncompleteCubeError", "COMPLEVEL", "ENGINE", "STAGE_SECONDS",
           "STAGE_BYTES"]

#: zlib compression level of every data variable.
COMPLEVEL = 4
#: The netCDF engine (a declared dependency): compression and region writes.
ENGINE = "netcdf4"
#: Seconds of finished blocks a streamed sweep gathers before staging them (at most this
#: much work is lost to a ``SIGKILL``).
STAGE_SECONDS = 1.0
#: Bytes of finished blocks a streamed sweep gathers at most before staging them.
STAGE_BYTES = 32 << 20

_FORMAT = "layout-sweep staged cube 1"
_MANIFEST = "manifest.json"
_SMALL = "small.npz"
_LOCK = "lock"
_BLOCKS = re.compile(r"^blocks-(\d+)-(\d+)\.npz$")
_ASIDE = re.compile(r"\.tmp-(\d+)(?:-[0-9a-f]+)?$")
#: Attributes that say when a cube was made and from which path, not what it holds.
_WHEN = ("date_created", "history", "spec_source")


class IncompleteCubeError(ValueError):
    """A cube that is not finished (an interrupted sweep), used where a finished one is needed."""


# ------------------------------------------------------------------ paths and files

def partial_path(path) -> Path:
    """Where a streamed sweep stages its blocks until complete: the directory ``<path>.partial``."""
    path = Path(path)
    return path.with_name(path.name + ".partial")


def _aside(path: Path, token: bool = False) -> Path:
    """A temporary name next to ``path``: ``<path>.tmp-<pid>`` (``-<random>`` with token)."""
    suffix = f".tmp-{os.getpid()}" + (f"-{uuid.uuid4().hex[:8]}" if token else "")
    return path.with_name(path.name + suffix)


def _fsync_file(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path) -> None:
    """Persist a rename in ``path`` (best effort: not every system syncs directories)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _replace(tmp: Path, path: Path) -> None:
    """Flush ``tmp`` to disk and rename it to ``path`` (atomic on POSIX and Windows)."""
    _fsync_file(tmp)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _remove_dead_asides(path: Path) -> None:
    """Delete ``<path>.tmp-<pid>`` files and dirs left by processes that no longer run."""
    for leftover in list(path.parent.glob(path.name + ".tmp-*")) + list(
            path.parent.glob(partial_path(path).name + ".tmp-*")):
        match = _ASIDE.search(leftover.name)
        if match and not _alive(int(match[1])):
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)


def _compression(complevel: int) -> dict:
    return {"zlib": complevel > 0, "complevel": complevel, "shuffle": complevel > 0}


# ------------------------------------------------------------------ whole cubes

def save(cube: xr.Dataset, path, *, complevel: int = COMPLEVEL) -> Path:
    """Write ``cube`` to a compressed netCDF4 file, atomically.

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
    path = Path(path)
    tmp = _aside(path, token=True)
    encoding = {name: _compression(complevel) for name, var in cube.data_vars.items()
                if var.ndim > 0}
    try:
        cube.to_netcdf(tmp, engine=ENGINE, format="NETCDF4", encoding=encoding)
        _replace(tmp, path)
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
    if path.is_dir() and (path / _MANIFEST).exists():  # the staging directory itself
        staging, path = path, path.with_name(path.name.removesuffix(".partial"))
        if allow_partial:
            return _preview(staging)
        raise IncompleteCubeError(_unfinished_message(path, staging))
    staging = partial_path(path)
    if not path.exists():
        if staging.is_dir():
            if allow_partial:
                try:
                    return _preview(staging)
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


def discard_staged(path, spec: Spec) -> bool:
    """Remove blocks of ``spec`` still staged for ``path`` (left when a kill came between
    the final rename and the clean-up). Returns True if something was removed."""
    staging = partial_path(path)
    if not staging.is_dir():
        return False
    try:
        manifest = _read_manifest(staging)
    except IncompleteCubeError:
        return False
    if manifest.get("spec") != spec.to_json():
        return False
    fd = None
    if fcntl is not None:
        fd = os.open(staging / _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False  # being written: not ours to remove
    try:
        shutil.rmtree(staging, ignore_errors=True)
    finally:
        if fd is not None:
            os.close(fd)
    return True


# ------------------------------------------------------------------ layout as JSON

def _jsonable(value):
    if isinstance(value, np.generic):
        return value.item()
    return value


def _layout_json(cube_layout) -> dict:
    return {
        "dims": list(cube_layout.dims),
        "shape": [int(n) for n in cube_layout.shape],
        "coords": {dim: {"values": values.tolist(), "dtype": values.dtype.str,
                         "attrs": {k: _jsonable(v) for k, v in attrs.items()}}
                   for dim, (values, attrs) in cube_layout.coords.items()},
        "variables": {name: {"dims": list(var.dims), "dtype": np.dtype(var.dtype).str,
                             "attrs": {k: _jsonable(v) for k, v in var.attrs.items()}}
                      for name, var in cube_layout.variables.items()},
        "attrs": {k: _jsonable(v) for k, v in cube_layout.attrs.items()},
    }


def _layout_from_json(data) -> "cube_.CubeLayout":
    coords = {dim: (np.array(c["values"], dtype=c["dtype"]), c["attrs"])
              for dim, c in data["coords"].items()}
    variables = {name: cube_.Variable(tuple(v["dims"]), np.dtype(v["dtype"]), v["attrs"])
                 for name, v in data["variables"].items()}
    return cube_.CubeLayout(dims=tuple(data["dims"]), shape=tuple(data["shape"]), coords=coords,
                            variables=variables, attrs=data["attrs"])


def _signature(layout_json: dict) -> dict:
    """What a resumed sweep must share with the staged one: all but when and from where."""
    return {**layout_json, "attrs": {k: v for k, v in layout_json["attrs"].items()
                                     if k not in _WHEN}}


def _differences(old: dict, new: dict) -> str:
    """The parts of two signatures that differ, for a message."""
    parts = []
    for key in ("dims", "shape"):
        if old.get(key) != new.get(key):
            parts.append(f"{key} {old.get(key)} vs {new.get(key)} now")
    for section in ("coords", "variables"):
        names = sorted(set(old.get(section, {})) | set(new.get(section, {})))
        changed = [n for n in names if old.get(section, {}).get(n) != new.get(section, {}).get(n)]
        if changed:
            parts.append(f"{section} {', '.join(changed)}")
    attrs = sorted(set(old.get("attrs", {})) | set(new.get("attrs", {})))
    changed = [a for a in attrs if old.get("attrs", {}).get(a) != new.get("attrs", {}).get(a)]
    if changed:
        parts.append(f"attributes {', '.join(changed)}")
    return "; ".join(parts) or "the staged layout"


# ------------------------------------------------------------------ staged sweeps

def _read_manifest(staging: Path) -> dict:
    try:
        manifest = json.loads((staging / _MANIFEST).read_text())
    except FileNotFoundError:
        raise IncompleteCubeError(f"{staging} is not a staged sweep (no {_MANIFEST}); "
                                  f"delete it") from None
    except ValueError as err:
        raise IncompleteCubeError(f"{staging}/{_MANIFEST} is damaged ({err}); delete "
                                  f"{staging} to start anew") from None
    if not isinstance(manifest, dict) or manifest.get("format") != _FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else manifest
        raise IncompleteCubeError(f"{staging}: expected a staged sweep of format {_FORMAT!r}, "
                                  f"but got {got!r}; delete it to start anew")
    return manifest


def _staged_files(staging: Path) -> list:
    """``[(first, stop, path), ...]`` of the staged block files, by first block."""
    files = []
    for entry in staging.iterdir():
        match = _BLOCKS.match(entry.name)
        if match:
            files.append((int(match[1]), int(match[2]), entry))
    return sorted(files)


def _readable(first: int, stop: int, path: Path, variables) -> bool:
    """A light check that a staged file holds its blocks (its zip directory, not its data)."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
    except (OSError, zipfile.BadZipFile, ValueError):
        return False
    return all(f"b{n}.{name}.npy" in names for n in range(first, stop)
               for name in ("index", *variables))


def staged_progress(staging) -> tuple:
    """``(blocks done, blocks in all)`` of the sweep staged in directory ``staging``."""
    staging = Path(staging)
    manifest = _read_manifest(staging)
    done = set()
    for first, stop, _ in _staged_files(staging):
        done.update(range(first, stop))
    return len(done), int(manifest["n_blocks"])


def _block_slices(index_array) -> tuple:
    return tuple(slice(int(lo), int(hi)) for lo, hi in np.asarray(index_array))


def _preview(staging: Path) -> xr.Dataset:
    """The blocks staged so far as an in-memory cube (``complete = 0``)."""
    manifest = _read_manifest(staging)
    layout = _layout_from_json(manifest["layout"])
    arrays = {name: np.full(layout.shape, np.nan if var.dtype.kind == "f" else 0, var.dtype)
              for name, var in layout.variables.items() if var.dims == layout.dims}
    with np.load(staging / _SMALL) as small:
        for name in small.files:
            arrays[name] = small[name]
    done = 0
    for first, stop, path in _staged_files(staging):
        try:
            archive = np.load(path)
        except (OSError, ValueError, zipfile.BadZipFile):
            continue
        with archive:
            for n in range(first, stop):
                index = _block_slices(archive[f"b{n}.index"])
                for name in arrays:
                    key = f"b{n}.{name}"
                    if key in archive.files:
                        arrays[name][index] = archive[key]
                done += 1
    ds = cube_.to_dataset(layout, arrays)
    ds.attrs.update({COMPLETE: 0, "blocks_done": done, "blocks_total": int(manifest["n_blocks"])})
    return ds


class StreamWriter:
    """A streamed sweep's blocks, staged in ``<path>.partial/`` and assembled at the end.

    Parameters
    ----------
    path : str or pathlib.Path
        The final cube file.
    cube_layout : sweep.cube.CubeLayout
        Dims, coordinates, variables and attributes of the cube.
    spec : Spec
        The sweep (a resume must be of the same spec).
    max_points : int
        Points per block of a new sweep (a resumed one keeps its own); sets the
        netCDF chunk shape (one block, one chunk).
    resume : bool
        Go on from the blocks staged by an interrupted sweep of the same spec.
        Without it, staged blocks at ``path`` are refused (never discarded).
    small : mapping, optional
        Values of the variables that are not full size.
    complevel : int
        zlib level of the data variables of the final file.

    Attributes
    ----------
    max_points : int
        The block partition in use (the staged one when resuming).
    n_blocks : int
    done : set of int
        Numbers of the blocks staged (in :func:`sweep.grid.blocks` order).

    Raises
    ------
    FileExistsError
        If blocks are staged at ``path`` and ``resume`` is False, or another
        process is writing them.
    SpecError
        If ``resume`` is True and the staged sweep is of another spec.
    """

    def __init__(self, path, cube_layout, *, spec: Spec, max_points: int, resume: bool = False,
                 small: Optional[Mapping] = None, complevel: int = COMPLEVEL):
        self.path = Path(path)
        self.staging = partial_path(self.path)
        self.layout = cube_layout
        self.spec = spec
        self.complevel = complevel
        self._full = [n for n, v in cube_layout.variables.items() if v.dims == cube_layout.dims]
        self._lock_fd = None
        self._buffer, self._buffer_bytes, self._last_flush = [], 0, time.monotonic()
        _remove_dead_asides(self.path)
        layout_json = _layout_json(cube_layout)
        if self.staging.exists() or self.staging.is_symlink():
            self._open_staged(layout_json, resume)
        else:
            self._create(layout_json, int(max_points), dict(small or {}))
        self._chunk = next(grid.blocks(spec, self.max_points)).shape

    # -- opening
    def _lock(self, directory: Path) -> None:
        if fcntl is None:
            return
        fd = os.open(directory / _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise FileExistsError(
                f"{self.staging} is being written by another process (pid {holder}): wait for "
                f"it to finish or stop it, then resume") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def _open_staged(self, layout_json: dict, resume: bool) -> None:
        staging = self.staging
        if not staging.is_dir():
            raise FileExistsError(
                f"{staging} is in the way of the staging directory of a streamed sweep (a file "
                f"left by an older version?); delete it to go on")
        manifest = _read_manifest(staging)
        self._lock(staging)
        try:
            same = manifest.get("signature") == _signature(layout_json)
            done, total = staged_progress(staging)
            if not resume:
                if same:
                    advice = ("pass resume=True (--resume on the command line) to go on from "
                              "it, or delete it to start anew")
                else:
                    advice = ("it is of another spec or catalog, so delete it to start anew, "
                              "or write to another path")
                raise FileExistsError(
                    f"{staging} holds an unfinished sweep of spec {manifest.get('spec_name')!r} "
                    f"({done} of {total} blocks done): {advice}")
            if not same:
                differs = _differences(manifest.get("signature", {}), _signature(layout_json))
                raise SpecError(
                    f"cannot resume from {staging}: it is an unfinished sweep of another spec or "
                    f"catalog (differs in {differs}); delete it to start anew, or write to "
                    f"another path")
            self.max_points = int(manifest["max_points"])
            self.n_blocks = int(manifest["n_blocks"])
            self.done = set()
            for entry in staging.iterdir():  # files being written when the writer stopped
                if _ASIDE.search(entry.name):
                    entry.unlink(missing_ok=True)
            for first, stop, path in _staged_files(staging):
                if stop > self.n_blocks or first >= stop or not _readable(
                        first, stop, path, self._full):
                    path.unlink(missing_ok=True)  # damaged: price its blocks again
                else:
                    self.done.update(range(first, stop))
        except BaseException:
            self._unlock()
            raise

    def _create(self, layout_json: dict, max_points: int, small: dict) -> None:
        n_blocks = sum(1 for _ in grid.blocks(self.spec, max_points))
        manifest = {"format": _FORMAT, "spec_name": self.spec.name, "spec": self.spec.to_json(),
                    "max_points": max_points, "n_blocks": n_blocks,
                    "signature": _signature(layout_json), "layout": layout_json}
        # Built aside and renamed: the staging directory always has its manifest.
        building = _aside(self.staging)
        building.mkdir()
        try:
            self._lock(building)
            with open(building / _SMALL, "wb") as fh:
                np.savez(fh, **{name: np.asarray(value) for name, value in small.items()})
            (building / _MANIFEST).write_text(json.dumps(manifest))
            _fsync_file(building / _SMALL)
            _fsync_file(building / _MANIFEST)
            try:
                os.rename(building, self.staging)
            except OSError:
                if not self.staging.exists():
                    raise
                raise FileExistsError(f"{self.staging} was created by another process at the "
                                      f"same time: one sweep per path") from None
            _fsync_dir(self.staging.parent)
        except BaseException:
            self._unlock()
            shutil.rmtree(building, ignore_errors=True)
            raise
        self.max_points, self.n_blocks, self.done = max_points, n_blocks, set()

    # -- writing
    def add(self, number: int, index: tuple, values: Mapping) -> None:
        """Stage block ``number`` (its ``index``, a tuple of slices, and its variables).

        Blocks are gathered and written together every :data:`STAGE_SECONDS`
        (or :data:`STAGE_BYTES`), and whenever the numbers stop being consecutive.
        """
        if self._buffer and number != self._buffer[-1][0] + 1:
            self.flush()
        values = {name: np.asarray(values[name]) for name in self._full}
        self._buffer.append((number, index, values))
        self._buffer_bytes += sum(v.nbytes for v in values.values())
        if (self._buffer_bytes >= STAGE_BYTES
                or time.monotonic() - self._last_flush >= STAGE_SECONDS):
            self.flush()

    def flush(self) -> None:
        """Write the gathered blocks as one staged file (temporary name, fsync, rename)."""
        if not self._buffer:
            return
        first, stop = self._buffer[0][0], self._buffer[-1][0] + 1
        arrays = {}
        for number, index, values in self._buffer:
            arrays[f"b{number}.index"] = np.array([[s.start, s.stop] for s in index],
                                                  dtype=np.int64)
            for name, value in values.items():
                arrays[f"b{number}.{name}"] = value
        target = self.staging / f"blocks-{first:06d}-{stop:06d}.npz"
        tmp = _aside(target)
        try:
            with open(tmp, "wb") as fh:
                np.savez(fh, **arrays)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self.done.update(range(first, stop))
        self._buffer, self._buffer_bytes, self._last_flush = [], 0, time.monotonic()

    def close(self) -> None:
        """Stage what is gathered (best effort) and let go, leaving the sweep to be resumed."""
        try:
            self.flush()
        except Exception:  # noqa: BLE001 - the caller is already failing; keep its error
            pass
        finally:
            self._unlock()

    def finalize(self) -> Path:
        """Assemble the staged blocks into ``path`` (atomic) and remove the staging directory."""
        try:
            self.flush()
            missing = sorted(set(range(self.n_blocks)) - self.done)
            if missing:
                raise RuntimeError(f"cannot assemble {self.path}: blocks {missing[:10]} of "
                                   f"{self.n_blocks} are not staged")
            tmp = _aside(self.path)
            try:
                self._assemble(tmp)
                _replace(tmp, self.path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            shutil.rmtree(self.staging, ignore_errors=True)
        finally:
            self._unlock()
        return self.path

    def _assemble(self, target: Path) -> None:
        """The netCDF file from the staged blocks, one block in memory at a time."""
        layout = self.layout
        ds = netCDF4.Dataset(target, "w", format="NETCDF4")
        try:
            with np.load(self.staging / _SMALL) as small_file:
                small = {name: small_file[name] for name in small_file.files}
            for dim, (values, attrs) in layout.coords.items():
                ds.createDimension(dim, len(values))
                var = _create_variable(ds, dim, (dim,), values.dtype, attrs, None, 0)
                _write(var, slice(None), values)
            for name, spec_var in layout.variables.items():
                full = spec_var.dims == layout.dims
                var = _create_variable(ds, name, spec_var.dims, spec_var.dtype, spec_var.attrs,
                                       self._chunk if full else None,
                                       self.complevel if full else 0)
                if not full:
                    _write(var, Ellipsis, np.asarray(small[name], dtype=spec_var.dtype))
            ds.setncatts({**dict(layout.attrs), COMPLETE: 0})
            ds.set_auto_maskandscale(False)
            for name in self._full:
                var = ds[name]
                if var.chunking() not in (None, "contiguous"):
                    # Each chunk is written once, whole: a cache of one chunk is enough.
                    chunk_bytes = int(np.prod(var.chunking())) * var.dtype.itemsize
                    var.set_var_chunk_cache(size=chunk_bytes, nelems=7, preemption=1.0)
            for first, stop, path in _staged_files(self.staging):
                try:
                    archive = np.load(path)
                except (OSError, ValueError, zipfile.BadZipFile) as err:
                    raise IncompleteCubeError(
                        f"{path} is damaged ({err}); delete it and resume to price its blocks "
                        f"again") from None
                with archive:
                    for n in range(first, stop):
                        index = _block_slices(archive[f"b{n}.index"])
                        for name in self._full:
                            _write(ds[name], index, archive[f"b{n}.{name}"])
            ds.setncattr(COMPLETE, 1)  # last: the file says it is complete once it is
        finally:
            ds.close()


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
