"""A multi-rank step with fixed-size ("padded") payloads, for CUDA graphs.

:class:`hetgmp.embedding.DistributedEmbedding`'s exact step sizes every payload exactly:
after the sizes exchange (the step's one host sync) it slices, splits and concatenates with the
host-known counts, about 150 small ops per step launched one by one from Python. On a GPU that
launch work, not the bytes, was the step's cost (2x H200, batch 8192, session 2's profiles at
commit 71a5f07: GPU busy 21-53 %, ~195 kernels and ~153 launches per step).

Here the same arithmetic runs on buffers of fixed *capacities*: ``q`` query rows and ``p``
pushed rows per peer, ``u`` unique rows per batch. Counts live on the device (the sizes tables),
rows past a count are padding. A padding entry's row write is skipped by the Triton kernels
(negative index) or, with the torch backend, goes to a *trash row* (one extra row after the
real ones in each state tensor, never read as data); a padding entry's count update adds 0 to
some real row (spread over rows: thousands of atomics on one address serialise).

With fixed shapes a step is a few CUDA graphs, each captured once and then replayed: the ids'
preprocessing (:class:`PrepRing`, on the prefetch stream), the part before the sizes exchange
(:meth:`StaticExchange.presync`: the last batch's counts, the next batch's sizes table), the
gradient's part (its per-row sum, own rows, the mirrors' local step, the push inputs: after the
sizes exchange, nothing there depends on gradient values) and the step proper (pack, exchange,
answer, exchange, finish). On NCCL with ``graph_collectives`` the all-to-alls (sizes included,
with the device->host copy of the sizes into pinned memory) are captured too, on a process group
of their own: the host replays the graphs and waits once, for the sizes. With the Triton backend
each segment is a few fused kernels (:mod:`hetgmp.embedding.padded_kernels`; the torch ops below
are their reference). Measured on 2x H200 at batch 8192 per GPU: 65 kernels per step (was ~290
with torch ops), 17-24M samples/s (bench/results/gpu/results_2xH200.md).

Capacities are agreed by all ranks: each rank puts its largest per-peer query and push count in
the sizes table, every rank reads every rank's, and a capacity grows (never shrinks) when the
global maximum exceeds it, by the same rule everywhere. A growth rebuilds the buffers and
graphs (warm-up, then capture at the next use).

Scope: SGD (linear, so own rows may be applied before the pushes arrive), ``replies="all"`` (reply
sizes are the query counts), training forward steps. Everything else (Adagrad, audit, eval,
flush) takes the dynamic step; both read and write the same state, so they mix freely.
Reads the same values and applies the same updates as the dynamic step (tests compare them).
Bytes: the padding travels too (bench: 1,259 vs 830 B/sample at bound 100, batch 8192).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from hetgmp.comm.exchange import exchange_fixed
from hetgmp.embedding import padded_kernels, sizes
from hetgmp.embedding.kernels import put_rows, scatter_add_rows, take_rows
from hetgmp.embedding.ops import current_stream, stable_partition

if TYPE_CHECKING:  # pragma: no cover
    from hetgmp.comm.env import DistEnv
    from hetgmp.embedding.distributed import DistributedEmbedding

_NQM, _NQR, _NP, _NDUE, _NOWN = sizes.NQM, sizes.NQR, sizes.NP, sizes.NDUE, sizes.NOWN


@dataclasses.dataclass(frozen=True)
class Capacity:
    """Fixed sizes of one set of static buffers."""

    q: int  # query rows per peer (each way)
    p: int  # pushed rows per peer (each way)
    u: int  # unique rows of this rank's batch
    n: int  # occurrences per batch (batch x fields)


def grow(cap: int, need: int, *, quantum: int = 256) -> int:
    """The capacity after seeing ``need`` (the same on every rank for the same inputs):
    unchanged while it fits, else ``need`` plus a half, rounded up to ``quantum`` (each growth
    rebuilds buffers and recaptures graphs: generous headroom keeps that to the first steps)."""
    if need <= cap and cap > 0:
        return cap
    want = need + need // 2 + 1
    return -(-want // quantum) * quantum


class StaticExchange:
    """Buffers and segments for one :class:`Capacity` (see the module docstring)."""

    def __init__(
        self, emb: DistributedEmbedding, cap: Capacity, *, graphs: bool, comm: DistEnv | None = None
    ) -> None:
        self.emb, self.cap = emb, cap
        # The collectives of the padded step run on ``comm`` (default: the embedding's env).
        # A communicator of their own (see DistributedEmbedding._padded_comm) lets them be
        # captured inside the graphs: a step is then two graph replays and one host wait.
        self.comm = comm if comm is not None else emb.env
        self.comm_in_graphs = graphs and self.comm is not emb.env
        self._frozen = (emb.bound, emb.opt.lr)  # constants inside the captured graphs
        w, d, dev = emb.env.world_size, emb.dim, emb.device
        self.w, self.d = w, d
        q, p, u, n = cap.q, cap.p, cap.u, cap.n
        # Triton: each segment is a few fused kernels (padded_kernels); torch: the reference
        # op sequences below. The fused kernels read int64 fields as pairs of float32 at even
        # offsets: even capacities (grow() gives multiples of 256).
        self.fused = emb.kernels == "triton"
        if self.fused and (q % 2 or p % 2):
            raise ValueError(f"the fused padded kernels need even capacities, got {cap}")
        i64 = dict(dtype=torch.int64, device=dev)
        # inputs, written by load() or by the pre-sync segment before the others run
        # batch unique ids in block order (+ padding), plus a pad entry (n) for empty slots
        self.u_pad = torch.zeros(n + 1, **i64)
        self.u_ids = self.u_pad[:n]
        # slots, plus one entry (n) pointing at the trash row, where padding entries look
        self.slot_pad = torch.full((n + 1,), emb.trash_slot, **i64)
        self.slot = self.slot_pad[:n]
        self.blocks = torch.zeros(3 * w, **i64)
        # the sizes table sent (row 0) and received (row 1): one buffer, so the host's copy
        # is one copy without a stack
        self.sz_both = torch.zeros(2, w, sizes.COLS, **i64)
        self.sz_mine, self.sz_theirs = self.sz_both[0], self.sz_both[1]
        # both tables for the host (pinned: the copy can be a node of the pre-sync graph)
        self.host_sizes = torch.zeros(
            2, w, sizes.COLS, dtype=torch.int64, pin_memory=dev.type == "cuda"
        )
        self._sizes_ready = torch.cuda.Event() if dev.type == "cuda" else None
        # the last batch's rows not stored here (pushed this step): at most q per owner, as
        # they were queries of the last batch
        self.pr_ids = torch.zeros(w * q, **i64)
        self.pr_cnt = torch.zeros(w * q, **i64)
        self.pr_grad = torch.zeros(w * q, d, device=dev)
        self.pr_n = torch.zeros(w, **i64)  # ... per owner
        self.ndue = torch.zeros(w, **i64)  # mirrors due per owner (fused pre-sync)
        self.prev_meta = torch.zeros(4, **i64)  # the last batch's block bounds (fused pre-sync)
        # payloads: per peer [query ids | mirror versions | push ids | push counts] as int64
        # pairs of float32, then the pushed gradients; reply: [lag | values | version]
        self.s1 = 4 * q + 4 * p + p * d
        self.s2 = q + q * d + 2 * q
        # what a step sends to (and receives from) the other ranks, by kind: the whole
        # padded buffers (DistributedEmbedding's byte counters)
        o = w - 1
        self.bytes_per_step = {
            "ids": o * 8 * (q + p),
            "versions": o * (8 * q + 8 * p + 8 * q + 4 * q),
            "gradients": o * 4 * d * p,
            "values": o * 4 * d * q,
        }
        assert sum(self.bytes_per_step.values()) == 4 * o * (self.s1 + self.s2)
        self.send1 = torch.zeros(w, self.s1, device=dev)
        self.recv1 = torch.zeros(w, self.s1, device=dev)
        self.send2 = torch.zeros(w, self.s2, device=dev)
        self.recv2 = torch.zeros(w, self.s2, device=dev)
        # outputs
        self.values = torch.zeros(u + 1, d, device=dev)  # row u: trash
        self.rows_step = torch.zeros(5, **i64)
        self.deferred = torch.zeros((), **i64)
        # the gradient of this batch's values, summed per row (see sum_grad; at a fixed
        # address for the next step's pre-sync graph)
        self.grad = torch.zeros(u + 1, d, device=dev)
        self._graphs = GraphCache(graphs)
        if not self.fused:
            self._reference_buffers(emb, w, q, p, u, d, i64)

    def _reference_buffers(
        self, emb: DistributedEmbedding, w: int, q: int, p: int, u: int, d: int, i64: Any
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

    # ------------------------------------------------------------------ host side
    def load(
        self,
        prep_u: torch.Tensor,
        prep_slot: torch.Tensor,
        prep_blocks: torch.Tensor,
        sz_mine: torch.Tensor,
        sz_theirs: torch.Tensor,
        pushes: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None,
    ) -> None:
        """Copy a step's inputs into the fixed buffers (``pushes``: the last batch's rows not
        stored here: ids, counts, gradients (host-known length) and per-owner counts)."""
        self.u_ids.copy_(prep_u)
        self.slot.copy_(prep_slot)
        self.blocks.copy_(prep_blocks)
        self.sz_mine.copy_(sz_mine)
        self.sz_theirs.copy_(sz_theirs)
        if pushes is None:
            self.pr_n.zero_()
            return
        ids, cnt, grad, per_owner = pushes
        k = ids.numel()
        if k:
            self.pr_ids[:k].copy_(ids)
            self.pr_cnt[:k].copy_(cnt)
            self.pr_grad[:k].copy_(grad)
        self.pr_n.copy_(per_owner)

    def run(self) -> torch.Tensor:
        """The three segments and the two payload exchanges; returns the values buffer
        (``[u + 1, D]``: the batch's unique rows in block order, then padding)."""
        if self.comm_in_graphs:  # one graph, the exchanges inside
            self._segment("step", lambda: self._step(lambda _key, fn: fn()))
        else:  # a graph per segment, the exchanges between them
            self._step(self._segment)
        return self.values

    def _step(self, segment: Callable[[str, Callable[[], None]], Any]) -> None:
        segment("pack", self._pack)
        exchange_fixed(self.comm, self.send1, self.recv1, "embedding exchange 1 (static)")
        segment("answer", self._answer)
        exchange_fixed(self.comm, self.send2, self.recv2, "embedding exchange 2 (static)")
        segment("finish", self._finish)

    def presync(
        self, prev: Any, cur: Any, bound_cols: torch.Tensor, grad_occ: torch.Tensor
    ) -> torch.Tensor:
        """The part of a step before the sizes exchange, for the batch after this one's
        (``prev``: the batch this object ran, ``grad_occ`` its gradient, one row per
        occurrence; ``cur``: the next batch, preprocessed): ``prev``'s gradient summed per row
        into :attr:`grad`, SGD on its own rows, its mirrors' local step, the push inputs, the
        next batch's inputs and sizes table (into :attr:`sz_mine`); then the sizes exchange.
        Returns both tables on the CPU (``[2, w, COLS]``: sent, received), the step's one wait
        for the device. Graphs per ring slot of ``cur`` (see :class:`PrepRing`) once both are
        at fixed addresses. ``bound_cols``: ``[w, 4]`` the bound / audit / operation / padded
        columns. With the fused kernels the sizes table needs counts only, so the gradient's
        part (the sum, the updates) runs after the exchange, while the host reads the sizes
        and launches the rest."""
        # (shapes with one numel share self; what reads the gradient: a graph per address of
        # the incoming gradient, a training loop's allocator hands out one or two)
        key = ("presync", tuple(cur.ids.shape), cur.ring)
        key_g = (*key, grad_occ.data_ptr())
        capturable = prev.static and cur.static

        def summed() -> None:
            self.sum_grad(prev.inv, grad_occ)

        def before() -> None:
            if self.fused:
                padded_kernels.presync_counts(self, prev, cur)
                padded_kernels.count_due(self)
                padded_kernels.presync_table(self, cur, bound_cols)
            else:  # (the reference: all of it before the exchange)
                summed()
                self._presync(prev, cur, bound_cols)
            if self.comm_in_graphs:  # the exchange and the copy for the host: graph nodes
                self._sizes_exchange()

        def after() -> None:
            summed()
            padded_kernels.presync_values(self, prev)

        self._segment(key if self.fused else key_g, before, capturable=capturable)
        if not self.comm_in_graphs:
            self._sizes_exchange()
        if self._sizes_ready is not None:
            self._sizes_ready.record(current_stream(self.emb.device))
        if self.fused:
            self._segment(key_g, after, capturable=capturable)
        if self._sizes_ready is not None:
            self._sizes_ready.synchronize()
        return self.host_sizes

    def _sizes_exchange(self) -> None:
        """Sizes exchange 1 and the copy of both tables into :attr:`host_sizes` (read by the
        host once :attr:`_sizes_ready` has passed; on CPU the copy is synchronous)."""
        exchange_fixed(self.comm, self.sz_mine, self.sz_theirs, "embedding size exchange 1")
        self.host_sizes.copy_(self.sz_both, non_blocking=self._sizes_ready is not None)

    def sum_grad(
        self, inv: torch.Tensor, grad_occ: torch.Tensor, rows: int | None = None
    ) -> torch.Tensor:
        """A batch's gradient, one row per occurrence (``grad_occ [n, D]``, occurrence ``i``
        of unique row ``inv[i]``), summed per unique row into :attr:`grad` (its first
        ``rows`` rows, default all: a fixed shape for the graphs); returns that part."""
        out = self.grad if rows is None else self.grad[:rows]
        out.zero_()
        scatter_add_rows(out, inv, grad_occ, 1.0, backend=self.emb.kernels)
        return out

    @property
    def current(self) -> bool:
        """Whether the constants its graphs hold (the bound and the learning rate) are still
        the embedding's (else it must be rebuilt before its graphs run again)."""
        return self._frozen == (self.emb.bound, self.emb.opt.lr)

    def release(self) -> None:
        """Drop the captured graphs (they hold the communicator, see DistEnv.closers)."""
        self._graphs.clear()

    def adopt(self, old: StaticExchange) -> None:
        """Take over the inputs :meth:`presync` wrote into ``old`` (capacities grew)."""
        for name in ("u_ids", "slot", "blocks", "sz_mine", "sz_theirs", "pr_n"):
            getattr(self, name).copy_(getattr(old, name))
        k = min(old.pr_ids.numel(), self.pr_ids.numel())
        self.pr_ids[:k].copy_(old.pr_ids[:k])
        self.pr_cnt[:k].copy_(old.pr_cnt[:k])
        self.pr_grad[:k].copy_(old.pr_grad[:k])

    def _segment(self, key: object, fn: Callable[[], None], *, capturable: bool = True) -> None:
        self._graphs.run(key, fn, capturable=capturable)

    # ------------------------------------------------------------------ segments (fixed shapes)
    def _presync(self, prev: Any, cur: Any, bound_cols: torch.Tensor) -> None:
        """The pre-sync segment with torch ops (the reference of the fused kernels)."""
        e, n = self.emb, self.cap.n
        u, lr = self.cap.u, e.opt.lr
        sz = self.sz_mine  # still the table of ``prev`` (rewritten last)
        n_o = sz[0, _NOWN]
        n_m = sz[:, _NQM].sum()
        nqr = sz[:, _NQR]
        g = self.grad
        # SGD on prev's own rows (block order: first n_o entries); padding skipped
        own = self.ar_u < n_o
        o_slot = prev.slot[:u]
        scatter_add_rows(
            e.weight_full, torch.where(own, o_slot, self.skip_s), g[:u], -lr, backend=e.kernels
        )
        o_cnt = torch.where(own, prev.cnt[:u], 0)
        e.version_full.index_add_(0, torch.where(own, o_slot, self.spread_u), o_cnt)
        # prev's mirrors (entries n_o .. n_o + n_m): local step, accumulate, count
        i = (n_o + self.ar_wq).clamp(max=min(n, u) - 1)
        mir = self.ar_wq < n_m
        ms_all = prev.slot.index_select(0, i)
        ms = torch.where(mir, ms_all, self.skip_s)
        mi = torch.where(mir, ms_all - e.n_own, self.skip_m)
        gm = take_rows(g, i, backend=e.kernels)
        scatter_add_rows(e.weight_full, ms, gm, -lr, backend=e.kernels)
        scatter_add_rows(e.delta_acc_full, mi, gm, -lr, backend=e.kernels)
        scatter_add_rows(e.grad_acc_full, mi, gm, 1.0, backend=e.kernels)
        m_cnt = torch.where(mir, prev.cnt.index_select(0, i), 0)
        e.pending_full.index_add_(0, torch.where(mir, ms_all - e.n_own, self.spread_wq_m), m_cnt)
        # prev's rows not stored here: the push inputs of the next step
        r0 = n_o + n_m
        j = (r0 + self.ar_wq).clamp(max=min(n, u) - 1)
        self.pr_ids.copy_(prev.u.index_select(0, j))
        self.pr_cnt.copy_(prev.cnt.index_select(0, j))
        take_rows(g, j, out=self.pr_grad, backend=e.kernels)
        self.pr_n.copy_(nqr)
        # mirrors due for a push, per owner
        ndue = e.due_per_owner(e.pending > e.bound) if e.n_mir else e._zeros_w  # noqa: SLF001
        # the next batch: inputs and sizes table
        self.u_ids.copy_(cur.u)
        self.slot.copy_(cur.slot)
        self.blocks.copy_(cur.blocks)
        table = sizes.sizes_table(
            cur.blocks, ndue + nqr, ndue, cur.bad.long(), bound_cols.unbind(1), e.env.rank
        )
        self.sz_mine.copy_(table)

    def _pack(self) -> None:
        """Queries (mirrors, then rows not stored, per owner) and pushes (the last batch's rows
        not stored here, then this rank's due mirrors, per owner) into ``send1``."""
        if self.fused:
            padded_kernels.pack(self)
            return
        e, w, q, p, d = self.emb, self.w, self.cap.q, self.cap.p, self.d
        # (first: a pushed mirror's version moves, and the queries carry the new one)
        if e.n_mir:
            self._pack_due(e, w, p)
        # -- queries: every (peer, slot) reads its batch entry (a gather over w*q slots, not
        # a scatter of all n entries: most are owned rows, and their dummy writes collided)
        is_m, _, ipos = self._query_slots()  # (kept in buffers for _finish)
        q_ids = self.u_pad.index_select(0, ipos)
        ms = torch.where(is_m, self.slot_pad.index_select(0, ipos), e.trash_slot)
        q_ver = e.version_full.index_select(0, ms)
        # -- pushes: the last batch's rows not stored here (contiguous per owner)
        ends = torch.cumsum(self.pr_n, 0)
        jp = torch.searchsorted(ends, self.ar_wq, right=True).clamp(max=w - 1)
        posp = self.ar_wq - (ends - self.pr_n).index_select(0, jp)
        tp = torch.where(self.ar_wq < ends[-1:], jp * p + posp, w * p)
        self.p_ids.index_copy_(0, tp, self.pr_ids)
        self.p_cnt.index_copy_(0, tp, self.pr_cnt)
        put_rows(self.p_grad, tp, self.pr_grad, backend=e.kernels)
        torch.cat(
            [
                q_ids.view(w, q).view(torch.float32),
                q_ver.view(w, q).view(torch.float32),
                self.p_ids[: w * p].view(w, p).view(torch.float32),
                self.p_cnt[: w * p].view(w, p).view(torch.float32),
                self.p_grad[: w * p].view(w, p * d),
            ],
            dim=1,
            out=self.send1,
        )

    def _query_slots(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For every query slot (peer j, position e; flat ``[w * q]``): whether it is a mirror
        query, whether it is a query of a row not stored here, and the batch entry it asks
        for (mirrors of owner j, then rows not stored of owner j, in block order; the pad
        entry ``n`` for empty slots). Written into :attr:`q_slots` (read again by
        :meth:`_finish`, in the same step)."""
        w = self.w
        nqm = self.sz_mine[:, _NQM]
        nq = nqm + self.sz_mine[:, _NQR]
        st = torch.cumsum(self.blocks, 0) - self.blocks
        ar = self.ar_q[None, :]
        is_m = ar < nqm[:, None]
        is_r = ~is_m & (ar < nq[:, None])
        ipos = torch.where(
            is_m, st[w : 2 * w, None] + ar, st[2 * w : 3 * w, None] + ar - nqm[:, None]
        )
        ipos = torch.where(is_m | is_r, ipos, self.cap.n)
        q_m, q_r, q_pos = self.q_slots
        q_m.copy_(is_m.reshape(-1))
        q_r.copy_(is_r.reshape(-1))
        q_pos.copy_(ipos.reshape(-1))
        return self.q_slots

    def _pack_due(self, e: DistributedEmbedding, w: int, p: int) -> None:
        """Due mirrors (``pending > bound``) into the push buffers, compacted and grouped by
        owner (as mirrors are stored); their pending state is cleared."""
        ndue = self.sz_mine[:, _NDUE]
        due = e.pending > e.bound
        self.deferred.copy_(((e.pending > 0) & ~due).sum())
        n_mir = due.numel()
        perm, tot = stable_partition(due, e.mir_arange)
        kd = min(n_mir, w * p)
        di = perm[:kd]
        ev = self.ar_wp[:kd]
        vd = ev < tot
        jd = e.mir_owner.index_select(0, di)
        before = torch.cumsum(ndue, 0) - ndue
        posd = self.pr_n.index_select(0, jd) + ev - before.index_select(0, jd)
        td = torch.where(vd, jd * p + posd, w * p)
        d_cnt = e.pending.index_select(0, di)
        self.p_ids.index_copy_(0, td, e.stored_ids.index_select(0, di + e.n_own))
        self.p_cnt.index_copy_(0, td, d_cnt)
        put_rows(self.p_grad, td, e.grad_acc.index_select(0, di), backend=e.kernels)
        # SGD: the mirror already holds what the owner will apply (exact_mirror)
        sp = self.spread_wp[:kd]
        e.version_full.index_add_(0, torch.where(vd, di + e.n_own, sp), torch.where(vd, d_cnt, 0))
        zi = torch.where(vd, di, n_mir)  # row n_mir of the mirror buffers: trash
        e.pending_full.index_fill_(0, zi, 0)
        e.grad_acc_full.index_fill_(0, zi, 0.0)
        e.delta_acc_full.index_fill_(0, zi, 0.0)

    def _answer(self) -> None:
        """Owners apply the pushed gradients, then answer every query: lag, value, version."""
        if self.fused:
            padded_kernels.answer(self)
            return
        e, w, q, p, d = self.emb, self.w, self.cap.q, self.cap.p, self.d
        r = self.recv1
        rq_ids = r[:, : 2 * q].contiguous().view(torch.int64).reshape(-1)
        rq_ver = r[:, 2 * q : 4 * q].contiguous().view(torch.int64).reshape(-1)
        o = 4 * q
        rp_ids = r[:, o : o + 2 * p].contiguous().view(torch.int64).reshape(-1)
        rp_cnt = r[:, o + 2 * p : o + 4 * p].contiguous().view(torch.int64).reshape(-1)
        rp_grad = r[:, o + 4 * p :].reshape(-1, d)
        nqm_in = self.sz_theirs[:, _NQM]
        nq_in = nqm_in + self.sz_theirs[:, _NQR]
        np_in = self.sz_theirs[:, _NP]
        # -- pushes (SGD: every contribution added directly, padding into the trash row)
        pv = (self.ar_p[None, :] < np_in[:, None]).reshape(-1)
        ps = e.slot_of.index_select(0, rp_ids.clamp(0, e.num_rows - 1)).long()
        scatter_add_rows(
            e.weight_full, torch.where(pv, ps, self.skip_s), rp_grad, -e.opt.lr, backend=e.kernels
        )
        e.version_full.index_add_(
            0, torch.where(pv, ps, self.spread_wp), torch.where(pv, rp_cnt, 0)
        )
        # -- answers
        qv = (self.ar_q[None, :] < nq_in[:, None]).reshape(-1)
        qs = e.slot_of.index_select(0, rq_ids.clamp(0, e.num_rows - 1)).long()
        qs = torch.where(qv & (qs >= 0), qs, e.trash_slot)
        ver = e.version_full.index_select(0, qs)
        lag = (ver - rq_ver).clamp(-(2**31 - 1), 2**31 - 1).to(torch.int32)
        vals = take_rows(e.weight_full, qs, backend=e.kernels)
        torch.cat(
            [
                lag.view(w, q).view(torch.float32),
                vals.view(w, q * d),
                ver.view(w, q).view(torch.float32),
            ],
            dim=1,
            out=self.send2,
        )

    def _finish(self) -> None:
        """Refresh the mirrors beyond the bound, then the batch's values in block order."""
        if self.fused:
            padded_kernels.finish(self)
            return
        e, w, q, d, u = self.emb, self.w, self.cap.q, self.d, self.cap.u
        r = self.recv2
        r_lag = r[:, :q].contiguous().view(torch.int32).long()  # [w, q]
        r_vals = r[:, q : q + q * d].reshape(w, q, d)
        r_ver = r[:, q + q * d :].contiguous().view(torch.int64)  # [w, q]
        is_m, is_r, ipos = (t.view(w, q) for t in self.q_slots)  # (from _pack)
        ms = self.slot_pad.index_select(0, ipos.reshape(-1)).view(w, q)
        refresh = is_m & (r_lag > e.bound)
        rs = torch.where(refresh, ms, self.skip_s).reshape(-1)
        mi = torch.where(refresh, ms - e.n_own, e.n_mir).reshape(-1)
        new = r_vals.reshape(-1, d) + e.delta_acc_full.index_select(0, mi)
        put_rows(e.weight_full, rs, new, backend=e.kernels)
        put_rows(e.version_full.view(-1, 1), rs, r_ver.reshape(-1, 1), backend=e.kernels)
        # values: owned + mirror rows from storage, rows not stored here from the reply
        n_om = self.sz_mine[0, _NOWN] + self.sz_mine[:, _NQM].sum()
        src = torch.where(self.ar_u < n_om, self.slot[:u], e.trash_slot)
        take_rows(e.weight_full, src, out=self.values[:u], backend=e.kernels)
        tv = torch.where(is_r, ipos, self.skip_u).reshape(-1)
        put_rows(self.values, tv, r_vals.reshape(-1, d), backend=e.kernels)
        torch.stack(
            [
                (is_m & (r_lag == 0)).sum(),
                (is_m & (r_lag > 0) & (r_lag <= e.bound)).sum(),
                refresh.sum(),
                self.deferred,
                self.deferred * 0,
            ],
            out=self.rows_step,
        )
        e._rows_dev_total.add_(self.rows_step)  # noqa: SLF001 - the owner's counter


class GraphCache:
    """Per key: run a function eagerly the first time (and always when ``enabled`` is false:
    CPU, or ``cuda_graphs`` off; and whenever the caller says its inputs are not at fixed
    addresses: ``capturable`` false), capture it as a CUDA graph at its second use (the first
    also compiled the Triton kernels) and replay it from then on. The captured call's return
    value is kept: its tensors are the graph's outputs, rewritten in place by every replay.
    At most ``limit`` graphs are kept (keys that hold an address, e.g. of an incoming gradient,
    could otherwise pile up graphs and their memory pools): the oldest goes first."""

    def __init__(self, enabled: bool, *, limit: int = 16) -> None:
        self.enabled, self.limit = enabled, limit
        self._graphs: dict[object, torch.cuda.CUDAGraph] = {}
        self._out: dict[object, Any] = {}
        self._warm: set[object] = set()

    def __len__(self) -> int:
        """The number of captured graphs."""
        return len(self._graphs)

    def clear(self) -> None:
        """Drop every captured graph (and its outputs); the next use starts over (warm-up)."""
        self._graphs.clear()
        self._out.clear()
        self._warm.clear()

    def run(
        self, key: object, fn: Callable[[], Any], *, capturable: bool = True
    ) -> tuple[Any, bool]:
        """``(fn's result, whether it came from a replayed graph)``."""
        if capturable and key in self._graphs:
            self._graphs[key].replay()
            return self._out[key], True
        if not (self.enabled and capturable) or key not in self._warm:
            if capturable:
                if len(self._warm) >= 4 * self.limit:
                    self._warm = set(self._graphs)
                self._warm.add(key)
            return fn(), False
        if len(self._graphs) >= self.limit:
            # (the device may still run the oldest graph: its memory pool must outlive it)
            torch.cuda.synchronize()
            old = next(iter(self._graphs))
            del self._graphs[old], self._out[old]
        out: list[Any] = []
        g = torch.cuda.CUDAGraph()
        # thread_local: other threads (NCCL's watchdog) may call CUDA while this one captures
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            out.append(fn())
        self._graphs[key], self._out[key] = g, out[0]
        g.replay()
        return out[0], True


class PrepRing:
    """Two fixed slots for a batch's preprocessed ids (``prepare(ids) -> prep``): the batch
    being trained reads one (its arrays live until the next step has staged its gradient),
    the next batch is prepared into the other. On CUDA with ``graphs`` each slot's
    preprocessing is captured at its second use; from then on the slot's outputs stay at fixed
    addresses (``static``), which is what lets the pre-sync segment be captured too."""

    def __init__(
        self, shape: tuple[int, int], device: torch.device, prepare: Callable[[torch.Tensor], Any],
        *, graphs: bool,
    ) -> None:  # fmt: skip
        self.ids = [torch.zeros(shape, dtype=torch.int64, device=device) for _ in range(2)]
        self.prepare = prepare
        self._graphs = GraphCache(graphs)  # one per slot
        self.last = 1  # the slot of the batch consumed last

    def release(self) -> None:
        """Drop the captured graphs."""
        self._graphs.clear()

    def fill(self, ids: torch.Tensor) -> tuple[Any, int, bool]:
        """Prepare ``ids`` into the free slot: ``(prep, slot, static)``."""
        s = self.last ^ 1
        self.ids[s].copy_(ids)
        prep, static = self._graphs.run(s, lambda: self.prepare(self.ids[s]))
        return prep, s, static
