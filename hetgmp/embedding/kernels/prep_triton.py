"""The Triton kernels of the batch plan (:func:`hetgmp.embedding.kernels.prep.prepare_triton`;
this module imports triton, so only :func:`hetgmp.embedding.kernels.launcher._triton` imports
it). Five launches, each over ``n`` occurrences in programs of ``BLOCK`` (the scan: one
program); ``c`` is an occurrence's clamped id, every kernel recomputes it from the ids:

1. ``prep_mark_kernel``: ``min_map[c[i]] = min(i)`` (atomic, one per distinct row of the
   program: the leader is the FIRST occurrence of its row), ``cnt_pos[i] = 0``, ``bad_p[program]`` = an id out of range here;
2. ``prep_key_kernel``: ``lead[i] = min_map[c[i]]``, ``key[i]`` = the leader's block
   (``block_of[c]``) or ``NKEY = 3w`` (padding), ``cnt_pos[lead[i]] += 1`` (one atomic per
   distinct leader of the program) and the program's
   key histogram ``hist[program, :]``;
3. ``prep_scan_kernel``: per program the exclusive column prefix of ``hist`` (``off``), the
   key totals (``blocks``), the exclusive prefix of the totals (``start``), the ``bad`` flag;
4. ``prep_place_kernel``: every occurrence's place ``dest = start[key] + off[program, key] +
   rank`` (``rank``: among the program's earlier occurrences of the same key, so the order is
   the stable sort by key); ``u / cnt / slot`` scattered there (a padding entry's count 0),
   ``pos[i] = dest`` for the leaders, and each leader's ``min_map`` entry put back to
   ``INT32_MAX`` (the map's state between calls);
5. ``prep_inv_kernel``: ``inv[i] = pos[lead[i]]``.
"""
# ruff: noqa: N803 - Triton's constexpr parameters are upper case by convention

from __future__ import annotations

import triton
import triton.language as tl

# The batch's ids (n) and programs (P) change with the batch: do_not_specialize. Triton
# otherwise compiles a kernel again for an int that is 1 or not a multiple of 16, and the first
# partial batch of an epoch (or an evaluation batch of another size) stalled ~5 s on 2 H100s
# while ptxas ran (tests/test_kernel_specialization.py checks every kernel). The table's
# num_rows (fixed for a run) keeps its specialization.

INT32_MAX = tl.constexpr(2**31 - 1)
# prep_mark's 32-bit sort key: a row's low HASH bits above the in-program index (BLOCK <=
# 2**IDX_BITS occurrences per program)
IDX_BITS = tl.constexpr(10)
HASH_MASK = tl.constexpr(2 ** (31 - 10) - 1)
# The in-program rank counts each key with a packed int64 cumsum: RANK_KEYS keys a cumsum,
# RANK_BITS bits each (a count is at most BLOCK, so BLOCK < 2**RANK_BITS).
RANK_BITS = tl.constexpr(12)
RANK_KEYS = tl.constexpr(5)


@triton.jit
def _clamped(ids_ptr, offs, m, num_rows):
    x = tl.load(ids_ptr + offs, mask=m, other=0)
    return x, tl.minimum(tl.maximum(x, 0), num_rows - 1)


