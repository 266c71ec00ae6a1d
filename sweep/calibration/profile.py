"""A calibration profile: fitted physics constants, saved as TOML and read back.

The file::

    # written by sweep.calibrate (layout-sweep 0.1.0)
    [calibration]
    physics = "megatron"
    date = "2026-12-01T10:00:00+00:00"
    data_source = "runs.csv"
    data_sha256 = "3f1c..."             # of the measurements file's bytes
    runs = 12
    free = ["gemm_scale", "scale_up_efficiency", ...]
    in_sample_mape = 2.1                # mean |predicted / measured - 1| [%]
    loo_mape = 3.4                      # the same, each run left out of its own fit
    noise = 0.03                        # assumed scatter of log(step time) per run
    warnings = ["scale_out_efficiency: ..."]

    [constants]                         # every constant of the physics
    gemm_scale = 0.71
    ...

    [uncertainty]                       # one standard deviation, fitted constants only
    gemm_scale = 0.012                  # nan: the data cannot identify it

    [prior_width]                       # of the prior on log(constant) around the start
    gemm_scale = 0.3                    # inf: no prior

The ``[constants]`` table holds every constant of the physics, so
``solver.physics.megatron.load_constants(path)`` reads a profile too, and
``solver.solve(wl, fl, physics="megatron", **load_profile(path).constants)``
prices with it.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import re
import tomllib
from pathlib import Path
from typing import Mapping, Optional

import solver
from solver import physics as physics_

__all__ = ["Profile", "load_profile", "ProfileError", "solve_keywords", "with_calibration"]


class ProfileError(ValueError):
    """A calibration profile that cannot be read: names the file and key."""


@dataclasses.dataclass(frozen=True)
class Profile:
    """Fitted constants of one physics model, with where they came from.

    ``constants`` holds every constant of the model (the fitted ones and the
    rest at the values the fit held them); ``uncertainty`` one standard
    deviation of each fitted one (same units; NaN when not identified).
    """

    physics: str
    constants: Mapping[str, float]
    uncertainty: Mapping[str, float] = dataclasses.field(default_factory=dict)
    free: tuple = ()
    data_sha256: str = ""
    data_source: str = ""
    date: str = ""
    runs: int = 0
    in_sample_mape: float = math.nan
    loo_mape: float = math.nan
    prior_width: Mapping[str, float] = dataclasses.field(default_factory=dict)
    noise: float = math.nan
    warnings: tuple = ()
    path: str = ""
    #: The accelerators of the runs fitted (names as the catalog gives them; empty for a
    #: profile written before 2026-12-05 or by hand): a spec priced on others is warned.
    accelerators: tuple = ()

    def other_accelerators(self, names) -> list:
        """Those of the accelerator ``names`` its runs did not run on (none where the profile
        does not record them), sorted, each once."""
        return sorted({n for n in names if self.accelerators and n not in self.accelerators})

    def solve_keywords(self) -> dict:
        """``{"physics": ..., **constants}``: keywords for :func:`solver.solve`."""
        return {"physics": self.physics, **self.constants}

    def to_toml(self) -> str:
        """The profile as TOML text (the format of this module's docstring)."""
        meta = {"physics": self.physics, "date": self.date, "data_source": self.data_source,
                "data_sha256": self.data_sha256, "runs": int(self.runs), "free": list(self.free),
                "in_sample_mape": float(self.in_sample_mape), "loo_mape": float(self.loo_mape),
                "noise": float(self.noise), "accelerators": list(self.accelerators),
                "warnings": list(self.warnings)}
        lines = [f"# written by sweep.calibrate (layout-sweep {solver.__version__})",
                 "[calibration]"]
        lines += [f"{k} = {_toml(v)}" for k, v in meta.items()]
        lines += ["", "[constants]"] + [f"{k} = {_toml(float(v))}" for k, v in self.constants.items()]
        lines += ["", "[uncertainty]"] + [f"{k} = {_toml(float(v))}"
                                          for k, v in self.uncertainty.items()]
        lines += ["", "[prior_width]"] + [f"{k} = {_toml(float(v))}"
                                          for k, v in self.prior_width.items()]
        return "\n".join(lines) + "\n"

    def save(self, path) -> Path:
        """Write :meth:`to_toml` to ``path``; returns the path."""
        path = Path(path)
        path.write_text(self.to_toml())
        return path

    def to_json(self) -> str:
        """The profile as one JSON string (a cube's ``calibration`` attr)."""
        data = dataclasses.asdict(self)
        return json.dumps({k: (list(v) if isinstance(v, tuple) else v) for k, v in data.items()},
                          sort_keys=True, default=float)


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value == math.inf else repr(value))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    # a TOML basic string: JSON's escapes are TOML's, but not its \\uD83D\\uDE80 pairs for a
    # character past U+FFFF, which TOML refuses: those are written as themselves (UTF-8)
    return json.dumps(str(value), ensure_ascii=False)


