"""Row owners without a plan: the placements a run uses when no partition is given.

Here, not in :mod:`hetgmp.embedding`, because the partitioner's train-time fallback plan
(:mod:`hetgmp.partition.fallback`) draws its owners the same way, and the partition layer
sits below the embedding layer (docs/architecture.md, "Import arrows").
"""

from __future__ import annotations

import numpy as np

PLACEMENTS = ("hash", "random")


def owner_array(num_rows: int, world_size: int, placement: str, seed: int) -> np.ndarray:
    """Owner per row without a plan: ``hash`` is ``id % world``, ``random`` a seeded draw."""
    if placement == "hash":
        return (np.arange(num_rows, dtype=np.int64) % world_size).astype(np.int32)
    if placement == "random":
        return np.random.default_rng(seed).integers(0, world_size, num_rows).astype(np.int32)
    raise ValueError(f"placement must be one of {PLACEMENTS} (or pass a plan), got {placement!r}")
