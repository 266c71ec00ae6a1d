"""The argument parser of ``layout-sweep``: the main job's options, the commands, argument types."""

from __future__ import annotations

import argparse
import warnings

import solver
from solver.outputs import MAXIMIZE, MINIMIZE
from solver.physics import PHYSICS

from ..limits import MemoryLimit, parse_memory_limit
from ._common import (_CATALOG_KINDS, _PLOT_KINDS, _PROG, _SAMPLERS, DEFAULT_CUBE, DEFAULT_SPEC,
                      UsageError, _suggest)

__all__ = ["build_parser"]


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (no usage dump), exit status 2."""

    def error(self, message):
        raise UsageError(f"{self.prog}: error: {message} (see {self.prog} --help)")


def _one_of(choices, what):
    """An argparse type accepting one of ``choices``, suggesting a close one otherwise."""
    def convert(text):
        if text in choices:
            return text
        raise argparse.ArgumentTypeError(
            f"expected {what} ({', '.join(choices)}), but got {text!r}{_suggest(text, choices)}")
    convert.__name__ = what
    return convert


#: ``--physics``: a model of :data:`solver.physics.PHYSICS`.
_PHYSICS_TYPE = _one_of(tuple(PHYSICS), "a physics model")
_PHYSICS_HELP = " or ".join(PHYSICS)


def _positive_int(text) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, but got {text!r}")
    return value


def _seed(text) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < 2 ** 32:
        raise argparse.ArgumentTypeError(f"expected a whole number in [0, 2**32 - 1], but got {text!r}")
    return value


def _jobs(text) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value == 0 or value < -1:
        raise argparse.ArgumentTypeError(
            f"expected a number of processes >= 1 (or -1 for every core), but got {text!r}")
    return value


def _seconds(text) -> float:
    """A positive, finite number of seconds (``--time-budget``)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, "
                                         f"but got {text!r}")
    return value


def _memory_limit(text) -> MemoryLimit:
    """``"72 GB"``, ``"0.9"`` (a fraction of capacity) or ``"7.2e10"`` (bytes).

    Parsed by :func:`sweep.limits.parse_memory_limit`, the one memory-limit parser.
    """
    try:
        return parse_memory_limit(text, where="")
    except ValueError as err:  # MemoryLimitError, or a unit parse_quantity does not know
        raise argparse.ArgumentTypeError(str(err)) from None


class _DeprecatedAlias(argparse.Action):
    """A hidden old spelling of an option: stores into the new one's ``dest``, warns.

    The flag used is kept in ``<dest>_flag`` so that errors name what was typed.
    """

    def __init__(self, option_strings, dest, new="", **kwargs):
        self.new = new
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        warnings.warn(f"{option_string} is deprecated; use {self.new}", DeprecationWarning,
                      stacklevel=2)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)
        setattr(namespace, f"{self.dest}_flag", option_string)


def _add_deprecated(parser, flag, new, dest, **kwargs):
    parser.add_argument(flag, action=_DeprecatedAlias, new=new, dest=dest, **kwargs)


def _add_direction(parser):
    """``--maximize`` / ``--minimize`` into ``direction`` (default: the registry's)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--maximize", dest="direction", action="store_const", const=MAXIMIZE,
                       help="the largest values of the objective are best")
    group.add_argument("--minimize", dest="direction", action="store_const", const=MINIMIZE,
                       help="the smallest values are best (default: the objective's direction "
                            "of better: mfu is maximized, step_latency_total minimized)")
    return group


def _add_progress(parser):
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (one is shown on a terminal)")


def _add_narrowing(parser):
    parser.add_argument("--where", default="admissible", metavar="MASK",
                        help="boolean variable selecting the points (default: admissible)")
    parser.add_argument("--memory-limit", type=_memory_limit, metavar="LIMIT",
                        help="per-accelerator memory limit: '72 GB', bytes, or a fraction of "
                             "the accelerator's memory (0.9)")
    parser.add_argument("--max-accelerators", type=_positive_int, metavar="N",
                        help="at most N accelerators")
    _add_min_accelerators(parser)
    parser.add_argument("--select", nargs="+", metavar="DIM=VALUE",
                        help="pin dims to one value each (tp_size=4 zero_stage=1)")
    _add_allow_partial(parser)


def _add_require_realizable(parser, dest="require_realizable"):
    parser.add_argument("--require-realizable", dest=dest, default=None,
                        action=argparse.BooleanOptionalAction,
                        help="admissible layouts must be realizable: the batch splits into "
                             "whole microbatches, no idle ranks (default: the spec's "
                             "require_realizable, true); --no-require-realizable ranks the "
                             "reference's raw layouts (parity studies)")


def _add_min_accelerators(parser):
    parser.add_argument("--min-accelerators", type=_positive_int, metavar="N",
                        help="at least N accelerators")


def _add_allow_partial(parser):
    parser.add_argument("--allow-partial", action="store_true",
                        help="read an unfinished sweep's cube: the points priced so far")


def _version() -> str:
    """The installed distribution's version, from its metadata."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("layout-sweep")
    except PackageNotFoundError:  # a source checkout on sys.path, not installed
        return f"{solver.__version__} (not installed)"


