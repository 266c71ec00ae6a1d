"""How Megatron-Core runs a training step: ``solve(workload, fleet, **knobs)``.

A second physics model beside mlsysim's (``solver.distributed``), judged by its
error against measured runs (``benchmarks/fidelity.py``), not by agreement
with the reference. It is composed of the topic modules' formula functions in
named steps, like pvlib's ModelChain:

1. **split**: TP x CP x DP x PP ranks (EP folded into DP x CP, as Megatron-Core
   does [6]); microbatches ``m = batch / (dp * micro_batch)``.
2. **layer**: GEMM by GEMM FLOPs (:mod:`solver.flops`) timed on the accelerator's
   efficiency curve (:mod:`solver.gemm`: size curve times the depth term
   ``K / (K + K0)`` of each GEMM's local reduction dimension after the TP split),
   FP8/FP4 for the transformer layers' GEMMs only; attention core (fused causal
   kernel at the accelerator's sourced efficiency [10], or unfused softmax);
   memory-bound kernels at HBM bandwidth; TP all-reduces (or RS + AG under SP,
   hidden by ``tp_comm_overlap``), CP ring exchange of K/V hidden behind
   attention, EP all-to-all (:mod:`solver.network`). A layer takes the longer
   of its GPU time and the host's time to launch its kernels [12].
3. **pipeline**: heaviest stage (LM head on the last: its GEMMs in 16 bits and
   the FP32 cross-entropy at HBM bandwidth [11]), 1F1B / interleaved bubble
   ``(p-1)/v`` stage-microbatches [1], p2p activation sends (divided by TP [1]).
4. **data parallel**: gradient all-reduce or reduce-scatter (distributed
   optimizer) in buckets overlapped with the last microbatch's backward,
   parameter all-gather overlapped with the first forward, FSDP per-microbatch
   gathers; optimizer step at HBM bandwidth; a fixed per-step overhead.
5. **memory**: :mod:`solver.megatron_memory` on the heaviest stage.

The free constants (:data:`CONSTANTS`) are the all-data fit stored in
``configs/physics/megatron.toml`` with its provenance; each may be overridden
by keyword (and may be an array).

References
----------
[1] Narayanan, D. et al. (2021), "Efficient large-scale language model training
    on GPU clusters using Megatron-LM", SC21 (eq. 1 and Sec. 2.2: bubble
    (p-1)/m, interleaved (p-1)/(v m); Sec. 4.1 scatter/gather of p2p sends).
[2] Korthikanti, V. et al. (2023), "Reducing activation recomputation in large
    transformer models", MLSys (sequence parallelism: all-reduce = RS + AG).
[3] Shoeybi, M. et al. (2019), "Megatron-LM", arXiv:1909.08053 (2 all-reduces
    forward and 2 backward per layer).
[4] Liu, H. et al. (2023), "Ring attention with blockwise transformers",
    arXiv:2310.01889; Megatron-Core context parallelism docs (K/V ring, cp - 1 steps,
    overlapped with attention).
[5] Dao, T. (2023), "FlashAttention-2", arXiv:2307.08691 (backward 2.5x the
    forward FLOPs; causal blocks skipped).
[6] Megatron-Core ``parallel_state.initialize_model_parallel``: rank order
    tp-cp-ep-dp-pp; expert parallelism splits the data x context parallel
    ranks, so ``ep_size`` must divide ``dp_size * cp_size``.
[7] Megatron-Core ``distributed/distributed_data_parallel.py`` and
    ``optimizer/distrib_optimizer.py``: gradients reduced per bucket as the
    backward produces them (``overlap_grad_reduce``), parameters all-gathered
    per bucket before the forward uses them (``overlap_param_gather``); FP32
    gradient reduction for BF16 training.
[8] Calculon (Isaev et al., SC23) ``systems/*.json``: per-step network
    latencies 1 us (NVLink) and 2 us (InfiniBand).
[9] Rajbhandari, S. et al. (2020), "ZeRO", SC: stage 3 gathers parameters in
    forward and backward and reduce-scatters gradients, per microbatch.
[10] Shah, J. et al. (2024), "FlashAttention-3", arXiv:2407.08608, Fig. "Attention
    forward speed, head dim 128 (H100 80GB SXM5)", causal: FlashAttention-2 at
    298-335 TFLOP/s for 2k-16k tokens.
[11] Megatron-Core ``tensor_parallel/cross_entropy.py``
    (``_VocabParallelCrossEntropy``) on ``logits.float()``
    (``GPTModel.compute_language_model_loss``); the output layer is a plain
    ``ColumnParallelLinear``, outside Transformer Engine's FP8 autocast, so the LM
    head's GEMMs run in 16 bits under FP8 training.
[12] PyTorch CUDA semantics ("Asynchronous execution"): kernels are queued by the
    host and run when the device is free, so a step is bound by the slower of
    the host's issue rate and the device's work (CUDA Graphs exist to lift the
    host bound).
"""

from __future__ import annotations

import importlib.resources
import math
import tomllib
from pathlib import Path

import numpy as np

from .. import flops as fl
from .. import gemm
from .. import knobs as knobs_
from .. import megatron_memory as mem
from .. import network as net
from ..specs import Fleet, Workload

__all__ = ["solve", "OUTPUTS", "KNOBS", "DEFAULTS", "CONSTANTS", "CONSTANTS_PROVENANCE",
           "RECOMPUTE", "PRECISIONS", "load_constants"]

#: Recompute modes, coded 0, 1, 2.
RECOMPUTE = ("none", "selective", "full")
#: Precisions of the GEMMs (weights stay 16-bit), coded 0..3.
PRECISIONS = ("bf16", "fp16", "fp8", "fp4")

