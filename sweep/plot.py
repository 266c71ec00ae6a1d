"""Plots of a cube: heatmaps over two dims, lines along one, Pareto fronts of two outputs.

Each function takes a cube (in memory or opened lazily with
:func:`sweep.open_cube`) and returns a :class:`matplotlib.figure.Figure`::

    >>> import sweep, sweep.plot
    >>> cube = sweep.open_cube("default_cube.nc")
    >>> fig = sweep.plot.heatmap(cube, "mfu", x="tp_size", y="pp_size")   # max over the rest
    >>> fig = sweep.plot.line(cube, "mfu", x="microbatch_count", hue="pp_size")
    >>> fig = sweep.plot.pareto(cube, x="memory_footprint", y="mfu")
    >>> fig.savefig("mfu.png")

The dims not plotted are reduced (``reduce="max"`` by default) over the points
``where`` selects (``admissible`` by default, see :func:`sweep.analysis.mask`),
or pinned with ``select={"zero_stage": 1}``; with no selected point at all a
plot raises :class:`sweep.analysis.NoAdmissibleError`, saying why. Bytes are
shown in GB (1e9 B).

matplotlib is an optional dependency (the ``plot`` extra) imported only when a
plot is drawn. Figures are built without :mod:`matplotlib.pyplot` (no global
state, no backend switch): ``savefig`` renders PNGs with Agg, and a notebook
shows a returned figure inline. Pass ``ax=`` to draw into an axes of your own.
"""

from __future__ import annotations

import textwrap
import warnings
from typing import Mapping, Optional

import numpy as np
import xarray as xr

from solver.outputs import MAXIMIZE, MINIMIZE, better, is_bytes

from . import analysis

__all__ = ["heatmap", "line", "pareto", "calibration", "reduce_to", "label", "REDUCTIONS"]

#: Reductions over the dims that are not plotted.
REDUCTIONS = ("max", "min", "mean")
#: Cells of a heatmap up to which each cell is annotated with its value.
ANNOTATE_CELLS = 144
_GB = 1e9


# ----------------------------------------------------------------------------- data


def _check_dim(cube: xr.Dataset, dim: str, what: str) -> None:
    if dim not in cube.dims:
        raise ValueError(f"{what} must be a dim of the cube ({', '.join(cube.dims)}), "
                         f"but got {dim!r}")


def _check_var(cube: xr.Dataset, name: str, what: str) -> None:
    if name not in cube.data_vars:
        raise ValueError(f"{what} must be a data variable of the cube "
                         f"({', '.join(cube.data_vars)}), but got {name!r}")
    try:  # an output of neither model of the points plotted: an all-NaN (grey) plot otherwise
        analysis.masks.require_output(cube, name, what)
    except KeyError as error:
        raise ValueError(str(error)) from None


def _select(cube: xr.Dataset, select: Optional[Mapping]) -> xr.Dataset:
    """The cube with each dim of ``select`` pinned to one value (the dim dropped)."""
    if not select:
        return cube
    for dim in select:
        _check_dim(cube, dim, "select")
    return cube.sel(dict(select))


