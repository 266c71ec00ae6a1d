"""A user's measured training steps: the CSV format, read and checked line by line.

One run a line. A ``#`` in the first column starts a comment line; blank lines
are skipped. Column names are case-sensitive; an unknown column is refused.

The workload: ``workload``, a catalog name (``Llama3_70B_MC``; see ``python -m
sweep catalog workloads``), or its shape:

=========================  ==============================================================
``layers``                 transformer layers (required with a shape)
``hidden_dim``             hidden width (required with a shape)
``heads``                  attention heads (required with a shape)
``kv_heads``               key/value heads (GQA; default ``heads``)
``ffn_hidden_dim``         MLP width (default ``4 * hidden_dim``)
``vocab_size``             vocabulary, the tokenizer's (padded to 128 x TP by the
                           physics, as Megatron-LM does; default 51200)
``head_dim``               attention head width (default ``hidden_dim / heads``)
``gated_mlp``              SwiGLU-style MLP of 3 matrices (default false)
``tied_embeddings``        output layer shares the embedding's weights (default true,
                           Megatron-LM's; false for Llama-style ``--untie-embeddings-...``)
``parameters``             total parameters, a check of the shape (default: counted
                           from it; the megatron physics prices the shape's count)
``experts``, ``active_experts_per_token``, ``moe_ffn_hidden_dim``, ``shared_experts``,
``dense_layers``           MoE shape (optional)
``kv_lora_rank``,          multi-head latent attention (DeepSeek-V2/V3's ``config.json``
``q_lora_rank``,           keys; optional, ``q_lora_rank`` too where queries are
``qk_nope_head_dim``,      projected down)
``qk_rope_head_dim``,
``v_head_dim``
=========================  ==============================================================

The hardware: ``fleet``, a catalog fleet name (``EOS_H100_MC``), or ``node`` (a
catalog node, ``DGX_H100_MC``) with ``fabric`` (a catalog fabric, default
``InfiniBand_NDR``). Only the node type and the fabric matter: the run's own
size is ``num_gpus`` (the accelerators it used) or ``dp_size``; give either, or
both when they agree (``num_gpus = tp_size * pp_size * cp_size * dp_size``).

The layout: the knobs of :data:`solver.physics.megatron.KNOBS`, by their
Megatron names (``tp_size``, ``pp_size``, ``cp_size``, ``ep_size``,
``dp_size``, ``v_stages``, ``micro_batch_size``, ``batch_size`` (global, in
sequences), ``seq_len``, ``sequence_parallel``, ``recompute`` (none, selective,
full), ``zero_stage`` (0 DDP, 1 distributed optimizer, 2, 3 FSDP),
``precision`` (bf16, fp16, fp8, fp4), ``tp_comm_overlap``,
``overlap_grad_reduce``, ``overlap_param_gather``, ``flash_attention``,
``grad_reduce_in_bf16``, ``scatter_gather_tensors_in_pipeline``,
``overlap_p2p_comm``, ``overlap_moe_expert_parallel_comm``, ``hidden_dropout``,
``attention_dropout``, ``cp_comm_type`` (p2p, all_gather, a2a, a2a+p2p),
``cp_a2a_size``, ``fp8_param_gather``, ``cross_entropy_loss_fusion``,
``cross_entropy_fusion_impl`` (native, te), ``recompute_modules`` (core_attn,
moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts, several joined by "+" or a
quoted ","), ``fp8_recipe``, ``recompute_method``, ``moe_shared_expert_overlap``,
``moe_router_num_groups``,
``moe_router_group_topk``, ``use_precision_aware_optimizer``,
``main_params_dtype`` (fp32, fp16), ``exp_avg_dtype`` and ``exp_avg_sq_dtype``
(fp32, fp16, bf16, fp8), ``store_param_remainders``, ...); an
empty cell or a missing column takes the knob's default
(:data:`solver.physics.megatron.DEFAULTS`). Booleans are true/false, yes/no or 1/0.

The measurement, exactly one per line: ``step_time_s`` (one optimizer step,
in seconds) or ``tokens_per_s_per_gpu`` (converted with ``batch_size * seq_len
/ (tokens_per_s_per_gpu * num_gpus)``). ``run_id`` names the line in tables
(default ``line N``).

A line the file cannot mean is refused with :class:`MeasurementError`, naming
the file, the line and the column (a layout Megatron-Core cannot run, a step faster
than the accelerators' dense peak allows at the model's FLOPs, a ``run_id`` two lines
share, a cell of the wrong kind): ``runs.csv line 4, column tp_size: expected a
whole number >= 1, but got 'x'``.
"""

