"""The example specs installed with the package: found by name from any folder.

``configs/sweeps/*.toml`` in the source tree is installed as the data package
``layout_sweep_configs.sweeps`` and read through :mod:`importlib.resources`;
a relative spec path that does not exist but names one of them
(``"default"``, ``"default.toml"``, ``"configs/sweeps/default.toml"``) reads
the installed copy (:func:`sweep.spec.load_spec`).
"""

from __future__ import annotations

from pathlib import Path

from solver import catalog

from ._reader import SpecError, suggest

__all__ = ["SPECS_PACKAGE", "builtin_specs", "builtin_spec"]

#: The data package the example specs are installed as (``configs/sweeps`` in the source tree).
SPECS_PACKAGE = "layout_sweep_configs.sweeps"
_SOURCE_SPECS = Path(__file__).resolve().parent.parent / "configs" / "sweeps"


def _specs_dir():
    return catalog.resource_dir(SPECS_PACKAGE, _SOURCE_SPECS)


def builtin_specs() -> list[str]:
    """Names of the example specs installed with the package (``"default"``, ...)."""
    return sorted(entry.name[:-5] for entry in _specs_dir().iterdir()
                  if entry.name.endswith(".toml"))


def builtin_spec(name: str):
    """The installed example spec ``name`` (``"default"`` or ``"default.toml"``), a traversable.

    Raises
    ------
    SpecError
        If there is no such spec; the close matches are named.
    """
    stem = name[:-5] if name.endswith(".toml") else name
    if stem not in builtin_specs():
        raise SpecError(f"no built-in spec {name!r} (built-in: {', '.join(builtin_specs())})"
                        f"{suggest(stem, builtin_specs())}")
    return _specs_dir() / f"{stem}.toml"


def _spec_name(path: Path):
    """The spec name a relative ``path`` spells, if it is spelled as one: a bare name
    (``"default"``, ``"default.toml"``) or the README's ``configs/sweeps/<name>.toml``."""
    parts = path.parts
    if path.is_absolute() or not (len(parts) == 1 or parts[-3:-1] == ("configs", "sweeps")
                                  and len(parts) == 3):
        return None
    return path.name[:-5] if path.name.endswith(".toml") else path.name


def missing_spec_hint(path: Path) -> str:
    """What to say of a spec file ``path`` that does not exist: the built-in specs, and the
    closest of them where ``path`` looks like a misspelled one (:func:`_spec_name`); ``""``
    for other paths."""
    stem = _spec_name(path)
    if stem is None:
        return ""
    return f" (built-in specs: {', '.join(builtin_specs())}){suggest(stem, builtin_specs())}"


def _builtin_for(path: Path):
    """The built-in spec a missing relative ``path`` names, if any.

    ``"default"``, ``"default.toml"`` and ``"configs/sweeps/default.toml"`` (the
    README's spelling, from any folder) name the installed example spec.
    """
    stem = _spec_name(path)
    return _specs_dir() / f"{stem}.toml" if stem in builtin_specs() else None
    parts = path.parts
    if len(parts) == 1 or parts[-3:-1] == ("configs", "sweeps") and len(parts) == 3:
        stem = path.name[:-5] if path.name.endswith(".toml") else path.name
        if stem in builtin_specs():
            return _specs_dir() / f"{stem}.toml"
    return None
