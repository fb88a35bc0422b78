"""Streaming reader for parquet files (record batches of row groups, never the whole file).

Columns are chosen by name. The label must be boolean or numeric 0/1; dense columns numeric
(or numeric strings; null = missing = 0); categorical columns integer (keys via
:func:`~hetgmp.data.vocab.int_keys`) or string/binary (FNV-1a), null = missing; ``multi_hot`` columns are list columns, one bag per row
(:mod:`hetgmp.data.parquet_lists`). Problems are reported by 1-based row number within the file,
with the column.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hetgmp.data.bad_lines import (
    BAD_CATEGORY,
    BAD_LABEL,
    BAD_NUMBER,
    BadInputError,
    BadLineReport,
    bad_rows,
)
from hetgmp.data.delimited import _FLOAT_RE, RawBlock, _to_float, transform_dense
from hetgmp.data.delimited_lists import take_lists
from hetgmp.data.delimited_spec import OVERFLOW, checked_dense
from hetgmp.data.parquet_lists import check_list_column, is_text, list_keys, list_scheme
from hetgmp.data.vocab import MISSING_KEY, int_keys, string_keys

DEFAULT_BATCH_ROWS = 1 << 18


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


class ParquetSource:
    """Blocks of validated rows from parquet files with named columns."""

    unit = "row"

    def __init__(
        self,
        paths: list[Path],
        *,
        label: str,
        dense: list[str],
        categorical: list[str],
        dense_transform: str = "none",
        batch_rows: int = DEFAULT_BATCH_ROWS,
        multi_hot: list[str] | None = None,
    ) -> None:
        if not paths:
            raise ValueError("no input files given")
        if not categorical:
            raise ValueError("at least one --categorical column is needed")
        self.paths = [Path(p) for p in paths]
        self.label, self.dense, self.categorical = label, list(dense), list(categorical)
        self.multi_hot = list(multi_hot or [])
        self._schemes: list[str] = []
        self.dense_transform = dense_transform
        transform_dense(np.zeros(1), dense_transform)
        self.batch_rows = batch_rows
        for p in self.paths:
            if not p.is_file():
                raise FileNotFoundError(f"{p}: input file not found")
            try:
                schema = pq.read_schema(p)
            except (pa.ArrowInvalid, OSError) as err:
                raise BadInputError(f"{p}: not a readable parquet file ({err})") from err
            self._check_schema(p, schema)

    def _check_schema(self, p: Path, schema: pa.Schema) -> None:
        """Every named column exists in ``p`` with a type its role accepts."""
        for option, cols in (
            ("--label", [self.label]),
            ("--dense", self.dense),
            ("--categorical", self.categorical),
            ("--multi-hot", self.multi_hot),
        ):
            for c in cols:
                if c not in schema.names:
                    raise ValueError(
                        f"{option} {c!r}: no such column in {p} "
                        f"(columns: {', '.join(schema.names[:50])})"
                    )
        for c in self.categorical:
            t = schema.field(c).type
            if not (pa.types.is_integer(t) or is_text(t)):
                raise ValueError(
                    f"{p}: categorical column {c!r} has type {t}; "
                    "expected an integer or string column"
                )
        for c in [self.label, *self.dense]:
            t = schema.field(c).type
            if not (_is_number(t) or is_text(t)):
                raise ValueError(f"{p}: column {c!r} has type {t}; expected numbers")
        for c in self.multi_hot:
            check_list_column(p, c, schema.field(c).type)
        schemes = [
            "int" if pa.types.is_integer(schema.field(c).type) else "fnv1a64"
            for c in self.categorical
        ] + [list_scheme(schema.field(c).type) for c in self.multi_hot]
        if self._schemes and schemes != self._schemes:
            raise ValueError(
                f"{p}: its categorical / multi-hot columns' types differ from "
                f"{self.paths[0]}'s (integer here, strings there, or the reverse)"
            )
        self._schemes = schemes

    @property
    def field_names(self) -> list[str]:
        return list(self.categorical)

    @property
    def multi_hot_names(self) -> list[str]:
        return list(self.multi_hot)

    @property
    def key_schemes(self) -> list[str]:
        """Every vocabulary field's key scheme (single-hot columns, then the bag columns)."""
        return list(self._schemes)

    @property
    def dense_names(self) -> list[str]:
        return list(self.dense)

    @property
    def total_bytes(self) -> int:
        return sum(os.path.getsize(p) for p in self.paths)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "parquet",
            "inputs": [{"path": str(p), "bytes": os.path.getsize(p)} for p in self.paths],
            "label_column": self.label,
            "dense_columns": self.dense,
            "categorical_columns": self.categorical,
            **({"multi_hot_columns": self.multi_hot} if self.multi_hot else {}),
            "dense_transform": self.dense_transform,
        }

    def iter_blocks(
        self, report: BadLineReport, progress: Callable[[int], None] | None = None
    ) -> Iterator[RawBlock]:
        for path in self.paths:
            f = pq.ParquetFile(path)
            if f.metadata.num_rows == 0:
                raise BadInputError(f"{path}:row 1: file has no rows")
            size = os.path.getsize(path)
            groups = max(f.num_row_groups, 1)
            row0 = 1
            cols = [self.label, *self.dense, *self.categorical, *self.multi_hot]
            for g in range(f.num_row_groups):
                for batch in f.iter_batches(
                    batch_size=self.batch_rows, row_groups=[g], columns=cols
                ):
                    block = self._block(str(path), row0, batch, report)
                    row0 += batch.num_rows
                    if len(block):
                        yield block
                if progress is not None:
                    progress(size // groups)

    def _numbers(self, arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(values float64 with null -> 0, ok, is_null) of a numeric or numeric-string column."""
        null = arr.is_null().to_numpy(zero_copy_only=False)
        if is_text(arr.type):
            s = arr.cast(pa.string()).fill_null("")
            ok = pc.match_substring_regex(s, _FLOAT_RE).to_numpy(zero_copy_only=False)
            return _to_float(s, ok), ok, null
        vals = arr.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False)
        return vals, ~np.isnan(vals), null

    def _block(
        self, path: str, row0: int, batch: pa.RecordBatch, report: BadLineReport
    ) -> RawBlock:
        n = batch.num_rows
        rows = row0 + np.arange(n, dtype=np.int64)
        flagged = np.zeros(n, dtype=bool)
        bad = []
        lab_arr = batch.column(self.label)
        labels, ok, null = self._numbers(lab_arr)
        lab_ok = ok & ~null & ((labels == 0.0) | (labels == 1.0))
        bad += bad_rows(
            path,
            rows,
            ~lab_ok,
            BAD_LABEL,
            lambda i: f"column {self.label}: {lab_arr[i].as_py()!r} is not a 0/1 label",
        )
        flagged |= ~lab_ok
        dense = None
        if self.dense:
            dense = np.empty((n, len(self.dense)), dtype=np.float32)
            for j, c in enumerate(self.dense):
                arr = batch.column(c)
                vals, ok, _ = self._numbers(arr)
                new = ~ok & ~flagged
                bad += bad_rows(
                    path,
                    rows,
                    new,
                    BAD_NUMBER,
                    lambda i, c=c, arr=arr: f"column {c}: {arr[i].as_py()!r} is not a number",
                )
                flagged |= new
                dense[:, j], over = checked_dense(np.where(ok, vals, 0.0), self.dense_transform)
                new = over & ~flagged
                bad += bad_rows(
                    path, rows, new, BAD_NUMBER,
                    lambda i, c=c, arr=arr: f"column {c}: {arr[i].as_py()!r} is {OVERFLOW}",
                )  # fmt: skip
                flagged |= new
        keys = np.empty((n, len(self.categorical)), dtype=np.uint64)
        for j, c in enumerate(self.categorical):
            arr = batch.column(c)
            if pa.types.is_integer(arr.type):
                null = arr.is_null().to_numpy(zero_copy_only=False)
                k = int_keys(arr.fill_null(0).to_numpy(zero_copy_only=False))
                keys[:, j] = np.where(null, MISSING_KEY, k)
            else:
                keys[:, j] = string_keys(arr)
        lists = self._lists(path, rows, batch, flagged, bad)
        report.handle(bad)
        keep = ~flagged
        return RawBlock(
            path,
            rows[keep],
            labels[keep].astype(np.float32),
            dense[keep] if dense is not None else None,
            keys[keep],
            take_lists(lists, keep),
        )

    def _lists(
        self, path: str, rows: np.ndarray, batch: pa.RecordBatch, flagged: np.ndarray, bad: list
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Every bag column's (keys, offsets); rows with a null or empty value in a bag are
        reported (column, position in the bag) and flagged."""
        lists = []
        for c in self.multi_hot:
            arr = batch.column(c)
            keys, offsets, wrong, first = list_keys(arr)
            new = wrong & ~flagged
            bad += bad_rows(
                path, rows, new, BAD_CATEGORY,
                lambda i, c=c, arr=arr, first=first: (
                    f"column {c}: value {int(first[i])} of the list {arr[i].as_py()!r} is "
                    "null or empty (a bag has no missing member)"
                ),
            )  # fmt: skip
            flagged |= new
            lists.append((keys, offsets))
        return lists
