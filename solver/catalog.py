"""The built-in catalog of accelerators, nodes, fabrics, fleets and workloads.

The catalog lives in ``configs/catalog/*.toml`` (values as mlsysim 0.3.0's
registry states them, each with its source). The files are read once, on
first use, with :mod:`tomllib`; quantity strings are converted to SI floats
at load (:mod:`solver.units`) and every entry becomes a frozen
:mod:`solver.specs` object.

    >>> from solver import catalog
    >>> catalog.fleet("Training_1K").node.accelerator.name
    'NVIDIA H100'
    >>> catalog.names("fabrics")[:2]
    ['Ethernet_100G', 'Ethernet_10G']

Users can describe their own hardware and models in a TOML file with tables
``[accelerators.X]``, ``[nodes.X]``, ``[fabrics.X]``, ``[fleets.X]`` and
``[workloads.X]`` (same keys as the catalog files) and read it with
:func:`load_file`; references (a node's ``accelerator``, a fleet's ``node`` and
``fabric``) name an entry of the same file or of the built-in catalog.

The catalog's files are ``configs/catalog/*.toml`` in the source tree, installed
with the package as the data package ``layout_sweep_configs.catalog`` and read
through :mod:`importlib.resources` (editable and non-editable installs alike);
``$SOLVER_CATALOG_DIR``, if set when the catalog is first used, names another
directory of the same five files.
"""

from __future__ import annotations

import difflib
import functools
import importlib.resources
import os
import tomllib
from pathlib import Path

from . import specs
from .catalog_schema import _SCHEMA, _SINGULAR, KINDS, MAGNITUDE, CatalogError, _wrong  # noqa: F401
from .knobs import MAX_INTEGER

__all__ = [
    "CatalogError",
    "MAGNITUDE",
    "KINDS",
    "workload",
    "fleet",
    "accelerator",
    "node",
    "fabric",
    "names",
    "key_of",
    "load_file",
    "catalog_dir",
    "read_toml",
    "resource_dir",
    "RESOURCE_PACKAGE",
    "EXTRA_FILES",
    "EXTRA_SUFFIX",
    "extra_names",
]

_SPEC = {"accelerators": specs.Accelerator, "nodes": specs.Node, "fabrics": specs.Fabric,
         "fleets": specs.Fleet, "workloads": specs.Workload}
#: The data package the catalog is installed as (``configs/catalog`` in the source tree).
RESOURCE_PACKAGE = "layout_sweep_configs.catalog"
#: The source tree's catalog, for a checkout used without installing (PYTHONPATH).
_SOURCE_DIR = Path(__file__).resolve().parent.parent / "configs" / "catalog"


# ---------------------------------------------------------------- building

def _suggest(name: str, choices) -> str:
    choices = sorted(choices)
    same_case = [c for c in choices if c.lower() == name.lower()]
    close = same_case or difflib.get_close_matches(name, choices, n=3, cutoff=0.6)
    if not close:
        return ""
    quoted = [repr(c) for c in close]
    options = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
    return f"; did you mean {options}?"


def _build(kind: str, key: str, table, loc: str, resolve):
    """One spec from one TOML table; ``loc`` is ``"<file>: <table>"``."""
    if not isinstance(table, dict):
        raise _wrong(loc, f"a table of {_SINGULAR[kind]} keys", table)
    schema = _SCHEMA[kind]
    for field in table:
        if field not in schema:
            raise CatalogError(
                f"{loc}: unknown key {field!r}{_suggest(field, schema)}; "
                f"a {_SINGULAR[kind]} takes {', '.join(schema)}"
            )
    for field, spec in schema.items():
        if spec.required and field not in table:
            raise CatalogError(f"{loc}: missing required key {field!r} ({spec.expected})")
    values = {"name": key}
    for field, value in table.items():
        values[field] = schema[field].convert(value, f"{loc}.{field}", resolve)
    try:
        built = _SPEC[kind](**values)
    except ValueError as err:
        raise CatalogError(f"{loc}: {err}") from None
    if kind == "fleets" and built.total_accelerators >= MAX_INTEGER:
        raise CatalogError(
            f"{loc}: expected fewer than 2**53 accelerators in all (count * the node's "
            f"accelerators_per_node, exact in float64), but got {built.count} * "
            f"{built.node.accelerators_per_node} = {built.total_accelerators}")
    return built