def now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def load_profile(source) -> Profile:
    """Read a profile: a TOML path, or a :class:`Profile` (returned as is).

    Raises
    ------
    ProfileError
        Naming the file and key, what was expected and what came.
    """
    if isinstance(source, Profile):
        return source
    path = Path(source)
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except OSError as err:
        raise ProfileError(f"{path}: expected a calibration profile (TOML), but got "
                           f"{err.strerror or err}") from None
    except tomllib.TOMLDecodeError as err:
        raise ProfileError(f"{path}: expected TOML, but got {err}") from None
    return _from_data(data, str(path))


def _from_data(data: Mapping, where: str) -> Profile:
    meta = data.get("calibration")
    if not isinstance(meta, Mapping):
        raise ProfileError(f"{where}: calibration: expected a [calibration] table (physics, "
                           f"date, data_sha256, ...), but got {meta!r}")
    name = meta.get("physics")
    try:
        model = physics_.model(name)
    except ValueError as err:
        raise ProfileError(f"{where}: calibration.physics: {err}") from None
    known = getattr(model, "CONSTANT_BOUNDS", {})
    if not known:
        raise ProfileError(f"{where}: calibration.physics: the {name} physics has no fitted "
                           f"constants to calibrate (it is exact); a profile is the megatron "
                           f"physics' (physics = \"megatron\")")
    constants = data.get("constants", {})
    if not isinstance(constants, Mapping):
        raise ProfileError(f"{where}: constants: expected a table, but got {constants!r}")
    for key, value in constants.items():
        if key not in known:
            raise ProfileError(f"{where}: constants.{key}: expected a constant of the {name} "
                               f"physics ({', '.join(known)}), but got {key!r}")
        low, high = known[key][:2]
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not low <= value <= high:
            raise ProfileError(f"{where}: constants.{key}: expected a number in "
                               f"[{low:g}, {high:g}], but got {value!r}")
    uncertainty = data.get("uncertainty", {})
    constants, notes = dict(constants), []
    predated = getattr(model, "PREDATED_CONSTANTS", {})
    if not constants:
        raise ProfileError(f"{where}: constants: expected the fitted constants of the {name} "
                           f"physics (a profile sweep.calibrate wrote), but got an empty table")
    missing = set(known) - set(constants)
    if missing and missing <= set(predated):  # a whole profile, written before `missing` existed
        for key in sorted(missing):
            constants[key] = predated[key]
            notes.append(f"constants.{key}: not in this profile, which predates it; taken as "
                         f"{predated[key]:g}, the value the profile was fitted under")
    elif missing:  # a profile cut short or written by hand: say what prices in its place
        import warnings

        from .core import CalibrationWarning

        shipped = getattr(model, "CONSTANTS", {})
        notes.append(f"{where}: constants {', '.join(sorted(missing))}: not in this profile; "
                     f"priced at the shipped values ("
                     + ", ".join(f"{k} = {shipped[k]:.4g}" for k in sorted(missing) if k in shipped)
                     + "), not fitted with the others")
        warnings.warn(notes[-1], CalibrationWarning, stacklevel=4)

    def number(key, kind, default):
        value = meta.get(key, default)
        try:
            if isinstance(value, bool):
                raise TypeError
            return kind(value)
        except (TypeError, ValueError):
            raise ProfileError(f"{where}: calibration.{key}: expected "
                               f"{'a whole number' if kind is int else 'a number'}, but got "
                               f"{value!r}") from None

    try:
        prior_width = {k: float(v) for k, v in data.get("prior_width", {}).items()}
        uncertainty = {k: float(v) for k, v in uncertainty.items()}
    except (TypeError, ValueError, AttributeError):
        raise ProfileError(f"{where}: prior_width and uncertainty: expected tables of numbers, "
                           f"but got {data.get('prior_width')!r} and {uncertainty!r}") from None
    def names(key):
        # a list of strings (a string alone would be taken letter by letter)
        value = meta.get(key, ())
        if isinstance(value, str) or not isinstance(value, (list, tuple)) \
                or not all(isinstance(v, str) for v in value):
            raise ProfileError(f"{where}: calibration.{key}: expected a list of strings "
                               f"([\"a\", \"b\"]), but got {value!r}")
        return tuple(value)

    return Profile(physics=name, constants={k: float(v) for k, v in constants.items()},
                   uncertainty=uncertainty,
                   free=names("free"), data_sha256=str(meta.get("data_sha256", "")),
                   data_source=str(meta.get("data_source", "")), date=str(meta.get("date", "")),
                   runs=number("runs", int, 0),
                   in_sample_mape=number("in_sample_mape", float, math.nan),
                   loo_mape=number("loo_mape", float, math.nan),
                   prior_width=prior_width,
                   noise=number("noise", float, math.nan),
                   warnings=names("warnings") + tuple(notes), path=where,
                   accelerators=names("accelerators"))