from __future__ import annotations

import csv
import dataclasses
import difflib
import hashlib
import io
import math
import warnings
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from solver import catalog
from solver.catalog import CatalogError
from solver.physics import megatron
from solver.physics.common import caller_stacklevel
from solver.specs import MLA_KEYS, Fleet, Workload

__all__ = ["MeasurementError", "Run", "Measurements", "read_measurements", "COLUMNS",
           "MEASURED", "DEFAULT_FABRIC"]

#: Fabric of a ``node`` column given without ``fabric``.
DEFAULT_FABRIC = "InfiniBand_NDR"
#: The measured quantities; exactly one per line.
MEASURED = ("step_time_s", "tokens_per_s_per_gpu")

_SHAPE_INT = ("layers", "hidden_dim", "heads", "kv_heads", "ffn_hidden_dim", "vocab_size",
              "head_dim", "experts", "active_experts_per_token", "moe_ffn_hidden_dim",
              "shared_experts", "dense_layers", *MLA_KEYS)
_SHAPE = _SHAPE_INT + ("gated_mlp", "tied_embeddings", "parameters")
_HARDWARE = ("fleet", "node", "fabric", "num_gpus")
#: Every column the format knows (name -> what it holds).
COLUMNS = {
    "run_id": "a name for the line",
    "workload": "a catalog workload name",
    **{name: "workload shape" for name in _SHAPE},
    "fleet": "a catalog fleet name", "node": "a catalog node name",
    "fabric": "a catalog fabric name", "num_gpus": "accelerators the run used",
    **{name: knob.why or name for name, knob in megatron.KNOBS.items()},
    "step_time_s": "measured step time [s]",
    "tokens_per_s_per_gpu": "measured tokens per second per accelerator [1/s]",
}
_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")


class MeasurementError(ValueError):
    """A measurements file that cannot be read: names the file, line and column."""


@dataclasses.dataclass(frozen=True)
class Run:
    """One measured run: where it ran, its layout and its step time.

    ``knobs`` are solve keywords of :func:`solver.physics.megatron.solve` with
    ``dp_size`` always stated; ``step_time`` is in seconds [s].
    """

    line: int
    run_id: str
    workload: Workload
    fleet: Fleet
    knobs: Mapping[str, Any]
    step_time: float
    measured_as: str
    group: tuple

    @property
    def n_accelerators(self) -> int:
        k = self.knobs
        return int(k["tp_size"] * k["pp_size"] * k["cp_size"] * k["dp_size"])


@dataclasses.dataclass(frozen=True)
class Measurements:
    """Measured runs read from one source, with the sha256 of its bytes."""

    runs: tuple
    source: str = "<records>"
    sha256: str = ""

    def __len__(self) -> int:
        return len(self.runs)

    @property
    def step_times(self) -> np.ndarray:
        """Measured step times [s], in line order."""
        return np.array([r.step_time for r in self.runs], dtype=np.float64)

    @property
    def run_ids(self) -> list:
        return [r.run_id for r in self.runs]

    def subset(self, indices) -> "Measurements":
        """The runs at ``indices`` (same source and hash)."""
        return dataclasses.replace(self, runs=tuple(self.runs[i] for i in indices))

    def groups(self) -> list:
        """``[(workload, fleet, indices, knobs)]``: one solve per (workload, fleet).

        ``knobs`` maps every solve keyword to a flat array over the group's runs.
        """
        order: dict = {}
        for i, run in enumerate(self.runs):
            order.setdefault(run.group, []).append(i)
        out = []
        for indices in order.values():
            first = self.runs[indices[0]]
            knobs = {name: np.array([self.runs[i].knobs[name] for i in indices])
                     for name in first.knobs}
            out.append((first.workload, first.fleet, np.array(indices), knobs))
        return out