def build_parser(prog: str = _PROG) -> argparse.ArgumentParser:
    """The argument parser of ``layout-sweep`` (the main job's options and the commands)."""
    parser = _Parser(
        prog=prog, description="Price millions of distributed-training layouts: sweeps into "
        "labeled cubes,\nsearches, tables and plots. With no command, runs the default sweep "
        "(configs/sweeps/default.toml)\nin memory, prints the best layouts and writes the cube.",
        epilog=f"examples:\n  {prog} run configs/sweeps/cluster_size.toml -o cluster.nc\n"
        f"  {prog} top cluster.nc --objective mfu -k 5 --select zero_stage=1\n"
        f"  {prog} plot cluster.nc --kind heatmap --x tp_size --y dp_size -o mfu.png\n"
        f"  {prog} search configs/sweeps/search_llama70b.toml --seed 0\n"
        f"  {prog} COMMAND --help",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}",
                        help="print the installed package's version and exit")
    parser.add_argument("--spec", dest="main_spec", default=str(DEFAULT_SPEC), metavar="SPEC",
                        help="main job: a spec other than the built-in default")
    parser.add_argument("-o", "--output", dest="main_output", default=None, metavar="CUBE",
                        help=f"main job: where to write the cube (default: {DEFAULT_CUBE}; "
                        "default_megatron_cube.nc with --physics megatron)")
    parser.add_argument("--no-save", action="store_true", help="main job: do not write the cube")
    parser.add_argument("--physics", dest="main_physics", type=_PHYSICS_TYPE, metavar="MODEL",
                        help=f"main job: the physics model ({_PHYSICS_HELP}); megatron without "
                        "--spec sweeps the built-in megatron_llama70b spec")
    parser.add_argument("-k", "--top", dest="main_top", type=_positive_int, default=10, metavar="K",
                        help="main job: splits shown (default: 10)")
    parser.add_argument("--jobs", dest="main_jobs", type=_jobs, default=1, metavar="N",
                        help="main job: worker processes (default: 1)")
    parser.add_argument("--no-progress", dest="main_no_progress", action="store_true",
                        help="main job: no progress bar")
    _add_require_realizable(parser, dest="main_require_realizable")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    for add in (_add_run, _add_search, _add_top, _add_show, _add_catalog, _add_plot,
                _add_calibrate):
        add(commands)
    return parser


def _add_run(commands):
    """The ``run`` command's arguments."""
    run = commands.add_parser("run", help="price every layout of a spec into a cube file",
                              description="Price every layout of a spec, streamed into a "
                              "netCDF cube file.")
    run.add_argument("spec", metavar="SPEC", help="a sweep spec (TOML)")
    run.add_argument("-o", "--output", help="the cube file (default: <spec name>.nc)")
    run.add_argument("--jobs", type=_jobs, default=1, help="worker processes (-1: every core)")
    run.add_argument("--physics", type=_PHYSICS_TYPE, metavar="MODEL",
                     help=f"the physics model ({_PHYSICS_HELP}), instead of the spec's")
    run.add_argument("--resume", action="store_true",
                     help="continue an interrupted sweep from <output>.partial")
    run.add_argument("--block-points", type=_positive_int, default=None, metavar="N",
                     help="points per block (bounds memory)")
    _add_deprecated(run, "--max-points", "--block-points", "block_points", type=_positive_int)
    _add_require_realizable(run)
    _add_calibration(run)
    _add_progress(run)


