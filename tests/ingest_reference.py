"""Plain-Python reference encoders the vectorized ingestion is tested against (test helper)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

MISSING = 2**64 - 1


def encode_fields(rows: list[list[int]], min_count: int, id_order: str):
    """Per-field dict ids with the documented rules; returns (global ids [N, F], cardinalities)."""
    nf = len(rows[0])
    local = np.zeros((len(rows), nf), dtype=np.int64)
    cards = []
    for f in range(nf):
        col = [r[f] for r in rows]
        counts = Counter(col)
        first: dict[int, int] = {}
        for i, k in enumerate(col):
            first.setdefault(k, i)
        kept = [k for k in counts if counts[k] >= min_count]
        if id_order == "frequency":
            kept.sort(key=lambda k: (-counts[k], k))
        else:
            kept.sort(key=lambda k: first[k])
        ids = {k: i for i, k in enumerate(kept)}
        rare = len(kept)
        local[:, f] = [ids.get(k, rare) for k in col]
        cards.append(len(kept) + (1 if len(kept) < len(counts) else 0))
    offsets = np.concatenate([[0], np.cumsum(cards)[:-1]])
    return local + offsets, cards


def criteo_reference(lines: list[str], min_count: int, id_order: str, test_fraction: float):
    """Expected (train, test) arrays and cardinalities for valid Criteo TSV lines."""
    labels, dense, keys = [], [], []
    for line in lines:
        cols = line.split("\t")
        labels.append(float(cols[0]))
        dense.append([math.log(max(int(v) if v else 0, 0) + 2) for v in cols[1:14]])
        keys.append([int(v, 16) if v else MISSING for v in cols[14:40]])
    ids, cards = encode_fields(keys, min_count, id_order)
    n = len(lines)
    n_test = int(round(test_fraction * n))
    cut = n - n_test
    lab = np.array(labels, np.float32)
    den = np.array(dense, np.float32)
    return (ids[:cut], den[:cut], lab[:cut]), (ids[cut:], den[cut:], lab[cut:]), cards