# ------------------------------------------------------------------ cells

class _Line:
    """Where a cell is, carried into every message."""

    def __init__(self, source, line):
        self.source, self.line = source, line

    def fail(self, column, expected, got, hint=""):
        col = f", column {column}" if column else ""
        raise MeasurementError(f"{self.source} line {self.line}{col}: expected {expected}, "
                               f"but got {got!r}{hint}")


def _float(text):
    """``float(text)``, NaN for what is no number; an underscore too (Python reads the cell
    ``0_1`` as 1.0, a typo it would have taken for a value)."""
    try:
        return math.nan if "_" in str(text) else float(text)
    except (TypeError, ValueError):
        return math.nan


def _whole(where, column, text, low=1, high=None):
    number = _float(text)
    ok = math.isfinite(number) and number == int(number) and number >= low \
        and (high is None or number <= high)
    if not ok:
        span = f">= {low}" if high is None else f"from {low} to {high}"
        where.fail(column, f"a whole number {span}", text)
    return int(number)


def _positive(where, column, text):
    number = _float(text)
    if not (math.isfinite(number) and number > 0):
        where.fail(column, "a positive number", text)
    return number


def _number(where, column, text, low, high):
    number = _float(text)
    if not (math.isfinite(number) and low <= number <= high):
        where.fail(column, f"a number from {low:g} to {high:g}", text)
    return number


def _boolean(where, column, text):
    key = str(text).strip().lower()
    if key in _TRUE:
        return True
    if key in _FALSE:
        return False
    where.fail(column, "true or false (yes/no, 1/0)", text)


def _choice(where, column, text, choices):
    key = str(text).strip().lower()
    if column == "recompute_modules":  # its modules in any order, joined by "," or "+"
        try:
            key = megatron.recompute_module_set(key)
        except ValueError as error:
            where.fail(column, str(error).rsplit(", but got", 1)[0].replace(
                "recompute_modules must name ", ""), text)
    if key not in choices:
        where.fail(column, f"one of {', '.join(choices)}", text)
    return key


def _catalog(where, column, text, getter):
    try:
        return getter(str(text).strip())
    except (CatalogError, KeyError, ValueError) as err:
        message = str(err)
        hint = message[message.index("; did you mean"):message.index("?") + 1] \
            if "; did you mean" in message and "?" in message else ""
        kind = {"workload": "workloads", "fleet": "fleets", "node": "nodes",
                "fabric": "fabrics"}.get(column, column)
        where.fail(column, f"a catalog name (python -m sweep catalog {kind} lists them)", text,
                   hint)


# ------------------------------------------------------------------ rows


def _workload(where, row):
    shape = {k: row[k] for k in _SHAPE if row.get(k) not in (None, "")}
    name = row.get("workload", "")
    if name and shape:
        where.fail(next(iter(shape)), f"no shape column when the workload is named ({name!r})",
                   shape[next(iter(shape))])
    if name:
        workload = _catalog(where, "workload", name, catalog.workload)
        if not workload.is_transformer:  # the megatron physics would refuse it (a traceback)
            where.fail("workload", "a transformer (kind 'transformer' or 'moe': the megatron "
                       "physics, which calibrate fits, prices transformers only)", name,
                       f", of kind {workload.kind!r}")
        return workload, ("workload", workload.name)
    if not shape:
        where.fail("workload", "a catalog workload name or the shape columns layers, "
                   "hidden_dim, heads", "")
    for key in ("layers", "hidden_dim", "heads"):
        if key not in shape:
            where.fail(key, "a whole number >= 1 (the shape needs layers, hidden_dim, heads)", "")
    ints = {k: _whole(where, k, shape[k], low=0 if k in ("shared_experts", "dense_layers") else 1)
            for k in _SHAPE_INT if k in shape}
    gated = _boolean(where, "gated_mlp", shape["gated_mlp"]) if "gated_mlp" in shape else False
    tied = (_boolean(where, "tied_embeddings", shape["tied_embeddings"])
            if "tied_embeddings" in shape else True)
    l, h = ints["layers"], ints["hidden_dim"]
    name = row.get("run_id") or f"h{h} l{l}"
    fields = dict(ints, gated_mlp=gated, tied_embeddings=tied)
    try:  # the shape as the megatron physics reads it, counted (kind and size stated below)
        counted = megatron._Shape(Workload(name=name, kind="transformer", parameters=1.0, **fields))
    except ValueError as error:  # a shape no one could build: the spec's message names the key
        key = next((k for k in shape if repr(k) in str(error) or f" {k} " in str(error)), None)
        where.fail(key, "a shape a model can have", shape.get(key, ""), hint=f" ({error})")
    total, active = counted.parameter_counts()
    params = (_positive(where, "parameters", shape["parameters"]) if "parameters" in shape
              else total)
    # The megatron physics counts the parameters from the shape; a stated count is a check
    # of the shape (published counts differ by their embeddings' convention, a few per cent),
    # and one off by 2x or more is a unit or a shape mistake, which the fit would not see.
    if not 0.5 <= params / total <= 2.0:
        where.fail("parameters", f"about the shape's own count, {total:.4g} (the megatron "
                   f"physics counts parameters from the shape; within 2x of it)",
                   shape["parameters"])
    fields["parameters"] = float(params)
    moe = counted.moe
    workload = Workload(name=name, kind="moe" if moe else "transformer",
                        active_parameters=min(active, params) if moe else None,
                        inference_flops=2.0 * params, **fields)
    return workload, ("shape",) + tuple(sorted((k, v) for k, v in fields.items()))


