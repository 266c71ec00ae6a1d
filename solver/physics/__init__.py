"""Physics models of a distributed training step, and ``solve``, which dispatches to one.

A physics model is a module that composes the formula functions of the topic
modules (:mod:`solver.collectives`, :mod:`solver.memory`,
:mod:`solver.pipeline`, :mod:`solver.replica`) in named steps, and exposes

- ``solve(workload, fleet, **knobs) -> dict`` of output name -> array, and
- ``OUTPUTS``, the registry entries (:class:`solver.outputs.Output`) of what it returns.

Models:

``"mlsysim"`` (:mod:`solver.physics.mlsysim`, the default)
    mlsysim 0.3.0's ``DistributedModel.solve``, exactly, quirks included.

``"megatron"`` (:mod:`solver.physics.megatron`)
    How Megatron-Core runs on real hardware (sequence and context parallelism,
    distributed optimizer and FSDP gathers, overlaps, per-GEMM efficiency, NVLink
    domains), judged by its error against published measured runs
    (``benchmarks/fidelity.py``). Its knobs are Megatron-Core's
    (:data:`solver.physics.megatron.KNOBS`).

To add a model: write the module, import it below and add its name to
:data:`PHYSICS`. Steps every model
shares (spec checks, the invalid mask) are in :mod:`solver.physics.common`.

    >>> import solver
    >>> wl, fl = solver.catalog.workload("Llama3_70B"), solver.catalog.fleet("Training_1K")
    >>> solver.solve(wl, fl, batch_size=1024, tp_size=8, physics="mlsysim")["mfu"].shape
    ()
"""

from __future__ import annotations

import difflib
import warnings
from types import ModuleType

import numpy as np

from .. import knobs as _knobs
from . import megatron, mlsysim
from .common import caller_stacklevel

__all__ = ["PHYSICS", "KNOBS", "DEFAULT_PHYSICS", "UnrealizableWarning", "model", "solve"]

#: Physics model name -> its module (``solve`` and ``OUTPUTS``).
PHYSICS = {
    "mlsysim": mlsysim,
    "megatron": megatron,
}

#: Physics model name -> its knobs (name -> :class:`solver.knobs.Knob`); mlsysim's are the
#: keywords of its ``DistributedModel.solve`` (:data:`solver.knobs.KNOBS`).
KNOBS = {
    "mlsysim": _knobs.KNOBS,
    "megatron": megatron.KNOBS,
}

#: The model ``solve`` uses unless told otherwise.
DEFAULT_PHYSICS = "mlsysim"


class UnrealizableWarning(UserWarning):
    """No configuration of a :func:`solve` call is ``realizable``.

    Its outputs then price only layouts a framework would not run as stated (a partial
    microbatch, idle ranks, layers that do not split over the stages, ...), or are NaN where
    the split cannot be made. The message names the rules the call breaks.
    """


def model(name: str) -> ModuleType:
    """The physics model called ``name`` (a key of :data:`PHYSICS`).

    Raises
    ------
    ValueError
        For an unknown name, naming the models there are and the closest one.
    """
    found = PHYSICS.get(name) if isinstance(name, str) else None
    if found is None:
        choices = sorted(PHYSICS)
        closest = difflib.get_close_matches(str(name).lower(), choices, n=1, cutoff=0.5) or [
            DEFAULT_PHYSICS]
        raise ValueError(f"physics must be one of {', '.join(map(repr, choices))}, but got "
                         f"{name!r} (the closest is {closest[0]!r})")
    return found


