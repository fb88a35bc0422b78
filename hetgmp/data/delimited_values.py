"""Column-by-column validation of a parsed delimited chunk (the general, non-fast path).

The label must be a number equal to 0 or 1, dense values numbers (integers for Criteo; empty
means missing) whose stored float32 is finite, hex categoricals hex. The first problem of each line is returned as a
:class:`~hetgmp.data.bad_lines.BadLine` and the line is dropped from the block.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hetgmp.data.arrow_values import FLOAT_RE as _FLOAT_RE
from hetgmp.data.arrow_values import INT_RE as _INT_RE
from hetgmp.data.arrow_values import to_float as _to_float
from hetgmp.data.bad_lines import BAD_CATEGORY, BAD_LABEL, BAD_NUMBER, BadLine, bad_rows
from hetgmp.data.delimited_lists import split_lists, take_lists
from hetgmp.data.delimited_spec import OVERFLOW, DelimitedSpec, RawBlock, checked_dense
from hetgmp.data.vocab import hex_keys, string_keys


def convert_columns(
    spec: DelimitedSpec, names: list[str], path: str, lines: np.ndarray, table: pa.Table
) -> tuple[RawBlock, list[BadLine]]:
    """Valid rows of ``table`` (string columns named ``names[column index]``) and bad lines."""
    n = table.num_rows
    flagged = np.zeros(n, dtype=bool)  # rows with a problem already reported
    bad: list[BadLine] = []

    def col(c: int) -> pa.Array:
        return table.column(names[c]).combine_chunks()

    def report_rows(mask: np.ndarray, reason: str, c: int, what: str, arr: pa.Array) -> None:
        new = mask & ~flagged
        if new.any():
            name = spec.column_names[c]
            say = lambda i: f"column {name}: {arr[i].as_py()!r} is {what}"  # noqa: E731
            bad.extend(bad_rows(path, lines, new, reason, say))
            flagged[:] |= new

    # Label: a number equal to 0 or 1 (NaN for label-less rows to score).
    if spec.label is None:
        labels = np.full(n, np.nan)
    else:
        lab = col(spec.label)
        lab_ok = pc.match_substring_regex(lab, _FLOAT_RE).to_numpy(zero_copy_only=False)
        lab_ok &= pc.not_equal(pc.utf8_trim_whitespace(lab), "").to_numpy(zero_copy_only=False)
        labels = _to_float(lab, lab_ok)
        lab_ok &= (labels == 0.0) | (labels == 1.0)
        report_rows(~lab_ok, BAD_LABEL, spec.label, "not a 0/1 label", lab)

    dense = None
    if spec.dense:
        dense = np.empty((n, len(spec.dense)), dtype=np.float32)
        regex = _INT_RE if spec.dense_kind == "int" else _FLOAT_RE
        what = "not an integer" if spec.dense_kind == "int" else "not a number"
        for j, c in enumerate(spec.dense):
            arr = col(c)
            ok = pc.match_substring_regex(arr, regex).to_numpy(zero_copy_only=False)
            report_rows(~ok, BAD_NUMBER, c, what, arr)
            dense[:, j], over = checked_dense(_to_float(arr, ok), spec.dense_transform)
            report_rows(over, BAD_NUMBER, c, OVERFLOW, arr)

    keys = np.empty((n, len(spec.categorical)), dtype=np.uint64)
    for j, c in enumerate(spec.categorical):
        arr = col(c)
        if spec.categorical_kind == "hex":
            keys[:, j], invalid = hex_keys(arr)
            report_rows(invalid, BAD_CATEGORY, c, "not a hex value of at most 15 digits", arr)
        else:
            keys[:, j] = string_keys(arr)

    lists = _lists(spec, col, report_rows)

    keep = ~flagged
    if not keep.all():
        lines, labels, keys = lines[keep], labels[keep], keys[keep]
        dense = dense[keep] if dense is not None else None
        lists = take_lists(lists, keep)
    return RawBlock(path, lines, labels.astype(np.float32), dense, keys, lists), bad


def _lists(
    spec: DelimitedSpec,
    col: Callable[[int], pa.Array],
    report_rows: Callable[[np.ndarray, str, int, str, pa.Array], None],
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every multi-hot column's lists (keys, offsets), reporting rows with a bad value."""
    lists = []
    for c, sep in zip(spec.multi_hot, spec.multi_hot_sep, strict=True):
        arr = col(c)
        values, offsets, empty_value, bad_hex = split_lists(arr, sep, spec.categorical_kind)
        what = f"a {sep!r}-separated list with an empty value"
        report_rows(empty_value, BAD_CATEGORY, c, what, arr)
        report_rows(bad_hex, BAD_CATEGORY, c, "a list with a value that is not hex", arr)
        lists.append((values, offsets))
    return lists
