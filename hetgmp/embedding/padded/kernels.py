"""Fused Triton kernels for the padded exchange's segments (:mod:`hetgmp.embedding.padded.buffers`).

Why: on 2x H200 at batch 8192 per GPU the padded step replayed ~290 small kernels inside its
CUDA graphs (torch's ``where`` / ``index_select`` / ``cumsum`` / ``cat``... each a few
microseconds, most of them on a few thousand elements); their sum, not the bytes, was the step's
GPU time (bench/results/gpu/profile_hetgmp-b100-pad_b8192_w2_H200.json). Here each segment is a
handful of kernels that read the counts from the device sizes tables and write the payloads in
place:

* pre-sync: :func:`presync_counts` (the last batch's counts: versions of its own rows, its
  mirrors' pending counts, its rows not stored here into the push inputs; the next batch's
  inputs copied in), :func:`count_due` (mirrors due for a push, per owner),
  :func:`presync_table` (the next batch's sizes table), and after the sizes exchange (nothing
  in it depends on gradient values) :func:`presync_values` (the gradient: own rows, the
  mirrors' local step, the pushed gradients);
* pack: :func:`pack_due` (due mirrors into the push payload, their state cleared) and
  :func:`pack_queries` (queries and the last batch's pushes into the payload);
* answer: :func:`answer_pushes` (owners apply the pushed gradients) and :func:`answer_queries`
  (lag, value and version of every query);
* finish: :func:`finish_values` (refresh mirrors beyond the bound, the batch's values).

With row-wise Adagrad (``st.sw``, the optimizer state's width) the same kernels stage the last
batch's own rows instead of applying them, take Adagrad's local step on mirrors, carry the
optimizer state in the replies and refresh it; the owner's update of its own and the pushed
rows (one per row of their sum) is :func:`.reference.merged_owner_update` (torch ops).

The reference each must match is the torch code of the same segment in
:mod:`.reference` (the ``torch`` backend runs it); tests
run both (Triton's interpreter on CPU ranks, and on GPUs) and compare every state tensor.

Payload layouts (per peer row, float32 units; int64 fields are pairs of float32, so every
capacity must be even, which :func:`hetgmp.embedding.padded.buffers.grow` guarantees):
exchange 1 ``[query ids 2q | query versions 2q | push ids 2p | push counts 2p | gradients p*D]``,
exchange 2 ``[lags q (int32) | values q*D | versions 2q]``. Entries past a peer's count are
never written nor read.
"""

from __future__ import annotations

import functools
import importlib
from types import SimpleNamespace
from typing import Any

import torch

from hetgmp.embedding import protocol, sizes
from hetgmp.embedding.kernels.launcher import row_tiles
from hetgmp.embedding.padded import owner_update as owner
from hetgmp.embedding.padded.peer_payloads import payload_target, reply_source
from hetgmp.embedding.padded.reference import (
    merged_owner_update,
)

# The mirrors due per owner read by the sizes table's kernel from the due mirrors' running count
# (at each owner group's end: mirrors are grouped by owner) instead of counted by
# count_due_kernel, a pass over every mirror with an atomic per owner and program (~10 us
# beside the 2-GPU forward at batch 8192 on 2 H100s, bench/results/gpu/scaling_diagnosis/
# timeline_8192_pull/); the running count, which pack's due list needs anyway, moves before
# the table and is kept for it. Exact (the same counts).
DUE_FROM_SCAN = True
# answer_queries writes a mirror query's value only when the querier refreshes it (its lag
# beyond the querier's bound, the rows finish_values reads), not for every mirror query: at
# the card's --store_rate 0.01 nearly every query is a mirror's version check and most are
# within the bound, so the owner wrote ~a row per query that nobody read. Exact (finish reads
# the same rows).
REPLY_STALE_ONLY = True


@functools.lru_cache(maxsize=1)
def _ns() -> Any:
    """The kernels (imported at the first fused segment: triton is needed only then)."""
    import triton

    k = importlib.import_module("hetgmp.embedding.padded.kernels_triton")
    pre = importlib.import_module("hetgmp.embedding.padded.presync_triton")
    due = importlib.import_module("hetgmp.embedding.padded.due_triton")
    return SimpleNamespace(
        triton=triton, presync_apply=pre.presync_apply_kernel, count_due=pre.count_due_kernel,
        presync_table=pre.presync_table_kernel, pack_due=k.pack_due_kernel,
        due_list=due.due_list_kernel, pack_due_list=due.pack_due_list_kernel,
        pack_queries=k.pack_queries_kernel, answer_pushes=k.answer_pushes_kernel,
        answer_queries=k.answer_queries_kernel, finish_values=k.finish_values_kernel,
    )  # fmt: skip


