"""The exact transport: variable-size all-to-alls, every payload sized exactly from the sizes
table (the step's host wait), for any optimizer, audit mode, evaluation and flush.

After the sizes exchange: the pushes are collected (the last batch's rows not stored here, then
the due mirrors, grouped by owner); payload 1 carries, per peer, query ids (mirrors, then rows
not stored), the mirrors' versions, push ids, counts and gradients; owners apply their own and
the pushed gradients, then answer: an int32 lag for every mirror query and value (+ optimizer
state + int64 version) for the mirrors beyond the requester's bound and for every row not stored
there (with ``replies="all"`` for every mirror query: the reply sizes are then the query counts
known since the sizes exchange, and the second size exchange is skipped); payload 2 carries
them back; stale mirrors are refreshed and the batch's rows gathered. The rules themselves are
:mod:`hetgmp.embedding.protocol`'s; the byte layout helpers are :mod:`hetgmp.embedding.wire`'s.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from hetgmp.comm.exchange import exchange_payload, exchange_sizes
from hetgmp.embedding import protocol, sizes
from hetgmp.embedding.batch import Batch, Prep
from hetgmp.embedding.context import OP_FLUSH, StepContext
from hetgmp.embedding.kernels import take_rows
from hetgmp.embedding.ops import compact
from hetgmp.embedding.reads import Answers, finish_read
from hetgmp.embedding.wire import f32, i64, join

Staged = tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]  # due, due per owner, deferred


@dataclasses.dataclass(eq=False)
class SizedStep:
    """A step after the sizes exchange: what every transport's stage 3 starts from.
    ``host``: both sizes tables on the CPU (sent, received); ``staged``: the write rule's
    :data:`Staged` (None: the padded pre-sync segment staged the last batch); ``own_done``: the
    last batch's own rows are applied already."""

    prep: Prep
    grads: tuple[Batch, Any] | None
    op: int
    evaluating: bool
    table: torch.Tensor
    theirs_dev: torch.Tensor
    host: torch.Tensor
    staged: Staged | None
    own_done: bool

    def __post_init__(self) -> None:
        self.mine: list[list[int]] = self.host[0].tolist()
        self.theirs: list[list[int]] = self.host[1].tolist()

    def col(self, c: int, *, theirs: bool = False) -> list[int]:
        """Column ``c`` of the sizes table sent (or received), per peer."""
        return [row[c] for row in (self.theirs if theirs else self.mine)]

    def make_batch(self) -> Batch:
        """This step's :class:`Batch` (the unique rows, their sizes now host-known)."""
        n_o = self.mine[0][sizes.NOWN]
        nqm, nqr = self.col(sizes.NQM), self.col(sizes.NQR)
        k = n_o + sum(nqm) + sum(nqr)
        p = self.prep
        return Batch(
            u=p.u[:k], cnt=p.cnt[:k], slot=p.slot[:k], inv=p.inv, n_own=n_o, n_mir=sum(nqm),
            nqr=nqr,
            # (the pre-sync path's table is a reused buffer: that batch makes its own copy)
            nqr_dev=None if self.staged is None else self.table[:, sizes.NQR],
        )  # fmt: skip


