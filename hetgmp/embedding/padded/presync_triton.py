"""The Triton kernels of the padded exchange's pre-sync segment (module-level ``@triton.jit``
functions; this module imports triton, so :mod:`.kernels` imports it only when a fused segment
runs): the last batch's counts and gradient (``presync_apply_kernel``), the mirrors due per
owner (``count_due_kernel``) and the next batch's sizes table (``presync_table_kernel``). The
torch reference: :func:`.reference.presync`.
"""
# ruff: noqa: N803 - Triton's constexpr parameters are upper case by convention

from __future__ import annotations

import triton
import triton.language as tl

from hetgmp.embedding.padded.rule_triton import is_due

# The batch's distinct rows (u) and ids (n) change with the batch: do_not_specialize (else a
# partial batch compiles the kernel again: a ~5 s stall on 2 H100s, see kernels_triton and
# tests/test_kernel_specialization.py). The table's fixed counts keep their specialization.


@triton.jit(do_not_specialize=["u", "n"])
def presync_apply_kernel(
    sz_ptr, meta_ptr, p_slot_ptr, p_cnt_ptr, p_u_ptr, g_ptr, w_ptr, ver_ptr, dacc_ptr,
    gacc_ptr, pend_ptr, pr_ids_ptr, pr_cnt_ptr, pr_grad_ptr, pr_n_ptr, ndue_ptr, c_u_ptr,
    c_slot_ptr, u_ids_ptr, slot_ptr, os_ptr, oc_ptr, og_ptr, state_ptr, pushed_ptr, n_own, u,
    n, neg_lr, eps, trash,
    W: tl.constexpr, WP: tl.constexpr, COLS: tl.constexpr, NQM: tl.constexpr,
    NQR: tl.constexpr, NOWN: tl.constexpr, D: tl.constexpr, BR: tl.constexpr,
    BD: tl.constexpr, COUNTS: tl.constexpr, SW: tl.constexpr, PART: tl.constexpr = 0,
    PUSHED_ONLY: tl.constexpr = False,
):  # fmt: skip
    # COUNTS: the part the sizes table needs (counts, versions, push ids, the next batch's
    # inputs), reading the last batch's table and keeping its block bounds in meta;
    # else the gradient's part (values, accumulators, pushed gradients), from meta (the
    # table holds the next batch's by then). SW 1 (row-wise Adagrad): own rows are staged
    # (os/oc/og: slot, count, gradient; trash slot where not own) for the owner's merged
    # update instead of applied, and mirrors take Adagrad's local step (state: per slot).
    # PART (the gradient's part, SW 1): 0 every entry, 1 the own rows' staging only, 2 the
    # others only (owner_update.STAGE_BESIDE: the staging on the own rows' stream).
    # PUSHED_ONLY (owner_update.STAGE_PUSHED_ONLY): only the own rows a push joins are staged
    # (pushed_ptr: their marks by entry), the others neither read nor copied
    pid = tl.program_id(0)
    i = pid * BR + tl.arange(0, BR)
    if COUNTS:
        n_o, r0, r1 = _last_blocks(sz_ptr, meta_ptr, pr_n_ptr, ndue_ptr, pid, W, WP, COLS, NQM,
                                   NQR, NOWN)  # fmt: skip
        cm = i < n  # the next batch's inputs
        tl.store(u_ids_ptr + i, tl.load(c_u_ptr + i, mask=cm), mask=cm)
        tl.store(slot_ptr + i, tl.load(c_slot_ptr + i, mask=cm), mask=cm)
    else:
        n_o = tl.load(meta_ptr + 0)
        r0 = tl.load(meta_ptr + 1)
        r1 = tl.load(meta_ptr + 2)
    live, own, mir, rem = _entries(i, u, n_o, r0, r1, pushed_ptr, PART, PUSHED_ONLY)
    stored = own | mir
    s = tl.load(p_slot_ptr + i, mask=stored, other=0).to(tl.int64)
    mi = tl.where(mir, s - n_own, 0)
    k = tl.where(rem, i - r0, 0)
    if COUNTS:
        _counts(
            p_cnt_ptr, p_u_ptr, ver_ptr, pend_ptr, pr_ids_ptr, pr_cnt_ptr, os_ptr, oc_ptr, i, s,
            mi, k, live, own, mir, rem, u, trash, SW,
        )  # fmt: skip
    elif SW == 0:
        _gradient_rows(
            g_ptr, w_ptr, dacc_ptr, gacc_ptr, pr_grad_ptr, i, s, mi, k, live, stored, mir, rem,
            neg_lr, D, BD,
        )  # fmt: skip
    else:
        _gradient_rows_adagrad(
            g_ptr, w_ptr, dacc_ptr, gacc_ptr, pr_grad_ptr, og_ptr, state_ptr, i, s, mi, k, live,
            own, mir, rem, neg_lr, eps, D, BR, BD,
        )  # fmt: skip