#: Network latency per algorithm step [s], NVLink and scale-out [8] (a fabric's
#: own stated latency is used for scale-out when it states one).
SCALE_UP_STEP_LATENCY = 1e-6
SCALE_OUT_STEP_LATENCY = 2e-6
#: Dense peak [FLOP/s] the GEMM curves' constants refer to (Calculon's A100, [8] of gemm).
GEMM_REFERENCE_PEAK = 312e12
#: Plateau share of peak for a large GEMM when the accelerator states none [1]
#: (Calculon's 0.95 for >= 128 GFLOP; the fitted ``gemm_scale`` multiplies it).
DEFAULT_GEMM_PLATEAU = 0.95
#: Vocabulary when a workload states none (GPT-2's, padded as Megatron-LM pads it).
DEFAULT_VOCAB = 51200
#: Adam step: FP32 grad read, master/m/v read+write, 16-bit weight write [B per parameter].
OPTIMIZER_BYTES_TOUCHED = 30.0
#: Unfused attention: bytes through HBM per score element, forward (scores, mask,
#: softmax, dropout: write + read of each 2-byte tensor, 1-byte mask) [2].
SOFTMAX_BYTES = 11.0
#: FlashAttention-2 backward / forward FLOPs [5].
FLASH_BACKWARD_RATIO = 2.5
#: Share of the 16-bit dense peak a fused causal attention kernel achieves when the
#: accelerator states none (``gemm_efficiency["flash_attention"]`` in the catalog):
#: FlashAttention-2 forward, causal, head dim 128, 4k-16k tokens on H100 SXM5,
#: 319-335 TFLOP/s of 989 [10]; the backward is taken at the same rate.
DEFAULT_FLASH_ATTENTION_EFFICIENCY = 0.33
#: HBM bytes per token per hidden unit per layer of the memory-bound kernels outside
#: the MLP's activation, forward (the backward moves twice as much): two fused
#: layer norms (read + write 2 + 2 each) and two fused bias-dropout-adds (read the
#: GEMM output and the residual, write the sum: 2 + 2 + 2, and the 1-byte mask) [2].
ELEMENTWISE_BYTES = 22.0
#: Bytes through HBM per FP32 logit element of the vocabulary-parallel cross-entropy,
#: forward and backward [11]: cast of the 16-bit logits to FP32 (2 + 4), max (4),
#: subtract the max (4 + 4), exp (4 + 4), sum (4), divide into the softmax kept for
#: the backward (4 + 4); backward: scale the softmax by the loss gradient (4 + 4) and
#: cast to 16 bits for the logits GEMM's backward (4 + 2).
CROSS_ENTROPY_BYTES = 52.0

#: The installed data package of the fitted constants, and the source tree's copy
#: (a checkout put on ``sys.path`` without installing).
CONSTANTS_PACKAGE = "layout_sweep_configs.physics"
_SOURCE_CONSTANTS_DIR = Path(__file__).resolve().parent.parent.parent / "configs" / "physics"


def _resource_dir(package: str, source_dir: Path):
    """``package`` as an :mod:`importlib.resources` traversable, else ``source_dir``."""
    try:
        return importlib.resources.files(package)
    except ModuleNotFoundError:
        return source_dir


_CONSTANTS_FILE = _resource_dir(CONSTANTS_PACKAGE, _SOURCE_CONSTANTS_DIR) / "megatron.toml"

#: Constant name -> (low, high, meaning). Values: :data:`CONSTANTS`.
CONSTANT_BOUNDS = {
    "gemm_scale": (1e-3, 1.0 / DEFAULT_GEMM_PLATEAU, "multiplier on the large-GEMM plateau (bf16/fp16)"),
    "fp8_gemm_scale": (1e-3, 1.5, "extra multiplier on the plateau of FP8/FP4 GEMMs"),
    "gemm_size_shift": (1e-3, 1e3, "scale of the GEMM size curve's durations"),
    "gemm_k_overhead": (0.0, 8192.0, "fixed cost per GEMM output tile, in columns of the reduction dimension at 312 TFLOP/s"),
    "attention_efficiency": (1e-3, 2.0, "multiplier on the accelerator's sourced fused-attention efficiency"),
    "elementwise_bytes": (0.0, 1e4, "HBM bytes per token per hidden unit per layer, forward (counted: ELEMENTWISE_BYTES)"),
    "layer_overhead": (0.0, 1.0, "host time to launch one layer's forward kernels; a layer takes at least this [s]"),
    "scale_up_efficiency": (1e-3, 1.0, "share of the NVLink domain's NCCL-tests bus bandwidth achieved"),
    "scale_out_efficiency": (1e-3, 1.0, "share of the NIC rate NCCL achieves across nodes"),
    "overlap_efficiency": (0.0, 1.0, "share of compute time that hides overlapped communication"),
    "step_overhead": (0.0, 1e3, "fixed time per step (data, logging, synchronization) [s]"),
    "collective_latency": (0.0, 1e-4, "fixed time per collective or p2p call (launch, handshake) [s]"),
}


def load_constants(path=None):
    """The fitted constants and their provenance from a TOML file.

    Returns
    -------
    tuple of (dict str -> float, dict str -> str)
    """
    source = Path(path) if path is not None else _CONSTANTS_FILE
    with source.open("rb") as handle:
        data = tomllib.load(handle)
    constants = {k: float(v) for k, v in data["constants"].items()}
    missing = set(CONSTANT_BOUNDS) - set(constants)
    if missing:
        raise ValueError(f"{path or _CONSTANTS_FILE}: missing constants {sorted(missing)}")
    return constants, {k: str(v) for k, v in data.get("provenance", {}).items()}