class ExactExchange:
    """Stage 3 with exactly sized payloads (see the module docstring)."""

    def __init__(self, ctx: StepContext) -> None:
        self.ctx = ctx

    def run(self, s: SizedStep, batch: Batch) -> torch.Tensor:
        """The rest of step ``s``; returns the batch's unique rows' values in block order."""
        ctx = self.ctx
        staged = s.staged
        if staged is None:  # (the pre-sync segment staged; a peer takes this path this step)
            staged = protocol.due_state(ctx.store, ctx.bound, push_all=s.evaluating)
        pushes = self._pushes(s, staged)
        recv = self._send_queries(s, batch, pushes)
        owned = ctx.owned  # (owned rows on a host tier: the peers' ones made resident)
        if owned is not None:
            owned.serve(recv["pids"], [recv["mids"], recv["rids"]])
        self._apply_at_owner(s, recv)
        if owned is not None:
            owned.applied(s.grads is not None and not s.own_done)
        self._count_sent(s, batch)
        if s.op == OP_FLUSH:
            z = ctx.store.zeros_w[0]
            ctx.counters.rows_dev_step = protocol.deferred_counts(staged[2], z)
            ctx.counters.accumulate_rows()
            out = torch.zeros(0, ctx.store.dim, device=ctx.store.device)
        else:
            out = self._gather(s, batch, self._answer(s, recv), staged[2])
        if owned is not None:
            owned.step_done()
        return out

    def _pushes(self, s: SizedStep, staged: Staged) -> list[tuple[Any, ...]]:
        """``[(ids, counts, grads, per-owner counts)]`` of the last batch's rows not stored
        here and of the due mirrors (their sync state cleared)."""
        ctx, store = self.ctx, self.ctx.store
        due = staged[0]
        di = compact(due, sum(s.col(sizes.NDUE))) if due is not None else store.zeros_w[:0]
        d_ids, d_cnt, d_grad = protocol.take_due(store, ctx.opt, di)
        if s.grads is not None:
            pb, pg = s.grads
            r0 = pb.n_own + pb.n_mir
            rem = (pb.u[r0:], pb.cnt[r0:], pg[r0:], pb.nqr)
        else:
            rem = (d_ids[:0], d_cnt[:0], d_grad[:0], [0] * ctx.env.world_size)
        return [rem, (d_ids, d_cnt, d_grad, s.col(sizes.NDUE))]

    def _send_queries(
        self, s: SizedStep, batch: Batch, pushes: list[tuple[Any, ...]]
    ) -> dict[str, torch.Tensor]:
        """Payload 1, per peer, written once in peer order: query ids (mirrors, then not
        stored), mirror versions, push ids, push counts, push gradients; returns what came."""
        ctx, d, w = self.ctx, self.ctx.store.dim, self.ctx.env.world_size
        dev = ctx.store.device
        nqm, nqr, npush = s.col(sizes.NQM), s.col(sizes.NQR), s.col(sizes.NP)
        nqm_in, nqr_in = s.col(sizes.NQM, theirs=True), s.col(sizes.NQR, theirs=True)
        np_in = s.col(sizes.NP, theirs=True)
        (pr_ids, pr_cnt, pr_grad, pr_n), (d_ids, d_cnt, d_grad, ndue) = pushes
        m0, m1 = batch.n_own, batch.n_own + batch.n_mir
        q_mv = ctx.store.version.index_select(0, batch.slot[m0:m1])
        parts = [
            f32(batch.u[m0:m1]).split([2 * k for k in nqm]),
            f32(batch.u[m1:]).split([2 * k for k in nqr]),
            f32(q_mv).split([2 * k for k in nqm]),
            f32(pr_ids).split([2 * k for k in pr_n]),
            f32(d_ids).split([2 * k for k in ndue]),
            f32(pr_cnt).split([2 * k for k in pr_n]),
            f32(d_cnt).split([2 * k for k in ndue]),
            pr_grad.reshape(-1).split([d * k for k in pr_n]),
            d_grad.reshape(-1).split([d * k for k in ndue]),
        ]
        send = join([p[j] for j in range(w) for p in parts], dev)
        recv = exchange_payload(
            ctx.env,
            send,
            [4 * a + 2 * b + (4 + d) * c for a, b, c in zip(nqm, nqr, npush, strict=True)],
            [4 * a + 2 * b + (4 + d) * c for a, b, c in zip(nqm_in, nqr_in, np_in, strict=True)],
            "embedding exchange 1",
        )
        split = [
            x for a, b, c in zip(nqm_in, nqr_in, np_in, strict=True)
            for x in (2 * a, 2 * b, 2 * a, 2 * c, 2 * c, d * c)
        ]  # fmt: skip
        pieces = recv.split(split)
        names = ("mids", "rids", "mver", "pids", "pcnt")
        out = {k: i64(join(pieces[j::6], dev)) for j, k in enumerate(names)}
        out["pgrad"] = join(pieces[5::6], dev).view(-1, d)
        ctx.timer.mark("exchange")
        return out

    def _apply_at_owner(self, s: SizedStep, recv: dict[str, torch.Tensor]) -> None:
        """Owners apply own + pushed gradients: one optimizer update per row per step."""
        ctx, store = self.ctx, self.ctx.store
        p_slot = store.slot_of.index_select(0, recv["pids"]).long()
        pushed = (p_slot, recv["pcnt"], recv["pgrad"])
        if s.grads is not None and not s.own_done:
            pb, pg = s.grads
            own = (pb.slot[: pb.n_own], pb.cnt[: pb.n_own], pg[: pb.n_own])
        else:
            own = (p_slot[:0], recv["pcnt"][:0], recv["pgrad"][:0])
        protocol.apply_at_owner(store, ctx.opt, own, pushed)
        ctx.timer.mark("update")

    def _count_sent(self, s: SizedStep, batch: Batch) -> None:
        """Payload 1's bytes, pushes and the host-known row counts."""
        d, c = self.ctx.store.dim, self.ctx.counters
        nqm, nqr, npush = s.col(sizes.NQM), s.col(sizes.NQR), s.col(sizes.NP)
        nqm_in, nqr_in = s.col(sizes.NQM, theirs=True), s.col(sizes.NQR, theirs=True)
        np_in = s.col(sizes.NP, theirs=True)
        n_q, n_p = sum(nqm) + sum(nqr), sum(npush)
        n_qin, n_pin = sum(nqm_in) + sum(nqr_in), sum(np_in)
        c.count_bytes(
            sent={"ids": 8 * (n_q + n_p), "versions": 8 * (sum(nqm) + n_p),
                  "gradients": 4 * d * n_p},
            recv={"ids": 8 * (n_qin + n_pin), "versions": 8 * (sum(nqm_in) + n_pin),
                  "gradients": 4 * d * n_pin},
            reset=True,
        )  # fmt: skip
        c.count_pushes(n_p)
        c.set_rows_host(batch.n_own, sum(nqr))

    def _answer(self, s: SizedStep, recv: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Owners answer: a lag for every mirror query; value + state + version for the
        queries the protocol says (:func:`protocol.reply_needed`); payload 2 both ways."""
        ctx, store, w = self.ctx, self.ctx.store, self.ctx.env.world_size
        nqm, nqr = s.col(sizes.NQM), s.col(sizes.NQR)
        nqm_in, nqr_in = s.col(sizes.NQM, theirs=True), s.col(sizes.NQR, theirs=True)
        m_slot = store.slot_of.index_select(0, recv["mids"]).long()
        lag = protocol.lags(store, m_slot, recv["mver"])
        ctx.timer.mark("gather")
        if all(s.col(sizes.SEND_ALL, theirs=True)):
            # Every rank asked for a value per query: the reply sizes are the query counts,
            # known on every rank since the sizes exchange (no second size exchange).
            k_out = [a + b for a, b in zip(nqm_in, nqr_in, strict=True)]
            k_in = [a + b for a, b in zip(nqm, nqr, strict=True)]
            rows_m = m_slot.split(nqm_in)
        else:
            need = protocol.reply_needed(lag, s.theirs_dev, nqm_in)
            k_out, k_in = self._reply_sizes(s, need)
            km_out = [k - a for k, a in zip(k_out, nqr_in, strict=True)]
            rows_m = m_slot.index_select(0, compact(need, sum(km_out))).split(km_out)
        rows_r = store.slot_of.index_select(0, recv["rids"]).long().split(nqr_in)
        dev = store.device
        rows = join([x for j in range(w) for x in (rows_m[j], rows_r[j])], dev, torch.int64)
        return self._send_replies(s, lag, rows, k_out, k_in)

    def _reply_sizes(self, s: SizedStep, need: torch.Tensor) -> tuple[list[int], list[int]]:
        """Sizes exchange 2 (``replies="stale"``): values sent to / received from each peer."""
        t, zeros_w = s.theirs_dev, self.ctx.store.zeros_w
        cn = torch.cat([zeros_w[:1], torch.cumsum(need, 0)])
        ends = torch.cumsum(t[:, sizes.NQM], 0)
        k_out = (
            cn.index_select(0, ends) - cn.index_select(0, ends - t[:, sizes.NQM])
            + t[:, sizes.NQR]
        )  # fmt: skip
        _, host2 = exchange_sizes(self.ctx.env, k_out[:, None], "embedding size exchange 2")
        return host2[0, :, 0].tolist(), host2[1, :, 0].tolist()

    def _send_replies(
        self, s: SizedStep, lag: torch.Tensor, rows: torch.Tensor, k_out: list[int],
        k_in: list[int],
    ) -> dict[str, Any]:  # fmt: skip
        """Payload 2: per peer [lags | values | (state +) versions]; returns what came."""
        ctx, store = self.ctx, self.ctx.store
        d, sw, dev = store.dim, ctx.opt.state_width, store.device
        nqm, nqr = s.col(sizes.NQM), s.col(sizes.NQR)
        nqm_in = s.col(sizes.NQM, theirs=True)
        vals = take_rows(store.weight, rows, backend=ctx.kernels)
        extra = [f32(store.version.index_select(0, rows)).view(-1, 2)]
        if sw:
            extra.insert(0, store.opt_state.index_select(0, rows)[:, None])
        ext = torch.cat(extra, dim=1)
        lag32 = f32(lag.clamp(-protocol.I32_MAX, protocol.I32_MAX).to(torch.int32))
        parts = [
            lag32.split(nqm_in),
            vals.reshape(-1).split([d * k for k in k_out]),
            ext.reshape(-1).split([(sw + 2) * k for k in k_out]),
        ]
        send = join([p[j] for j in range(ctx.env.world_size) for p in parts], dev)
        recv = exchange_payload(
            ctx.env, send,
            [a + (d + sw + 2) * k for a, k in zip(nqm_in, k_out, strict=True)],
            [a + (d + sw + 2) * k for a, k in zip(nqm, k_in, strict=True)],
            "embedding exchange 2",
        )  # fmt: skip
        km_in = [k - a for k, a in zip(k_in, nqr, strict=True)]
        split = [
            x for a, k, km in zip(nqm, k_in, km_in, strict=True)
            for x in (a, d * km, d * (k - km), (sw + 2) * km, (sw + 2) * (k - km))
        ]  # fmt: skip
        p2 = recv.split(split)
        ctx.timer.mark("exchange")
        nm_in = sum(nqm_in)
        ctx.counters.count_bytes(
            sent={"versions": 4 * nm_in + 8 * sum(k_out), "values": 4 * (d + sw) * sum(k_out)},
            recv={"versions": 4 * sum(nqm) + 8 * sum(k_in), "values": 4 * (d + sw) * sum(k_in)},
            reset=False,
        )
        return {
            "lag": join(p2[0::5], dev).view(torch.int32).long(),
            "mir_vals": join(p2[1::5], dev).view(-1, d),
            "rem_vals": join(p2[2::5], dev).view(-1, d),
            "mir_ext": join(p2[3::5], dev).view(-1, sw + 2),
            "rem_ext": join(p2[4::5], dev).view(-1, sw + 2),
            "n_sent_mir": sum(km_in),
        }

    def _gather(
        self, s: SizedStep, batch: Batch, r: dict[str, Any], deferred: torch.Tensor
    ) -> torch.Tensor:
        """Refresh mirrors beyond the bound, then the batch's values in block order
        (:func:`~hetgmp.embedding.reads.finish_read`)."""
        ctx = self.ctx
        sw, bound = ctx.opt.state_width, 0 if s.evaluating else ctx.bound
        ext, rext = r["mir_ext"], r["rem_ext"]
        # (decoded only where read: the versions' int64 lanes after the optimizer state)
        mir_ver = i64(ext[:, sw:]) if r["n_sent_mir"] or ctx.audit else ctx.store.zeros_w[:0]
        answers = Answers(
            r["lag"], r["mir_vals"], mir_ver, ext[:, 0] if sw else None, r["rem_vals"],
            rem_ver=i64(rext[:, sw:]) if ctx.audit else None,
        )  # fmt: skip
        return finish_read(ctx, batch, answers, bound, deferred)
