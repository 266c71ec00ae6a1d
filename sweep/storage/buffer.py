"""The block buffer of a streamed sweep: finished blocks gathered, then staged together.

Staging every block as its own file would cost a file (and an ``fsync``) per
block; gathering them for at most :data:`STAGE_SECONDS` or :data:`STAGE_BYTES`
bounds both the files and the work a ``SIGKILL`` can lose.
"""

from __future__ import annotations

import time
from typing import Callable, Mapping

import numpy as np

__all__ = ["BlockBuffer", "STAGE_SECONDS", "STAGE_BYTES"]

#: Seconds of finished blocks a streamed sweep gathers before staging them (at most this
#: much work is lost to a ``SIGKILL``).
STAGE_SECONDS = 1.0
#: Bytes of finished blocks a streamed sweep gathers at most before staging them.
STAGE_BYTES = 32 << 20


class BlockBuffer:
    """Consecutive finished blocks, handed to ``write(first, stop, arrays)`` in one go.

    Parameters
    ----------
    variables : sequence of str
        The full-size variables each block carries.
    write : callable
        ``write(first, stop, arrays)`` stages blocks ``first`` to ``stop - 1``;
        ``arrays`` maps ``"b<n>.index"`` (an ``(ndim, 2)`` array of slice
        bounds) and ``"b<n>.<variable>"`` to arrays (see
        :meth:`sweep.storage.staging.Staging.write_blocks`).

    The thresholds are read from :data:`STAGE_SECONDS` and :data:`STAGE_BYTES`
    when each block comes, so setting them takes effect at once.
    """

    def __init__(self, variables, write: Callable[[int, int, Mapping], None]):
        self._variables, self._write = tuple(variables), write
        self._blocks, self._bytes, self._last_flush = [], 0, time.monotonic()

    def add(self, number: int, index: tuple, values: Mapping) -> None:
        """Gather block ``number`` (its ``index``, a tuple of slices, and its variables).

        The gathered blocks are written every :data:`STAGE_SECONDS` (or
        :data:`STAGE_BYTES`), and whenever the numbers stop being consecutive.
        """
        if self._blocks and number != self._blocks[-1][0] + 1:
            self.flush()
        values = {name: np.asarray(values[name]) for name in self._variables}
        self._blocks.append((number, index, values))
        self._bytes += sum(v.nbytes for v in values.values())
        if self._bytes >= STAGE_BYTES or time.monotonic() - self._last_flush >= STAGE_SECONDS:
            self.flush()

    def flush(self) -> None:
        """Write the gathered blocks (nothing if none)."""
        if not self._blocks:
            return
        first, stop = self._blocks[0][0], self._blocks[-1][0] + 1
        arrays = {}
        for number, index, values in self._blocks:
            arrays[f"b{number}.index"] = np.array([[s.start, s.stop] for s in index],
                                                  dtype=np.int64)
            for name, value in values.items():
                arrays[f"b{number}.{name}"] = value
        self._write(first, stop, arrays)
        self._blocks, self._bytes, self._last_flush = [], 0, time.monotonic()
