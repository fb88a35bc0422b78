"""Arrow string columns to numbers: the number patterns and the validated conversions."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

INT_RE = r"^(-?[0-9]+)?$"
FLOAT_RE = r"^\s*([+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?)?\s*$"


def chunked_numpy(arr: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A null-free numeric arrow column as numpy (one copy at most)."""
    if isinstance(arr, pa.ChunkedArray):
        if arr.num_chunks == 1:
            return arr.chunk(0).to_numpy()
        return (
            np.concatenate([c.to_numpy() for c in arr.chunks])
            if arr.num_chunks
            else (np.zeros(0, arr.type.to_pandas_dtype()))
        )
    return arr.to_numpy()


def to_float(arr: pa.Array, ok: np.ndarray) -> np.ndarray:
    """Cast validated number strings to float64; empty or invalid entries become 0."""
    trimmed = pc.utf8_trim_whitespace(arr)
    usable = pa.array(ok) if isinstance(ok, np.ndarray) else ok
    usable = pc.and_(usable, pc.not_equal(trimmed, ""))
    filled = pc.if_else(usable, trimmed, "0")
    return pc.cast(filled, pa.float64()).to_numpy(zero_copy_only=False)
