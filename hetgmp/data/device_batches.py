"""A rank's training batches as device tensors, in :class:`BatchLoader`'s exact order.

The trainer asks for one batch per *global step* (``None`` once this rank's epoch has run out:
the distributed table needs every rank at every exchange). Three sources yield the same batches:

- :class:`ResidentSource`: the rank's samples live on the device (ids as int32 when the table
  has fewer than 2**31 rows, widened per batch); a batch is an ``index_select`` by the epoch's
  positions, uploaded once per epoch. No host work per step.
- :class:`~hetgmp.data.prefetch.ThreadSource`: a background thread gathers batches from the
  memory-mapped split (into pinned buffers and onto the device on a side CUDA stream) a few
  steps ahead.
- :class:`SyncSource`: the plain path: gather in the training thread, copy, train.

Every source follows :func:`step_slots`, so the order (shuffle by ``(seed, epoch)``), the
resume position and the last partial batch are those of :class:`BatchLoader`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Iterator

import numpy as np
import torch

from hetgmp.data.format import SplitArrays
from hetgmp.data.loader import Batch, BatchLoader, gather
from hetgmp.data.multi_hot_padded import PAD_ID

INT32_MAX = 2**31 - 1


@dataclasses.dataclass
class DeviceBatch:
    """One batch on the training device: int64 ids, float32 dense features and labels."""

    sparse: torch.Tensor  # int64 [B, F]
    dense: torch.Tensor | None  # float32 [B, num_dense]
    labels: torch.Tensor  # float32 [B, 1]

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclasses.dataclass
class PendingBatch:
    """A resident batch not gathered yet: its positions in the source's device arrays
    (:attr:`ResidentSource.deferred`). Why: a whole-step CUDA graph gathers it inside the graph
    from one copied position vector, instead of three gathers, a widening and three copies into
    its input buffers per step (:class:`~hetgmp.train.graphed.GraphedStep`)."""

    source: ResidentSource
    pos: torch.Tensor  # int64 [B]
    # the embedding's verdict (ResidentSource.epoch_check): the batch fits the capacities of
    # a multi-rank whole-step graph (hetgmp.train.graphed_multi); else it trains eagerly
    fits: bool = True

    def __len__(self) -> int:
        return int(self.pos.shape[0])

    @property
    def has_dense(self) -> bool:
        return self.source.dense is not None

    def gather(self, sparse: torch.Tensor | None = None) -> DeviceBatch:
        """The batch (``sparse``: its ids, gathered already)."""
        return self.source.gather(self.pos, sparse)


@dataclasses.dataclass(frozen=True)
class Slot:
    """What one global step reads: ``batch`` of ``epoch`` (``local`` False: this rank is done)."""

    step: int
    epoch: int
    batch: int
    local: bool


@dataclasses.dataclass(frozen=True)
class EpochPlan:
    """How one rank walks its samples: the :class:`BatchLoader` arguments shared by all epochs."""

    split: SplitArrays
    indices: np.ndarray  # this rank's sample indices
    batch_size: int
    shuffle: bool
    seed: int

    @property
    def local_batches(self) -> int:
        return -(-int(self.indices.size) // self.batch_size)

    def loader(self, epoch: int) -> BatchLoader:
        """The epoch's :class:`BatchLoader` (its order is the reference for every source)."""
        return BatchLoader(
            self.split,
            self.batch_size,
            indices=self.indices,
            shuffle=self.shuffle,
            seed=self.seed,
            epoch=epoch,
        )


def step_slots(
    plan: EpochPlan, *, step: int, epoch: int, batch: int, steps_per_epoch: int, total_steps: int
) -> Iterator[Slot]:
    """The slots of global steps ``step .. total_steps - 1``, starting at ``(epoch, batch)``.

    ``steps_per_epoch`` is the global count (the most batches any rank has); a rank with fewer
    gets ``local=False`` slots at the end of each epoch.
    """
    local = plan.local_batches
    while step < total_steps:
        for b in range(batch, steps_per_epoch):
            if step >= total_steps:
                return
            yield Slot(step, epoch, b, b < local)
            step += 1
        epoch, batch = epoch + 1, 0


def empty_batch(num_fields: int, num_dense: int, device: torch.device) -> DeviceBatch:
    """The zero-sample batch of a rank whose epoch has run out."""
    sparse = torch.zeros((0, num_fields), dtype=torch.long, device=device)
    dense = torch.zeros((0, num_dense), device=device) if num_dense else None
    return DeviceBatch(sparse, dense, torch.zeros((0, 1), device=device))


def host_to_device(batch: Batch, device: torch.device) -> DeviceBatch:
    """A host :class:`Batch` copied to ``device`` (no copy on CPU: the tensors share memory)."""
    sparse = torch.from_numpy(batch.sparse).to(device)
    dense = None if batch.dense is None else torch.from_numpy(batch.dense).to(device)
    return DeviceBatch(sparse, dense, torch.from_numpy(batch.labels).to(device))


