"""The command line: ``layout-sweep`` (or ``python -m sweep``).

With no command it runs the main job: the built-in default sweep
(``configs/sweeps/default.toml``: Llama-3.1-70B on 1024 H100s, ~1.3 million
layouts) in memory, prints the best layout of each parallel split with one
line on why the runner-up loses, and writes the cube to ``default_cube.nc``.

Commands::

    layout-sweep run SPEC [-o cube.nc] [--jobs N] [--resume] [--block-points N]
    layout-sweep search SPEC [--trials N] [--seed S] [--memory-limit "72 GB"|0.9]
                             [--objective mfu] [--minimize|--maximize]
                             [--sampler tpe|nsga2|random|grid]
                             [--storage URL|file.log] [--study-name NAME] [--exact] [-k K]
    layout-sweep top CUBE [--objective mfu] [-k 10] [--minimize|--maximize] [--where admissible]
                          [--memory-limit ...] [--max-accelerators N] [--select dim=value ...]
    layout-sweep show CUBE
    layout-sweep catalog [workloads|fleets|accelerators|nodes|fabrics]
    layout-sweep plot CUBE --kind heatmap|line|pareto [--var mfu] [--x DIM] [--y DIM]
                           [--hue DIM] [--reduce max|min|mean] [--select dim=value ...]
                           [--where admissible] [-o file.png]

Errors in what the user gave (a missing file, a spec key, a catalog name, a
variable, a ``--select``) print one line to stderr, naming where, what was
expected and what came, with close matches, and exit with status 2. A ``top``
or ``plot`` with no admissible point prints on stderr how many points each
condition removed and which to relax, and exits with status 3. Success exits
0; an interrupt exits 130.

One module per command (``main_job``, ``run``, ``search``, ``top``, ``show``,
``catalog``, ``plot``), each with ``command(args) -> exit status``; the parser
in :mod:`~sweep.cli.parser`, text in :mod:`~sweep.cli.format`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from typing import Optional, Sequence

from solver.catalog import CatalogError
from solver.physics import DEFAULT_PHYSICS

from ..analysis import NoAdmissibleError, explain_runner_up, step_components
from ..calibration import MeasurementError, ProfileError
from ..limits import MemoryLimitError
from ..spec import SpecError
from ..search.storage import JournalWarning
from . import calibrate, catalog, cubes, main_job, plot, run, search, show, top
from ._common import (_PROG, DEFAULT_CUBE, DEFAULT_SPEC, EXIT_EMPTY, EXIT_INTERRUPTED, EXIT_OK,
                      EXIT_USAGE, UsageError, _one_line)
from .format import format_table
from .parser import build_parser

__all__ = [
    "main",
    "build_parser",
    "UsageError",
    "DEFAULT_SPEC",
    "DEFAULT_CUBE",
    "format_table",
    "explain_runner_up",
    "step_components",
    "EXIT_OK",
    "EXIT_USAGE",
    "EXIT_EMPTY",
    "EXIT_INTERRUPTED",
]


_COMMANDS = {"run": run.command, "search": search.command, "top": top.command,
             "show": show.command, "catalog": catalog.command, "plot": plot.command,
             "calibrate": calibrate.command}


def _dispatch(args) -> int:
    if args.command is None:
        args.output, args.top, args.jobs = args.main_output, args.main_top, args.main_jobs
        if args.output is None:  # the megatron main job does not overwrite the default one's cube
            args.output = DEFAULT_CUBE if args.main_physics in (None, DEFAULT_PHYSICS) else \
                f"default_{args.main_physics}_cube.nc"
        args.no_progress, args.spec = args.main_no_progress, args.main_spec
        args.physics = args.main_physics
        args.require_realizable = args.main_require_realizable
        return main_job.command(args)
    return _COMMANDS[args.command](args)


@contextlib.contextmanager
def _warning_lines(prog: str):
    """Show the package's own warnings (a repaired journal, MFU across precisions, ...) as one
    ``prog: warning:`` line each, not Python's file path and source line; others as Python does."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, JournalWarning) or category.__module__.split(".")[0] in (
                "sweep", "solver"):
            print(f"{prog}: warning: {_one_line(message)}", file=sys.stderr, flush=True)
        else:
            shown(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.simplefilter("always", JournalWarning)
        warnings.showwarning = show
        yield


def main(argv: Optional[Sequence[str]] = None, *, prog: str = _PROG) -> int:
    """Run the command line; return the exit status.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments (default: ``sys.argv[1:]``).
    prog : str
        The program's name in messages.

    Returns
    -------
    int
        0 on success, 2 for a user error (one line on stderr), 3 when no point
        is admissible (why, on stderr), 130 when interrupted.
    """
    parser = build_parser(prog)
    cubes.OPENED.clear()
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as done:  # --help, --version
            return int(done.code or 0)
        args.prog = prog
        with _warning_lines(prog):
            return _dispatch(args)
    except (UsageError, SpecError, CatalogError, MemoryLimitError, ProfileError,
            MeasurementError) as err:
        message = _one_line(err)
        if not message.startswith(prog):
            message = f"{prog}: error: {message}"
        print(message, file=sys.stderr)
        return EXIT_USAGE
    except NoAdmissibleError as err:
        print(f"{prog}: {_one_line(err)}", file=sys.stderr)
        return EXIT_EMPTY
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `layout-sweep catalog | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except (RuntimeError, AttributeError, OSError) as err:  # only a damaged cube's data
        if not cubes.damaged(err):
            raise
        print(f"{prog}: error: {cubes.damaged_message(err)}", file=sys.stderr)
        return EXIT_USAGE


