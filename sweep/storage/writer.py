"""A streamed sweep's writer: coordinates the staging directory, the buffer and the assembly."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional

from .. import grid
from ..spec import Spec
from .assemble import COMPLEVEL, assemble
from .atomic import aside, partial_path, remove_dead_asides, replace
from .buffer import BlockBuffer
from .staging import Staging

__all__ = ["StreamWriter"]


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
    block_points : int
        Points per block of a new sweep (a resumed one keeps its own); sets the
        netCDF chunk shape (one block, one chunk). ``max_points`` is a
        deprecated alias.
    resume : bool
        Go on from the blocks staged by an interrupted sweep of the same spec.
        Without it, staged blocks at ``path`` are refused (never discarded).
    small : mapping, optional
        Values of the variables the blocks do not price (:data:`sweep.cube.FROM_SPEC`).
    complevel : int
        zlib level of the data variables of the final file.

    Attributes
    ----------
    block_points : int
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

    def __init__(self, path, cube_layout, *, spec: Spec, block_points: Optional[int] = None,
                 resume: bool = False, small: Optional[Mapping] = None,
                 complevel: int = COMPLEVEL, max_points: Optional[int] = None):
        block_points = grid.points_per_block(block_points, max_points)
        self.path = Path(path)
        self.staging = partial_path(self.path)
        self.layout, self.spec, self.complevel = cube_layout, spec, complevel
        full = cube_layout.priced()  # n_accelerators is staged once, in small
        remove_dead_asides(self.path)
        if self.staging.exists() or self.staging.is_symlink():
            self._staged = Staging.open(self.staging, cube_layout, resume=resume, variables=full)
        else:
            n_blocks = sum(1 for _ in grid.blocks(spec, block_points))
            self._staged = Staging.create(self.staging, cube_layout, spec=spec,
                                          block_points=block_points, n_blocks=n_blocks,
                                          small=dict(small or {}))
        self._buffer = BlockBuffer(full, self._staged.write_blocks)
        self._chunk = next(grid.blocks(spec, self.block_points)).shape

    @property
    def block_points(self) -> int:
        return self._staged.block_points

    @property
    def max_points(self) -> int:
        """Deprecated alias of :attr:`block_points`."""
        grid.warn_renamed("StreamWriter.max_points", "StreamWriter.block_points")
        return self.block_points

    @property
    def n_blocks(self) -> int:
        return self._staged.n_blocks

    @property
    def done(self) -> set:
        return self._staged.done

    def add(self, number: int, index: tuple, values: Mapping) -> None:
        """Stage block ``number`` (its ``index``, a tuple of slices, and its variables).

        Blocks are gathered and written together (see :mod:`sweep.storage.buffer`).
        """
        self._buffer.add(number, index, values)

    def flush(self) -> None:
        """Write the gathered blocks as one staged file (temporary name, fsync, rename)."""
        self._buffer.flush()

    def close(self) -> None:
        """Stage what is gathered (best effort) and let go, leaving the sweep to be resumed."""
        try:
            self.flush()
        except Exception:  # noqa: BLE001 - the caller is already failing; keep its error
            pass
        finally:
            self._staged.release()

    def finalize(self) -> Path:
        """Assemble the staged blocks into ``path`` (atomic) and remove the staging directory."""
        try:
            self.flush()
            missing = self._staged.missing()
            if missing:
                raise RuntimeError(f"cannot assemble {self.path}: blocks {missing[:10]} of "
                                   f"{self.n_blocks} are not staged")
            tmp = aside(self.path)
            try:
                assemble(tmp, self.staging, self.layout, chunk=self._chunk,
                         complevel=self.complevel)
                replace(tmp, self.path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            self._staged.remove()
        finally:
            self._staged.release()
        return self.path