def _fleet(where, row):
    name, node = row.get("fleet", ""), row.get("node", "")
    if name and node:
        where.fail("node", f"no node column when the fleet is named ({name!r})", node)
    if name:
        if row.get("fabric"):
            where.fail("fabric", f"no fabric column when the fleet is named ({name!r})", row["fabric"])
        fleet = _catalog(where, "fleet", name, catalog.fleet)
        return fleet, ("fleet", name)
    if not node:
        where.fail("fleet", "a catalog fleet name, or a catalog node name in column node", "")
    node_spec = _catalog(where, "node", node, catalog.node)
    fabric_name = row.get("fabric") or DEFAULT_FABRIC
    fabric = _catalog(where, "fabric", fabric_name, catalog.fabric)
    return Fleet(f"{node} x {fabric_name}", node_spec, 1, fabric), ("node", node, fabric_name)


def _knobs(where, row):
    knobs = {}
    for name, knob in megatron.KNOBS.items():
        text = row.get(name, "")
        if text in (None, ""):
            knobs[name] = knob.default
        elif knob.kind == "int":
            knobs[name] = _whole(where, name, text, low=int(knob.low),
                                 high=None if knob.high is None else int(knob.high))
        elif knob.kind == "bool":
            knobs[name] = _boolean(where, name, text)
        elif knob.kind == "float":
            knobs[name] = _number(where, name, text, knob.low, knob.high)
        else:
            knobs[name] = _choice(where, name, text, megatron.CHOICES[name])
    if knobs.get("etp_size") is None:  # Megatron-Core's default: the dense TP (stated, so
        knobs["etp_size"] = knobs["tp_size"]  # a group's runs stack into one int array)
    model_parallel = knobs["tp_size"] * knobs["pp_size"] * knobs["cp_size"]
    n_gpus = _whole(where, "num_gpus", row["num_gpus"]) if row.get("num_gpus") else None
    if knobs["dp_size"] is None:
        if n_gpus is None:
            where.fail("num_gpus", "the accelerators the run used (or a dp_size column)", "")
        if n_gpus % model_parallel:
            where.fail("num_gpus", f"a multiple of tp_size * pp_size * cp_size = {model_parallel}",
                       row["num_gpus"])
        knobs["dp_size"] = n_gpus // model_parallel
    elif n_gpus is not None and n_gpus != model_parallel * knobs["dp_size"]:
        where.fail("num_gpus", f"tp_size * pp_size * cp_size * dp_size = "
                   f"{model_parallel * knobs['dp_size']}", row["num_gpus"])
    return knobs


