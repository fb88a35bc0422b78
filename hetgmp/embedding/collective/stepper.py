"""A multi-rank step as one sequence of stages, whatever the transport:

1. **stage** the previous step's gradient (write rule, :mod:`hetgmp.embedding.protocol`): its
   mirrors apply it locally and become due once ``pending > bound``; its owned rows and its rows
   not stored here wait for the exchange;
2. **sizes exchange** (the step's one host wait): per-peer query / push counts, status (a bad
   id here: a device flag), bound, audit flag, operation, own-row count, largest per-peer
   counts and the padded flag (:mod:`hetgmp.embedding.sizes`); a rank with bad input makes its
   peers fail at once with :class:`PeerFailedError` instead of waiting for a timeout;
3. the **transport** moves queries and pushes, owners apply and answer, replies come back and
   the batch's rows are gathered: :class:`~.exact.ExactExchange` (payloads sized exactly) or
   :class:`~hetgmp.embedding.padded.exchange.PaddedExchange` (fixed capacities, CUDA graphs; training steps where every
   rank takes it).

The padded transport can also run stages 1-2 for the next batch in fixed shapes (its
pre-sync segment, a CUDA graph); the step then starts at stage 3.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from hetgmp.comm.errors import PeerFailedError
from hetgmp.comm.exchange import exchange_sizes
from hetgmp.embedding import protocol, sizes
from hetgmp.embedding.batch import Batch, Occurrences, Prep, Summed, range_error
from hetgmp.embedding.collective.exact import ExactExchange, SizedStep, Staged
from hetgmp.embedding.context import OP_FLUSH, OP_FORWARD, OP_NAMES, StepContext
from hetgmp.embedding.errors import EmbeddingInputError
from hetgmp.embedding.ops import index_add_rows
from hetgmp.embedding.padded.whole import materialize

Grads = tuple[Batch, Any]  # (batch, gradient [n, D] per unique row, or Occurrences)


class Stepper:
    """Runs multi-rank steps (see the module docstring). ``padded``: the padded transport, or
    None. ``grads``: the last training step's gradient, staged at the next step."""

    def __init__(self, ctx: StepContext, padded: Any | None) -> None:
        self.ctx, self.padded = ctx, padded
        self.exact = ExactExchange(ctx)
        self.grads: Grads | None = None
        # steps run (an exchange made early is taken only if none ran since: padded.ahead)
        self.count = 0
        # whether every rank's batch of the coming step is full (the trainer says, from every
        # rank's sample count: StepEngine.peers_full; None: nobody said). The pre-sync path
        # is a local decision (this rank's shapes and last step): a rank with a full batch
        # beside one with a partial or empty batch would meet its peers in another collective
        # than theirs (a hang on 2 H100s: bench/results/gpu/uneven_s21/), and a partial
        # batch's padded step leaves the next step's pre-sync possible on some ranks only. So
        # where not every batch is full, every rank takes the exact transport; where nobody
        # said (a custom loop on the table), the padded transport is agreed at the sizes
        # exchange as ever but the pre-sync path, which runs before it, never taken.
        self.peers_full: bool | None = None
        self._const_cache: dict[tuple[int, int, bool], torch.Tensor] = {}

    def step(
        self, prep: Prep, *, op: int, error: str | None, training: bool
    ) -> tuple[torch.Tensor, Batch]:
        """One step (``op``: forward or flush) on a prepared batch; returns its unique rows'
        values in block order and the batch record."""
        ctx = self.ctx
        evaluating = op == OP_FLUSH or not training
        bound = 0 if evaluating else ctx.bound
        ctx.timer.mark("unique")
        grads, self.grads = self.grads, None
        self.count += 1
        if self.padded is not None:
            self.padded.join()  # (a gradient summed on a side stream: see sum_grad_aside)
        told = self.peers_full
        # (bad input told full: a stand-in batch flagged bad takes its peers' path, planned)
        pe = self.padded if not evaluating and (error is None or told is True) else None
        padded = pe is not None and told is not False and pe.accepts(prep)
        if grads is not None and grads[0].replayed and not (pe is not None and pe.capturing):
            # (a replay's record holds its capture's counts: an eager step reads the replay's)
            grads = (materialize(grads[0]), grads[1])
        if pe is not None and padded and told and pe.can_presync(grads, prep):
            # stages 1-2 for this batch in fixed shapes (a graph on CUDA)
            host, grads = pe.presync(grads, prep, self.const_cols(bound, op, True))
            ctx.timer.mark("update")
            st = pe.static
            # (SGD applied the last batch's own rows there; other optimizers staged them)
            linear = ctx.opt.exact_mirror
            s = SizedStep(prep, grads, op, False, st.sz_mine, st.sz_theirs, host, None, linear)
            return self._after_sizes(s, error, padded)
        if self.padded is not None:  # (the own rows of a split sum: owner_update.SPLIT_SUM)
            self.padded.run_own_sum()
        grads = self._summed(grads)
        staged = self._stage(grads, evaluating)
        own_done = padded and ctx.opt.exact_mirror and self._apply_own_early(grads)
        ctx.timer.mark("update")
        table, theirs, host = self._exchange_sizes(prep, grads, staged, error, bound, op, padded)
        s = SizedStep(prep, grads, op, evaluating, table, theirs, host, staged, own_done)
        return self._after_sizes(s, error, padded)

    def count_early(self, prep: Prep, trained: Batch) -> None:
        """The counts phase of the next step's pre-sync part (``trained``'s pushes, ``prep``'s
        sizes table and the sizes exchange) now, before ``trained``'s gradient exists, where
        that step will take the pre-sync path (:mod:`hetgmp.embedding.padded.presync_step`;
        the next batch's exchange made early, :mod:`hetgmp.embedding.padded.ahead`)."""
        pe = self.padded
        st = pe.static if pe is not None else None
        if pe is None or st is None or not st.fused or trained.prep is None:
            return
        if self.peers_full is not True:  # (only where every rank may take that path)
            return
        grads = (trained, Summed(st.grad_of(trained.ring)))  # (where backward will sum it)
        if not (pe.accepts(prep) and pe.can_presync(grads, prep)):
            return
        st.presync_counts_early(
            trained.prep, prep, self.const_cols(self.ctx.bound, OP_FORWARD, True)
        )

    # ---------------------------------------------------------------- stage 1
    def _stage(self, grads: Grads | None, evaluating: bool) -> Staged:
        """Write rule for the last batch's mirrors; ``(due mask or None, due per owner,
        deferred)``."""
        ctx, store = self.ctx, self.ctx.store
        if grads is not None and grads[0].n_mir:
            batch, grad = grads
            m0, m1 = batch.n_own, batch.n_own + batch.n_mir
            protocol.stage_mirror_updates(
                store, ctx.opt, batch.slot[m0:m1], grad[m0:m1], batch.cnt[m0:m1]
            )
        return protocol.due_state(store, ctx.bound, push_all=evaluating)

    def _apply_own_early(self, grads: Grads | None) -> bool:
        """Padded steps with SGD (linear): the last batch's own rows are applied now, before
        the pushes (the padded segments apply only those; the exact path then skips them)."""
        if grads is None or not grads[0].n_own:
            return False
        ctx, (pb, pg) = self.ctx, grads
        o_slot = pb.slot[: pb.n_own]
        ctx.opt.apply(ctx.store.weight, ctx.store.opt_state, o_slot, pg[: pb.n_own])
        index_add_rows(ctx.store.version, o_slot, pb.cnt[: pb.n_own])
        return True

    def _summed(self, grads: Grads | None) -> Grads | None:
        """A padded step's per-occurrence gradient summed per unique row, eagerly (outside
        the pre-sync graph); one summed in backward already (:class:`Summed`) as its rows."""
        if grads is not None and isinstance(grads[1], Summed):
            pb = materialize(grads[0])
            return pb, grads[1].grad[: pb.u.numel()]
        if grads is None or not isinstance(grads[1], Occurrences):
            return grads
        pb = grads[0]
        assert pb.static is not None
        f = None if pb.prep is None else pb.prep.fields
        return pb, pb.static.sum_grad(pb.inv, grads[1].grad, pb.u.numel(), slot=pb.ring, fields=f)

    # ---------------------------------------------------------------- stage 2
    def _exchange_sizes(
        self, prep: Prep, grads: Grads | None, staged: Staged, error: str | None, bound: int,
        op: int, padded: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        """Sizes table 1 (one device->host copy): ``(sent, received, both on the host)``."""
        ctx = self.ctx
        n_push = staged[1] + (grads[0].nqr_device(ctx.store.device) if grads is not None else 0)
        if error is None:
            status = prep.bad.long()
        else:
            status = torch.ones((), dtype=torch.int64, device=ctx.store.device)
        consts = self.const_cols(bound, op, padded).unbind(1)
        cap = self.padded.frozen if padded and self.padded is not None else None
        if cap is not None:  # (a batch over the fixed distinct rows, one an epoch's scan never
            # saw, asks for the exact transport on the device: every rank then takes it too,
            # where this rank alone would refuse the padded one after the sizes exchange)
            fits_u = (prep.blocks.sum() <= cap.u).to(consts[3].dtype)
            consts = (*consts[:3], consts[3] * fits_u)
        table = sizes.sizes_table(prep.blocks, n_push, staged[1], status, consts, ctx.env.rank)
        theirs, host = exchange_sizes(ctx.env, table, "embedding size exchange 1")
        return table, theirs, host

    def const_cols(self, bound: int, op: int, padded: bool) -> torch.Tensor:
        """The bound / audit / operation / padded columns of sizes table 1 as one ``[w, 4]``
        tensor, made once per value (fill kernels per step saved)."""
        key = (bound, op, padded)
        cols = self._const_cache.get(key)
        if cols is None:
            row = [bound, int(self.ctx.send_all), op, int(padded)]
            cols = torch.tensor([row] * self.ctx.env.world_size, dtype=torch.int64)
            cols = self._const_cache[key] = cols.to(self.ctx.store.device)
        return cols

    # ---------------------------------------------------------------- stage 3
    def _after_sizes(
        self, s: SizedStep, error: str | None, padded: bool
    ) -> tuple[torch.Tensor, Batch]:
        """Check every rank's status, then hand the step to its transport."""
        pe = self.padded if padded else None
        if pe is not None and pe.capturing:  # (a replay's sizes are not read: see .whole)
            batch = s.make_batch()
            return pe.run(s, batch), batch
        mine, theirs = s.mine, s.theirs
        if error is None and mine[0][sizes.STATUS]:
            error = range_error(s.prep.ids, self.ctx.store.num_rows)
        try:
            if error:
                raise EmbeddingInputError(f"rank {self.ctx.env.rank}: {error}")
            self._check_peers(theirs, s.op)
        except (EmbeddingInputError, PeerFailedError) as e:
            _refuse_after_split(pe, "stopped", e)
            self._keep_unapplied(s.grads, s.own_done)
            raise
        batch = s.make_batch()
        if pe is not None and all(row[sizes.PADDED] for row in theirs) and pe.fits(theirs):
            return pe.run(s, batch), batch
        _refuse_after_split(pe, "went to the exact path", None)
        return self.exact.run(s, batch), batch

    def _check_peers(self, theirs: list[list[int]], op: int) -> None:
        r = self.ctx.env.rank
        bad = [i for i, row in enumerate(theirs) if row[sizes.STATUS] != 0]
        if bad:
            raise PeerFailedError(
                f"rank {r}: rank(s) {bad} reported bad input to the embedding lookup; "
                "aborting this step (see their error)"
            )
        ops = [row[sizes.OP] for row in theirs]
        if any(o != op for o in ops):
            names = {i: OP_NAMES.get(o, str(o)) for i, o in enumerate(ops)}
            raise PeerFailedError(
                f"rank {r}: ranks disagree on the collective call ({names}); every rank must "
                "call forward (an empty batch when it has none left) or flush together"
            )

    def _keep_unapplied(self, grads: Grads | None, own_done: bool) -> None:
        """A step that stops at the sizes exchange (bad input here or on a peer) has staged
        the last batch's mirrors (and, ``own_done``, applied its own rows); the rest, its own
        rows and its rows not stored here (pushed at the next step), is kept as the pending
        gradient, so a caught error loses nothing (as with one rank or the reference)."""
        if grads is None:
            return
        pb, pg = grads
        own, r0 = (0 if own_done else pb.n_own), pb.n_own + pb.n_mir
        kept = dataclasses.replace(
            pb, u=torch.cat([pb.u[:own], pb.u[r0:]]), cnt=torch.cat([pb.cnt[:own], pb.cnt[r0:]]),
            slot=torch.cat([pb.slot[:own], pb.slot[r0:]]), n_own=own, n_mir=0,
            nqr_dev=pb.nqr_device(self.ctx.store.device).clone(), prep=None, static=None,
        )  # fmt: skip
        self.grads = (kept, torch.cat([pg[:own], pg[r0:]]))


def _refuse_after_split(pe: Any, what: str, cause: BaseException | None) -> None:
    """Raise where the padded pre-sync's split update (``padded.owner_update.OWN_SPLIT``)
    already applied the own rows no push joins: a step that then leaves the padded path would
    apply them again (the exact path) or keep them as pending (a caught error), silently."""
    st = None if pe is None else pe.static
    if st is None or not getattr(st, "own_split", False):
        return
    if cause is not None:  # (e.g. a peer's bad ids, flagged on its device at this step)
        raise RuntimeError(
            f"the embedding step stopped ({cause}) after this rank's split owner update had "
            "applied its own rows: the table cannot take this step again; restart from the "
            "last checkpoint once the input is mended"
        ) from cause
    raise RuntimeError(
        f"the embedding step {what} after its split owner update had applied this rank's "
        "own rows (padded.owner_update.OWN_SPLIT): they would be applied twice; please "
        "report this, with the run's log"
    )
