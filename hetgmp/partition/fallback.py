"""The plan a run makes for itself when it has none but asks for mirrors (HET-GMP's habit:
``mpirun -np 8 python examples/hetuctr.py --bound 100 --store_rate 0.01`` without a partition).

As HET-GMP does, rows go to random owners; samples keep the contiguous shards a run without a
plan trains on. Each rank ranks the rows it does not own by how often its own samples use them
(one counting pass over its shard, in bounded memory): the most used become its mirrors. No
rank needs another's list, so every rank builds only its own (the others' are left empty) and
no communication is needed. A real plan (``hetgmp partition``) places samples and rows
together and moves far fewer rows (docs/partition.md).
"""

from __future__ import annotations

import numpy as np

from hetgmp.partition.owners import owner_array
from hetgmp.partition.plan import Plan

CHUNK = 1 << 20  # samples counted at a time (bounded memory for Criteo-sized shards)


def local_frequency_plan(
    sparse: np.ndarray, indices: np.ndarray, num_rows: int, world: int, rank: int, seed: int
) -> Plan:
    """A plan with random owners (``seed``: the same on every rank) whose mirror list for
    ``rank`` is its non-owned rows used by its samples ``indices``, most used first.
    ``sparse``: the ``[N, F]`` id matrix, or a multi-hot set's padded one (``-1`` skipped)."""
    counts = np.zeros(num_rows, dtype=np.int64)
    for lo in range(0, indices.size, CHUNK):
        ids = np.asarray(sparse[indices[lo : lo + CHUNK]]).ravel()
        ids = ids[ids >= 0]  # (a multi-hot set's padded bags: -1 fills the short ones)
        counts += np.bincount(ids, minlength=num_rows)
    owner = owner_array(num_rows, world, "random", seed)
    used = np.flatnonzero((counts > 0) & (owner != rank))
    ranked = used[np.argsort(-counts[used], kind="stable")].astype(np.int64)
    data = np.empty(sparse.shape[0], dtype=np.int32)
    for r in range(world):  # the contiguous shards (hetgmp.data.loader.rank_sample_indices)
        data[r * sparse.shape[0] // world : (r + 1) * sparse.shape[0] // world] = r
    mirrors = [ranked if r == rank else np.zeros(0, np.int64) for r in range(world)]
    meta = {"method": "random owners, mirrors by local frequency (made at train time)"}
    return Plan(data, owner, mirrors, meta)
