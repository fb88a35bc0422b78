"""The padded exchange's segments in torch ops: the reference the fused Triton kernels of
:mod:`.kernels` are tested against (the ``torch`` backend runs these), on the buffers of a
:class:`~.fields.SegmentBuffers` ``st`` (a :class:`~.buffers.StaticExchange`). Where a padding entry must
write somewhere, its row write goes to a *trash row* (one extra row after the real ones in each
state tensor, never read as data) and its count update adds 0 to some real row (spread over
rows: thousands of atomics on one address serialise).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from hetgmp.embedding import protocol, sizes
from hetgmp.embedding.kernels.rows import put_rows, scatter_add_rows, take_rows
from hetgmp.embedding.ops import stable_partition

if TYPE_CHECKING:  # pragma: no cover
    from hetgmp.embedding.padded.fields import SegmentBuffers
    from hetgmp.embedding.store import RowStore

_NQM, _NQR, _NP, _NDUE, _NOWN = sizes.NQM, sizes.NQR, sizes.NP, sizes.NDUE, sizes.NOWN


def clamp_due(st: SegmentBuffers, ndue: torch.Tensor) -> None:
    """Due pushes per owner (``ndue``, in place) cut to the room the push payload has after
    the last batch's rows not stored here (``st.pr_n``); the rest stay due, pending, and go at
    a later step (counted in ``st.cap_deferred``). Only a push capacity under the query
    capacity cuts (a whole-step graph's, :mod:`hetgmp.embedding.padded.whole`): pushes
    are rows the last batch queried, so ``p == q`` always fits."""
    if not st.frozen or st.cap.p >= st.cap.q:  # (growing capacities take every push)
        return
    room = torch.minimum(ndue, (st.cap.p - st.pr_n).clamp(min=0))
    st.cap_deferred.add_((ndue - room).sum())
    ndue.copy_(room)


def presync(st: SegmentBuffers, prev: Any, cur: Any, bound_cols: torch.Tensor) -> None:
    """The pre-sync segment with torch ops (the reference of the fused kernels)."""
    e, n = st.store, st.cap.n
    u, lr = st.cap.u, st.lr
    sz = st.sz_prev  # the table of ``prev`` (its ring slot's)
    n_o = sz[0, _NOWN]
    n_m = sz[:, _NQM].sum()
    nqr = sz[:, _NQR]
    g = st.grad
    # prev's own rows (block order: first n_o entries; padding skipped): SGD applies them
    # now, other optimizers stage them for the owner's merged update in ``answer``
    own = st.ar_u < n_o
    o_slot = prev.slot[:u]
    o_cnt = torch.where(own, prev.cnt[:u], 0)
    if st.sw:
        _stage_own(st, torch.where(own, o_slot, e.trash_slot), o_cnt, g[:u])
    else:
        scatter_add_rows(
            e.weight_full, torch.where(own, o_slot, st.skip_s), g[:u], -lr, backend=st.kernels
        )
        e.version_full.index_add_(0, torch.where(own, o_slot, st.spread_u), o_cnt)
    # prev's mirrors (entries n_o .. n_o + n_m): local step, accumulate, count
    i = (n_o + st.ar_wq).clamp(max=min(n, u) - 1)
    mir = st.ar_wq < n_m
    ms_all = prev.slot.index_select(0, i)
    ms = torch.where(mir, ms_all, st.skip_s)
    mi = torch.where(mir, ms_all - e.n_own, st.skip_m)
    gm = take_rows(g, i, backend=st.kernels)
    _mirror_local_step(st, e, ms, mi, gm)
    m_cnt = torch.where(mir, prev.cnt.index_select(0, i), 0)
    e.pending_full.index_add_(0, torch.where(mir, ms_all - e.n_own, st.spread_wq_m), m_cnt)
    # prev's rows not stored here: the push inputs of the next step
    r0 = n_o + n_m
    j = (r0 + st.ar_wq).clamp(max=min(n, u) - 1)
    st.pr_ids.copy_(prev.u.index_select(0, j))
    st.pr_cnt.copy_(prev.cnt.index_select(0, j))
    take_rows(g, j, out=st.pr_grad, backend=st.kernels)
    st.pr_n.copy_(nqr)
    # mirrors due for a push, per owner
    ndue = e.due_per_owner(protocol.is_due(e.pending, st.bound)) if e.n_mir else e.zeros_w.clone()
    clamp_due(st, ndue)  # (as many as the push payload has room for)
    # the next batch: inputs and sizes table
    st.u_ids.copy_(cur.u)
    st.slot.copy_(cur.slot)
    st.blocks.copy_(cur.blocks)
    table = sizes.sizes_table(
        cur.blocks, ndue + nqr, ndue, cur.bad.long(), bound_cols.unbind(1), st.rank
    )
    st.sz_mine.copy_(table)


def _stage_own(st: SegmentBuffers, slots: torch.Tensor, cnt: torch.Tensor, g: torch.Tensor) -> None:
    """The last batch's own rows (``slots``: trash where not own) for ``answer``'s merged
    update; entries past them unused."""
    k = slots.numel()
    st.own_slot[:k].copy_(slots)
    st.own_slot[k:].fill_(st.store.trash_slot)
    st.own_cnt[:k].copy_(cnt)
    st.own_grad[:k].copy_(g)


def _mirror_local_step(
    st: SegmentBuffers, e: RowStore, ms: torch.Tensor, mi: torch.Tensor, gm: torch.Tensor
) -> None:
    """Write rule for the last batch's mirrors (slots ``ms``, mirror rows ``mi``; padding:
    the trash rows): the optimizer's local step, the applied delta and the raw gradient
    accumulated (:func:`hetgmp.embedding.protocol.stage_mirror_updates` on fixed shapes)."""
    if st.sw:
        delta, state = st.opt.local_step(e.opt_state_full.index_select(0, ms), gm)
        e.opt_state_full.index_copy_(0, ms, state)  # (real mirrors are distinct)
        scatter_add_rows(e.weight_full, ms, delta, 1.0, backend=st.kernels)
        scatter_add_rows(e.delta_acc_full, mi, delta, 1.0, backend=st.kernels)
    else:
        scatter_add_rows(e.weight_full, ms, gm, -st.lr, backend=st.kernels)
        scatter_add_rows(e.delta_acc_full, mi, gm, -st.lr, backend=st.kernels)
    scatter_add_rows(e.grad_acc_full, mi, gm, 1.0, backend=st.kernels)


def pack(st: SegmentBuffers) -> None:
    """Queries (mirrors, then rows not stored, per owner) and pushes (the last batch's rows
    not stored here, then this rank's due mirrors, per owner) into ``send1``."""
    e, w, q, p, d = st.store, st.w, st.cap.q, st.cap.p, st.d
    # (first: a pushed mirror's version moves, and the queries carry the new one)
    if e.n_mir:
        _pack_due(st, e, w, p)
    # -- queries: every (peer, slot) reads its batch entry (a gather over w*q slots, not
    # a scatter of all n entries: most are owned rows, and their dummy writes collided)
    is_m, _, ipos = query_slots(st)  # (kept in buffers for _finish)
    q_ids = st.u_pad.index_select(0, ipos)
    ms = torch.where(is_m, st.slot_pad.index_select(0, ipos), e.trash_slot)
    q_ver = e.version_full.index_select(0, ms)
    # -- pushes: the last batch's rows not stored here (contiguous per owner)
    ends = torch.cumsum(st.pr_n, 0)
    jp = torch.searchsorted(ends, st.ar_wq, right=True).clamp(max=w - 1)
    posp = st.ar_wq - (ends - st.pr_n).index_select(0, jp)
    tp = torch.where(st.ar_wq < ends[-1:], jp * p + posp, w * p)
    st.p_ids.index_copy_(0, tp, st.pr_ids)
    st.p_cnt.index_copy_(0, tp, st.pr_cnt)
    put_rows(st.p_grad, tp, st.pr_grad, backend=st.kernels)
    torch.cat(
        [
            q_ids.view(w, q).view(torch.float32),
            q_ver.view(w, q).view(torch.float32),
            st.p_ids[: w * p].view(w, p).view(torch.float32),
            st.p_cnt[: w * p].view(w, p).view(torch.float32),
            st.p_grad[: w * p].view(w, p * d),
        ],
        dim=1,
        out=st.send1,
    )


def query_slots(st: SegmentBuffers) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For every query slot (peer j, position e; flat ``[w * q]``): whether it is a mirror
    query, whether it is a query of a row not stored here, and the batch entry it asks
    for (mirrors of owner j, then rows not stored of owner j, in block order; the pad
    entry ``n`` for empty slots). Written into :attr:`q_slots` (read again by
    :meth:`_finish`, in the same step)."""
    w = st.w
    nqm = st.sz_mine[:, _NQM]
    nq = nqm + st.sz_mine[:, _NQR]
    starts = torch.cumsum(st.blocks, 0) - st.blocks
    ar = st.ar_q[None, :]
    is_m = ar < nqm[:, None]
    is_r = ~is_m & (ar < nq[:, None])
    ipos = torch.where(
        is_m, starts[w : 2 * w, None] + ar, starts[2 * w : 3 * w, None] + ar - nqm[:, None]
    )
    ipos = torch.where(is_m | is_r, ipos, st.cap.n)
    q_m, q_r, q_pos = st.q_slots
    q_m.copy_(is_m.reshape(-1))
    q_r.copy_(is_r.reshape(-1))
    q_pos.copy_(ipos.reshape(-1))
    return st.q_slots


def _pack_due(st: SegmentBuffers, e: RowStore, w: int, p: int) -> None:
    """Due mirrors (``pending > bound``) into the push buffers, compacted and grouped by
    owner (as mirrors are stored); their pending state is cleared."""
    ndue = st.sz_mine[:, _NDUE]  # (those that fit the payload: see clamp_due)
    due = protocol.is_due(e.pending, st.bound)
    st.deferred.copy_(protocol.deferred_mask(e.pending, due).sum())
    n_mir = due.numel()
    perm, tot = stable_partition(due, e.mir_arange)
    di = perm
    ev = e.mir_arange
    jd = e.mir_owner.index_select(0, di)
    every = e.due_per_owner(due)  # (all due, fitting or not: the ranks within an owner)
    rank = ev - (torch.cumsum(every, 0) - every).index_select(0, jd)
    vd = (ev < tot) & (rank < ndue.index_select(0, jd))
    posd = st.pr_n.index_select(0, jd) + rank
    td = torch.where(vd, jd * p + posd, w * p)
    d_cnt = e.pending.index_select(0, di)
    st.p_ids.index_copy_(0, td, e.stored_ids.index_select(0, di + e.n_own))
    st.p_cnt.index_copy_(0, td, d_cnt)
    put_rows(st.p_grad, td, e.grad_acc.index_select(0, di), backend=st.kernels)
    if st.opt.exact_mirror:  # SGD: the mirror already holds what the owner will apply
        sp = e.mir_arange % max(1, e.trash_slot)
        e.version_full.index_add_(0, torch.where(vd, di + e.n_own, sp), torch.where(vd, d_cnt, 0))
    zi = torch.where(vd, di, n_mir)  # row n_mir of the mirror buffers: trash
    e.pending_full.index_fill_(0, zi, 0)
    e.grad_acc_full.index_fill_(0, zi, 0.0)
    e.delta_acc_full.index_fill_(0, zi, 0.0)


def answer(st: SegmentBuffers) -> None:
    """Owners apply the pushed gradients, then answer every query: lag, value, version."""
    e, w, q, d = st.store, st.w, st.cap.q, st.d
    r = st.recv1
    rq_ids = r[:, : 2 * q].contiguous().view(torch.int64).reshape(-1)
    rq_ver = r[:, 2 * q : 4 * q].contiguous().view(torch.int64).reshape(-1)
    nqm_in = st.sz_theirs[:, _NQM]
    nq_in = nqm_in + st.sz_theirs[:, _NQR]
    # -- pushes (SGD: every contribution added directly, padding into the trash row; other
    # optimizers: one update per row of the own and pushed gradients summed)
    if st.sw:
        merged_owner_update(st)
    else:
        pv, ps, rp_cnt, rp_grad = pushes_received(st)
        scatter_add_rows(
            e.weight_full, torch.where(pv, ps, st.skip_s), rp_grad, -st.lr, backend=st.kernels
        )
        e.version_full.index_add_(0, torch.where(pv, ps, st.spread_wp), torch.where(pv, rp_cnt, 0))
    # -- answers
    qv = (st.ar_q[None, :] < nq_in[:, None]).reshape(-1)
    qs = e.slot_of.index_select(0, rq_ids.clamp(0, e.num_rows - 1)).long()
    qs = torch.where(qv & (qs >= 0), qs, e.trash_slot)
    ver = e.version_full.index_select(0, qs)
    lag = (ver - rq_ver).clamp(-(2**31 - 1), 2**31 - 1).to(torch.int32)
    vals = take_rows(e.weight_full, qs, backend=st.kernels)
    parts = [
        lag.view(w, q).view(torch.float32),
        vals.view(w, q * d),
        ver.view(w, q).view(torch.float32),
    ]
    if st.sw:
        parts.append(e.opt_state_full.index_select(0, qs).view(w, q))
    torch.cat(parts, dim=1, out=st.send2)


def pushes_received(
    st: SegmentBuffers,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Payload 1's pushes: ``(valid [w*p], slots, counts, gradients [w*p, D])``."""
    e, p, d = st.store, st.cap.p, st.d
    r, o = st.recv1, 4 * st.cap.q
    rp_ids = r[:, o : o + 2 * p].contiguous().view(torch.int64).reshape(-1)
    rp_cnt = r[:, o + 2 * p : o + 4 * p].contiguous().view(torch.int64).reshape(-1)
    rp_grad = r[:, o + 4 * p :].reshape(-1, d)
    pv = (st.ar_p_push[None, :] < st.sz_theirs[:, _NP][:, None]).reshape(-1)
    ps = e.slot_of.index_select(0, rp_ids.clamp(0, e.num_rows - 1)).long()
    return pv, ps, rp_cnt, rp_grad


def merged_owner_update(st: SegmentBuffers) -> None:
    """Owners of a non-linear optimizer (Adagrad): the staged own rows and the pushes
    received, one update per row of their summed gradient (the fused path runs this too)."""
    pv, ps, rp_cnt, rp_grad = pushes_received(st)
    e = st.store
    _owner_update(st, e, torch.where(pv, ps, e.trash_slot), rp_grad, torch.where(pv, rp_cnt, 0))


def _owner_update(
    st: SegmentBuffers, e: RowStore, ps: torch.Tensor, pg: torch.Tensor, pc: torch.Tensor
) -> None:
    """One optimizer update per row of the staged own rows and the pushed ones (slots
    ``ps``, trash for padding; gradients ``pg``; counts ``pc``), as
    :func:`hetgmp.embedding.protocol.apply_at_owner`: every entry of a row finds the row's
    leader entry through a per-slot position map, the leader gets the row's sums, every
    entry writes the same new state and only the leader adds a step."""
    slots = torch.cat([st.own_slot, ps])
    valid = slots != e.trash_slot
    ar = st.ar_own
    st.pos_map.index_copy_(0, slots, ar)
    # A padding entry is its own leader and adds its zeros to a row of its own (``spread``):
    # all of them adding to the trash row's sums serialised their atomics (2 H200s, batch
    # 65536: a 28 ms step where the buffers held ~1M padding entries).
    lead = torch.where(valid, st.pos_map.index_select(0, slots), ar)
    grads = torch.cat([st.own_grad, pg]) * valid[:, None]
    gsum = torch.zeros_like(grads).index_add_(0, lead, grads)
    csum = torch.zeros_like(ar).index_add_(0, lead, torch.cat([st.own_cnt, pc]))
    is_lead = (lead == ar) & valid
    g_row = gsum.index_select(0, lead)
    state = e.opt_state_full.index_select(0, slots) + g_row.pow(2).mean(dim=1)
    e.opt_state_full.index_copy_(0, slots, state)  # (repeats write the same value)
    step = g_row * (st.lr / (state.sqrt() + st.opt.eps) * is_lead)[:, None]
    spread = torch.where(valid, slots, st.spread_own)
    scatter_add_rows(e.weight_full, spread, step, -1.0, backend=st.kernels)
    e.version_full.index_add_(0, spread, csum.index_select(0, lead) * is_lead)


def finish(st: SegmentBuffers) -> None:
    """Refresh the mirrors beyond the bound, then the batch's values in block order."""
    e, w, q, d, u = st.store, st.w, st.cap.q, st.d, st.cap.u
    r = st.recv2
    r_lag = r[:, :q].contiguous().view(torch.int32).long()  # [w, q]
    r_vals = r[:, q : q + q * d].reshape(w, q, d)
    r_ver = r[:, q + q * d : 3 * q + q * d].contiguous().view(torch.int64)  # [w, q]
    is_m, is_r, ipos = (t.view(w, q) for t in st.q_slots)  # (from _pack)
    ms = st.slot_pad.index_select(0, ipos.reshape(-1)).view(w, q)
    refresh = is_m & protocol.beyond_bound(r_lag, st.bound)
    rs = torch.where(refresh, ms, st.skip_s).reshape(-1)
    mi = torch.where(refresh, ms - e.n_own, e.n_mir).reshape(-1)
    new = r_vals.reshape(-1, d) + e.delta_acc_full.index_select(0, mi)
    put_rows(e.weight_full, rs, new, backend=st.kernels)
    put_rows(e.version_full.view(-1, 1), rs, r_ver.reshape(-1, 1), backend=st.kernels)
    if st.sw:  # the owner's optimizer state, as the exact transport's refresh
        r_state = r[:, 3 * q + q * d :].reshape(-1, 1)
        put_rows(e.opt_state_full.view(-1, 1), rs, r_state, backend=st.kernels)
    # values: owned + mirror rows from storage, rows not stored here from the reply
    n_om = st.sz_mine[0, _NOWN] + st.sz_mine[:, _NQM].sum()
    if st.from_table:  # (the stored rows' slots instead of their values: .take)
        st.src[:u].copy_(torch.where(st.ar_u < n_om, st.slot[:u], -1))
    else:
        src = torch.where(st.ar_u < n_om, st.slot[:u], e.trash_slot)
        take_rows(e.weight_full, src, out=st.values[:u], backend=st.kernels)
    tv = torch.where(is_r, ipos, st.skip_u).reshape(-1)
    put_rows(st.values, tv, r_vals.reshape(-1, d), backend=st.kernels)
    torch.stack(
        [
            (is_m & (r_lag == 0)).sum(),
            (is_m & (r_lag > 0) & protocol.within_bound(r_lag, st.bound)).sum(),
            refresh.sum(),
            st.deferred,
            st.deferred * 0,
        ],
        out=st.rows_step,
    )
    st.ctx.counters.rows_dev_total.add_(st.rows_step)


def reference_buffers(
    self: Any, emb: Any, w: int, q: int, p: int, u: int, d: int, i64: Any
) -> None:
    """Scratch and constants of the torch segments only (the fused kernels need none)."""
    dev = emb.device
    # push scratch written by scatters (index w*p: trash)
    self.p_ids = torch.zeros(w * p + 1, **i64)
    self.p_cnt = torch.zeros(w * p + 1, **i64)
    self.p_grad = torch.zeros(w * p + 1, d, device=dev)
    # constants
    self.ar_u = torch.arange(u, **i64)
    self.ar_q = torch.arange(q, **i64)
    self.ar_p = torch.arange(p, **i64)
    self.ar_wp = torch.arange(w * p, **i64)
    self.ar_wq = torch.arange(w * q, **i64)
    # the query slots of the current step (see _query_slots)
    self.q_slots = (
        torch.zeros(w * q, dtype=torch.bool, device=dev),
        torch.zeros(w * q, dtype=torch.bool, device=dev),
        torch.zeros(w * q, **i64),
    )
    # where padding entries go: row writes to the trash rows, count adds of 0 spread
    # over real rows
    self.skip_s = emb.trash_slot  # weight / version rows
    self.skip_m = emb.n_mir  # mirror buffers
    self.skip_u = u  # values
    s_rows = max(1, emb.trash_slot)
    self.spread_u = self.ar_u % s_rows
    self.spread_wp = self.ar_wp % s_rows
    self.spread_wq_m = self.ar_wq % max(1, emb.n_mir)
