"""The batches a host tier was told are coming (:meth:`.tiered.TieredRows.expect`): their ids
on the host and, once staged, the residency move that makes their rows resident ahead of
their step.

Why a queue: the trainer hands the table batch t+1's ids before it trains batch t
(``DistributedEmbedding.prefetch``); the tier decides and issues t+1's copies at the end of
batch t's lookup (the rows batch t still needs are held then), and batch t+1's lookup only
waits for that move's event. A batch is matched by the identity of its ids tensor, as the other
engines' prefetch; a lookup of any other tensor drops the queue (an evaluation between steps:
its rows are made resident at once, beside the staged ones where there is room).

On CUDA the ids may be on the device: :meth:`AheadQueue.expect` copies them into pinned memory
on the tier's copy stream (after an event on the producing stream; ``record_stream`` keeps the
tensor alive for that copy) and the decision waits for that copy's event only, a copy enqueued
a whole step before it is needed. Untested here (no GPU on the machine this was written on).
"""

from __future__ import annotations

import dataclasses

import torch

from hetgmp.embedding.tier_move import Move

DEPTH = 2  # batches expected at most (the one being trained and the next)


@dataclasses.dataclass
class Expected:
    """A coming batch: ``ids`` (the caller's tensor), its ids on the host (``host``, filled by
    the copy behind ``ready`` on CUDA) and, once staged, its ``move`` and the cache ``slots``
    of its distinct rows (host int64)."""

    ids: torch.Tensor
    host: torch.Tensor
    ready: torch.cuda.Event | None = None
    state: str = "waiting"  # waiting | staged | skipped (made resident at its step instead)
    move: Move | None = None
    slots: torch.Tensor | None = None

    def host_ids(self) -> torch.Tensor:
        """The batch's ids, flat int64 on the host (waits for their copy on CUDA)."""
        if self.ready is not None:
            self.ready.synchronize()
            self.ready = None
        return self.host


class AheadQueue:
    """Expected batches, oldest first (at most :data:`DEPTH`). ``copy``: the tier's copy
    stream on CUDA (None: ids are read on the host at once)."""

    def __init__(self, copy: torch.cuda.Stream | None) -> None:
        self.copy = copy
        self.items: list[Expected] = []

    def expect(self, ids: torch.Tensor) -> None:
        """Queue ``ids``' batch (dropping the oldest beyond :data:`DEPTH`)."""
        if len(self.items) >= DEPTH:
            self.items.pop(0)
        flat = ids.reshape(-1)
        if flat.device.type != "cuda" or self.copy is None:
            self.items.append(Expected(ids, flat.to("cpu", torch.int64)))
            return
        made = torch.cuda.Event()
        made.record(torch.cuda.current_stream(flat.device))
        host = torch.empty(flat.numel(), dtype=torch.int64, pin_memory=True)
        with torch.cuda.stream(self.copy):
            self.copy.wait_event(made)
            flat.record_stream(self.copy)  # (freed by its owner meanwhile: kept for this copy)
            host.copy_(flat.to(torch.int64), non_blocking=True)  # (int32 widened there)
            ready = torch.cuda.Event()
            ready.record(self.copy)
        self.items.append(Expected(ids, host, ready))

    def take(self, ids: torch.Tensor) -> Expected | None:
        """The expected batch of this very tensor, removed from the queue with the batches
        expected before it (never looked up); None when it was not expected (an evaluation's
        batch): the queue stays."""
        for i, e in enumerate(self.items):
            if e.ids is ids:
                del self.items[: i + 1]
                return e
        return None

    def next_waiting(self) -> Expected | None:
        """The oldest batch not staged or skipped yet."""
        return next((e for e in self.items if e.state == "waiting"), None)

    def staged_slots(self) -> list[torch.Tensor]:
        """The cache slots of the staged batches (kept resident until their step)."""
        return [e.slots for e in self.items if e.state == "staged" and e.slots is not None]

    def clear(self) -> None:
        self.items.clear()