def solve(workload, fleet, *, physics: str = DEFAULT_PHYSICS, engine: str = "auto",
          warn: bool = True, **knobs) -> dict:
    """Distributed training step of ``workload`` on ``fleet``, for every configuration at once.

    Parameters
    ----------
    workload : solver.specs.Workload or str
        From :func:`solver.catalog.workload` or :func:`solver.from_mlsysim`, or a catalog
        key (``"Llama3_70B_MC"``), looked up the same way.
    fleet : solver.specs.Fleet or str
        From :func:`solver.catalog.fleet` or :func:`solver.from_mlsysim`, or a catalog key.
    physics : str, optional
        The model (a key of :data:`PHYSICS`); ``"mlsysim"`` by default.
    **knobs
        The model's knobs. For ``"megatron"``: :data:`solver.physics.megatron.KNOBS`
        (``batch_size``, ``seq_len``, ``tp_size``, ``pp_size``, ``cp_size``,
        ``ep_size``, ``dp_size``, ``v_stages``, ``micro_batch_size``,
        ``sequence_parallel``, ``recompute``, ``zero_stage``, ``precision``,
        ``tp_comm_overlap``, ``overlap_grad_reduce``, ``overlap_param_gather``, ...).
        For ``"mlsysim"``: the keywords of mlsysim 0.3.0's ``DistributedModel.solve`` (``batch_size``,
        ``precision``, ``efficiency``, ``tp_size``, ``pp_size``, ``ep_size``,
        ``v_stages``, ``microbatch_count``, ``topology_override``, ``zero_stage``,
        ``is_lora``, ``activation_recomputation``, ``overlap_comm``,
        ``overlap_efficiency``, ``congestion_factor``, ``straggler_factor``,
        ``moe_routing_imbalance_factor``, ``gradient_accumulation_steps``,
        ``seq_len``), with its defaults, and ``dp_size`` to size the cluster by
        the layout. Numeric and boolean knobs may be arrays; all broadcast
        together. See :func:`solver.physics.mlsysim.solve`.
    engine : {"auto", "numpy", "fused"}, optional
        The path that prices the call, with the same outputs bit for bit:
        ``"numpy"`` the broadcast numpy model (any shapes: open meshes, grids);
        ``"fused"`` the model's numba kernel (:mod:`solver.fused`), for flat
        inputs (every knob a scalar or a 1-D array of one length), or a
        ``ValueError`` saying why it cannot run; ``"auto"`` (default) fused
        where it can run and the call is large enough
        (:data:`solver.fused.FUSED_MIN_POINTS` configurations), else numpy.
        Passed to the model as its ``engine`` keyword.
    warn : bool, optional
        Warn about the call itself: :class:`UnrealizableWarning` (naming the rules broken)
        when no configuration of it is ``realizable`` (a single layout that breaks a rule
        still gets its numbers, and they should not be read without it), and under
        ``physics="megatron"`` :class:`solver.physics.megatron.ShapeWarning` when the
        workload's shape is not the model it declares. True by default; callers that mask
        by ``realizable`` and check the workloads themselves (a sweep's blocks, a search's
        trials) pass False.

    Returns
    -------
    dict of str -> numpy.ndarray
        The model's ``OUTPUTS`` in SI units, each of the broadcast shape of the
        knobs. Where ``valid`` is False every float output is NaN and every
        boolean False.

    Raises
    ------
    ValueError
        For an unknown physics model, a knob value no configuration can have
        (naming the knob and the value), or array knobs that do not broadcast.
    TypeError
        For a workload or fleet that is not a solver spec, or an unknown keyword.
    solver.catalog.CatalogError
        For a workload or fleet name the catalog does not hold (naming the closest).
    """
    chosen = model(physics)
    from .. import catalog  # (solver.catalog imports the physics' constants: not at the top)
    workload = catalog.workload(workload) if isinstance(workload, str) else workload
    fleet = catalog.fleet(fleet) if isinstance(fleet, str) else fleet
    # numpy.ma keeps its mask beside the data, and numpy's arithmetic on the data alone
    # would price the masked entries as if they were values: refused, not ignored.
    masked = next((name for name, value in knobs.items()
                   if np.ma.isMaskedArray(value) and np.ma.getmaskarray(value).any()), None)
    if masked is not None:
        raise ValueError(f"{masked} is a masked array with masked entries, which solve would "
                         f"price as values: pass {masked}.compressed() (drop them) or "
                         f"{masked}.filled(value)")
    try:
        extra = {} if chosen is not megatron else {"check_shape": bool(warn)}
        out = chosen.solve(workload, fleet, engine=engine, **extra, **knobs)
    except TypeError as error:
        # a keyword of the other model: say which model takes it
        name = next((n for n in knobs if f"unexpected keyword argument '{n}'" in str(error)), None)
        owners = [p for p, m in PHYSICS.items() if m is not chosen and name in KNOBS[p]]
        if name is None or not owners:
            raise
        raise TypeError(f"{name!r} is a knob of physics={owners[0]!r}, not of "
                        f"physics={physics!r} (pass physics={owners[0]!r}); {error}") from None
    realizable = np.asarray(out["realizable"])
    if warn and realizable.size and not realizable.any():
        warnings.warn(_unrealizable_message(physics, workload, fleet, knobs, out),
                      UnrealizableWarning, stacklevel=caller_stacklevel())
    return out