CONSTANTS, CONSTANTS_PROVENANCE = load_constants()

_K = knobs_.Knob
#: The knobs of :func:`solve` (name -> :class:`solver.knobs.Knob`).
KNOBS = {k.name: k for k in (
    _K("batch_size", "int", 1, low=1, why="global batch in sequences"),
    _K("seq_len", "int", 2048, low=1, why="tokens per sequence"),
    _K("tp_size", "int", 1, low=1, why="tensor-parallel degree"),
    _K("pp_size", "int", 1, low=1, why="pipeline-parallel degree"),
    _K("cp_size", "int", 1, low=1, why="context-parallel degree"),
    _K("ep_size", "int", 1, low=1, why="expert-parallel degree (folded into DP x CP)"),
    _K("dp_size", "int", None, low=1, why="data-parallel degree when it sizes the cluster"),
    _K("v_stages", "int", 1, low=1, why="virtual pipeline stages per device"),
    _K("micro_batch_size", "int", 1, low=1, why="sequences per microbatch"),
    _K("sequence_parallel", "bool", False),
    _K("recompute", "choice", "none"),
    _K("zero_stage", "int", 1, low=0, high=3, why="0 DDP, 1 distributed optimizer, 2 + grads, 3 FSDP"),
    _K("precision", "choice", "bf16"),
    _K("tp_comm_overlap", "bool", False),
    _K("overlap_grad_reduce", "bool", True),
    _K("overlap_param_gather", "bool", True),
    _K("flash_attention", "bool", True),
)}
#: Knob name -> default.
DEFAULTS = {name: knob.default for name, knob in KNOBS.items()}
_CHOICES = {"recompute": RECOMPUTE, "precision": PRECISIONS}

#: Output name -> (CF units, long name).
OUTPUTS = {
    "valid": ("1", "split is possible: TP*PP*CP divides the fleet and EP divides DP*CP"),
    "realizable": ("1", "Megatron-Core can run it: whole microbatches, even splits, no idle ranks"),
    "dp_size": ("1", "data-parallel degree"),
    "microbatch_count": ("1", "microbatches per step per data-parallel rank"),
    "step_latency_total": ("s", "training step time"),
    "effective_throughput": ("s-1", "fleet throughput in samples per second"),
    "tokens_per_second_per_accelerator": ("s-1", "tokens per second per accelerator"),
    "model_flops_per_accelerator": ("FLOP s-1", "model FLOP/s per accelerator (Megatron-LM's count)"),
    "mfu": ("1", "model FLOPs utilization against the dense peak at the GEMM precision"),
    "hfu": ("1", "hardware FLOPs utilization (recomputation included)"),
    "compute_latency": ("s", "busy time of the heaviest stage (GEMMs, attention, memory-bound kernels)"),
    "tp_communication_latency": ("s", "exposed tensor-parallel collectives"),
    "cp_communication_latency": ("s", "exposed context-parallel K/V exchange"),
    "ep_communication_latency": ("s", "expert-parallel all-to-all"),
    "pp_communication_latency": ("s", "exposed pipeline p2p sends"),
    "dp_communication_latency": ("s", "exposed data-parallel gradient reduction and parameter gather"),
    "communication_latency": ("s", "all communication before overlap"),
    "pipeline_bubble_latency": ("s", "pipeline fill and drain"),
    "bubble_fraction": ("1", "idle share of the pipelined step"),
    "optimizer_latency": ("s", "optimizer step"),
    "memory_footprint": ("byte", "training memory per accelerator (heaviest stage)"),
    "memory_weights": ("byte", "weights per accelerator"),
    "memory_gradients": ("byte", "gradients per accelerator"),
    "memory_optimizer_state": ("byte", "optimizer state per accelerator"),
    "memory_activations": ("byte", "stored activations per accelerator"),
    "memory_communication_buffers": ("byte", "gradient buckets, p2p and gather buffers per accelerator"),
    "feasible": ("1", "training state fits the accelerator's memory"),
}


# ------------------------------------------------------------------ knobs

def _codes(name, value):
    """Integer codes into :data:`_CHOICES` [name] for a string or array of strings."""
    choices = _CHOICES[name]

    def code(v):
        key = str(v).lower() if isinstance(v, (str, np.str_)) else None
        if key not in choices:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, but got {v!r}")
        return choices.index(key)

    if isinstance(value, (str, np.str_)):
        return np.int64(code(value))
    array = knobs_._array(KNOBS[name], value)
    if array.dtype.kind not in "UO":
        raise ValueError(f"{name} must be a string or an array of strings, but got {value!r:.80}")
    raw, codes = knobs_._factorize(array)
    table = np.array([code(v) for v in raw], dtype=np.int64)
    return table[codes]


def _normalize(values):
    out = {}
    for name, value in values.items():
        knob = KNOBS[name]
        if knob.kind == "choice":
            out[name] = _codes(name, value)
        else:
            out[name] = knobs_._CONVERT[knob.kind](knob, value)
    return out


def _constants(overrides):
    out = dict(CONSTANTS)
    for name, value in overrides.items():
        if name not in CONSTANT_BOUNDS:
            raise TypeError(f"solve() got an unexpected keyword argument {name!r} (knobs: "
                            f"{', '.join(KNOBS)}; constants: {', '.join(CONSTANT_BOUNDS)})")
        low, high, why = CONSTANT_BOUNDS[name]
        array = np.asarray(value, dtype=np.float64)
        if not np.all(np.isfinite(array)) or np.any(array < low) or np.any(array > high):
            bad = array[~(np.isfinite(array) & (array >= low) & (array <= high))].flat[0] \
                if array.ndim else array
            raise ValueError(f"{name} must be a number in [{low:g}, {high:g}] ({why}), "
                             f"but got {name}={float(bad)!r}")
        out[name] = array
    return out