def _add_search(commands):
    """The ``search`` command's arguments."""
    search = commands.add_parser("search", help="search a spec's layouts with optuna",
                                 description="Search a spec's layouts for the best objective "
                                 "under a memory limit: exhaustively when the whole space prices "
                                 "within --time-budget, else sampled (optuna proposals refined "
                                 "by pricing whole sub-grids); --mode forces one.")
    search.add_argument("spec", metavar="SPEC", help="a spec (TOML)")
    search.add_argument("--trials", type=_positive_int, help="sampled mode: a fixed budget of "
                        "plain optuna trials (the classic ask/tell loop, as a study shared "
                        "through --storage runs); default: the sub-grid search, which stops by "
                        "evidence and in a large space finds better layouts than a few hundred "
                        "plain trials")
    search.add_argument("--seed", type=_seed, help="seeds the sampler (0 .. 2**32 - 1)")
    search.add_argument("--physics", type=_PHYSICS_TYPE, metavar="MODEL",
                        help=f"the physics model ({_PHYSICS_HELP}), instead of the spec's")
    search.add_argument("--memory-limit", type=_memory_limit, metavar="LIMIT",
                        help="'72 GB', bytes, or a fraction of the accelerator's memory (0.9); "
                             "default: the spec's")
    search.add_argument("--objective", default="mfu", help="output to optimize (default: mfu)")
    _add_direction(search)
    search.add_argument("--sampler", default="tpe", type=_one_of(_SAMPLERS, "a sampler"),
                        help="sampled mode: the optuna sampler (" + ", ".join(_SAMPLERS)
                        + "; default tpe)")
    search.add_argument("--storage", help="optuna storage: an RDB URL or a journal file "
                        "(*.log) to resume or share a study")
    search.add_argument("--study-name", help="study name (default: from the spec and space)")
    search.add_argument("--mode", default=None,
                        type=_one_of(("auto", "exhaustive", "sampled"), "a mode"),
                        help="auto (default): exhaustive when it fits --time-budget, else "
                             "sampled; exhaustive: every layout; sampled: optuna")
    search.add_argument("--exact", action="store_true",
                        help="the same as --mode exhaustive (every layout: the true optimum)")
    search.add_argument("--time-budget", type=_seconds, default=None, metavar="SECONDS",
                        help="wall time auto mode allows the exhaustive walk, and the sampled "
                             "search at most (default: 60)")
    search.add_argument("-k", "--top", dest="k", type=_positive_int, default=10, metavar="K",
                        help="layouts listed (default: 10)")
    search.add_argument("--batch-size", type=_positive_int, help="trials priced per batch")
    search.add_argument("--jobs", type=_jobs, default=1, help="processes for --exact")
    _add_min_accelerators(search)
    _add_require_realizable(search)
    _add_calibration(search)
    _add_progress(search)


def _add_top(commands):
    """The ``top`` command's arguments."""
    top = commands.add_parser("top", help="the best layouts of a cube",
                              description="The best layouts of a cube by one variable.")
    top.add_argument("cube", metavar="CUBE", help="a cube file (netCDF)")
    top.add_argument("--objective", default="mfu", help="variable to rank by (default: mfu)")
    _add_deprecated(top, "--by", "--objective", "objective")
    top.add_argument("-k", "--top", dest="k", type=_positive_int, default=10, metavar="K",
                     help="layouts listed (default: 10)")
    _add_direction(top)
    _add_deprecated(top, "--smallest", "--minimize", "direction", nargs=0, const=MINIMIZE)
    top.add_argument("--keep-ties", action="store_true",
                     help="list layouts equal in every output one by one (by default they "
                          "are one row, listing the knobs' equivalent values: 1|2|4)")
    top.add_argument("--breakdown", action="store_true",
                     help="also each listed layout's step time by term (compute, TP, CP, EP, PP, "
                          "exposed DP, bubble, ...; share of its step) and its memory by part")
    _add_narrowing(top)