#: Configurations past which the warning does not count the rules (it would price the
#: call's split again on the numpy path: a million layouts took 0.31 s and 767 MB against
#: the fused call's 0.08 s and 476 MB).
RULES_COUNTED_UP_TO = 65_536


def _unrealizable_message(physics, workload, fleet, knobs, out) -> str:
    """What :class:`UnrealizableWarning` says: each rule the call breaks, with how many of
    its configurations break it (all of them where the call is one layout)."""
    size = np.asarray(out["realizable"]).size
    if physics == "megatron":
        if size > RULES_COUNTED_UP_TO:
            return (f"none of the {size:,} configurations of this solve call is realizable "
                    f"(physics={physics!r}); solver.physics.megatron.why_unrealizable(workload, "
                    f"fleet, **knobs) names the rules each breaks. The outputs price what would "
                    f"not run as stated (NaN where the split cannot be made). warn=False "
                    f"silences this.")
        taken = {n: v for n, v in knobs.items() if n in megatron.KNOBS}
        broken = megatron.why_unrealizable(workload, fleet, check_shape=False, **taken)
        rules = {name: megatron.steps.REALIZABLE_CONDITIONS.get(name, _SPLIT_RULE)
                 for name in broken}
        counts = {name: int(np.count_nonzero(where)) for name, where in broken.items()}
        see = "solver.physics.megatron.why_unrealizable says where"
    else:
        rules, counts = {}, {}
        for name, text, where in _mlsysim_rules(workload, knobs, out):
            if where.any():
                rules[name], counts[name] = text, int(np.count_nonzero(where))
        see = "solver.physics.common.realizable and even_splits say what they ask"
    if size == 1:
        head = f"the layout is not realizable (physics={physics!r}); it breaks "
        listed = "; ".join(f"rule {name!r}: {text}" for name, text in rules.items())
    else:
        head = (f"none of the {size:,} configurations of this solve call is realizable "
                f"(physics={physics!r}); they break ")
        listed = "; ".join(f"rule {name!r} ({counts[name]:,} of {size:,}): {text}"
                           for name, text in rules.items())
    return (f"{head}{listed}. The outputs price what would not run as stated (NaN where the "
            f"split cannot be made); {see}. warn=False silences this.")


def _mlsysim_rules(workload, knobs, out):
    """(name, what it asks, where it is broken) of the mlsysim model's ``realizable``:
    the split (``valid``), whole microbatches and the even splits of heads, layers and
    experts (:func:`solver.physics.common.realizable`, :func:`~.common.even_splits`)."""
    from . import common
    valid = np.asarray(out["valid"])
    k = {n: knobs.get(n, _knobs.KNOBS[n].default) for n in (
        "batch_size", "gradient_accumulation_steps", "microbatch_count", "tp_size", "pp_size",
        "v_stages", "ep_size")}
    dp = np.where(valid, np.nan_to_num(np.asarray(out["dp_size"], dtype=float), nan=1.0),
                  1.0).astype(np.int64)
    whole = np.broadcast_to(common.realizable(
        batch_size=k["batch_size"], dp_size=dp,
        gradient_accumulation_steps=k["gradient_accumulation_steps"],
        microbatch_count=k["microbatch_count"]), valid.shape)
    even = np.broadcast_to(common.even_splits(
        common.split_divisors(workload), tp_size=k["tp_size"], pp_size=k["pp_size"],
        v_stages=k["v_stages"], ep_size=k["ep_size"]), valid.shape)
    return (("valid", _SPLIT_RULE, ~valid),
            ("whole_microbatches", "dp_size * gradient_accumulation_steps * microbatch_count "
             "divides batch_size (mlsysim prices the layout anyway)", valid & ~whole),
            ("even_splits", "tp_size divides the heads, the layers split into pp_size * "
             "v_stages equal chunks where interleaved, ep_size divides the experts",
             valid & ~even))


#: What ``valid`` asks, in the words of :class:`UnrealizableWarning`.
_SPLIT_RULE = ("the split can be made (TP x PP (x CP) divides the fleet's accelerators and the "
               "expert grid tiles the ranks; else every output is NaN)")
