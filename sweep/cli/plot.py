"""``plot``: a heatmap, line or Pareto plot of a cube, written as a PNG."""

from __future__ import annotations

from pathlib import Path

from ._common import EXIT_OK, UsageError, _check_figure_output
from .cubes import _check_dim, _check_variable, _check_where, _constraints, _open_cube, _parse_select
from .format import _human_bytes

__all__ = ["command"]


def _plot_defaults(args) -> tuple:
    if args.kind == "pareto":
        return args.x or "memory_footprint", args.y or "mfu"
    return args.x or "tp_size", args.y or "pp_size"


def command(args) -> int:
    """``plot``: a heatmap, line or Pareto plot of a cube, written as a PNG."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("plot: expected matplotlib to be installed (pip install "
                         "'layout-sweep[plot]', or pip install matplotlib), but it is not")
    from .. import plot

    if args.output:  # refused before any work
        _check_figure_output(args.output, "-o")
    cube = _open_cube(args.cube, args.allow_partial)
    where = _check_where(cube, args.where)
    select = _parse_select(cube, args.select)
    constraints = _constraints(args)
    x, y = _plot_defaults(args)
    if args.kind == "pareto":
        _check_variable(cube, x, "--x (a pareto plot's x is a variable)")
        _check_variable(cube, y, "--y (a pareto plot's y is a variable)")
        if x == y:
            raise UsageError(f"--x and --y: expected two different variables, but got {x!r} twice")
    else:
        _check_variable(cube, args.var, "--var")
        dims = [x] + ([y] if args.kind == "heatmap" else []) + ([args.hue] if args.hue else [])
        flags = ["--x", "--y" if args.kind == "heatmap" else "--hue", "--hue"]
        for dim, flag in zip(dims, flags):
            _check_dim(cube, dim, flag)
            if dim in select:
                raise UsageError(f"--select {dim}: expected a dim that is not plotted, but "
                                 f"{dim!r} is {flag}")
        if len(set(dims)) != len(dims):
            raise UsageError(f"--x, --y, --hue: expected different dims, but got {dims}")
    if args.kind == "heatmap":
        figure = plot.heatmap(cube, args.var, x, y, reduce=args.reduce, where=where,
                              select=select, constraints=constraints)
    elif args.kind == "line":
        figure = plot.line(cube, args.var, x, hue=args.hue, reduce=args.reduce, where=where,
                           select=select, constraints=constraints)
    else:
        figure = plot.pareto(cube, x, y, where=where, select=select, constraints=constraints)
    name = args.var if args.kind != "pareto" else f"{y}_vs_{x}"
    output = _check_figure_output(args.output or f"{Path(args.cube).stem}_{args.kind}_{name}.png", "-o")
    figure.savefig(output, dpi=args.dpi)
    cube.close()
    print(f"wrote {output} ({_human_bytes(output.stat().st_size)})")
    return EXIT_OK