def _build_all(sources: dict, fallback: dict | None) -> dict:
    """Specs from ``{kind: (display_path, table_prefix, {key: table})}``.

    References resolve to entries built from ``sources`` first, then to
    ``fallback`` (the built-in catalog) if given.
    """
    out = {kind: {} for kind in KINDS}

    def resolve(kind, name, where):
        if name in out[kind]:
            return out[kind][name]
        if fallback is not None and name in fallback[kind]:
            return fallback[kind][name]
        known = set(out[kind]) | set(fallback[kind] if fallback else ())
        raise CatalogError(f"{where}: unknown {_SINGULAR[kind]} {name!r}{_suggest(name, known)}")

    for kind in KINDS:
        if kind in sources:
            display, prefix, tables = sources[kind]
            for key, table in tables.items():
                out[kind][key] = _build(kind, key, table, f"{display}: {prefix}{key}", resolve)
    return out


def read_toml(path, display: str, *, error=None, what: str = "file") -> dict:
    """A TOML file as a dict; a missing, unreadable or malformed file raises ``error``.

    ``path`` is a path or an :mod:`importlib.resources` traversable; ``error``
    is the exception class (:class:`CatalogError` by default) and ``what``
    names the file in the message (``"spec file"``...).
    """
    error = error or CatalogError
    try:
        with path.open("rb") if hasattr(path, "open") else open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise error(f"{display}: no such {what}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise error(f"{display}: not valid TOML: {err}") from None
    except OSError as err:
        raise error(f"{display}: cannot read the {what}: {err.strerror or err}") from None


def resource_dir(package: str, source_dir: Path):
    """The installed data package ``package`` as a traversable, else ``source_dir``.

    The fallback serves a source checkout put on ``sys.path`` without installing.
    """
    try:
        return importlib.resources.files(package)
    except ModuleNotFoundError:
        return source_dir


def catalog_dir():
    """The directory the built-in catalog is read from.

    Returns
    -------
    pathlib.Path or importlib.resources.abc.Traversable
        ``$SOLVER_CATALOG_DIR`` if set, else the installed catalog
        (:data:`RESOURCE_PACKAGE`).
    """
    override = os.environ.get("SOLVER_CATALOG_DIR")
    return Path(override) if override else resource_dir(RESOURCE_PACKAGE, _SOURCE_DIR)


@functools.cache
def _builtin() -> dict:
    override = os.environ.get("SOLVER_CATALOG_DIR")
    directory = catalog_dir()
    sources = {}
    for kind in KINDS:
        path = directory / f"{kind}.toml"
        display = str(path) if override else f"configs/catalog/{kind}.toml"
        sources[kind] = (display, "", read_toml(path, display))
    return _build_all(sources, fallback=None)


# ------------------------------------------------------------------ public

def _kind(kind: str) -> str:
    if kind not in _SINGULAR:
        raise CatalogError(f"unknown catalog kind {kind!r} (expected one of "
                           f"{', '.join(sorted(KINDS))}){_suggest(kind, KINDS)}")
    return kind


#: Catalog files beyond mlsysim's registry (the ``load_file`` format: tables
#: ``[accelerators.X]``, ``[nodes.X]``, ...), read after the built-in files when
#: present in :func:`catalog_dir`. Their entries are found by the same getters
#: (``catalog.fleet("Selene_MC")``) and listed by :func:`names` beside the
#: registry's; :func:`extra_names` lists them alone.
EXTRA_FILES = ("megatron.toml",)
#: Every extra entry's table key ends in this suffix, so none collides with a
#: registry name.
EXTRA_SUFFIX = "_MC"


@functools.cache
def _extras_in(directory: str) -> dict:
    out = {kind: {} for kind in KINDS}
    for filename in EXTRA_FILES:
        path = Path(directory) / filename
        if not path.exists():
            continue
        for kind, entries in _load_file(path, _builtin()).items():
            for key, spec in entries.items():
                if not key.endswith(EXTRA_SUFFIX):
                    raise CatalogError(f"{path}: {kind}.{key}: extra catalog keys must end in "
                                       f"{EXTRA_SUFFIX!r}, so that none collides with the registry's")
                out[kind][key] = spec
    return out


def _extras() -> dict:
    return _extras_in(str(catalog_dir()))


def extra_names(kind: str) -> list[str]:
    """Sorted table keys of one section of the extra catalog files (:data:`EXTRA_FILES`).

    Parameters
    ----------
    kind : {"workloads", "fleets", "accelerators", "nodes", "fabrics"}

    Returns
    -------
    list of str
        Each ends in :data:`EXTRA_SUFFIX`.
    """
    return sorted(_extras()[_kind(kind)])


def _get(kind: str, name: str):
    entries = _builtin()[kind]
    if name in entries:
        return entries[name]
    if isinstance(name, str) and name.endswith(EXTRA_SUFFIX) and name in _extras()[kind]:
        return _extras()[kind][name]
    raise CatalogError(
        f"unknown {_SINGULAR[kind]} {name!r}{_suggest(str(name), {**entries, **_extras()[kind]})}"
        f" (see solver.catalog.names({kind!r}))"
    )


def workload(name: str) -> specs.Workload:
    """The catalog workload with table key ``name`` (e.g. ``"Llama3_70B"``).

    Raises
    ------
    CatalogError
        If there is no such entry; close matches are suggested.
    """
    return _get("workloads", name)


def fleet(name: str) -> specs.Fleet:
    """The catalog fleet with table key ``name`` (e.g. ``"Training_1K"``).

    Raises
    ------
    CatalogError
        If there is no such entry; close matches are suggested.
    """
    return _get("fleets", name)


def accelerator(name: str) -> specs.Accelerator:
    """The catalog accelerator with table key ``name`` (e.g. ``"H100"``).

    Raises
    ------
    CatalogError
        If there is no such entry; close matches are suggested.
    """
    return _get("accelerators", name)


def node(name: str) -> specs.Node:
    """The catalog node with table key ``name`` (e.g. ``"DGX_H100"``).

    Raises
    ------
    CatalogError
        If there is no such entry; close matches are suggested.
    """
    return _get("nodes", name)


def fabric(name: str) -> specs.Fabric:
    """The catalog fabric with table key ``name`` (e.g. ``"InfiniBand_NDR"``).

    Raises
    ------
    CatalogError
        If there is no such entry; close matches are suggested.
    """
    return _get("fabrics", name)


def names(kind: str) -> list[str]:
    """Sorted table keys of one catalog section.

    Parameters
    ----------
    kind : {"workloads", "fleets", "accelerators", "nodes", "fabrics"}

    Returns
    -------
    list of str
        The mlsysim registry's entries and those of the extra catalog files
        (:data:`EXTRA_FILES`, keys ending in :data:`EXTRA_SUFFIX`).
    """
    kind = _kind(kind)
    return sorted(set(_builtin()[kind]) | set(_extras()[kind]))


def key_of(kind: str, entry):
    """The table key of the catalog entry equal to ``entry`` (a spec of section ``kind``),
    or None if the catalog has none: ``key_of("workloads", workload("Llama3_70B"))`` is
    ``"Llama3_70B"``."""
    return next((name for name in names(kind) if _get(_kind(kind), name) == entry), None)


def load_file(path) -> dict:
    """Read a user's TOML file of accelerators, nodes, fabrics, fleets and workloads.

    Parameters
    ----------
    path : str or os.PathLike
        A TOML file whose top-level tables are any of ``accelerators``,
        ``nodes``, ``fabrics``, ``fleets``, ``workloads``, each holding one
        sub-table per entry (``[fleets.MyFleet]``) with the same keys as the
        built-in catalog files. A node's ``accelerator`` and a fleet's
        ``node`` / ``fabric`` name an entry of this file or, failing that, of
        the built-in catalog (the registry's entries and the ``_MC`` ones of
        :data:`EXTRA_FILES`). ``name`` defaults to the table key.

    Returns
    -------
    dict
        ``{kind: {table key: spec}}`` for all five kinds (empty where the file
        has none).

    Raises
    ------
    CatalogError
        For unreadable TOML, unknown tables or keys, wrong types (booleans are
        not numbers), bad units, values that are not finite or beyond
        :data:`MAGNITUDE`, counts of 2**53 or more, missing required keys or
        unknown references; the message names the file, the table and the key.
    """
    builtin, extras = _builtin(), _extras()
    return _load_file(path, {kind: {**builtin[kind], **extras[kind]} for kind in KINDS})


def _load_file(path, fallback: dict) -> dict:
    """:func:`load_file` with references resolved in ``fallback`` after the file's own."""
    display = str(path)
    data = read_toml(Path(path), display)
    for top, value in data.items():
        if top not in _SINGULAR:
            raise CatalogError(f"{display}: unknown table [{top}] (expected any of "
                               f"{', '.join(f'[{k}.NAME]' for k in sorted(KINDS))}){_suggest(top, KINDS)}")
        if not isinstance(value, dict):
            raise _wrong(f"{display}: {top}", f"a table of [{top}.NAME] tables", value)
    sources = {kind: (display, f"{kind}.", data[kind]) for kind in KINDS if kind in data}
    return _build_all(sources, fallback=fallback)
