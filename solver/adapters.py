"""Convert mlsysim 0.3.0 registry objects into this package's specs.

mlsysim is an optional extra: it is imported only inside :func:`from_mlsysim`,
so the solver itself never needs it. Quantities are converted with pint's
``m_as`` into the SI base units of :mod:`solver.specs`.
"""

from __future__ import annotations

from . import specs

__all__ = ["from_mlsysim", "source_of"]

# mlsysim workload class name -> specs.Workload.kind
_KINDS = {
    "SparseTransformerWorkload": "moe",
    "TransformerWorkload": "transformer",
    "CNNWorkload": "cnn",
    "SSMWorkload": "ssm",
    "DiffusionWorkload": "diffusion",
    "EmbodiedWorkload": "embodied",
    "Workload": "generic",
}


def source_of(obj, fallback: str = "") -> str:
    """The ``source`` string of an mlsysim registry object.

    Parameters
    ----------
    obj : object
        Anything with ``metadata.provenance`` (mlsysim Metadata).
    fallback : str, optional
        Returned when the object has no provenance.

    Returns
    -------
    str
        ``"<ref> <<url>>"``, or ``"<ref>"`` when the provenance has no URL.
    """
    metadata = getattr(obj, "metadata", None)
    provenance = getattr(metadata, "provenance", None)
    if provenance is None:
        return fallback
    return f"{provenance.ref} <{provenance.url}>" if provenance.url else provenance.ref


def _m(quantity, unit):
    return None if quantity is None else float(quantity.m_as(unit))


def _workload(obj) -> specs.Workload:
    kind = next(_KINDS[cls.__name__] for cls in type(obj).__mro__ if cls.__name__ in _KINDS)
    ints = {
        name: getattr(obj, name, None)
        for name in ("layers", "hidden_dim", "heads", "experts", "active_experts_per_token",
                     "denoising_steps")
    }
    return specs.Workload(
        name=obj.name,
        kind=kind,
        parameters=_m(obj.parameters, "count"),
        model_size=_m(obj.model_size, "byte"),
        inference_flops=_m(obj.inference_flops, "flop"),
        active_parameters=_m(getattr(obj, "active_parameters", None), "count"),
        source=source_of(obj, f"mlsysim {type(obj).__name__} {obj.name!r}"),
        **ints,
    )


def _accelerator(obj) -> specs.Accelerator:
    compute, memory = obj.compute, obj.memory
    nvlink = obj.nvlink
    return specs.Accelerator(
        name=obj.name,
        peak_flops=_m(compute.peak_flops, "flop/second"),
        precision_flops={k: _m(v, "flop/second") for k, v in compute.precision_flops.items()},
        memory_capacity=_m(memory.capacity, "byte"),
        memory_bandwidth=_m(memory.bandwidth, "byte/second"),
        sram_capacity=_m(memory.sram_capacity, "byte"),
        sram_bandwidth=_m(memory.sram_bandwidth, "byte/second"),
        flash_bandwidth=_m(memory.flash_bandwidth, "byte/second"),
        host_link_bandwidth=(None if obj.interconnect is None
                             else _m(obj.interconnect.bandwidth_per_direction, "byte/second")),
        nvlink_latency=None if nvlink is None else _m(nvlink.latency, "second"),
        tdp=_m(obj.tdp, "watt"),
        dispatch_tax=_m(obj.dispatch_tax, "second"),
        source=source_of(obj, f"mlsysim HardwareNode {obj.name!r}"),
    )


def _node(obj) -> specs.Node:
    return specs.Node(
        name=obj.name,
        accelerator=_accelerator(obj.accelerator),
        accelerators_per_node=obj.accelerators_per_node,
        intra_node_bandwidth=_m(obj.intra_node_bw, "byte/second"),
        source=source_of(obj, f"mlsysim Node {obj.name!r}"),
    )


def _fabric(obj) -> specs.Fabric:
    return specs.Fabric(
        name=obj.name,
        bandwidth=_m(obj.bandwidth, "byte/second"),
        latency=_m(obj.latency, "second"),
        oversubscription=float(obj.oversubscription_ratio),
        source=source_of(obj, f"mlsysim NetworkFabric {obj.name!r}"),
    )


def _fleet(obj) -> specs.Fleet:
    return specs.Fleet(
        name=obj.name,
        node=_node(obj.node),
        count=obj.count,
        fabric=_fabric(obj.fabric),
        source=source_of(obj, f"mlsysim Fleet {obj.name!r}"),
    )


def from_mlsysim(obj):
    """Convert an mlsysim object to the matching spec.

    Parameters
    ----------
    obj : mlsysim Workload (any subclass), HardwareNode, Node, NetworkFabric or Fleet

    Returns
    -------
    specs.Workload, specs.Accelerator, specs.Node, specs.Fabric or specs.Fleet
        All quantities in SI base units. A workload's ``kind`` follows its
        most derived mlsysim class (SparseTransformerWorkload -> ``"moe"``,
        TransformerWorkload -> ``"transformer"``, ..., Workload -> ``"generic"``).

    Raises
    ------
    TypeError
        For any other type.
    ImportError
        If mlsysim is not installed.
    """
    from mlsysim.hardware.types import HardwareNode
    from mlsysim.models.types import Workload
    from mlsysim.systems.types import Fleet, NetworkFabric, Node

    for cls, convert in ((Workload, _workload), (HardwareNode, _accelerator), (Node, _node),
                         (NetworkFabric, _fabric), (Fleet, _fleet)):
        if isinstance(obj, cls):
            return convert(obj)
    raise TypeError(
        "from_mlsysim expects an mlsysim Workload, HardwareNode, Node, NetworkFabric or Fleet, "
        f"but got {type(obj).__module__}.{type(obj).__qualname__}"
    )
