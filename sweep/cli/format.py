"""Text for the terminal: aligned tables, layout tables, numbers, sizes and counts."""

from __future__ import annotations

import json
from typing import Mapping, Optional, Sequence

import numpy as np

from solver.outputs import is_bytes

from ..analysis.explain import _fmt, _plain  # one way to write a coordinate value
from ._common import _GB

__all__ = ["format_table"]


#: Value columns of a layout table: variable -> (header, format).
_COLUMNS = {
    "mfu": ("MFU", "{:.4f}"),
    "step_latency_total": ("step [s]", "{:.3f}"),
    "effective_throughput": ("samples/s", "{:.1f}"),
    "memory_footprint": ("memory [GB]", "{:.1f}"),
    "n_accelerators": ("accelerators", "{:.0f}"),
}


_TABLE_VALUES = ("mfu", "step_latency_total", "memory_footprint", "n_accelerators")


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *,
                 left: Sequence[int] = ()) -> str:
    """Rows of strings as aligned columns under their headers.

    Parameters
    ----------
    headers : sequence of str
    rows : sequence of sequences of str
    left : sequence of int
        Columns aligned left (the others are aligned right).

    Returns
    -------
    str
        The header line, a rule, and one line per row.
    """
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells):
        return "  ".join(c.ljust(w) if i in left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths])]
                     + [line(r) for r in rows])


def _value_column(name, units=None):
    if name in _COLUMNS:
        return _COLUMNS[name]
    if is_bytes(units):
        return f"{name} [GB]", "{:.3g}"
    return (f"{name} [{units}]" if units and units != "1" else name), "{:.4g}"


def _format_value(name, value, units=None) -> str:
    value = _plain(value)
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    scale = _GB if name == "memory_footprint" or is_bytes(units) else 1.0
    return _value_column(name, units)[1].format(value / scale)


def _layout_table(rows: Sequence[Mapping], dims: Sequence[str], values: Sequence[str],
                  units: Optional[Mapping] = None, *, first: str = "#") -> str:
    """A table of layouts: dims that vary as columns, the others in one line above.

    ``rows`` map dims and value names to values; ``values`` are the value columns.
    """
    units = dict(units or {})

    def cell(r, d):  # blank where a row has no such dim (a knob of another physics model)
        return _fmt(r[d]) if d in r else ""
    dims = [d for d in dims if any(d in r for r in rows)]
    varying = [d for d in dims if len({cell(r, d) for r in rows}) > 1]
    constant = [d for d in dims if d not in varying]
    lines = []
    if constant and rows:
        lead = "same in every row" if len(rows) > 1 else "layout"
        lines.append(f"{lead}: " + ", ".join(f"{d}={cell(rows[0], d)}" for d in constant))
    headers = [first] + varying + [_value_column(v, units.get(v))[0] for v in values]
    cells = [[str(i)] + [cell(r, d) for d in varying]
             + [_format_value(v, r.get(v), units.get(v)) for v in values]
             for i, r in enumerate(rows, 1)]
    lines.append(format_table(headers, cells))
    return "\n".join(lines)


def _human_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _memory_size(n: float) -> str:
    """An accelerator's memory [B] in GB (1e9 B), with GiB alongside when it is whole GiB.

    Sizes are printed in GB everywhere (the reference's convention); the
    catalog gives memories in GiB, so ``80 GiB`` prints as ``85.9 GB = 80 GiB``,
    never as a bare ``86 GB`` that reads like a datasheet's 80.
    """
    text = f"{n / 1e9:.3g} GB"
    gib = n / 2**30
    if gib >= 1 and abs(gib - round(gib)) < 1e-9 * gib:
        text += f" = {round(gib)} GiB"
    return text


def _count(value) -> str:
    """A parameter count: ``70.6 B``, ``83 M``."""
    if not value:
        return "-"
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f}"


def _opt(value) -> str:
    return "-" if value is None else str(value)


def _values_text(values, limit: int = 10) -> str:
    shown = [_fmt(v) for v in values]
    if len(shown) > limit:
        shown = shown[:limit - 3] + ["..."] + shown[-2:]
    return ", ".join(shown)


def _pretty_json(value, indent: int = 0) -> str:
    """JSON with one key per line, but short lists and tables of plain values inline."""
    inline = json.dumps(value)
    if not isinstance(value, (dict, list)):
        return inline
    members = value.values() if isinstance(value, dict) else value
    if all(not isinstance(v, (dict, list)) for v in members) and len(inline) + indent <= 100:
        return inline
    pad = " " * (indent + 2)
    if isinstance(value, dict):
        items = [f"{pad}{json.dumps(k)}: {_pretty_json(v, indent + 2)}"
                 for k, v in sorted(value.items())]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [f"{pad}{_pretty_json(v, indent + 2)}" for v in value]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