# --------------------------------------------------------------- hardware

def _peak(acc, key):
    pf = acc.precision_flops
    if key in ("bf16", "fp16"):
        for k in (key, "fp16" if key == "bf16" else "bf16", "fp16_dense"):
            if k in pf:
                return pf[k]
        return acc.peak_flops
    return pf.get(key, _peak(acc, "bf16") if key == "fp8" else _peak(acc, "fp8"))


def _plateau(acc, key):
    ge = acc.gemm_efficiency
    return ge.get(key, ge.get("bf16", DEFAULT_GEMM_PLATEAU))


class _Shape:
    """The workload's transformer shape, with Megatron's defaults for what it omits."""

    def __init__(self, w: Workload):
        if w.layers is None or w.parameters is None:
            raise ValueError(f"workload {w.name!r}: the megatron physics needs layers and parameters")
        self.layers = int(w.layers)
        if w.hidden_dim and w.heads:
            self.hidden, self.heads = int(w.hidden_dim), int(w.heads)
        else:  # no shape: 12 L h^2 = N (then FLOPs are about 6 N per token)
            self.hidden = int(round(math.sqrt((w.active_parameters or w.parameters) / (12 * self.layers))))
            self.heads = max(1, self.hidden // 128)
        h = self.hidden
        self.kv_heads = int(w.kv_heads or self.heads)
        self.head_dim = float(w.head_dim or h / self.heads)
        self.gated = bool(w.gated_mlp)
        self.ffn = float(w.ffn_hidden_dim or 4 * h)
        self.vocab = float(w.vocab_size or (DEFAULT_VOCAB if w.hidden_dim else 0))
        self.moe = bool(w.experts and w.experts > 1)
        self.experts = int(w.experts or 1)
        self.top_k = float(w.active_experts_per_token or 1) if self.moe else 0.0
        self.moe_ffn = float(w.moe_ffn_hidden_dim or self.ffn)
        self.shared = float(w.shared_experts or 0)
        self.dense_layers = int(w.dense_layers or 0) if self.moe else self.layers
        self.moe_layers = self.layers - self.dense_layers
        mats = 3.0 if self.gated else 2.0
        attn = h * self.head_dim * (self.heads + 2 * self.kv_heads) + self.heads * self.head_dim * h
        self.dense_layer_params = attn + mats * h * self.ffn + 2 * h
        self.expert_params = mats * h * self.moe_ffn
        self.moe_layer_nonexpert = attn + 2 * h + h * self.experts + self.shared * self.expert_params
        self.embedding_params = self.vocab * h


# ------------------------------------------------------------------- solve

def solve(workload: Workload, fleet: Fleet, *, batch_size=1, seq_len=2048, tp_size=1, pp_size=1,
          cp_size=1, ep_size=1, dp_size=None, v_stages=1, micro_batch_size=1,
          sequence_parallel=False, recompute="none", zero_stage=1, precision="bf16",
          tp_comm_overlap=False, overlap_grad_reduce=True, overlap_param_gather=True,
          flash_attention=True, **constants):
    """Megatron-Core training step of ``workload`` on ``fleet``, for every configuration at once.

    Every knob may be an array; all broadcast together (pass a grid as an
    open mesh, like ``np.ix_``: each term is computed on the axes it spans).

    Parameters
    ----------
    workload : solver.specs.Workload
        A transformer or MoE; its optional shape fields (``kv_heads``,
        ``ffn_hidden_dim``, ``vocab_size``, ``gated_mlp``, ``moe_ffn_hidden_dim``,
        ``shared_experts``, ...) refine the FLOPs and memory.
    fleet : solver.specs.Fleet
    batch_size : int [1]
        Global batch in sequences.
    seq_len : int [1]
    tp_size, pp_size, cp_size, ep_size : int [1]
        Tensor, pipeline, context and expert-parallel degrees. EP is folded
        into DP x CP [6]: it must divide ``dp_size * cp_size``.
    dp_size : int [1], optional
        Data-parallel degree. If given, the cluster is ``tp*pp*cp*dp``
        accelerators of the fleet's node type; else ``dp`` is derived from the
        fleet's accelerators (``total / (tp*pp*cp)``, which must be whole).
    v_stages : int [1]
        Virtual (interleaved) stages per device.
    micro_batch_size : int [1]
        Sequences per microbatch; ``microbatch_count = batch / (dp * mbs)``,
        which must be whole (else ``realizable`` is False).
    sequence_parallel : bool
    recompute : {"none", "selective", "full"}
    zero_stage : {0, 1, 2, 3}
        0 DDP, 1 distributed optimizer, 2 also gradients, 3 FSDP.
    precision : {"bf16", "fp16", "fp8", "fp4"}
        Of the GEMMs; FP8/FP4 apply to GEMMs only.
    tp_comm_overlap, overlap_grad_reduce, overlap_param_gather : bool
    flash_attention : bool
        Fused causal attention kernel (False: unfused softmax, as Megatron-LM
        ran before 2023).
    **constants : float or array_like
        Overrides of :data:`CONSTANTS` (names in :data:`CONSTANT_BOUNDS`).

    Returns
    -------
    dict of str -> numpy.ndarray
        :data:`OUTPUTS` in SI units, of the broadcast shape (read-only views
        where a term spans fewer axes). Where ``valid`` is False every float
        output is NaN and every bool False.

    Raises
    ------
    ValueError
        For a knob value no configuration can have, naming the knob and value.
    """
    if not isinstance(workload, Workload):
        raise TypeError(f"workload must be a solver.specs.Workload, but got {type(workload).__name__}")
    if not isinstance(fleet, Fleet):
        raise TypeError(f"fleet must be a solver.specs.Fleet, but got {type(fleet).__name__}")
    values = dict(batch_size=batch_size, seq_len=seq_len, tp_size=tp_size, pp_size=pp_size,
                  cp_size=cp_size, ep_size=ep_size, v_stages=v_stages,
                  micro_batch_size=micro_batch_size, sequence_parallel=sequence_parallel,
                  recompute=recompute, zero_stage=zero_stage, precision=precision,
                  tp_comm_overlap=tp_comm_overlap, overlap_grad_reduce=overlap_grad_reduce,
                  overlap_param_gather=overlap_param_gather, flash_attention=flash_attention)
    if dp_size is not None:
        values["dp_size"] = dp_size
    k = _normalize(values)
    c = _constants(constants)
    try:
        shape = np.broadcast_shapes(*(np.shape(v) for v in list(k.values()) + list(c.values())))
    except ValueError:
        shapes = {n: np.shape(v) for n, v in {**k, **c}.items() if np.shape(v)}
        raise ValueError("the array knobs must broadcast together, but got "
                         + ", ".join(f"{n} of shape {s}" for n, s in shapes.items())) from None
    return _solve(_Shape(workload), fleet, k, c, shape)


def _exposed(comm, window, efficiency):
    """Communication left after hiding it behind ``efficiency * window`` of compute [s]."""
    return np.maximum(comm - efficiency * window, 0.0)


def _solve(w: _Shape, fleet: Fleet, k, c, shape):
    node, fabric = fleet.node, fleet.fabric
    acc = node.accelerator
    tp, pp, cp, ep = k["tp_size"], k["pp_size"], k["cp_size"], k["ep_size"]
    v, mbs, batch, s = k["v_stages"], k["micro_batch_size"], k["batch_size"], k["seq_len"]
    sp = k["sequence_parallel"] & (tp > 1)
    rc, zero = k["recompute"], k["zero_stage"]
    prec = k["precision"]

    # ---- 1. split
    model_parallel = tp * 1.0 * pp * cp
    if "dp_size" in k:
        dp = k["dp_size"]
        valid = model_parallel * dp < knobs_.MAX_INTEGER
    else:
        n_total = fleet.total_accelerators
        fits = model_parallel <= n_total
        safe = np.where(fits, model_parallel, 1.0)
        valid = fits & (n_total % safe == 0)
        dp = np.where(valid, n_total // safe, 1).astype(np.int64)
    group = dp * cp  # gradient / optimizer-shard group [6]
    valid = valid & (group % ep == 0)
    n_acc = model_parallel * dp
    m_exact = batch / (dp * 1.0 * mbs)
    m = np.maximum(np.floor(m_exact), 1.0)
    realizable = (valid & (m_exact == np.floor(m_exact)) & (m_exact >= 1)
                  & (w.heads % tp == 0) & ((w.kv_heads % tp == 0) | (tp % w.kv_heads == 0))
                  & (w.layers % (pp * v) == 0) & ((v == 1) | (pp > 1))
                  & ((cp == 1) | (s % (2 * cp) == 0))
                  & ((w.experts % ep == 0) if w.moe else (ep == 1))
                  & ~(k["tp_comm_overlap"] & ~sp & (tp > 1)))

    # ---- hardware facts by precision code (tiny tables, spread by the codes)
    gemm_key = np.array(PRECISIONS)
    peak_gemm = np.array([_peak(acc, p) for p in PRECISIONS])[prec]
    peak16 = np.array([_peak(acc, "fp16" if p == "fp16" else "bf16") for p in PRECISIONS])[prec]
    low_bits = np.array([p in ("fp8", "fp4") for p in PRECISIONS])[prec]
    plateau = (np.array([_plateau(acc, p) for p in gemm_key])[prec] * c["gemm_scale"]
               * np.where(low_bits, c["fp8_gemm_scale"], 1.0))
    plateau16 = np.array([_plateau(acc, "fp16" if p == "fp16" else "bf16") for p in PRECISIONS])[prec] \
        * c["gemm_scale"]
    grad_bytes = np.where(prec == PRECISIONS.index("fp16"), 2.0, 4.0)  # FP32 reduce for BF16 [7]
    hbm = acc.memory_bandwidth
    shift = c["gemm_size_shift"]
    domain = node.scale_up_domain or node.accelerators_per_node
    up_bw = (node.scale_up_bus_bandwidth or node.intra_node_bandwidth) * c["scale_up_efficiency"]
    out_bw = (node.nic_bandwidth or fabric.bandwidth / fabric.oversubscription) * c["scale_out_efficiency"]
    up_lat = SCALE_UP_STEP_LATENCY
    call_lat = c["collective_latency"]
    flash_eff = acc.gemm_efficiency.get("flash_attention", DEFAULT_FLASH_ATTENTION_EFFICIENCY)
    out_lat = fabric.latency if fabric.latency is not None else SCALE_OUT_STEP_LATENCY

    def g(flops, calls=1.0, peak=peak_gemm, plat=plateau, k=None):
        # k: the GEMM's reduction dimension on this rank (its depth term, gemm [2]); the
        # backward's data- and weight-gradient GEMMs are priced at the forward's.
        # The fixed cost per tile is a time: in columns of K it grows with the device's
        # rate (normalized to the A100's 312 TFLOP/s, like the size curve's knots).
        return gemm.gemm_time(flops / calls, peak, plateau=plat, size_shift=shift, calls=calls,
                              k_dim=k, k_overhead=c["gemm_k_overhead"] * peak / GEMM_REFERENCE_PEAK)

    # ---- 2. one layer, one microbatch, one rank
    h, d = float(w.hidden), w.head_dim
    s_local = s / (cp * 1.0)
    tokens = mbs * s_local
    heads_t = w.heads / (tp * 1.0)
    kv_t = np.maximum(w.kv_heads / (tp * 1.0), 1.0)
    ffn_t = w.ffn / tp
    norm_split = np.where(sp, tp, 1)  # SP splits norms, dropout and residuals by TP [2]
    t_qkv = g(fl.qkv_flops(tokens, h, heads=heads_t, kv_heads=kv_t, head_dim=d), k=h)
    t_proj = g(fl.attention_output_flops(tokens, h, heads=heads_t, head_dim=d), k=heads_t * d)
    flash = k["flash_attention"]
    # Attention core: a fused causal kernel skips masked blocks [5] at its own efficiency;
    # an unfused softmax computes the whole s x s and streams it through HBM.
    core_flops = fl.attention_core_flops(mbs, s_local, s, heads=heads_t, head_dim=d,
                                         causal_fraction=np.where(flash, 0.5, 1.0))
    scores = mbs * heads_t * s_local * s
    t_core_f = np.where(
        flash, core_flops / (peak16 * flash_eff * c["attention_efficiency"]),
        g(core_flops, calls=mbs * heads_t, peak=peak16, plat=plateau16)
        + gemm.memory_bound_time(SOFTMAX_BYTES * scores, hbm))
    t_core_b = t_core_f * np.where(flash, FLASH_BACKWARD_RATIO, 2.0)

    def mlp_time(tok, width, calls=1.0):
        fc1 = 2.0 * tok * h * width * (1.0 + w.gated)
        fc2 = 2.0 * tok * width * h
        act = gemm.memory_bound_time(2.0 * tok * width * (3.0 if w.gated else 2.0), hbm)
        return g(fc1, calls, k=h) + g(fc2, calls, k=width) + act

    t_mlp_dense = mlp_time(tokens, ffn_t)
    elementwise = gemm.memory_bound_time(c["elementwise_bytes"] * tokens * h / norm_split, hbm)
    attn_gemms_f = t_qkv + t_proj
    t_dense_f = attn_gemms_f + t_mlp_dense + elementwise
    if w.moe:
        local_experts = w.experts / (ep * 1.0)
        routed = tokens * w.top_k
        t_moe = (mlp_time(routed, w.moe_ffn / tp, calls=local_experts)
                 + (mlp_time(tokens, w.shared * w.moe_ffn / tp) if w.shared else 0.0)
                 + g(fl.router_flops(tokens, h, w.experts), k=h))
        t_moe_f = attn_gemms_f + t_moe + elementwise
    else:
        t_moe_f = 0.0
    moe_share = w.moe_layers / w.layers
    layer_f = (1 - moe_share) * t_dense_f + moe_share * t_moe_f  # GEMMs + memory-bound + overhead
    # Backward: 2x the forward GEMMs and memory-bound kernels [3]; recompute adds
    # the forward (full) or the attention core (selective) again.
    layer_b = 2.0 * layer_f + t_core_b
    layer_b = layer_b + np.where(rc == 2, layer_f + t_core_f, np.where(rc == 1, t_core_f, 0.0))
    layer_f = layer_f + t_core_f

    # TP: 2 all-reduces forward, 2 backward per layer [3] (RS + AG under SP [2], same bus
    # bytes), 2 more when the forward is recomputed in full; over NVLink in the domain.
    act_bytes = 2.0 * tokens * h
    tp_in = tp <= domain
    tp_bw = np.where(tp_in, up_bw, out_bw)
    tp_lat = np.where(tp_in, up_lat, out_lat)
    t_ar = net.allreduce_time(act_bytes, tp, bus_bandwidth=tp_bw, latency=tp_lat) + call_lat * (tp > 1)
    tp_calls = 4.0 + 2.0 * (rc == 2)
    tp_total = tp_calls * t_ar
    tp_hidden = np.where(k["tp_comm_overlap"] & sp, c["overlap_efficiency"], 0.0)
    tp_layer = tp_total * (1.0 - tp_hidden)
    # CP: cp-1 ring steps of the local K and V, forward; K, V and their gradients backward
    # (3x in all), hidden behind the attention core [4].
    kv_bytes = 2.0 * 2.0 * tokens * kv_t * d
    cp_in = tp * cp <= domain
    cp_step = net.p2p_time(kv_bytes, bandwidth=np.where(cp_in, up_bw, out_bw),
                           latency=np.where(cp_in, up_lat, out_lat)) + call_lat
    cp_f = (cp - 1) * cp_step
    cp_total = 3.0 * cp_f * (1.0 + (rc == 2) / 3.0)
    cp_layer = (_exposed(cp_f, t_core_f, 1.0) + _exposed(2.0 * cp_f, t_core_b, 1.0)
                + (rc == 2) * _exposed(cp_f, t_core_f, 1.0))
    # EP: dispatch + combine forward and backward per MoE layer, top-k copies of each token.
    if w.moe:
        ep_in = tp * cp * ep <= domain
        a2a = net.all_to_all_time(act_bytes * w.top_k / norm_split, ep,
                                  bus_bandwidth=np.where(ep_in, up_bw, out_bw),
                                  latency=np.where(ep_in, up_lat, out_lat)) + call_lat * (ep > 1)
        ep_layer = moe_share * (4.0 + 2.0 * (rc == 2)) * a2a
    else:
        ep_layer = np.zeros(())

    # ---- 3. pipeline: the heaviest stage and the bubble
    layers_stage = np.ceil(w.layers / (pp * 1.0))
    # The host launches kernels asynchronously: a layer takes its GPU time or the
    # host's time to issue its kernels, whichever is longer [12] (forward once,
    # backward twice, the recomputed forward again) -- small microbatches of small
    # models are launch-bound, and then a bigger microbatch costs nothing extra.
    launches = c["layer_overhead"] * (3.0 + (rc == 2))
    per_layer = np.maximum(layer_f + layer_b + tp_layer + cp_layer + ep_layer, launches)
    t_layers = layers_stage * per_layer
    vocab_t = w.vocab / tp
    head_tokens = tokens
    # LM head: the logits GEMM forward and backward in 16 bits (outside FP8 [11]) and the
    # FP32 vocabulary-parallel cross-entropy at HBM bandwidth [11].
    t_head = 3.0 * g(fl.logits_flops(head_tokens, h, vocab_t), peak=peak16, plat=plateau16, k=h) \
        + gemm.memory_bound_time(CROSS_ENTROPY_BYTES * head_tokens * vocab_t, hbm)
    stage_max = t_layers + t_head
    stage_mean = t_layers + t_head / pp
    bubble = (pp - 1) / (v * 1.0) * stage_mean  # eq. (1) and Sec. 2.2 of [1]
    t_pipe = m * stage_max + bubble
    # p2p: microbatch activations, split by TP (scatter/gather, Sec. 4.1 of [1]); the first
    # and last send cross all p v - 1 chunk boundaries; 1F1B also waits on each steady send.
    pp_in = tp * cp * dp * 2 <= domain
    t_p2p = net.p2p_time(act_bytes / tp, bandwidth=np.where(pp_in, up_bw, out_bw),
                         latency=np.where(pp_in, up_lat, out_lat)) + call_lat
    t_pp = np.where(pp > 1, 2.0 * t_p2p * ((pp * v - 1) + np.where(v == 1, m, 0.0)), 0.0)

    # ---- 4. data parallel
    dense_stage_params = (w.dense_layer_params * w.dense_layers / w.layers
                          + w.moe_layer_nonexpert * w.moe_layers / w.layers) * layers_stage / tp \
        + w.embedding_params / tp * (pp == 1)
    expert_stage_params = (w.expert_params * w.experts * w.moe_layers / w.layers) * layers_stage \
        / (tp * ep * 1.0) if w.moe else 0.0
    heavy_params = dense_stage_params + w.embedding_params / tp * (pp > 1)  # + LM head on last
    ranks_up = np.clip(domain // tp, 1, None)
    ranks_up = np.minimum(ranks_up, group)

    def dp_coll(kind, nbytes, n):
        return net.two_level_time(kind, nbytes, n, np.minimum(ranks_up, n),
                                  scale_up_bandwidth=up_bw, scale_up_latency=up_lat,
                                  scale_out_bandwidth=out_bw, scale_out_latency=out_lat)

    expert_group = np.maximum(group // ep, 1)
    grads_dense = heavy_params * grad_bytes
    grads_expert = expert_stage_params * grad_bytes
    sharded = zero >= 1
    t_grad = np.where(
        sharded, dp_coll("reduce_scatter", grads_dense, group) + (
            dp_coll("reduce_scatter", grads_expert, expert_group) if w.moe else 0.0),
        dp_coll("all_reduce", grads_dense, group) + (
            dp_coll("all_reduce", grads_expert, expert_group) if w.moe else 0.0))
    params_bytes = mem.WEIGHT_BYTES * (heavy_params + expert_stage_params)
    t_gather = np.where(sharded, dp_coll("all_gather", mem.WEIGHT_BYTES * heavy_params, group)
                        + (dp_coll("all_gather", mem.WEIGHT_BYTES * expert_stage_params,
                                   expert_group) if w.moe else 0.0), 0.0)
    # Last microbatch's backward hides the bucketed gradient reduction; the first forward
    # hides the parameter all-gather [7].
    stage_b = layers_stage * (layer_b + tp_layer / 2)
    stage_f = layers_stage * (layer_f + tp_layer / 2)
    eta = c["overlap_efficiency"]
    exp_grad = np.where(k["overlap_grad_reduce"], _exposed(t_grad, stage_b, eta), t_grad)
    exp_gather = np.where(k["overlap_param_gather"], _exposed(t_gather, stage_f, eta), t_gather)
    # FSDP [9]: gather forward and backward, reduce-scatter gradients, every microbatch,
    # prefetched behind the whole compute.
    # The gathers run as one flat ring per rank over its own NIC (DeepSpeed ZeRO-3 and
    # FSDP shard over all DP ranks, not per node), the bound NAR21 Table 2 measured.
    fsdp_bw = np.where(group <= domain, up_bw, out_bw)
    fsdp_lat = np.where(group <= domain, up_lat, out_lat)
    t_fsdp = m * (2.0 * net.all_gather_time(params_bytes, group, bus_bandwidth=fsdp_bw, latency=fsdp_lat)
                  + net.reduce_scatter_time((heavy_params + expert_stage_params) * grad_bytes, group,
                                            bus_bandwidth=fsdp_bw, latency=fsdp_lat))
    exp_fsdp = np.where(k["overlap_param_gather"], _exposed(t_fsdp, t_pipe, eta), t_fsdp)
    fsdp = zero == 3
    t_dp_total = np.where(fsdp, t_fsdp, t_grad + t_gather)
    t_dp = np.where(fsdp, exp_fsdp, exp_grad + exp_gather)
    # Optimizer: Adam over the local (sharded) parameters at HBM bandwidth.
    local_params = heavy_params + expert_stage_params
    t_opt = gemm.memory_bound_time(
        OPTIMIZER_BYTES_TOUCHED * local_params / np.where(sharded, group, 1), hbm)

    total = t_pipe + t_pp + t_dp + t_opt + c["step_overhead"]

    # ---- outputs: throughput and utilization
    model_flops = fl.megatron_model_flops(
        batch, s, w.layers, h, heads=w.heads, kv_heads=w.kv_heads,
        ffn_hidden=np.where(w.moe, w.moe_ffn, w.ffn) if w.moe else w.ffn, vocab=w.vocab,
        gated=w.gated, experts_per_token=w.top_k if w.moe else 1.0,
        shared_ffn_hidden=w.shared * w.moe_ffn, head_dim=d)
    if w.moe and w.dense_layers:
        model_flops = model_flops + fl.megatron_model_flops(
            batch, s, w.dense_layers, h, heads=w.heads, kv_heads=w.kv_heads, ffn_hidden=w.ffn,
            vocab=0.0, gated=w.gated, head_dim=d) - fl.megatron_model_flops(
            batch, s, w.dense_layers, h, heads=w.heads, kv_heads=w.kv_heads, ffn_hidden=w.moe_ffn,
            vocab=0.0, gated=w.gated, experts_per_token=w.top_k,
            shared_ffn_hidden=w.shared * w.moe_ffn, head_dim=d)
    per_acc = model_flops / (total * n_acc)
    recompute_extra = np.where(rc == 2, 1.0 / 3.0, np.where(
        rc == 1, 4.0 * s * h * w.layers / (model_flops / (batch * s)), 0.0))
    mfu = per_acc / peak_gemm

    # ---- 5. memory of the heaviest stage
    weights, grads, optim = mem.model_state(dense_stage_params + w.embedding_params / tp * (pp > 1),
                                            shard_group=group, zero_stage=zero)
    if w.moe:
        we, ge, oe = mem.model_state(expert_stage_params, shard_group=expert_group, zero_stage=zero)
        weights, grads, optim = weights + we, grads + ge, optim + oe
    act_dense = mem.layer_activation_bytes(
        mbs, s_local, h, heads=w.heads, kv_heads=w.kv_heads, ffn_hidden=w.ffn, gated=w.gated,
        tp_size=tp, sequence_parallel=sp, recompute_code=rc, flash_attention=flash)
    if w.moe:
        act_moe = mem.layer_activation_bytes(
            mbs, s_local, h, heads=w.heads, kv_heads=w.kv_heads, ffn_hidden=w.ffn, gated=w.gated,
            tp_size=tp, sequence_parallel=sp, recompute_code=rc, flash_attention=flash,
            moe_top_k=w.top_k, moe_ffn_hidden=w.moe_ffn + w.shared * w.moe_ffn / max(w.top_k, 1))
        act_layer = (1 - moe_share) * act_dense + moe_share * act_moe
    else:
        act_layer = act_dense
    activations = act_layer * mem.in_flight_layers(layers_stage, pp, v, m) + np.where(
        pp == 1, mem.logits_bytes(mbs, s_local, w.vocab, tp_size=tp), 0.0)
    bucket = grad_bytes * np.maximum(4e7, 1e6 * group)  # Megatron DDP bucket size [7]
    buffers = (bucket + 2.0 * act_bytes / tp * (pp > 1)
               + (zero == 3) * 2.0 * mem.WEIGHT_BYTES * (params_bytes / mem.WEIGHT_BYTES / layers_stage))
    footprint = weights + grads + optim + activations + buffers

    out = {
        "dp_size": dp * 1.0,
        "microbatch_count": m_exact,
        "step_latency_total": total,
        "effective_throughput": batch / total,
        "tokens_per_second_per_accelerator": batch * 1.0 * s / (total * n_acc),
        "model_flops_per_accelerator": per_acc,
        "mfu": mfu,
        "hfu": mfu * (1.0 + recompute_extra),
        "compute_latency": m * layers_stage * (layer_f + layer_b) + m * t_head,
        "tp_communication_latency": m * layers_stage * tp_layer,
        "cp_communication_latency": m * layers_stage * cp_layer,
        "ep_communication_latency": m * layers_stage * ep_layer,
        "pp_communication_latency": t_pp,
        "dp_communication_latency": t_dp,
        "communication_latency": m * layers_stage * (tp_total + cp_total + ep_layer) + t_pp + t_dp_total,
        "pipeline_bubble_latency": bubble,
        "bubble_fraction": bubble / t_pipe,
        "optimizer_latency": t_opt,
        "memory_footprint": footprint,
        "memory_weights": weights,
        "memory_gradients": grads,
        "memory_optimizer_state": optim,
        "memory_activations": activations,
        "memory_communication_buffers": buffers,
    }
    out["feasible"] = footprint <= acc.memory_capacity
    all_valid = bool(np.all(valid))
    nan = None if all_valid else np.where(valid, 0.0, np.nan)
    result = {"valid": np.broadcast_to(valid, shape), "realizable": np.broadcast_to(realizable, shape)}
    for name, value in out.items():
        value = np.asarray(value)
        if value.dtype == bool:
            value = value if all_valid else value & valid
        else:
            value = value.astype(np.float64, copy=False)
            if nan is not None:
                value = value + nan
        result[name] = np.broadcast_to(value, shape)
    return {name: result[name] for name in OUTPUTS}
