"""``catalog``: tables of the built-in catalog's entries, or of a user's catalog file."""

from __future__ import annotations

from pathlib import Path

from solver import catalog

from ._common import _CATALOG_KINDS, _GB, EXIT_OK, UsageError, _suggest
from .format import _count, _opt, format_table

__all__ = ["command"]


def _catalog_table(kind: str, entries=None) -> str:
    """The table of one catalog kind: the built-in entries, or ``entries`` (key -> spec)."""
    if entries is None:
        get = getattr(catalog, kind[:-1])
        entries = {name: get(name) for name in catalog.names(kind)}
    entries = sorted(entries.items())
    if kind == "workloads":
        headers = ["workload", "kind", "parameters", "layers", "hidden", "heads", "experts"]
        rows = [[k, w.kind, _count(w.parameters),
                 _opt(w.layers), _opt(w.hidden_dim), _opt(w.heads), _opt(w.experts)]
                for k, w in entries]
        return format_table(headers, rows, left=(0, 1))
    if kind == "fleets":
        headers = ["fleet", "nodes", "per node", "accelerators", "accelerator", "fabric",
                   "fabric [GB/s]"]
        rows = [[k, str(f.count), str(f.node.accelerators_per_node), str(f.total_accelerators),
                 f.node.accelerator.name, f.fabric.name, f"{f.fabric.bandwidth / _GB:.3g}"]
                for k, f in entries]
        return format_table(headers, rows, left=(0, 4, 5))
    if kind == "accelerators":
        headers = ["accelerator", "name", "peak [TFLOP/s]", "memory [GB]", "bandwidth [TB/s]",
                   "TDP [W]"]
        rows = [[k, a.name, f"{a.peak_flops / 1e12:.4g}", f"{a.memory_capacity / _GB:.4g}",
                 f"{a.memory_bandwidth / 1e12:.3g}", f"{a.tdp:.0f}" if a.tdp else "-"]
                for k, a in entries]
        return format_table(headers, rows, left=(0, 1))
    if kind == "nodes":
        headers = ["node", "accelerator", "per node", "intra-node [GB/s]"]
        rows = [[k, n.accelerator.name, str(n.accelerators_per_node),
                 f"{n.intra_node_bandwidth / _GB:.4g}"] for k, n in entries]
        return format_table(headers, rows, left=(0, 1))
    headers = ["fabric", "bandwidth [GB/s]", "latency [us]", "oversubscription"]
    rows = [[k, f"{f.bandwidth / _GB:.4g}", f"{f.latency * 1e6:.3g}" if f.latency else "-",
             f"{f.oversubscription:g}"] for k, f in entries]
    return format_table(headers, rows, left=(0,))


def command(args) -> int:
    """``catalog``: tables of the built-in catalog's entries, or of a user's catalog file."""
    if args.kind is not None and args.kind not in _CATALOG_KINDS:
        if not args.kind.endswith(".toml") and not Path(args.kind).is_file():
            raise UsageError(f"catalog: expected a catalog kind ({', '.join(_CATALOG_KINDS)}) "
                             f"or a catalog TOML file, but got {args.kind!r}"
                             f"{_suggest(args.kind, _CATALOG_KINDS)}")
        loaded = catalog.load_file(args.kind)
        shown = [kind for kind in _CATALOG_KINDS if loaded.get(kind)]
        if not shown:
            raise UsageError(f"{args.kind}: expected [workloads.NAME], [fleets.NAME], ... "
                             f"tables, but the file has no entries")
        for n, kind in enumerate(shown):
            if n:
                print()
            print(f"{kind} in {args.kind} ({len(loaded[kind])}):")
            print(_catalog_table(kind, loaded[kind]))
        return EXIT_OK
    kinds = _CATALOG_KINDS if args.kind is None else (args.kind,)
    for n, kind in enumerate(kinds):
        if n:
            print()
        print(f"{kind} ({len(catalog.names(kind))}):")
        print(_catalog_table(kind))
    return EXIT_OK
