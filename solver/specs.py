"""Frozen specifications of hardware and workloads, in plain SI floats.

Every quantity is stored once, in SI base units, as the datasheet (or the
mlsysim 0.3.0 registry) states it: bytes [B], bytes per second [B/s],
floating-point operations per second [FLOP/s], seconds [s], watts [W].
Conventions that depend on a fact being absent (a fabric with no stated
latency, an accelerator with no host link) are applied by the solver, not
here, so that a spec says only what its source says.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Optional

__all__ = [
    "Accelerator",
    "Node",
    "Fabric",
    "Fleet",
    "Workload",
    "WORKLOAD_KINDS",
]

#: Workload families, named after the mlsysim 0.3.0 classes they mirror.
#: ``transformer`` = TransformerWorkload, ``moe`` = SparseTransformerWorkload,
#: ``cnn`` = CNNWorkload, ``ssm`` = SSMWorkload, ``diffusion`` =
#: DiffusionWorkload, ``embodied`` = EmbodiedWorkload, ``generic`` = Workload.
WORKLOAD_KINDS = ("transformer", "moe", "cnn", "ssm", "diffusion", "embodied", "generic")


def _positive(obj, *names):
    for name in names:
        value = getattr(obj, name)
        if value is None:
            continue
        if not value > 0:
            raise ValueError(
                f"{type(obj).__name__} {obj.name!r}: {name} must be > 0, but got {value!r}"
            )


@dataclass(frozen=True)
class Accelerator:
    """One accelerator (GPU, TPU, ...).

    Parameters
    ----------
    name : str
    peak_flops : float [FLOP/s]
        Default (dense FP16) peak; used for any precision not in ``precision_flops``.
    memory_capacity : float [B]
    memory_bandwidth : float [B/s]
    precision_flops : mapping str -> float [FLOP/s]
        Peaks by precision key as the registry names them (``fp32``, ``fp8``, ...).
    sram_capacity, sram_bandwidth, flash_bandwidth : float, optional [B], [B/s]
        On-chip SRAM and flash tiers (single-device roofline path only).
    host_link_bandwidth : float, optional [B/s]
        One-way host (PCIe) bandwidth; the offload path's bandwidth.
    nvlink_latency : float, optional [s]
        Per-hop latency of the accelerator's NVLink-class link.
    tdp : float, optional [W]
    dispatch_tax : float [s]
        Fixed per-step launch overhead (mlsysim default 0.01 ms).
    gemm_efficiency : mapping str -> float, optional [1]
        Megatron physics only: achieved share of the dense peak on large GEMMs,
        by precision key (``bf16``, ``fp8``, ...), as published GEMM benchmarks state it.
    architecture : str, optional
        Megatron physics only: the GPU architecture (``"ampere"``, ``"hopper"``,
        ``"blackwell"``); Hopper's GEMMs get the fitted ``hopper_gemm_scale``.
    """

    name: str
    peak_flops: float
    memory_capacity: float
    memory_bandwidth: float
    precision_flops: Mapping[str, float] = field(default_factory=dict)
    sram_capacity: Optional[float] = None
    sram_bandwidth: Optional[float] = None
    flash_bandwidth: Optional[float] = None
    host_link_bandwidth: Optional[float] = None
    nvlink_latency: Optional[float] = None
    tdp: Optional[float] = None
    dispatch_tax: float = 1e-5
    source: str = ""
    gemm_efficiency: Mapping[str, float] = field(default_factory=dict)
    architecture: str = ""

    def __post_init__(self):
        object.__setattr__(self, "precision_flops", MappingProxyType(dict(self.precision_flops)))
        object.__setattr__(self, "gemm_efficiency", MappingProxyType(dict(self.gemm_efficiency)))
        for key, value in self.gemm_efficiency.items():
            if not 0 < value <= 1:
                raise ValueError(
                    f"Accelerator {self.name!r}: gemm_efficiency[{key!r}] must be in (0, 1], but got {value!r}"
                )
        _positive(self, "peak_flops", "memory_capacity", "memory_bandwidth",
                  "sram_capacity", "sram_bandwidth", "flash_bandwidth", "host_link_bandwidth")
        for key, value in self.precision_flops.items():
            if not value > 0:
                raise ValueError(
                    f"Accelerator {self.name!r}: precision_flops[{key!r}] must be > 0, but got {value!r}"
                )
        for name in ("nvlink_latency", "dispatch_tax", "tdp"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"Accelerator {self.name!r}: {name} must be >= 0, but got {value!r}")

    def peak_for(self, precision: str) -> float:
        """Peak [FLOP/s] at a canonical precision key (the reference's lookup)."""
        return self.precision_flops.get(precision, self.peak_flops)


@dataclass(frozen=True)
class Node:
    """A server holding ``accelerators_per_node`` accelerators.

    ``intra_node_bandwidth`` [B/s] is the one-way rate between two accelerators of
    the node (the ring collectives' beta).

    Optional facts used by the Megatron physics only (absent = derived from the
    above, see :mod:`solver.network`): ``scale_up_domain`` accelerators joined by
    one NVLink/NVSwitch domain (8 on HGX/DGX, 72 on GB200 NVL72);
    ``scale_up_bus_bandwidth`` [B/s] the NCCL all-reduce bus bandwidth achieved
    inside that domain; ``nic_bandwidth`` [B/s] the scale-out NIC rate per
    accelerator (one direction).
    """

    name: str
    accelerator: Accelerator
    accelerators_per_node: int
    intra_node_bandwidth: float
    source: str = ""
    scale_up_domain: Optional[int] = None
    scale_up_bus_bandwidth: Optional[float] = None
    nic_bandwidth: Optional[float] = None

    def __post_init__(self):
        if int(self.accelerators_per_node) != self.accelerators_per_node or self.accelerators_per_node < 1:
            raise ValueError(
                f"Node {self.name!r}: accelerators_per_node must be an integer >= 1, "
                f"but got {self.accelerators_per_node!r}"
            )
        object.__setattr__(self, "accelerators_per_node", int(self.accelerators_per_node))
        _positive(self, "intra_node_bandwidth", "scale_up_bus_bandwidth", "nic_bandwidth")
        if self.scale_up_domain is not None and (
                int(self.scale_up_domain) != self.scale_up_domain or self.scale_up_domain < 1):
            raise ValueError(f"Node {self.name!r}: scale_up_domain must be an integer >= 1, "
                             f"but got {self.scale_up_domain!r}")


@dataclass(frozen=True)
class Fabric:
    """The inter-node network: per-port ``bandwidth`` [B/s], per-hop ``latency`` [s]."""

    name: str
    bandwidth: float
    latency: Optional[float] = None
    oversubscription: float = 1.0
    source: str = ""

    def __post_init__(self):
        _positive(self, "bandwidth", "oversubscription")
        if self.latency is not None and not self.latency >= 0:
            raise ValueError(f"Fabric {self.name!r}: latency must be >= 0, but got {self.latency!r}")


@dataclass(frozen=True)
class Fleet:
    """``count`` nodes joined by one fabric."""

    name: str
    node: Node
    count: int
    fabric: Fabric
    source: str = ""

    def __post_init__(self):
        if int(self.count) != self.count or self.count < 1:
            raise ValueError(f"Fleet {self.name!r}: count must be an integer >= 1, but got {self.count!r}")
        object.__setattr__(self, "count", int(self.count))

    @property
    def accelerator(self) -> Accelerator:
        return self.node.accelerator

    @property
    def total_accelerators(self) -> int:
        return self.count * self.node.accelerators_per_node

    def with_count(self, count: int) -> "Fleet":
        """The same fleet with ``count`` nodes."""
        return dataclasses.replace(self, count=count, name=f"{self.name}[{count} nodes]")


#: The keys of multi-head latent attention (a Workload's, as DeepSeek's config.json names them).
MLA_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


@dataclass(frozen=True)
class Workload:
    """A model to train.

    Parameters
    ----------
    name : str
    kind : str
        One of :data:`WORKLOAD_KINDS`; decides how the model is lowered.
    parameters : float, optional [1]
        Total parameter count.
    model_size : float, optional [B]
        Stated size in bytes (taken at 2-byte precisions, as the reference does).
    inference_flops : float, optional [FLOP]
        Forward FLOPs per token (language models) or per sample (others).
    layers, hidden_dim, heads : int, optional
    active_parameters : float, optional [1]
        MoE: parameters active per token.
    experts, active_experts_per_token : int, optional
        MoE: expert count and top-k.
    denoising_steps : int, optional
        Diffusion: forward passes per sample.
    kv_heads, ffn_hidden_dim, vocab_size, head_dim : int, optional
        Megatron physics: key/value heads (GQA; default ``heads``), MLP width
        (default 4 * hidden), vocabulary (the tokenizer's: the megatron physics pads it to
        a multiple of 128 x TP as Megatron-LM does; an already padded size is padded again
        only where it is no such multiple), attention head width
        (default hidden / heads).
    gated_mlp : bool, optional
        SwiGLU-style MLP with 3 matrices (default False: GELU, 2 matrices).
    moe_ffn_hidden_dim, shared_experts, dense_layers : int, optional
        MoE: width of one routed expert, shared experts per MoE layer, leading
        dense (non-MoE) layers.
    tied_embeddings : bool, optional
        The output layer shares the input embedding's weights (Megatron-LM's default,
        and GPT's; default True). Llama, Mixtral, Qwen3, DeepSeek-V3 and Nemotron-4
        untie them (``--untie-embeddings-and-output-weights``): a single pipeline stage
        then holds both matrices.
    kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim : int, optional
        Multi-head latent attention (MLA, DeepSeek-V2/V3; the names of their
        ``config.json``): keys and values projected down to ``kv_lora_rank`` (plus a
        shared ``qk_rope_head_dim`` positional key) and up per head; queries likewise
        through ``q_lora_rank`` (None: projected directly). Query and key heads are
        ``qk_nope_head_dim + qk_rope_head_dim`` wide, value heads ``v_head_dim``. Given
        ``kv_lora_rank``, the megatron physics prices MLA; the others but ``q_lora_rank``
        are then required, and ``head_dim`` and ``kv_heads`` (other than ``heads``) refused.
    """

    name: str
    kind: str
    parameters: Optional[float] = None
    model_size: Optional[float] = None
    inference_flops: Optional[float] = None
    layers: Optional[int] = None
    hidden_dim: Optional[int] = None
    heads: Optional[int] = None
    active_parameters: Optional[float] = None
    experts: Optional[int] = None
    active_experts_per_token: Optional[int] = None
    denoising_steps: Optional[int] = None
    source: str = ""
    kv_heads: Optional[int] = None
    ffn_hidden_dim: Optional[int] = None
    vocab_size: Optional[int] = None
    head_dim: Optional[int] = None
    gated_mlp: Optional[bool] = None
    moe_ffn_hidden_dim: Optional[int] = None
    shared_experts: Optional[int] = None
    dense_layers: Optional[int] = None
    tied_embeddings: Optional[bool] = None
    kv_lora_rank: Optional[int] = None
    q_lora_rank: Optional[int] = None
    qk_nope_head_dim: Optional[int] = None
    qk_rope_head_dim: Optional[int] = None
    v_head_dim: Optional[int] = None

    def __post_init__(self):
        if self.kind not in WORKLOAD_KINDS:
            raise ValueError(
                f"Workload {self.name!r}: kind must be one of {', '.join(WORKLOAD_KINDS)}, "
                f"but got {self.kind!r}"
            )
        _positive(self, "parameters", "model_size", "active_parameters")
        if self.parameters is None and self.model_size is None:
            raise ValueError(f"Workload {self.name!r}: give parameters or model_size (got neither)")
        if self.inference_flops is not None and not self.inference_flops >= 0:
            raise ValueError(
                f"Workload {self.name!r}: inference_flops must be >= 0, but got {self.inference_flops!r}"
            )
        for name in ("layers", "hidden_dim", "heads", "experts", "active_experts_per_token",
                     "denoising_steps", "kv_heads", "ffn_hidden_dim", "vocab_size", "head_dim",
                     "moe_ffn_hidden_dim", "shared_experts", "dense_layers", *MLA_KEYS):
            value = getattr(self, name)
            if value is not None and (int(value) != value or value < 0):
                raise ValueError(
                    f"Workload {self.name!r}: {name} must be a whole number >= 0, but got {value!r}"
                )
        needs = {
            "transformer": ("parameters", "layers"),
            "moe": ("parameters", "layers", "active_parameters", "experts"),
            "cnn": ("parameters", "inference_flops"),
            "ssm": ("parameters", "layers", "hidden_dim"),
            "diffusion": ("parameters", "denoising_steps"),
            "embodied": ("parameters",),
            "generic": (),
        }[self.kind]
        missing = [name for name in needs if getattr(self, name) is None]
        if missing:
            raise ValueError(
                f"Workload {self.name!r} of kind {self.kind!r} needs {', '.join(missing)} (got None)"
            )
        if self.kind in ("transformer", "moe") and self.layers < 1:
            raise ValueError(f"Workload {self.name!r}: layers must be >= 1, but got {self.layers!r}")
        self._check_consistent()

    def _check_consistent(self):
        """Refuse a model no one could build: each message names the key, expected and got."""
        def refuse(key, expected, got):
            raise ValueError(f"Workload {self.name!r}: {key} must be {expected}, but got {got!r}")

        if self.kind in ("transformer", "moe", "ssm"):
            for key in ("hidden_dim", "heads"):
                if getattr(self, key) == 0:
                    refuse(key, ">= 1 for a layered model", 0)
        if self.heads and self.hidden_dim and self.heads > self.hidden_dim:
            refuse("heads", f"at most hidden_dim ({self.hidden_dim})", self.heads)
        if self.heads and self.hidden_dim and self.hidden_dim % self.heads:
            refuse("heads", f"a divisor of hidden_dim ({self.hidden_dim})", self.heads)
        if self.kv_heads and self.heads and self.heads % self.kv_heads:
            # grouped-query attention: each KV head serves the same number of query heads
            refuse("kv_heads", f"a divisor of heads ({self.heads})", self.kv_heads)
        mla = [key for key in MLA_KEYS if getattr(self, key) is not None]
        if mla:
            for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                if not getattr(self, key):
                    refuse(key, f"a whole number >= 1 with multi-head latent attention "
                                f"(given: {', '.join(mla)})", getattr(self, key))
            if self.q_lora_rank == 0:
                refuse("q_lora_rank", "None (queries projected directly) or >= 1", 0)
            if self.head_dim is not None:
                refuse("head_dim", "None with multi-head latent attention (its widths are "
                                   "qk_nope_head_dim, qk_rope_head_dim and v_head_dim)", self.head_dim)
            if self.kv_heads is not None and self.kv_heads != self.heads:
                refuse("kv_heads", f"None or heads ({self.heads}) with multi-head latent "
                                   "attention (every head has its own key and value)", self.kv_heads)
        if (self.active_parameters is not None and self.parameters is not None
                and self.active_parameters > self.parameters):
            refuse("active_parameters", f"at most parameters ({self.parameters:g})",
                   self.active_parameters)
        if self.active_experts_per_token is not None:
            if self.experts is None:
                refuse("active_experts_per_token", "given only with experts",
                       self.active_experts_per_token)
            if self.active_experts_per_token > self.experts:
                refuse("active_experts_per_token", f"at most experts ({self.experts})",
                       self.active_experts_per_token)
        if self.kind == "moe" and self.experts < 1:
            refuse("experts", ">= 1 for a mixture of experts", self.experts)

    @property
    def is_transformer(self) -> bool:
        """Priced with the sharded training-memory model (mlsysim TransformerWorkload)."""
        return self.kind in ("transformer", "moe")
