"""The staging directory of a streamed sweep: lock, manifest, block files and the resume check.

``<path>.partial/`` holds

``manifest.json``
    The spec (JSON), the block partition (``block_points``, block count) and
    the cube's layout (dims, coordinates, variables, attributes).
``small.npz``
    The variables taken from the spec, not priced by the blocks (``n_accelerators``,
    whatever dims it spans: :data:`sweep.cube.FROM_SPEC`).
``blocks-000120-000135.npz``
    Finished blocks 120 to 134 (each block's index and its variables), written
    under a temporary name, flushed to disk and renamed: a staged file is whole
    or absent, so finished blocks survive any interruption, ``SIGKILL`` included.
``lock``
    Held (``flock``) by the process writing; a second writer is refused.

A :class:`Staging` is such a directory held by this process, either created
(:meth:`Staging.create`) or opened to go on with (:meth:`Staging.open`, which
refuses a staged sweep of another spec and deletes damaged block files).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import zipfile
from pathlib import Path
from typing import Iterator, Mapping, Optional

import numpy as np

from .. import cube as cube_
from ..spec import Spec, SpecError
from .atomic import aside, fsync_dir, fsync_file, is_aside, partial_path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no lock (one writer per path is then up to you)
    fcntl = None

__all__ = ["Staging", "IncompleteCubeError", "staged_progress", "discard_staged", "read_manifest",
           "staged_blocks", "layout_json", "layout_from_json", "MANIFEST", "SMALL"]

FORMAT = "layout-sweep staged cube 1"
MANIFEST = "manifest.json"
SMALL = "small.npz"
#: zlib level of staged blocks: the fastest (staging is written once and read once;
#: level 6, numpy's savez_compressed, made a 1e8-point streamed sweep 1.7x slower).
STAGE_COMPLEVEL = 1
_LOCK = "lock"
_BLOCKS = re.compile(r"^blocks-(\d+)-(\d+)\.npz$")
#: Attributes that say when a cube was made and from which path, not what it holds.
_WHEN = ("date_created", "history", "spec_source")


class IncompleteCubeError(ValueError):
    """A cube that is not finished (an interrupted sweep), used where a finished one is needed."""


# ------------------------------------------------------------------ the layout as JSON

def _jsonable(value):
    if isinstance(value, np.generic):
        return value.item()
    return value


def layout_json(cube_layout) -> dict:
    """A :class:`sweep.cube.CubeLayout` as JSON-able data (the manifest's ``layout``)."""
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


def layout_from_json(data) -> "cube_.CubeLayout":
    """The :class:`sweep.cube.CubeLayout` that :func:`layout_json` wrote."""
    coords = {dim: (np.array(c["values"], dtype=c["dtype"]), c["attrs"])
              for dim, c in data["coords"].items()}
    variables = {name: cube_.Variable(tuple(v["dims"]), np.dtype(v["dtype"]), v["attrs"])
                 for name, v in data["variables"].items()}
    return cube_.CubeLayout(dims=tuple(data["dims"]), shape=tuple(data["shape"]), coords=coords,
                            variables=variables, attrs=data["attrs"])


def _signature(layout: dict) -> dict:
    """What a resumed sweep must share with the staged one: all but when and from where."""
    return {**layout, "attrs": {k: v for k, v in layout["attrs"].items() if k not in _WHEN}}


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


# ------------------------------------------------------------------ reading a staging directory

def read_manifest(staging: Path) -> dict:
    """The manifest of the staging directory ``staging``.

    Raises
    ------
    IncompleteCubeError
        If it is missing, damaged or of another format.
    """
    try:
        manifest = json.loads((staging / MANIFEST).read_text())
    except FileNotFoundError:
        raise IncompleteCubeError(f"{staging} is not a staged sweep (no {MANIFEST}); "
                                  f"delete it") from None
    except ValueError as err:
        raise IncompleteCubeError(f"{staging}/{MANIFEST} is damaged ({err}); delete "
                                  f"{staging} to start anew") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else manifest
        raise IncompleteCubeError(f"{staging}: expected a staged sweep of format {FORMAT!r}, "
                                  f"but got {got!r}; delete it to start anew")
    return manifest


def _block_points(manifest: dict) -> int:
    # ``max_points``: the key of staging directories written before the rename.
    return int(manifest.get("block_points", manifest.get("max_points")))


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
    manifest = read_manifest(staging)
    done = set()
    for first, stop, _ in _staged_files(staging):
        done.update(range(first, stop))
    return len(done), int(manifest["n_blocks"])


def staged_blocks(staging: Path, *, strict: bool = True) -> Iterator[tuple]:
    """``(index, arrays)`` of every staged block, one block in memory at a time.

    ``index`` is the block's tuple of slices into the cube and ``arrays`` maps
    ``name`` to the block's values (read on access). A file that cannot be read
    raises :class:`IncompleteCubeError` when ``strict``, else is skipped.
    """
    for first, stop, path in _staged_files(staging):
        try:
            archive = np.load(path)
        except (OSError, ValueError, zipfile.BadZipFile) as err:
            if not strict:
                continue
            raise IncompleteCubeError(f"{path} is damaged ({err}); delete it and resume to "
                                      f"price its blocks again") from None
        with archive:
            for n in range(first, stop):
                index = tuple(slice(int(lo), int(hi)) for lo, hi in archive[f"b{n}.index"])
                yield index, _Block(archive, n)


class _Block:
    """The arrays of block ``n`` in an open staged file, read by name."""

    def __init__(self, archive, n: int):
        self._archive, self._n = archive, n

    def __contains__(self, name) -> bool:
        return f"b{self._n}.{name}" in self._archive.files

    def __getitem__(self, name):
        return self._archive[f"b{self._n}.{name}"]


# ------------------------------------------------------------------ the lock

def _lock(directory: Path, staging: Path) -> Optional[int]:
    """Take the lock of ``directory`` (the descriptor; None without ``flock``)."""
    if fcntl is None:
        return None
    fd = os.open(directory / _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise FileExistsError(
            f"{staging} is being written by another process (pid {holder}): wait for it to "
            f"finish or stop it, then resume") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def discard_staged(path, spec: Spec) -> bool:
    """Remove blocks of ``spec`` still staged for ``path`` (left when a kill came between
    the final rename and the clean-up). Returns True if something was removed."""
    staging = partial_path(path)
    if not staging.is_dir():
        return False
    try:
        manifest = read_manifest(staging)
    except IncompleteCubeError:
        return False
    if manifest.get("spec") != spec.to_json():
        return False
    try:
        fd = _lock(staging, staging)
    except FileExistsError:
        return False  # being written: not ours to remove
    try:
        shutil.rmtree(staging, ignore_errors=True)
    finally:
        if fd is not None:
            os.close(fd)
    return True


# ------------------------------------------------------------------ a staging directory held

class Staging:
    """A staging directory held (locked) by this process: from :meth:`create` or :meth:`open`.

    Attributes
    ----------
    directory : pathlib.Path
    block_points : int
        The block partition of the staged sweep.
    n_blocks : int
    done : set of int
        Numbers of the blocks staged.
    """

    def __init__(self, directory: Path, fd: Optional[int], block_points: int, n_blocks: int,
                 done: set):
        self.directory, self._fd = directory, fd
        self.block_points, self.n_blocks, self.done = block_points, n_blocks, done

    @classmethod
    def create(cls, directory: Path, cube_layout, *, spec: Spec, block_points: int,
               n_blocks: int, small: Mapping) -> "Staging":
        """A new staging directory with its manifest and small variables (built aside, renamed).

        Raises
        ------
        FileExistsError
            If another process created ``directory`` at the same time.
        """
        layout = layout_json(cube_layout)
        manifest = {"format": FORMAT, "spec_name": spec.name, "spec": spec.to_json(),
                    "block_points": block_points, "n_blocks": n_blocks,
                    "signature": _signature(layout), "layout": layout}
        # Built aside and renamed: the staging directory always has its manifest.
        building = aside(directory)
        building.mkdir()
        fd = None
        try:
            fd = _lock(building, directory)
            with open(building / SMALL, "wb") as fh:
                np.savez(fh, **{name: np.asarray(value) for name, value in small.items()})
            (building / MANIFEST).write_text(json.dumps(manifest))
            fsync_file(building / SMALL)
            fsync_file(building / MANIFEST)
            try:
                os.rename(building, directory)
            except OSError:
                if not directory.exists():
                    raise
                raise FileExistsError(f"{directory} was created by another process at the "
                                      f"same time: one sweep per path") from None
            fsync_dir(directory.parent)
        except BaseException:
            if fd is not None:
                os.close(fd)
            shutil.rmtree(building, ignore_errors=True)
            raise
        return cls(directory, fd, block_points, n_blocks, set())

    @classmethod
    def open(cls, directory: Path, cube_layout, *, resume: bool, variables) -> "Staging":
        """The staged sweep in ``directory``, to go on with (the resume check).

        Block files being written when the last writer stopped, and damaged
        ones (missing any of ``variables``), are deleted: their blocks are
        priced again.

        Raises
        ------
        FileExistsError
            If ``directory`` is not a directory, if ``resume`` is False, or if
            another process holds it.
        SpecError
            If the staged sweep is of another spec or catalog (another layout).
        """
        if not directory.is_dir():
            raise FileExistsError(
                f"{directory} is in the way of the staging directory of a streamed sweep (a "
                f"file left by an older version?); delete it to go on")
        manifest = read_manifest(directory)
        fd = _lock(directory, directory)
        try:
            _check_resume(directory, manifest, _signature(layout_json(cube_layout)), resume)
            n_blocks = int(manifest["n_blocks"])
            for entry in directory.iterdir():  # files being written when the writer stopped
                if is_aside(entry.name):
                    entry.unlink(missing_ok=True)
            done = set()
            for first, stop, path in _staged_files(directory):
                if stop > n_blocks or first >= stop or not _readable(first, stop, path, variables):
                    path.unlink(missing_ok=True)  # damaged: price its blocks again
                else:
                    done.update(range(first, stop))
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        return cls(directory, fd, _block_points(manifest), n_blocks, done)

    def write_blocks(self, first: int, stop: int, arrays: Mapping) -> None:
        """Stage blocks ``first`` to ``stop - 1`` as one file (temporary name, fsync, rename)."""
        target = self.directory / f"blocks-{first:06d}-{stop:06d}.npz"
        tmp = aside(target)
        try:
            with open(tmp, "wb") as fh:
                _savez_fast(fh, arrays)  # compressed staging (#12.6), at zlib's fastest level
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self.done.update(range(first, stop))

    def missing(self) -> list:
        """Numbers of the blocks not staged yet."""
        return sorted(set(range(self.n_blocks)) - self.done)

    def release(self) -> None:
        """Let go of the lock (the directory stays, to be resumed)."""
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def remove(self) -> None:
        """Delete the directory (its sweep is assembled) and let go of the lock."""
        shutil.rmtree(self.directory, ignore_errors=True)
        self.release()


def _check_resume(directory: Path, manifest: dict, signature: dict, resume: bool) -> None:
    """Refuse to go on from a staged sweep unless asked to, and unless it is of the same layout."""
    same = manifest.get("signature") == signature
    if not resume:
        done, total = staged_progress(directory)
        if same:
            advice = ("pass resume=True (--resume on the command line) to go on from it, or "
                      "delete it to start anew")
        else:
            advice = ("it is of another spec or catalog, so delete it to start anew, or write "
                      "to another path")
        raise FileExistsError(
            f"{directory} holds an unfinished sweep of spec {manifest.get('spec_name')!r} "
            f"({done} of {total} blocks done): {advice}")
    if not same:
        differs = _differences(manifest.get("signature", {}), signature)
        raise SpecError(
            f"cannot resume from {directory}: it is an unfinished sweep of another spec or "
            f"catalog (differs in {differs}); delete it to start anew, or write to another path")


def _savez_fast(handle, arrays) -> None:
    """``np.savez_compressed`` at zlib level :data:`STAGE_COMPLEVEL` (``np.load`` reads it)."""
    with zipfile.ZipFile(handle, "w", compression=zipfile.ZIP_DEFLATED,
                         compresslevel=STAGE_COMPLEVEL, allowZip64=True) as archive:
        for name, value in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)
