"""Which batch a multi-rank graphed step primes, and whether a step may take what the last one
primed (:class:`~hetgmp.train.graphed_multi.MultiRankGraphedStep`): the host's decisions about
planning or exchanging the next batch one step ahead (:mod:`hetgmp.embedding.padded.ahead`).

Every rank decides alike (full batches everywhere, the same warm-up and boundaries), so the
ranks replay the same graphs. ``step`` below is the ``MultiRankGraphedStep`` (typed ``Any``:
that module imports this one).
"""

from __future__ import annotations

from typing import Any

import torch

from hetgmp.data.device_batches import DeviceBatch, PendingBatch
from hetgmp.embedding.padded.ahead import Primed
from hetgmp.train.accounting import global_batch_sizes
from hetgmp.train.profile import NoMarks, PhaseProfiler


def next_batch(
    step: Any, batch: DeviceBatch | PendingBatch, global_batch: int,
    marks: NoMarks | PhaseProfiler | None,
) -> PendingBatch | None:  # fmt: skip
    """The next batch when this step may read it ahead (every rank decides the same: full
    batches everywhere, by the ranks' counts; past the warm-up; not profiled), else None."""
    if not step.plans_ahead or not isinstance(batch, PendingBatch) or step.warmup > 0:
        return None
    pad = step.whole.padded  # (capacities about to grow: this step rebuilds the buffers)
    if pad.static is None or pad.frozen is None or pad.static.cap != pad.frozen:
        return None
    if isinstance(marks, PhaseProfiler) and marks.active:
        return None
    slot, full = batch.source.last_slot, step.batch_size * step.env.world_size
    if slot is None or global_batch != full or slot.batch + 1 >= step.steps_per_epoch:
        return None
    if step.boundary is not None and step.boundary(slot.step + 1):
        return None
    if step.tier_windows is not None and step.tier_windows.starts_window(slot.batch + 1):
        return None  # (its rows are held at its own step: nothing may plan it before)
    if global_batch_sizes(step.counts or [], step.batch_size, slot.batch + 1) != full:
        return None
    nxt = batch.source.peek()
    return nxt if nxt is not None and nxt.fits and len(nxt) == step.batch_size else None


def key_of(nxt: PendingBatch | None) -> tuple[int, int] | None:
    """What identifies a primed batch: its positions' address and its epoch."""
    if nxt is None or nxt.source.last_slot is None:
        return None
    return (nxt.pos.data_ptr(), nxt.source.last_slot.epoch)


def primed_for(step: Any, batch: DeviceBatch | PendingBatch, slot: int) -> bool:
    """Whether the last step left this batch planned or exchanged, usable by a graph that
    takes it (nothing ran since, the ring slot the graph expects)."""
    p, grads = step.ahead.primed, step.whole.stepper.grads
    if not isinstance(batch, PendingBatch):
        return False
    last = batch.source.last_slot
    return (
        p is not None and still_primed(step, p, grads)
        # (not buffers since rebuilt)
        and (p.batch is None or p.batch.static is step.whole.padded.static)
        and p.prep.ring == slot and last is not None
        and step._primed_for == (batch.pos.data_ptr(), last.epoch)
    )  # fmt: skip


def exact_ids(step: Any, batch: PendingBatch) -> torch.Tensor | None:
    """The ids tensor of the rows the last step exchanged early for ``batch`` (an eager step
    gathers into it and takes them), else None."""
    p, last = step.ahead.primed, batch.source.last_slot
    if p is None or not p.exact or last is None:
        return None
    if step._primed_for != (batch.pos.data_ptr(), last.epoch):
        return None
    if step.bags is not None and not step.inputs.has(p.prep.ring):
        return None
    return step.inputs.batch_ids(p.prep.ring, p.prep.ids)


def still_primed(step: Any, p: Primed, grads: Any) -> bool:
    """Whether nothing changed the table since ``p`` was primed: the pending gradient is the
    one it was primed after (no step ran since an early exchange, for an exact one)."""
    if p.exact:
        return grads is None and step.ahead.primed_at == step.whole.stepper.count
    return grads is not None and p.after is grads[0]
