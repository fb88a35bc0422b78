"""The Triton kernels of the padded exchange's pack, answer and finish segments (the pre-sync
segment's: :mod:`.presync_triton`) (module-level ``@triton.jit``
functions; this module imports triton, so :mod:`.kernels` imports it only when a fused segment
runs). What each computes, and the payload layouts: :mod:`.kernels`; their reference, the torch
segments: :mod:`.reference`.
"""
# ruff: noqa: N803 - Triton's constexpr parameters are upper case by convention

from __future__ import annotations

import triton
import triton.language as tl

from hetgmp.embedding.kernels.rows_triton import _copy_rows
from hetgmp.embedding.padded.due_triton import pack_rows, scan_due
from hetgmp.embedding.padded.payload_triton import as32, as64, payload_row
from hetgmp.embedding.padded.rule_triton import beyond_bound, within_bound

# The batch's distinct rows (u) change with the batch: do_not_specialize. Triton otherwise
# compiles a kernel again for an int that is 1 or not a multiple of 16, and the first partial
# batch of an epoch (or an evaluation batch of another size) stalled ~5 s on 2 H100s while
# ptxas ran (tests/test_kernel_specialization.py checks every kernel). The capacities q, p and
# the payload strides s1, s2 keep it: multiples of 256 by construction (buffers.grow,
# whole.round_up), so their specialization never changes, and the payload's row copies get
# aligned vector accesses from it; so do the table's counts (n_own, n_mir, num_rows: fixed).


@triton.jit
def _block_starts(blocks_ptr, W: tl.constexpr, B3: tl.constexpr):
    # (ends, starts, index) of the 3W block sizes (own | mirrors by owner | not stored by
    # owner), padded to B3 entries
    t = tl.arange(0, B3)
    b = tl.load(blocks_ptr + t, mask=t < 3 * W, other=0)
    ends = tl.cumsum(b, 0)
    return ends, ends - b, t


@triton.jit
def _pick(vec, t, k):
    # vec[k] for a row vector of indices k (vec: a small [B] vector, t = arange(B))
    return tl.sum(tl.where(t[None, :] == k[:, None], vec[None, :], 0), axis=1)


@triton.jit
def _rows(src_ptr, dst_ptr, src_off, dst_off, rmask, D: tl.constexpr, BD: tl.constexpr):
    # dst[dst_off + c] = src[src_off + c] for whole rows at int64 element offsets (not row
    # indices, as kernels._copy_rows: payload rows sit at offsets inside a peer's row)
    for d0 in tl.static_range(0, D, BD):
        c = d0 + tl.arange(0, BD)
        m = rmask[:, None] & (c < D)[None, :]
        v = tl.load(src_ptr + src_off[:, None] + c[None, :], mask=m, other=0.0)
        tl.store(dst_ptr + dst_off[:, None] + c[None, :], v, mask=m)


@triton.jit
def pack_due_kernel(
    pend_ptr, csum_ptr, owner_ptr, mstart_ptr, pr_n_ptr, ndue_ptr, ids_ptr, ver_ptr, gacc_ptr,
    dacc_ptr, send_ptr, deferred_ptr, n_mir, n_own, bound, q, p, s1,
    D: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr, EXACT: tl.constexpr,
    PEER: tl.constexpr,
):  # fmt: skip
    # every mirror scanned (the due list's kernels, .due_triton, when the counts phase ran early)
    i, pend, j, rank, due = scan_due(
        pend_ptr, csum_ptr, owner_ptr, mstart_ptr, ndue_ptr, deferred_ptr, n_mir, bound, BR
    )
    pack_rows(
        i, j, rank, due, pend, pend_ptr, pr_n_ptr, ids_ptr, ver_ptr, gacc_ptr, dacc_ptr,
        send_ptr, n_own, q, p, s1, D, BD, EXACT, PEER,
    )  # fmt: skip


