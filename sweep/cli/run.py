"""``run``: a spec's sweep streamed into a cube file."""

from __future__ import annotations

import sys
import time

from ..preflight import ResourceError
from ..spec import load_spec
from ._common import EXIT_INTERRUPTED, EXIT_OK, UsageError, _check_output, _progress
from .format import _human_bytes

__all__ = ["command"]


def command(args) -> int:
    """``run``: stream a spec's sweep into a cube file and summarize it."""
    import sweep

    spec = load_spec(args.spec, physics=args.physics).with_constraints(
        require_realizable=args.require_realizable)
    path = _check_output(args.output or f"{spec.name}.nc", "-o", inputs=(args.spec,))
    before = path.stat().st_mtime_ns if path.exists() else None
    staged = _staged(path) if args.resume else None
    started = time.perf_counter()
    try:
        blocks = {"block_points": args.block_points} if args.block_points else {}
        cube = sweep.run(spec, n_jobs=args.jobs, path=path, progress=_progress(args),
                         resume=args.resume, calibration=args.calibration, **blocks)
    except KeyboardInterrupt:
        print(f"{args.prog}: interrupted; the sweep so far is in {path}.partial: continue it "
              f"with `{args.prog} run {args.spec} -o {path} --resume`", file=sys.stderr)
        return EXIT_INTERRUPTED
    except FileExistsError as err:  # staged blocks of an earlier run, and no --resume
        # (the message names --resume where it would continue them, else delete or elsewhere)
        raise UsageError(str(err)) from None
    except ResourceError as err:  # refused before pricing: the disk cannot hold it
        raise UsageError(str(err)) from None
    elapsed = time.perf_counter() - started
    shape = " x ".join(f"{d} {n}" for d, n in zip(spec.dims, spec.shape))
    admissible = int(cube["admissible"].sum())
    print(f"{spec.name}: {spec.size:,} layouts ({shape})")
    if args.resume and before is not None and path.stat().st_mtime_ns == before:
        print(f"{path} already holds this finished sweep; {admissible:,} admissible")
        cube.close()
        return EXIT_OK
    if staged and staged[0]:  # a rate over every point would count what an earlier run priced
        done, total = staged
        print(f"resumed: {done:,} of {total:,} blocks were staged by an earlier run; the other "
              f"{total - done:,} priced and the cube written in {elapsed:.2f} s; "
              f"{admissible:,} admissible")
    else:
        # the file's staging, compression and assembly included: for small sweeps they, not
        # the pricing, take most of this time
        print(f"priced and written in {elapsed:.2f} s ({spec.size / max(elapsed, 1e-9):,.0f} "
              f"layouts/s end to end); {admissible:,} admissible")
    print(f"wrote {path} ({_human_bytes(path.stat().st_size)})")
    cube.close()
    return EXIT_OK


def _staged(path):
    """``(blocks staged, blocks in all)`` of the unfinished sweep beside ``path``; None if none."""
    from ..storage import IncompleteCubeError, partial_path, staged_progress

    staging = partial_path(path)
    if not staging.is_dir():
        return None
    try:
        return staged_progress(staging)
    except IncompleteCubeError:  # the sweep's own resume says what is wrong with it
        return None
