"""Evaluate a declared space block by block into a labeled cube.

:func:`run` walks :func:`sweep.grid.blocks`, prices each block with one call of
``solver.solve`` (an open mesh: no Python loop over configurations, only over
blocks) and writes the chosen outputs and the masks of :mod:`sweep.cube` into
preallocated arrays, or straight into a netCDF file when ``path`` is given.

Parallel sweeps use joblib: ``n_jobs`` worker processes (the ``loky`` backend
by default). To run on a dask cluster, create a ``dask.distributed`` client
first and pass ``backend="dask"``::

    from dask.distributed import Client, LocalCluster
    client = Client(LocalCluster(n_workers=4))      # or Client("tcp://scheduler:8786")
    cube = sweep.run("configs/sweeps/calculon_gpt3.toml", backend="dask")

joblib's dask backend (``joblib.parallel_config(backend="dask")``) then sends
batches of blocks to the client's workers; with ``backend="dask"``, ``n_jobs=1``
(the default) means "every worker thread" (``n_jobs=-1``). Their results come
back to this process, which writes the cube (or the file), so no worker needs
to see the output path. Local workers (loky, multiprocessing, threading) building
an in-memory cube write their blocks in place instead, into the cube's arrays
mapped from files in ``/dev/shm`` (or in the temporary directory when
``/dev/shm`` has no room: never a ``SIGBUS``), so no result is pickled back.
Worker processes exit within a second of this process's death.

Before anything is priced, a cube memory cannot hold (in memory) or the disk
cannot (streamed) is refused with the numbers (:mod:`sweep.preflight`).
"""

from __future__ import annotations

import errno
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Mapping, Optional

import joblib
import numpy as np
import xarray as xr

import solver
from solver.blocks import BLOCK_POINTS

from . import calibration as calibration_
from . import cube as cube_
from . import physics as physics_
from . import grid, preflight, storage
from .spec import Spec, load_spec

__all__ = ["run", "BLOCK_POINTS", "PROGRESS_MIN_POINTS", "TASK_BYTES", "SHARED_MEMORY_DIR",
           "PARENT_POLL_SECONDS"]
#: With ``progress=None``, a bar is shown on a terminal for sweeps this large.
PROGRESS_MIN_POINTS = 5_000_000
#: Bytes of results a parallel task returns at most (bounds memory in flight).
TASK_BYTES = 32 << 20


@dataclass(frozen=True)
class _Plan:
    """What a worker needs to turn a block's solve results into cube variables."""

    outputs: tuple            # spec outputs that are not masks
    dtypes: Mapping           # full-size variable -> numpy dtype
    memory_limits: Mapping    # fleet label -> bytes
    accelerators_ok: Optional[np.ndarray]  # n_accelerators within bounds, over all dims (1s elsewhere)
    require_realizable: bool = True
    constants: Mapping = field(default_factory=dict)  # physics -> a calibration's constants


def _make_plan(spec: Spec, cube_layout: cube_.CubeLayout) -> _Plan:
    full = {name: cube_layout.variables[name].dtype for name in cube_layout.priced()}
    return _Plan(outputs=tuple(n for n in spec.outputs if n in full and n not in cube_.MASKS),
                 dtypes=full,
                 memory_limits={k: spec.memory_limit_for(f) for k, f in spec.fleets.items()},
                 accelerators_ok=cube_.accelerators_ok(spec),
                 require_realizable=spec.require_realizable,
                 constants=physics_.calibrated(spec))


def _evaluate_block(block: grid.Block, plan: _Plan, out: Optional[dict] = None) -> dict:
    """Price one block; write its variables into ``out`` (views) or new arrays.

    An output the block's physics model does not return is NaN (False for a boolean).
    """
    result = solver.solve(block.workload, block.fleet, physics=block.physics,
                          warn=False, **block.knobs,
                          **plan.constants.get(block.physics, {}))
    if out is None:
        out = {name: np.empty(block.shape, dtype=dtype) for name, dtype in plan.dtypes.items()}
    for name in plan.outputs:
        out[name][...] = result[name] if name in result else (
            False if out[name].dtype == bool else np.nan)
    out["valid"][...] = result["valid"]
    out["feasible"][...] = result["feasible"]
    out["realizable"][...] = result["realizable"]
    np.less_equal(result["memory_footprint"], plan.memory_limits[block.fleet_label],
                  out=out["within_memory_limit"])
    admissible = out["admissible"]
    np.logical_and(out["valid"], out["within_memory_limit"], out=admissible)
    if plan.require_realizable:
        np.logical_and(admissible, out["realizable"], out=admissible)
    if plan.accelerators_ok is not None:
        ok = plan.accelerators_ok
        index = tuple(i if n > 1 else slice(None) for i, n in zip(block.index, ok.shape))
        np.logical_and(admissible, ok[index], out=admissible)
    return out


