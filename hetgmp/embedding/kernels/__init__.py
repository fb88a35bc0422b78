"""GPU kernels of the embedding runtime, each next to the plain-torch reference it is tested against.

* :mod:`.rows`: row kernels (``scatter_add_rows``, ``take_rows``, ``put_rows``, the
  differentiable ``gather_rows``) with their torch references and the backend choice
  (:func:`resolve`); :mod:`.local_lookup`: the one-rank lookup ``mark_local`` /
  ``take_local``; the Triton code is in :mod:`.rows_triton`.
* :mod:`.launcher`: loading the Triton kernels and the cached launcher (:func:`launch`).

The padded exchange's fused segment kernels live with that engine, in
:mod:`hetgmp.embedding.padded` (``kernels.py``, ``kernels_triton.py``, ``presync_triton.py``,
``reference.py``).
"""

from hetgmp.embedding.kernels.launcher import launch, triton_available
from hetgmp.embedding.kernels.local_lookup import mark_local, take_local
from hetgmp.embedding.kernels.rows import (
    KERNELS,
    _trial_launch,
    gather_rows,
    put_rows,
    put_rows_reference,
    resolve,
    scatter_add_rows,
    scatter_add_rows_reference,
    take_rows,
    take_rows_reference,
)

__all__ = [
    "KERNELS",
    "_trial_launch",
    "gather_rows",
    "launch",
    "mark_local",
    "put_rows",
    "put_rows_reference",
    "resolve",
    "scatter_add_rows",
    "scatter_add_rows_reference",
    "take_local",
    "take_rows",
    "take_rows_reference",
    "triton_available",
]