def _measured(where, row, knobs):
    given = [k for k in MEASURED if row.get(k) not in (None, "")]
    if len(given) != 1:
        where.fail(MEASURED[0] if not given else given[1],
                   "exactly one of step_time_s, tokens_per_s_per_gpu",
                   ", ".join(f"{k}={row[k]}" for k in given) or "neither")
    value = _positive(where, given[0], row[given[0]])
    if given[0] == "step_time_s":
        return value, given[0]
    n = knobs["tp_size"] * knobs["pp_size"] * knobs["cp_size"] * knobs["dp_size"]
    return knobs["batch_size"] * knobs["seq_len"] / (value * n), given[0]


def _run(source, line, row) -> Run:
    where = _Line(source, line)
    workload, wkey = _workload(where, row)
    fleet, fkey = _fleet(where, row)
    knobs = _knobs(where, row)
    step, kind = _measured(where, row, knobs)
    return Run(line=line, run_id=row.get("run_id") or f"line {line}", workload=workload,
               fleet=fleet, knobs=knobs, step_time=step, measured_as=kind, group=(wkey, fkey))


#: Knobs of the mlsysim model a measurements file may carry by mistake -> what the megatron
#: model takes instead ("" where nothing): the close-match hint pointed microbatch_count to
#: micro_batch_size, a different quantity, and efficiency to moe_ffn_hidden_dim.
_MLSYSIM_ONLY = {
    "microbatch_count": "the microbatch count follows from batch_size, dp_size and "
                        "micro_batch_size (sequences per microbatch)",
    "efficiency": "its GEMM efficiency is a fitted constant (what calibrate fits), not a column",
    "activation_recomputation": "use recompute (none, selective or full)",
    "overlap_comm": "use overlap_grad_reduce and overlap_param_gather",
    "gradient_accumulation_steps": "the microbatch count follows from batch_size, dp_size and "
                                   "micro_batch_size",
}


def _check_columns(source, header):
    if len(header) == 1 and any(sep in header[0] for sep in ";\t"):
        sep = ";" if ";" in header[0] else "tab"
        raise MeasurementError(f"{source} line 1: expected columns separated by commas, but "
                               f"got one column holding {sep}-separated names (save the file "
                               f"as comma-separated CSV)")
    for column in header:
        if column not in COLUMNS:
            close = difflib.get_close_matches(column, list(COLUMNS), n=1, cutoff=0.4)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            if column in _MLSYSIM_ONLY:  # a knob of the other model: say so, not a look-alike
                hint = (f" ({column!r} is a knob of the mlsysim model; the megatron model, which "
                        f"calibrate fits, has no such knob"
                        + (f": {_MLSYSIM_ONLY[column]}" if _MLSYSIM_ONLY[column] else "") + ")")
            raise MeasurementError(f"{source} line 1, column {column}: expected a column of the "
                                   f"measurements format{hint}, but got {column!r}")
    twice = sorted({c for c in header if header.count(c) > 1})
    if twice:
        raise MeasurementError(f"{source} line 1: expected distinct column names, but got "
                               f"{', '.join(twice)} more than once")
    if not any(c in header for c in MEASURED):
        raise MeasurementError(f"{source} line 1: expected a column step_time_s or "
                               f"tokens_per_s_per_gpu, but got {', '.join(header)}")