def _evaluate_task(blocks: list, plan: _Plan) -> list:
    """Price a batch of blocks (one joblib task): ``[(index, {name: array}), ...]``."""
    return [(block.index, _evaluate_block(block, plan)) for block in blocks]


#: Backends whose workers share this machine's memory: they write the cube in place.
_SHARED_BACKENDS = ("loky", "multiprocessing", "threading")


#: Where the shared arrays of a parallel in-memory sweep go first (a RAM-backed tmpfs);
#: the environment variable ``SWEEP_SHARED_MEMORY`` overrides it.
SHARED_MEMORY_DIR = "/dev/shm"


def _free_bytes(directory) -> int:
    """Bytes an unprivileged process may still write under ``directory`` [B]."""
    stat = os.statvfs(directory)
    return stat.f_bavail * stat.f_frsize


def _shared_directories() -> list:
    """Candidate folders of the shared arrays, best first: the tmpfs, then the temp dir."""
    shm = os.environ.get("SWEEP_SHARED_MEMORY") or SHARED_MEMORY_DIR
    found = [shm] if os.path.isdir(shm) and os.access(shm, os.W_OK) else []
    return found + [tempfile.gettempdir()]


def _reserve(fd: int, nbytes: int) -> None:
    """Allocate ``nbytes`` of the file now, so that a full folder raises ``ENOSPC`` here
    instead of a ``SIGBUS`` when a worker writes into the mapping later."""
    if nbytes and hasattr(os, "posix_fallocate"):
        try:
            os.posix_fallocate(fd, 0, nbytes)
            return
        except OSError as err:
            if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", -1)):
                raise
    os.ftruncate(fd, nbytes)  # cannot reserve here: the free-space check must do


class _SharedArrays:
    """The cube's arrays in memory-mapped files (``/dev/shm`` when there is room).

    Local workers open them and write their blocks in place, so no result is
    pickled back and copied again; the files are removed at the end and the
    arrays live on in this process's mapping. The files are allocated up front
    (``posix_fallocate``) in the first folder with room for them, the tmpfs
    :data:`SHARED_MEMORY_DIR` and then the temporary directory (a file-backed
    mapping), so a small ``/dev/shm`` never kills a worker with ``SIGBUS``.

    Raises
    ------
    OSError
        ``ENOSPC`` if no folder can hold the arrays (the message gives the numbers).
    """

    def __init__(self, dtypes: Mapping, shape: tuple):
        self.files, self.arrays = {}, {}
        count = math.prod(shape)
        self.nbytes = sum(np.dtype(dtype).itemsize * count for dtype in dtypes.values())
        tried = []
        for base in _shared_directories():
            free = _free_bytes(base)
            tried.append(f"{base} has {free / 2**20:,.0f} MiB free")
            if free < self.nbytes:
                continue
            self.directory = tempfile.mkdtemp(prefix="sweep-", dir=base)
            try:
                self._allocate(dtypes, shape, count)
                return
            except OSError as err:
                self.close()
                if err.errno != errno.ENOSPC:
                    raise
                self.files, self.arrays = {}, {}
        raise OSError(errno.ENOSPC,
                      f"a parallel in-memory sweep shares its cube through files, and expected "
                      f"a folder with {self.nbytes / 2**20:,.0f} MiB free, but "
                      f"{'; '.join(tried)}: stream it to a file instead (path=..., or "
                      f"`-o cube.nc` on the command line), or price it in this process "
                      f"(n_jobs=1)")

    def _allocate(self, dtypes: Mapping, shape: tuple, count: int) -> None:
        for name, dtype in dtypes.items():
            path = os.path.join(self.directory, f"{name}.bin")
            with open(path, "wb") as fh:
                _reserve(fh.fileno(), np.dtype(dtype).itemsize * count)
            self.arrays[name] = np.asarray(np.memmap(path, dtype=dtype, mode="r+", shape=shape))
            self.files[name] = (path, np.dtype(dtype).str, tuple(shape))

    def close(self):
        shutil.rmtree(self.directory, ignore_errors=True)


