"""The megatron physics' named steps for one layout, for tests that check a step's terms
against closed forms (solver.physics.megatron._solve runs the same chain)."""

import warnings
from types import SimpleNamespace

import numpy as np

from solver import catalog
from solver.physics import megatron as M
from solver.physics import megatron_compose as after
from solver.physics import megatron_steps as steps


def _workload(workload):
    """A catalog key's workload, or ``workload`` itself (a Workload a test built)."""
    return catalog.workload(workload) if isinstance(workload, str) else workload


def chain(workload, fleet, **knobs):
    """Steps 1-6 (split ... data parallel) of ``workload`` on ``fleet`` at ``knobs`` (solve's,
    scalars), with the shipped constants: a namespace of ``w, k, c, sp, hw, ly, cm, pl, dpr``."""
    wl, fl = _workload(workload), catalog.fleet(fleet)
    w = M._Shape(wl)
    k = M._account_stages(w, M._normalize(M._knob_values(knobs, "chain")))
    c = M._constants({})
    sp = steps.split(w, fl, k)
    hw = steps.hardware(fl, c, sp.prec, k["grad_reduce_in_bf16"])
    ly = steps.layer_times(w, k, c, sp, hw)
    cm = steps.communication(w, k, c, sp, hw, ly)
    pl = steps.pipeline(w, c, sp, hw, ly, cm)
    dpr = after.data_parallel(w, k, c, sp, hw, ly, cm, pl)
    return SimpleNamespace(w=w, k=k, c=c, sp=sp, hw=hw, ly=ly, cm=cm, pl=pl, dpr=dpr)


def solve(workload, fleet, engine="numpy", **knobs):
    """``megatron.solve`` of catalog keys (or a Workload), its warnings silenced (the tests' layouts break
    rules on purpose)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return M.solve(_workload(workload), catalog.fleet(fleet), engine=engine, **knobs)


def why(workload, fleet, **knobs):
    """The names of the rules ``megatron.why_unrealizable`` finds broken, sorted."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sorted(M.why_unrealizable(_workload(workload), catalog.fleet(fleet), **knobs))


def engines_agree(workload, fleet, **knobs):
    """The numpy path's outputs of a call, after holding the fused engine's to them bit for
    bit, output by output."""
    numpy_ = solve(workload, fleet, **knobs)
    fused = solve(workload, fleet, "fused", **knobs)
    for name in M.OUTPUTS:
        np.testing.assert_array_equal(np.asarray(fused[name]), np.asarray(numpy_[name]),
                                      err_msg=name)
    return numpy_
