"""Multi-hot parquet columns (issue 34): a list column holds one sample's bag per row.

``--multi-hot COL`` names a column of type ``list<...>``, ``large_list<...>`` or
``fixed_size_list<...>`` whose values are integers (keys by the ``int`` scheme, as integer
categoricals) or strings / binary (FNV-1a, as string categoricals). A null list is an empty bag.
A null value inside a list, or an empty string there, is a bad row: a bag has no "missing"
member, and silently dropping the value or turning it into the missing key would both change
the data (the CSV reader's rule for ``a||b``, :mod:`hetgmp.data.delimited_lists`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hetgmp.data.vocab import int_keys, string_keys


def is_text(t: pa.DataType) -> bool:
    """Whether ``t`` is a string or binary type (keys by FNV-1a)."""
    return any(
        f(t)
        for f in (
            pa.types.is_string,
            pa.types.is_large_string,
            pa.types.is_binary,
            pa.types.is_large_binary,
        )
    )


def is_list(t: pa.DataType) -> bool:
    """Whether ``t`` is one of the list types a multi-hot column may have."""
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def check_list_column(path: object, column: str, t: pa.DataType) -> None:
    """Raise ``ValueError`` unless ``column`` (of type ``t`` in ``path``) can be a bag column."""
    if not is_list(t):
        raise ValueError(
            f"{path}: --multi-hot column {column!r} has type {t}; expected a list column "
            "(list<int64> or list<string>), one bag per row"
        )
    v = t.value_type
    if not (pa.types.is_integer(v) or is_text(v)):
        raise ValueError(
            f"{path}: --multi-hot column {column!r} holds {v} values; expected integers or strings"
        )


def list_scheme(t: pa.DataType) -> str:
    """The key scheme of a bag column's values (``int`` or ``fnv1a64``)."""
    return "int" if pa.types.is_integer(t.value_type) else "fnv1a64"


def list_keys(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One bag column of a batch: ``(keys uint64 [E], offsets int64 [n + 1], bad bool [n],
    first_bad int64 [n])``: ``bad`` marks the rows holding a null or empty value, ``first_bad``
    the position (in the row's list) of the first such value (-1 elsewhere). The bad rows' bags
    are kept here; the caller drops the rows."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    n = len(arr)
    flat = arr.flatten()  # (null lists contribute nothing; slicing is honoured)
    parent = np.asarray(pc.list_parent_indices(arr).to_numpy(zero_copy_only=False), np.int64)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(parent, minlength=n), out=offsets[1:])
    null = np.asarray(flat.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    if pa.types.is_integer(flat.type):
        keys = int_keys(np.asarray(flat.fill_null(0).to_numpy(zero_copy_only=False)))
        wrong = null
    else:
        keys = string_keys(flat)
        wrong = null | np.asarray(
            pc.equal(flat.cast(pa.binary()), b"").fill_null(True).to_numpy(zero_copy_only=False),
            dtype=bool,
        )
    bad = np.zeros(n, dtype=bool)
    bad[parent[wrong]] = True
    first_bad = np.full(n, -1, dtype=np.int64)
    where = np.flatnonzero(wrong)[::-1]  # (reversed: the first one per row is written last)
    first_bad[parent[where]] = where - offsets[parent[where]]
    return np.ascontiguousarray(keys, dtype=np.uint64), offsets, bad, first_bad
