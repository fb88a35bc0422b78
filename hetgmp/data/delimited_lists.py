"""Multi-hot columns of delimited text (issue 34): a cell holds a list of values split by the
column's separator (``--multi-hot COL[:SEP]``, default ``|``).

An empty cell is an empty list. An empty value inside a non-empty cell (``a||b``, a trailing
``a|``) is a bad line: it is far more often a formatting slip than a meant value, and silently
dropping it or turning it into the missing key would both change the data. Values are keyed like
the file's single-hot categoricals (FNV-1a of the bytes, or exact hex).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hetgmp.data.vocab import hex_keys, string_keys

DEFAULT_SEPARATOR = "|"


def parse_multi_hot_arg(text: str) -> tuple[str, str]:
    """``COL[:SEP]`` -> ``(COL, SEP)``; the separator defaults to ``|`` (a column name holding
    ``:`` takes an explicit separator: ``a:b:|``)."""
    col, colon, sep = text.rpartition(":")
    if not colon:
        return text, DEFAULT_SEPARATOR
    if not col:
        raise ValueError(f"--multi-hot {text!r}: expected COL[:SEP], e.g. tags or tags:;")
    return col, sep


def split_lists(arr: pa.Array, sep: str, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                              np.ndarray]:  # fmt: skip
    """One column's lists: ``(keys uint64 [E], offsets int64 [n + 1], empty_value bool [n],
    bad_hex bool [n])`` -- the last two mark rows to report (their lists are kept here; the
    caller drops the rows)."""
    n = len(arr)
    parts = pc.split_pattern(arr, pattern=sep)
    if isinstance(parts, pa.ChunkedArray):
        parts = parts.combine_chunks()
    flat = parts.flatten()
    bounds = np.asarray(parts.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    per_row = np.diff(bounds)
    owner = np.repeat(np.arange(n, dtype=np.int64), per_row)
    empty_elem = np.asarray(pc.equal(flat, "").to_numpy(zero_copy_only=False), dtype=bool)
    empty_cell = np.asarray(pc.equal(arr, "").to_numpy(zero_copy_only=False), dtype=bool)
    keep = ~empty_cell[owner]  # (an empty cell splits into one empty value: the empty list)
    empty_value = np.zeros(n, dtype=bool)
    empty_value[owner[empty_elem & keep]] = True
    bad_hex = np.zeros(n, dtype=bool)
    if kind == "hex":
        keys, invalid = hex_keys(flat)
        bad_hex[owner[invalid & keep]] = True
    else:
        keys = string_keys(flat)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner[keep], minlength=n), out=offsets[1:])
    return np.ascontiguousarray(keys[keep], dtype=np.uint64), offsets, empty_value, bad_hex


def take_lists(
    lists: list[tuple[np.ndarray, np.ndarray]], mask: np.ndarray
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The lists of the rows where ``mask`` is true, offsets restarted at 0."""
    out = []
    for values, offsets in lists:
        lengths = np.diff(offsets)
        new = np.zeros(int(mask.sum()) + 1, dtype=np.int64)
        np.cumsum(lengths[mask], out=new[1:])
        out.append((values[np.repeat(mask, lengths)], new))
    return out
