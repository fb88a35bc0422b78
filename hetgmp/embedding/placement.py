"""Which worker owns each row, and which rows a worker mirrors."""

from __future__ import annotations

import numpy as np

from hetgmp.partition.plan import Plan, PlanError

PLACEMENTS = ("hash", "random")


def owner_array(num_rows: int, world_size: int, placement: str, seed: int) -> np.ndarray:
    """Owner per row without a plan: ``hash`` is ``id % world``, ``random`` a seeded draw."""
    if placement == "hash":
        return (np.arange(num_rows, dtype=np.int64) % world_size).astype(np.int32)
    if placement == "random":
        return np.random.default_rng(seed).integers(0, world_size, num_rows).astype(np.int32)
    raise ValueError(f"placement must be one of {PLACEMENTS} (or pass a plan), got {placement!r}")


def plan_placement(
    plan: Plan, num_rows: int, world_size: int, rank: int, store_rate: float
) -> tuple[np.ndarray, np.ndarray]:
    """(owner per row, sorted mirror row ids of ``rank``) from a plan, checked against the job."""
    plan.check_matches(num_rows=num_rows, world_size=world_size)
    owner = np.asarray(plan.embed_partition, dtype=np.int32)
    mirrors = np.unique(np.asarray(plan.mirror_rows(rank, store_rate), dtype=np.int64))
    if mirrors.size and (mirrors.min() < 0 or mirrors.max() >= num_rows):
        raise PlanError(f"plan mirror list of worker {rank} holds row ids outside [0, {num_rows})")
    if mirrors.size and (owner[mirrors] == rank).any():
        raise PlanError(f"plan mirror list of worker {rank} holds rows that worker {rank} owns")
    return owner, mirrors
