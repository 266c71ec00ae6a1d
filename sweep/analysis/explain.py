"""Why #1 wins: where a layout's step time goes, and how the runner-up loses, term by term.

    >>> from sweep.analysis import explain_runner_up
    >>> explain_runner_up(spec, winner, runner_up)   # doctest: +SKIP
    'Why #1 wins: #2 (pp_size 4->8) has 3.1% lower MFU; its step is 3.2% longer (+41 ms): ...'
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

import solver
from solver.outputs import exposed_dp_time, n_accelerators

from .. import grid
from .. import physics as physics_

__all__ = ["step_components", "explain_runner_up", "where_step_goes", "MEGATRON_TERMS"]

#: Gaps in MFU and step time below this [%] are float noise: the two layouts tie.
TIE_PERCENT = 1e-9


def _plain(value):
    """A numpy scalar (or 0-d array) as a plain Python value."""
    return value.item() if hasattr(value, "item") else value


def _fmt(value) -> str:
    """A coordinate value as text: ``true``, ``0.5``, ``Llama3_70B``."""
    value = _plain(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _seconds(value: float) -> str:
    """A duration [s] with its sign: ``+12 ms``, ``-1.23 s``."""
    sign = "+" if value >= 0 else "-"
    value = abs(value)
    if value >= 1:
        return f"{sign}{value:.2f} s"
    if value >= 1e-3:
        return f"{sign}{value * 1e3:.3g} ms"
    return f"{sign}{value * 1e6:.3g} us"


#: The megatron model's step terms explain_runner_up compares: (name, output) [s].
MEGATRON_TERMS = (("compute", "compute_latency"),
                  ("exposed DP communication", "dp_communication_latency"),
                  ("TP communication", "tp_communication_latency"),
                  ("CP communication", "cp_communication_latency"),
                  ("PP communication", "pp_communication_latency"),
                  ("EP communication", "ep_communication_latency"),
                  ("pipeline bubble", "pipeline_bubble_latency"), ("optimizer", "optimizer_latency"),
                  ("activation offload", "offload_latency"))
#: Terms a cube written before they were priced lacks (their value there: 0.0).
_LATER_TERMS = frozenset({"offload_latency"})
#: The mlsysim model's outputs its terms are made of (the exposed DP time is the step's rest).
_MLSYSIM_NEEDS = ("step_latency_total", "node_latency", "tp_communication_latency",
                  "ep_communication_latency", "pipeline_bubble_latency")


def _model_of(out: Mapping, physics) -> str:
    """The physics model whose outputs ``out`` are: ``physics`` if given, else the one whose
    own step terms it holds (the finite ones, where a physics axis' cube row holds both)."""
    if physics is not None:
        solver.physics.model(physics)  # ValueError naming the models
        return physics
    own = {"mlsysim": "node_latency", "megatron": "compute_latency"}
    present = [m for m, name in own.items() if name in out]
    if len(present) == 2:
        present = [m for m in present if np.isfinite(np.asarray(out[own[m]], float)).all()]
        if len(present) != 1:
            raise ValueError("step_components: the outputs hold both physics models' terms (a "
                             "physics axis' row) and cannot say which priced this layout: pass "
                             "physics='mlsysim' or physics='megatron'")
    if not present:
        raise ValueError("step_components: expected one layout's solver.solve outputs (the "
                         "mlsysim physics' have node_latency, the megatron physics' "
                         "compute_latency), but got neither")
    return present[0]


def step_components(out: Mapping, straggler_factor: float = 1.0, physics=None) -> dict:
    """Where one layout's step time goes [s]: the terms that sum to ``step_latency_total``.

    Parameters
    ----------
    out : mapping
        ``solver.solve`` outputs for one layout (scalars), of either physics model.
    straggler_factor : float
        The layout's knob (the mlsysim model scales the whole step by it when > 1; the
        megatron model has none, and refuses any other value than 1).
    physics : str, optional
        The model that priced ``out``; by default the one whose own outputs it holds
        (``node_latency``: mlsysim; ``compute_latency``: megatron).

    Returns
    -------
    dict
        mlsysim: ``replica compute`` (the replica's roofline step), ``exposed DP
        communication`` (the share overlap does not hide:
        :func:`solver.outputs.exposed_dp_time`), ``TP communication``,
        ``EP communication`` and ``pipeline bubble``, each scaled by the
        straggler factor. megatron: its own exposed terms (:data:`MEGATRON_TERMS`:
        ``compute``, ``exposed DP communication``, ``TP``, ``CP``, ``PP`` and ``EP
        communication``, ``pipeline bubble``, ``optimizer``, ``activation offload``, 0.0
        where a cube written before it was priced lacks it), ``launch`` (host launch
        time the GPU work does not hide, ``launch_latency``) and ``step overhead`` (the
        fixed per-step time, the step's rest). Either way they sum to the step time.

    Raises
    ------
    ValueError
        Naming the outputs ``out`` lacks for its model, where it cannot tell the model,
        or for a straggler factor under the megatron model.
    """
    model = _model_of(out, physics)
    if model == "megatron":
        needs = (("step_latency_total",)
                 + tuple(k for _, k in MEGATRON_TERMS if k not in _LATER_TERMS)
                 + ("launch_latency",))
    else:
        needs = _MLSYSIM_NEEDS
    missing = [name for name in needs if name not in out]
    if missing:
        raise ValueError(f"step_components: expected the {model} physics' outputs "
                         f"{', '.join(needs)}, but {', '.join(missing)} "
                         f"{'is' if len(missing) == 1 else 'are'} missing")
    if model == "megatron":
        if float(straggler_factor) != 1.0:
            raise ValueError(f"step_components: the megatron physics has no straggler factor, "
                             f"so expected straggler_factor=1, but got {straggler_factor!r}")
        terms = {name: float(out[key]) if key in out else 0.0 for name, key in MEGATRON_TERMS}
        terms["launch"] = float(out["launch_latency"])
        terms["step overhead"] = float(out["step_latency_total"]) - sum(terms.values())
        return terms
    scale = max(float(straggler_factor), 1.0)
    terms = {"replica compute": out["node_latency"],
             "exposed DP communication": exposed_dp_time(out, straggler_factor),
             "TP communication": out["tp_communication_latency"],
             "EP communication": out["ep_communication_latency"],
             "pipeline bubble": out["pipeline_bubble_latency"]}
    return {name: float(value) * scale for name, value in terms.items()}


def _price(spec, coords: Mapping) -> dict:
    """One layout priced again (float64): its numeric outputs, components and accelerators."""
    workload, fleet, knobs = grid.point(spec, coords)
    # with the spec's calibration profile, as the cube was priced (sweep.evaluate)
    constants = physics_.calibrated(spec).get(knobs.get("physics", physics_.DEFAULT_PHYSICS), {})
    out = solver.solve(workload, fleet, warn=False, **knobs, **constants)  # (the cube's own)
    values = {name: float(np.asarray(v)) for name, v in out.items() if np.asarray(v).dtype != bool}
    if knobs.get("physics") == "megatron":  # its own terms (they exclude the step overhead)
        values["components"] = {name: float(out[key]) for name, key in MEGATRON_TERMS}
    else:
        values["components"] = step_components(out, knobs.get("straggler_factor", 1.0))
    values["n_accelerators"] = round(float(n_accelerators(out, knobs)))
    return values


def explain_runner_up(spec, winner: Mapping, runner_up: Mapping) -> str:
    """One line: why ``runner_up`` has a lower MFU than ``winner``, term by term.

    Both layouts (dim -> value, as in the cube) are priced again with
    ``solver.solve`` (float64) and their step-time components compared
    (see :func:`step_components`).

    Parameters
    ----------
    spec : Spec
        The sweep the layouts come from (for the fixed knobs).
    winner, runner_up : mapping
        Coordinates of the two layouts (every dim of ``spec``).

    Returns
    -------
    str
    """
    first = _price(spec, {d: winner[d] for d in spec.dims})
    second = _price(spec, {d: runner_up[d] for d in spec.dims})
    changed = [f"{d} {_fmt(winner[d])}->{_fmt(runner_up[d])}" for d in spec.dims
               if _fmt(winner[d]) != _fmt(runner_up[d])]
    loss = (first["mfu"] - second["mfu"]) / first["mfu"] * 100
    step = second["step_latency_total"] - first["step_latency_total"]
    diffs = {k: second["components"].get(k, 0.0) - first["components"].get(k, 0.0)
             for k in {**first["components"], **second["components"]}}
    biggest = max((abs(v) for v in diffs.values()), default=0.0)
    shown = sorted((kv for kv in diffs.items()
                    if abs(kv[1]) > max(1e-7, 0.02 * biggest)), key=lambda kv: -abs(kv[1]))[:4]
    terms = ", ".join(f"{_seconds(v)} {k}" for k, v in shown) or "no step-time term differs"
    relative = step / first["step_latency_total"] * 100
    what = "longer" if step >= 0 else "shorter"
    count = (f" on {second['n_accelerators']} accelerators instead of {first['n_accelerators']}"
             if second["n_accelerators"] != first["n_accelerators"] else "")
    if abs(loss) < TIE_PERCENT and abs(relative) < TIE_PERCENT:
        # A tie is not a win (two splits that give each rank the same tokens, say).
        return (f"#1 and #2 ({', '.join(changed) or 'same layout'}) tie: the same MFU and step "
                f"time{count}; neither wins, they are listed in the cube's order.")
    return (f"Why #1 wins: #2 ({', '.join(changed) or 'same layout'}) has {_percent(loss)} lower "
            f"MFU{count}; its step is {_percent(abs(relative))} {what} ({_seconds(step)}): {terms}.")


def where_step_goes(spec, layout: Mapping) -> str:
    """One line: the shares of ``layout``'s step time, largest first (priced again, float64).

    The terms are :func:`explain_runner_up`'s; under the megatron physics what they leave
    of the step is ``other`` (its fixed per-step overhead and the time the host's kernel
    launches add where a layer's GPU work is shorter). Shares under 0.1 % are left out.
    """
    priced = _price(spec, {d: layout[d] for d in spec.dims})
    step = priced["step_latency_total"]
    terms = dict(priced["components"])
    rest = step - sum(terms.values())
    if rest > 1e-12 * step:
        terms["other"] = rest
    shown = sorted(((k, v / step * 100) for k, v in terms.items() if v / step * 100 >= 0.1),
                   key=lambda kv: -kv[1])
    return ("Where #1's step goes: " + ", ".join(f"{k} {v:.1f}%" for k, v in shown)
            + " (`top CUBE --breakdown` lists each layout's terms and memory).")


def _percent(value) -> str:
    """A share in %: one decimal, or two significant digits below 0.1 % (not a '0.0%' gap)."""
    return f"{value:.1f}%" if abs(value) >= 0.1 or value == 0 else f"{value:.2g}%"