@triton.jit
def _entries(i, u, n_o, r0, r1, pushed_ptr, PART: tl.constexpr, PUSHED_ONLY: tl.constexpr):
    # the last batch's entries i in block order (own rows | mirrors | rows not stored here):
    # (live, own, mir, rem), cut to PART's, and with PUSHED_ONLY the own rows a push joins only
    live = i < tl.minimum(u, r1)
    own = live & (i < n_o)
    mir = live & (i >= n_o) & (i < r0)
    rem = live & (i >= r0)
    if PART == 1:  # (the own rows' staging only)
        mir = mir & (i < 0)
        rem = rem & (i < 0)
        live = own
    if PART == 2:  # (the mirrors and the pushes only)
        own = own & (i < 0)
        live = mir | rem
    if PUSHED_ONLY:
        own = own & (tl.load(pushed_ptr + i, mask=own, other=0) != 0)
        live = own | mir | rem
    return live, own, mir, rem


@triton.jit
def _gradient_rows_adagrad(
    g_ptr, w_ptr, dacc_ptr, gacc_ptr, pr_grad_ptr, og_ptr, state_ptr, i, s, mi, k, live, own,
    mir, rem, neg_lr, eps, D: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    # _gradient_rows for row-wise Adagrad: own rows' gradients staged (og), mirrors' local
    # step (s += mean(g^2), delta = -lr g / (sqrt(s) + eps)), pushed gradients (push slot k)
    gi = i.to(tl.int64) * D
    ss = tl.zeros([BR], dtype=tl.float32)
    for d0 in tl.static_range(0, D, BD):
        c = d0 + tl.arange(0, BD)
        m = mir[:, None] & (c < D)[None, :]
        g = tl.load(g_ptr + gi[:, None] + c[None, :], mask=m, other=0.0)
        ss += tl.sum(g * g, axis=1)
    state = tl.load(state_ptr + s, mask=mir, other=0.0) + ss / D
    tl.store(state_ptr + s, state, mask=mir)
    scale = neg_lr / (tl.sqrt(state) + eps)
    s_off = s * D
    m_off = mi.to(tl.int64) * D
    k_off = k.to(tl.int64) * D
    for d0 in tl.static_range(0, D, BD):
        c = d0 + tl.arange(0, BD)
        cmask = (c < D)[None, :]
        g = tl.load(g_ptr + gi[:, None] + c[None, :], mask=live[:, None] & cmask, other=0.0)
        tl.store(og_ptr + gi[:, None] + c[None, :], g, mask=own[:, None] & cmask)
        mm = mir[:, None] & cmask
        delta = g * scale[:, None]
        ws = w_ptr + s_off[:, None] + c[None, :]
        tl.store(ws, tl.load(ws, mask=mm) + delta, mask=mm)
        da = dacc_ptr + m_off[:, None] + c[None, :]
        tl.store(da, tl.load(da, mask=mm) + delta, mask=mm)
        ga = gacc_ptr + m_off[:, None] + c[None, :]
        tl.store(ga, tl.load(ga, mask=mm) + g, mask=mm)
        tl.store(pr_grad_ptr + k_off[:, None] + c[None, :], g, mask=rem[:, None] & cmask)


@triton.jit
def _last_blocks(
    sz_ptr, meta_ptr, pr_n_ptr, ndue_ptr, pid, W: tl.constexpr, WP: tl.constexpr,
    COLS: tl.constexpr, NQM: tl.constexpr, NQR: tl.constexpr, NOWN: tl.constexpr,
):  # fmt: skip
    # the last batch's block bounds (own rows end, mirrors end, rows not stored end) from its
    # sizes table; program 0 keeps them in meta and writes the push counts per owner
    j = tl.arange(0, WP)
    jm = j < W
    nqm = tl.load(sz_ptr + j * COLS + NQM, mask=jm, other=0)
    nqr = tl.load(sz_ptr + j * COLS + NQR, mask=jm, other=0)
    n_o = tl.load(sz_ptr + NOWN)
    r0 = n_o + tl.sum(nqm, 0)
    r1 = r0 + tl.sum(nqr, 0)
    if pid == 0:
        tl.store(pr_n_ptr + j, nqr, mask=jm)
        tl.store(ndue_ptr + j, nqr * 0, mask=jm)
        tl.store(meta_ptr + 0, n_o)
        tl.store(meta_ptr + 1, r0)
        tl.store(meta_ptr + 2, r1)
    return n_o, r0, r1


@triton.jit
def _gradient_rows(
    g_ptr, w_ptr, dacc_ptr, gacc_ptr, pr_grad_ptr, i, s, mi, k, live, stored, mir, rem, neg_lr,
    D: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    # presync_apply's gradient part for entries i of the last batch: SGD on stored rows s,
    # the mirrors' accumulators (row mi), the pushed gradients (push slot k)
    gi = i.to(tl.int64) * D
    s_off = s * D
    m_off = mi.to(tl.int64) * D
    k_off = k.to(tl.int64) * D
    for d0 in tl.static_range(0, D, BD):
        c = d0 + tl.arange(0, BD)
        cmask = (c < D)[None, :]
        g = tl.load(g_ptr + gi[:, None] + c[None, :], mask=live[:, None] & cmask, other=0.0)
        ws = w_ptr + s_off[:, None] + c[None, :]
        sm = stored[:, None] & cmask
        tl.store(ws, tl.load(ws, mask=sm) + neg_lr * g, mask=sm)
        mm = mir[:, None] & cmask
        da = dacc_ptr + m_off[:, None] + c[None, :]
        tl.store(da, tl.load(da, mask=mm) + neg_lr * g, mask=mm)
        ga = gacc_ptr + m_off[:, None] + c[None, :]
        tl.store(ga, tl.load(ga, mask=mm) + g, mask=mm)
        tl.store(pr_grad_ptr + k_off[:, None] + c[None, :], g, mask=rem[:, None] & cmask)


@triton.jit
def count_due_kernel(
    pend_ptr, owner_ptr, ndue_ptr, n_mir, bound, W: tl.constexpr, BLOCK: tl.constexpr
):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n_mir
    due = m & is_due(tl.load(pend_ptr + i, mask=m, other=0), bound)
    o = tl.load(owner_ptr + i, mask=m, other=0)
    for j in tl.static_range(W):
        k = tl.sum((due & (o == j)).to(tl.int64), 0)
        if k > 0:
            tl.atomic_add(ndue_ptr + j, k, sem="relaxed")


@triton.jit
def presync_table_kernel(
    out_ptr, blocks_ptr, ndue_ptr, nqr_ptr, bad_ptr, consts_ptr, rank, blocks_out_ptr,
    cap_def_ptr, room_p, count_ptr, csum_ptr, mstart_ptr, mend_ptr, W: tl.constexpr,
    WP: tl.constexpr, COLS: tl.constexpr, CP: tl.constexpr, NQM: tl.constexpr,
    NQR: tl.constexpr, NP: tl.constexpr, NDUE: tl.constexpr, STATUS: tl.constexpr,
    BOUND: tl.constexpr, SEND_ALL: tl.constexpr, OP: tl.constexpr, NOWN: tl.constexpr,
    MAXQ: tl.constexpr, MAXP: tl.constexpr, PADDED: tl.constexpr, COUNT: tl.constexpr = False,
    SCAN: tl.constexpr = False,
):  # fmt: skip
    # one program: the sizes table (see hetgmp.embedding.sizes.sizes_table); the due pushes
    # per owner cut to the push payload's room (room_p: its capacity, reference.clamp_due)
    # and the block sizes copied for the pack kernels; COUNT: a replayed step's owned rows,
    # rows not stored here and pushes added to count_ptr[0:3] (presync_step.count_replay's
    # sums, here instead of four small kernels); SCAN: the due mirrors per owner from their
    # running count csum at each owner's mirror group [mstart, mend) (kernels.DUE_FROM_SCAN)
    j = tl.arange(0, WP)
    jm = j < W
    b3 = tl.arange(0, 4 * WP)
    b3m = b3 < 3 * W
    tl.store(blocks_out_ptr + b3, tl.load(blocks_ptr + b3, mask=b3m, other=0), mask=b3m)
    mir = tl.load(blocks_ptr + W + j, mask=jm, other=0)
    rem = tl.load(blocks_ptr + 2 * W + j, mask=jm, other=0)
    pr_n = tl.load(nqr_ptr + j, mask=jm, other=0)
    due = _due_per_owner(ndue_ptr, csum_ptr, mstart_ptr, mend_ptr, j, jm, SCAN)
    ndue = tl.minimum(due, tl.maximum(room_p - pr_n, 0))
    tl.store(ndue_ptr + j, ndue, mask=jm)
    tl.store(cap_def_ptr, tl.load(cap_def_ptr) + tl.sum(due - ndue, 0))
    npush = ndue + pr_n
    bad = tl.load(bad_ptr).to(tl.int64)
    n_own = tl.load(blocks_ptr + rank)
    maxq = tl.max(mir + rem, 0)
    maxp = tl.max(npush, 0)
    c = tl.arange(0, CP)
    cm = c < COLS
    bound = tl.load(consts_ptr + j * 4 + 0, mask=jm, other=0)
    send_all = tl.load(consts_ptr + j * 4 + 1, mask=jm, other=0)
    op = tl.load(consts_ptr + j * 4 + 2, mask=jm, other=0)
    padded = tl.load(consts_ptr + j * 4 + 3, mask=jm, other=0)
    z = mir * 0
    row = tl.where(c[None, :] == NQM, mir[:, None], z[:, None])
    row = tl.where(c[None, :] == NQR, rem[:, None], row)
    row = tl.where(c[None, :] == NP, npush[:, None], row)
    row = tl.where(c[None, :] == NDUE, ndue[:, None], row)
    row = tl.where(c[None, :] == STATUS, (z + bad)[:, None], row)
    row = tl.where(c[None, :] == BOUND, bound[:, None], row)
    row = tl.where(c[None, :] == SEND_ALL, send_all[:, None], row)
    row = tl.where(c[None, :] == OP, op[:, None], row)
    row = tl.where(c[None, :] == NOWN, (z + n_own)[:, None], row)
    row = tl.where(c[None, :] == MAXQ, (z + maxq)[:, None], row)
    row = tl.where(c[None, :] == MAXP, (z + maxp)[:, None], row)
    row = tl.where(c[None, :] == PADDED, padded[:, None], row)
    tl.store(out_ptr + j[:, None] * COLS + c[None, :], row, mask=jm[:, None] & cm[None, :])
    if COUNT:
        tl.store(count_ptr + 0, tl.load(count_ptr + 0) + n_own)
        tl.store(count_ptr + 1, tl.load(count_ptr + 1) + tl.sum(rem, 0))
        tl.store(count_ptr + 2, tl.load(count_ptr + 2) + tl.sum(npush, 0))


@triton.jit
def _due_per_owner(ndue_ptr, csum_ptr, mstart_ptr, mend_ptr, j, jm, SCAN: tl.constexpr):
    # the due mirrors of owners j: counted by count_due_kernel into ndue, or (SCAN) their
    # running count csum at the end of each owner's mirror group [mstart, mend) less its start
    if SCAN:
        ms = tl.load(mstart_ptr + j, mask=jm, other=0)
        me = tl.load(mend_ptr + j, mask=jm, other=0)
        some = jm & (me > ms)
        hi = tl.load(csum_ptr + me - 1, mask=some, other=0)
        return hi - tl.load(csum_ptr + ms - 1, mask=some & (ms > 0), other=0)
    return tl.load(ndue_ptr + j, mask=jm, other=0)


@triton.jit
def _counts(
    p_cnt_ptr, p_u_ptr, ver_ptr, pend_ptr, pr_ids_ptr, pr_cnt_ptr, os_ptr, oc_ptr, i, s, mi, k,
    live, own, mir, rem, u, trash, SW: tl.constexpr,
):  # fmt: skip
    # presync_apply's counts part for entries i of the last batch (a batch's rows are distinct:
    # plain read-modify-writes, no atomics; a mirror's version moves when its pending count is
    # pushed, not here)
    cnt = tl.load(p_cnt_ptr + i, mask=live, other=0)
    if SW == 0:
        tl.store(ver_ptr + s, tl.load(ver_ptr + s, mask=own) + cnt, mask=own)
    else:
        tl.store(os_ptr + i, tl.where(own, s, trash), mask=i < u)
        tl.store(oc_ptr + i, tl.where(own, cnt, 0), mask=i < u)
    tl.store(pend_ptr + mi, tl.load(pend_ptr + mi, mask=mir) + cnt, mask=mir)
    tl.store(pr_ids_ptr + k, tl.load(p_u_ptr + i, mask=rem), mask=rem)
    tl.store(pr_cnt_ptr + k, cnt, mask=rem)
