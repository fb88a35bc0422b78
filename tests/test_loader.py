"""Per-rank loaders: coverage, deterministic shuffling, resume, rank splits, bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

from hetgmp.data.loader import BatchLoader, LoaderError, rank_sample_indices
from hetgmp.partition.plan import Plan, PlanError


def _epoch(loader: BatchLoader) -> list:
    return list(loader)


def test_batches_hold_the_right_rows(tiny_dataset) -> None:
    split = tiny_dataset.train
    for b in BatchLoader(split, 64, shuffle=True, seed=3):
        assert b.sparse.dtype == np.int64 and b.sparse.shape == (len(b), 3)
        assert b.dense is not None and b.dense.dtype == np.float32
        assert b.labels.shape == (len(b), 1) and b.labels.dtype == np.float32
        assert np.all(np.diff(b.indices) > 0), "gathers must be sorted"
        np.testing.assert_array_equal(b.sparse, np.asarray(split.sparse)[b.indices])
        np.testing.assert_array_equal(b.dense, np.asarray(split.dense)[b.indices])
        np.testing.assert_array_equal(b.labels, np.asarray(split.labels)[b.indices])


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("batch_size", [1, 7, 64, 400, 1000])
def test_every_index_exactly_once(tiny_dataset, shuffle: bool, batch_size: int) -> None:
    loader = BatchLoader(tiny_dataset.train, batch_size, shuffle=shuffle, seed=1, epoch=2)
    batches = _epoch(loader)
    assert len(batches) == len(loader) == -(-400 // batch_size)
    seen = np.concatenate([b.indices for b in batches])
    np.testing.assert_array_equal(np.sort(seen), np.arange(400))
    assert all(len(b) == batch_size for b in batches[:-1])


def test_unshuffled_order_is_sequential(tiny_dataset) -> None:
    seen = np.concatenate([b.indices for b in BatchLoader(tiny_dataset.train, 30)])
    np.testing.assert_array_equal(seen, np.arange(400))


def test_shuffle_is_a_function_of_seed_and_epoch(tiny_dataset) -> None:
    def order(seed: int, epoch: int) -> list[np.ndarray]:
        return [
            b.indices
            for b in BatchLoader(tiny_dataset.train, 50, shuffle=True, seed=seed, epoch=epoch)
        ]

    a, b = order(5, 1), order(5, 1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    for other in (order(5, 2), order(6, 1)):
        assert not all(np.array_equal(x, y) for x, y in zip(a, other, strict=True))
    # Shuffled batches are not simply consecutive ranges.
    assert not np.array_equal(np.concatenate(a), np.arange(400))


def test_start_batch_resumes_the_same_epoch(tiny_dataset) -> None:
    full = BatchLoader(tiny_dataset.train, 33, shuffle=True, seed=9, epoch=4)
    resumed = BatchLoader(tiny_dataset.train, 33, shuffle=True, seed=9, epoch=4, start_batch=5)
    assert len(resumed) == len(full) - 5
    tail = _epoch(resumed)
    head = _epoch(full)[5:]
    assert len(tail) == len(head)
    for x, y in zip(tail, head, strict=True):
        np.testing.assert_array_equal(x.indices, y.indices)
        np.testing.assert_array_equal(x.sparse, y.sparse)
    assert len(_epoch(BatchLoader(tiny_dataset.train, 33, start_batch=len(full)))) == 0


def test_drop_last(tiny_dataset) -> None:
    loader = BatchLoader(tiny_dataset.train, 64, drop_last=True)
    batches = _epoch(loader)
    assert len(batches) == len(loader) == 6 and all(len(b) == 64 for b in batches)


def test_indices_restrict_the_loader(tiny_dataset) -> None:
    idx = np.array([399, 5, 17, 200, 3], dtype=np.int32)
    seen = np.concatenate([b.indices for b in BatchLoader(tiny_dataset.train, 2, indices=idx)])
    np.testing.assert_array_equal(np.sort(seen), np.sort(idx))
    empty = BatchLoader(tiny_dataset.train, 8, indices=np.zeros(0, dtype=np.int64))
    assert len(empty) == 0 and _epoch(empty) == []


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_contiguous_rank_split_covers_all_once(world: int) -> None:
    n = 1001
    parts = [rank_sample_indices(n, r, world, None) for r in range(world)]
    allidx = np.concatenate(parts)
    np.testing.assert_array_equal(allidx, np.arange(n))
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert all(np.all(np.diff(p) == 1) for p in parts if p.size > 1)


@pytest.mark.parametrize("world", [2, 4])
def test_plan_rank_split_covers_all_once(world: int) -> None:
    rng = np.random.default_rng(world)
    n = 500
    dp = rng.integers(0, world, n).astype(np.int32)
    plan = Plan(dp, np.zeros(10, dtype=np.int32), [np.zeros(0, np.int64)] * world)
    parts = [rank_sample_indices(n, r, world, plan) for r in range(world)]
    for r, p in enumerate(parts):
        assert p.dtype == np.int64
        assert np.all(dp[p] == r)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(n))


def test_plan_mismatch_is_refused() -> None:
    plan = Plan(np.zeros(10, np.int32), np.zeros(4, np.int32), [np.zeros(0, np.int64)] * 2)
    with pytest.raises(PlanError, match="2 workers but 3"):
        rank_sample_indices(10, 0, 3, plan)
    with pytest.raises(PlanError, match="10 training samples"):
        rank_sample_indices(11, 0, 2, plan)


def test_bad_arguments_are_named(tiny_dataset) -> None:
    split = tiny_dataset.train
    with pytest.raises(LoaderError, match="batch_size"):
        BatchLoader(split, 0)
    with pytest.raises(LoaderError, match=r"\[0, 400\)"):
        BatchLoader(split, 4, indices=np.array([0, 400]))
    with pytest.raises(LoaderError, match="1-D"):
        BatchLoader(split, 4, indices=np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(LoaderError, match="integers"):
        BatchLoader(split, 4, indices=np.array([0.5, 1.0]))
    with pytest.raises(LoaderError, match="start_batch"):
        BatchLoader(split, 100, start_batch=5)
    with pytest.raises(LoaderError, match="rank 2"):
        rank_sample_indices(10, 2, 2)
    assert isinstance(LoaderError("x"), ValueError)
