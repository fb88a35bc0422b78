"""The pass-1 spill file of :func:`~hetgmp.data.preprocess.preprocess`: parsed blocks."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from hetgmp.data.delimited_spec import RawBlock

_U32_MAX = np.uint64(2**32 - 1)


class Spill:
    """Pass-1 blocks (keys, dense, labels) in an anonymous temporary file, read by pass 2.

    The input is parsed once: pass 2 only maps the spilled keys to ids. Memory stays one block;
    the file (next to the output, deleted on close or crash) takes about 4 bytes per key plus
    4 per dense value and label, less than the text. Keys that all fit are stored as
    ``key + 1`` in uint32 (so the missing key ``2**64 - 1`` becomes 0), others as uint64.
    """

    def __init__(self, directory: Path, *, keep_lines: bool) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.f = tempfile.TemporaryFile(prefix=".hetgmp-preprocess-spill-", dir=directory)
        self.keep_lines = keep_lines
        self.index: list[tuple[str, int, str, int, int, bool, bool, int]] = []

    def put(self, role: str, file_index: int, block: RawBlock) -> None:
        n = len(block)
        keys = block.keys
        with np.errstate(over="ignore"):
            shifted = keys + np.uint64(1)
        small = keys.size == 0 or bool(shifted.max() <= _U32_MAX)
        parts = [shifted.astype(np.uint32) if small else keys, block.labels.astype(np.float32)]
        if block.dense is not None:
            parts.append(block.dense.astype(np.float32, copy=False))
        if self.keep_lines:
            parts.append(block.lines.astype(np.int64, copy=False))
        for values, offsets in block.lists:  # (offsets first: they give the values' length)
            parts += [offsets.astype(np.int64, copy=False), values.astype(np.uint64, copy=False)]
        for a in parts:
            self.f.write(np.ascontiguousarray(a).data.cast("B"))
        self.index.append(
            (role, file_index, block.path, n, keys.shape[1], small, block.dense is not None,
             len(block.lists))
        )  # fmt: skip

    def _read(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        a = np.empty(shape, dtype=dtype)
        if a.nbytes and self.f.readinto(a.data.cast("B")) != a.nbytes:
            raise RuntimeError("preprocess spill file is truncated")
        return a

    def blocks(self, num_dense: int) -> Iterator[tuple[str, int, RawBlock]]:
        self.f.flush()
        self.f.seek(0)
        for role, file_index, path, n, nf, small, has_dense, nlists in self.index:
            if small:
                with np.errstate(over="ignore"):
                    keys = self._read((n, nf), np.uint32).astype(np.uint64) - np.uint64(1)
            else:
                keys = self._read((n, nf), np.uint64)
            labels = self._read((n,), np.float32)
            dense = self._read((n, num_dense), np.float32) if has_dense else None
            lines = self._read((n,), np.int64) if self.keep_lines else np.zeros(0, np.int64)
            lists = []
            for _ in range(nlists):
                offsets = self._read((n + 1,), np.int64)
                lists.append((self._read((int(offsets[-1]),), np.uint64), offsets))
            yield role, file_index, RawBlock(path, lines, labels, dense, keys, lists)

    def close(self) -> None:
        self.f.close()
