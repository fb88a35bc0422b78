"""Pack's due mirrors listed by the counts phase (:func:`.kernels.due_prefix`), so that pack
copies the due mirrors only (this module imports triton: :mod:`.kernels` imports it only when a
fused segment runs).

Why: ``pack_due_kernel`` scanned every mirror each step (a grid over ``n_mir``, ~338k mirrors
at the card's ``--store_rate 0.01`` on the 33.8M-row table, a few of them due) on the
exchange's critical path: 22 us of a ~850 us step on 2 H100s at batch 8192 (2026-11-26). The
mirrors' pending counts change only in the counts phase, and with the counts phase run early
(:mod:`.presync_step`) the scan moves off that path: ``due_list_kernel`` writes each due
mirror that fits the payload at ``list[j * p + rank]`` (owner ``j``, its rank among ``j``'s due
mirrors, the payload's order) and counts the deferred ones; ``pack_due_list_kernel`` then runs
over the ``w * p`` list entries and writes exactly what ``pack_due_kernel`` writes.
"""
# ruff: noqa: N803 - Triton's constexpr parameters are upper case by convention

from __future__ import annotations

import triton
import triton.language as tl

from hetgmp.embedding.padded.payload_triton import as64, payload_row
from hetgmp.embedding.padded.rule_triton import is_due


@triton.jit
def count_deferred(pend, m, bound, deferred_ptr):
    # mirrors with pending updates not due yet: counted (the step's deferred pushes)
    k = tl.sum((m & (pend > 0) & ~is_due(pend, bound)).to(tl.int64), 0)
    if k > 0:
        tl.atomic_add(deferred_ptr, k, sem="relaxed")


@triton.jit
def due_rank(i, due, csum_ptr, owner_ptr, mstart_ptr, ndue_ptr):
    # (owner j, rank among j's due mirrors, still due: only the first ndue[j] of owner j's due
    # mirrors fit the payload, the rest stay due) of due mirrors i
    j = tl.load(owner_ptr + i, mask=due, other=0)
    st = tl.load(mstart_ptr + j, mask=due, other=0)
    before = tl.load(csum_ptr + st - 1, mask=due & (st > 0), other=0)
    rank = tl.load(csum_ptr + i, mask=due, other=1) - 1 - before
    return j, rank, due & (rank < tl.load(ndue_ptr + j, mask=due, other=0))


@triton.jit
def pack_rows(
    i, j, rank, due, pend, pend_ptr, pr_n_ptr, ids_ptr, ver_ptr, gacc_ptr, dacc_ptr, send_ptr,
    n_own, q, p, s1, D: tl.constexpr, BD: tl.constexpr, EXACT: tl.constexpr,
    PEER: tl.constexpr, IDS: tl.constexpr = True,
):  # fmt: skip
    # due mirrors i (owner j, payload rank) into exchange 1's payload: id, pending count and
    # accumulated gradient after owner j's rows not stored here; pending and both accumulators
    # cleared (EXACT: the optimizer's local step equals the owner's (SGD), so a pushed mirror's
    # version moves with the push; else it turns stale and is refetched). IDS False: the id
    # and count went with the counts phase (push_ids_kernel)
    pos = tl.load(pr_n_ptr + j, mask=due, other=0) + rank
    row = payload_row(send_ptr, j, due, s1, PEER)  # (PEER: in owner j's receive buffer)
    if IDS:
        h = as64(row)
        tl.store(h + 2 * q + pos, tl.load(ids_ptr + n_own + i, mask=due), mask=due)
        tl.store(h + 2 * q + p + pos, pend, mask=due)
    if EXACT:
        tl.store(ver_ptr + n_own + i, tl.load(ver_ptr + n_own + i, mask=due) + pend, mask=due)
    tl.store(pend_ptr + i, pend * 0, mask=due)
    g_off = i.to(tl.int64) * D
    dst = 4 * q + 4 * p + pos.to(tl.int64) * D
    for d0 in tl.static_range(0, D, BD):
        c = d0 + tl.arange(0, BD)
        mm = due[:, None] & (c < D)[None, :]
        ga = gacc_ptr + g_off[:, None] + c[None, :]
        g = tl.load(ga, mask=mm, other=0.0)
        tl.store(row[:, None] + dst[:, None] + c[None, :], g, mask=mm)
        tl.store(ga, g * 0.0, mask=mm)
        tl.store(dacc_ptr + g_off[:, None] + c[None, :], g * 0.0, mask=mm)