_COLS = dict(COLS=sizes.COLS, NQM=sizes.NQM, NQR=sizes.NQR)
_TABLE_COLS = {
    c: getattr(sizes, c)
    for c in ("NP", "NDUE", "STATUS", "BOUND", "SEND_ALL", "OP", "NOWN", "MAXQ", "MAXP", "PADDED")
}  # the other columns presync_table writes


def _p2(x: int) -> int:
    return _ns().triton.next_power_of_2(x)


def _tiles(d: int) -> tuple[int, int]:
    """(rows, columns) per program: the row kernels' tile rule (kernels._row_tiles)."""
    return row_tiles(_ns().triton, d)


def _grid(n: int, block: int) -> tuple[int]:
    return (max(1, _ns().triton.cdiv(n, block)),)


def presync_counts(st: Any, prev: Any, cur: Any) -> None:
    """The last batch (``prev``): what the next sizes table needs: its own rows' versions, its
    mirrors' pending counts, its rows not stored here (ids, counts) into the push inputs
    ``st.pr_*``; the next batch's (``cur``) ids and slots into ``st.u_ids`` / ``st.slot``;
    ``st.ndue`` zeroed for :func:`count_due`; ``prev``'s block bounds kept for
    :func:`presync_values`."""
    _presync_apply(st, prev, cur, counts=True)
    owner.own_entries_early(st)


def presync_values(st: Any, prev: Any) -> None:
    """The last batch's gradient (summed per row in ``st.grad``): SGD on its own rows, its
    mirrors' local step (value, delta and gradient accumulators), its pushed gradients into
    ``st.pr_grad``. After :func:`presync_counts` (it may run after the sizes exchange: nothing
    there depends on gradient values)."""
    own_sum = owner.take_own_sum(st)  # (SPLIT_SUM: the own rows' pass, not yet run)
    if owner.stages_beside(st):  # (the own rows' staging on their update's stream)

        def stage() -> None:
            if own_sum is not None:
                own_sum()
            _presync_apply(st, prev, prev, counts=False, part=1)

        owner.own_update_early(st, stage=stage)
        _presync_apply(st, prev, prev, counts=False, part=2)
        return
    if own_sum is not None:  # (no split update after all: the rows summed first)
        own_sum()
    _presync_apply(st, prev, prev, counts=False)
    owner.own_update_early(st)


def _presync_apply(st: Any, prev: Any, cur: Any, *, counts: bool, part: int = 0) -> None:
    k, e, cap = _ns(), st.store, st.cap
    br, bd = _tiles(st.d)
    own = _own(st)
    # (owner_update.STAGE_PUSHED_ONLY: only the own rows a push joins staged, by their marks)
    pushed_only = not counts and part == 0 and owner.stages_pushed_only(st)
    marks = st.own_entries[4] if pushed_only else own[0]
    k.presync_apply[_grid(max(cap.u, cap.n) if counts else cap.u, br)](
        st.sz_prev, st.prev_meta, prev.slot, prev.cnt, prev.u, st.grad, e.weight_full,
        e.version_full, e.delta_acc_full, e.grad_acc_full, e.pending_full, st.pr_ids,
        st.pr_cnt, st.pr_grad, st.pr_n, st.ndue, cur.u, cur.slot, st.u_ids, st.slot, *own,
        marks, e.n_own, cap.u, cap.n, -float(st.lr), float(st.opt.eps), e.trash_slot, W=st.w,
        WP=_p2(st.w), NOWN=sizes.NOWN, D=st.d, BR=br, BD=bd, COUNTS=counts, SW=st.sw, PART=part,
        PUSHED_ONLY=pushed_only, **_COLS,
    )  # fmt: skip
    if counts and st.sw:  # (entries past this batch's unique rows: none staged)
        st.own_slot[cap.u :].fill_(e.trash_slot)


