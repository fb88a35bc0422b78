"""Bad input lines: the error raised for them and the report kept when they are skipped.

Every reader validates its input vectorized per block and reports offending lines through a
:class:`BadLineReport`. In ``"error"`` mode (the default) the first bad line raises
:class:`BadInputError` naming the file, the 1-based line number and what is wrong; in ``"skip"``
mode the line is dropped and counted per reason, and the report (counts plus the first few
examples) is printed and stored in ``meta.json`` under ``source.bad_lines``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

ON_BAD_LINE_CHOICES = ("error", "skip")
_MAX_EXAMPLES = 20

# Reasons (stable names: they are keys of the report in meta.json).
WRONG_FIELD_COUNT = "wrong_field_count"
EMPTY_LINE = "empty_line"
BAD_NUMBER = "bad_number"
BAD_LABEL = "bad_label"
BAD_CATEGORY = "bad_category"
DUPLICATE_FIELD = "duplicate_field"


class BadInputError(ValueError):
    """The input is malformed; the message names the file and line (or row)."""


@dataclasses.dataclass
class BadLine:
    """One offending line: where it is and what is wrong with it."""

    path: str
    line: int
    reason: str
    detail: str

    def message(self, unit: str = "line") -> str:
        return f"{self.path}:{unit} {self.line}: {self.detail}"


@dataclasses.dataclass
class BadLineReport:
    """Counts of skipped lines per reason plus the first few examples."""

    mode: str = "error"
    unit: str = "line"  # "line" for text files, "row" for parquet
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    examples: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if self.mode not in ON_BAD_LINE_CHOICES:
            raise ValueError(f"--on-bad-line: {self.mode!r} is not one of {ON_BAD_LINE_CHOICES}")

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def handle(self, bad: list[BadLine]) -> None:
        """Raise for the earliest bad line (error mode) or count them all (skip mode)."""
        if not bad:
            return
        if self.mode == "error":
            first = min(bad, key=lambda b: (b.path, b.line))
            raise BadInputError(
                first.message(self.unit) + " (use --on-bad-line skip to skip and count such lines)"
            )
        for b in sorted(bad, key=lambda b: b.line):
            self.counts[b.reason] = self.counts.get(b.reason, 0) + 1
            if len(self.examples) < _MAX_EXAMPLES:
                self.examples.append(b.message(self.unit))

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "skipped": self.total,
            "counts": dict(self.counts),
            "examples": list(self.examples),
        }

    def summary(self) -> str:
        if not self.total:
            return "no bad lines"
        parts = ", ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
        return f"skipped {self.total} bad {self.unit}s ({parts})"


def bad_rows(
    path: str, lines: np.ndarray, mask: np.ndarray, reason: str, describe: Any
) -> list[BadLine]:
    """BadLine entries for rows where ``mask`` is true; ``describe(i)`` says what is wrong."""
    idx = np.flatnonzero(mask)
    return [BadLine(path, int(lines[i]), reason, describe(int(i))) for i in idx]