def _check_priced(measurements: Measurements) -> None:
    """Refuse runs the model cannot price as Megatron-Core would run them."""
    checked = set()
    for workload, fleet, indices, knobs in measurements.groups():
        # A catalog entry written for the mlsysim physics (Llama3_70B: no KV heads, FFN width
        # or vocabulary) is another model to the megatron physics: said once a workload. A
        # shape of the file's own has its parameters checked where it is read.
        if workload not in checked and catalog.key_of("workloads", workload) is not None:
            checked.add(workload)
            megatron.check_shape(workload)
        try:
            out = megatron.solve(workload, fleet, check_shape=False, **knobs)
        except ValueError as err:
            raise MeasurementError(f"{measurements.source}: {err}") from None
        for name, why in (("valid", "a possible split (ep_size must divide dp_size * cp_size, "
                                    "and etp_size * ep_size must divide tp_size * cp_size * "
                                    "dp_size)"),
                          ("realizable", "a layout Megatron-Core can run (whole microbatches: "
                           "batch_size a multiple of dp_size * micro_batch_size; "
                           f"{megatron.REALIZABLE_RULES})")):
            bad = np.flatnonzero(~np.asarray(out[name]))
            if bad.size:
                run = measurements.runs[indices[bad[0]]]
                broken = ""
                if name == "realizable":  # the rules this run breaks, by name
                    from solver.physics.megatron_steps import REALIZABLE_CONDITIONS
                    where = megatron.why_unrealizable(workload, fleet, **knobs)
                    rules = [r for r, w in where.items() if np.ravel(w)[bad[0]] and r != "valid"]
                    broken = "".join(f"; it breaks {r}: {REALIZABLE_CONDITIONS[r]}" for r in rules)
                raise MeasurementError(f"{measurements.source} line {run.line}: expected {why}, "
                                       f"but got {_layout(run.knobs)}{broken}")
        # The measured step at the model's FLOPs: faster than the accelerators' dense peak
        # allows, it cannot have been measured (a unit or a batch is wrong).
        measured = np.array([measurements.runs[i].step_time for i in indices])
        implied = (np.asarray(out["mfu"], dtype=np.float64)
                   * np.asarray(out["step_latency_total"], dtype=np.float64) / measured)
        bad = np.flatnonzero(implied > 1.0)
        if bad.size:
            run = measurements.runs[indices[bad[0]]]
            raise MeasurementError(
                f"{measurements.source} line {run.line}, column {run.measured_as}: expected a "
                f"step the accelerators can run (the model's FLOPs at most their dense peak), "
                f"but got {run.step_time:.4g} s, which is {implied[bad[0]]:.2f}x that peak "
                f"(MFU {implied[bad[0]]:.2f}): check the unit ("
                + ("seconds per optimizer step" if run.measured_as == "step_time_s"
                   else "tokens per second per GPU, not the job's") +
                ") and batch_size (global, in sequences)")


def _layout(knobs) -> str:
    keys = ("tp_size", "pp_size", "cp_size", "ep_size", "dp_size", "v_stages", "micro_batch_size",
            "batch_size")
    return ", ".join(f"{k}={knobs[k]}" for k in keys)


class CalibrationWarning(UserWarning):
    """The runs cannot identify a constant, or its uncertainty is not stated, or a column
    is left empty on some of them (filter it by class)."""


#: Knob columns a run's layout cannot leave to a default without a slip being likely.
_SPLIT_COLUMNS = ("tp_size", "pp_size", "cp_size", "ep_size", "v_stages", "micro_batch_size",
                  "batch_size", "seq_len", "zero_stage", "recompute", "precision")


#: Columns whose default a run is unlikely to have without saying so: left out of the file,
#: each is named (a missing seq_len had been read as 2,048 on runs of 8,192 and the constants
#: fitted to it, an audit's case; the others' defaults are the plain layout's: one
#: microbatch sequence, BF16, no recompute, the distributed optimizer).
_STATED_COLUMNS = ("seq_len",)


def _warn_absent(source, header) -> None:
    """:class:`CalibrationWarning` naming the columns of :data:`_STATED_COLUMNS` the file
    leaves out, and the default each run takes for it."""
    absent = [c for c in _STATED_COLUMNS if c not in header]
    if absent:
        shown = ", ".join(f"{c} ({megatron.KNOBS[c].default})" for c in absent)
        warnings.warn(f"{source}: no column {', '.join(absent)}: every run takes the default "
                      f"({shown}); add the column where the runs set another", CalibrationWarning,
                      stacklevel=caller_stacklevel())


def _warn_blanks(source, header, numbered) -> None:
    """:class:`CalibrationWarning` for each column of the layout's sizes some runs fill in
    and others leave empty: those take the default (a missing ``pp_size`` had been read as 1 without a
    word, and a step time then blamed for an MFU it could not have)."""
    # The split's sizes only, where an empty cell is a slip: a flag or a dropout left empty
    # is "not stated, the default" (the shipped h100_measurements.csv states dropout 0 on the
    # runs that set it); dp_size and etp_size have no default (a blank dp_size beside
    # num_gpus is the rule); shape columns are blank where a run names a catalog workload.
    columns = [c for c in header if c in _SPLIT_COLUMNS]
    for column in columns:
        i = header.index(column)
        blank = [line for line, cells in numbered if len(cells) == len(header)
                 and not cells[i].strip()]
        if blank and len(blank) < len(numbered):
            default = f"its default ({megatron.KNOBS[column].default})"
            shown = ", ".join(map(str, blank[:8])) + (", ..." if len(blank) > 8 else "")
            warnings.warn(f"{source}: column {column} is empty on line{'s' if len(blank) > 1 else ''} "
                          f"{shown} ({len(blank)} of {len(numbered)} runs), which take "
                          f"{default}; fill it in where the run set it", CalibrationWarning,
                          stacklevel=caller_stacklevel())


