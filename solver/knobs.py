"""The knobs of ``solve``: names, defaults, kinds and the values each may take.

One table serves the solver (validation), the sweep (axis names and types) and
the command line (flags). Names and defaults are those of mlsysim 0.3.0's
``DistributedModel.solve``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

__all__ = [
    "Knob",
    "KNOBS",
    "REFERENCE_KNOBS",
    "PRECISION_BYTES",
    "TOPOLOGIES",
    "canonical_precision",
    "Precisions",
    "normalize",
]

#: Storage bytes per element by canonical precision key (the reference's PRECISION_MAP).
PRECISION_BYTES = {
    "fp32": 4.0,
    "tf32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}

#: Integer knobs stay below 2**53, where every count is exact in float64 too.
MAX_INTEGER = 2 ** 53

#: Slow-down factors stay below this: far past any real network or worker, and
#: far from float64 overflow when they multiply a time.
MAX_FACTOR = 1e6

#: Accepted values of ``topology_override``. The reference accepts the knob and
#: does not use it; so do we (it changes no output).
TOPOLOGIES = (None, "ring", "tree")


@dataclass(frozen=True)
class Knob:
    """One keyword of ``solve``.

    kind is ``"int"``, ``"float"``, ``"bool"``, ``"precision"`` or ``"topology"``;
    ``low``/``high`` bound the value (``low_open``: the low bound itself is refused);
    ``why`` finishes the error message.
    """

    name: str
    kind: str
    default: Any
    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    why: str = ""


KNOBS = {k.name: k for k in (
    Knob("batch_size", "int", 1, low=1, why="global batch in samples"),
    Knob("precision", "precision", "fp16"),
    Knob("efficiency", "float", 0.5, low=1e-9, high=1.0,
         why="achieved share of peak compute, in (0, 1] (at least 1e-9, as the reference requires)"),
    Knob("tp_size", "int", 1, low=1, why="tensor-parallel degree"),
    Knob("pp_size", "int", 1, low=1, why="pipeline-parallel degree"),
    Knob("ep_size", "int", 1, low=1, why="expert-parallel degree"),
    Knob("v_stages", "int", 1, low=1, why="virtual stages per device"),
    Knob("microbatch_count", "int", 1, low=1, why="microbatches per step"),
    Knob("topology_override", "topology", None),
    Knob("zero_stage", "int", 0, low=0, high=3, why="ZeRO stage 0, 1, 2 or 3"),
    Knob("is_lora", "bool", False),
    Knob("activation_recomputation", "bool", False),
    Knob("overlap_comm", "bool", False),
    Knob("overlap_efficiency", "float", 0.85, low=0.0, high=1.0,
         why="share of DP communication hidden behind compute, in [0, 1]"),
    Knob("congestion_factor", "float", 1.0, low=1.0, high=MAX_FACTOR,
         why="multiplier on communication time; 1.0 is an ideal network"),
    Knob("straggler_factor", "float", 1.0, low=1.0, high=MAX_FACTOR,
         why="multiplier on step time for the slowest worker; 1.0 is none"),
    Knob("moe_routing_imbalance_factor", "float", 1.0, low=1.0, high=MAX_FACTOR,
         why="multiplier on routed MoE traffic; 1.0 is balanced routing"),
    Knob("gradient_accumulation_steps", "int", 1, low=1, why="micro-steps per optimizer step"),
    Knob("seq_len", "int", 2048, low=1, why="tokens per sample"),
    # Not a reference keyword: sizes the cluster as tp*pp*ep*dp_size accelerators.
    Knob("dp_size", "int", None, low=1, why="data-parallel degree when it sizes the cluster"),
)}


#: The keywords of mlsysim 0.3.0 ``DistributedModel.solve``, in its order.
REFERENCE_KNOBS = tuple(name for name in KNOBS if name != "dp_size")


def canonical_precision(value) -> str:
    """The reference's canonical key for a precision name (case-insensitive)."""
    if not isinstance(value, (str, np.str_)):
        raise ValueError(f"precision must be a string such as 'fp16', but got {value!r}")
    key = str(value).lower()
    if key not in PRECISION_BYTES:
        raise ValueError(
            f"precision must be one of {', '.join(PRECISION_BYTES)} (any case), but got {value!r}"
        )
    return key


