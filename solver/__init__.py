"""Distributed-training step physics in broadcasting numpy: mlsysim 0.3.0's DistributedModel, exactly.

``solve(workload, fleet, *, physics="mlsysim", **knobs)`` dispatches to a
physics model of :mod:`solver.physics`; ``OUTPUTS`` is the output registry of
:mod:`solver.outputs`.

    >>> import solver
    >>> wl, fl = solver.catalog.workload("Llama3_70B"), solver.catalog.fleet("Training_1K")
    >>> out = solver.solve(wl, fl, batch_size=1024, tp_size=[1, 2, 4, 8], pp_size=8)
    >>> out["mfu"].shape
    (4,)
"""

from . import catalog
from .adapters import from_mlsysim
from . import physics
from .outputs import OUTPUTS
from .physics import PHYSICS, solve
from . import knobs
from .knobs import KNOBS, PRECISION_BYTES
from .specs import Accelerator, Fabric, Fleet, Node, Workload

__version__ = "0.1.0"
REFERENCE = "mlsysim 0.3.0 DistributedModel.solve"

__all__ = [
    "solve",
    "PHYSICS",
    "OUTPUTS",
    "KNOBS",
    "PRECISION_BYTES",
    "catalog",
    "from_mlsysim",
    "Accelerator",
    "Node",
    "Fabric",
    "Fleet",
    "Workload",
    "REFERENCE",
    "__version__",
]
