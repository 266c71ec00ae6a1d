"""Pre-flight checks of a sweep: refuse, with the numbers, what memory or disk cannot hold.

An in-memory sweep needs its whole cube (:meth:`sweep.cube.CubeLayout.bytes_per_point`
per point) and, in each pricing process, the temporaries of one block
(:data:`SOLVE_BYTES_PER_POINT` per block point). It is refused before anything
is allocated when that exceeds what this process may still get: the smaller of
``MemAvailable`` (``/proc/meminfo``) and the room left under ``RLIMIT_AS``.

A streamed sweep stages compressed blocks in ``<path>.partial`` and then writes
the compressed file beside them: about twice the compressed cube. It is
refused when the disk has less free than that, taking the cube to compress at
least :data:`DISK_COMPRESSION` times (it does 30x on ``default.toml``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional

__all__ = ["ResourceError", "check_memory", "check_disk", "available_memory", "free_disk",
           "SOLVE_BYTES_PER_POINT", "DISK_COMPRESSION"]

#: Bytes of temporaries per point of a block while ``solver.solve`` prices it [B]
#: (measured: about 230 B on a 737,280-point block of ``default.toml``).
SOLVE_BYTES_PER_POINT = 320
#: The least compression (zlib, byte shuffle) a cube is assumed to get on disk.
DISK_COMPRESSION = 4

_GIB = 2 ** 30


class ResourceError(RuntimeError):
    """A sweep this machine cannot hold: the message gives the need, what there is, the fix."""


def _meminfo_available() -> Optional[int]:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _address_space_left() -> Optional[tuple]:
    """``(bytes left, the limit)`` under ``RLIMIT_AS``, or None without a limit."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    used = 0
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                used = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return max(0, soft - used), soft


def available_memory() -> tuple:
    """``(bytes, why)``: what this process may still allocate, and what bounds it.

    ``bytes`` is None when nothing is known (no ``/proc/meminfo``, no limit).
    """
    found = []
    meminfo = _meminfo_available()
    if meminfo is not None:
        found.append((meminfo, f"MemAvailable in /proc/meminfo is {meminfo / _GIB:.1f} GiB"))
    left = _address_space_left()
    if left is not None:
        found.append((left[0], f"the address-space limit (RLIMIT_AS) of {left[1] / _GIB:.1f} "
                               f"GiB leaves {left[0] / _GIB:.1f} GiB"))
    if not found:
        return None, "unknown"
    return min(found)


def free_disk(directory) -> int:
    """Bytes an unprivileged process may still write under ``directory`` [B]."""
    stat = os.statvfs(directory)
    return stat.f_bavail * stat.f_frsize


def check_memory(spec, cube_layout, *, block_points: int, workers: int = 1) -> int:
    """Refuse an in-memory sweep whose cube and temporaries exceed the memory left.

    Returns the bytes needed [B]. ``workers`` processes each hold one block's temporaries.

    Raises
    ------
    ResourceError
        Naming the bytes needed, what is available, and the fix (stream to a file).
    """
    per_point = cube_layout.bytes_per_point()
    cube_bytes = per_point * spec.size
    temporaries = SOLVE_BYTES_PER_POINT * min(block_points, spec.size) * max(1, workers)
    need = cube_bytes + temporaries
    have, why = available_memory()
    if have is not None and need > have:
        raise ResourceError(
            f"an in-memory sweep of {spec.name!r} needs about {need / _GIB:.1f} GiB "
            f"({spec.size:,} points x {per_point} B of cube, plus {temporaries / _GIB:.1f} GiB "
            f"of temporaries), but only {have / _GIB:.1f} GiB is available ({why}): stream it "
            f"to a file instead, which holds one block at a time (`run SPEC -o cube.nc` on "
            f"the command line, sweep.run(spec, path='cube.nc') in Python)")
    return need


def check_disk(spec, cube_layout, path) -> int:
    """Refuse a streamed sweep whose staged blocks and file the disk at ``path`` cannot hold.

    Returns the bytes expected [B]: twice the cube compressed :data:`DISK_COMPRESSION`
    times (the staged blocks and the assembled file exist together at the end).

    Raises
    ------
    ResourceError
        Naming the bytes needed, the free bytes and the folder.
    """
    raw = cube_layout.bytes_per_point() * spec.size
    need = 2 * math.ceil(raw / DISK_COMPRESSION)
    folder = Path(path).resolve().parent
    free = free_disk(folder)
    if need > free:
        raise ResourceError(
            f"a streamed sweep of {spec.name!r} needs up to {need / _GIB:.2f} GiB of disk "
            f"(its {raw / _GIB:.2f} GiB cube compressed at least {DISK_COMPRESSION}x, staged "
            f"in {Path(path).name}.partial and then assembled beside it), but {folder} has "
            f"{free / _GIB:.2f} GiB free: free some space or write to another disk")
    return need
