"""The sample -> rows edges of a data set with multi-hot fields, as one ragged list.

A single-hot data set's edges are its ``[N, F]`` id matrix (sample ``s`` uses rows
``ids[s, :]``). With multi-hot fields a sample also uses every id of each of its lists, so the
partitioner sees one ragged list per sample: its ``F`` single-hot ids, then each multi-hot
field's list. A repeated id is a repeated edge -- the weight of that (sample, row) pair in the
use counts, the refinement gains and the report, as it is read that many times per step.
The native code takes ``values`` with ``offsets=`` (:func:`native_args`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np


@dataclasses.dataclass
class SampleRows:
    """Ragged sample -> row ids: sample ``s`` uses ``values[offsets[s]:offsets[s + 1]]``."""

    values: np.ndarray  # int64 [E]
    offsets: np.ndarray  # int64 [N + 1]

    @property
    def ndim(self) -> int:
        return 2  # (a stand-in for the [N, F] matrix in argument checks)

    @property
    def shape(self) -> tuple[int, int]:
        """``(samples, mean ids per sample rounded up)``: edge budgets divide by the second."""
        n = int(self.offsets.shape[0]) - 1
        return n, -(-int(self.values.shape[0]) // max(1, n))

    def padded(self, chosen: np.ndarray) -> np.ndarray:
        """The lists of samples ``chosen`` as an ``[S, W]`` matrix, each sample's ids distinct
        and sorted, -1 filling the rest (METIS wants no repeated edges)."""
        starts, ends = self.offsets[chosen], self.offsets[chosen + 1]
        lengths = ends - starts
        width = int(lengths.max()) if lengths.size else 0
        out = np.full((chosen.size, max(width, 1)), -1, dtype=np.int64)
        col = np.arange(width, dtype=np.int64)
        mask = col[None, :] < lengths[:, None]
        out[:, :width][mask] = self.values[(starts[:, None] + col[None, :])[mask]]
        out.sort(axis=1)
        out[:, 1:][out[:, 1:] == out[:, :-1]] = -1  # (-1s sort first, repeats stay adjacent)
        return out


def combine(single: np.ndarray, lists: Sequence[Any]) -> SampleRows:
    """One ragged list per sample: the ``[N, F]`` single-hot ids, then every multi-hot field's
    list (each with ``values`` and ``offsets [N + 1]``), in field order."""
    n, f = single.shape
    lengths: np.ndarray = np.full(n, f, dtype=np.int64)
    for mh in lists:
        lengths = lengths + np.diff(np.asarray(mh.offsets, dtype=np.int64))
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = np.empty(int(offsets[-1]), dtype=np.int64)
    values[(offsets[:-1, None] + np.arange(f)[None, :]).ravel()] = np.asarray(single).ravel()
    start = offsets[:-1] + f  # where each sample's next list goes
    for mh in lists:
        mo = np.asarray(mh.offsets, dtype=np.int64)
        ln = np.diff(mo)
        # the i-th id of the field's values belongs to sample s = owner[i], at start[s] + rank
        owner = np.repeat(np.arange(n, dtype=np.int64), ln)
        rank = np.arange(int(mo[-1]), dtype=np.int64) - mo[:-1][owner]
        values[start[owner] + rank] = np.asarray(mh.values)
        start = start + ln
    return SampleRows(values, offsets)


def native_args(ids: np.ndarray | SampleRows) -> tuple[np.ndarray, np.ndarray | None]:
    """``(sparse, offsets)`` for the native partition calls: the matrix and None, or the ragged
    values and their offsets."""
    if isinstance(ids, SampleRows):
        return np.ascontiguousarray(ids.values), np.ascontiguousarray(ids.offsets)
    return ids, None


def num_samples(ids: np.ndarray | SampleRows) -> int:
    """The number of samples of either form."""
    return int(ids.shape[0])