def read_measurements(source, *, name: Optional[str] = None) -> Measurements:
    """Read and check measured runs.

    Parameters
    ----------
    source : str, pathlib.Path, Measurements or sequence of dict
        A CSV file (the format of this module's docstring), measurements
        already read, or records (column -> value, one dict a run).
    name : str, optional
        What messages call the source (default: the path, or ``<records>``).

    Returns
    -------
    Measurements

    Raises
    ------
    MeasurementError
        Naming the file, line and column, what was expected and what came.
    """
    if isinstance(source, Measurements):
        return source
    if isinstance(source, (str, Path)):
        path = Path(source)
        try:
            data = path.read_bytes()
        except OSError as err:
            raise MeasurementError(f"{path}: expected a readable measurements CSV file, but got "
                                   f"{err.strerror or err}") from None
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as err:
            line = data[:err.start].count(b"\n") + 1
            raise MeasurementError(f"{path} line {line}: expected UTF-8 text (save the CSV as "
                                   f"UTF-8), but got the byte {data[err.start]:#04x} at offset "
                                   f"{err.start}") from None
        return _from_text(text, name or str(path), hashlib.sha256(data).hexdigest())
    if isinstance(source, Sequence) and all(isinstance(r, Mapping) for r in source):
        buffer = io.StringIO()
        header = list(dict.fromkeys(k for r in source for k in r))
        writer = csv.DictWriter(buffer, header, lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: _cell(v) for k, v in r.items()} for r in source)
        text = buffer.getvalue()
        return _from_text(text, name or "<records>", hashlib.sha256(text.encode()).hexdigest())
    raise MeasurementError(f"measurements: expected a CSV path, Measurements or a list of dicts, "
                           f"but got {type(source).__name__}")


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    return str(value)


def _from_text(text, source, sha256) -> Measurements:
    lines = [(i + 1, line) for i, line in enumerate(text.splitlines())]
    body = [(n, line) for n, line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not body:
        raise MeasurementError(f"{source}: expected a header line and one run a line, but got "
                               f"an empty file")
    # Each record with the line it starts on: a quoted cell may span lines, and zipping
    # records with lines had put every later line number off by one per such cell.
    consumed = []

    def feed():
        for number, line in body:
            consumed.append(number)
            yield line

    reader, numbered = csv.reader(feed()), []
    while True:
        before = len(consumed)
        try:
            cells = next(reader)
        except StopIteration:
            break
        numbered.append((consumed[before], cells))
    rows = [cells for _, cells in numbered]
    header = [c.strip() for c in rows[0]]
    header_line = numbered[0][0]
    try:
        _check_columns(source, header)
    except MeasurementError as err:
        raise MeasurementError(str(err).replace(" line 1", f" line {header_line}", 1)) from None
    runs = []
    for line, cells in numbered[1:]:
        if len(cells) != len(header):
            _Line(source, line).fail("", f"{len(header)} cells (one per column of the header)",
                                     f"{len(cells)} cells")
        runs.append(_run(source, line, {k: c.strip() for k, c in zip(header, cells)}))
    if not runs:
        raise MeasurementError(f"{source}: expected at least one run after the header, but got none")
    _warn_absent(source, header)
    _warn_blanks(source, header, numbered[1:])
    first = {}
    for run in runs:
        if run.run_id in first:
            raise MeasurementError(f"{source} line {run.line}, column run_id: expected a name no "
                                   f"other line has, but got {run.run_id!r} (also line "
                                   f"{first[run.run_id]})")
        first[run.run_id] = run.line
    measurements = Measurements(runs=tuple(runs), source=source, sha256=sha256)
    _check_priced(measurements)
    return measurements
