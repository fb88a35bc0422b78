"""The padded transport: fixed-capacity payloads, so that a training step replays as CUDA
graphs (the buffers and segments are :class:`~.buffers.StaticExchange`'s).

It owns: the capacities every rank agrees on (grown, never shrunk, rebuilding the buffers), the
preprocessing rings that keep a batch's arrays at fixed addresses (:class:`~.graphs.PrepRing`),
the pre-sync segment that runs stages 1-2 of the next step in fixed shapes, and the process
group its captured collectives use. Scope: any sparse optimizer, ``replies="all"``, no audit,
training forward steps on which every rank takes it (the sizes table's padded column); evaluation and flush take
the exact transport, and both read and write the same state, so they mix freely.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from hetgmp.comm.env import DistEnv, purpose_env
from hetgmp.embedding import sizes
from hetgmp.embedding.batch import Batch, Occurrences, Prep, Summed
from hetgmp.embedding.collective.exact import SizedStep
from hetgmp.embedding.context import StepContext
from hetgmp.embedding.padded import owner_update
from hetgmp.embedding.padded.ahead import ReadAhead
from hetgmp.embedding.padded.buffers import Capacity, StaticExchange, grow
from hetgmp.embedding.padded.graphs import PrepRing
from hetgmp.embedding.padded.presync_step import count_replay
from hetgmp.embedding.padded.releaser import GraphReleaser
from hetgmp.embedding.padded.streams import priority_stream

# The rows' gradient summed on a side stream in a captured whole step (sum_grad_aside), under
# the dense all-reduce and optimizer: +1.4 % / +2.8 % at 2 / 4 H200s, batch 8192 (2026-11-26,
# bench/results/gpu/scaling_4gpu/). Forked only while capturing (an eager fork broke capture).
SUM_GRAD_ASIDE = True
# With it, the gradient buffer zeroed on that side stream during the forward (zero_grad_early),
# not right before the sum on the chain after backward (~16 us at batch 8192 on 2 H100s):
# 1.53x -> 1.56x (2026-11-26, bench/results/gpu/zero_mark/). Captured steps only.
EARLY_ZERO = True
# The exchange made early (on_side, after backward) waits only for what the sum waited for
# when it forked on the side stream, not for the rest of the backward queued since (the chain's
# first 13 us at batch 8192 on 2 H100s, bench/results/gpu/scaling_diagnosis/timeline_8192_peer/).
# On with owner_update.OWN_SLOTS_EARLY and VERSIONS_IN_UPDATE since the tail left the dense path
# (2 H100s, 2026-11-27, bench/results/gpu/tail_beside/: 1.70x -> 1.72x at batch 8192).
NARROW_WAIT = True
# The main stream waits for the side stream's sum right after forking it: the backward's rest
# (the first layer's deferred weight product, models.deferred_wgrad) after the sum, not beside
# it (on 2 H100s at batch 8192 they shared the GPU for ~110 us, the sum alone ~73, so the
# chain, which starts at the sum's end, started ~35 us late; the dense path has slack since the
# tail moved off it, bench/results/gpu/adam_peer/). On since measured (2 H100s, 2026-11-27,
# bench/results/gpu/sum_first/: 1.708x -> 1.727x at batch 8192, median of 2 rounds).
SUM_FIRST = True
# A whole-step graph's preparation rings: the plan written straight into each ring slot's
# fixed buffers instead of copied there (six copies, ~12 us of the 2-GPU step's plan stream
# at batch 8192 on 2 H100s, bench/results/gpu/scaling_diagnosis/timeline_8192_pull/). Exact
# (the same kernels, other output buffers).
WRITE_PLAN_INTO = True


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


class PaddedExchange:
    """Stage 3 with fixed capacities, and the pre-sync segment (see the module docstring).
    ``graphs``: capture CUDA graphs; ``graph_collectives``: capture the all-to-alls too (NCCL,
    on a process group of their own). Diagnostics: ``rebuilds`` (every capacity taken) and
    ``presyncs`` (steps whose pre-sync part ran in fixed shapes)."""

    def __init__(self, ctx: StepContext, *, graphs: bool, graph_collectives: bool) -> None:
        self.ctx = ctx
        self.graphs, self.graph_collectives = graphs, graph_collectives
        self.static: StaticExchange | None = None  # buffers (lazily, at the first step)
        self.rebuilds: list[Capacity] = []
        self.presyncs = 0
        self._rings: dict[tuple[int, ...], PrepRing] = {}  # per batch shape
        self._comm: DistEnv | None = None
        # the whole-step graph's settings (:mod:`.whole`): capacities fixed in advance (None:
        # grown from each step's sizes), the gradient summed in backward, the preparation's
        # outputs in fixed buffers, and whether a whole-step graph is being captured
        self.frozen: Capacity | None = None
        self.whole = False
        self.capturing = False
        # the row gradient summed on a side stream (sum_grad_aside): the stream, and what it
        # reads, held until join()
        self._side: torch.cuda.Stream | None = None
        self._held: tuple[torch.Tensor, ...] | None = None
        self._zeroed: Batch | None = None  # (the batch whose buffer zero_grad_early zeroed)
        # the next batch's exchange run while this batch computes (.ahead; set up by the
        # whole-step graph where --bound >= 1)
        self.ahead = ReadAhead(ctx.store.device)

    # ---------------------------------------------------------------- preprocessing
    def prepare(self, ids: torch.Tensor, plain: Callable[..., Prep]) -> Prep:
        """``plain(ids)`` into a :class:`PrepRing` slot (up to four batch shapes; others are
        prepared plainly); ``plain(ids, arrays)`` must write the plan into ``arrays`` (a
        ``PlanArrays``) when :data:`WRITE_PLAN_INTO` is on."""
        if ids.dim() != 2:
            return plain(ids)
        key = tuple(ids.shape)
        ring = self._rings.get(key)
        if ring is None:
            if len(self._rings) >= 4:
                return plain(ids)
            ring = PrepRing(
                key, self.ctx.store.device, plain, graphs=self.graphs, writes_into=WRITE_PLAN_INTO
            )
            ring.fixed = self.whole
            self._rings[key] = ring
        prep, slot, static = ring.fill(ids)
        if static:  # (a replay returns the captured call's own Prep: the same every time)
            prep.ring, prep.static, prep.source = slot, True, ids
            return prep
        return dataclasses.replace(prep, ring=slot, static=static, source=ids)

    def rings(self) -> list[PrepRing]:
        return list(self._rings.values())

    def ring(self, shape: tuple[int, ...]) -> PrepRing | None:
        """The preparation ring of batches of ``shape`` (None before the first)."""
        return self._rings.get(tuple(shape))

    def consumed(self, prep: Prep) -> None:
        """``prep``'s step is done with its ring slot's ids: the other slot is free."""
        if prep.ring >= 0:
            self._rings[tuple(prep.ids.shape)].last = prep.ring

    # ---------------------------------------------------------------- stages 1-2, fixed shapes
    def can_presync(self, grads: tuple[Batch, Any] | None, prep: Prep) -> bool:
        """Whether the last step (``grads``) and this batch fit the buffers' graphs: the same
        StaticExchange, the two ring slots in turn, the same shape, capacities and constants."""
        st = self.static
        if st is None or grads is None or prep.ring < 0:
            return False
        pb, g = grads
        if isinstance(g, Summed):
            size_ok = g.grad is st.grad_of(pb.ring)
        else:
            size_ok = isinstance(g, Occurrences) and g.grad.shape[0] == st.cap.n
        return (
            size_ok and pb.static is st and pb.prep is not None
            and pb.prep.ring != prep.ring and min(st.cap.u, st.cap.n) > 0
            and pb.prep.ids.shape == prep.ids.shape and prep.u.numel() == st.cap.n
            and st.current  # (its graphs hold the bound and the learning rate)
        )  # fmt: skip

    def presync(
        self, grads: tuple[Batch, Any], prep: Prep, consts: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[Batch, torch.Tensor]]:
        """Stages 1-2 in the pre-sync segment: ``(both sizes tables on the host, the last
        batch with its gradient summed per row)``."""
        st, (pb, g) = self.static, grads
        assert st is not None and pb.prep is not None
        host = st.presync(pb.prep, prep, consts, None if isinstance(g, Summed) else g.grad)
        self.presyncs += 1
        return host, (pb, st.grad[: pb.u.numel()])

    # ---------------------------------------------------------------- stage 3
    def run(self, s: SizedStep, batch: Batch) -> torch.Tensor:
        """The rest of a training step on the static buffers (every rank takes it together,
        with the same capacities from every rank's maxima); the batch's values."""
        st = self._buffers(s, batch)
        if s.staged is not None:  # (else the pre-sync segment wrote the inputs)
            pushes = own = None
            if s.grads is not None:
                pb, pg = s.grads
                r0 = pb.n_own + pb.n_mir
                pushes = (pb.u[r0:], pb.cnt[r0:], pg[r0:], pb.nqr_device(st.store.device))
                if not s.own_done:
                    own = (pb.slot[: pb.n_own], pb.cnt[: pb.n_own], pg[: pb.n_own])
            p = s.prep
            st.load(p.u, p.slot, p.blocks, s.table, s.theirs_dev, pushes, own, slot=p.ring)
            # (the ring slot's host copy too: a record of this batch may be materialized from
            # it later, after a whole-step graph restored it: whole.materialize)
            st.host_of(p.ring).copy_(s.host)
        values = st.run()
        batch.prep, batch.static = s.prep, st
        if self.capturing:  # (a replay counts on the device, see whole.WholeStep)
            batch.replayed = True
            if not st.replay_counted:  # (else counted with its counts phase, early)
                count_replay(st)
            st.replay_counted = False
            return values
        st.replay_counted = False  # (an eager step counts on the host)
        self._count(s, batch, st)
        return values[: batch.u.numel()]

    def accepts(self, prep: Prep) -> bool:
        """Whether this rank can take the padded exchange with ``prep`` (fixed capacities
        are for one batch shape: another, e.g. the last partial batch, takes the exact one)."""
        return self.frozen is None or prep.u.numel() == self.frozen.n

    def fits(self, theirs: list[list[int]]) -> bool:
        """Whether every rank's largest per-peer query and push counts fit the fixed
        capacities (always, when they grow): a step that does not takes the exact transport,
        the same decision on every rank (every rank reads every rank's maxima)."""
        cap = self.frozen
        if cap is None:
            return True
        return all(r[sizes.MAXQ] <= cap.q and r[sizes.MAXP] <= cap.p for r in theirs)

    def _buffers(self, s: SizedStep, batch: Batch) -> StaticExchange:
        """The StaticExchange for this step's capacities (rebuilt when they grow)."""
        old = self.static.cap if self.static is not None else None
        if self.frozen is not None:  # (fixed in advance; a step that exceeds them is exact)
            return self._frozen_buffers(s, batch)
        n, theirs = s.prep.u.numel(), s.theirs
        cap = Capacity(
            q=grow(old.q if old else 0, max(row[sizes.MAXQ] for row in theirs)),
            p=grow(old.p if old else 0, max(row[sizes.MAXP] for row in theirs)),
            u=min(n, grow(old.u if old and old.n == n else 0, batch.u.numel())),
            n=n,
            o=self._own_capacity(old, s, batch),
        )
        if cap != old or not self.static.current:
            new = StaticExchange(
                self.ctx, cap, graphs=self.graphs, comm=self.comm(), old=self.static
            )
            if s.staged is None:  # the pre-sync segment wrote the inputs into the old buffers
                assert self.static is not None
                new.adopt(self.static)
            self.static = new
            self.rebuilds.append(cap)
        return self.static

    def _frozen_buffers(self, s: SizedStep, batch: Batch) -> StaticExchange:
        cap = self.frozen
        assert cap is not None and cap.n == s.prep.u.numel(), (cap, s.prep.u.numel())
        if not self.capturing and batch.u.numel() > cap.u:  # (the epoch's counts said not)
            raise RuntimeError(f"{batch.u.numel()} distinct rows exceed the fixed {cap}")
        if self.static is None or self.static.cap != cap or not self.static.current:
            new = StaticExchange(
                self.ctx, cap, graphs=self.graphs, comm=self.comm(), old=self.static
            )
            new.frozen = True
            if s.staged is None and self.static is not None:  # (see _buffers)
                new.adopt(self.static)
            self.static = new
            self.rebuilds.append(cap)
        return self.static

    def set_plain(self, on: bool) -> None:
        """While a whole-step graph captures: every segment and preparation runs plainly (no
        nested graphs) and nothing waits for the device."""
        self.capturing = on
        for ring in self._rings.values():
            ring.plain = on
        if self.static is not None:
            self.static.set_plain(on)

    def _own_capacity(self, old: Capacity | None, s: SizedStep, batch: Batch) -> int:
        """Room for the last batch's own rows staged for the owner's update (optimizers
        other than SGD): at least this batch's unique rows (the pre-sync segment stages up
        to those) and the last batch's own rows (loaded when no pre-sync ran)."""
        if not self.ctx.opt.state_width:
            return 0
        last = s.grads[0].n_own if s.grads is not None else 0
        need = max(last, min(s.prep.u.numel(), batch.u.numel()))
        return grow(old.o if old else 0, max(need, 1))

    def _count(self, s: SizedStep, batch: Batch, st: StaticExchange) -> None:
        """Bytes actually sent (the padded buffers, to every other rank), pushes and rows."""
        c = self.ctx.counters
        self.ctx.timer.mark("exchange")
        c.count_bytes(sent=st.bytes_per_step, recv=st.bytes_per_step, reset=True)
        c.count_pushes(sum(s.col(sizes.NP)))
        c.set_rows_host(batch.n_own, sum(batch.nqr))
        c.rows_dev_step = st.rows_step
        c.accumulate_rows(device_part=False)  # (the device counts were added in-graph)

    # ---------------------------------------------------------------- the row gradient
    def sum_grad_aside(self, batch: Batch, grad_occ: torch.Tensor) -> Summed:
        """``batch``'s gradient (one row per occurrence) summed per unique row into its
        exchange's fixed buffer (whole-step mode), on a side CUDA stream: the dense gradient's
        all-reduce and the dense optimizer, which follow on the main stream, run under this
        scatter-add instead of after it (2 H100s, batch 8192: ~50 us of a 1.03 ms step).
        Nothing reads the sum before :meth:`join` (the next step, or the end of a captured
        step)."""
        st = batch.static
        assert st is not None
        # (only inside a captured step: its fork and join are both captured; an eager step's
        # fork would make the next capture depend on uncaptured work, which CUDA refuses)
        zeroed, self._zeroed = self._zeroed is batch, None
        if not (SUM_GRAD_ASIDE and _capturing(st.store.device)):
            return Summed(owner_update.sum_split(st, batch, grad_occ, zero=True))
        main = torch.cuda.current_stream(st.store.device)
        side = self._side_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            out = owner_update.sum_split(st, batch, grad_occ, zero=not zeroed)
        if SUM_FIRST:  # (the rest of the backward after the sum: see the switch)
            main.wait_stream(side)
        # (alive until the main stream waits: the allocator must not hand them out earlier)
        self._held = (grad_occ, batch.inv)
        return Summed(out)

    def zero_grad_early(self, batch: Batch) -> None:
        """(:data:`EARLY_ZERO`, while a whole-step graph captures) ``batch``'s gradient buffer
        zeroed now, on the side stream of :meth:`sum_grad_aside`, which then adds into it
        without zeroing it first: the fill runs beside the forward instead of on the chain
        after backward. Safe: the buffer's last reader, the exchange that applied the gradient
        of the batch before last in this ring slot, ran in an earlier step's graph."""
        st = batch.static
        if not (EARLY_ZERO and SUM_GRAD_ASIDE and st is not None and batch.ring >= 0):
            return
        if not _capturing(st.store.device):
            return
        side = self._side_stream()
        side.wait_stream(torch.cuda.current_stream(st.store.device))
        with torch.cuda.stream(side):
            st.grad_of(batch.ring).zero_()
        self._zeroed = batch
        if self._held is None:  # (join() waits for the side stream)
            self._held = ()

    def _side_stream(self) -> torch.cuda.Stream:
        if self._side is None:
            self._side = priority_stream(self.ctx.store.device, "exchange")
        return self._side

    def on_side(self, fn: Callable[[], None]) -> None:
        """``fn()`` on the side stream of :meth:`sum_grad_aside`, after what the current
        stream has queued, while a whole-step graph is captured (:meth:`join` then waits for
        it too); inline otherwise (the next batch's exchange made early: ``.ahead``)."""
        dev = self.ctx.store.device
        if not _capturing(dev):
            fn()
            return
        if self._side is None:
            self._side = priority_stream(dev, "exchange")
        # (a non-empty _held: the sum forked on the side stream in this capture, NARROW_WAIT)
        if not (NARROW_WAIT and self._held):
            self._side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(self._side):
            fn()
        if self._held is None:
            self._held = ()

    def join(self) -> None:
        """The current stream waits for the side stream's work (a no-op when there is none,
        or when it is that stream: work running on it, joined later)."""
        if self._held is not None and self._side is not None:
            current = torch.cuda.current_stream(self._side.device)
            if current == self._side:
                return
            current.wait_stream(self._side)
            self._held = None

    def run_own_sum(self) -> None:
        """A split sum's own rows' pass no pre-sync took, now (``owner_update.run_own_sum``)."""
        if self.static is not None:
            owner_update.run_own_sum(self.static)

    # ---------------------------------------------------------------- graphs and groups
    def release_graphs(self) -> None:
        """Drop every captured graph, after the device is done with them (later steps
        capture again)."""
        if self.ctx.store.device.type == "cuda":
            torch.cuda.synchronize(self.ctx.store.device)
        if self.static is not None:
            self.static.release()
        for ring in self._rings.values():
            ring.release()

    def comm(self) -> DistEnv:
        """The env whose group the captured collectives use (every rank calls this at its
        first padded step, together). With CUDA graphs on NCCL and ``graph_collectives``: a
        process group of its own, so the all-to-alls can be captured inside the graphs
        (replays bypass a process group's per-call host bookkeeping, so a captured collective
        must never share its communicator with eager calls of the exact path); else the
        table's env."""
        if self._comm is None:
            env = self.ctx.env
            if (
                self.graphs
                and self.graph_collectives
                and env.backend == "nccl"
                and env.group is not None
            ):
                # (one for every table on this env: see DistEnv.groups)
                self._comm = purpose_env(env, "padded")
                # the graphs must go before the group does (hetgmp.comm.launch.shutdown)
                GraphReleaser.register(env, self)
            else:
                self._comm = env
        return self._comm