def _first_bad(array, bad):
    value = array[bad].flat[0] if np.ndim(array) else array
    return value.item() if hasattr(value, "item") else value


def _describe_bounds(knob):
    parts = []
    if knob.low is not None:
        parts.append(f"{'>' if knob.low_open else '>='} {knob.low:g}")
    if knob.high is not None:
        parts.append(f"<= {knob.high:g}")
    return " and ".join(parts)


def _out_of_bounds(knob, array):
    bad = np.zeros(np.shape(array), dtype=bool)
    if knob.low is not None:
        bad |= (array <= knob.low) if knob.low_open else (array < knob.low)
    if knob.high is not None:
        bad |= array > knob.high
    return bad


def _check_bounds(knob, array, low, high):
    # The extremes (the caller's two reductions) on the fast path; the mask is built only
    # to report a refusal.
    edges = np.array([low, high])
    if _out_of_bounds(knob, edges).any():
        bad = _out_of_bounds(knob, array)
        kind = "an integer" if knob.kind == "int" else "a number"
        raise ValueError(
            f"{knob.name} must be {kind} {_describe_bounds(knob)} ({knob.why}), "
            f"but got {knob.name}={_first_bad(array, bad)!r}"
        )


def _array(knob, value):
    """``np.asarray(value)``, with numpy's refusals (ragged lists) naming the knob."""
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{knob.name} must be a scalar or a rectangular array, "
                         f"but got {value!r:.80} ({err})") from None


def _as_int(knob, value):
    array = _array(knob, value)
    if array.dtype == bool or array.dtype.kind not in "iuf":
        raise ValueError(
            f"{knob.name} must be an integer or an array of integers ({knob.why}), "
            f"but got {value!r:.80}"
        )
    if array.dtype.kind == "f":
        bad = ~np.isfinite(array) | (array != np.round(array))
        if bad.any():
            raise ValueError(
                f"{knob.name} must be a whole number ({knob.why}), "
                f"but got {knob.name}={_first_bad(array, bad)!r}"
            )
    if array.size == 0:
        return array.astype(np.int64, copy=False)
    low, high = array.min(), array.max()  # two reductions serve every range check
    if high >= MAX_INTEGER or low <= -MAX_INTEGER:
        raise ValueError(
            f"{knob.name} must be below 2**53 ({knob.why}; larger counts are not exact "
            f"in float64), but got {knob.name}={_first_bad(array, np.abs(array) >= MAX_INTEGER)!r}")
    array = array.astype(np.int64, copy=False)
    _check_bounds(knob, array, low, high)
    return array


def _as_float(knob, value):
    array = _array(knob, value)
    if array.dtype == bool or array.dtype.kind not in "iuf":
        raise ValueError(f"{knob.name} must be a number or an array of numbers ({knob.why}), "
                         f"but got {value!r:.80}")
    array = array.astype(np.float64, copy=False)
    if array.size == 0:
        return array
    low, high = array.min(), array.max()  # NaN and inf show in the extremes
    if not (np.isfinite(low) and np.isfinite(high)):
        raise ValueError(f"{knob.name} must be finite ({knob.why}), "
                         f"but got {knob.name}={_first_bad(array, ~np.isfinite(array))!r}")
    _check_bounds(knob, array, low, high)
    return array


def _as_bool(knob, value):
    array = _array(knob, value)
    if array.dtype == bool:
        return array
    if array.dtype.kind in "iuf" and np.isin(array, (0, 1)).all():
        return array.astype(bool)
    raise ValueError(f"{knob.name} must be True or False (or an array of them), "
                     f"but got {value!r:.80}")


