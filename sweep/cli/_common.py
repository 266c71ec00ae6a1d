"""What every command shares: exit statuses, the one-line usage error, default files."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

from ..spec import builtin_spec
from ..storage.atomic import writable_file

__all__ = ["UsageError", "DEFAULT_SPEC", "DEFAULT_CUBE", "EXIT_OK", "EXIT_USAGE",
           "EXIT_EMPTY", "EXIT_INTERRUPTED"]


#: The main job's sweep.
#: The main job's spec: ``configs/sweeps/default.toml`` as installed with the package.
DEFAULT_SPEC = builtin_spec("default")


#: Where the main job writes its cube (in the current directory).
DEFAULT_CUBE = "default_cube.nc"

EXIT_OK, EXIT_USAGE, EXIT_INTERRUPTED = 0, 2, 130

#: No admissible point to rank or plot: the explanation is on stderr (not a usage error).
EXIT_EMPTY = 3


_PROG = "layout-sweep"


_GB = 1e9


_SPLIT_DIMS = ("tp_size", "pp_size", "ep_size", "cp_size", "dp_size")


_CATALOG_KINDS = ("workloads", "fleets", "accelerators", "nodes", "fabrics")


_PLOT_KINDS = ("heatmap", "line", "pareto")


_SAMPLERS = ("tpe", "nsga2", "random", "grid")


class UsageError(Exception):
    """A mistake in what the user gave: reported in one line, exit status 2."""


def _suggest(name, choices) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``choices`` (or one it begins), else ``""``."""
    choices = [str(c) for c in choices]
    close = [c for c in choices if c.lower() == str(name).lower()][:1]  # MFU for mfu
    close = close or difflib.get_close_matches(str(name), choices, n=1, cutoff=0.5)
    close = close or [c for c in choices if name and c.startswith(str(name))][:1]
    return f"; did you mean {close[0]!r}?" if close else ""


def _check_output(path, flag, inputs=()) -> Path:
    """``path`` as a Path, if its directory exists and it is none of the command's
    ``inputs`` (files it reads; else a :class:`UsageError`)."""
    try:
        path = writable_file(path)  # (the rule sweep.save and sweep.run(path=) keep)
    except OSError as error:
        raise UsageError(f"{flag}: {error}") from None
    for source in inputs:
        if source is not None and path.exists() and Path(source).is_file() \
                and path.resolve() == Path(source).resolve():
            raise UsageError(f"{flag}: {str(path)!r} is the file this command reads; writing "
                             f"there would replace it (name another file)")
    return path


def _check_figure_output(path, flag) -> Path:
    """A figure's file name: its directory must exist, no suffix means ``.png``, and the
    suffix must be a format matplotlib writes (else a :class:`UsageError`, before any work)."""
    path = _check_output(path, flag)
    if not path.suffix:
        return path.with_name(path.name + ".png")
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    if path.suffix[1:].lower() not in formats:
        raise UsageError(f"{flag}: expected a figure file ending in one of "
                         f"{', '.join('.' + f for f in sorted(formats))}, but got {str(path)!r}")
    return path


def _progress(args) -> bool:
    return not args.no_progress and sys.stderr.isatty()


def _one_line(message: str) -> str:
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())