def _add_show(commands):
    """The ``show`` command's arguments."""
    show = commands.add_parser("show", help="dims, variables, masks and provenance of a cube",
                               description="Dims, variables, masks and provenance of a cube.")
    show.add_argument("cube", metavar="CUBE", help="a cube file (netCDF)")
    _add_allow_partial(show)


def _add_catalog(commands):
    """The ``catalog`` command's arguments."""
    cat = commands.add_parser("catalog", help="workloads, fleets and hardware known by name",
                              description="The built-in catalog, with key facts.")
    cat.add_argument("kind", nargs="?", metavar="KIND|FILE",
                     help=f"one of {', '.join(_CATALOG_KINDS)} (default: all), or a catalog "
                          f"TOML file of your own to list its entries")


def _add_plot(commands):
    """The ``plot`` command's arguments."""
    plt = commands.add_parser("plot", help="heatmap, line or Pareto plot of a cube (PNG)",
                              description="Plot a cube: a heatmap of a variable over two dims "
                              "or a line along one (the other dims reduced over the selected "
                              "points, or pinned with --select), or a Pareto scatter of two "
                              "variables.")
    plt.add_argument("cube", metavar="CUBE", help="a cube file (netCDF)")
    plt.add_argument("--kind", default="heatmap", type=_one_of(_PLOT_KINDS, "a plot kind"),
                     help="the plot: " + ", ".join(_PLOT_KINDS) + " (default heatmap)")
    plt.add_argument("--var", default="mfu", help="variable plotted (heatmap, line)")
    plt.add_argument("--x", help="dim on x (default tp_size); pareto: a variable "
                     "(default memory_footprint)")
    plt.add_argument("--y", help="dim on y (default pp_size); pareto: a variable (default mfu)")
    plt.add_argument("--hue", help="line: one line per value of this dim")
    plt.add_argument("--reduce", default="max", type=_one_of(("max", "min", "mean"),
                                                             "a reduction"),
                     help="how the dims not plotted are reduced (default: max)")
    plt.add_argument("-o", "--output", help="PNG file (default: <cube>_<kind>_<var>.png)")
    plt.add_argument("--dpi", type=_positive_int, default=120,
                     help="resolution of a raster figure (default 120)")
    _add_narrowing(plt)


def _add_calibration(parser):
    parser.add_argument("--calibration", metavar="FILE",
                        help="price with a calibration profile (from `calibrate`; replaces the "
                             "spec's calibration)")


def _add_calibrate(commands):
    """The ``calibrate`` command's arguments."""
    cal = commands.add_parser(
        "calibrate", help="fit the megatron physics to your measured runs (a profile)",
        description="Fit the megatron physics' free constants to measured step times "
        "(CSV: one run a line; see sweep.calibration.measurements), print the fit and the "
        "per-run residuals, save the profile (TOML) for specs, run and search.")
    cal.add_argument("measurements", metavar="RUNS.csv", help="the measured runs (CSV)")
    cal.add_argument("-o", "--output", metavar="PROFILE.toml", help="write the profile here")
    cal.add_argument("--free", metavar="A,B,...", help="constants to fit (default: gemm_scale, "
                     "[fp8_gemm_scale,] scale_up_efficiency, scale_out_efficiency, "
                     "overlap_efficiency, step_overhead[, layer_overhead where runs are "
                     "launch-bound]; auto: those of them the runs support, chosen by "
                     "leave-one-out error)")
    loo = cal.add_mutually_exclusive_group()
    loo.add_argument("--no-loo", action="store_true", help="skip the leave-one-out refits "
                     "(default: run them up to 200 runs, one fit per run)")
    loo.add_argument("--loo", action="store_true", help="run the leave-one-out refits however "
                     "many the runs")
    cal.add_argument("--prior-width", metavar="W", type=float, default=None,
                     help="standard deviation of the prior on each log constant around its "
                     "start (default: per constant, sweep.calibration.core.PRIOR_WIDTHS; "
                     "inf: plain least squares)")
    cal.add_argument("--noise", metavar="S", type=float, default=None,
                     help="assumed scatter of a run's log step time about the model "
                     "(default 0.03)")
    cal.add_argument("--calibration", metavar="FILE",
                     help="score this profile on the runs instead of fitting")
    cal.add_argument("--plot", metavar="PNG", help="also plot predicted vs measured")