class SyncSource:
    """Gathers each batch in the calling thread (the plain path)."""

    name = "sync"

    def __init__(self, plan: EpochPlan, slots: Iterator[Slot], device: torch.device) -> None:
        self.plan = plan
        self.slots = slots
        self.device = device
        self._loader: BatchLoader | None = None

    def next(self) -> tuple[Slot, DeviceBatch | None]:
        """The next step's slot and batch (``None``: this rank has nothing this step)."""
        slot = next(self.slots)
        if not slot.local:
            return slot, None
        if self._loader is None or self._loader.epoch != slot.epoch:
            self._loader = self.plan.loader(slot.epoch)
        return slot, host_to_device(
            gather(self.plan.split, self._loader.batch_indices(slot.batch)), self.device
        )

    def close(self) -> None:
        """Nothing to release."""


def resident_bytes(split: SplitArrays, num_samples: int, ids_int32: bool) -> int:
    """Device bytes :class:`ResidentSource` needs for ``num_samples`` samples (plus the epoch's
    positions, the stored sample indices and, while an epoch starts, its order and sort)."""
    fields = int(split.sparse.shape[1])
    dense = 0 if split.dense is None else int(split.dense.shape[1])
    return num_samples * (fields * (4 if ids_int32 else 8) + 4 * dense + 4 + 8 * 4)


def epoch_positions(loader: BatchLoader, stored: np.ndarray) -> np.ndarray:
    """Positions in ``stored`` (sorted unique sample indices) of the epoch's samples, batch by
    batch, each batch ascending: the order :meth:`BatchLoader.batch_indices` gives. (The
    reference of :func:`device_epoch_positions`.)"""
    pos = np.searchsorted(stored, loader.order)
    bs = loader.batch_size
    full = pos.size // bs * bs
    head = np.sort(pos[:full].reshape(-1, bs), axis=1).ravel()
    return np.concatenate([head, np.sort(pos[full:])])


def device_epoch_positions(
    order: np.ndarray, stored: torch.Tensor | int, batch_size: int, device: torch.device
) -> torch.Tensor:
    """:func:`epoch_positions` of the epoch whose sample order is ``order``, computed on
    ``device``: ``stored`` the sorted stored sample indices as a device tensor, or the first one
    when they are a contiguous range. Why: on the host, the search and the per-batch sorts of
    Criteo Kaggle's 45.8M samples take seconds, as long as an epoch of training on one GPU."""
    o = torch.from_numpy(order).to(device, non_blocking=False)
    pos = o - stored if isinstance(stored, int) else torch.searchsorted(stored, o)
    full = pos.numel() // batch_size * batch_size
    head = pos[:full].view(-1, batch_size).sort(dim=1).values.view(-1)
    return torch.cat([head, pos[full:].sort().values])


