"""Per-rank batch loaders over a memory-mapped dataset split.

A worker first picks its samples with :func:`rank_sample_indices` (the plan's ``data_partition``
when there is a plan, else a contiguous shard), then iterates :class:`BatchLoader` over them.

Determinism: the shuffled order is a pure function of ``(seed, epoch)`` and the index set, so a run
resumed at ``start_batch`` sees exactly the batches the interrupted run would have seen.

Rows are gathered from the memmap with *sorted* indices (sequential page access instead of random
seeks; it matters once the split is larger than the page cache), so inside a batch samples come in
ascending index order. Batch *membership* follows the shuffled order; losses summed over a batch do
not depend on the order inside it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Protocol

import numpy as np

from hetgmp.data.format import SplitArrays


class LoaderError(ValueError):
    """Invalid loader arguments (batch size, indices, rank, plan)."""


class SamplePlan(Protocol):
    """What :func:`rank_sample_indices` reads of a plan (a
    :class:`hetgmp.partition.plan.Plan`): named by its shape, since the data layer sits below
    the partitioner and does not import it (docs/architecture.md, "Import arrows")."""

    data_partition: np.ndarray  # the worker of every training sample

    def check_matches(
        self, *, num_samples: int | None = None, world_size: int | None = None
    ) -> None: ...


@dataclasses.dataclass
class Batch:
    """One batch: global ids, dense features, labels, and the sample indices they came from."""

    sparse: np.ndarray  # int64 [B, F], global ids
    dense: np.ndarray | None  # float32 [B, num_dense] or None
    labels: np.ndarray  # float32 [B, 1]
    indices: np.ndarray  # int64 [B], row indices into the split

    def __len__(self) -> int:
        return int(self.indices.shape[0])


def rank_sample_indices(
    num_samples: int, rank: int, world_size: int, plan: SamplePlan | None = None
) -> np.ndarray:
    """Sample indices (int64, ascending) that worker ``rank`` of ``world_size`` trains on.

    With a plan: the samples whose ``data_partition`` is ``rank``. Without: the contiguous shard
    ``[rank * N // W, (rank + 1) * N // W)``; over all ranks either way covers every sample once.
    """
    if world_size < 1:
        raise LoaderError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise LoaderError(f"rank {rank} is outside [0, {world_size})")
    if num_samples < 0:
        raise LoaderError(f"num_samples must be >= 0, got {num_samples}")
    if plan is not None:
        # Raises PlanError naming the mismatch (plan for another world size / data set).
        plan.check_matches(num_samples=num_samples, world_size=world_size)
        return np.flatnonzero(plan.data_partition == rank).astype(np.int64)
    start = rank * num_samples // world_size
    end = (rank + 1) * num_samples // world_size
    return np.arange(start, end, dtype=np.int64)


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The shuffle of ``n`` positions used for ``(seed, epoch)``; a pure function of its inputs."""
    if seed < 0 or epoch < 0:
        raise LoaderError(f"seed and epoch must be >= 0, got seed={seed}, epoch={epoch}")
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, 0x10AD])))
    return rng.permutation(n)


class BatchLoader:
    """Iterate one epoch of a split in batches.

    ``indices`` restricts the loader to those samples (e.g. from :func:`rank_sample_indices`);
    default all. ``shuffle`` permutes them by ``(seed, epoch)``. ``start_batch`` skips the first
    batches of the epoch (resume). ``len(loader)`` is the number of batches this iterator yields
    (``batches_per_epoch - start_batch``); ``batches_per_epoch`` counts the whole epoch.
    """

    def __init__(
        self,
        split: SplitArrays,
        batch_size: int,
        *,
        indices: np.ndarray | None = None,
        shuffle: bool = False,
        seed: int = 0,
        epoch: int = 0,
        drop_last: bool = False,
        start_batch: int = 0,
    ) -> None:
        if batch_size < 1:
            raise LoaderError(f"batch_size must be >= 1, got {batch_size}")
        n = len(split)
        if indices is None:
            idx = np.arange(n, dtype=np.int64)
        else:
            idx = np.asarray(indices)
            if idx.ndim != 1:
                raise LoaderError(f"indices must be 1-D, got shape {idx.shape}")
            if idx.size and idx.dtype.kind not in "iu":
                raise LoaderError(f"indices must be integers, got dtype {idx.dtype}")
            idx = idx.astype(np.int64, copy=False)
            if idx.size and (idx.min() < 0 or idx.max() >= n):
                raise LoaderError(
                    f"indices must lie in [0, {n}) for this split; got range "
                    f"[{int(idx.min())}, {int(idx.max())}]"
                )
        self.split = split
        self.batch_size = int(batch_size)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.epoch = int(epoch)
        self.drop_last = drop_last
        if shuffle:
            idx = idx[epoch_permutation(idx.size, self.seed, self.epoch)]
        self.order = idx  # this epoch's sample order (before start_batch is skipped)
        if drop_last:
            self.batches_per_epoch = idx.size // self.batch_size
        else:
            self.batches_per_epoch = -(-idx.size // self.batch_size)
        if not 0 <= start_batch <= self.batches_per_epoch:
            raise LoaderError(
                f"start_batch {start_batch} is outside [0, {self.batches_per_epoch}] "
                f"(batches in this epoch)"
            )
        self.start_batch = int(start_batch)

    def __len__(self) -> int:
        return self.batches_per_epoch - self.start_batch

    def batch_indices(self, b: int) -> np.ndarray:
        """Sorted sample indices of batch ``b`` of the epoch (0-based, counting skipped ones)."""
        if not 0 <= b < self.batches_per_epoch:
            raise LoaderError(f"batch {b} is outside [0, {self.batches_per_epoch})")
        return np.sort(self.order[b * self.batch_size : (b + 1) * self.batch_size])

    def __iter__(self) -> Iterator[Batch]:
        for b in range(self.start_batch, self.batches_per_epoch):
            yield gather(self.split, self.batch_indices(b))


def gather(split: SplitArrays, idx: np.ndarray) -> Batch:
    """Read the rows ``idx`` (ascending int64) of a split into a :class:`Batch`."""
    sparse = np.asarray(split.sparse[idx], dtype=np.int64)
    dense = None if split.dense is None else np.asarray(split.dense[idx], dtype=np.float32)
    labels = np.asarray(split.labels[idx], dtype=np.float32).reshape(-1, 1)
    return Batch(sparse=sparse, dense=dense, labels=labels, indices=idx)
