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
"""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from hetgmp.data.bad_lines import (
    BAD_CATEGORY,
    BAD_LABEL,
    BAD_NUMBER,
    EMPTY_LINE,
    WRONG_FIELD_COUNT,
    BadInputError,
    BadLine,
    BadLineReport,
    bad_rows,
)
from hetgmp.data.vocab import hex8_keys, hex_keys, string_keys

DEFAULT_BLOCK_BYTES = 32 << 20
_PARSE_THREADS = 2  # chunks converted at once (so at most 3 chunks are in memory)
DENSE_KINDS = ("int", "float")
CATEGORICAL_KINDS = ("hex", "string")
DENSE_TRANSFORMS = ("log", "none")
_FAST_HEX_WIDTH = 8
_FAST_BYTES = b"0123456789abcdefABCDEF-\t\n"
_INT_RE = r"^(-?[0-9]+)?$"
_FLOAT_RE = r"^\s*([+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?)?\s*$"


@dataclasses.dataclass
class RawBlock:
    """Validated rows of one chunk: raw keys (not yet ids), transformed dense values, labels."""

    path: str
    lines: np.ndarray  # int64 [n], 1-based line (or row) number in ``path``
    labels: np.ndarray  # float32 [n], 0/1
    dense: np.ndarray | None  # float32 [n, num_dense]
    keys: np.ndarray  # uint64 [n, num_fields]

    def __len__(self) -> int:
        return int(self.lines.shape[0])


def transform_dense(x: np.ndarray, transform: str) -> np.ndarray:
    """Dense transform. ``log``: ``log(max(x, 0) + 2)`` (negatives clipped to 0 first, as the
    issue asks; missing values were already set to 0, so they become ``log 2``). ``none``: x."""
    if transform == "log":
        return np.log(np.maximum(x, 0.0) + 2.0).astype(np.float32)
    if transform == "none":
        return x.astype(np.float32)
    raise ValueError(f"dense transform {transform!r} is not one of {DENSE_TRANSFORMS}")


@dataclasses.dataclass
class DelimitedSpec:
    """Which column is what in a delimited file (0-based column indices)."""

    num_columns: int
    label: int
    dense: list[int]
    categorical: list[int]
    column_names: list[str]
    delimiter: str = ","
    header: bool = False
    quote_char: str | None = None
    dense_kind: str = "float"
    categorical_kind: str = "string"
    dense_transform: str = "none"

    def check(self) -> None:
        used = [self.label, *self.dense, *self.categorical]
        if len(set(used)) != len(used):
            raise ValueError("a column is used twice among --label/--dense/--categorical")
        for c in used:
            if not 0 <= c < self.num_columns:
                raise ValueError(f"column index {c} is outside 0..{self.num_columns - 1}")
        if not self.categorical:
            raise ValueError("at least one --categorical column is needed")
        if len(self.delimiter) != 1:
            raise ValueError(f"--delimiter must be one character, got {self.delimiter!r}")
        if self.dense_kind not in DENSE_KINDS or self.categorical_kind not in CATEGORICAL_KINDS:
            raise ValueError("unknown dense/categorical kind")
        transform_dense(np.zeros(1), self.dense_transform)


def criteo_spec() -> DelimitedSpec:
    """Criteo Kaggle / 1 TB ``day_N`` TSV: label, I1..I13 (ints), C1..C26 (hex), no header."""
    names = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
    return DelimitedSpec(
        num_columns=40,
        label=0,
        dense=list(range(1, 14)),
        categorical=list(range(14, 40)),
        column_names=names,
        delimiter="\t",
        header=False,
        quote_char=None,
        dense_kind="int",
        categorical_kind="hex",
        dense_transform="log",
    )


def _split_header(line: bytes, delimiter: str, quote: str | None) -> list[str]:
    text = line.decode("utf-8", errors="replace").rstrip("\r\n")
    parts = text.split(delimiter)
    if quote:
        parts = [p.strip().strip(quote) for p in parts]
    return parts


def read_first_line(path: Path) -> bytes:
    """First line of ``path`` (for headers / column counts); error when the file is empty."""
    with open(path, "rb") as f:
        line = f.readline(1 << 20)
    if not line.strip():
        raise BadInputError(
            f"{path}:line 1: file is empty" if not line else f"{path}:line 1: first line is empty"
        )
    return line


def resolve_columns(
    path: Path,
    *,
    label: str,
    dense: list[str],
    categorical: list[str],
    delimiter: str,
    header: bool,
    quote_char: str | None,
    dense_kind: str = "float",
    categorical_kind: str = "string",
    dense_transform: str = "none",
) -> DelimitedSpec:
    """Build a spec from column names (needs a header) or 0-based indices, reading line 1."""
    first = read_first_line(path)
    cols = _split_header(first, delimiter, quote_char)
    names = cols if header else [f"c{i}" for i in range(len(cols))]

    def index(col: str, option: str) -> int:
        if col in names:
            return names.index(col)
        if col.lstrip("-").isdigit():
            return int(col)
        raise ValueError(
            f"{option} {col!r}: no such column in {path} (columns: {', '.join(names[:50])})"
        )

    spec = DelimitedSpec(
        num_columns=len(cols),
        label=index(label, "--label"),
        dense=[index(c, "--dense") for c in dense],
        categorical=[index(c, "--categorical") for c in categorical],
        column_names=names,
        delimiter=delimiter,
        header=header,
        quote_char=quote_char,
        dense_kind=dense_kind,
        categorical_kind=categorical_kind,
        dense_transform=dense_transform,
    )
    spec.check()
    return spec


def _iter_chunks(
    path: Path, block_bytes: int, quote: str | None
) -> Iterator[tuple[int, bytes, int]]:
    """Yield (first line number, chunk of whole lines, bytes consumed) of ``path``."""
    line = 1
    carry = b""
    with open(path, "rb") as f:
        while True:
            data = f.read(block_bytes)
            if not data:
                break
            buf = carry + data if carry else data
            cut = _last_record_end(buf, quote)
            if cut < 0:
                carry = buf  # a line longer than the block: keep reading
                continue
            chunk, carry = buf[: cut + 1], buf[cut + 1 :]
            yield line, chunk, len(data)
            line += chunk.count(b"\n")
    if carry:
        yield line, carry, 0


def _last_record_end(buf: bytes, quote: str | None) -> int:
    if not quote:
        return buf.rfind(b"\n")
    b = np.frombuffer(buf, dtype=np.uint8)
    nl = np.flatnonzero(b == 10)
    q = np.flatnonzero(b == ord(quote))
    outside = np.searchsorted(q, nl) % 2 == 0
    ends = nl[outside]
    return int(ends[-1]) if ends.size else -1


@dataclasses.dataclass
class _Records:
    starts: np.ndarray
    ends: np.ndarray  # exclusive, before the newline
    nfields: np.ndarray
    lines: np.ndarray


def _records(buf: bytes, first_line: int, delimiter: str, quote: str | None) -> _Records:
    """Per record (line, unless a newline is quoted): byte span, field count, line number."""
    b = np.frombuffer(buf, dtype=np.uint8)
    nl = np.flatnonzero(b == 10)
    delims = np.flatnonzero(b == ord(delimiter))
    if quote:
        q = np.flatnonzero(b == ord(quote))
        nl_rec = nl[np.searchsorted(q, nl) % 2 == 0]
        delims = delims[np.searchsorted(q, delims) % 2 == 0]
    else:
        nl_rec = nl
    ends = nl_rec if buf.endswith(b"\n") else np.concatenate([nl_rec, [len(b)]])
    starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)
    nfields = np.searchsorted(delims, ends) - np.searchsorted(delims, starts) + 1
    lines = first_line + np.searchsorted(nl, starts)
    # Drop a trailing '\r' (CRLF files) from the span.
    has_cr = (ends > starts) & (b[np.maximum(ends - 1, 0)] == 13)
    ends = ends - has_cr
    return _Records(starts, ends.astype(np.int64), nfields.astype(np.int64), lines.astype(np.int64))


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
        self._used = [spec.label, *spec.dense, *spec.categorical]
        self._fast_ok = (
            spec.dense_kind == "int"
            and spec.categorical_kind == "hex"
            and not spec.quote_char
            and spec.delimiter == "\t"
        )

    @property
    def field_names(self) -> list[str]:
        return [self.spec.column_names[c] for c in self.spec.categorical]

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
            "label_column": s.column_names[s.label],
            "dense_columns": self.dense_names,
            "categorical_columns": self.field_names,
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
        spec = self.spec
        if buf.translate(None, _FAST_BYTES):
            return None
        invalid = [0]

        def on_invalid(_row: object) -> str:
            invalid[0] += 1
            return "skip"

        types = {self._names[spec.label]: pa.int8()}
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
        n = table.num_rows
        if invalid[0] or n != n_lines:
            return None
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
            dense = transform_dense(raw.astype(np.float64), spec.dense_transform)
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
        )

    def _convert(
        self, path: str, lines: np.ndarray, table: pa.Table
    ) -> tuple[RawBlock, list[BadLine]]:
        spec = self.spec
        n = table.num_rows
        flagged = np.zeros(n, dtype=bool)  # rows with a problem already reported
        bad: list[BadLine] = []

        def col(c: int) -> pa.Array:
            return table.column(self._names[c]).combine_chunks()

        def report_rows(mask: np.ndarray, reason: str, c: int, what: str, arr: pa.Array) -> None:
            new = mask & ~flagged
            if new.any():
                name = spec.column_names[c]
                bad.extend(
                    bad_rows(
                        path,
                        lines,
                        new,
                        reason,
                        lambda i: f"column {name}: {arr[i].as_py()!r} is {what}",
                    )
                )
                flagged[:] |= new

        # Label: a number equal to 0 or 1.
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
                dense[:, j] = transform_dense(_to_float(arr, ok), spec.dense_transform)

        keys = np.empty((n, len(spec.categorical)), dtype=np.uint64)
        for j, c in enumerate(spec.categorical):
            arr = col(c)
            if spec.categorical_kind == "hex":
                keys[:, j], invalid = hex_keys(arr)
                report_rows(invalid, BAD_CATEGORY, c, "not a hex value of at most 15 digits", arr)
            else:
                keys[:, j] = string_keys(arr)

        keep = ~flagged
        if not keep.all():
            lines, labels, keys = lines[keep], labels[keep], keys[keep]
            dense = dense[keep] if dense is not None else None
        return RawBlock(path, lines, labels.astype(np.float32), dense, keys), bad


def _chunked_numpy(arr: pa.ChunkedArray | pa.Array) -> np.ndarray:
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


def _to_float(arr: pa.Array, ok: np.ndarray) -> np.ndarray:
    """Cast validated number strings to float64; empty or invalid entries become 0."""
    trimmed = pc.utf8_trim_whitespace(arr)
    usable = pa.array(ok) if isinstance(ok, np.ndarray) else ok
    usable = pc.and_(usable, pc.not_equal(trimmed, ""))
    filled = pc.if_else(usable, trimmed, "0")
    return pc.cast(filled, pa.float64()).to_numpy(zero_copy_only=False)
