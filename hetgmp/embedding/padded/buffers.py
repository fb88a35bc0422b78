"""The buffers and segments of the padded transport: a multi-rank step with fixed-size
("padded") payloads, for CUDA graphs (:mod:`.exchange` drives it).

The exact transport (:mod:`hetgmp.embedding.collective.exact`) sizes every payload exactly:
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
each segment is a few fused kernels (:mod:`hetgmp.embedding.padded.kernels`; the torch ops of
:mod:`hetgmp.embedding.padded.reference` are their reference): 65 kernels per step at batch 8192
on 2x H200 (was ~290 with torch ops; bench/results/gpu/results_2xH200.md).

The payloads' capacities ``q``, ``p`` are agreed by all ranks (the sizes table carries each
rank's largest per-peer counts; they grow, never shrink, by the global maximum); ``u`` and the
own rows' room are this rank's, so a rebuild for them alone keeps the peer-memory transport (a
new one is a rendezvous). A growth rebuilds the buffers and graphs (capture at the next use).

Scope: ``replies="all"`` (reply sizes are the query counts), training forward steps; any
sparse optimizer. SGD is linear, so own rows are applied before the pushes arrive; other
optimizers (row-wise Adagrad) stage the last batch's own rows and apply one update per row of
the own and pushed gradients summed (``answer``), the replies carry the optimizer state, and a
pushed mirror is refetched (as in the exact transport). Audit, eval and flush take the exact
transport; both read and write the same state, so they mix freely. The fused kernels cover both
optimizers (with Adagrad the owner's merged update is torch ops; see FUSED_WITH_STATE).
Reads the same values and applies the same updates as the exact transport (tests compare them).
Bytes: the padding travels too (bench: 1,259 vs 830 B/sample at bound 100, batch 8192).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from hetgmp.comm.exchange import exchange_fixed
from hetgmp.embedding import sizes
from hetgmp.embedding.context import StepContext
from hetgmp.embedding.kernels import scatter_add_rows
from hetgmp.embedding.padded import kernels as fused_segments
from hetgmp.embedding.padded import owner_update, presync_step, take
from hetgmp.embedding.padded import reference as torch_segments
from hetgmp.embedding.padded.fields import SLOTS, Capacity
from hetgmp.embedding.padded.graphs import GraphCache
from hetgmp.embedding.padded.peer_payloads import peer_payloads

if TYPE_CHECKING:  # pragma: no cover
    from hetgmp.comm.env import DistEnv
    from hetgmp.embedding.store import RowStore


# The fused segments for an optimizer with state (row-wise Adagrad) match the torch segments in
# Triton's interpreter (tests/test_padded_kernels.py) and, on 2 H200s (2026-11-26), the exact
# transport over 40 steps at bound 0 and 5 (tests/gpu_padded_check.py); the user's command ran
# 1.16x faster with them than with the torch segments (5.87M -> 6.79M samples/s, batch 8192).
FUSED_WITH_STATE = True


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
        self, ctx: StepContext, cap: Capacity, *, graphs: bool, comm: DistEnv | None = None,
        old: StaticExchange | None = None,
    ) -> None:  # fmt: skip
        self.ctx, self.store, self.cap = ctx, ctx.store, cap
        emb = ctx.store
        # The collectives of the padded step run on ``comm`` (default: the table's env). A
        # communicator of their own (see PaddedExchange.comm) lets them be captured inside
        # the graphs: a step is then two graph replays and one host wait.
        self.comm = comm if comm is not None else ctx.env
        self.comm_in_graphs = graphs and self.comm is not ctx.env
        # constants inside the captured graphs
        self.bound, self.lr, self.rank = ctx.bound, ctx.opt.lr, ctx.env.rank
        self.kernels = ctx.kernels
        w, d, dev = ctx.env.world_size, emb.dim, emb.device
        self.w, self.d = w, d
        q, p, u, n = cap.q, cap.p, cap.u, cap.n
        # Triton: each segment is a few fused kernels (.kernels); torch: the reference
        # op sequences (.reference). The fused kernels read int64 fields as
        # pairs of float32 at even offsets: even capacities (grow() gives multiples of 256).
        self.opt, self.sw = ctx.opt, ctx.opt.state_width
        self.fused = ctx.kernels == "triton" and (self.sw == 0 or FUSED_WITH_STATE)
        self.seg = fused_segments if self.fused else torch_segments
        if self.fused and (q % 2 or p % 2):
            raise ValueError(f"the fused padded kernels need even capacities, got {cap}")
        i64 = dict(dtype=torch.int64, device=dev)
        self._input_buffers(emb, w, q, n, d, i64)
        self._payload_buffers(w, q, p, d, old)  # (old: the buffers replaced, peer_payloads')
        # outputs
        self.values = torch.zeros(u + 1, d, device=dev)  # row u: trash
        # (.take: the stored rows read from the table by the lookup; their slots, -1 others)
        self.from_table = take.TAKE_FROM_TABLE  # (read now: a switch set before the run)
        self.src = torch.full((u + 1,), -1, **i64)
        self.rows_step = torch.zeros(5, **i64)
        self.deferred = torch.zeros((), **i64)
        # the mirrors' due mask's running count (pack), made by the counts phase when it ran
        # (``due_ready``): mirrors' pending counts change there only
        self.due_csum = torch.zeros(emb.n_mir, **i64)
        self.due_ready = False
        # (and the due mirrors that fit the payload, per owner: .due_triton)
        self.due_list = torch.zeros(max(1, w * p), **i64)
        self.due_listed = False
        # the gradient of a batch's values summed per row, one buffer per preparation ring
        # slot (see sum_grad; at fixed addresses for the graphs): a step that reads one step
        # ahead (.ahead) sums this batch's while the next exchange pushes the last batch's
        self.grads = [torch.zeros(u + 1, d, device=dev) for _ in range(SLOTS)]
        self.bind(0, 0)  # (sz_mine, grad, ...: see bind)
        # (per ring slot: the pre-sync pair and the step's segments, several shapes)
        self._graphs = GraphCache(graphs, limit=48)
        self.capturing = False  # (a whole-step graph is being captured: no host waits)
        self.frozen = False  # capacities fixed in advance: due pushes may wait for room
        self.own_early = self.pushes_early = self.own_split = False  # (entries made early)
        if not self.fused:
            torch_segments.reference_buffers(self, emb, w, q, p, u, d, i64)
        if self.sw:
            self._own_buffers(emb, cap.o, w * p, d, i64)

    def _input_buffers(self, emb: RowStore, w: int, q: int, n: int, d: int, i64: Any) -> None:
        """Inputs, written by load() or by the pre-sync segment before the others run."""
        dev = emb.device
        # batch unique ids in block order (+ padding), plus a pad entry (n) for empty slots
        self.u_pad = torch.zeros(n + 1, **i64)
        self.u_ids = self.u_pad[:n]
        # slots, plus one entry (n) pointing at the trash row, where padding entries look
        self.slot_pad = torch.full((n + 1,), emb.trash_slot, **i64)
        self.slot = self.slot_pad[:n]
        self.blocks = torch.zeros(3 * w, **i64)
        # the sizes table sent (row 0) and received (row 1): one buffer, so the host's copy
        # is one copy without a stack; one per ring slot (a batch's table outlives the next
        # batch's exchange when reads run one step ahead), bound by :meth:`bind`
        self.sz_slots = torch.zeros(SLOTS, 2, w, sizes.COLS, **i64)
        # both tables for the host (pinned: the copy can be a node of the pre-sync graph)
        self.host_slots = torch.zeros(
            SLOTS, 2, w, sizes.COLS, dtype=torch.int64, pin_memory=dev.type == "cuda"
        )
        self._sizes_ready = torch.cuda.Event() if dev.type == "cuda" else None
        # (prev, cur) ring slots whose presync counts phase ran early (.presync_step)
        self.counted: tuple[int, int] | None = None
        self.counted_early = 0  # (how many ran early: tests)
        self.replay_counted = False  # (the next run's replay counters were added early)
        # the last batch's rows not stored here (pushed this step): at most q per owner, as
        # they were queries of the last batch
        self.pr_ids = torch.zeros(w * q, **i64)
        self.pr_cnt = torch.zeros(w * q, **i64)
        self.pr_grad = torch.zeros(w * q, d, device=dev)
        self.pr_n = torch.zeros(w, **i64)  # ... per owner
        self.ndue = torch.zeros(w, **i64)  # mirrors due per owner, as many as fit (pre-sync)
        # due pushes left pending for want of room in a push payload (mirror-steps; only with
        # a push capacity under the query capacity, see clamp_due), summed over steps
        self.cap_deferred = self.ctx.counters.replay_dev[3:]
        self.prev_meta = torch.zeros(4, **i64)  # the last batch's block bounds (fused pre-sync)

    def _payload_buffers(self, w: int, q: int, p: int, d: int, old: Any) -> None:
        """The payloads, both ways, and what they weigh."""
        dev = self.store.device
        # payloads: per peer [query ids | mirror versions | push ids | push counts] as int64
        # pairs of float32, then the pushed gradients; reply: [lag | values | version]
        self.s1 = s1 = 4 * q + 4 * p + p * d
        # (+ the optimizer state of every answered row, last: the fused layout is unchanged)
        self.s2 = s2 = q + q * d + 2 * q + self.sw * q
        # what a step sends to (and receives from) the other ranks, by kind: the whole
        # padded buffers (the table's byte counters)
        o = w - 1
        self.bytes_per_step = {
            "ids": o * 8 * (q + p),
            "versions": o * (8 * q + 8 * p + 8 * q + 4 * q),
            "gradients": o * 4 * d * p,
            "values": o * 4 * (d + self.sw) * q,
        }
        assert sum(self.bytes_per_step.values()) == 4 * o * (self.s1 + self.s2)
        # (the receive buffers in peer memory when the payloads travel that way: .peer_payloads;
        # the fused segments then write there directly and need no send buffers)
        self.peer, self.payload_note = peer_payloads(self.comm, s1, s2, direct=self.fused, old=old)
        ws = 0 if self.peer is not None and self.peer.direct else w
        self.send1 = torch.zeros(ws, self.s1, device=dev)
        self.send2 = torch.zeros(ws, self.s2, device=dev)
        if self.peer is not None:  # (pulled replies: send2 in peer memory, read there)
            self.recv1, self.recv2 = self.peer.recv1, self.peer.recv2
            self.send2 = self.peer.send2 if self.peer.pull else self.send2
        else:
            self.recv1 = torch.zeros(w, self.s1, device=dev)
            self.recv2 = torch.zeros(w, self.s2, device=dev)
        self.ar_p_push = torch.arange(p, dtype=torch.int64, device=dev)  # push slots per peer

    def _own_buffers(self, emb: RowStore, o: int, wp: int, d: int, i64: dict[str, Any]) -> None:
        """Optimizers other than SGD are not linear: the owner applies one update per row of
        the summed gradient (its own rows' and every push), so the last batch's own rows are
        staged here (slot: trash where unused) and merged with the pushes in ``answer``."""
        self.own_slot = torch.full((o,), emb.trash_slot, **i64)
        self.own_cnt = torch.zeros(o, **i64)
        # the leaders' gradient sums (zero between steps past the own rows); its first o rows
        # are the staged own rows' gradient itself: an own row leads its row's entries, so its
        # sum starts in place and only pushes are added to it (.owner_update.merged_owner_update_fused)
        self.own_gsum = torch.zeros(o + wp, d, device=emb.device)
        self.own_grad = self.own_gsum[:o]
        self.pos_map = torch.zeros(emb.trash_slot + 1, **i64)  # slot -> leader entry
        self.ar_own = torch.arange(o + wp, **i64)
        self.spread_own = self.ar_own % max(1, emb.trash_slot)  # (padding: see merged update)
        # the fused merge's entries: slots, counts, leaders, count sums (zero between steps),
        # own entries a push joins (.owner_update.OWN_SPLIT)
        self.own_entries = torch.zeros(5, o + wp, **i64)

    # ------------------------------------------------------------------ ring slots
    def bind(self, prev: int, cur: int) -> None:
        """Point the per-slot buffers at ring slots: ``cur``, the batch whose exchange runs
        next (its sizes tables :attr:`sz_mine` / :attr:`sz_theirs` and their host copy
        :attr:`host_sizes`), and ``prev``, the batch whose gradient it pushes (its table
        :attr:`sz_prev`, its summed gradient :attr:`grad`). Slot -1 (a batch prepared
        outside a ring) uses slot 0. Captured graphs hold the addresses bound while they
        were recorded."""
        prev, cur = max(prev, 0), max(cur, 0)
        self.bound_slots = (prev, cur)
        self.sz_prev = self.sz_slots[prev][0]
        self.grad = self.grads[prev]
        self.sz_both = self.sz_slots[cur]
        self.sz_mine, self.sz_theirs = self.sz_both[0], self.sz_both[1]
        self.host_sizes = self.host_slots[cur]

    def grad_of(self, slot: int) -> torch.Tensor:
        """The summed-gradient buffer of the batch in ring ``slot``."""
        return self.grads[max(slot, 0)]

    def host_of(self, slot: int) -> torch.Tensor:
        """Both sizes tables (``[2, w, COLS]``) of the batch in ring ``slot``, on the host."""
        return self.host_slots[max(slot, 0)]

    def tables_of(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The device sizes tables (sent, received) of the batch in ring ``slot``."""
        t = self.sz_slots[max(slot, 0)]
        return t[0], t[1]

    # ------------------------------------------------------------------ host side
    def load(
        self,
        prep_u: torch.Tensor,
        prep_slot: torch.Tensor,
        prep_blocks: torch.Tensor,
        sz_mine: torch.Tensor,
        sz_theirs: torch.Tensor,
        pushes: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None,
        own: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
        *,
        slot: int = -1,
    ) -> None:
        """Copy a step's inputs into the fixed buffers (``pushes``: the last batch's rows not
        stored here: ids, counts, gradients (host-known length) and per-owner counts;
        ``own``: its own rows' slots, counts and gradients, not applied yet (Adagrad);
        ``slot``: the batch's ring slot, whose sizes tables these are)."""
        self.bind(slot, slot)
        if self.sw:
            self._load_own(own)
        self.u_ids.copy_(prep_u)
        self.slot.copy_(prep_slot)
        self.blocks.copy_(prep_blocks)
        self.sz_mine.copy_(sz_mine)
        self.sz_theirs.copy_(sz_theirs)
        self.ndue.copy_(sz_mine[:, sizes.NDUE])  # (host-sized: every due mirror fits)
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

    def _load_own(self, own: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None) -> None:
        self.own_early = self.pushes_early = self.own_split = False  # (host-staged: all)
        self.own_slot.fill_(self.store.trash_slot)
        self.own_cnt.zero_()
        if own is not None and own[0].numel():
            k = own[0].numel()
            self.own_slot[:k].copy_(own[0])
            self.own_cnt[:k].copy_(own[1])
            self.own_grad[:k].copy_(own[2])

    def run(self) -> torch.Tensor:
        """The three segments and the two payload exchanges; returns the values buffer
        (``[u + 1, D]``: the batch's unique rows in block order, then padding)."""
        # (graphs per ring slot: each reads its slot's tables; and per owner-update form)
        cur = (self.bound_slots[1], self.own_early, self.pushes_early, self.own_split)
        if self.comm_in_graphs:  # one graph, the exchanges inside
            self._segment(("step", cur), lambda: self._step(lambda _key, fn: fn()))
        else:  # a graph per segment, the exchanges between them
            self._step(lambda key, fn: self._segment((key, cur), fn))
        return self.values

    def _step(self, segment: Callable[[str, Callable[[], None]], Any]) -> None:
        seg = self.seg
        segment("pack", lambda: seg.pack(self))
        if self.peer is not None:  # (copies into the peers' buffers, a barrier)
            self.peer.exchange(self.send1, "recv1", self.ctx.rider)
        else:
            exchange_fixed(self.comm, self.send1, self.recv1, "embedding exchange 1 (static)")
        segment("answer", lambda: seg.answer(self))
        if self.peer is not None:
            self.peer.exchange(self.send2, "recv2", self.ctx.rider)
        else:
            exchange_fixed(self.comm, self.send2, self.recv2, "embedding exchange 2 (static)")
        segment("finish", lambda: seg.finish(self))

    def presync(
        self, prev: Any, cur: Any, bound_cols: torch.Tensor, grad_occ: torch.Tensor | None
    ) -> torch.Tensor:
        """The part of a step before the sizes exchange, then the gradient's part
        (:func:`.presync_step.presync`); both tables on the CPU."""
        return presync_step.presync(self, prev, cur, bound_cols, grad_occ)

    def presync_counts_early(self, prev: Any, cur: Any, bound_cols: torch.Tensor) -> None:
        """The counts part of the next :meth:`presync` of ``(prev, cur)`` and the sizes
        exchange, now (:func:`.presync_step.counts_early`)."""
        presync_step.counts_early(self, prev, cur, bound_cols)

    def sizes_exchange(self) -> None:
        """Sizes exchange 1 and the copy of both tables into :attr:`host_sizes` (read by the
        host once :attr:`_sizes_ready` has passed; on CPU the copy is synchronous)."""
        exchange_fixed(self.comm, self.sz_mine, self.sz_theirs, "embedding size exchange 1")
        self.host_sizes.copy_(self.sz_both, non_blocking=self._sizes_ready is not None)

    def sum_grad(
        self, inv: torch.Tensor, grad_occ: torch.Tensor, rows: int | None = None, *, slot: int,
        fields: int | None = None, zero: bool = True, part: tuple[torch.Tensor, int] | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """A batch's gradient, one row per occurrence (``grad_occ [n, D]``, occurrence ``i``
        of unique row ``inv[i]``), summed per unique row into the gradient buffer of its ring
        ``slot`` (its first ``rows`` rows, default all: a fixed shape for the graphs);
        returns that part. ``fields``: occurrences per sample (the batch's ``Prep.fields``);
        ``zero`` False: the buffer was zeroed already (``PaddedExchange.zero_grad_early``);
        ``part``: one pass of a split sum (:func:`~hetgmp.embedding.kernels.scatter_add_rows`)."""
        g = self.grad_of(slot)
        out = g if rows is None else g[:rows]
        if zero:
            out.zero_()
        scatter_add_rows(out, inv, grad_occ, 1.0, backend=self.kernels, fields=fields, part=part)
        return out

    @property
    def current(self) -> bool:
        """Whether the constants its graphs hold (the bound and the learning rate) are still
        the table's (else it must be rebuilt before its graphs run again)."""
        return (self.bound, self.lr) == (self.ctx.bound, self.ctx.opt.lr)

    def release(self) -> None:
        """Drop the captured graphs (they hold the communicator, see DistEnv.closers)."""
        self._graphs.clear()

    def set_plain(self, on: bool) -> None:
        """While a whole-step graph captures: segments run plainly, nothing waits for the
        device."""
        self._graphs.plain = self.capturing = on

    def adopt(self, old: StaticExchange) -> None:
        """Take over the inputs :meth:`presync` wrote into ``old`` (capacities grew)."""
        for name in ("u_ids", "slot", "blocks", "sz_slots", "host_slots", "pr_n", "ndue"):
            getattr(self, name).copy_(getattr(old, name))
        self.bind(*old.bound_slots)
        k = min(old.pr_ids.numel(), self.pr_ids.numel())
        self.pr_ids[:k].copy_(old.pr_ids[:k])
        self.pr_cnt[:k].copy_(old.pr_cnt[:k])
        self.pr_grad[:k].copy_(old.pr_grad[:k])
        if self.sw:
            k = old.cap.o
            self.own_slot[:k].copy_(old.own_slot)
            self.own_cnt[:k].copy_(old.own_cnt)
            self.own_grad[:k].copy_(old.own_grad)
            if self.fused and owner_update.OWN_SLOTS_EARLY:  # (their entries, made again)
                owner_update.own_entries_early(self)

    def _segment(self, key: object, fn: Callable[[], None], *, capturable: bool = True) -> None:
        # (no graph while a rider rides the barriers: it would replay without its work)
        self._graphs.run(key, fn, capturable=capturable and self.ctx.rider is None)
