"""Column specs of delimited files, the parsed-block type and the dense transforms.

:class:`DelimitedSpec` says which column is the label, dense or categorical;
:func:`criteo_spec` is the Criteo TSV layout and :func:`resolve_columns` builds a spec from column
names or indices. :class:`RawBlock` is what every reader (delimited, libsvm, parquet) yields.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from hetgmp.data.bad_lines import BadInputError

DENSE_KINDS = ("int", "float")
CATEGORICAL_KINDS = ("hex", "string")
DENSE_TRANSFORMS = ("log", "none")


@dataclasses.dataclass
class RawBlock:
    """Validated rows of one chunk: raw keys (not yet ids), transformed dense values, labels."""

    path: str
    lines: np.ndarray  # int64 [n], 1-based line (or row) number in ``path``
    labels: np.ndarray  # float32 [n], 0/1
    dense: np.ndarray | None  # float32 [n, num_dense]
    keys: np.ndarray  # uint64 [n, num_fields]
    # per multi-hot field: (keys uint64 [E], offsets int64 [n + 1]); row i's list is
    # keys[offsets[i]:offsets[i + 1]]
    lists: list[tuple[np.ndarray, np.ndarray]] = dataclasses.field(default_factory=list)

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


OVERFLOW = "too large: its stored float32 value would be inf (hetgmp refuses such numbers)"


def checked_dense(x: np.ndarray, transform: str) -> tuple[np.ndarray, np.ndarray]:
    """(``transform_dense(x)``, where it overflowed): a value whose stored float32 is not finite
    (``1e400`` or a 400-digit integer read as inf, ``1e39`` under ``none``) is a bad number,
    never a silent inf that turns training's loss into NaN."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = transform_dense(x, transform)
    return out, ~np.isfinite(out)


@dataclasses.dataclass
class DelimitedSpec:
    """Which column is what in a delimited file (0-based column indices)."""

    num_columns: int
    label: int | None  # None: the rows carry no label (files to score); labels read as NaN
    dense: list[int]
    categorical: list[int]
    column_names: list[str]
    delimiter: str = ","
    header: bool = False
    quote_char: str | None = None
    dense_kind: str = "float"
    categorical_kind: str = "string"
    dense_transform: str = "none"
    # multi-hot columns (issue 34): each cell a list of values split by its separator
    multi_hot: list[int] = dataclasses.field(default_factory=list)
    multi_hot_sep: list[str] = dataclasses.field(default_factory=list)

    def check(self) -> None:
        used = [*([] if self.label is None else [self.label]), *self.dense, *self.categorical]
        used += self.multi_hot
        if len(set(used)) != len(used):
            raise ValueError(
                "a column is used twice among --label/--dense/--categorical/--multi-hot"
            )
        if len(self.multi_hot_sep) != len(self.multi_hot):
            raise ValueError("every --multi-hot column needs a separator")
        for c, sep in zip(self.multi_hot, self.multi_hot_sep, strict=True):
            if not sep or sep in (self.delimiter, "\n", "\r") or sep == self.quote_char:
                raise ValueError(
                    f"--multi-hot {self.column_names[c]}: separator {sep!r} must be non-empty "
                    f"and differ from the delimiter {self.delimiter!r} and the quote character"
                )
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
    multi_hot: list[tuple[str, str]] | None = None,
) -> DelimitedSpec:
    """Build a spec from column names (needs a header) or 0-based indices, reading line 1;
    ``multi_hot``: ``(column, separator)`` pairs."""
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
        multi_hot=[index(c, "--multi-hot") for c, _ in multi_hot or []],
        multi_hot_sep=[sep for _, sep in multi_hot or []],
    )
    spec.check()
    return spec