@triton.jit
def pack_queries_kernel(
    sz_ptr, blocks_ptr, u_ids_ptr, slot_ptr, ver_ptr, pr_n_ptr, pr_ids_ptr, pr_cnt_ptr,
    pr_grad_ptr, send_ptr, rows_ptr, q, p, s1,
    W: tl.constexpr, WP: tl.constexpr, B3: tl.constexpr, COLS: tl.constexpr,
    NQM: tl.constexpr, NQR: tl.constexpr, D: tl.constexpr, BR: tl.constexpr,
    BD: tl.constexpr, PEER: tl.constexpr, IDS: tl.constexpr = True,
):  # fmt: skip
    # (PEER: send_ptr is the table of the peers' receive rows, .payload_triton; IDS False: the
    # pushes' ids and counts went with the counts phase, .due_triton.push_ids_kernel)
    pid = tl.program_id(0)
    if pid == 0:
        r = tl.arange(0, 4)
        tl.store(rows_ptr + r, r.to(tl.int64) * 0, mask=r < 3)  # finish_values counts
    s = pid * BR + tl.arange(0, BR)  # query slot (peer s // q, position s % q)
    sm = s < W * q
    j = s // q
    e = s - j * q
    nqm = tl.load(sz_ptr + j * COLS + NQM, mask=sm, other=0)
    nq = nqm + tl.load(sz_ptr + j * COLS + NQR, mask=sm, other=0)
    ends, starts, t = _block_starts(blocks_ptr, W, B3)
    is_m = sm & (e < nqm)
    is_q = sm & (e < nq)
    ipos = tl.where(is_m, _pick(starts, t, W + j) + e, _pick(starts, t, 2 * W + j) + e - nqm)
    ipos = tl.where(is_q, ipos, 0)
    h = as64(payload_row(send_ptr, j, is_q, s1, PEER))
    tl.store(h + e, tl.load(u_ids_ptr + ipos, mask=is_q), mask=is_q)
    ms = tl.load(slot_ptr + ipos, mask=is_m, other=0)
    tl.store(h + q + e, tl.load(ver_ptr + ms, mask=is_m), mask=is_m)
    # the last batch's rows not stored here (pr_*, contiguous per owner) -> push slots
    jw = tl.arange(0, WP)
    prn = tl.load(pr_n_ptr + jw, mask=jw < W, other=0)
    pends = tl.cumsum(prn, 0)
    jp = tl.sum(((pends[None, :] <= s[:, None]) & (jw < W)[None, :]).to(tl.int32), axis=1)
    pv = sm & (s < tl.sum(prn, 0))
    jp = tl.where(pv, jp, 0)
    pos = s - (_pick(pends, jw, jp) - _pick(prn, jw, jp))
    rp = payload_row(send_ptr, jp, pv, s1, PEER)
    hp = as64(rp)
    if IDS:
        tl.store(hp + 2 * q + pos, tl.load(pr_ids_ptr + s, mask=pv), mask=pv)
        tl.store(hp + 2 * q + p + pos, tl.load(pr_cnt_ptr + s, mask=pv), mask=pv)
    src = s.to(tl.int64) * D
    dst = 4 * q + 4 * p + pos.to(tl.int64) * D
    _rows(pr_grad_ptr, rp[:, None], src, dst, pv, D, BD)


