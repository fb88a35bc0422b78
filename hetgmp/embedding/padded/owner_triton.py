"""The Triton kernels of the owner's merged update (:func:`.owner_update.merged_owner_update_fused`),
over the entries ``[the staged own rows (o) | every peer's pushes (w * p)]``: three launches
where the torch composition took about 28 small ops (2 H100s, batch 8192: ~60 us of a 1.4 ms
step, 2026-11-26). Reference: :func:`.reference.merged_owner_update`.

* ``owner_slots_kernel``: each entry's slot (a push's through ``slot_of``; the trash slot for
  padding: an unused own entry, a push past its peer's count), its count, and the slot ->
  entry map written by every valid entry (launched over the pushes, then over the own rows:
  an own row's entry leads its row, else any one push does).
* ``owner_sum_kernel``: each valid entry reads its leader back and adds its count at the
  leader (``csum``: zero between steps) and, a push, its gradient row (``gsum``: its first ``o``
  rows are the staged own rows' gradient, which an own row's leader sum starts from; zero
  between steps past them); padding writes ``-1``.
* ``owner_version_kernel`` (after the Adagrad launch over the leaders): each leader moves its
  row's version by the row's count and zeroes that count.
"""
# ruff: noqa: N803 - Triton's constexpr parameters are upper case by convention

from __future__ import annotations

import triton
import triton.language as tl

# The entries (n = o + w p) and the staged own rows (o) change with the batch (o is the batch's
# distinct-row capacity, the batch itself for a small one): do_not_specialize (else a partial
# batch compiles the kernel again: a ~5 s stall on 2 H100s, see kernels_triton and
# tests/test_kernel_specialization.py). The capacity p and the payload offsets (s1, s1h, q2,
# g0: multiples of 256) keep their specialization: it never changes, and aligns accesses.


@triton.jit
def _entry(e, o, p, s1h, q2):
    # (is_push, peer, index within the peer's pushes, int64 offset of the push's id in recv1)
    push = e >= o
    k = tl.where(push, e - o, 0)
    j = k // p
    i = k - j * p
    return push, j, i, j.to(tl.int64) * s1h + q2 + i


@triton.jit(do_not_specialize=["e0", "n", "o"])
def owner_slots_kernel(
    own_slot_ptr, own_cnt_ptr, r64_ptr, sz_ptr, slot_of_ptr, slots_ptr, cnts_ptr, pos_ptr,
    e0, n, o, p, s1h, q2, num_rows, trash, COLS: tl.constexpr, NP: tl.constexpr,
    BLOCK: tl.constexpr, KEEP_OWN: tl.constexpr = False, pushed_ptr=None,
    MARK: tl.constexpr = False,
):  # fmt: skip
    # (entries [e0, n): launched for the pushes first, then for the own rows, whose writes to
    # the slot -> entry map then win: an own row leads its row. KEEP_OWN: the own rows' launch
    # ran first (in the counts phase, off the exchange's chain), so a push leaves a slot that
    # an own entry of this step leads: the map's entry c < o with this step's slots[c] == slot;
    # any other entry there is an earlier step's)
    e = e0 + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = e < n
    push, j, i, off = _entry(e, o, p, s1h, q2)
    own = m & ~push
    npush = tl.load(sz_ptr + j * COLS + NP, mask=m & push, other=0)
    pm = m & push & (i < npush)
    rid = tl.load(r64_ptr + off, mask=pm, other=0)
    rid = tl.minimum(tl.maximum(rid, 0), num_rows - 1)
    ps = tl.load(slot_of_ptr + rid, mask=pm, other=trash).to(tl.int64)
    os = tl.load(own_slot_ptr + e, mask=own, other=trash)
    slot = tl.where(own, os, tl.where(pm, ps, trash))
    pc = tl.load(r64_ptr + off + p, mask=pm, other=0)
    oc = tl.load(own_cnt_ptr + e, mask=own, other=0)
    tl.store(slots_ptr + e, slot, mask=m)
    tl.store(cnts_ptr + e, tl.where(own, oc, pc), mask=m)
    live = m & (slot != trash)
    if KEEP_OWN:
        cur = tl.load(pos_ptr + slot, mask=live, other=-1)
        mine = live & (cur >= 0) & (cur < o)
        led = mine & (tl.load(slots_ptr + cur, mask=mine, other=-1) == slot)
        live = live & ~led
        if MARK:  # (the own entry this push joins: owner_update.OWN_SPLIT)
            tl.store(pushed_ptr + cur, cur * 0 + 1, mask=led)
    tl.store(pos_ptr + slot, e.to(tl.int64), mask=live)


@triton.jit(do_not_specialize=["n", "o"])
def owner_sum_kernel(
    slots_ptr, cnts_ptr, pos_ptr, lead_ptr, csum_ptr, recv_ptr, gsum_ptr, n, o, p, s1, g0,
    trash, D: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr, pushed_ptr=None,
    SPLIT: tl.constexpr = False,
):  # fmt: skip
    # (SPLIT: own entries no push joins took their update already, owner_update.OWN_SPLIT: skipped)
    pid = tl.program_id(0)
    e = pid * BR + tl.arange(0, BR)
    m = e < n
    slot = tl.load(slots_ptr + e, mask=m, other=trash)
    valid = m & (slot != trash)
    if SPLIT:
        own = valid & (e < o)
        valid = valid & ~(own & (tl.load(pushed_ptr + e, mask=own, other=1) == 0))
    lead = tl.load(pos_ptr + slot, mask=valid, other=-1)
    tl.store(lead_ptr + e, tl.where(valid, lead, -1), mask=m)
    cnt = tl.load(cnts_ptr + e, mask=valid, other=0)
    tl.atomic_add(csum_ptr + lead, cnt, mask=valid, sem="relaxed")
    # an own row leads its row (owner_slots_kernel's launch order; the own rows' slots are
    # distinct), so its gradient is its leader's sum already (gsum's first o rows are the
    # staged own gradient): only pushes add rows, and a program of own rows only is done
    if pid * BR + BR > o:
        push = valid & (e >= o)
        # (not tl.where(push, ...): with SPLIT's masked load, Triton <= 3.6 fails to compile
        # that select on sm_90 (TritonGPURemoveLayoutConversions); a push has e >= o anyway)
        k = tl.maximum(e - o, 0)
        j = k // p
        # a push's row inside its peer's payload
        src = j.to(tl.int64) * s1 + g0 + (k - j * p).to(tl.int64) * D
        dst = lead.to(tl.int64) * D
        for d0 in tl.static_range(0, D, BD):
            c = d0 + tl.arange(0, BD)
            cm = push[:, None] & (c < D)[None, :]
            g = tl.load(recv_ptr + src[:, None] + c[None, :], mask=cm, other=0.0)
            tl.atomic_add(gsum_ptr + dst[:, None] + c[None, :], g, mask=cm, sem="relaxed")


@triton.jit(do_not_specialize=["n"])
def owner_version_kernel(
    slots_ptr, lead_ptr, csum_ptr, version_ptr, n, BLOCK: tl.constexpr,
):  # fmt: skip
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = e < n
    lead = tl.load(lead_ptr + e, mask=m, other=-1)
    is_lead = m & (lead == e)
    slot = tl.load(slots_ptr + e, mask=is_lead, other=0)
    c = tl.load(csum_ptr + e, mask=is_lead, other=0)
    tl.atomic_add(version_ptr + slot, c, mask=is_lead, sem="relaxed")
    tl.store(csum_ptr + e, tl.zeros_like(c), mask=is_lead)
