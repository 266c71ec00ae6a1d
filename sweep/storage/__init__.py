"""Cubes on disk: compressed netCDF4 files, written atomically; streamed sweeps that survive kills.

* :func:`save` writes a cube (``zlib`` level :data:`COMPLEVEL`, byte shuffle) so
  that ``xr.load_dataset`` gives it back identical (bools come back as bools).
* A streamed sweep (``sweep.run(spec, path=...)``) stages its work in the
  directory ``<path>.partial/`` (:func:`partial_path`) through a
  :class:`StreamWriter`, which coordinates three units:

  :mod:`~sweep.storage.staging`
      The staging directory: its lock (a second writer is refused), its
      manifest (spec, block partition, the cube's layout), its block files
      (each whole or absent: written aside, flushed and renamed, so finished
      blocks survive any interruption, ``SIGKILL`` included) and the resume
      check.
  :mod:`~sweep.storage.buffer`
      Finished blocks gathered for at most :data:`STAGE_SECONDS` or
      :data:`STAGE_BYTES`, then staged as one file.
  :mod:`~sweep.storage.assemble`
      Once every block is staged, the netCDF file in one streaming pass (one
      block in memory at a time) at ``<path>.tmp-<pid>``, renamed to ``path``
      (atomic); the staging directory is then removed.

  A sweep stopped at any point goes on with ``sweep.run(spec, path=path,
  resume=True)``: only the missing blocks are priced (a stop during assembly
  only repeats the assembly), and the cube is identical to an uninterrupted
  run's. A resume with another spec, block partition or catalog facts is refused.
* The netCDF file follows xarray's encoding conventions (bools stored as
  ``int8`` with the attribute ``dtype = "bool"``, strings as variable-length
  strings, ``_FillValue = NaN`` for floats), so ``xr.open_dataset`` decodes it
  exactly like one :func:`save` wrote.
* A finished cube carries the attribute ``complete = 1``. :func:`open_cube`
  refuses a file without it, or a path where only a staged sweep is, unless
  ``allow_partial=True`` (the dataset then says ``complete = 0``, and the
  analyses of :mod:`sweep.analysis` refuse it unless asked too).

Every write to a final path is atomic (:mod:`~sweep.storage.atomic`): written
aside, flushed, then renamed.
"""

from __future__ import annotations

from . import assemble, atomic, buffer, files, staging, writer
from .assemble import COMPLEVEL
from .atomic import partial_path
from .buffer import STAGE_BYTES, STAGE_SECONDS
from .files import ENGINE, finished_cube, open_cube, save
from .staging import IncompleteCubeError, discard_staged, staged_progress
from .writer import StreamWriter

__all__ = ["save", "open_cube", "partial_path", "finished_cube", "staged_progress",
           "discard_staged", "StreamWriter", "IncompleteCubeError", "COMPLEVEL", "ENGINE",
           "STAGE_SECONDS", "STAGE_BYTES"]