class Precisions:
    """An array of precision names, stored as codes into ``keys`` (canonical names)."""

    __slots__ = ("keys", "codes")

    def __init__(self, keys, codes):
        self.keys, self.codes = tuple(keys), codes

    @property
    def shape(self):
        return self.codes.shape

    def names(self):
        """The canonical names as a string array."""
        return np.array(self.keys)[self.codes]

    def lookup(self, fn):
        """``fn(key)`` for every distinct precision, spread over the array [float64]."""
        return np.array([fn(key) for key in self.keys], dtype=np.float64)[self.codes]


def _ascii_key(array):
    """A uint64 per short ASCII string (7 bits a character), or None if they do not fit."""
    if array.dtype.kind != "U" or array.dtype.itemsize // 4 > 9:
        return None
    chars = np.ascontiguousarray(array).view(np.uint32).reshape(array.shape + (-1,))
    if chars.size and chars.max() >= 128:
        return None
    key = np.zeros(array.shape, dtype=np.uint64)
    for position in range(chars.shape[-1]):  # a few characters, not configurations
        key = (key << np.uint64(7)) | chars[..., position]
    return key


def _factorize(array):
    """Distinct values of an array and its codes; one pass per distinct value.

    Short ASCII strings (every precision name) are compared as integers, which
    is an order of magnitude faster than comparing strings.
    """
    key = _ascii_key(array)
    probe = array if key is None else key
    codes = np.full(array.shape, -1, dtype=np.int64)
    values = []
    while True:
        todo = (codes < 0).ravel()
        first = int(np.argmax(todo))
        if not todo[first]:
            return values, codes
        codes[probe == probe.flat[first]] = len(values)
        values.append(array.flat[first])


def _as_precision(knob, value):
    if isinstance(value, (str, np.str_)):
        return canonical_precision(value)
    if isinstance(value, Precisions):
        return value
    array = _array(knob, value)
    if array.size == 0:
        raise ValueError(f"precision must be a string or a non-empty array of strings such as "
                         f"['bf16', 'fp8'], but got an empty array (shape {array.shape})")
    if array.dtype.kind not in "UO":
        raise ValueError(f"precision must be a string or an array of strings, but got {value!r:.80}")
    raw, codes = _factorize(array)
    keys = sorted({canonical_precision(v) for v in raw})
    to_key = np.array([keys.index(canonical_precision(v)) for v in raw], dtype=np.int64)
    return Precisions(keys, to_key[codes])


def _as_topology(knob, value):
    if not (value is None or isinstance(value, str)) or value not in TOPOLOGIES:
        raise ValueError(
            f"topology_override must be None, 'ring' or 'tree', but got {value!r}"
        )
    return value


_CONVERT = {
    "int": _as_int,
    "float": _as_float,
    "bool": _as_bool,
    "precision": _as_precision,
    "topology": _as_topology,
}


def normalize(values: dict, *, check_bounds: bool = True) -> dict:
    """Check every knob and convert it to a numpy array of its kind.

    Parameters
    ----------
    values : dict
        Knob name -> scalar or array.
    check_bounds : bool, optional
        False skips the range checks (bounds, finiteness, below 2**53) of numeric
        knobs that already have their kind's dtype (int64, float64): a caller that
        makes them in its own pass over the values (the fused kernels, which then
        call ``normalize(values)`` to raise) saves two or three passes per knob.
        Every other check and conversion is made as usual.

    Returns
    -------
    dict
        Knob name -> int64, float64 or bool array; precision: a canonical name,
        or :class:`Precisions` for an array of names.

    Raises
    ------
    ValueError
        Naming the knob, what it accepts and the offending value.
    """
    out = {}
    for name, value in values.items():
        knob = KNOBS[name]
        if not check_bounds and _DTYPES.get(knob.kind) == getattr(value, "dtype", None):
            out[name] = np.asarray(value)
            continue
        out[name] = _CONVERT[knob.kind](knob, value)
    return out


_DTYPES = {"int": np.dtype(np.int64), "float": np.dtype(np.float64)}
