"""Byte-level cutting of delimited text: chunks of whole lines and the records inside a chunk.

Because the readers cut the chunks themselves they know the line number of every row, which is
what bad-line messages (``file:line``) and the ``random`` split are built on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np


def iter_chunks(
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
            cut = last_record_end(buf, quote)
            if cut < 0:
                carry = buf  # a line longer than the block: keep reading
                continue
            chunk, carry = buf[: cut + 1], buf[cut + 1 :]
            yield line, chunk, len(data)
            line += chunk.count(b"\n")
    if carry:
        yield line, carry, 0


def last_record_end(buf: bytes, quote: str | None) -> int:
    if not quote:
        return buf.rfind(b"\n")
    b = np.frombuffer(buf, dtype=np.uint8)
    nl = np.flatnonzero(b == 10)
    q = np.flatnonzero(b == ord(quote))
    outside = np.searchsorted(q, nl) % 2 == 0
    ends = nl[outside]
    return int(ends[-1]) if ends.size else -1


@dataclasses.dataclass
class Records:
    starts: np.ndarray
    ends: np.ndarray  # exclusive, before the newline
    nfields: np.ndarray
    lines: np.ndarray


def find_records(buf: bytes, first_line: int, delimiter: str, quote: str | None) -> Records:
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
    return Records(starts, ends.astype(np.int64), nfields.astype(np.int64), lines.astype(np.int64))
