"""The next batch's dense features and labels gathered by the step before it, while the next
batch's rows are exchanged early (:mod:`hetgmp.embedding.padded.ahead`, ``EXCHANGE_EARLY``).

Why: a rank of several runs its step as one CUDA graph, and the graph that takes the rows
exchanged early started with the gathers of its batch's samples (dense features, labels:
three gather kernels and copies, ~35 us of a ~850 us step on 2 H100s at batch 8192,
2026-11-26) on the critical path, right after the exchange ended. Gathered by the previous
step on the main stream, they run while that step's exchange (a chain of small kernels and
two all-to-alls on a side stream) keeps the GPU mostly idle.

The gathers write fixed buffers, one pair per preparation ring slot of the next batch, so a
graph that takes them reads the same addresses at every replay whichever step (a graph or an
eager step) filled them. A step fills its next batch's buffers exactly when it primes that
batch (:class:`hetgmp.embedding.padded.ahead.Primed`), and a graph takes them exactly when it
takes that primed batch: the two decisions are the multi-rank graphed step's own.
"""

from __future__ import annotations

from typing import Any

import torch

from hetgmp.data.device_batches import DeviceBatch, ResidentSource

# The next batch's gathers on a side stream that waits only for the step's start (in a
# captured step; eagerly they stay in order), not at the end of the step's main stream: there
# they sat behind the dense Adam on the path the next step waits for, which the exchange's
# chain and the dense all-reduce + Adam share (2 H100s, batch 8192: leaving both out took the
# 2-GPU step from 1.73x to 1.93x one GPU, either alone 1.76x / 1.69x, 2026-11-27,
# bench/results/gpu/ablations_tail/; the gathers were ~20 us of that path's tail).
FILL_BESIDE = True


def exact_primed(ahead: Any, early: bool) -> Any:
    """The primed next batch of ``ahead`` (a :class:`~hetgmp.embedding.padded.ahead.ReadAhead`)
    when its rows were exchanged early (``early``: the step does), else None."""
    p = ahead.primed
    return p if early and p is not None and p.exact else None


class InputsAhead:
    """Fixed buffers for a next batch's dense features and labels, per ring slot; with
    multi-hot ``bags`` (a :class:`~hetgmp.models.pooling.BagLayout`) its ids too, pinned to
    the plan's table ids (the ring slot's buffer) so that its lookup hands the table that very
    tensor: the plan made ahead is matched by it."""

    def __init__(self, slots: int, bags: Any = None) -> None:
        self.slots = slots  # (the preparation ring's: buffers for all of them at once)
        self.bags = bags
        self._bufs: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
        self._ids: dict[int, torch.Tensor] = {}  # (bags: each slot's batch ids)
        self._side: torch.cuda.Stream | None = None  # (FILL_BESIDE's stream)

    def mark_start(self, device: torch.device) -> torch.cuda.Event | None:
        """The start of a step being captured (an event on the capture stream) that the next
        batch's gathers then wait for alone (:data:`FILL_BESIDE`); None eagerly."""
        if not (FILL_BESIDE and device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            return None
        if self._side is None:
            self._side = torch.cuda.Stream(device)  # (the default priority: the lowest)
        start = torch.cuda.Event()
        start.record()
        return start

    def fill_next(
        self, primed: Any, source: ResidentSource, pos: torch.Tensor,
        start: torch.cuda.Event | None = None,
    ) -> None:  # fmt: skip
        """After a step that exchanged the next batch early (``primed``, a
        :class:`~hetgmp.embedding.padded.ahead.Primed`; None: no such exchange, nothing to
        do): the next batch's samples at ``pos`` into its ring slot's buffers; with ``start``
        (:meth:`mark_start`) on a side stream after it, joined back (the slot is not the
        step's own: nothing of the step reads or writes it)."""
        if primed is None:
            return
        if start is None or self._side is None:
            self.fill(source, pos, primed.prep.ring)
            return
        self._side.wait_event(start)
        with torch.cuda.stream(self._side):
            self.fill(source, pos, primed.prep.ring)
        torch.cuda.current_stream().wait_stream(self._side)

    def take(
        self, primed: Any, source: ResidentSource, pos: torch.Tensor, ids: torch.Tensor | None
    ) -> DeviceBatch:
        """A step's batch: from the buffers the last step filled when the step takes rows it
        exchanged early (``primed``, and ``ids`` its plan's), else gathered now."""
        if ids is not None and primed is not None and self.has(primed.prep.ring):
            return self.batch(primed.prep.ring, self.batch_ids(primed.prep.ring, ids))
        return source.gather(pos, ids if self.bags is None else None)

    def batch_ids(self, slot: int, table_ids: torch.Tensor) -> torch.Tensor:
        """The ids of ring slot ``slot``'s batch whose plan holds ``table_ids``: those very
        ids, or with bags the slot's ids buffer, pinned to them."""
        if self.bags is None:
            return table_ids
        ids = self._ids[slot]
        self.bags.pin(ids, table_ids)
        return ids

    def fill(self, source: ResidentSource, pos: torch.Tensor, slot: int) -> None:
        """Gather the samples at positions ``pos`` into ring slot ``slot``'s buffers (every
        slot's made at the first fill, which must not be inside a graph capture: the first
        step that primes a batch is an eager one)."""
        dense, labels = self._buffers(source, int(pos.shape[0]), slot)
        if dense is not None:
            assert source.dense is not None
            torch.index_select(source.dense, 0, pos, out=dense)
        torch.index_select(source.labels, 0, pos, out=labels)
        if self.bags is not None:
            torch.index_select(source.sparse, 0, pos, out=self._ids[slot])

    def batch(self, slot: int, ids: torch.Tensor) -> DeviceBatch:
        """The batch of ring slot ``slot`` (filled by the step that primed it) with ``ids``."""
        dense, labels = self._bufs[slot]
        return DeviceBatch(ids, dense, labels)

    def has(self, slot: int) -> bool:
        return slot in self._bufs

    def _buffers(
        self, source: ResidentSource, n: int, slot: int
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        got = self._bufs.get(slot)
        if got is not None and got[1].shape[0] == n:
            return got
        dev = source.labels.device
        if dev.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("InputsAhead: buffers must be made before a graph captures")
        for s in range(self.slots):
            dense = None
            if source.dense is not None:
                dense = source.dense.new_empty((n, *source.dense.shape[1:]))
            self._bufs[s] = (dense, source.labels.new_empty((n, *source.labels.shape[1:])))
            if self.bags is not None:
                self._ids[s] = source.sparse.new_empty((n, *source.sparse.shape[1:]))
        return self._bufs[slot]