@triton.jit(do_not_specialize=["n"])
def prep_mark_kernel(
    ids_ptr, min_ptr, cnt_pos_ptr, bad_p_ptr, n, num_rows, AGG: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x, c = _clamped(ids_ptr, offs, m, num_rows)
    # ~one atomic per distinct row of the program (hot rows serialised their atomics): the
    # local indices sorted by (row hash, index) in 32 bits (an int64 sort of (row, index) took
    # 89 us of a 2-GPU step at batch 8192 on an H100); an index whose predecessor in that
    # order is another row starts a run and takes part in the atomic. A row's first occurrence
    # always does (its predecessor has another row, or another hash), so the minimum is
    # right; rows sharing a hash may interleave and add atomics, never lose one.
    if AGG:
        i = tl.arange(0, BLOCK)
        key = tl.where(m, ((c & HASH_MASK) << IDX_BITS).to(tl.int32) | i, -1)
        ordered = tl.sort(key)  # (padding lanes first: -1)
        live = ordered >= 0
        local = tl.where(live, ordered & (2**IDX_BITS - 1), 0)
        row = tl.where(live, tl.gather(c, local, 0), -1)  # (padding: no row's value)
        start = live & ((i == 0) | (row != tl.gather(row, tl.maximum(i - 1, 0), 0)))
        first = (pid * BLOCK + local).to(tl.int32)
        tl.atomic_min(min_ptr + tl.where(start, row, 0), first, mask=start, sem="relaxed")
    else:
        tl.atomic_min(min_ptr + c, offs, mask=m, sem="relaxed")
    tl.store(cnt_pos_ptr + offs, tl.zeros([BLOCK], dtype=tl.int64), mask=m)
    tl.store(bad_p_ptr + pid, tl.max(((x != c) & m).to(tl.int32), axis=0))


@triton.jit(do_not_specialize=["b_rows"])
def prep_mark_fields_kernel(
    ids_ptr, min_ptr, cnt_map_ptr, b_rows, num_rows, F: tl.constexpr,
    BS: tl.constexpr, LB: tl.constexpr,
):  # fmt: skip
    # prep_mark over a [B, F] batch by field (prep.MARK_BY_FIELD): a program takes BS samples of
    # one field, sorts them by (row, sample) in 64 bits and adds one atomic_min per run, the
    # run's first sample being the row's first occurrence in the program (a field's hot rows
    # recur across samples; rows of different fields rarely meet). A 64-entry sort instead of
    # prep_mark's 1024-entry one (prep_mark: 62 us of a 2-GPU step at batch 8192 on an H100,
    # one GPU's leader marking 20). Each run's length is added to the row's count in
    # ``cnt_map`` (zero between calls: prep_place clears the leaders' rows), so prep_key reads
    # a leader's count instead of sorting its program's leaders again; the bad-id flag is left
    # to prep_key too (its BAD).
    lane = tl.arange(0, BS)
    b = tl.program_id(0) * BS + lane
    m = b < b_rows
    occ = b.to(tl.int64) * F + tl.program_id(1)
    _, c = _clamped(ids_ptr, occ, m, num_rows)
    key = tl.sort(tl.where(m, (c.to(tl.int64) << LB) | lane, 2**62))
    live = key != 2**62
    row = key >> LB
    start = live & ((lane == 0) | (row != tl.gather(row, tl.maximum(lane - 1, 0), 0)))
    first = ((tl.program_id(0) * BS + (key & (BS - 1))) * F + tl.program_id(1)).to(tl.int32)
    tl.atomic_min(min_ptr + tl.where(start, row, 0), first, mask=start, sem="relaxed")
    seg = tl.cumsum(start.to(tl.int32), 0) - 1
    # (padding lanes, sorted last, counted in bin BS - 1: with any padding there are fewer
    # than BS - 1 runs, so no run's bin)
    runs = tl.gather(tl.histogram(tl.where(live, seg, BS - 1), BS), seg, 0)
    tl.atomic_add(cnt_map_ptr + tl.where(start, row, 0), runs, mask=start, sem="relaxed")
    # (no zeros into ``cnt_pos``: prep_key writes its leaders' entries from ``cnt_map`` and
    # prep_place reads only those. The zeros were a store per occurrence at a stride of F
    # entries: at batch 65536 x 26, 1.7M scattered 8-byte stores)


@triton.jit
def _count_at_leaders(cnt_pos_ptr, lead, m, BLOCK: tl.constexpr):
    # cnt[lead] += 1 for every occurrence, summed within the block first (sorted leaders, one
    # atomic per run): a hot row's occurrences otherwise serialise on one address (2 H100s,
    # batch 65536 x 26: this kernel took 363 us with one atomic per occurrence)
    s = tl.sort(tl.where(m, lead, INT32_MAX))
    i = tl.arange(0, BLOCK)
    start = (i == 0) | (s != tl.gather(s, tl.maximum(i - 1, 0), 0))
    seg = tl.cumsum(start.to(tl.int32), 0) - 1
    runs = tl.gather(tl.histogram(seg, BLOCK), seg, 0)
    live = start & (s != INT32_MAX)
    tl.atomic_add(cnt_pos_ptr + s, runs.to(tl.int64), mask=live, sem="relaxed")


@triton.jit(do_not_specialize=["n"])
def prep_key_kernel(
    ids_ptr, min_ptr, block_ptr, lead_ptr, key_ptr, cnt_pos_ptr, hist_ptr, bad_p_ptr, cnt_map_ptr,
    n, num_rows, NKEY: tl.constexpr, KP: tl.constexpr, AGG: tl.constexpr, BLOCK: tl.constexpr,
    BY_FIELD: tl.constexpr = False,
):  # fmt: skip
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x, c = _clamped(ids_ptr, offs, m, num_rows)
    if BY_FIELD:  # (prep_mark_fields_kernel leaves the program's bad-id flag to this kernel)
        tl.store(bad_p_ptr + pid, tl.max(((x != c) & m).to(tl.int32), axis=0))
    lead = tl.load(min_ptr + c, mask=m, other=0)
    tl.store(lead_ptr + offs, lead, mask=m)
    is_lead = (lead == offs) & m
    b = tl.load(block_ptr + c, mask=is_lead, other=0)
    key = tl.where(is_lead, b, NKEY)
    tl.store(key_ptr + offs, key, mask=m)
    if BY_FIELD:  # (the rows' counts, summed by prep_mark_fields_kernel)
        cnt = tl.load(cnt_map_ptr + c, mask=is_lead, other=0)
        tl.store(cnt_pos_ptr + offs, cnt.to(tl.int64), mask=is_lead)
    elif AGG:
        _count_at_leaders(cnt_pos_ptr, lead, m, BLOCK)
    else:
        tl.atomic_add(cnt_pos_ptr + lead, tl.full([BLOCK], 1, tl.int64), mask=m, sem="relaxed")
    # (tl.histogram's mask argument is recent: the lanes past n count as padding, taken off)
    bins = tl.arange(0, KP)
    hist = tl.histogram(key, KP) - tl.where(bins == NKEY, BLOCK - tl.sum(m.to(tl.int32), 0), 0)
    tl.store(hist_ptr + pid * KP + bins, hist)


@triton.jit(do_not_specialize=["P"])
def prep_scan_kernel(
    hist_ptr, off_ptr, start_ptr, blocks_ptr, bad_p_ptr, bad_ptr, P,
    NKEY: tl.constexpr, KP: tl.constexpr, CH: tl.constexpr,
):  # fmt: skip
    cols = tl.arange(0, KP)
    carry = tl.zeros([KP], dtype=tl.int32)
    bad = tl.zeros([CH], dtype=tl.int32)
    for p0 in range(0, P, CH):
        rows = p0 + tl.arange(0, CH)
        rm = rows < P
        at = rows[:, None] * KP + cols[None, :]
        x = tl.load(hist_ptr + at, mask=rm[:, None], other=0)
        tl.store(off_ptr + at, tl.cumsum(x, axis=0) - x + carry[None, :], mask=rm[:, None])
        carry += tl.sum(x, axis=0)
        bad = tl.maximum(bad, tl.load(bad_p_ptr + rows, mask=rm, other=0))
    tl.store(start_ptr + cols, tl.cumsum(carry, axis=0) - carry)
    tl.store(blocks_ptr + cols, carry.to(tl.int64), mask=cols < NKEY)
    tl.store(bad_ptr, (tl.max(bad, axis=0) > 0).to(tl.uint8))


@triton.jit
def _rank_in_program(key, BLOCK: tl.constexpr, NK: tl.constexpr):
    # rank[i] = #{j < i in this program: key[j] == key[i]} (keys in [0, NK); others: 0)
    rank = tl.zeros([BLOCK], dtype=tl.int32)
    for g in tl.static_range(0, NK, RANK_KEYS):
        kk = key - g
        here = (kk >= 0) & (kk < RANK_KEYS)
        sh = tl.where(here, kk * RANK_BITS, 0).to(tl.int64)
        one = tl.full([BLOCK], 1, tl.int64)
        cs = tl.cumsum(tl.where(here, one << sh, 0), axis=0)
        r = ((cs >> sh) & (2**RANK_BITS - 1)).to(tl.int32) - 1
        rank = tl.where(here, r, rank)
    return rank


@triton.jit(do_not_specialize=["n"])
def prep_place_kernel(
    ids_ptr, key_ptr, cnt_pos_ptr, off_ptr, start_ptr, slot_of_ptr, min_ptr, u_ptr, cnt_ptr,
    slot_ptr, pos_ptr, cnt_map_ptr, n, num_rows, NKEY: tl.constexpr, KP: tl.constexpr,
    BLOCK: tl.constexpr, BY_FIELD: tl.constexpr = False,
):  # fmt: skip
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    key = tl.load(key_ptr + offs, mask=m, other=0)
    led = m & (key < NKEY)  # (the leaders; the other occurrences are padding)
    base = tl.load(start_ptr + key, mask=m, other=0)
    base += tl.load(off_ptr + pid * KP + key, mask=m, other=0)
    dest = base + _rank_in_program(tl.where(m, key, -1), BLOCK, NKEY + 1)
    _, c = _clamped(ids_ptr, offs, m, num_rows)
    # (every occurrence, padding too, as the torch reference. The leaders' only, 89 % fewer
    # random reads of slot_of and stores at batch 65536 x 26, is exact on CPU ranks, whose
    # readers never take padding (tests/test_padded_kernels.py poisons it), but waits for its
    # GPU checks and timing: docs/scaling_plan.md, session 23)
    tl.store(u_ptr + dest, c, mask=m)
    tl.store(cnt_ptr + dest, tl.load(cnt_pos_ptr + offs, mask=led, other=0), mask=m)
    slot = tl.load(slot_of_ptr + c, mask=m, other=0).to(tl.int64)
    tl.store(slot_ptr + dest, slot, mask=m)
    # (prep_inv reads the places of leaders only: an occurrence's leader is one)
    tl.store(pos_ptr + offs, dest, mask=led)
    # (no kernel reads min_map after prep_key_kernel: put the leaders' entries back)
    tl.store(min_ptr + c, tl.full([BLOCK], INT32_MAX, tl.int32), mask=led)
    if BY_FIELD:  # (and the rows' counts: zero between calls)
        tl.store(cnt_map_ptr + c, tl.zeros([BLOCK], dtype=tl.int32), mask=led)


@triton.jit(do_not_specialize=["n"])
def prep_inv_kernel(lead_ptr, pos_ptr, inv_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    lead = tl.load(lead_ptr + offs, mask=m, other=0)
    tl.store(inv_ptr + offs, tl.load(pos_ptr + lead, mask=m, other=0), mask=m)