def _own(st: Any) -> tuple[torch.Tensor, ...]:
    """The staged own rows and the optimizer state (row-wise Adagrad), or stand-ins the SGD
    kernels never read."""
    if st.sw:
        return st.own_slot, st.own_cnt, st.own_grad, st.store.opt_state_full
    return (st.store.version_full,) * 2 + (st.grad, st.grad)


def count_due(st: Any) -> None:
    """``st.ndue[j]`` += the number of mirrors of owner ``j`` with ``pending > bound``; with
    :data:`DUE_FROM_SCAN` the due mirrors' running count into ``st.due_csum`` instead, which
    :func:`presync_table` reads at the owner groups' ends (and :func:`due_prefix` may keep)."""
    e = st.store
    if e.n_mir == 0:
        return
    if DUE_FROM_SCAN:
        _due_scan(st)
        return
    _ns().count_due[_grid(e.n_mir, 1024)](
        e.pending, e.mir_owner, st.ndue, e.n_mir, int(st.bound), W=st.w, BLOCK=1024
    )  # (cut to the payload's room by presync_table, as reference.clamp_due)


def _due_scan(st: Any) -> None:
    e = st.store
    torch.cumsum(protocol.is_due(e.pending, st.bound), 0, out=st.due_csum)


def presync_table(st: Any, cur: Any, bound_cols: torch.Tensor, *, count: bool = False) -> None:
    """The next batch's sizes table into ``st.sz_mine`` (and its block sizes into
    ``st.blocks``), from its blocks, ``st.ndue`` and ``st.pr_n`` (the pushes of this step);
    ``st.ndue`` cut to the push payload's room first (:func:`.reference.clamp_due`).
    ``count``: also the replay counters from the table (:func:`.presync_step.count_replay`)."""
    cut = st.frozen and st.cap.p < st.cap.q  # (growing capacities take every push)
    e = st.store
    _ns().presync_table[(1,)](
        st.sz_mine, cur.blocks, st.ndue, st.pr_n, cur.bad, bound_cols.contiguous(),
        st.rank, st.blocks, st.cap_deferred, st.cap.p if cut else 1 << 62,
        st.ctx.counters.replay_dev, st.due_csum, e.mir_start, e.mir_end, W=st.w, WP=_p2(st.w),
        CP=_p2(sizes.COLS), **_COLS, **_TABLE_COLS, COUNT=count, SCAN=_scans(st),
    )  # fmt: skip


def _scans(st: Any) -> bool:
    """Whether the due mirrors per owner come from the due scan (:func:`count_due`)."""
    return bool(DUE_FROM_SCAN and st.store.n_mir)


def due_prefix(st: Any, *, listed: bool = False, scanned: bool = False) -> None:
    """What :func:`pack` needs before its kernels: the deferred count zeroed and the running
    count of due mirrors (``pending > bound``) into ``st.due_csum``. The mirrors' pending
    counts change in the counts phase only, so it may run right after that phase (off the
    exchange's chain when that phase runs early: :mod:`.presync_step`). ``listed``: also the
    due mirrors that fit the payload listed in ``st.due_list`` and the deferred ones counted
    (:mod:`.due_triton`; ``st.ndue`` final: after :func:`presync_table`), so that pack copies
    those only (``st.due_listed``). ``scanned``: the counts phase just made the running count
    (:func:`count_due` with :data:`DUE_FROM_SCAN`): kept."""
    st.deferred.zero_()
    e = st.store
    st.due_listed = listed
    if not e.n_mir:
        return
    if not (scanned and _scans(st)):
        _due_scan(st)
    if listed:
        _ns().due_list[_grid(e.n_mir, 1024)](
            e.pending, st.due_csum, e.mir_owner, e.mir_start, st.ndue, st.due_list,
            st.deferred, e.n_mir, int(st.bound), st.cap.p, BLOCK=1024,
        )  # fmt: skip