@triton.jit
def scan_due(
    pend_ptr, csum_ptr, owner_ptr, mstart_ptr, ndue_ptr, deferred_ptr, n_mir, bound,
    BLOCK: tl.constexpr,
):  # fmt: skip
    # this program's mirrors i: the deferred ones counted; (i, pending, owner, rank, due)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n_mir
    pend = tl.load(pend_ptr + i, mask=m, other=0)
    count_deferred(pend, m, bound, deferred_ptr)
    j, rank, due = due_rank(i, m & is_due(pend, bound), csum_ptr, owner_ptr, mstart_ptr, ndue_ptr)
    return i, pend, j, rank, due


@triton.jit
def due_list_kernel(
    pend_ptr, csum_ptr, owner_ptr, mstart_ptr, ndue_ptr, list_ptr, deferred_ptr, n_mir, bound,
    p, BLOCK: tl.constexpr,
):  # fmt: skip
    i, _, j, rank, due = scan_due(
        pend_ptr, csum_ptr, owner_ptr, mstart_ptr, ndue_ptr, deferred_ptr, n_mir, bound, BLOCK
    )
    tl.store(list_ptr + j.to(tl.int64) * p + rank, i.to(tl.int64), mask=due)


@triton.jit
def pack_due_list_kernel(
    list_ptr, pend_ptr, pr_n_ptr, ndue_ptr, ids_ptr, ver_ptr, gacc_ptr, dacc_ptr, send_ptr,
    n_own, q, p, s1, W: tl.constexpr, D: tl.constexpr, BR: tl.constexpr,
    BD: tl.constexpr, EXACT: tl.constexpr, PEER: tl.constexpr, IDS: tl.constexpr = True,
):  # fmt: skip
    # entries t of the list: owner j = t // p, rank t - j p (pack_due_kernel's, per mirror)
    t = tl.program_id(0) * BR + tl.arange(0, BR)
    j = (t // p).to(tl.int64)
    rank = t - j * p
    jm = j < W
    due = jm & (rank < tl.load(ndue_ptr + j, mask=jm, other=0))
    i = tl.load(list_ptr + t, mask=due, other=0)
    pend = tl.load(pend_ptr + i, mask=due, other=0)
    pack_rows(
        i, j, rank, due, pend, pend_ptr, pr_n_ptr, ids_ptr, ver_ptr, gacc_ptr, dacc_ptr,
        send_ptr, n_own, q, p, s1, D, BD, EXACT, PEER, IDS,
    )  # fmt: skip


@triton.jit
def push_ids_kernel(
    list_ptr, pend_ptr, pr_n_ptr, ndue_ptr, ids_ptr, pr_ids_ptr, pr_cnt_ptr, rows_ptr, n_own,
    q, p, s1, W: tl.constexpr, WP: tl.constexpr, BR: tl.constexpr,
):  # fmt: skip
    # (owner_update.PUSH_SLOTS_EARLY, in the counts phase) the ids and counts of exchange 1's pushes
    # straight into each owner's receive row (rows_ptr: the peers' row table), where pack
    # would write them: owner j's rows not stored here (pr_*, contiguous per owner) at ranks
    # [0, pr_n[j]), then its listed due mirrors (pending counts final here, cleared by pack)
    t = tl.program_id(0) * BR + tl.arange(0, BR)
    j = (t // p).to(tl.int64)
    rank = t - j * p
    jm = j < W
    prn = tl.load(pr_n_ptr + j, mask=jm, other=0)
    nd = tl.load(ndue_ptr + j, mask=jm, other=0)
    rem = jm & (rank < prn)
    due = jm & (rank >= prn) & (rank < prn + nd)
    jw = tl.arange(0, WP)
    before = tl.sum(
        tl.where(
            jw[None, :] < j[:, None], tl.load(pr_n_ptr + jw, mask=jw < W, other=0)[None, :], 0
        ),
        axis=1,
    )
    s = before + rank  # (owner j's pushes sit at pr_*[before .. before + pr_n[j]))
    i = tl.load(list_ptr + j * p + rank - prn, mask=due, other=0)
    rid = tl.where(rem, tl.load(pr_ids_ptr + s, mask=rem, other=0),
                   tl.load(ids_ptr + n_own + i, mask=due, other=0))  # fmt: skip
    cnt = tl.where(rem, tl.load(pr_cnt_ptr + s, mask=rem, other=0),
                   tl.load(pend_ptr + i, mask=due, other=0).to(tl.int64))  # fmt: skip
    live = rem | due
    h = as64(payload_row(rows_ptr, j, live, s1, True))
    tl.store(h + 2 * q + rank, rid, mask=live)
    tl.store(h + 2 * q + p + rank, cnt, mask=live)
