"""Streaming reader for libsvm / libfm lines.

Two forms (one per input, detected from its first feature token; see
:mod:`hetgmp.data.libsvm_fields`):

* libfm ``label field:id:value ...``: ``field`` is the column (0-based);
* plain libsvm ``label index:value ...``: the i-th token is field i (default), or
  ``field_map`` maps each feature index to its field; ``index`` is the id.

A line holds at most one token per field (a repeated field is a bad line), except the
``multi_hot_fields``, whose tokens on a line form a bag (:mod:`hetgmp.data.libsvm_lists`); a
field absent from a line is a missing value (an empty bag). By default every field is categorical with raw id ``id`` /
``index`` (``value`` is ignored, as in one-hot data); fields named in ``dense_fields`` are dense
features whose value is ``value``. The number of fields is ``num_fields`` or, when not given,
one more than the largest field in the input (an extra vectorized scan; the field map's largest
field with a map). Labels are 0/1, or libsvm's -1/+1 read as 0/1 (logged once).
"""

from __future__ import annotations

import logging
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
    BAD_NUMBER,
    DUPLICATE_FIELD,
    EMPTY_LINE,
    WRONG_FIELD_COUNT,
    BadInputError,
    BadLine,
    BadLineReport,
    bad_rows,
)
from hetgmp.data.delimited import DEFAULT_BLOCK_BYTES
from hetgmp.data.delimited_spec import OVERFLOW, RawBlock, checked_dense, transform_dense
from hetgmp.data.libsvm_fields import (
    LABEL_MAPPING,
    LIBFM,
    FieldMap,
    LineForm,
    check_labels,
    detect_form,
    load_field_map,
)
from hetgmp.data.libsvm_lists import bags, check_multi_hot_fields, repeated_field
from hetgmp.data.text_chunks import iter_chunks
from hetgmp.data.vocab import MISSING_KEY, int_keys

_UINT_RE = r"^[0-9]+$"
log = logging.getLogger(__name__)


def _np(a: pa.Array) -> np.ndarray:
    return a.to_numpy(zero_copy_only=False)


