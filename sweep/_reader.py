"""Errors of a spec that cannot be read, naming the file and key (shared by spec and axes)."""

from __future__ import annotations

import difflib

__all__ = ["SpecError", "Reader", "suggest"]


class SpecError(ValueError):
    """A spec that cannot be read: names where, what was expected and what came."""


def suggest(name, choices) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``choices``, or ``""``."""
    close = difflib.get_close_matches(str(name), list(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


class Reader:
    """Carries where we are (file and key) into every error message."""

    def __init__(self, source, physics_note=""):
        self.source = source
        #: said after a knob of the other physics model: where the physics came from, when
        #: not from the spec itself (``load_spec(physics=...)``, ``--physics``)
        self.physics_note = physics_note

    def where(self, key) -> str:
        """``"<file>: <key>"``, the prefix of every message about ``key``."""
        return f"{self.source}: {key}"

    def fail(self, key, expected, got):
        raise SpecError(f"{self.where(key)}: expected {expected}, but got {got!r}")

    def unknown(self, key, choices, where=""):
        place = f"{where}." if where else ""
        raise SpecError(f"{self.source}: {place}{key}: unknown key{suggest(key, choices)} "
                        f"(expected one of {', '.join(choices)})")