class ResidentSource:
    """The rank's samples held on the device; batches are ``index_select`` by position."""

    name = "resident"
    CHUNK = 1 << 18  # samples read from the memmap at a time (bounds host memory)
    # next() hands out PendingBatch instead of gathering (set by a consumer that gathers itself)
    deferred = False
    # called at each epoch start (collective: every rank starts each epoch at the same global
    # step) with the samples, the epoch's positions and the batch size; says per batch whether
    # it fits (PendingBatch.fits)
    epoch_check: Callable[[torch.Tensor, torch.Tensor, int], list[bool]] | None = None

    def __init__(
        self,
        plan: EpochPlan,
        slots: Iterator[Slot],
        device: torch.device,
        *,
        ids_int32: bool,
        num_rows: int | None = None,
        pad_from: int | None = None,
    ) -> None:
        self.plan = plan
        self.slots = slots
        self.device = device
        self.stored = np.unique(plan.indices.astype(np.int64, copy=False))
        id_dtype = torch.int32 if ids_int32 else torch.int64
        self.num_rows = num_rows  # (ids are checked against it as they are loaded)
        # multi-hot bags padded into the ids (hetgmp.data.multi_hot_padded): the columns from
        # pad_from on may hold PAD_ID, which the model's pooled lookup takes out
        self.pad_from = pad_from
        self.sparse = self._upload(plan.split.sparse, id_dtype, ids=True)
        self._fits: list[bool] = []
        split = plan.split
        self.dense = None if split.dense is None else self._upload(split.dense, torch.float32)
        self.labels = self._upload(split.labels, torch.float32).reshape(-1, 1)
        self._epoch = -1
        self.last_slot: Slot | None = None  # (the last next()'s: see peek)
        self._positions = torch.zeros(0, dtype=torch.long, device=device)
        lo, n = (int(self.stored[0]), self.stored.size) if self.stored.size else (0, 0)
        contiguous = n == 0 or int(self.stored[-1]) == lo + n - 1  # (one rank: all samples)
        self._stored: torch.Tensor | int = (
            lo if contiguous else torch.from_numpy(self.stored).to(device)
        )
        # the next epoch's shuffle (a host permutation), drawn by a thread while this one trains
        self._ahead: tuple[int, concurrent.futures.Future[np.ndarray]] | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hetgmp-epoch")

    def _upload(self, array: np.ndarray, dtype: torch.dtype, *, ids: bool = False) -> torch.Tensor:
        """Rows ``self.stored`` of ``array`` as one device tensor, read chunk by chunk (ids
        checked against the table's rows: a whole-step graph does not stop for a bad id)."""
        n = self.stored.size
        shape = (n, *array.shape[1:])
        out = torch.empty(shape, dtype=dtype, device=self.device)
        for lo in range(0, n, self.CHUNK):
            rows = np.asarray(array[self.stored[lo : lo + self.CHUNK]])
            if ids and rows.size:
                self._check_ids(array, rows, lo)
            low = PAD_ID if ids and self.pad_from is not None else 0
            if dtype == torch.int32 and rows.size and (rows.min() < low or rows.max() > INT32_MAX):
                raise ValueError("ids outside int32 in a table said to fit int32")
            out[lo : lo + rows.shape[0]].copy_(torch.from_numpy(rows).to(dtype))
        return out

    def _check_ids(self, array: np.ndarray, rows: np.ndarray, lo: int) -> None:
        """Raise, naming the file, the sample and the field, if an id is outside the table."""
        hi = self.num_rows
        bad = (rows < 0) if hi is None else ((rows < 0) | (rows >= hi))
        if self.pad_from is not None:  # (a bag's padding slots)
            bad[:, self.pad_from :] &= rows[:, self.pad_from :] != PAD_ID
        if not bad.any():
            return
        r, f = (int(v) for v in np.argwhere(bad)[0])
        where = getattr(array, "filename", None) or "the sparse features"
        raise ValueError(
            f"{where}: sample {int(self.stored[lo + r])}, field {f}: id {int(rows[r, f])} is "
            f"outside the table's [0, {hi}) rows (was the data set preprocessed for another "
            "table?)"
        )

    @property
    def nbytes(self) -> int:
        ts = [self.sparse, self.labels] + ([] if self.dense is None else [self.dense])
        return sum(t.numel() * t.element_size() for t in ts)

    def next(self) -> tuple[Slot, DeviceBatch | PendingBatch | None]:
        """The next step's slot and batch (``None``: this rank has nothing this step)."""
        slot = self.last_slot = next(self.slots)
        if slot.epoch != self._epoch:  # (every rank: the epoch check is collective)
            self._start_epoch(slot.epoch)
        if not slot.local:
            return slot, None
        bs = self.plan.batch_size
        pos = self._positions[slot.batch * bs : (slot.batch + 1) * bs]
        if not self.deferred:
            return slot, self.gather(pos)
        fits = self._fits[slot.batch] if slot.batch < len(self._fits) else True
        return slot, PendingBatch(self, pos, fits)

    def peek(self) -> PendingBatch | None:
        """The batch after the last one :meth:`next` handed out, in the same epoch, without
        taking it (None: the epoch ends first, or batches are not deferred)."""
        slot = self.last_slot
        if slot is None or not (self.deferred and slot.local and slot.epoch == self._epoch):
            return None
        bs, b = self.plan.batch_size, slot.batch + 1
        pos = self._positions[b * bs : (b + 1) * bs]
        if pos.numel() == 0:
            return None
        return PendingBatch(self, pos, self._fits[b] if b < len(self._fits) else True)

    def gather_ids(self, pos: torch.Tensor) -> torch.Tensor:
        """The ids of the samples at positions ``pos`` (int64 ``[B, F]``)."""
        return self.sparse.index_select(0, pos).long()

    def gather(self, pos: torch.Tensor, sparse: torch.Tensor | None = None) -> DeviceBatch:
        """The samples at positions ``pos`` (int64 ``[B]``) as a batch (``sparse``: their ids,
        gathered already)."""
        if sparse is None:
            sparse = self.gather_ids(pos)
        dense = None if self.dense is None else self.dense.index_select(0, pos)
        return DeviceBatch(sparse, dense, self.labels.index_select(0, pos))

    def _start_epoch(self, epoch: int) -> None:
        """This epoch's positions (its order from the thread when it drew it ahead), and the
        next epoch's order drawn in the background."""
        ahead = self._ahead
        if ahead is not None and ahead[0] == epoch:
            order = ahead[1].result()
        else:
            order = self.plan.loader(epoch).order
        self._positions = device_epoch_positions(
            order, self._stored, self.plan.batch_size, self.device
        )
        self._epoch = epoch
        if self.epoch_check is not None:
            self._fits = self.epoch_check(self.sparse, self._positions, self.plan.batch_size)
        plan = self.plan
        self._ahead = (epoch + 1, self._pool.submit(lambda: plan.loader(epoch + 1).order))

    def close(self) -> None:
        """Drop the device copies (the memory returns to the caching allocator) and stop the
        thread (a shuffle it is drawing is not waited for)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._ahead = None
        self.sparse = self.labels = self._positions = torch.zeros(0)
        self._stored = 0
        self.dense = None
