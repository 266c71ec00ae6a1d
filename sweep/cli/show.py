"""``show``: dims, variables, masks (with counts) and provenance of a cube."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..cube import MASKS
from ._common import _GB, EXIT_OK
from .cubes import _open_cube
from .format import _count, _human_bytes, _memory_size, _pretty_json, _values_text, format_table

__all__ = ["command"]


def _show_facts(attrs) -> list:
    lines = []
    try:
        workloads = json.loads(attrs.get("workloads", "{}"))
        fleets = json.loads(attrs.get("fleets", "{}"))
    except ValueError:
        return lines
    for key, w in workloads.items():
        params = w.get("parameters")
        lines.append(f"  workload {key}: {w.get('kind')}"
                     + (f", {_count(params)} parameters" if params else "")
                     + (f", {w['layers']} layers" if w.get("layers") else ""))
    for key, f in fleets.items():
        node = f["node"]
        lines.append(f"  fleet {key}: {f['count']} x {node['accelerators_per_node']} "
                     f"{node['accelerator']['name']} "
                     f"({_memory_size(node['accelerator']['memory_capacity'])}) on "
                     f"{f['fabric']['name']} ({f['fabric']['bandwidth'] / _GB:.0f} GB/s)")
    return lines


def _calibration_lines(text) -> tuple:
    """The provenance lines of the calibration profile a cube was priced with, and the
    physics model it calibrates (``([], None)`` for none)."""
    if not text:
        return [], None
    try:
        profile = json.loads(text)
        constants = profile["constants"]
    except (ValueError, TypeError, KeyError):
        return [f"  calibration: {text}"], "megatron"  # (the one model with fitted constants)
    mape = profile.get("in_sample_mape")
    runs = profile.get("runs", "?")
    fit = (f"{runs} run{'' if runs == 1 else 's'} of {profile.get('data_source') or '?'}, "
           f"{profile.get('date', '?')}"
           + (f", in-sample error {mape:.2f} %" if isinstance(mape, (int, float)) else ""))
    return [f"  calibration: {profile.get('path') or 'a profile'} ({fit}); priced with the "
            f"constants {json.dumps(constants, sort_keys=True)}"], profile.get("physics", "megatron")


def _physics_models(attrs) -> dict:
    """``physics_models`` of a cube (model -> its provenance), {} for an older cube."""
    try:
        return json.loads(attrs.get("physics_models", "{}"))
    except ValueError:
        return {}


def _limits_text(value) -> str:
    """The cube's ``memory_limit`` attribute (bytes per fleet, JSON) in GB: ``Training_1K 72 GB``."""
    try:
        limits = json.loads(value)
    except (TypeError, ValueError):
        return str(value)
    if not isinstance(limits, dict):
        limits = {"": limits}
    return ", ".join(f"{k} {float(v) / _GB:.4g} GB".strip() for k, v in limits.items())


def command(args) -> int:
    """``show``: dims, variables, masks (with counts) and provenance of a cube."""
    cube = _open_cube(args.cube, args.allow_partial)
    attrs = cube.attrs
    path = Path(args.cube)
    size = int(np.prod([cube.sizes[d] for d in cube.dims], dtype=np.int64))
    # an unfinished sweep (--allow-partial) is read from its staged blocks: no file yet
    file_size = _human_bytes(path.stat().st_size) if path.exists() else "not assembled yet"
    print(f"{path} ({file_size}): {attrs.get('title', 'a cube')}")
    if attrs.get("description"):
        print(f"  {attrs['description']}")
    print(*_show_facts(attrs), sep="\n")
    print(f"\ndims ({len(cube.dims)}; {size:,} points):")
    print(format_table(["dim", "size", "values"],
                       [[d, str(cube.sizes[d]), _values_text(cube[d].values)] for d in cube.dims],
                       left=(0, 2)))
    print("\nvariables:")
    every = set(cube.dims)
    rows = [[n, v.attrs.get("units", ""),
             "all" if set(v.dims) == every else ", ".join(v.dims) or "-",
             v.attrs.get("long_name", "")]
            for n, v in cube.data_vars.items() if n not in MASKS]
    print(format_table(["name", "units", "dims", "long name"], rows, left=(0, 1, 2, 3)))
    print("\nmasks:")
    rows = []
    for name in (m for m in MASKS if m in cube):  # older cubes have no realizable mask
        count = int(cube[name].sum())
        rows.append([name, f"{count:,}", f"{100 * count / max(size, 1):.1f}%",
                     cube[name].attrs.get("long_name", "")])
    print(format_table(["mask", "points", "share", "meaning"], rows, left=(0, 3)))
    print("\nprovenance:")
    for key in ("physics", "reference", "package", "package_version", "spec_name", "spec_source",
                "date_created", "history", "memory_limit", "max_accelerators",
                "min_accelerators", "require_realizable"):
        if key == "memory_limit" and key in attrs:
            print(f"  {key}: {_limits_text(attrs[key])}")
        elif key in attrs:
            print(f"  {key}: {attrs[key]}")
    if "fixed" in attrs:
        print(f"  fixed: {attrs['fixed']}")
    calibrated, calibrated_model = _calibration_lines(attrs.get("calibration"))
    for line in calibrated:
        print(line)
    for model, facts in _physics_models(attrs).items():
        shipped = (" (the shipped constants; the calibration above replaced them)"
                   if model == calibrated_model else "")
        print(f"  physics {model}{shipped}: " + "; ".join(f"{k} {v}" for k, v in facts.items()))
    if "spec" in attrs:
        print("  spec:")
        try:
            text = _pretty_json(json.loads(attrs["spec"]))
        except ValueError:
            text = str(attrs["spec"])
        print("\n".join("    " + line for line in text.splitlines()))
    cube.close()
    return EXIT_OK
