"""The device tier's lookup (:func:`.tier_misses.miss_slots`) in three Triton kernels.

Why: the torch composition is ~25 small ops over the batch's occurrences (index_select,
where, cumsum, index_copy...), ~150 us of a ~590 us step at batch 8192 x 26 on one H100 even
when every row hits (bench/results/gpu/host_tier_graph/, 2026-11-26): the tier cost 26 % with
nothing to move. Here:

* ``tier_mark_kernel``: each occurrence clamps its id (a bad one is flagged, and neither counts
  nor leads), counts it in ``seen`` and writes its index at ``pos[id]`` (any writer wins: that
  occurrence leads its row);
* ``tier_lead_kernel``: a leader of a missed row reserves the next miss entry (one atomic per
  program for its leaders, numbered by a prefix sum inside the program), lists its row in
  ``rows`` and writes the entry into ``pos[id]`` as ``-2 - entry`` (no occurrence index is
  negative, so a later reader cannot mistake it for a leader); a leader of a cached row counts a
  hit;
* ``tier_slots_kernel``: each occurrence's working slot: the cached row's, ``C +`` its row's
  entry, or ``C + M`` for a bad id (past the working table: the step's range flag names it).

Entries are numbered in the order programs reserve them, not by occurrence as the reference
does: a row's slot differs, its arithmetic does not (rows are independent in every sparse
optimizer). Tests: ``tests/test_tier_triton.py`` against :func:`.tier_misses.miss_slots` in
Triton's interpreter.
"""
# ruff: noqa: N803 - Triton's constexpr parameters are upper case by convention

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _occurrences(ids_ptr, n, num_rows, BLOCK: tl.constexpr):
    # (a program's occurrences: index, in range, valid id, its row clamped into the table)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    raw = tl.load(ids_ptr + i, mask=m, other=0)
    ok = m & (raw >= 0) & (raw < num_rows)
    return i, m, ok, tl.minimum(tl.maximum(raw, 0), num_rows - 1)


@triton.jit(do_not_specialize=["n"])
def tier_mark_kernel(ids_ptr, pos_ptr, seen_ptr, n, num_rows, BLOCK: tl.constexpr):
    i, m, ok, row = _occurrences(ids_ptr, n, num_rows, BLOCK)
    tl.atomic_add(seen_ptr + row, tl.full([BLOCK], 1, tl.int32), mask=ok, sem="relaxed")
    tl.store(pos_ptr + row, i.to(tl.int32), mask=ok)


@triton.jit(do_not_specialize=["n"])
def tier_lead_kernel(
    ids_ptr, slot_of_ptr, pos_ptr, rows_ptr, count_ptr, dev_ptr, n, num_rows, capacity,
    BLOCK: tl.constexpr,
):  # fmt: skip
    i, m, ok, row = _occurrences(ids_ptr, n, num_rows, BLOCK)
    lead = ok & (tl.load(pos_ptr + row, mask=ok, other=-1) == i)
    cached = tl.load(slot_of_ptr + row, mask=ok, other=-1) >= 0
    miss = lead & ~cached
    k = miss.to(tl.int32)
    base = tl.atomic_add(count_ptr, tl.sum(k, 0).to(tl.int64), sem="relaxed")
    entry = base + (tl.cumsum(k, 0) - k).to(tl.int64)
    tl.store(rows_ptr + entry, row, mask=miss & (entry < capacity))
    tl.store(pos_ptr + row, (-2 - entry).to(tl.int32), mask=miss)
    hits = tl.sum((lead & cached).to(tl.int64), 0)
    tl.atomic_add(dev_ptr, hits, sem="relaxed")


@triton.jit(do_not_specialize=["n"])
def tier_slots_kernel(
    ids_ptr, slot_of_ptr, pos_ptr, slots_ptr, n, num_rows, cache_rows, capacity,
    BLOCK: tl.constexpr,
):  # fmt: skip
    i, m, ok, row = _occurrences(ids_ptr, n, num_rows, BLOCK)
    c = tl.load(slot_of_ptr + row, mask=ok, other=-1).to(tl.int64)
    entry = -2 - tl.load(pos_ptr + row, mask=ok & (c < 0), other=-2).to(tl.int64)
    refused = cache_rows + capacity  # (past the working table)
    slot = tl.where(c >= 0, c, tl.where(entry < capacity, cache_rows + entry, refused))
    tl.store(slots_ptr + i, tl.where(ok, slot, refused), mask=m)