def reduce_to(cube: xr.Dataset, var: str, dims, *, reduce: str = "max", where=None,
              select: Optional[Mapping] = None,
              constraints: Optional[Mapping] = None) -> xr.DataArray:
    """``var`` over ``dims`` alone: the other dims reduced over the selected points.

    Parameters
    ----------
    cube : xarray.Dataset
    var : str
        A data variable.
    dims : sequence of str
        The dims to keep, in order.
    reduce : {"max", "min", "mean"}
        How the other dims are reduced.
    where, constraints
        Which points count (see :func:`sweep.analysis.mask`); ``admissible``
        by default.
    select : mapping, optional
        Dims pinned to one value before reducing (``{"zero_stage": 1}``).

    Returns
    -------
    xarray.DataArray
        Over ``dims``; NaN where no point is selected.

    Raises
    ------
    sweep.analysis.NoAdmissibleError
        When no point at all is selected: its message says how many points
        each condition removed and which to relax (so do :func:`heatmap`,
        :func:`line` and :func:`pareto`).
    """
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {', '.join(REDUCTIONS)}, but got {reduce!r}")
    dims = tuple(dims)
    if select:
        for dim in dims:
            if dim in select:
                raise ValueError(f"{dim!r} is plotted, so it cannot also be selected "
                                 f"(select={dict(select)!r})")
    _check_var(cube, var, "var")
    cube = _select(cube, select)
    _check_var(cube, var, "var")  # again: the models of the points selected
    for dim in dims:
        _check_dim(cube, dim, "a plotted dim")
    selected = _selected(cube, where, constraints)
    values = cube[var].astype(np.float64).where(selected)
    others = [d for d in values.dims if d not in dims]
    analysis.ranking.warn_reduced(cube, others, selected, stacklevel=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices: no selected point
        reduced = getattr(values, reduce)(dim=others, skipna=True) if others else values
    reduced = reduced.expand_dims([d for d in dims if d not in reduced.dims])
    return reduced.transpose(*dims)


def _selected(cube: xr.Dataset, where, constraints) -> xr.DataArray:
    """The mask of the plotted points; none is a :class:`sweep.analysis.NoAdmissibleError`."""
    selected = analysis.mask(cube, where, constraints)
    if not bool(selected.any()):
        raise analysis.NoAdmissibleError(analysis.admissible_counts(cube, where, constraints))
    return selected


def _scale(cube: xr.Dataset, var: str) -> float:
    """Divisor for display: bytes in GB, everything else as stored."""
    return _GB if is_bytes(cube[var].attrs.get("units")) else 1.0


def label(cube: xr.Dataset, name: str) -> str:
    """An axis label: ``"mfu: fleet model FLOPs utilization"``, with units (bytes in GB)."""
    attrs = cube[name].attrs
    units = attrs.get("units", "")
    units = "GB" if is_bytes(units) else units
    text = name + (f": {attrs['long_name']}" if attrs.get("long_name") else "")
    return text + (f" [{units}]" if units and units != "1" else "")


def _reduced_title(cube, var, dims, reduce, where, select) -> str:
    others = [d for d in cube.dims if d not in dims and d not in (select or {})]
    if where is None:  # analysis.mask's default
        where = "admissible" if "admissible" in cube.data_vars else "valid"
    where_name = where if isinstance(where, str) else "selected"
    if not others:
        text = var
    elif len(others) <= 3:
        text = f"{var}: {reduce} over {', '.join(others)}"
    else:
        text = f"{var}: {reduce} over the {len(others)} other dims"
    text += f" ({where_name} layouts)"
    if select:
        text += "\n" + textwrap.shorten(", ".join(f"{k}={_tick(v)}" for k, v in select.items()),
                                        width=80)
    return text


# ----------------------------------------------------------------------------- drawing


def _figure(ax, size):
    """``(figure, axes)``: the given axes' figure, or a new figure (no pyplot)."""
    if ax is not None:
        return ax.figure, ax
    from matplotlib.figure import Figure

    figure = Figure(figsize=size, layout="constrained")
    return figure, figure.add_subplot()


def _tick(value) -> str:
    value = value.item() if hasattr(value, "item") else value
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _is_powers_of_two(values) -> bool:
    values = np.asarray(values)
    if values.dtype.kind not in "iuf" or len(values) < 3 or (values <= 0).any():
        return False
    exponents = np.log2(values.astype(np.float64))
    return bool(np.allclose(exponents, np.round(exponents)))


def heatmap(cube: xr.Dataset, var: str = "mfu", x: str = "tp_size", y: str = "pp_size", *,
            reduce: str = "max", where=None, select: Optional[Mapping] = None,
            constraints: Optional[Mapping] = None, annotate: Optional[bool] = None,
            cmap: str = "viridis", ax=None):
    """A heatmap of ``var`` over dims ``x`` and ``y``, the other dims reduced.

    Parameters
    ----------
    cube : xarray.Dataset
    var : str
        The data variable to color by.
    x, y : str
        Dims on the horizontal and vertical axes (one cell per coordinate value).
    reduce, where, select, constraints
        See :func:`reduce_to`.
    annotate : bool, optional
        Write each cell's value in it; by default when there are at most
        :data:`ANNOTATE_CELLS` cells.
    cmap : str
        A matplotlib colormap; cells with no selected point are grey.
    ax : matplotlib.axes.Axes, optional
        Draw here instead of in a new figure.

    Returns
    -------
    matplotlib.figure.Figure
    """
    if x == y:
        raise ValueError(f"x and y must be two different dims, but got x = y = {x!r}")
    data = reduce_to(cube, var, (y, x), reduce=reduce, where=where, select=select,
                     constraints=constraints)
    values = np.asarray(data.values) / _scale(cube, var)
    import matplotlib

    figure, ax = _figure(ax, (1.2 + 0.6 * max(4, values.shape[1]),
                              1.4 + 0.45 * max(4, values.shape[0])))
    colors = matplotlib.colormaps[cmap].with_extremes(bad="0.85")
    image = ax.imshow(np.ma.masked_invalid(values), origin="lower", aspect="auto", cmap=colors,
                      interpolation="nearest")
    ax.set_xticks(range(values.shape[1]), [_tick(v) for v in data[x].values])
    ax.set_yticks(range(values.shape[0]), [_tick(v) for v in data[y].values])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    figure.colorbar(image, ax=ax, label=label(cube, var))
    ax.set_title(_reduced_title(cube, var, (x, y), reduce, where, select), fontsize="medium")
    if annotate is None:
        annotate = values.size <= ANNOTATE_CELLS
    if annotate and np.isfinite(values).any():
        low, high = np.nanmin(values), np.nanmax(values)
        middle = (low + high) / 2
        for (i, j), value in np.ndenumerate(values):
            if np.isfinite(value):
                ax.text(j, i, f"{value:.3g}", ha="center", va="center", fontsize="small",
                        color="black" if value > middle else "white")
    return figure


def line(cube: xr.Dataset, var: str = "mfu", x: str = "tp_size", *, hue: Optional[str] = None,
         reduce: str = "max", where=None, select: Optional[Mapping] = None,
         constraints: Optional[Mapping] = None, ax=None):
    """``var`` along dim ``x`` (one line per value of dim ``hue``), the other dims reduced.

    Parameters
    ----------
    cube : xarray.Dataset
    var : str
        The data variable on the vertical axis.
    x : str
        The dim on the horizontal axis; powers of two get a log2 scale, names
        and booleans one tick each.
    hue : str, optional
        A dim drawn as one line per value.
    reduce, where, select, constraints
        See :func:`reduce_to`.
    ax : matplotlib.axes.Axes, optional

    Returns
    -------
    matplotlib.figure.Figure
    """
    if hue == x:
        raise ValueError(f"hue must be a dim other than x, but got hue = x = {x!r}")
    dims = (x,) if hue is None else (x, hue)
    data = reduce_to(cube, var, dims, reduce=reduce, where=where, select=select,
                     constraints=constraints) / _scale(cube, var)
    figure, ax = _figure(ax, (6.4, 4.4))
    coords = data[x].values
    numeric = coords.dtype.kind in "iuf"
    positions = coords if numeric else np.arange(len(coords))
    series = [(None, data)] if hue is None else [
        (f"{hue}={_tick(v)}", data.sel({hue: v})) for v in data[hue].values]
    marker = "o" if len(positions) <= 24 else None
    for name, values in series:
        if np.isfinite(values.values).any():  # a hue value with no selected point: no line
            ax.plot(positions, values.values, marker=marker, label=name)
    if not numeric:
        ax.set_xticks(positions, [_tick(v) for v in coords])
    elif _is_powers_of_two(coords):
        ax.set_xscale("log", base=2)
        ax.set_xticks(coords, [_tick(v) for v in coords])
    ax.set_xlabel(x)
    ax.set_ylabel(label(cube, var))
    ax.grid(True, alpha=0.3)
    if hue is not None:
        ax.legend(title=None, fontsize="small")
    ax.set_title(_reduced_title(cube, var, dims, reduce, where, select), fontsize="medium")
    return figure


def _direction(name: str) -> str:
    """The registry's direction of better for ``name`` (``"minimize"`` if it has none)."""
    try:
        return better(name) or MINIMIZE
    except KeyError:
        return MINIMIZE


def _word(direction: str) -> str:
    """``"maximize"`` for ``"maximize"`` and its deprecated spelling ``"max"``."""
    return {"max": MAXIMIZE, "min": MINIMIZE}.get(direction, direction)


def _flat(cube, names, selected) -> list:
    """Each variable of ``names`` at the selected points with finite values, flat."""
    arrays = xr.broadcast(*(cube[n].astype(np.float64) for n in names), selected)
    columns = [np.asarray(a.values).ravel() for a in arrays[:-1]]
    keep = np.asarray(arrays[-1].values).ravel().astype(bool)
    for column in columns:
        keep &= np.isfinite(column)
    return [column[keep] for column in columns]


def pareto(cube: xr.Dataset, x: str = "memory_footprint", y: str = "mfu", *,
           directions: Optional[Mapping] = None, where=None, select: Optional[Mapping] = None,
           constraints: Optional[Mapping] = None, max_points: int = 20_000, seed: int = 0,
           ax=None, senses: Optional[Mapping] = None):
    """A scatter of two outputs over the selected layouts, with their Pareto front.

    Parameters
    ----------
    cube : xarray.Dataset
    x, y : str
        Data variables on the two axes.
    directions : mapping of str -> "maximize" or "minimize", optional
        What is better for each; by default the output registry's direction
        of better (:func:`solver.outputs.better`; ``"minimize"`` for a
        variable without one). ``"max"`` and ``"min"`` are deprecated.
    where, select, constraints
        See :func:`reduce_to`.
    max_points : int
        At most this many layouts are drawn (a seeded random sample); the
        front is computed over all of them (:func:`sweep.pareto_front`).
    seed : int
        Seeds the sample.
    ax : matplotlib.axes.Axes, optional
    senses
        Deprecated spelling of ``directions``.

    Returns
    -------
    matplotlib.figure.Figure
    """
    if senses is not None:
        if directions is not None:
            raise TypeError("give directions= only, not also its deprecated spelling senses=")
        warnings.warn("senses= is deprecated; use directions=", DeprecationWarning, stacklevel=2)
        directions = senses
    if x == y:
        raise ValueError(f"x and y must be two different variables, but got x = y = {x!r}")
    for name, what in ((x, "x"), (y, "y")):
        _check_var(cube, name, what)
    directions = {x: _direction(x), y: _direction(y), **dict(directions or {})}
    cube = _select(cube, select)
    for name, what in ((x, "x"), (y, "y")):
        _check_var(cube, name, what)  # again: the models of the points selected
    selected = _selected(cube, where, constraints)
    cloud_x, cloud_y = _flat(cube, (x, y), selected)
    front = analysis.pareto_front(cube, {x: directions[x], y: directions[y]}, where=selected,
                                  constraints=constraints)
    sx, sy = _scale(cube, x), _scale(cube, y)
    figure, ax = _figure(ax, (6.4, 4.8))
    n = len(cloud_x)
    shown = (np.sort(np.random.default_rng(seed).choice(n, size=max_points, replace=False))
             if n > max_points else slice(None))
    if where is None:  # analysis.mask's default
        where = "admissible" if "admissible" in cube.data_vars else "valid"
    where_name = where if isinstance(where, str) else "selected"
    sampled = f", {max_points:,} drawn" if n > max_points else ""
    ax.scatter(cloud_x[shown] / sx, cloud_y[shown] / sy, s=5, alpha=0.35, color="0.55",
               linewidths=0, rasterized=True, label=f"{n:,} {where_name} layouts{sampled}")
    fx, fy = np.asarray(front[x].values, float) / sx, np.asarray(front[y].values, float) / sy
    order = np.argsort(fx, kind="stable")
    ax.plot(fx[order], fy[order], marker="o", markersize=4, color="tab:red",
            label=f"Pareto front ({len(fx)} layouts)")
    ax.set_xlabel(f"{label(cube, x)} ({_word(directions[x])})")
    ax.set_ylabel(f"{label(cube, y)} ({_word(directions[y])})")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    title = f"{y} against {x}"
    if select:
        title += "\n" + ", ".join(f"{k}={_tick(v)}" for k, v in select.items())
    ax.set_title(title, fontsize="medium")
    return figure


def calibration(measured, predicted, *, labels=None, uncalibrated=None, title: str = "",
                ax=None):
    """Predicted vs measured step time on log axes, with the identity line.

    Parameters
    ----------
    measured, predicted : array_like [s]
        Step times of the same runs (e.g. ``cal.measurements.step_times`` and
        ``cal.predicted`` of :func:`sweep.calibrate`).
    labels : sequence of str, optional
        A name per run, written beside its point.
    uncalibrated : array_like [s], optional
        The same runs before calibration, drawn as hollow markers.
    title : str
    ax : matplotlib.axes.Axes, optional

    Returns
    -------
    matplotlib.figure.Figure
    """
    meas, pred = np.asarray(measured, float), np.asarray(predicted, float)
    if meas.shape != pred.shape or meas.ndim != 1 or not meas.size:
        raise ValueError(f"measured and predicted must be 1-D of one length, but got shapes "
                         f"{meas.shape} and {pred.shape}")
    figure, ax = _figure(ax, (5.5, 5.0))
    points = [meas, pred] + ([np.asarray(uncalibrated, float)] if uncalibrated is not None else [])
    finite = np.concatenate([p[np.isfinite(p) & (p > 0)] for p in points])
    low, high = finite.min() / 1.3, finite.max() * 1.3
    ax.plot([low, high], [low, high], color="0.4", lw=1, label="identity (predicted = measured)")
    for factor in (0.9, 1.1):
        ax.plot([low, high], [low * factor, high * factor], color="0.7", lw=0.8, ls=":")
    if uncalibrated is not None:
        ax.scatter(meas, points[2], facecolors="none", edgecolors="tab:gray", s=28,
                   label="uncalibrated")
    err = np.mean(np.abs(pred / meas - 1.0)) * 100.0
    ax.scatter(meas, pred, color="tab:blue", s=28, label=f"calibrated (mean error {err:.1f} %)")
    for name, x, y in zip(labels if labels is not None else [], meas, pred):
        ax.annotate(str(name), (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("measured step time [s]")
    ax.set_ylabel("predicted step time [s]")
    ax.set_title(title or "calibration: predicted vs measured (dotted: +-10 %)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    return figure
