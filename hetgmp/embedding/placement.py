"""Which rows a worker mirrors, and their owners, from a plan (without a plan the owners are
:func:`hetgmp.partition.owners.owner_array`'s)."""

from __future__ import annotations

import numpy as np

from hetgmp.partition.plan import Plan, PlanError


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
