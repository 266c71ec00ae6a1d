"""How many points are priced (or read) at a time: one name, one default, everywhere.

``block_points`` is the keyword, ``--block-points`` the flag; the solver's chunks
of a large call, a sweep's grid blocks and the analysis slabs of a cube all use
:data:`BLOCK_POINTS` unless told otherwise. It bounds the temporaries of one
block (about 4 KB a point inside ``solve``) while keeping numpy's per-call
overhead small.
"""

__all__ = ["BLOCK_POINTS"]

#: Points per block by default (2**18: about 1 GB of temporaries at most in ``solve``).
BLOCK_POINTS = 1 << 18
