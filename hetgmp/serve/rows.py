"""Where a scorer's rows live: all on the device, or in host memory with a device cache.

* :class:`DeviceRows`: the whole table on the device; a lookup is one gather.
* :class:`CachedRows`: the table in host memory (pinned when CUDA is used, so misses copy
  asynchronously), and the hottest rows in a device cache. A device-side slot map (4 bytes a
  row) says where a cached row is; a lookup gathers the hits on the device and only the misses
  from host memory. Hot rows are the most frequently accessed ones when the artifact has
  access counts, else the first rows of every field (preprocessing numbers a field's values by
  descending count, so these are the frequent ones there too). The pinned host rows and the
  hottest-first order are the trainer's host tier's (:mod:`hetgmp.embedding.tiered`), which
  also updates rows and changes residency; a scorer's cache is read-only and fixed.
"""

from __future__ import annotations

import numpy as np
import torch

from hetgmp.embedding.tiered import host_tensor, hottest_first


class DeviceRows:
    """The whole table on ``device``."""

    def __init__(self, rows: torch.Tensor, device: torch.device) -> None:
        self.table = rows.to(device)
        self.device = device
        self.cached_rows = rows.shape[0]

    def lookup(self, rows: torch.Tensor) -> torch.Tensor:
        """float32 ``[..., D]`` of table rows ``rows`` (int64 on the device)."""
        return self.table[rows].float()


class CachedRows:
    """The table in host memory, ``order[:cache_rows]`` (hottest first) cached on ``device``."""

    def __init__(
        self, rows: torch.Tensor, device: torch.device, cache_rows: int, order: torch.Tensor
    ) -> None:
        self.device = device
        self.host = host_tensor(rows, device, copy=False)  # (pinned for CUDA, as the trainer's)
        n = rows.shape[0]
        hot = order[: max(0, min(int(cache_rows), n))].to(torch.int64)
        self.cached_rows = int(hot.numel())
        self.cache = rows[hot].to(device)
        slot = torch.full((n,), -1, dtype=torch.int32)
        slot[hot] = torch.arange(hot.numel(), dtype=torch.int32)
        self.slot = slot.to(device)

    def lookup(self, rows: torch.Tensor) -> torch.Tensor:
        """float32 ``[..., D]`` of table rows ``rows``: cache hits on the device, misses copied
        from host memory."""
        flat = rows.reshape(-1)
        slot = self.slot[flat]
        out = torch.empty(
            (flat.numel(), self.host.shape[1]), dtype=self.host.dtype, device=self.device
        )
        hit = slot >= 0
        out[hit] = self.cache[slot[hit].to(torch.int64)]
        miss = torch.nonzero(~hit).reshape(-1)
        if miss.numel():
            ids = flat[miss].cpu()
            got = self.host[ids]
            if self.device.type == "cuda":
                got = got.pin_memory()
            out[miss] = got.to(self.device, non_blocking=True)
        return out.reshape(*rows.shape, out.shape[1]).float()  # (0 ids too: a batch's empty bags)


def hot_order(
    num_table_rows: int,
    fields: list[dict[str, int]],
    counts: torch.Tensor | None,
    index: torch.Tensor | None,
) -> torch.Tensor:
    """Table rows hottest first: by ``counts`` (global ids) when known, else interleaving the
    fields' first ids (id 0 of every field, then id 1, ...). ``index`` maps global ids to table
    rows (``--min-count`` artifacts); rows appear once, in their hottest id's place."""
    if counts is not None:
        order = hottest_first(counts, counts.numel())
    else:
        cards = np.array([int(f["cardinality"]) for f in fields], np.int64)
        offs = np.array([int(f["offset"]) for f in fields], np.int64)
        local = np.arange(int(cards.max(initial=0)), dtype=np.int64)
        grid = local[:, None] + offs[None, :]  # [max card, F], row-major = interleaved
        valid = local[:, None] < cards[None, :]
        order = torch.from_numpy(grid[valid])
    if index is not None:
        order = index[order]
        # keep each table row's first (hottest) occurrence
        uniq, inverse = torch.unique(order, return_inverse=True)
        first = torch.full((uniq.numel(),), order.numel(), dtype=torch.int64)
        first.scatter_reduce_(0, inverse, torch.arange(order.numel()), reduce="amin")
        order = uniq[torch.argsort(first)]
    seen = torch.zeros(num_table_rows, dtype=torch.bool)
    seen[order] = True
    rest = torch.nonzero(~seen).reshape(-1)  # (e.g. the zero row) coldest
    return torch.cat([order, rest])
