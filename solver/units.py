"""Parse quantity strings ("80 GiB", "3.35 TB/s", "400 Gbps") into SI floats.

A small, explicit unit table replaces pint. The conventions are mlsysim
0.3.0's (``mlsysim/core/mlsysim_units.txt``): decimal prefixes for bytes
(GB = 1e9 B), binary ones with an ``i`` (GiB = 2**30 B), network rates in bits
(Gbps = 1e9 bit/s = 1.25e8 B/s), and integer-operation rates counted as
operations per second (TOPS = 1e12 FLOP/s).

Every dimension converts to one SI base unit:

========== ======== ==============================================
dimension  result   accepted units
========== ======== ==============================================
bytes      B        B, KB, MB, GB, TB, PB, KiB, MiB, GiB, TiB
bandwidth  B/s      <bytes unit>/s, bit/s, Kbps .. Tbps, Gb/s, Tb/s
flops      FLOP/s   FLOP/s, KFLOP/s .. EFLOP/s, OPS, KOPS .. TOPS
time       s        s, ms, us (also µs), ns
power      W        W, kW, MW
========== ======== ==============================================

Units are case sensitive (``MB`` is a megabyte, ``Mb/s`` a megabit per
second). Spaces inside the unit are ignored, so ``"989 TFLOP / s"`` parses.
"""

from __future__ import annotations

import re

__all__ = ["UNITS", "DIMENSIONS", "parse_quantity", "accepted_units"]

_BYTES = {
    "B": 1, "byte": 1, "bytes": 1,
    "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
}
_BITS_PER_SECOND = {
    "bit/s": 1, "bps": 1,
    "Kbps": 1e3, "Mbps": 1e6, "Gbps": 1e9, "Tbps": 1e12,
    "Kb/s": 1e3, "Mb/s": 1e6, "Gb/s": 1e9, "Tb/s": 1e12,
}
_FLOP_PREFIXES = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}

#: Unit symbol -> factor to the SI base unit, by dimension.
UNITS: dict[str, dict[str, float]] = {
    "bytes": dict(_BYTES),
    "bandwidth": {
        **{f"{symbol}/s": factor for symbol, factor in _BYTES.items()},
        **{symbol: factor / 8 for symbol, factor in _BITS_PER_SECOND.items()},
    },
    "flops": {
        **{f"{p}FLOP/s": f for p, f in _FLOP_PREFIXES.items()},
        **{f"{p}FLOPs/s": f for p, f in _FLOP_PREFIXES.items()},  # pint's spelling
        **{f"{p}OPS": f for p, f in _FLOP_PREFIXES.items() if p in ("", "K", "M", "G", "T")},
    },
    "time": {"s": 1, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ns": 1e-9},
    "power": {"W": 1, "kW": 1e3, "MW": 1e6},
}

#: The dimensions :func:`parse_quantity` understands.
DIMENSIONS = tuple(UNITS)

_EXAMPLES = {
    "bytes": "80 GiB",
    "bandwidth": "3.35 TB/s",
    "flops": "989 TFLOP/s",
    "time": "5 us",
    "power": "700 W",
}

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_QUANTITY = re.compile(rf"^\s*(?P<number>{_NUMBER})\s*(?P<unit>[^\W\d_].*?)\s*$")


def accepted_units(dimension: str) -> str:
    """Comma-separated unit symbols accepted for ``dimension``.

    Parameters
    ----------
    dimension : str
        One of :data:`DIMENSIONS`.

    Returns
    -------
    str
        For error messages, e.g. ``"B, byte, bytes, KB, ..."``.
    """
    return ", ".join(UNITS[dimension])


def parse_quantity(text, dimension: str, *, where: str = "") -> float:
    """Convert a quantity string to a float in the dimension's SI base unit.

    Parameters
    ----------
    text : str
        A number followed by a unit, e.g. ``"80 GiB"``, ``"3.35 TB/s"``,
        ``"1979 TOPS"``, ``"400 Gbps"``, ``"500 ns"``, ``"1.2 kW"``.
    dimension : str
        One of ``"bytes"``, ``"bandwidth"``, ``"flops"``, ``"time"``, ``"power"``.
    where : str, optional
        Location named in error messages, e.g.
        ``"configs/catalog/accelerators.toml: H100.memory_capacity"``.

    Returns
    -------
    float
        Bytes [B], bytes per second [B/s], FLOP per second [FLOP/s],
        seconds [s] or watts [W].

    Raises
    ------
    ValueError
        If ``text`` is not a string, has no unit, or its unit does not belong
        to ``dimension``; the message names ``where``, the accepted units and
        what came.

    Examples
    --------
    >>> parse_quantity("80 GiB", "bytes")
    85899345920.0
    >>> parse_quantity("400 Gbps", "bandwidth")
    50000000000.0
    """
    if dimension not in UNITS:
        raise ValueError(f"unknown dimension {dimension!r}; expected one of {', '.join(DIMENSIONS)}")
    prefix = f"{where}: " if where else ""
    expected = (
        f"expected a {dimension} quantity such as {_EXAMPLES[dimension]!r} "
        f"(units: {accepted_units(dimension)})"
    )
    if not isinstance(text, str):
        shown = f"the bare number {text!r} (a unit is required)" if isinstance(
            text, (int, float)) and not isinstance(text, bool) else f"{type(text).__name__} {text!r}"
        raise ValueError(f"{prefix}{expected}, but got {shown}")
    if re.fullmatch(rf"\s*{_NUMBER}\s*", text):
        raise ValueError(f"{prefix}{expected}, but got {text!r} (a unit is required)")
    match = _QUANTITY.match(text)
    if match is None:
        raise ValueError(f"{prefix}{expected}, but got {text!r}")
    unit = "".join(match["unit"].split())
    factor = UNITS[dimension].get(unit)
    if factor is None:
        other = [d for d, table in UNITS.items() if unit in table]
        cased = [u for u in UNITS[dimension] if u.lower() == unit.lower()]
        hint = (f" ({unit!r} is a {other[0]} unit)" if other
                else f" (unknown unit {match['unit']!r}; did you mean "
                     f"{' or '.join(repr(u) for u in cased)}?)" if cased
                else f" (unknown unit {match['unit']!r})")
        raise ValueError(f"{prefix}{expected}, but got {text!r}{hint}")
    number = match["number"]
    magnitude = int(number) if re.fullmatch(r"[+-]?\d+", number) else float(number)
    if factor < 1:  # divide by the exact reciprocal: "0.01 ms" -> 1e-05, not 1.0000000000000001e-05
        return float(magnitude / round(1 / factor))
    return float(magnitude * factor)
