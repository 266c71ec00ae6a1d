"""The schema of catalog files: the kinds of entry, each kind's keys, and their converters.

Each key of a catalog table (``[accelerators.H100]``, ``[fleets.X]``, ...) has
an expected type (for messages) and a converter ``(value, where, resolve) ->
value`` that checks it and turns quantity strings into SI floats at load
(:mod:`solver.units`). :mod:`solver.catalog` builds the specs from them.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

from .knobs import MAX_INTEGER
from .units import parse_quantity

__all__ = ["KINDS", "MAGNITUDE", "CatalogError"]

#: Catalog sections, in the order they are built (references point backwards).
KINDS = ("accelerators", "fabrics", "workloads", "nodes", "fleets")

_SINGULAR = {"accelerators": "accelerator", "nodes": "node", "fabrics": "fabric",
             "fleets": "fleet", "workloads": "workload"}

#: Magnitudes a catalog number or quantity may have, in SI units (or be 0): far
#: beyond any real hardware or model, and far inside float64, so no product or
#: quotient of the model overflows to inf or underflows to 0 (which would then
#: make NaN of a valid configuration).
MAGNITUDE = (1e-30, 1e30)


class CatalogError(ValueError):
    """An unknown catalog name, or a catalog/user TOML entry that cannot be read."""


# ----------------------------------------------------------------- fields

class _Field(NamedTuple):
    expected: str                      # for messages: "an integer", "a bytes quantity such as ..."
    convert: Callable                  # (value, where, resolve) -> converted value
    required: bool = False


def _type_name(value) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string",
            dict: "table", list: "array"}.get(type(value), type(value).__name__)


def _wrong(where, expected, value):
    return CatalogError(f"{where}: expected {expected}, but got {_type_name(value)} {value!r}")


def _string(value, where, resolve):
    if not isinstance(value, str):
        raise _wrong(where, "a string", value)
    return value


def _integer(value, where, resolve):
    if not isinstance(value, int) or isinstance(value, bool):
        raise _wrong(where, "an integer", value)
    if abs(value) >= MAX_INTEGER:  # counts stay exact in float64
        raise _wrong(where, "an integer below 2**53", value)
    return value


def _in_range(number, value, where, what):
    if not math.isfinite(number):
        raise _wrong(where, f"a finite {what}", value)
    low, high = MAGNITUDE
    if number != 0 and not low <= abs(number) <= high:
        raise _wrong(where, f"a {what} of magnitude {low:g} to {high:g} (SI units) or 0", value)
    return number


def _number(value, where, resolve):
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise _wrong(where, "a plain number", value)
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    return _in_range(number, value, where, "number")


def _quantity(dimension):
    def convert(value, where, resolve):
        try:
            number = parse_quantity(value, dimension, where=where)
        except OverflowError:
            number = math.inf
        except ValueError as err:
            raise CatalogError(str(err)) from None
        return _in_range(number, value, where, f"{dimension} quantity")
    return convert


def _flops_table(value, where, resolve):
    if not isinstance(value, dict):
        raise _wrong(where, "an inline table of precision = FLOP/s quantity", value)
    return {key: _quantity("flops")(v, f"{where}.{key}", resolve) for key, v in value.items()}


def _boolean(value, where, resolve):
    if not isinstance(value, bool):
        raise _wrong(where, "true or false", value)
    return value


def _number_table(value, where, resolve):
    if not isinstance(value, dict):
        raise _wrong(where, "an inline table of precision = number", value)
    return {key: _number(v, f"{where}.{key}", resolve) for key, v in value.items()}


def _reference(kind):
    def convert(value, where, resolve):
        return resolve(kind, _string(value, where, resolve), where)
    return convert


def _field(kind_of_value: str, required: bool = False) -> _Field:
    table = {
        "string": ("a string", _string),
        "integer": ("an integer", _integer),
        "number": ("a plain number", _number),
        "bytes": ("a bytes quantity such as '80 GiB'", _quantity("bytes")),
        "bandwidth": ("a bandwidth quantity such as '3.35 TB/s' or '400 Gbps'", _quantity("bandwidth")),
        "flops": ("a FLOP/s quantity such as '989 TFLOP/s'", _quantity("flops")),
        "time": ("a time quantity such as '5 us'", _quantity("time")),
        "power": ("a power quantity such as '700 W'", _quantity("power")),
        "flops_table": ("an inline table of precision = FLOP/s quantity", _flops_table),
        "boolean": ("true or false", _boolean),
        "number_table": ("an inline table of precision = number", _number_table),
    }
    if kind_of_value in _SINGULAR:
        return _Field(f"the name of a {_SINGULAR[kind_of_value]} (this file or the built-in catalog)",
                      _reference(kind_of_value), required)
    expected, convert = table[kind_of_value]
    return _Field(expected, convert, required)


_SCHEMA = {
    "accelerators": {
        "name": _field("string"),
        "peak_flops": _field("flops", True),
        "precision_flops": _field("flops_table"),
        "memory_capacity": _field("bytes", True),
        "memory_bandwidth": _field("bandwidth", True),
        "sram_capacity": _field("bytes"),
        "sram_bandwidth": _field("bandwidth"),
        "flash_bandwidth": _field("bandwidth"),
        "host_link_bandwidth": _field("bandwidth"),
        "nvlink_latency": _field("time"),
        "tdp": _field("power"),
        "dispatch_tax": _field("time"),
        "source": _field("string"),
        "gemm_efficiency": _field("number_table"),
        "architecture": _field("string"),
    },
    "nodes": {
        "name": _field("string"),
        "accelerator": _field("accelerators", True),
        "accelerators_per_node": _field("integer", True),
        "intra_node_bandwidth": _field("bandwidth", True),
        "source": _field("string"),
        "scale_up_domain": _field("integer"),
        "scale_up_bus_bandwidth": _field("bandwidth"),
        "nic_bandwidth": _field("bandwidth"),
    },
    "fabrics": {
        "name": _field("string"),
        "bandwidth": _field("bandwidth", True),
        "latency": _field("time"),
        "oversubscription": _field("number"),
        "source": _field("string"),
    },
    "fleets": {
        "name": _field("string"),
        "node": _field("nodes", True),
        "count": _field("integer", True),
        "fabric": _field("fabrics", True),
        "source": _field("string"),
    },
    "workloads": {
        "name": _field("string"),
        "kind": _field("string", True),
        "parameters": _field("number"),
        "model_size": _field("bytes"),
        "inference_flops": _field("number"),
        "layers": _field("integer"),
        "hidden_dim": _field("integer"),
        "heads": _field("integer"),
        "active_parameters": _field("number"),
        "experts": _field("integer"),
        "active_experts_per_token": _field("integer"),
        "denoising_steps": _field("integer"),
        "source": _field("string"),
        "kv_heads": _field("integer"),
        "ffn_hidden_dim": _field("integer"),
        "vocab_size": _field("integer"),
        "head_dim": _field("integer"),
        "gated_mlp": _field("boolean"),
        "moe_ffn_hidden_dim": _field("integer"),
        "shared_experts": _field("integer"),
        "dense_layers": _field("integer"),
        "tied_embeddings": _field("boolean"),
        "kv_lora_rank": _field("integer"),
        "q_lora_rank": _field("integer"),
        "qk_nope_head_dim": _field("integer"),
        "qk_rope_head_dim": _field("integer"),
        "v_head_dim": _field("integer"),
    },
}