def _evaluate_task_in_place(blocks: list, plan: _Plan, files: Mapping) -> list:
    """Price a batch of blocks into the shared cube arrays: ``[(index, None), ...]``.

    The files are mapped for this task only, so no worker keeps them alive.
    """
    arrays = {name: np.memmap(path, dtype=dtype, mode="r+", shape=shape)
              for name, (path, dtype, shape) in files.items()}
    for block in blocks:
        _evaluate_block(block, plan, {name: a[block.index] for name, a in arrays.items()})
    del arrays
    return [(block.index, None) for block in blocks]


def _tasks(blocks: list, task_points: int) -> list:
    tasks, current, points = [], [], 0
    for block in blocks:
        current.append(block)
        points += block.size
        if points >= task_points:
            tasks.append(current)
            current, points = [], 0
    if current:
        tasks.append(current)
    return tasks


def _progress_bar(spec: Spec, progress, initial: int):
    from tqdm import tqdm  # a text bar on stderr (tqdm.auto warns in kernels without widgets)

    if progress is None:
        show = spec.size >= PROGRESS_MIN_POINTS and sys.stderr.isatty()
    else:
        show = bool(progress)
    return tqdm(total=spec.size, initial=initial, unit="config", unit_scale=True,
                desc=spec.name, disable=not show, file=sys.stderr, dynamic_ncols=True)


def _check_backend(backend: Optional[str]) -> None:
    if backend == "dask":
        try:
            from distributed import get_client
            get_client()
        except (ImportError, ValueError) as err:
            raise RuntimeError(
                "backend='dask' needs a dask.distributed Client, created before sweep.run "
                "(from dask.distributed import Client; client = Client(...)), "
                f"but found none: {err}") from None


#: Seconds between a worker's checks that the process that started it is alive.
PARENT_POLL_SECONDS = 0.5
#: Backends whose workers are processes this one starts (they must not outlive it).
_PROCESS_BACKENDS = ("loky", "multiprocessing")


def _watch_parent(parent: int, every: float = PARENT_POLL_SECONDS) -> None:
    """Worker initializer: end this worker within ``every`` seconds of ``parent``'s death.

    A daemon thread polls ``os.getppid()``: once the parent is gone (a ``SIGKILL``
    from a job scheduler, say) the worker is re-parented and exits at once, so
    no orphan holds memory, and the resource tracker, whose pipe the workers
    hold open, exits with them. Polling works on every POSIX system and is
    immune to what ``prctl(PR_SET_PDEATHSIG)`` gets wrong (it fires when the
    *thread* that forked the worker ends, and loky forks from its own threads).
    """
    def watch():
        while os.getppid() == parent:
            time.sleep(every)
        os._exit(1)

    if os.getppid() != parent:  # died before this worker was initialized
        os._exit(1)
    threading.Thread(target=watch, name="sweep-parent-watchdog", daemon=True).start()


def _backend_options(backend: str) -> dict:
    """``joblib.parallel_config`` options of ``backend``: the parent watchdog for processes."""
    if backend in _PROCESS_BACKENDS:
        return {"initializer": _watch_parent, "initargs": (os.getpid(),)}
    return {}


def _parallel(tasks: list, plan: _Plan, n_jobs: int, backend: Optional[str], files=None):
    """Results of every task, in order, computed by joblib workers.

    With ``files`` (shared arrays) the workers write in place and return no data.
    Worker processes end within seconds of this process's death (:func:`_watch_parent`).
    """
    backend = backend or "loky"
    if backend == "dask" and n_jobs == 1:
        n_jobs = -1
    with joblib.parallel_config(backend=backend, **_backend_options(backend)):
        parallel = joblib.Parallel(n_jobs=n_jobs, return_as="generator",
                                   pre_dispatch="2*n_jobs", batch_size=1)
        if files is None:
            calls = (joblib.delayed(_evaluate_task)(task, plan) for task in tasks)
        else:
            calls = (joblib.delayed(_evaluate_task_in_place)(task, plan, files) for task in tasks)
        yield from parallel(calls)


