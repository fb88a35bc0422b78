"""A batch source read one batch ahead, for a table that makes rows resident ahead of their
step (``--rows-on host``: :meth:`hetgmp.embedding.DistributedEmbedding.prefetch` hands the
next batch's table ids -- multi-hot bags flattened -- to the host tier, which copies its
missed rows from host memory while the current batch trains; :mod:`hetgmp.embedding.tiered`).

The wrapped source yields the same ``(slot, batch)`` pairs in the same order; only the read of
batch t+1 moves before step t (its time counts as step t's data wait), and it never reads past
the run's last step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hetgmp.data.device_batches import DeviceBatch, PendingBatch, Slot
from hetgmp.data.pipeline import BatchSource
from hetgmp.models.ctr import CTRModel

Item = tuple[Slot, DeviceBatch | PendingBatch | None]


class Lookahead:
    """``source`` one batch ahead for ``steps`` more steps; ``tell(ids)`` gets each next
    batch's sparse ids before the current batch is returned (a batch gathered later, a
    ``PendingBatch``, or none: nothing to tell)."""

    def __init__(
        self, source: BatchSource, steps: int, tell: Callable[[torch.Tensor], None]
    ) -> None:
        self.source, self.left, self.tell = source, steps, tell
        self.name = source.name
        self._next: Item | None = None

    def next(self) -> Item:
        cur = self._next if self._next is not None else self.source.next()
        self.left -= 1
        self._next = self.source.next() if self.left > 0 else None
        if self._next is not None and isinstance(self._next[1], DeviceBatch):
            self.tell(self._next[1].sparse)
        return cur

    def close(self) -> None:
        self.source.close()


def read_ahead(
    source: BatchSource, model: CTRModel, steps: int, *, epoch_held: bool = False
) -> BatchSource:
    """``source`` read one batch ahead, ``model``'s table told each next batch, where the
    table makes rows resident ahead (a host tier); else ``source`` itself. The table is told
    the ids the model's lookup will hand it (``model.table_ids``: with multi-hot fields the
    bags flattened, padding taken out), as that very tensor: the tier matches a batch by
    identity, and a padding slot (-1) would make it refuse the batch ahead.

    ``epoch_held``: the several ranks' whole-step flow, whose epoch check holds every row of
    the epoch resident (:mod:`hetgmp.embedding.tier_epoch`): nothing to tell ahead, and the
    flow plans the next batch from the source's own position (reading it one batch ahead
    here made every step's planned batch the wrong one, so every step ran eagerly)."""
    embedding: Any = model.embedding  # (a DistributedEmbedding; nn.Module's attribute type)
    if getattr(embedding, "tier", None) is None:
        return source
    if epoch_held and getattr(embedding, "owned", None) is not None:
        return source
    prefetch, table_ids = embedding.prefetch, model.table_ids
    return Lookahead(source, steps, lambda ids: prefetch(table_ids(ids)))
