"""The one memory-limit parser: specs, ``search``, analysis and the command line all use it.

A memory limit is one of:

- a size with a unit: ``"80 GB"`` (GB = 1e9 B), ``"80 GiB"`` (2**30 B), ``"80e9 B"``;
- a fraction in (0, 1] of the accelerator's memory: ``0.9`` (or ``"0.9"``);
- a number of bytes, accepted as a bare number only when it is at least
  :data:`MIN_BARE_BYTES` (``1e6``, 1 MB): a bare ``80`` is far more likely to mean
  80 GB than 80 bytes, so it is refused with that suggestion.

Zero, negative and non-finite limits are refused, and so are bare numbers in
(1, :data:`MIN_BARE_BYTES`).

    >>> parse_memory_limit("72 GB").resolve(80e9)
    72000000000.0
    >>> parse_memory_limit(0.9).resolve(80e9)
    72000000000.0
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Optional

import numpy as np

from solver.units import parse_quantity

__all__ = ["MemoryLimit", "MemoryLimitError", "MemoryLimitWarning", "parse_memory_limit",
           "MIN_BARE_BYTES", "EXPECTED"]

#: The smallest bare number taken as bytes (1 MB); below it a unit is required.
MIN_BARE_BYTES = 1e6

#: What a memory limit may be, as error messages say it.
EXPECTED = ("a size with a unit such as '72 GB' or '80 GiB', a fraction of the accelerator's "
            "memory in (0, 1] such as 0.9, or bytes as a number >= 1e6")


class MemoryLimitError(ValueError):
    """A memory limit that cannot be right: says what was expected, what came, and a likely fix."""


class MemoryLimitWarning(RuntimeWarning):
    """A memory limit above the accelerator's memory: the memory is the limit."""


@dataclass(frozen=True)
class MemoryLimit:
    """A parsed memory limit: ``size`` in bytes, or ``fraction`` of the capacity (one is None)."""

    size: Optional[float] = None
    fraction: Optional[float] = None

    def resolve(self, capacity):
        """The limit in bytes [B] for an accelerator of ``capacity`` bytes (arrays broadcast).

        A size above the capacity is the capacity, with a :class:`MemoryLimitWarning`: a
        layout must fit the device whatever the limit, and a looser limit would make
        admissible (within the limit) layouts that do not fit (``feasible`` False).
        """
        if self.size is not None:
            over = np.asarray(self.size > capacity)
            if over.any():
                smallest = float(np.min(np.asarray(capacity)))
                warnings.warn(
                    f"memory limit {self.describe()} is above the accelerator's memory "
                    f"({smallest / 1e9:.4g} GB): a layout must fit the device, so its memory is "
                    f"the limit", MemoryLimitWarning, stacklevel=2)
                if isinstance(capacity, (int, float)):
                    return float(min(self.size, capacity))
                return np.minimum(self.size, capacity)
            return self.size
        return self.fraction * capacity

    def describe(self) -> str:
        """``"72 GB"`` or ``"90% of the accelerator's memory"``."""
        if self.size is not None:
            return f"{self.size / 1e9:g} GB"
        return f"{self.fraction * 100:g}% of the accelerator's memory"


def _suggestion(number: float) -> str:
    if 1 < number < MIN_BARE_BYTES:
        # no accelerator holds 4 TB: past that a number in (1, 1e6) reads as MB (80000: 80 GB)
        hint = f"did you mean '{number:g} {'GB' if number <= 4096 else 'MB'}'"
        if number <= 100:
            hint += f" or the fraction {number / 100:g}"
        return f" ({hint}?)"
    return ""


def _refuse(where: str, value, why: str = "") -> MemoryLimitError:
    prefix = f"{where}: " if where else ""
    return MemoryLimitError(f"{prefix}expected {EXPECTED}, but got {value!r}{why}")


def parse_memory_limit(value, *, where: str = "memory_limit") -> MemoryLimit:
    """Parse a memory limit; see the module's docstring for what it may be.

    Parameters
    ----------
    value : str, int, float or MemoryLimit
    where : str
        Named in error messages (``"spec.toml: constraints.memory_limit"``).

    Returns
    -------
    MemoryLimit

    Raises
    ------
    MemoryLimitError
        For zero, negative, non-finite, unitless numbers in (1, 1e6), sizes
        under 1 MB, unknown units and wrong types; the message suggests the
        likely meaning.
    """
    if isinstance(value, MemoryLimit):
        return value
    if isinstance(value, str):
        text = value.strip()
        try:
            number = float(text)
        except ValueError:
            number = None
        if number is None:
            try:
                size = parse_quantity(text, "bytes", where=where)
            except OverflowError:
                size = math.inf
            except ValueError as err:  # an unknown unit, or no number
                raise MemoryLimitError(str(err)) from None
            if not (math.isfinite(size) and size > 0):
                prefix = f"{where}: " if where else ""
                raise MemoryLimitError(f"{prefix}expected a finite size > 0 such as '72 GB', "
                                       f"but got {value!r}")
            if size < MIN_BARE_BYTES:  # no training state fits in less than a megabyte
                prefix = f"{where}: " if where else ""
                raise MemoryLimitError(f"{prefix}expected a size of at least 1 MB such as "
                                       f"'72 GB', but got {value!r} ({size:g} B)")
            return MemoryLimit(size=float(size))
        value = number
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise _refuse(where, value)
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise _refuse(where, value, " (a limit is finite and > 0)")
    if number <= 1:
        return MemoryLimit(fraction=number)
    if number < MIN_BARE_BYTES:
        raise _refuse(where, value, _suggestion(number))
    return MemoryLimit(size=number)