def _task_points(spec: Spec, cube_layout, block_points: int, n_jobs: int, backend) -> int:
    with joblib.parallel_config(backend=backend or "loky"):
        workers = max(1, joblib.effective_n_jobs(n_jobs if n_jobs != 1 or backend != "dask" else -1))
    by_bytes = TASK_BYTES // max(1, cube_layout.bytes_per_point())
    balanced = math.ceil(spec.size / (4 * workers))
    return max(block_points, min(by_bytes, balanced))


def _price_here(todo: list, plan: _Plan, writer, arrays, bar) -> None:
    """Price ``[(number, block), ...]`` in this process, into ``arrays`` or the ``writer``."""
    for n, block in todo:
        if writer is None:
            _evaluate_block(block, plan, {k: a[block.index] for k, a in arrays.items()})
        else:
            writer.add(n, block.index, _evaluate_block(block, plan))
        bar.update(block.size)


def _price_in_parallel(todo: list, plan: _Plan, writer, arrays, bar, results) -> None:
    """Write the ``results`` of the workers' tasks (in order) into ``arrays`` or the ``writer``.

    Workers that wrote in place (shared arrays) return None for the values.
    """
    numbers = iter([n for n, _ in todo])  # results come back in order
    for task in results:
        for index, values in task:
            n = next(numbers)
            if writer is not None:
                writer.add(n, index, values)
            elif values is not None:
                for name, value in values.items():
                    arrays[name][index] = value
            bar.update(math.prod(s.stop - s.start for s in index))


def _preflight(spec: Spec, cube_layout, *, path, serial: bool, n_jobs: int, backend,
               block_points: int) -> None:
    """Refuse a sweep that memory (in memory) or the disk (streamed) cannot hold."""
    if path is None:
        local = serial or (backend or "loky") in _SHARED_BACKENDS
        with joblib.parallel_config(backend=backend or "loky"):
            workers = 1 if serial or not local else max(1, joblib.effective_n_jobs(n_jobs))
        preflight.check_memory(spec, cube_layout, block_points=block_points, workers=workers)
    else:
        storage.atomic.writable_file(path)  # before the work, not at its end
        if not storage.partial_path(path).exists():  # a resume needs less than a new sweep
            preflight.check_disk(spec, cube_layout, path)


def _destination(spec: Spec, cube_layout, *, path, serial: bool, backend, block_points: int,
                 resume: bool) -> tuple:
    """``(writer, arrays, shared)``: where the blocks go (a file, arrays, or shared arrays)."""
    if path is not None:
        writer = storage.StreamWriter(
            path, cube_layout, spec=spec, block_points=block_points, resume=resume,
            small={"n_accelerators": cube_.accelerator_counts(spec)})
        return writer, None, None
    if not serial and (backend or "loky") in _SHARED_BACKENDS:
        full = {n: cube_layout.variables[n].dtype for n in cube_layout.priced()}
        shared = _SharedArrays(full, cube_layout.shape)
        return None, shared.arrays, shared
    return None, cube_.allocate(cube_layout), None


