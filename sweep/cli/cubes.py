"""Cube files and what the user asks of them: opened, checked, narrowed, read as rows."""

from __future__ import annotations

import json
import traceback
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np

from solver.outputs import n_accelerators

from ..cube import MASKS

from ._common import _PROG, _SPLIT_DIMS, UsageError, _one_line, _suggest
from .format import _fmt, _plain


#: The cube files this command opened, latest last (:func:`damaged` names them).
OPENED: list = []

#: Where the netCDF library's own code runs: an error raised there is the file's, not ours.
_NETCDF_CODE = ("netCDF4", "h5py", "h5netcdf")


def damaged(err: BaseException) -> bool:
    """Whether ``err`` was raised inside the netCDF library while reading a file.

    ``RuntimeError: NetCDF: HDF error`` (a corrupt data chunk, read lazily by
    any command) or ``AttributeError: NetCDF: Can't open HDF5 attribute`` (a
    corrupt header); an error raised by this project's code is not.
    """
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and any(name in frames[-1].filename for name in _NETCDF_CODE)


def damaged_message(err: BaseException) -> str:
    """The one line for a cube whose data the netCDF library cannot read."""
    path = OPENED[-1] if OPENED else "the cube file"
    detail = str(err).splitlines()[0] if str(err) else type(err).__name__
    return (f"{path}: expected a readable cube, but the netCDF library cannot read its data "
            f"({detail}): the file is damaged (cut short or changed since it was written); "
            f"copy it again, or re-create it with `{_PROG} run SPEC -o {path}`")


def _open_cube(path, allow_partial: bool = False):
    """A finished cube file opened lazily; anything else is a :class:`UsageError`.

    With ``allow_partial`` an unfinished sweep's cube (or its staged blocks) opens too.
    """
    from .. import storage

    path = Path(path)
    incomplete = getattr(storage, "IncompleteCubeError", ())
    try:
        cube = storage.open_cube(path, allow_partial=allow_partial)
    except FileNotFoundError as err:
        raise UsageError(f"{path}: expected a cube file (written by `{_PROG} run`), "
                         f"but {err}") from None
    except incomplete as err:
        if path.is_file():
            _check_foreign(path)
        raise UsageError(f"{path}: expected a finished cube, but {_one_line(err)}; or pass "
                         f"--allow-partial to look at the points priced so far") from None
    except (OSError, ValueError) as err:
        raise UsageError(_unreadable(path, err)) from None
    except (AttributeError, RuntimeError) as err:  # a corrupt header, if netCDF says so
        if not damaged(err):
            raise
        raise UsageError(_unreadable(path, err)) from None
    OPENED.append(path)
    _check_masks(path, cube)
    return cube


def _unreadable(path, err) -> str:
    detail = str(err).splitlines()[0] if str(err) else type(err).__name__
    return (f"{path}: expected a cube (a netCDF file written by `{_PROG} run`), but it "
            f"cannot be read as netCDF ({detail})")


def _check_foreign(path) -> None:
    """Raise :class:`UsageError` if the netCDF file at ``path`` is not a cube at all."""
    import xarray as xr

    from ..storage import ENGINE

    try:
        dataset = xr.open_dataset(path, engine=ENGINE)
    except (OSError, ValueError) as err:
        raise UsageError(_unreadable(path, err)) from None
    except (AttributeError, RuntimeError) as err:
        if not damaged(err):
            raise
        raise UsageError(_unreadable(path, err)) from None
    _check_masks(path, dataset)
    dataset.close()


def _check_masks(path, dataset) -> None:
    missing = [m for m in MASKS if m not in dataset.data_vars]
    if missing:
        names = ", ".join(dataset.data_vars) or "none"
        dataset.close()
        raise UsageError(f"{path}: expected a cube written by {_PROG} (with the masks "
                         f"{', '.join(MASKS)}), but it has the variables: {names}")


def _check_variable(cube, name, what, *, numeric=True) -> str:
    choices = [n for n, v in cube.data_vars.items() if not numeric or v.dtype != bool]
    if name not in choices:
        kind = "a numeric variable" if numeric else "a variable"
        raise UsageError(f"{what}: expected {kind} of the cube ({', '.join(choices)}), "
                         f"but got {name!r}{_suggest(name, choices)}")
    return name


def _check_where(cube, name) -> str:
    choices = [n for n, v in cube.data_vars.items() if v.dtype == bool]
    if name not in choices:
        raise UsageError(f"--where: expected a boolean variable of the cube "
                         f"({', '.join(choices)}), but got {name!r}{_suggest(name, choices)}")
    return name


