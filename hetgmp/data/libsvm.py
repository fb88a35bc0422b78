"""Streaming reader for libsvm / libfm lines: ``label field:id:value field:id:value ...``.

Every ``field`` is one column of the dataset (0-based); a line holds at most one token per
field (a repeated field is a bad line), and a field absent from a line is a missing value.
By default every field is categorical with raw id ``id`` (``value`` is ignored, as in libfm
one-hot data); fields named in ``dense_fields`` are dense features whose value is ``value``
(``id`` ignored). The number of fields is ``num_fields`` or, when not given, one more than the
largest field index in the input (found by an extra vectorized scan).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hetgmp.data.arrow_values import FLOAT_RE, to_float
from hetgmp.data.bad_lines import (
    BAD_CATEGORY,
    BAD_LABEL,
    BAD_NUMBER,
    DUPLICATE_FIELD,
    EMPTY_LINE,
    BadInputError,
    BadLine,
    BadLineReport,
    bad_rows,
)
from hetgmp.data.delimited import DEFAULT_BLOCK_BYTES
from hetgmp.data.delimited_spec import RawBlock, transform_dense
from hetgmp.data.text_chunks import iter_chunks
from hetgmp.data.vocab import MISSING_KEY, int_keys

_UINT_RE = r"^[0-9]+$"


def _np(a: pa.Array) -> np.ndarray:
    return a.to_numpy(zero_copy_only=False)


class LibsvmSource:
    """Blocks of validated rows from libsvm/libfm files."""

    unit = "line"

    def __init__(
        self,
        paths: list[Path],
        *,
        num_fields: int | None = None,
        dense_fields: list[int] | None = None,
        dense_transform: str = "none",
        block_bytes: int = DEFAULT_BLOCK_BYTES,
    ) -> None:
        if not paths:
            raise ValueError("no input files given")
        for p in paths:
            if not Path(p).is_file():
                raise FileNotFoundError(f"{p}: input file not found")
        self.paths = [Path(p) for p in paths]
        self.block_bytes = block_bytes
        self.dense_fields = sorted(set(dense_fields or []))
        self.dense_transform = dense_transform
        transform_dense(np.zeros(1), dense_transform)
        if num_fields is None:
            num_fields = self._scan_num_fields()
        if num_fields < 1:
            raise ValueError(f"--num-fields must be >= 1, got {num_fields}")
        self.num_fields = int(num_fields)
        bad = [f for f in self.dense_fields if not 0 <= f < self.num_fields]
        if bad:
            raise ValueError(f"--dense-fields {bad} outside 0..{self.num_fields - 1}")
        self.cat_fields = [f for f in range(self.num_fields) if f not in self.dense_fields]
        if not self.cat_fields:
            raise ValueError("every field is dense; at least one categorical field is needed")

    def _scan_num_fields(self) -> int:
        top = -1
        report = BadLineReport("skip")  # real validation happens in the passes
        for path in self.paths:
            for first, chunk, _ in iter_chunks(path, self.block_bytes, None):
                parsed = self._tokens(str(path), first, chunk, report)
                if parsed is not None and parsed["field"].size:
                    top = max(top, int(parsed["field"][parsed["ok"]].max(initial=-1)))
        if top < 0:
            raise BadInputError(f"{self.paths[0]}: no field:id:value tokens found")
        return top + 1

    @property
    def field_names(self) -> list[str]:
        return [f"f{f}" for f in self.cat_fields]

    @property
    def dense_names(self) -> list[str]:
        return [f"f{f}" for f in self.dense_fields]

    @property
    def total_bytes(self) -> int:
        return sum(os.path.getsize(p) for p in self.paths)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "libsvm",
            "inputs": [{"path": str(p), "bytes": os.path.getsize(p)} for p in self.paths],
            "num_fields": self.num_fields,
            "dense_fields": self.dense_fields,
            "dense_transform": self.dense_transform,
        }

    def _tokens(self, path: str, first_line: int, buf: bytes, report: BadLineReport):
        """Split a chunk into per-token arrays; returns None for a chunk of no lines."""
        raw = buf.split(b"\n")
        if buf.endswith(b"\n"):
            raw.pop()
        if not raw:
            return None
        lines = first_line + np.arange(len(raw), dtype=np.int64)
        try:
            arr = pa.array(raw, type=pa.binary()).cast(pa.string())
        except pa.ArrowInvalid as err:
            raise BadInputError(f"{path}:lines {first_line}..: not UTF-8 text ({err})") from err
        toks = pc.utf8_split_whitespace(arr)
        ntok = _np(pc.list_value_length(toks)).astype(np.int64)
        flat = pc.list_flatten(toks)
        parent = _np(pc.list_parent_indices(toks)).astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(ntok)[:-1]])
        is_label = np.arange(len(flat)) == starts[parent]
        label_tok = flat.filter(pa.array(is_label))
        feat_tok = flat.filter(pa.array(~is_label))
        feat_row = parent[~is_label]
        parts = pc.split_pattern(feat_tok, ":")
        nparts = _np(pc.list_value_length(parts))
        three = nparts == 3
        # Pad malformed tokens so every token has three parts to index.
        fixed = pc.if_else(pa.array(three), feat_tok, "x:x:x")
        p3 = pc.list_flatten(pc.split_pattern(fixed, ":"))
        f_s, i_s, v_s = (p3.take(pa.array(np.arange(j, len(p3), 3))) for j in range(3))
        f_ok = _np(pc.match_substring_regex(f_s, _UINT_RE))
        i_ok = _np(pc.match_substring_regex(i_s, _UINT_RE))
        v_ok = _np(pc.match_substring_regex(v_s, FLOAT_RE)) & _np(pc.not_equal(v_s, ""))
        ok = three & f_ok & i_ok & v_ok
        field = to_float(f_s, f_ok).astype(np.int64)
        return {
            "lines": lines,
            "ntok": ntok,
            "label": label_tok,
            "feat": feat_tok,
            "row": feat_row,
            "ok": ok,
            "field": field,
            "id": to_float(i_s, i_ok),
            "id_str": i_s,
            "value": to_float(v_s, v_ok),
        }

    def iter_blocks(
        self, report: BadLineReport, progress: Callable[[int], None] | None = None
    ) -> Iterator[RawBlock]:
        for path in self.paths:
            if os.path.getsize(path) == 0:
                raise BadInputError(f"{path}:line 1: file is empty")
            for first, chunk, consumed in iter_chunks(path, self.block_bytes, None):
                block = self._block(str(path), first, chunk, report)
                if block is not None and len(block):
                    yield block
                if progress is not None:
                    progress(consumed)

    def _block(self, path: str, first: int, buf: bytes, report: BadLineReport) -> RawBlock | None:
        t = self._tokens(path, first, buf, report)
        if t is None:
            return None
        labels, flagged, good_tok = self._check(path, t, report)
        return self._rows(path, t, labels, ~flagged, good_tok)

    def _check(
        self, path: str, t: dict[str, Any], report: BadLineReport
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Report the chunk's bad lines; its labels, flagged lines and usable tokens."""
        lines, n = t["lines"], len(t["lines"])
        flagged = np.zeros(n, dtype=bool)
        bad: list[BadLine] = []

        def flag(mask: np.ndarray, reason: str, describe: Any) -> None:
            new = mask & ~flagged
            bad.extend(bad_rows(path, lines, new, reason, describe))
            flagged[:] |= new

        empty = t["ntok"] == 0
        flag(empty, EMPTY_LINE, lambda i: "empty line")
        # Labels: one per non-empty line, in line order.
        has = np.flatnonzero(~empty)
        lab_arr = t["label"]
        lab_ok_t = _np(pc.match_substring_regex(lab_arr, FLOAT_RE))
        lab_val_t = to_float(lab_arr, lab_ok_t)
        labels = np.zeros(n, dtype=np.float64)
        labels[has] = lab_val_t
        lab_ok = np.ones(n, dtype=bool)
        lab_ok[has] = lab_ok_t & ((lab_val_t == 0.0) | (lab_val_t == 1.0))
        lab_pos = np.full(n, -1)
        lab_pos[has] = np.arange(has.size)
        flag(~lab_ok, BAD_LABEL, lambda i: f"label {lab_arr[int(lab_pos[i])].as_py()!r} is not 0/1")

        row, ok, field = t["row"], t["ok"], t["field"]
        tok_idx = np.arange(row.size)
        bad_tok = np.full(n, -1)
        bad_tok[row[~ok][::-1]] = tok_idx[~ok][::-1]  # first bad token per line
        flag(
            bad_tok >= 0,
            BAD_NUMBER,
            lambda i: f"token {t['feat'][int(bad_tok[i])].as_py()!r} is not field:id:value",
        )
        out_of_range = ok & (field >= self.num_fields)
        oor = np.full(n, -1)
        oor[row[out_of_range]] = field[out_of_range]
        flag(
            oor >= 0,
            BAD_CATEGORY,
            lambda i: f"field {oor[i]} is outside 0..{self.num_fields - 1} (see --num-fields)",
        )
        good_tok = ok & ~out_of_range
        r, f = row[good_tok], field[good_tok]
        order = np.lexsort((f, r))
        dup = (r[order][1:] == r[order][:-1]) & (f[order][1:] == f[order][:-1])
        dup_field = np.full(n, -1)
        dup_field[r[order][1:][dup]] = f[order][1:][dup]
        flag(dup_field >= 0, DUPLICATE_FIELD, lambda i: f"field {dup_field[i]} appears twice")
        report.handle(bad)
        return labels, flagged, good_tok

    def _rows(
        self,
        path: str,
        t: dict[str, Any],
        labels: np.ndarray,
        keep: np.ndarray,
        good_tok: np.ndarray,
    ) -> RawBlock:
        """The kept lines' keys (missing where a field is absent), dense values and labels."""
        lines, n = t["lines"], len(t["lines"])
        row, field = t["row"], t["field"]
        use = good_tok & keep[row]
        r, f = row[use], field[use]
        ids, vals = t["id"][use], t["value"][use]
        col_of = np.full(self.num_fields, -1)
        col_of[self.cat_fields] = np.arange(len(self.cat_fields))
        keys = np.full((n, len(self.cat_fields)), MISSING_KEY, dtype=np.uint64)
        is_cat = col_of[f] >= 0
        keys[r[is_cat], col_of[f[is_cat]]] = int_keys(ids[is_cat].astype(np.int64))
        dense = None
        if self.dense_fields:
            dcol = np.full(self.num_fields, -1)
            dcol[self.dense_fields] = np.arange(len(self.dense_fields))
            raw = np.zeros((n, len(self.dense_fields)), dtype=np.float64)
            raw[r[~is_cat], dcol[f[~is_cat]]] = vals[~is_cat]
            dense = transform_dense(raw, self.dense_transform)[keep]
        return RawBlock(path, lines[keep], labels[keep].astype(np.float32), dense, keys[keep])