def with_calibration(spec, calibration):
    """``spec`` (a :class:`sweep.Spec`) priced with ``calibration`` (a path or
    :class:`Profile`; None leaves the spec's own).

    A spec that names no ``physics`` takes the calibration's; one that names
    other models only is refused (:class:`ProfileError`).
    """
    if calibration is None:
        return spec
    profile = load_profile(calibration)
    if profile.physics not in spec.physics and "physics" not in spec.raw:
        from ..spec import SpecError, load_spec

        try:
            spec = load_spec(spec, physics=profile.physics)  # the calibration implies its physics
        except SpecError as err:  # name the calibration, which asked for the physics
            why = re.sub(r" \(set physics = [^)]*\)", "", str(err).split("; the physics ")[0])
            raise ProfileError(
                f"{profile.path or calibration}: a calibration of the {profile.physics!r} "
                f"physics, which the spec {spec.name!r} takes from it (the spec names no "
                f"physics, so it is priced by the calibration's), but {why}: give the "
                f"calibration a spec written for {profile.physics!r}, or drop it") from None
    if profile.physics not in spec.physics:
        raise ProfileError(f"{profile.path or calibration}: a calibration of the "
                           f"{profile.physics!r} physics, but the spec {spec.name!r} prices with "
                           f"{', '.join(spec.physics)}: set physics = {profile.physics!r} in the "
                           f"spec (or --physics {profile.physics})")
    warn_other_hardware(profile, spec)
    return dataclasses.replace(spec, calibration=profile)


def warn_other_hardware(profile, spec) -> None:
    """Warn where ``spec`` prices accelerators the profile's runs did not run on: its
    constants (GEMM efficiency, link shares) were fitted to those."""
    if not profile.accelerators:
        return
    import warnings

    from .core import CalibrationWarning

    for label, fleet in spec.fleets.items():
        name = fleet.node.accelerator.name
        if profile.other_accelerators([name]):
            warnings.warn(f"{profile.path or 'the calibration'}: fitted on runs of "
                          f"{', '.join(profile.accelerators)}, but spec {spec.name!r} prices "
                          f"fleet {label!r} of {name}: its GEMM efficiency and link shares "
                          f"were fitted to other hardware (calibrate on runs of {name})",
                          CalibrationWarning, stacklevel=4)


def solve_keywords(calibration: Optional[Profile], physics: Optional[str] = None) -> dict:
    """Extra keywords of ``solver.solve`` for a calibration (``{}`` for none).

    A calibration implies its physics; a ``physics`` named besides must be the
    same one.

    Raises
    ------
    ValueError
        When ``physics`` is not the profile's.
    """
    if calibration is None:
        return {} if physics is None else {"physics": physics}
    if physics is not None and physics != calibration.physics:
        raise ValueError(f"the calibration {calibration.path or ''!s} is of the "
                         f"{calibration.physics!r} physics, but got physics={physics!r}")
    return calibration.solve_keywords()
