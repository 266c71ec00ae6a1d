"""CF encodings of a cube's variables in its netCDF file (both writers).

A cube keeps bools as bools; every boolean data variable (the masks, the
boolean outputs) carries CF's flag attributes
(:func:`sweep.cube.flag_attrs`: ``flag_values = [0, 1]``, ``flag_meanings =
"false true"``, CF-1.8 section 3.5) in memory and in the file, where it is an
``int8`` variable with xarray's ``dtype = "bool"`` so that
:func:`xarray.open_dataset` gives bools back. A boolean coordinate (an axis
such as ``overlap_comm``) is a coordinate variable with ``units = "1"``, not
a flag variable (CF gives flags to data variables). ``flag_values`` is written as
``int8``, the stored variable's type. Coordinates carry no ``_FillValue``
(CF-1.8 section 5: a coordinate variable has no missing values); float data
variables keep ``_FillValue = NaN`` (NaN marks an impossible split). Both
writers, :func:`sweep.storage.save` (xarray) and the streaming assembly
(netCDF4, :mod:`sweep.storage.assemble`), encode alike.
"""

from __future__ import annotations

import xarray as xr

from ..cube import flag_attrs

__all__ = ["encode", "flag_attrs"]


def encode(cube: xr.Dataset, encoding: dict) -> tuple:
    """``(cube, encoding)`` for :meth:`xarray.Dataset.to_netcdf`, CF-encoded.

    Boolean variables get the flag attributes (on a shallow copy: ``cube`` is
    left as it is); every coordinate gets ``_FillValue = None`` (none written).
    """
    out = cube.copy(deep=False)
    for var in out.data_vars.values():
        if var.dtype == bool:
            var.attrs.update(flag_attrs())
    encoding = {name: dict(value) for name, value in encoding.items()}
    for name in out.coords:
        encoding.setdefault(name, {})["_FillValue"] = None
    return out, encoding