class LibsvmSource:
    """Blocks of validated rows from libsvm/libfm files.

    ``form``: the inputs' line form (detected from the first feature token when None; the test
    file's source is given the training source's, so both must agree). ``field_map``: a
    ``--field-map`` file (or a loaded :class:`FieldMap`), plain libsvm lines only.
    """

    unit = "line"

    def __init__(
        self,
        paths: list[Path],
        *,
        num_fields: int | None = None,
        dense_fields: list[int] | None = None,
        dense_transform: str = "none",
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        field_map: Path | FieldMap | None = None,
        form: LineForm | None = None,
        multi_hot_fields: list[int] | None = None,
    ) -> None:
        if not paths:
            raise ValueError("no input files given")
        for p in paths:
            if not Path(p).is_file():
                raise FileNotFoundError(f"{p}: input file not found")
        self.paths = [Path(p) for p in paths]
        self.block_bytes = block_bytes
        self.dense_fields = sorted(set(dense_fields or []))
        self.multi_hot_fields = sorted(set(multi_hot_fields or []))
        self.dense_transform = dense_transform
        transform_dense(np.zeros(1), dense_transform)
        self.form = form if form is not None else detect_form(self.paths)
        if field_map is not None and self.form.kind == LIBFM:
            raise ValueError(
                f"--field-map is for plain libsvm lines (index:value), but {self.form.path} is "
                f"libfm (field:id:value, line {self.form.line}): its fields are in the tokens"
            )
        self.field_map = (
            load_field_map(Path(field_map)) if isinstance(field_map, (str, Path)) else field_map
        )
        self._signed_labels_logged = False
        self.num_fields = self._resolve_num_fields(num_fields)
        bad = [f for f in self.dense_fields if not 0 <= f < self.num_fields]
        if bad:
            raise ValueError(f"--dense-fields {bad} outside 0..{self.num_fields - 1}")
        check_multi_hot_fields(
            self.multi_hot_fields, self.dense_fields, self.num_fields, self.by_position
        )
        other = {*self.dense_fields, *self.multi_hot_fields}
        self.cat_fields = [f for f in range(self.num_fields) if f not in other]
        if not self.cat_fields:
            raise ValueError("every field is dense; at least one categorical field is needed")

    @property
    def by_position(self) -> bool:
        """Plain libsvm lines without a field map: the token's position is its field."""
        return self.form.kind != LIBFM and self.field_map is None

    def _resolve_num_fields(self, num_fields: int | None) -> int:
        if num_fields is None:
            num_fields = (
                self.field_map.num_fields if self.field_map is not None else self._scan_num_fields()
            )
        if num_fields < 1:
            raise ValueError(f"--num-fields must be >= 1, got {num_fields}")
        if self.field_map is not None and num_fields < self.field_map.num_fields:
            raise ValueError(
                f"--num-fields {num_fields}: --field-map {self.field_map.path} names field "
                f"{self.field_map.num_fields - 1}"
            )
        return int(num_fields)

    def _scan_num_fields(self) -> int:
        top = -1
        report = BadLineReport("skip")  # real validation happens in the passes
        for path in self.paths:
            for first, chunk, _ in iter_chunks(path, self.block_bytes, None):
                parsed = self._tokens(str(path), first, chunk, report)
                if parsed is not None and parsed["field"].size:
                    top = max(top, int(parsed["field"][parsed["ok"]].max(initial=-1)))
        if top < 0:
            raise BadInputError(f"{self.paths[0]}: no valid {self.form.kind} tokens found")
        return top + 1

    @property
    def field_names(self) -> list[str]:
        return [f"f{f}" for f in self.cat_fields]

    @property
    def multi_hot_names(self) -> list[str]:
        return [f"f{f}" for f in self.multi_hot_fields]

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
            **({"multi_hot_fields": self.multi_hot_fields} if self.multi_hot_fields else {}),
            "dense_transform": self.dense_transform,
            "form": self.form.kind,
            "fields": (
                "in the tokens"
                if self.form.kind == LIBFM
                else ("token position" if self.field_map is None else self.field_map.path)
            ),
            "labels": LABEL_MAPPING,
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
        # the split keeps empty strings between repeated spaces, at the ends of a line and for
        # an empty line (``""`` -> ``[""]``): drop them, so a blank line is empty
        flat = pc.list_flatten(toks)
        parent = _np(pc.list_parent_indices(toks)).astype(np.int64)
        nonempty = _np(pc.not_equal(flat, ""))
        flat, parent = flat.filter(pa.array(nonempty)), parent[nonempty]
        ntok = np.bincount(parent, minlength=len(raw)).astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(ntok)[:-1]])
        is_label = np.arange(len(flat)) == starts[parent]
        feat_tok = flat.filter(pa.array(~is_label))
        feat_row = parent[~is_label]
        t = {
            "lines": lines,
            "ntok": ntok,
            "label": flat.filter(pa.array(is_label)),
            "feat": feat_tok,
            "row": feat_row,
        }
        t.update(self._features(feat_tok, feat_row, ntok))
        return t

    def _features(self, feat: pa.Array, row: np.ndarray, ntok: np.ndarray) -> dict[str, Any]:
        """Field, id and value of every feature token, and which tokens are well formed."""
        k = self.form.parts
        nparts = _np(pc.list_value_length(pc.split_pattern(feat, ":")))
        shaped = nparts == k
        # Pad malformed tokens so every token has k parts to index.
        fixed = pc.if_else(pa.array(shaped), feat, ":".join(["x"] * k))
        flat = pc.list_flatten(pc.split_pattern(fixed, ":"))
        cols = [flat.take(pa.array(np.arange(j, len(flat), k))) for j in range(k)]
        i_s, v_s = cols[-2], cols[-1]
        i_ok = _np(pc.match_substring_regex(i_s, _UINT_RE))
        v_ok = _np(pc.match_substring_regex(v_s, FLOAT_RE)) & _np(pc.not_equal(v_s, ""))
        ids = to_float(i_s, i_ok)
        known = np.ones(row.size, dtype=bool)
        if self.form.kind == LIBFM:
            f_ok = _np(pc.match_substring_regex(cols[0], _UINT_RE))
            # (capped: a field number of 400 digits reads as inf; it is reported out of range)
            field = np.minimum(to_float(cols[0], f_ok), 2.0**62).astype(np.int64)
        elif self.field_map is None:
            f_ok = known
            # the token's position after the label (tokens come in line order)
            first = np.concatenate([[0], np.cumsum(np.maximum(ntok - 1, 0))[:-1]])
            field = np.arange(row.size, dtype=np.int64) - first[row]
        else:
            f_ok = known
            field, known = self.field_map.lookup(ids.astype(np.int64))
        ok = shaped & f_ok & i_ok & v_ok
        value = to_float(v_s, v_ok)
        # ids past 2**63 (a 400-digit id reads as inf) and values whose stored float32 is inf
        over = ok & ((ids >= 2.0**63) | checked_dense(value, self.dense_transform)[1])
        return {
            "ok": ok & ~over,
            "over": over,
            "known": known | ~ok,  # (an unknown index is reported only for a well-formed token)
            "field": field,
            "id": ids,
            "value": value,
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
        labels, signed = check_labels(t["label"], empty, flag)
        if signed and not self._signed_labels_logged:
            self._signed_labels_logged = True
            log.info("libsvm labels: -1 is read as 0 and +1 as 1")
        good_tok = self._check_tokens(t, flag)
        report.handle(bad)
        return labels, flagged, good_tok

    def _check_tokens(self, t: dict[str, Any], flag: Any) -> np.ndarray:
        """Flag malformed, unmapped, out-of-range and repeated fields; the usable tokens."""
        n = len(t["lines"])
        row, ok, field = t["row"], t["ok"], t["field"]
        tok_idx = np.arange(row.size)
        bad_tok = np.full(n, -1)
        malformed = ~ok & ~t["over"]
        bad_tok[row[malformed][::-1]] = tok_idx[malformed][::-1]  # first bad token per line
        flag(
            bad_tok >= 0,
            BAD_NUMBER,
            lambda i: self.form.mismatch(t["feat"][int(bad_tok[i])].as_py()),
        )
        over_tok = np.full(n, -1)
        over_tok[row[t["over"]][::-1]] = tok_idx[t["over"]][::-1]
        flag(
            over_tok >= 0,
            BAD_NUMBER,
            lambda i: f"token {t['feat'][int(over_tok[i])].as_py()!r}: a number is {OVERFLOW}",
        )
        if self.by_position:
            nfeat = np.maximum(t["ntok"] - 1, 0)
            flag(
                (t["ntok"] > 0) & (nfeat != self.num_fields),
                WRONG_FIELD_COUNT,
                lambda i: (
                    f"{nfeat[i]} features, expected {self.num_fields}: in index:value "
                    "lines the i-th feature is field i, so every line needs one per field "
                    "(--field-map FILE maps feature index -> field for lines that differ)"
                ),
            )
        unknown = np.full(n, -1)
        unknown[row[~t["known"]]] = t["id"][~t["known"]]
        fm_path = self.field_map.path if self.field_map is not None else None  # (unknown: set)
        flag(
            unknown >= 0,
            BAD_CATEGORY,
            lambda i: f"feature index {unknown[i]} is not in --field-map {fm_path}",
        )
        out_of_range = ok & t["known"] & (field >= self.num_fields)
        oor = np.full(n, -1)
        oor[row[out_of_range]] = field[out_of_range]
        flag(
            oor >= 0,
            BAD_CATEGORY,
            lambda i: f"field {oor[i]} is outside 0..{self.num_fields - 1} (see --num-fields)",
        )
        good_tok = ok & t["known"] & ~out_of_range
        dup_field = repeated_field(row, field, good_tok, n, self.multi_hot_fields)
        via_map = " (two of the line's feature indices map to it)" if self.field_map else ""
        flag(
            dup_field >= 0,
            DUPLICATE_FIELD,
            lambda i: f"field {dup_field[i]} appears twice{via_map}",
        )
        return good_tok

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
            is_dense = dcol[f] >= 0  # (neither single-hot nor a bag)
            raw[r[is_dense], dcol[f[is_dense]]] = vals[is_dense]
            dense = transform_dense(raw, self.dense_transform)[keep]
        lists = bags(r, f, ids, keep, self.multi_hot_fields)
        return RawBlock(
            path, lines[keep], labels[keep].astype(np.float32), dense, keys[keep], lists
        )
