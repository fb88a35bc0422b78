"""A background thread that gathers a rank's batches a few steps ahead of the training thread.

On CUDA the thread gathers each batch from the memory-mapped split straight into pinned host
buffers (ids in their stored width), copies them to the device with ``non_blocking`` on a side
stream and waits for that copy itself, so the training thread only makes its stream wait for an
already-finished event and marks the tensors as used there (``record_stream``). On CPU the thread
hands over the gathered numpy batch (``torch.from_numpy`` shares its memory).

Errors in the thread are re-raised in the training thread by :meth:`ThreadSource.next`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from hetgmp.data.device_batches import DeviceBatch, EpochPlan, Slot, host_to_device
from hetgmp.data.loader import BatchLoader, gather

_DONE = object()  # the slots ran out


class _Failed:
    """The thread's exception, carried to the training thread."""

    def __init__(self, err: BaseException) -> None:
        self.err = err


class _Pinned:
    """Pinned host staging buffers for one batch, filled by ``np.take`` from the memmap."""

    def __init__(self, plan: EpochPlan) -> None:
        split, bs = plan.split, plan.batch_size
        self.sparse = torch.empty(
            (bs, split.sparse.shape[1]), dtype=_torch_dtype(split.sparse.dtype), pin_memory=True
        )
        self.dense = (
            None
            if split.dense is None
            else torch.empty((bs, split.dense.shape[1]), dtype=torch.float32, pin_memory=True)
        )
        self.labels = torch.empty((bs, 1), dtype=torch.float32, pin_memory=True)

    def fill(self, plan: EpochPlan, idx: np.ndarray) -> list[torch.Tensor]:
        """Gather rows ``idx`` into the buffers; returns the filled views."""
        n, split = idx.size, plan.split
        np.take(split.sparse, idx, axis=0, out=self.sparse.numpy()[:n])
        out = [self.sparse[:n]]
        if self.dense is not None and split.dense is not None:  # (one exists with the other)
            rows = self.dense.numpy()[:n]
            if split.dense.dtype == rows.dtype:
                np.take(split.dense, idx, axis=0, out=rows)
            else:
                rows[...] = split.dense[idx]  # another stored dtype: assignment casts
            out.append(self.dense[:n])
        self.labels.numpy()[:n] = np.asarray(split.labels[idx], dtype=np.float32).reshape(-1, 1)
        out.append(self.labels[:n])
        return out


def _torch_dtype(np_dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype=np_dtype)).dtype


class ThreadSource:
    """Yields the slots' batches, gathered by a daemon thread up to ``depth`` steps ahead."""

    name = "thread"

    def __init__(
        self, plan: EpochPlan, slots: Iterator[Slot], device: torch.device, *, depth: int
    ) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, got {depth}")
        self.plan = plan
        self.device = device
        self.cuda = device.type == "cuda"
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(slots,), name="hetgmp-prefetch", daemon=True
        )
        self._thread.start()

    # ---- the background thread -------------------------------------------------------------
    def _run(self, slots: Iterator[Slot]) -> None:
        try:
            self._produce(slots)
            self._put(_DONE)
        except BaseException as err:  # noqa: BLE001 - handed to the training thread
            self._put(_Failed(err))

    def _produce(self, slots: Iterator[Slot]) -> None:
        loader: BatchLoader | None = None
        pinned = stream = None
        if self.cuda:
            if self.device.index is not None:
                torch.cuda.set_device(self.device)  # the current device is per thread
            pinned, stream = _Pinned(self.plan), torch.cuda.Stream(self.device)
        for slot in slots:
            if self._stop.is_set():
                return
            if not slot.local:
                self._put((slot, None))
                continue
            if loader is None or loader.epoch != slot.epoch:
                loader = self.plan.loader(slot.epoch)
            idx = loader.batch_indices(slot.batch)
            if pinned is None or stream is None:  # (both set on CUDA)
                self._put((slot, gather(self.plan.split, idx)))
            else:
                self._put((slot, self._copy(pinned.fill(self.plan, idx), stream)))

    def _copy(self, host: list[torch.Tensor], stream: torch.cuda.Stream) -> Any:
        """Copy pinned views to the device on ``stream``; wait here, so the buffers are free."""
        with torch.cuda.stream(stream):
            dev = [t.to(self.device, non_blocking=True) for t in host]
            done = torch.cuda.Event()
            done.record(stream)
        done.synchronize()
        return dev, done

    def _put(self, item: Any) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    # ---- the training thread ---------------------------------------------------------------
    def next(self) -> tuple[Slot, DeviceBatch | None]:
        """The next step's slot and batch (``None``: this rank has nothing this step)."""
        item = self._queue.get()
        if item is _DONE:
            raise StopIteration
        if isinstance(item, _Failed):
            raise RuntimeError(f"the batch prefetch thread failed: {item.err}") from item.err
        slot, payload = item
        if payload is None:
            return slot, None
        if not self.cuda:
            return slot, host_to_device(payload, self.device)
        return slot, self._adopt(*payload)

    def _adopt(self, dev: list[torch.Tensor], done: torch.cuda.Event) -> DeviceBatch:
        """Tensors made on the side stream, used from now on on the current stream."""
        current = torch.cuda.current_stream(self.device)
        current.wait_event(done)
        for t in dev:
            t.record_stream(current)  # the allocator must not reuse them before current is done
        sparse, *rest = dev
        dense = rest[0] if len(rest) == 2 else None
        return DeviceBatch(sparse.long(), dense, rest[-1])

    def close(self) -> None:
        """Stop the thread (it may be blocked on a full queue) and wait for it."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get_nowait()
            except queue.Empty:
                self._thread.join(timeout=0.1)
