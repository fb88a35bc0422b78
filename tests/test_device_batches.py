"""The device batch sources yield exactly :class:`BatchLoader`'s batches, step by step.

Every source (resident on the device, background thread, plain) against the reference built
from ``BatchLoader``: shuffled or not, a rank's non-contiguous sample subset, global epochs
longer than the rank's (empty slots), resume in the middle of an epoch, the last partial batch,
several epochs. CUDA variants run on the GPU machine only.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from hetgmp.data.device_batches import (
    EpochPlan,
    PendingBatch,
    ResidentSource,
    SyncSource,
    epoch_positions,
    step_slots,
)
from hetgmp.data.loader import BatchLoader
from hetgmp.data.pipeline import PipelineOptions, open_source
from hetgmp.data.prefetch import ThreadSource

# "deferred": resident batches handed out as positions (PendingBatch, what the whole-step CUDA
# graph takes) and gathered only after the whole run was drawn, across epoch changes
SOURCES = ["sync", "resident32", "resident64", "resident32deferred", "thread1", "thread3"]


def _source(kind: str, plan: EpochPlan, slots, device: torch.device):
    if kind == "sync":
        return SyncSource(plan, slots, device)
    if kind.startswith("resident"):
        src = ResidentSource(plan, slots, device, ids_int32="32" in kind)
        src.deferred = kind.endswith("deferred")
        return src
    return ThreadSource(plan, slots, device, depth=int(kind[-1]))


def _reference(plan: EpochPlan, start: tuple[int, int, int], spe: int, total: int) -> list:
    """(step, epoch, batch, Batch or None) from BatchLoader, the order every source must follow."""
    step, epoch, b0 = start
    out = []
    while step < total:
        loader = BatchLoader(
            plan.split,
            plan.batch_size,
            indices=plan.indices,
            shuffle=plan.shuffle,
            seed=plan.seed,
            epoch=epoch,
            start_batch=min(b0, plan.local_batches),
        )
        it = iter(loader)
        for b in range(b0, spe):
            if step >= total:
                break
            out.append((step, epoch, b, next(it, None)))
            step += 1
        epoch, b0 = epoch + 1, 0
    return out


def _drain(kind: str, plan: EpochPlan, start, spe: int, total: int, device) -> list:
    step, epoch, b = start
    slots = step_slots(
        plan, step=step, epoch=epoch, batch=b, steps_per_epoch=spe, total_steps=total
    )
    src = _source(kind, plan, slots, device)
    try:
        got = [src.next() for _ in range(total - step)]
        return [(s, b.gather() if isinstance(b, PendingBatch) else b) for s, b in got]
    finally:
        src.close()


def _check_same(got: list, ref: list) -> None:
    assert len(got) == len(ref)
    for (slot, batch), (step, epoch, b, want) in zip(got, ref, strict=True):
        assert (slot.step, slot.epoch, slot.batch) == (step, epoch, b)
        assert (batch is None) == (want is None) and slot.local == (want is not None)
        if want is None:
            continue
        assert batch.sparse.dtype == torch.int64 and batch.labels.dtype == torch.float32
        np.testing.assert_array_equal(batch.sparse.cpu().numpy(), want.sparse)
        np.testing.assert_array_equal(batch.dense.cpu().numpy(), want.dense)
        np.testing.assert_array_equal(batch.labels.cpu().numpy(), want.labels)


def _subset(n: int) -> np.ndarray:
    """A plan-like rank shard: ascending, non-contiguous."""
    return np.flatnonzero(np.random.default_rng(4).random(n) < 0.6).astype(np.int64)


@pytest.mark.parametrize("kind", SOURCES)
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("batch_size", [7, 64, 400])
def test_sources_follow_batchloader(
    tiny_dataset, kind: str, shuffle: bool, batch_size: int
) -> None:
    idx = _subset(len(tiny_dataset.train))
    plan = EpochPlan(tiny_dataset.train, idx, batch_size, shuffle, seed=3)
    spe = plan.local_batches + 2  # another rank has more batches: this one gets empty slots
    total = 2 * spe + 3  # into a third epoch
    ref = _reference(plan, (0, 0, 0), spe, total)
    _check_same(_drain(kind, plan, (0, 0, 0), spe, total, torch.device("cpu")), ref)


@pytest.mark.parametrize("kind", SOURCES)
def test_resume_mid_epoch_and_last_partial_batch(tiny_dataset, kind: str) -> None:
    idx = _subset(len(tiny_dataset.train))
    plan = EpochPlan(tiny_dataset.train, idx, 30, True, seed=9)
    spe = plan.local_batches
    assert idx.size % 30 != 0  # the epoch ends in a partial batch
    total = 3 * spe
    full = _reference(plan, (0, 0, 0), spe, total)
    start = (spe + 4, 1, 4)  # step spe + 4 = epoch 1, batch 4
    ref = _reference(plan, start, spe, total)
    assert [r[:3] for r in ref] == [r[:3] for r in full[spe + 4 :]]
    got = _drain(kind, plan, start, spe, total, torch.device("cpu"))
    _check_same(got, ref)
    last = [b for s, b in got if s.batch == spe - 1][0]
    assert len(last) == idx.size % 30


def test_epoch_positions_are_the_loader_batches(tiny_dataset) -> None:
    idx = _subset(len(tiny_dataset.train))
    loader = BatchLoader(tiny_dataset.train, 16, indices=idx, shuffle=True, seed=1, epoch=5)
    pos = epoch_positions(loader, idx)
    for b in range(loader.batches_per_epoch):
        np.testing.assert_array_equal(idx[pos[b * 16 : (b + 1) * 16]], loader.batch_indices(b))


@pytest.mark.parametrize("contiguous", [True, False])
def test_device_epoch_positions_equal_the_host_reference(tiny_dataset, contiguous) -> None:
    from hetgmp.data.device_batches import device_epoch_positions

    n = len(tiny_dataset.train)
    idx = np.arange(7, n - 3) if contiguous else _subset(n)
    for bs, epoch in ((16, 0), (29, 3), (len(idx) + 5, 1)):  # (a tail; one short batch only)
        loader = BatchLoader(tiny_dataset.train, bs, indices=idx, shuffle=True, seed=2, epoch=epoch)
        stored = int(idx[0]) if contiguous else torch.from_numpy(idx)
        got = device_epoch_positions(loader.order, stored, bs, torch.device("cpu"))
        np.testing.assert_array_equal(got.numpy(), epoch_positions(loader, idx))


def test_thread_errors_reach_the_training_thread(tiny_dataset) -> None:
    @dataclasses.dataclass(frozen=True)
    class Broken(EpochPlan):
        def loader(self, epoch: int) -> BatchLoader:
            raise OSError(f"disk gone in epoch {epoch}")

    plan = Broken(tiny_dataset.train, np.arange(100), 10, True, 0)
    slots = step_slots(plan, step=0, epoch=0, batch=0, steps_per_epoch=10, total_steps=10)
    src = ThreadSource(plan, slots, torch.device("cpu"), depth=2)
    with pytest.raises(RuntimeError, match="prefetch thread failed: disk gone in epoch 0"):
        src.next()
    src.close()


def test_close_stops_a_thread_blocked_on_a_full_queue(tiny_dataset) -> None:
    plan = EpochPlan(tiny_dataset.train, np.arange(400), 8, True, 0)
    slots = step_slots(plan, step=0, epoch=0, batch=0, steps_per_epoch=50, total_steps=10**6)
    src = ThreadSource(plan, slots, torch.device("cpu"), depth=1)
    src.next()
    src.close()
    assert not src._thread.is_alive()


@pytest.mark.parametrize(
    ("mode", "prefetch", "name"),
    [("on", 0, "resident"), ("off", 0, "sync"), ("off", 2, "thread"), ("auto", 0, "sync")],
)
def test_pipeline_choice(tiny_dataset, mode: str, prefetch: int, name: str) -> None:
    plan = EpochPlan(tiny_dataset.train, np.arange(400), 64, True, 0)
    slots = step_slots(plan, step=0, epoch=0, batch=0, steps_per_epoch=7, total_steps=7)
    src, why = open_source(
        plan, slots, torch.device("cpu"), PipelineOptions(mode, 0.0, prefetch), num_rows=70
    )
    try:
        assert src.name == name and why
        if name == "resident":
            assert src.sparse.dtype == torch.int32  # 70 rows: ids fit int32
    finally:
        src.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (pinned/side-stream path)")
@pytest.mark.parametrize("kind", SOURCES)
def test_cuda_sources_follow_batchloader(tiny_dataset, kind: str) -> None:
    idx = _subset(len(tiny_dataset.train))
    plan = EpochPlan(tiny_dataset.train, idx, 16, True, seed=2)
    spe = plan.local_batches + 1
    total = 2 * spe + 1
    got = _drain(kind, plan, (0, 0, 0), spe, total, torch.device("cuda"))
    assert all(b is None or b.sparse.is_cuda for _, b in got)
    _check_same(got, _reference(plan, (0, 0, 0), spe, total))
