"""Deprecated spellings of analysis keywords: accepted, with a DeprecationWarning."""

from __future__ import annotations

import warnings
from typing import Optional

import numpy as np

from solver.outputs import MAXIMIZE, MINIMIZE, better

#: Old words for the directions (deprecated) -> optuna's.
OLD_DIRECTIONS = {"max": MAXIMIZE, "min": MINIMIZE}


def _warn(message: str, stacklevel: int) -> None:
    warnings.warn(message, DeprecationWarning, stacklevel=stacklevel + 1)


def renamed(new: str, value, old: str, old_value, default, *, stacklevel: int = 3):
    """The value of keyword ``new``, or of its deprecated spelling ``old`` (warned).

    ``value`` is the new keyword's value (``default`` when not given); giving
    both spellings is a :class:`TypeError`.
    """
    if old_value is None:
        return value
    if value != default:
        raise TypeError(f"give {new}= only, not also its deprecated spelling {old}=")
    _warn(f"{old}= is deprecated; use {new}=", stacklevel)
    return old_value


def direction_of(name: str, direction=None, largest: Optional[bool] = None, *,
                 stacklevel: int = 3) -> str:
    """``"maximize"`` or ``"minimize"`` for ranking ``name``.

    ``direction`` ``None`` is the registry's direction of better
    (:func:`solver.outputs.better`; ``"maximize"`` for a variable it does not
    know or that has none). ``largest`` is the deprecated spelling (and so is a
    bool given positionally as ``direction``).
    """
    if isinstance(direction, bool):  # the old positional `largest`
        direction, largest = None, direction
    if largest is not None:
        if direction is not None:
            raise TypeError("give direction= only, not also its deprecated spelling largest=")
        if not isinstance(largest, (bool, np.bool_)):  # "no" would read as True
            raise TypeError(f"largest (deprecated) must be True or False, but got {largest!r}; "
                            f"use direction='maximize' or direction='minimize'")
        _warn("largest= is deprecated; use direction='maximize' or direction='minimize'",
              stacklevel)
        return MAXIMIZE if largest else MINIMIZE
    if direction is None:
        try:
            return better(name) or MAXIMIZE
        except KeyError:
            return MAXIMIZE
    return checked_direction(direction, "direction", stacklevel=stacklevel + 1)


def checked_direction(value, what: str, *, old_words: bool = False, stacklevel: int = 3) -> str:
    """``value`` as ``"maximize"`` or ``"minimize"``; ``"max"``/``"min"`` are deprecated.

    The error message speaks the caller's words: ``'max' or 'min'`` when
    ``old_words`` (the caller used the deprecated ones), else optuna's.
    """
    if value in (MAXIMIZE, MINIMIZE):
        return value
    if isinstance(value, str) and value in OLD_DIRECTIONS:
        new = OLD_DIRECTIONS[value]
        _warn(f"{what} {value!r} is deprecated; use {new!r}", stacklevel)
        return new
    words = ("max", "min") if old_words else (MAXIMIZE, MINIMIZE)
    raise ValueError(f"{what} must be {words[0]!r} or {words[1]!r}, but got {value!r}")