def pack(st: Any) -> None:
    """Exchange 1's payload into ``st.send1``: due mirrors (cleared here), queries, the last
    batch's pushes; zeroes the row counters :func:`finish_values` adds to."""
    k, e, cap = _ns(), st.store, st.cap
    br, bd = _tiles(st.d)
    if not st.due_ready:  # (else the counts phase made them: due_prefix)
        due_prefix(st)
    st.due_ready = False
    listed, st.due_listed = st.due_listed, False
    send, peer = payload_target(st, 1)  # (peer: straight into the owners' receive buffers)
    if e.n_mir and listed:  # (only the listed due mirrors: .due_triton)
        k.pack_due_list[_grid(st.w * cap.p, br)](
            st.due_list, e.pending, st.pr_n, st.ndue, e.stored_ids, e.version_full, e.grad_acc,
            e.delta_acc, send, e.n_own, cap.q, cap.p, st.s1, W=st.w, D=st.d, BR=br,
            BD=bd, EXACT=st.opt.exact_mirror, PEER=peer, IDS=not st.pushes_early,
        )  # fmt: skip
    elif e.n_mir:
        k.pack_due[_grid(e.n_mir, br)](
            e.pending, st.due_csum, e.mir_owner, e.mir_start, st.pr_n, st.ndue, e.stored_ids,
            e.version_full, e.grad_acc, e.delta_acc, send, st.deferred, e.n_mir,
            e.n_own, int(st.bound), cap.q, cap.p, st.s1, D=st.d, BR=br, BD=bd,
            EXACT=st.opt.exact_mirror, PEER=peer,
        )  # fmt: skip
    k.pack_queries[_grid(st.w * cap.q, br)](
        st.sz_mine, st.blocks, st.u_ids, st.slot, e.version_full, st.pr_n, st.pr_ids,
        st.pr_cnt, st.pr_grad, send, st.rows_step, cap.q, cap.p, st.s1,
        W=st.w, WP=_p2(st.w), B3=_p2(3 * st.w), D=st.d, BR=br, BD=bd, **_COLS, PEER=peer,
        IDS=not st.pushes_early,
    )  # fmt: skip


def answer(st: Any) -> None:
    """Owners apply the pushed gradients, then answer every query into ``st.send2``."""
    k, e, cap = _ns(), st.store, st.cap
    br, bd = _tiles(st.d)
    r64 = st.recv1.view(torch.int64)
    if st.sw and owner.FUSED_OWNER_UPDATE:  # one update per row of own rows and pushes
        owner.merged_owner_update_fused(st)
    elif st.sw:  # (torch ops)
        merged_owner_update(st)
    else:
        k.answer_pushes[_grid(st.w * cap.p, br)](
            st.sz_theirs, st.recv1, r64, e.slot_of, e.weight_full, e.version_full, e.num_rows,
            cap.q, cap.p, st.s1, -float(st.lr), W=st.w, COLS=sizes.COLS, NP=sizes.NP, D=st.d,
            BR=br, BD=bd,
        )  # fmt: skip
    send, peer = payload_target(st, 2)
    owner.join_own(st)  # (owner_update.OWN_SPLIT: the own rows updated beside)
    k.answer_queries[_grid(st.w * cap.q, br)](
        st.sz_theirs, r64, e.slot_of, e.weight_full, e.version_full, _own(st)[3], send,
        e.num_rows, cap.q, st.s1, st.s2, W=st.w, D=st.d, BR=br, BD=bd, SW=st.sw, **_COLS,
        PEER=peer, BOUND=sizes.BOUND, STALE_ONLY=REPLY_STALE_ONLY,
    )  # fmt: skip


def finish(st: Any) -> None:
    """Refresh the mirrors beyond the bound and write the batch's values into ``st.values``;
    the step's row counters into ``st.rows_step``, and added to the run's totals (the kernel
    adds them: no launch after it on the chain's end)."""
    k, e, cap = _ns(), st.store, st.cap
    br, bd = _tiles(st.d)
    r, peer = reply_source(st)  # (peer: the owners' send buffers, through a row table)
    k.finish_values[_grid(cap.u, br)](
        st.sz_mine, st.blocks, st.slot, r, e.weight_full, e.version_full, e.delta_acc_full, _own(st)[3], st.values, st.src,
        st.rows_step, st.deferred, st.ctx.counters.rows_dev_total, cap.u, e.n_own,
        int(st.bound), cap.q, st.s2, W=st.w, B3=_p2(3 * st.w), COLS=sizes.COLS, NQM=sizes.NQM,
        D=st.d, BR=br, BD=bd, SW=st.sw, FROM_TABLE=st.from_table, PEER=peer,
    )  # fmt: skip