@triton.jit
def answer_pushes_kernel(
    sz_ptr, recv_ptr, recv64_ptr, slot_of_ptr, w_ptr, ver_ptr, num_rows, q, p, s1, neg_lr,
    W: tl.constexpr, COLS: tl.constexpr, NP: tl.constexpr, D: tl.constexpr,
    BR: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    k = tl.program_id(0) * BR + tl.arange(0, BR)
    km = k < W * p
    j = k // p
    e = k - j * p
    v = km & (e < tl.load(sz_ptr + j * COLS + NP, mask=km, other=0))
    h = j.to(tl.int64) * (s1 // 2)
    rid = tl.load(recv64_ptr + h + 2 * q + e, mask=v, other=0)
    cnt = tl.load(recv64_ptr + h + 2 * q + p + e, mask=v, other=0)
    rid = tl.minimum(tl.maximum(rid, 0), num_rows - 1)
    slot = tl.load(slot_of_ptr + rid, mask=v, other=-1).to(tl.int64)
    v = v & (slot >= 0)
    # (several peers may push one row: atomics)
    tl.atomic_add(ver_ptr + slot, cnt, mask=v, sem="relaxed")
    src = j.to(tl.int64) * s1 + 4 * q + 4 * p + e.to(tl.int64) * D
    dst = slot * D
    for d0 in tl.static_range(0, D, BD):
        c = d0 + tl.arange(0, BD)
        mm = v[:, None] & (c < D)[None, :]
        g = tl.load(recv_ptr + src[:, None] + c[None, :], mask=mm, other=0.0)
        tl.atomic_add(w_ptr + dst[:, None] + c[None, :], g * neg_lr, mask=mm, sem="relaxed")


@triton.jit
def answer_queries_kernel(
    sz_ptr, recv64_ptr, slot_of_ptr, w_ptr, ver_ptr, state_ptr, send_ptr, num_rows, q, s1, s2,
    W: tl.constexpr, COLS: tl.constexpr, NQM: tl.constexpr, NQR: tl.constexpr,
    D: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr, SW: tl.constexpr, PEER: tl.constexpr,
    BOUND: tl.constexpr = 0, STALE_ONLY: tl.constexpr = False,
):  # fmt: skip
    # (SW 1: the row's optimizer state too, after the versions; PEER: send_ptr is the table of
    # the queriers' receive rows, .payload_triton; STALE_ONLY: a mirror query's value written
    # only beyond the querier's bound (its table's BOUND column), the rows finish_values reads)
    k = tl.program_id(0) * BR + tl.arange(0, BR)
    km = k < W * q
    j = k // q
    e = k - j * q
    nqm = tl.load(sz_ptr + j * COLS + NQM, mask=km, other=0)
    nq = nqm + tl.load(sz_ptr + j * COLS + NQR, mask=km, other=0)
    v = km & (e < nq)
    h = j.to(tl.int64) * (s1 // 2)
    rid = tl.load(recv64_ptr + h + e, mask=v, other=0)
    rver = tl.load(recv64_ptr + h + q + e, mask=v, other=0)
    rid = tl.minimum(tl.maximum(rid, 0), num_rows - 1)
    slot = tl.load(slot_of_ptr + rid, mask=v, other=-1).to(tl.int64)
    ok = v & (slot >= 0)
    ver = tl.load(ver_ptr + slot, mask=ok, other=0)
    lag = tl.minimum(tl.maximum(ver - rver, -(2**31 - 1)), 2**31 - 1).to(tl.int32)
    o = payload_row(send_ptr, j, v, s2, PEER)
    tl.store(as32(o) + e, lag, mask=v)
    tl.store(as64(o) + (q + q * D) // 2 + e, ver, mask=v)
    if SW:
        sv = tl.load(state_ptr + slot, mask=ok, other=0.0)
        tl.store(o + 3 * q + q * D + e, sv, mask=v)
    read = ok
    if STALE_ONLY:
        qb = tl.load(sz_ptr + j * COLS + BOUND, mask=v, other=0)
        read = ok & ((e >= nqm) | beyond_bound(lag.to(tl.int64), qb))
    _rows(w_ptr, o[:, None], slot * D, q + e.to(tl.int64) * D, read, D, BD)


@triton.jit(do_not_specialize=["u"])
def finish_values_kernel(
    sz_ptr, blocks_ptr, slot_ptr, recv_ptr, w_ptr, ver_ptr, dacc_ptr, state_ptr, values_ptr,
    src_ptr, rows_ptr, deferred_ptr, total_ptr, u, n_own, bound, q, s2,
    W: tl.constexpr, B3: tl.constexpr, COLS: tl.constexpr, NQM: tl.constexpr,
    D: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr, SW: tl.constexpr,
    FROM_TABLE: tl.constexpr = False, PEER: tl.constexpr = False,
):  # fmt: skip
    # (SW 1: a refreshed mirror takes the owner's optimizer state too; FROM_TABLE: the values
    # of rows stored here are not written, their slot is, in src (-1: a row not stored here,
    # its value written): the lookup reads them from the table, .take; PEER: recv_ptr is the
    # table of this rank's reply rows in the owners' send buffers, read there: pulled)
    pid = tl.program_id(0)
    i = pid * BR + tl.arange(0, BR)
    ends, starts, t = _block_starts(blocks_ptr, W, B3)
    total = tl.sum(tl.where(t < 3 * W, ends - starts, 0), 0)
    live = (i < u) & (i < total)
    seg = tl.sum(((ends[None, :] <= i[:, None]) & (t < 3 * W)[None, :]).to(tl.int32), axis=1)
    seg = tl.where(live, seg, 0)
    e0 = i - _pick(starts, t, seg)
    mir = live & (seg >= W) & (seg < 2 * W)
    rem = live & (seg >= 2 * W)
    stored = live & (seg < 2 * W)
    j = tl.where(mir, seg - W, tl.where(rem, seg - 2 * W, 0))
    nqm = tl.load(sz_ptr + j * COLS + NQM, mask=rem, other=0)
    e = tl.where(rem, e0 + nqm, e0)  # position among the queries to owner j
    o = payload_row(recv_ptr, j, mir | rem, s2, PEER)  # (owner j's reply row)
    lag = tl.load(as32(o) + e, mask=mir, other=0).to(tl.int64)
    fresh = mir & beyond_bound(lag, bound)
    s = tl.load(slot_ptr + i, mask=stored, other=0).to(tl.int64)
    rver = tl.load(as64(o) + (q + q * D) // 2 + e, mask=fresh, other=0)
    tl.store(ver_ptr + s, rver, mask=fresh)
    if SW:
        rstate = tl.load(o + 3 * q + q * D + e, mask=fresh, other=0.0)
        tl.store(state_ptr + s, rstate, mask=fresh)
    k0 = tl.sum((mir & (lag == 0)).to(tl.int64), 0)
    k1 = tl.sum((mir & (lag > 0) & within_bound(lag, bound)).to(tl.int64), 0)
    k2 = tl.sum(fresh.to(tl.int64), 0)
    tl.atomic_add(rows_ptr + 0, k0, sem="relaxed")
    tl.atomic_add(rows_ptr + 1, k1, sem="relaxed")
    tl.atomic_add(rows_ptr + 2, k2, sem="relaxed")
    # (and the run's totals, total_ptr: no add of the step's counters after this kernel)
    tl.atomic_add(total_ptr + 0, k0, sem="relaxed")
    tl.atomic_add(total_ptr + 1, k1, sem="relaxed")
    tl.atomic_add(total_ptr + 2, k2, sem="relaxed")
    if pid == 0:
        deferred = tl.load(deferred_ptr)
        tl.store(rows_ptr + 3, deferred)
        tl.store(rows_ptr + 4, k0 * 0)
        tl.store(total_ptr + 3, tl.load(total_ptr + 3) + deferred)
    keep, put = stored, live  # (rows whose stored value is read; rows whose value is written)
    if FROM_TABLE:
        tl.store(src_ptr + i, tl.where(stored, s, -1), mask=i < u)
        keep, put = fresh & ~fresh, rem
    _finish_rows(
        o[:, None], w_ptr, dacc_ptr, values_ptr, q + e.to(tl.int64) * D, s, i, n_own, fresh,
        rem, keep, put, D, BD,
    )  # fmt: skip


@triton.jit
def _finish_rows(
    recv_ptr, w_ptr, dacc_ptr, values_ptr, r_off, s, i, n_own, fresh, rem, stored, live,
    D: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    # finish_values' rows: refreshed mirrors take the reply (+ their own unpushed delta), rows
    # not stored here the reply, the others their stored value; all into values[i]
    s_off = s * D
    m_off = tl.where(fresh, s - n_own, 0).to(tl.int64) * D
    v_off = i.to(tl.int64) * D
    from_reply = fresh | rem
    for d0 in tl.static_range(0, D, BD):
        c = d0 + tl.arange(0, BD)
        cm = (c < D)[None, :]
        rv = tl.load(
            recv_ptr + r_off[:, None] + c[None, :], mask=from_reply[:, None] & cm, other=0.0
        )
        fm = fresh[:, None] & cm
        new = rv + tl.load(dacc_ptr + m_off[:, None] + c[None, :], mask=fm, other=0.0)
        tl.store(w_ptr + s_off[:, None] + c[None, :], new, mask=fm)
        old = tl.load(
            w_ptr + s_off[:, None] + c[None, :], mask=(stored & ~fresh)[:, None] & cm, other=0.0
        )
        out = tl.where(fresh[:, None], new, tl.where(rem[:, None], rv, old))
        tl.store(values_ptr + v_off[:, None] + c[None, :], out, mask=live[:, None] & cm)


@triton.jit(do_not_specialize=["n"])
def take_values_kernel(
    w_ptr, src_ptr, values_ptr, inv_ptr, out_ptr, n, D: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    # out[o] = the table's row src[inv[o]] when stored here (>= 0), else values[inv[o]]
    # (.take: finish_values wrote only the rows not stored here)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < n
    i = tl.load(inv_ptr + rows, mask=rmask, other=0).to(tl.int64)
    s = tl.load(src_ptr + i, mask=rmask, other=-1)
    _copy_rows(w_ptr, out_ptr, tl.maximum(s, 0), rows, rmask & (s >= 0), D, BLOCK_D)
    _copy_rows(values_ptr, out_ptr, i, rows, rmask & (s < 0), D, BLOCK_D)
