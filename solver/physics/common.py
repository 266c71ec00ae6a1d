"""Steps every physics model shares: checking the specs, whether a layout can run, masking.

A model prices every point, possible or not (an impossible split is priced as
some possible stand-in, so no branch is needed), and masks the impossible ones
once, at the end, with :func:`mask_invalid`. Whether a training framework can
run a layout (:func:`realizable`) does not depend on the model.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from ..specs import Fleet, Workload

__all__ = ["check_specs", "mask_invalid", "realizable", "even_splits", "split_divisors",
           "caller_stacklevel"]

#: The project's packages (solver, sweep): a warning is attributed to the first frame
#: outside them, the user's call, however deep in them it was raised.
_PACKAGES = tuple(str(Path(__file__).resolve().parent.parent.parent / name) + os.sep
                  for name in ("solver", "sweep"))


def caller_stacklevel() -> int:
    """The ``stacklevel`` that attributes a warning its caller makes to the first frame
    outside the ``solver`` and ``sweep`` packages (the user's call, whether it came
    through ``solver.solve``, ``sweep.run`` or a model's own ``solve``); the outermost
    frame where every frame is theirs (the command line)."""
    frame, level = sys._getframe(2), 2
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGES):
        frame, level = frame.f_back, level + 1
    return level


def check_specs(workload, fleet) -> None:
    """Refuse a ``workload`` or ``fleet`` that is not a solver spec.

    Raises
    ------
    TypeError
        Naming the argument, the converters that make a spec and the type that came.
    """
    if not isinstance(workload, Workload):
        raise TypeError(f"workload must be a solver.specs.Workload (see solver.catalog.workload "
                        f"or solver.from_mlsysim), but got {type(workload).__name__}")
    if not isinstance(fleet, Fleet):
        raise TypeError(f"fleet must be a solver.specs.Fleet (see solver.catalog.fleet "
                        f"or solver.from_mlsysim), but got {type(fleet).__name__}")


def mask_invalid(outputs: Mapping, valid, shape: tuple, names: Iterable[str]) -> dict:
    """The outputs ``names``, broadcast to ``shape``, masked where ``valid`` is False.

    Parameters
    ----------
    outputs : mapping of str -> array_like
        The priced outputs (each on the axes its inputs span), without ``valid``.
    valid : array_like of bool
        False where the split is impossible.
    shape : tuple
        The broadcast shape of the knobs.
    names : iterable of str
        Output names in the order to return them; ``"valid"`` is ``valid`` itself.

    Returns
    -------
    dict of str -> numpy.ndarray
        Read-only views of ``shape``: where ``valid`` is False, every float
        output is NaN and every boolean False. When every point is valid the
        outputs are returned as priced (no pass over them).

    Notes
    -----
    A float output that already spans every axis of ``valid`` and owns its
    memory is masked in place (a fresh full-size array per output costs more
    in page faults than the add itself), so ``outputs`` must hold arrays the
    model computed, never its input arrays; two outputs may share one array
    (adding 0 or NaN twice changes nothing).
    """
    valid = np.asarray(valid)
    # x + 0.0 is x and x + NaN is NaN: one vectorized add per output, about five
    # times cheaper than np.where's masked select on a random mask.
    nan_if_invalid = None if np.all(valid) else np.where(valid, 0.0, np.nan)
    result = {}
    for name in names:
        if name == "valid":
            result[name] = np.broadcast_to(valid, shape)
            continue
        value = np.asarray(outputs[name])
        if nan_if_invalid is None:
            pass
        elif value.dtype == bool:
            value = value & valid
        elif _owned(value) and np.broadcast_shapes(value.shape, nan_if_invalid.shape) == value.shape:
            np.add(value, nan_if_invalid, out=value)  # no new block of memory to fault in
        else:
            value = value + nan_if_invalid
        result[name] = np.broadcast_to(value, shape)
    return result


def _owned(value: np.ndarray) -> bool:
    """Whether ``value`` is a writable array of its own (not a view, not read-only)."""
    return value.base is None and value.flags.writeable and value.ndim > 0




def realizable(*, batch_size, dp_size, gradient_accumulation_steps, microbatch_count):
    """Whether a training framework can run the layout as the knobs state it.

    The reference prices ``batch_size // dp_size`` samples per replica per step
    (at least 1), ``gradient_accumulation_steps`` micro-steps of
    ``batch_size / (dp_size * gradient_accumulation_steps)`` samples each
    (mlsysim's ``TrainingMemoryModel``), and a pipeline of ``microbatch_count``
    microbatches, without tying them together: it prices 256 microbatches of
    a replica holding 8 samples, or a batch smaller than DP (idle ranks). A
    layout is realizable when the per-replica batch of each accumulation step,
    ``batch_size / dp_size / gradient_accumulation_steps``, is a whole number
    of samples that splits into ``microbatch_count`` whole microbatches of at
    least one sample; that is, when
    ``dp_size * gradient_accumulation_steps * microbatch_count`` divides
    ``batch_size``. This implies no idle ranks (``batch_size >= dp_size``).
    The condition is the same whatever ``pp_size``: with one stage the
    microbatch count changes no output, and the same layout with a count that
    divides the batch is realizable and priced the same.

    Parameters
    ----------
    batch_size : array_like of int [1]
        Global batch per optimizer step, in samples.
    dp_size : array_like of int [1]
    gradient_accumulation_steps : array_like of int [1]
    microbatch_count : array_like of int [1]

    Returns
    -------
    numpy.ndarray of bool
        On the axes the four inputs span.

    Examples
    --------
    >>> bool(realizable(batch_size=1024, dp_size=128, gradient_accumulation_steps=1,
    ...                 microbatch_count=8))      # 8 samples per replica, 8 microbatches of 1
    True
    >>> bool(realizable(batch_size=1024, dp_size=128, gradient_accumulation_steps=1,
    ...                 microbatch_count=256))    # 256 microbatches of 1/32 of a sample
    False
    """
    # Successive exact divisions in int64: no product of knobs can overflow.
    batch = np.asarray(batch_size, dtype=np.int64)
    per_replica, rest = np.divmod(batch, np.asarray(dp_size, dtype=np.int64))
    whole_replica = rest == 0
    per_step, rest = np.divmod(per_replica, np.asarray(gradient_accumulation_steps, np.int64))
    whole_step = (rest == 0) & (per_step >= 1)
    whole_micro = per_step % np.asarray(microbatch_count, dtype=np.int64) == 0
    return whole_replica & whole_step & whole_micro


#: :func:`even_splits` in words (messages name them).
EVEN_SPLIT_RULES = ("heads divisible by tp_size, an interleaved schedule's layers by pp_size x "
                    "v_stages (and pp_size > 1), experts by ep_size (ep_size 1 on a dense model)")


def split_divisors(workload) -> tuple:
    """``(heads, layers, experts)`` the layout must split evenly, 0 where the workload
    states none (a non-transformer has no heads or layers to split; ``experts`` is 1 for
    a dense model, so EP must be 1): the facts :func:`even_splits` checks, as floats."""
    transformer = workload.is_transformer
    heads = float(workload.heads or 0) if transformer else 0.0
    layers = float(workload.layers or 0) if transformer else 0.0
    experts = float(workload.experts or 0) if workload.kind == "moe" else 1.0
    return heads, layers, experts


def even_splits(divisors, *, tp_size, pp_size, v_stages, ep_size):
    """Whether the model splits over the layout as a training framework needs.

    ``divisors``: the model's ``(heads, layers, experts)``, 0 for a fact it does not
    state (:func:`split_divisors` of a workload; the megatron model passes its shape's).

    The reference prices any split; a framework runs one only if TP divides the
    attention heads, an interleaved schedule (``v_stages > 1``) has more than one
    stage and cuts the layers into ``pp_size * v_stages`` equal chunks (without
    interleaving any ``pp_size`` up to the layer count: uneven first and last
    stages), and EP divides the experts (an EP degree above 1 on a dense model
    leaves its ranks nothing to hold). These are the megatron model's rules for the
    same knobs (Megatron-Core's ``TransformerConfig`` and schedules; see
    ``solver.physics.megatron``, which checks heads and experts here too) but one: an
    uneven split without interleaving, which pipeline engines that partition layers
    unevenly run, Megatron-LM only with the first or last stage's layers set
    (``megatron_steps.split``). Facts the workload does not state are not checked.

    Examples
    --------
    >>> from solver import catalog
    >>> w = catalog.workload("Llama3_70B")        # 80 layers, 64 heads, dense
    >>> d = split_divisors(w)
    >>> even_splits(d, tp_size=4, pp_size=16, v_stages=[1, 4, 5], ep_size=1).tolist()
    [True, False, True]
    >>> bool(even_splits(d, tp_size=8, pp_size=4, v_stages=1, ep_size=2))
    False
    """
    heads, layers, experts = divisors
    tp = np.asarray(tp_size, dtype=np.int64)
    pp = np.asarray(pp_size, dtype=np.int64)
    v = np.asarray(v_stages, dtype=np.int64)
    ep = np.asarray(ep_size, dtype=np.int64)
    ok = np.ones(np.broadcast_shapes(tp.shape, pp.shape, v.shape, ep.shape), dtype=bool)
    if heads:
        ok = ok & (int(heads) % tp == 0)
    if layers:
        L = int(layers)
        chunks = np.where((pp <= L) & (v <= L), pp * v, L + 1)  # no int64 overflow
        ok = ok & np.where(v == 1, pp <= L, (pp > 1) & (L % chunks == 0))
    if experts:
        ok = ok & (int(experts) % ep == 0)
    return ok
