"""A batch's misses of a device cache, found on the device in fixed shapes (issue 33: the
device-side host tier of ``docs/host_tier_plan.md``).

Why: the host tier decided residency on the host, ~7.5 ms of host work per step against a
~0.6 ms step. Here a batch's ids become slots of one working table ``[C cached rows | M miss
entries]`` with a handful of device ops and no host read, so a CUDA graph can hold the step:
the cached rows keep their slots (``slot_of``), every distinct missed row gets one miss entry,
and the missed rows' ids are listed for the gather from host memory (a zero-copy view,
:mod:`.uva`) and the write-back after the update.

:func:`miss_slots` is exact for any batch: with ``capacity`` >= the batch's occurrences no
batch can have more distinct misses than entries.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class MissPlan(NamedTuple):
    """A batch's slots in the working table and its missed rows."""

    slots: torch.Tensor  # ids' shape, int64: a cached row's slot, or C + its miss entry
    rows: torch.Tensor  # [capacity] int64: each miss entry's row id, -1 past ``misses``
    misses: torch.Tensor  # () int64: the batch's distinct missed rows


def miss_slots(
    ids: torch.Tensor, slot_of: torch.Tensor, pos: torch.Tensor, cache_rows: int, capacity: int
) -> MissPlan:
    """The working-table slots of ``ids`` (any shape, int64 in ``[0, N)``): ``slot_of [N]``
    maps a row to its cache slot (-1: not cached); ``pos [N + 1]`` int32 is scratch (its
    contents need not be kept between calls: each row's entry is written before it is read;
    the last entry is a dummy target); ``cache_rows`` is ``C``; ``capacity`` the miss entries
    (``M``, at least the batch's distinct missed rows: ``ids.numel()`` always is). Missed rows
    take entries in the order of their leader occurrence (the occurrence whose write to
    ``pos`` won; any one of a row's occurrences may)."""
    n, num_rows = ids.numel(), slot_of.numel()
    if pos.numel() != num_rows + 1 or pos.dtype != torch.int32:
        raise ValueError(f"pos must be int32 [{num_rows + 1}], got {pos.dtype} {tuple(pos.shape)}")
    flat = ids.reshape(-1)
    cached = slot_of.index_select(0, flat).long()
    miss = cached < 0
    at = torch.arange(n, dtype=torch.int32, device=ids.device)
    dummy = torch.full_like(flat, num_rows)
    target = torch.where(miss, flat, dummy)
    pos.index_copy_(0, target, at)  # (any writer wins: that occurrence leads its row)
    lead = miss & (pos.index_select(0, flat) == at)
    entry = torch.cumsum(lead, 0) - 1  # (a leader's entry; past the leaders: the count - 1)
    pos.index_copy_(0, torch.where(lead, flat, dummy), entry.to(torch.int32))
    mine = pos.index_select(0, flat).long()  # (a missed occurrence: its row's entry)
    slots = torch.where(miss, cache_rows + mine, cached)
    rows = torch.full((capacity + 1,), -1, dtype=torch.int64, device=ids.device)
    # (an entry past the capacity goes to the dummy too: its slot, past C + M, is then out of
    # the working table's range, which the step's range check refuses: never a wrong row)
    fits = lead & (entry < capacity)
    rows.index_copy_(0, torch.where(fits, entry, torch.full_like(entry, capacity)), flat)
    count = entry[-1] + 1 if n else torch.zeros((), dtype=torch.int64, device=ids.device)
    return MissPlan(slots.view(ids.shape), rows[:capacity], count)


def miss_slots_fused(
    ids: torch.Tensor, slot_of: torch.Tensor, pos: torch.Tensor, cache_rows: int,
    capacity: int, *, seen: torch.Tensor, hits: torch.Tensor, rows: torch.Tensor,
) -> MissPlan:  # fmt: skip
    """:func:`miss_slots` in three Triton kernels (:mod:`.tier_triton`), for ``ids`` ``[n]``
    int64 (any values: an id outside ``[0, N)`` gets slot ``C + M``, past the working table,
    and is neither counted nor gathered); also adds each valid occurrence to ``seen [N]``
    int32 and the batch's distinct cached rows to ``hits`` (``[1]`` int64). ``rows``
    (``[capacity]`` int64, kept by the caller) is refilled. Missed rows take entries in the
    order the kernels' programs reserve them (the reference's order differs; the rows each
    slot holds do not)."""
    from hetgmp.embedding.kernels.launcher import launch
    from hetgmp.embedding.tier_triton import (
        tier_lead_kernel,
        tier_mark_kernel,
        tier_slots_kernel,
    )

    n, num_rows = ids.numel(), slot_of.numel()
    if n > capacity or rows.numel() != capacity:
        raise ValueError(f"{n} ids need {n} miss entries; there are {capacity} ({rows.numel()})")
    rows.fill_(-1)
    count = torch.zeros(1, dtype=torch.int64, device=ids.device)
    slots = torch.empty(n, dtype=torch.int64, device=ids.device)
    if n:
        grid, c = (-(-n // 1024),), {"BLOCK": 1024}
        launch(tier_mark_kernel, grid, (ids, pos, seen, n, num_rows), c)
        launch(tier_lead_kernel, grid, (ids, slot_of, pos, rows, count, hits, n, num_rows,
                                        capacity), c)  # fmt: skip
        launch(tier_slots_kernel, grid, (ids, slot_of, pos, slots, n, num_rows, cache_rows,
                                         capacity), c)  # fmt: skip
    return MissPlan(slots, rows, count[0])
