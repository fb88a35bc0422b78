"""Statistics of generated data: per-id counts for meta.json and the locality measure."""

from __future__ import annotations

from typing import Any

import numpy as np


def repeat_rate(users: np.ndarray, values: np.ndarray) -> float:
    """Share of samples whose value the same user already had in an earlier sample."""
    key = np.stack([users.astype(np.int64), values.astype(np.int64)], axis=1)
    return 1.0 - np.unique(key, axis=0).shape[0] / max(1, key.shape[0])


def excess_repeat_rate(users: np.ndarray, values: np.ndarray, seed: int = 0) -> float:
    """Within-user repeat rate beyond chance, normalised: ``(r - r0) / (1 - r0)``.

    ``r0`` is the rate with users randomly re-assigned to samples (same user sizes), so a field
    that repeats only because it has few values scores 0 and one fixed per user scores ~1. This is
    the locality statistic the default ``locality`` is calibrated with.
    """
    r = repeat_rate(users, values)
    r0 = repeat_rate(np.random.default_rng(seed).permutation(users), values)
    return (r - r0) / (1.0 - r0) if r0 < 1.0 else 0.0


class FieldCounts:
    """Exact per-id occurrence counts (uint32), accumulated with per-field bincounts in groups."""

    def __init__(self, cards: np.ndarray, group_rows: int = 1 << 20) -> None:
        self.cards = cards
        self.counts = [np.zeros(int(c), dtype=np.uint32) for c in cards]
        self._buf: list[np.ndarray] = []
        self._rows = 0
        self.group_rows = group_rows

    def add(self, local: np.ndarray) -> None:
        self._buf.append(local)
        self._rows += local.shape[0]
        if self._rows >= self.group_rows:
            self.flush()

    def flush(self) -> None:
        if not self._buf:
            return
        block = np.concatenate(self._buf)
        for f, c in enumerate(self.counts):
            c += np.bincount(block[:, f], minlength=c.size).astype(np.uint32)
        self._buf, self._rows = [], 0

    def summary(self) -> dict[str, Any]:
        self.flush()
        distinct, top1, top_share = [], [], []
        for c in self.counts:
            total = int(c.sum(dtype=np.int64))
            k = max(1, c.size // 100)
            top = np.partition(c, c.size - k)[c.size - k :].sum(dtype=np.int64)
            distinct.append(int(np.count_nonzero(c)))
            top1.append(round(float(top) / max(1, total), 4))
            top_share.append(round(float(c.max()) / max(1, total), 4))
        return {
            "distinct_ids_per_field": distinct,
            "top1pct_id_share_per_field": top1,
            "top_id_share_per_field": top_share,
        }
