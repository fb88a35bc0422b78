"""Streaming reader for delimited text (Criteo TSV, CSV/TSV with a column spec).

Files are read in byte chunks cut at line ends and each chunk is parsed by pyarrow's
multithreaded C++ CSV reader into string columns, which are then validated and converted
vectorized. Because we cut the chunks ourselves we know the line number of every row:

* fast path: the chunk parses into exactly one row per line -> row ``i`` is line ``first + i``;
* slow path (only for chunks with a malformed line): count fields per line with numpy, report
  the lines whose count is wrong (or that are empty), and re-parse only the good lines.

Values are then checked per column: the label must be a number equal to 0 or 1, dense values
must be numbers (integers for Criteo; empty means missing), hex categoricals must be hex. The
first problem of each line is reported through :class:`~hetgmp.data.bad_lines.BadLineReport`.

Layout: specs and :class:`RawBlock` are in :mod:`hetgmp.data.delimited_spec`, chunk cutting in
:mod:`hetgmp.data.text_chunks`, the per-column checks in :mod:`hetgmp.data.delimited_values` and
string-to-number conversion in :mod:`hetgmp.data.arrow_values`; this module holds the reader.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from hetgmp.data.arrow_values import FLOAT_RE as _FLOAT_RE
from hetgmp.data.arrow_values import INT_RE as _INT_RE
from hetgmp.data.arrow_values import chunked_numpy as _chunked_numpy
from hetgmp.data.arrow_values import to_float as _to_float
from hetgmp.data.bad_lines import (
    EMPTY_LINE,
    WRONG_FIELD_COUNT,
    BadInputError,
    BadLine,
    BadLineReport,
    bad_rows,
)
from hetgmp.data.delimited_spec import (
    CATEGORICAL_KINDS,
    DENSE_KINDS,
    DENSE_TRANSFORMS,
    DelimitedSpec,
    RawBlock,
    checked_dense,
    criteo_spec,
    read_first_line,
    resolve_columns,
    transform_dense,
)
from hetgmp.data.delimited_values import convert_columns
from hetgmp.data.text_chunks import find_records as _records
from hetgmp.data.text_chunks import iter_chunks as _iter_chunks
from hetgmp.data.vocab import hex8_keys

# Names that lived here before the spec, chunking and value conversions got their own modules
# (the readers of libsvm and parquet import the private helpers from here).
__all__ = [
    "CATEGORICAL_KINDS", "DEFAULT_BLOCK_BYTES", "DENSE_KINDS", "DENSE_TRANSFORMS",
    "DelimitedSource", "DelimitedSpec", "RawBlock", "_FLOAT_RE", "_INT_RE", "_chunked_numpy",
    "_iter_chunks", "_records", "_to_float", "criteo_spec", "read_first_line", "resolve_columns",
    "transform_dense",
]  # fmt: skip

DEFAULT_BLOCK_BYTES = 32 << 20
_PARSE_THREADS = 2  # chunks converted at once (so at most 3 chunks are in memory)
_FAST_HEX_WIDTH = 8
_FAST_BYTES = b"0123456789abcdefABCDEF-\t\n"


class DelimitedSource:
    """Blocks of validated rows from one or more delimited files with one spec."""

    def __init__(
        self,
        paths: list[Path],
        spec: DelimitedSpec,
        *,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        kind: str = "delimited",
    ) -> None:
        spec.check()
        if not paths:
            raise ValueError("no input files given")
        for p in paths:
            if not Path(p).is_file():
                raise FileNotFoundError(f"{p}: input file not found")
        self.paths = [Path(p) for p in paths]
        self.spec = spec
        self.block_bytes = int(block_bytes)
        if self.block_bytes < 1:
            raise ValueError("--block-bytes must be positive")
        self.kind = kind
        self._names = [f"c{i}" for i in range(spec.num_columns)]
        self._used = [
            *([] if spec.label is None else [spec.label]),
            *spec.dense,
            *spec.categorical,
            *spec.multi_hot,
        ]
        self._fast_ok = (
            not spec.multi_hot
            and spec.dense_kind == "int"
            and spec.categorical_kind == "hex"
            and not spec.quote_char
            and spec.delimiter == "\t"
        )

    @property
    def field_names(self) -> list[str]:
        return [self.spec.column_names[c] for c in self.spec.categorical]

    @property
    def multi_hot_names(self) -> list[str]:
        return [self.spec.column_names[c] for c in self.spec.multi_hot]

    @property
    def dense_names(self) -> list[str]:
        return [self.spec.column_names[c] for c in self.spec.dense]

    @property
    def total_bytes(self) -> int:
        return sum(os.path.getsize(p) for p in self.paths)

    def describe(self) -> dict:
        s = self.spec
        return {
            "kind": self.kind,
            "inputs": [{"path": str(p), "bytes": os.path.getsize(p)} for p in self.paths],
            "delimiter": s.delimiter,
            "header": s.header,
            "label_column": None if s.label is None else s.column_names[s.label],
            "dense_columns": self.dense_names,
            "categorical_columns": self.field_names,
            **(
                {"multi_hot_columns": dict(zip(self.multi_hot_names, s.multi_hot_sep, strict=True))}
                if s.multi_hot
                else {}
            ),  # fmt: skip
            "dense_kind": s.dense_kind,
            "categorical_kind": s.categorical_kind,
            "dense_transform": {
                "log": "missing -> 0; y = log(max(x, 0) + 2) (negatives clipped to 0 first)",
                "none": "missing -> 0; y = x",
            }[s.dense_transform],
        }

    def iter_blocks(
        self, report: BadLineReport, progress: Callable[[int], None] | None = None
    ) -> Iterator[RawBlock]:
        # Chunks are converted by a small thread pool (pyarrow and most numpy work release the
        # GIL), results are taken in input order, and bad lines are reported in that order.
        with ThreadPoolExecutor(
            max_workers=_PARSE_THREADS, thread_name_prefix="hetgmp-parse"
        ) as pool:
            for path in self.paths:
                if os.path.getsize(path) == 0:
                    raise BadInputError(f"{path}:line 1: file is empty")
                rows = 0
                pending: collections.deque = collections.deque()
                chunks = _iter_chunks(path, self.block_bytes, self.spec.quote_char)
                done = False
                while not done or pending:
                    if not done and len(pending) <= _PARSE_THREADS:
                        try:
                            first_line, chunk, consumed = next(chunks)
                        except StopIteration:
                            done = True
                            continue
                        if self.spec.header and first_line == 1:
                            nl = chunk.find(b"\n")
                            chunk = chunk[nl + 1 :] if nl >= 0 else b""
                            first_line = 2
                        fut = pool.submit(self._block, path, first_line, chunk) if chunk else None
                        pending.append((fut, consumed))
                        continue
                    fut, consumed = pending.popleft()
                    if fut is not None:
                        block, bad = fut.result()
                        report.handle(bad)
                        rows += len(block)
                        if len(block):
                            yield block
                    if progress is not None:
                        progress(consumed)
                if rows == 0 and report.mode == "error":
                    raise BadInputError(
                        f"{path}:line {2 if self.spec.header else 1}: no data lines"
                    )

    def _parse(self, buf: bytes) -> tuple[pa.Table, int]:
        invalid = [0]

        def on_invalid(_row: object) -> str:
            invalid[0] += 1
            return "skip"

        used_names = [self._names[c] for c in self._used]
        table = pacsv.read_csv(
            pa.py_buffer(buf),
            read_options=pacsv.ReadOptions(
                column_names=self._names, block_size=1 << 22, use_threads=True
            ),
            parse_options=pacsv.ParseOptions(
                delimiter=self.spec.delimiter,
                quote_char=self.spec.quote_char or False,
                ignore_empty_lines=True,
                invalid_row_handler=on_invalid,
            ),
            convert_options=pacsv.ConvertOptions(
                column_types={n: pa.string() for n in used_names},
                include_columns=used_names,
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )
        return table, invalid[0]

    def _block(self, path: Path, first_line: int, buf: bytes) -> tuple[RawBlock, list[BadLine]]:
        """Convert one chunk: its valid rows plus its bad lines (for the caller to report)."""
        n_lines = buf.count(b"\n") + (0 if buf.endswith(b"\n") else 1)
        if self._fast_ok:
            block = self._fast_block(str(path), first_line, buf, n_lines)
            if block is not None:
                return block, []
        table, invalid = self._parse(buf)
        bad: list[BadLine] = []
        if invalid == 0 and table.num_rows == n_lines:
            lines = first_line + np.arange(n_lines, dtype=np.int64)
        else:
            # Slow path: find the malformed lines ourselves, then parse only the good ones.
            rec = _records(buf, first_line, self.spec.delimiter, self.spec.quote_char)
            empty = rec.ends == rec.starts
            wrong = (rec.nfields != self.spec.num_columns) & ~empty
            want = self.spec.num_columns
            bad += bad_rows(str(path), rec.lines, empty, EMPTY_LINE, lambda i: "empty line")
            bad += bad_rows(
                str(path),
                rec.lines,
                wrong,
                WRONG_FIELD_COUNT,
                lambda i: f"{rec.nfields[i]} fields, expected {want}",
            )
            good = np.flatnonzero(~(empty | wrong))
            lines = rec.lines[good]
            good_buf = b"\n".join(buf[rec.starts[i] : rec.ends[i]] for i in good)
            table, invalid = self._parse(good_buf + b"\n") if good.size else (None, 0)
            got = 0 if table is None else table.num_rows
            if invalid or got != good.size:
                raise BadInputError(
                    f"{path}:lines {first_line}..{first_line + n_lines - 1}: could not parse "
                    f"(quoting problem?)"
                )
            if table is None:
                return self._empty_block(str(path)), bad
        block, value_bad = self._convert(str(path), lines, table)
        return block, bad + value_bad

    def _fast_block(self, path: str, first_line: int, buf: bytes, n_lines: int) -> RawBlock | None:
        """Criteo fast path: typed C++ parsing of a chunk with nothing unusual in it.

        Only for integer dense columns and hex categoricals. Used when the chunk holds only the
        bytes ``[0-9a-fA-F-\\t\\n]`` (so no whitespace, quotes, ``\\r``, ``0x`` or ``+`` that
        pyarrow's integer parser would accept but our rules reject), every line has the right
        field count, every label is 0/1, every dense value an int64 and every categorical 8 hex
        digits or empty. Anything else returns None and the chunk takes the general path, which
        validates value by value and reports bad lines; the result is identical either way.
        """
        if buf.translate(None, _FAST_BYTES):
            return None
        table = self._fast_table(buf, n_lines)
        if table is None:
            return None
        return self._fast_arrays(path, first_line, table)

    def _fast_table(self, buf: bytes, n_lines: int) -> pa.Table | None:
        """Typed pyarrow parse of a fast-path chunk; None unless it gives one row per line."""
        spec = self.spec
        invalid = [0]

        def on_invalid(_row: object) -> str:
            invalid[0] += 1
            return "skip"

        types = {} if spec.label is None else {self._names[spec.label]: pa.int8()}
        types.update({self._names[c]: pa.int64() for c in spec.dense})
        types.update({self._names[c]: pa.binary(_FAST_HEX_WIDTH) for c in spec.categorical})
        try:
            table = pacsv.read_csv(
                pa.py_buffer(buf),
                read_options=pacsv.ReadOptions(
                    column_names=self._names, block_size=1 << 22, use_threads=True
                ),
                parse_options=pacsv.ParseOptions(
                    delimiter=spec.delimiter,
                    quote_char=False,
                    ignore_empty_lines=False,
                    invalid_row_handler=on_invalid,
                ),
                convert_options=pacsv.ConvertOptions(
                    column_types=types,
                    include_columns=list(types),
                    strings_can_be_null=True,
                    quoted_strings_can_be_null=True,
                ),
            )
        except pa.ArrowInvalid:
            return None
        if invalid[0] or table.num_rows != n_lines:
            return None
        return table

    def _fast_arrays(self, path: str, first_line: int, table: pa.Table) -> RawBlock | None:
        """Labels, hex keys and dense values of a typed table; None if any value needs checks."""
        spec = self.spec
        n = table.num_rows
        if spec.label is None:
            labels = np.full(n, np.nan)
        else:
            lab = table.column(self._names[spec.label])
            if lab.null_count:
                return None
            labels = _chunked_numpy(lab)
            if not ((labels == 0) | (labels == 1)).all():
                return None
        keys = np.empty((n, len(spec.categorical)), dtype=np.uint64)
        for j, c in enumerate(spec.categorical):
            got = hex8_keys(table.column(self._names[c]).combine_chunks())
            if got is None:
                return None
            keys[:, j] = got
        dense = None
        if spec.dense:
            raw = np.empty((n, len(spec.dense)), dtype=np.int64)
            for j, c in enumerate(spec.dense):
                raw[:, j] = _chunked_numpy(pc.fill_null(table.column(self._names[c]), 0))
            dense, over = checked_dense(raw.astype(np.float64), spec.dense_transform)
            if over.any():  # (the general path reports the line)
                return None
        lines = first_line + np.arange(n, dtype=np.int64)
        return RawBlock(path, lines, labels.astype(np.float32), dense, keys)

    def _empty_block(self, path: str) -> RawBlock:
        nd = len(self.spec.dense)
        return RawBlock(
            path,
            np.zeros(0, np.int64),
            np.zeros(0, np.float32),
            np.zeros((0, nd), np.float32) if nd else None,
            np.zeros((0, len(self.spec.categorical)), np.uint64),
            [(np.zeros(0, np.uint64), np.zeros(1, np.int64)) for _ in self.spec.multi_hot],
        )

    def _convert(
        self, path: str, lines: np.ndarray, table: pa.Table
    ) -> tuple[RawBlock, list[BadLine]]:
        return convert_columns(self.spec, self._names, path, lines, table)
