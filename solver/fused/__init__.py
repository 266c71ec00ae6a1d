"""Fused numba kernels for flat (1-D) inputs; the numpy paths stay the reference and the fallback.

The kernels import numba, so import them lazily and check :data:`NUMBA` first.
"""

import importlib.util

#: numba is importable (the fused kernels can run).
NUMBA = importlib.util.find_spec("numba") is not None
