"""The epoch-start scan of a multi-rank whole step (:meth:`.whole.WholeStep.epoch_fits`): per
batch of the epoch, ``[largest number of distinct rows this rank queries from one peer (rows
owned elsewhere: mirrors and rows not stored here), distinct rows, largest number of rows not
stored here of one peer, rows the batch holds more than --bound times]``.

Two ways, the same counts (``tests/test_epoch_scan.py``):

* :func:`epoch_maxima_reference`: torch ops, ``torch.unique`` over ``(batch, row)`` keys,
  2^25 at a time: it sorts every id of the epoch, ~595M keys a rank per epoch on the full
  Kaggle set at 2 GPUs (an estimated 0.3-0.6 s against ~2 s of training an epoch; the log
  says what the scan took at each epoch start);
* the kernels (:mod:`.epoch_scan_triton`, :data:`KERNEL`, with the Triton backend): no sort; a
  launch per batch stamps each id's row with the batch's number (an atomic exchange: the
  occurrence that finds another stamp is the row's first in the batch) and counts first
  occurrences per column; above bound 0 each row's occurrences are counted too (its
  ``bound + 1``-th marks it) and cleared by a second launch.
"""

from __future__ import annotations

import functools
import importlib
from types import SimpleNamespace
from typing import Any

import torch

from hetgmp.embedding import protocol
from hetgmp.embedding.kernels.launcher import launch, on_device

KERNEL = True
KEYS_PER_CHUNK = 1 << 25  # ids sorted at once by the reference
BLOCK = 1024


def _columns(counts: torch.Tensor, hot: torch.Tensor, w: int) -> torch.Tensor:
    """``[batches, 4]`` from the per-column distinct counts ``[batches, 2w + 1]`` (mirrors of
    owner j, rows not stored of owner j, owned) and the hot rows ``[batches]``."""
    queries = counts[:, :w] + counts[:, w : 2 * w]
    return torch.stack([queries.amax(1), counts.sum(1), counts[:, w : 2 * w].amax(1), hot], dim=1)


def epoch_maxima_reference(
    store: Any, bound: int, sparse: torch.Tensor, positions: torch.Tensor, batch_size: int
) -> torch.Tensor:
    """The counts (module docstring) in torch ops: the reference."""
    w = store.world
    n_batches = -(-positions.numel() // batch_size)
    per = max(1, KEYS_PER_CHUNK // max(1, batch_size * int(sparse.shape[1])))
    out = [torch.zeros(0, 4, dtype=torch.int64, device=store.device)]
    for b0 in range(0, n_batches, per):
        pos = positions[b0 * batch_size : (b0 + per) * batch_size]
        out.append(_chunk(store, bound, sparse.index_select(0, pos), batch_size, w))
    return torch.cat(out)


def _chunk(store: Any, bound: int, ids: torch.Tensor, batch_size: int, w: int) -> torch.Tensor:
    rows = store.num_rows
    ids = ids.long().clamp_(0, rows - 1)
    nb = -(-ids.shape[0] // batch_size)
    which = torch.arange(ids.shape[0], device=ids.device) // batch_size
    key, occ = torch.unique((which[:, None] * rows + ids).reshape(-1), return_counts=True)
    block = store.block_of.index_select(0, key % rows).long()
    col = torch.where(block >= w, block - w, 2 * w)
    counts = torch.zeros(nb * (2 * w + 1), dtype=torch.int64, device=ids.device)
    counts.index_add_(0, (key // rows) * (2 * w + 1) + col, torch.ones_like(key))
    hot = torch.zeros(nb, dtype=torch.int64, device=ids.device)
    # (a row in ``occ`` samples of the batch: a read one step ahead would lag ``occ``)
    hot.index_add_(0, key // rows, protocol.beyond_bound(occ, bound).long())
    return _columns(counts.view(nb, 2 * w + 1), hot, w)


class EpochScan:
    """The kernels' state for one table (its row stamps and occurrence counts, ``[num_rows]``
    int32 each, made at the first scan and kept: zero / the last stamp between scans)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._stamp: torch.Tensor | None = None
        self._occ: torch.Tensor | None = None
        self._next = 1  # (the next batch's stamp; the rows start at 0)

    def maxima(
        self, bound: int, sparse: torch.Tensor, positions: torch.Tensor, batch_size: int
    ) -> torch.Tensor:
        """The counts (module docstring) by the kernels."""
        store, w = self.store, self.store.world
        n_batches = -(-positions.numel() // batch_size)
        counts = torch.zeros(n_batches, 2 * w + 2, dtype=torch.int64, device=store.device)
        if n_batches == 0:
            return _columns(counts[:, : 2 * w + 1], counts[:, 0], w)
        stamp, occ = self._arrays(counts_rows=bound > 0)
        k, f = _ns(), int(sparse.shape[1])
        nb = _ns().triton.next_power_of_2(2 * w + 2)
        block_of, hot = store.block_of, bound > 0  # (bound 0: every distinct row is held > 0)
        sparse, positions = sparse.contiguous(), positions.contiguous()
        with on_device(counts):
            for b in range(n_batches):
                s = min(batch_size, positions.numel() - b * batch_size)
                grid = (max(1, -(-s * f // BLOCK)),)
                if self._next >= 2**31 - 1:  # (the stamps wrap: start again from zero rows)
                    stamp.zero_()
                    self._next = 1
                launch(k.counts, grid,
                       (sparse, positions, stamp, occ, block_of, counts, b * batch_size, s,
                        self._next, b, store.num_rows, bound),
                       {"F": f, "W": w, "NB": nb, "BLOCK": BLOCK, "HOT": hot})  # fmt: skip
                self._next += 1
                if hot:
                    launch(k.clear, grid,
                           (sparse, positions, occ, b * batch_size, s, store.num_rows),
                           {"F": f, "BLOCK": BLOCK})  # fmt: skip
        per_col = counts[:, : 2 * w + 1]
        return _columns(per_col, counts[:, 2 * w + 1] if hot else per_col.sum(1), w)

    def _arrays(self, *, counts_rows: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The stamps and (``counts_rows``: above bound 0) the occurrence counts; a stand-in
        the kernels never touch otherwise."""
        n, dev = self.store.num_rows, self.store.device
        if self._stamp is None:
            self._stamp = torch.zeros(n, dtype=torch.int32, device=dev)
        if counts_rows and self._occ is None:
            self._occ = torch.zeros(n, dtype=torch.int32, device=dev)
        return self._stamp, self._occ if self._occ is not None else self._stamp


@functools.lru_cache(maxsize=1)
def _ns() -> Any:
    import triton

    m = importlib.import_module("hetgmp.embedding.padded.epoch_scan_triton")
    return SimpleNamespace(triton=triton, counts=m.epoch_counts_kernel, clear=m.epoch_clear_kernel)