def run(spec, *, n_jobs: int = 1, backend: Optional[str] = None,
        block_points: Optional[int] = None, path=None, progress: Optional[bool] = None,
        resume: bool = False, max_points: Optional[int] = None,
        require_realizable: Optional[bool] = None, calibration=None) -> xr.Dataset:
    """Price every point of a declared space into a labeled cube.

    Parameters
    ----------
    spec : dict, str, pathlib.Path or Spec
        The space (see :func:`sweep.load_spec`).
    n_jobs : int
        joblib workers; 1 prices in this process, -1 uses every core.
    backend : str, optional
        joblib backend: ``"loky"`` (default), ``"threading"``, ``"multiprocessing"``,
        or ``"dask"`` to use the ``dask.distributed`` client you created (see the
        module docstring).
    block_points : int, optional
        Points per block: bounds the memory of one ``solver.solve`` call
        (:data:`solver.blocks.BLOCK_POINTS` by default). ``max_points`` is a
        deprecated alias.
    path : str or pathlib.Path, optional
        Stream the cube into this netCDF file instead of memory: finished
        blocks are staged in the directory ``<path>.partial`` (they survive any
        interruption, ``SIGKILL`` included), then assembled into ``path``
        (atomic rename). The result is then :func:`sweep.open_cube` of the
        file (lazy). Peak memory does not grow with the space.
    progress : bool, optional
        A tqdm bar on stderr; by default only on a terminal and for sweeps of
        at least :data:`PROGRESS_MIN_POINTS` points.
    resume : bool
        With ``path``: continue an interrupted sweep from the blocks staged in
        ``<path>.partial`` (only the missing blocks are priced; the cube is
        identical to an uninterrupted run's), or return the finished file if it
        already holds this spec's sweep. Without it, staged blocks at ``path``
        are refused, never discarded.
    require_realizable : bool, optional
        Whether ``admissible`` requires ``realizable`` (whole microbatches, no
        idle ranks); None: the spec's ``constraints.require_realizable``
        (default true). False keeps the reference's raw layouts admissible
        (parity studies); the cube says which in its ``require_realizable``
        attribute.
    calibration : str, pathlib.Path or sweep.calibration.Profile, optional
        Price with a calibration profile's physics and constants (replaces the
        spec's ``calibration``; see :func:`sweep.calibrate`).

    Returns
    -------
    xarray.Dataset
        The cube (see :mod:`sweep.cube`).

    Raises
    ------
    SpecError
        For an unreadable spec, a continuous axis, a space with no valid split,
        or a resume of blocks staged by another spec.
    sweep.preflight.ResourceError
        Before anything is priced, for an in-memory cube the memory left cannot
        hold, or a streamed one the disk cannot (with the numbers and the fix).
    FileExistsError
        If blocks are staged at ``path`` and ``resume`` is False, or another
        process is writing them.
    """
    spec = calibration_.with_calibration(load_spec(spec), calibration)
    spec = spec.with_constraints(require_realizable=require_realizable)
    block_points = grid.points_per_block(block_points, max_points)
    if resume and path is None:
        raise ValueError("resume=True continues a sweep streamed to a file, so it needs path=, "
                         "but got path=None")
    if path is not None and resume:
        finished = storage.finished_cube(path, spec)
        if finished is not None:
            storage.discard_staged(path, spec)
            return finished
    blocks = list(grid.blocks(spec, block_points))  # raises for continuous axes
    physics_.check_shapes(spec)  # once, here: the blocks price with warn=False
    cube_.check_some_valid(spec)
    cube_layout = cube_.layout(spec)
    plan = _make_plan(spec, cube_layout)
    serial = n_jobs == 1 and backend is None
    if not serial:
        _check_backend(backend)
    _preflight(spec, cube_layout, path=path, serial=serial, n_jobs=n_jobs, backend=backend,
               block_points=block_points)

    writer, arrays, shared = _destination(spec, cube_layout, path=path, serial=serial,
                                          backend=backend, block_points=block_points,
                                          resume=resume)
    if writer is not None and writer.block_points != block_points:
        block_points = writer.block_points  # resuming: keep the partition already begun
        blocks = list(grid.blocks(spec, block_points))
    done = writer.done if writer is not None else set()
    todo = [(n, block) for n, block in enumerate(blocks) if n not in done]
    done_points = sum(b.size for n, b in enumerate(blocks) if n in done)

    bar = None
    try:
        bar = _progress_bar(spec, progress, done_points)
        if serial:
            _price_here(todo, plan, writer, arrays, bar)
        else:
            task_points = _task_points(spec, cube_layout, block_points, n_jobs, backend)
            files = shared.files if shared is not None else None
            _price_in_parallel(todo, plan, writer, arrays, bar,
                               _parallel(_tasks([b for _, b in todo], task_points), plan, n_jobs,
                                         backend, files))
    except BaseException:
        if writer is not None:
            writer.close()  # stages the blocks finished so far
        raise
    finally:
        if bar is not None:
            bar.close()
        if shared is not None:
            shared.close()

    if writer is None:
        arrays["n_accelerators"] = cube_.accelerator_counts(spec)
        return cube_.to_dataset(cube_layout, arrays)
    final = writer.finalize()
    return storage.open_cube(final)


def __getattr__(name):
    if name == "DEFAULT_MAX_POINTS":  # the former default here (2**17); now the one default
        grid.warn_renamed("sweep.evaluate.DEFAULT_MAX_POINTS", "solver.blocks.BLOCK_POINTS")
        return BLOCK_POINTS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