def _check_dim(cube, name, what) -> str:
    dims = list(cube.dims)
    if name not in dims:
        raise UsageError(f"{what}: expected a dim of the cube ({', '.join(dims)}), "
                         f"but got {name!r}{_suggest(name, dims)}")
    return name

_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def _coordinate_value(cube, dim, text):
    """The coordinate value of ``dim`` that ``text`` names (numbers compared as numbers)."""
    values = np.asarray(cube[dim].values)
    shown = ", ".join(_fmt(v) for v in values)
    expected = f"--select {dim}: expected one of {shown}, but got {text!r}"
    kind = values.dtype.kind
    if kind == "b":
        lowered = text.strip().lower()
        if lowered not in _TRUE + _FALSE:
            raise UsageError(expected)
        wanted = lowered in _TRUE
        match = np.flatnonzero(values == wanted)
    elif kind in "iuf":
        try:
            number = float(text)
        except ValueError:
            raise UsageError(expected) from None
        match = np.flatnonzero(np.isclose(values.astype(np.float64), number, rtol=1e-9, atol=0))
    else:
        match = np.flatnonzero(values.astype(str) == text)
        if not len(match):
            raise UsageError(expected + _suggest(text, values.astype(str)))
    if not len(match):
        raise UsageError(expected)
    return _plain(values[match[0]])


def _parse_select(cube, items: Optional[Sequence[str]]) -> dict:
    """``["tp_size=4", ...]`` -> ``{"tp_size": 4, ...}``, each checked against the cube."""
    out = {}
    for item in items or ():
        dim, sep, text = item.partition("=")
        dim = dim.strip()
        if not sep or not dim or not text.strip():
            raise UsageError(f"--select: expected dim=value such as tp_size=4, but got {item!r}")
        _check_dim(cube, dim, "--select")
        if dim in out:
            raise UsageError(f"--select: expected each dim once, but got {dim!r} twice")
        out[dim] = _coordinate_value(cube, dim, text.strip())
    return out


def _constraints(args) -> dict:
    out = {}
    if getattr(args, "memory_limit", None) is not None:
        out["memory_limit"] = args.memory_limit
    if getattr(args, "max_accelerators", None) is not None:
        out["max_accelerators"] = args.max_accelerators
    if getattr(args, "min_accelerators", None) is not None:
        out["min_accelerators"] = args.min_accelerators
    low, high = out.get("min_accelerators"), out.get("max_accelerators")
    if low is not None and high is not None and low > high:
        raise UsageError(f"--min-accelerators: expected at most --max-accelerators ({high}), "
                         f"but got {low}: no layout could pass both")
    return out


def _rows(points, dims, values) -> list:
    """Result datasets of top_k / pareto_front (dim ``rank`` or ``point``) as dicts."""
    along = next(iter(points.dims), None)
    n = points.sizes[along] if along else 0
    names = [d for d in dims if d in points] + [v for v in values if v in points]
    data = {name: np.asarray(points[name].values) for name in names}
    return [{name: _plain(data[name][i]) for name in names} for i in range(n)]


def _with_dp(row: dict, fixed: Mapping, physics=None) -> dict:
    """Add the derived ``dp_size`` (accelerators / model-parallel ranks) to a row that lacks it.

    The model-parallel ranks are TP*PP*EP for mlsysim, TP*PP*CP for megatron
    (:func:`solver.outputs.n_accelerators`); the row's ``physics``, else ``physics``.
    """
    if "dp_size" in row or "n_accelerators" not in row:
        return row
    model = row.get("physics", physics) or "mlsysim"
    knobs = {name: int(_plain(row.get(name, fixed.get(name, 1))))
             for name in ("tp_size", "pp_size", "ep_size", "cp_size")}
    model_parallel = int(n_accelerators({"dp_size": 1}, knobs, physics=str(model)))
    count = _plain(row["n_accelerators"])
    if isinstance(count, float) and not np.isfinite(count):
        return row
    return {"dp_size": int(count) // model_parallel, **row}


def _split_first(dims: Sequence[str], row: Mapping) -> list:
    """Table column order: workload and fleet, the split (with a derived dp_size), the rest."""
    labels = [d for d in dims if d in ("workload", "fleet")]
    split = [d for d in _SPLIT_DIMS if d in dims or (d == "dp_size" and d in row)]
    return labels + split + [d for d in dims if d not in labels and d not in split]


def _fixed(cube) -> dict:
    try:
        return json.loads(cube.attrs.get("fixed", "{}"))
    except ValueError:
        return {}
