"""What the step engines of several ranks share (:class:`PlannedEngine`, the base of
:class:`~hetgmp.embedding.collective.engine.CollectiveEngine` and of
:class:`~hetgmp.embedding.rowservice.engine.AsyncEngine`): both run a step on a *batch plan*
(unique ids in block order, :class:`~hetgmp.embedding.batch.BatchPlanner`), made ahead on a
side CUDA stream by :meth:`~PlannedEngine.prefetch`, and turn the step's unique rows into the
``[B, F, D]`` output with autograd hooked. What differs is the stepper they hand the plan to:
:class:`~hetgmp.embedding.collective.stepper.Stepper` (one exchange among all ranks, exact or
padded) or :class:`~hetgmp.embedding.rowservice.AsyncStep` (point to point), both
:class:`Stepping`.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F

from hetgmp.embedding.batch import Batch, BatchPlanner, Prep, input_problem
from hetgmp.embedding.context import OP_FLUSH, OP_FORWARD, EngineKind, StepContext
from hetgmp.embedding.kernels import gather_rows
from hetgmp.embedding.local import LocalStep
from hetgmp.embedding.lookup import _PaddedLookup
from hetgmp.embedding.ops import current_stream
from hetgmp.embedding.padded.ahead import Primed, ReadAhead
from hetgmp.embedding.padded.buffers import StaticExchange
from hetgmp.embedding.padded.exchange import PaddedExchange
from hetgmp.embedding.padded.fields import Capacity
from hetgmp.embedding.padded.local_now import refresh_stored
from hetgmp.embedding.padded.whole import WholeStep


class Stepping(Protocol):
    """A stepper of several ranks: runs a step on a batch plan and keeps the step's gradient
    (``grads``) for the next one."""

    grads: Any

    def step(
        self, prep: Prep, *, op: int, error: str | None, training: bool
    ) -> tuple[torch.Tensor, Batch]:
        """The batch's unique rows' values in block order, and the batch record."""
        ...


class PlannedEngine:
    """A multi-rank engine's plumbing around its stepper (see the module docstring);
    ``anchor``: the table's 0-d leaf the autograd nodes hang on (see :mod:`.lookup`). A
    subclass adds ``async_engine()`` (this module names no engine's own types)."""

    kind: EngineKind

    def __init__(
        self, ctx: StepContext, stepper: Stepping, padded: PaddedExchange | None,
        anchor: torch.Tensor,
    ) -> None:  # fmt: skip
        self.ctx, self.stepper, self.padded, self.anchor = ctx, stepper, padded, anchor
        s = ctx.store
        self.device = s.device
        self.planner = BatchPlanner(
            s.slot_of, s.block_of, ctx.env.world_size, s.device, backend=ctx.kernels
        )
        self._side: torch.cuda.Stream | None = None  # prefetch stream (CUDA)
        self._prefetched: Prep | None = None

    def forward(self, ids: torch.Tensor, *, training: bool) -> torch.Tensor:
        """One step (:meth:`~hetgmp.embedding.engine.StepEngine.forward`)."""
        err = input_problem(ids)
        self.ctx.timer.start()
        ahead = self.padded.ahead if self.padded is not None and training else None
        count = getattr(self.stepper, "count", 0)
        primed = ahead.take(ids, self.stepper.grads, count) if ahead is not None else None
        if primed is not None and primed.batch is not None:  # (its exchange ran: .ahead)
            assert primed.values is not None
            prep, values, batch = primed.prep, primed.values, primed.batch
        else:  # (planned during the last step, or now)
            prep = primed.prep if primed is not None else self._take_plan(ids, err, training)
            values, batch = self.stepper.step(prep, op=OP_FORWARD, error=err, training=training)
        b, f = prep.ids.shape
        if self.padded is not None:
            self.padded.consumed(prep)
        grad = training and torch.is_grad_enabled()
        if batch.static is not None and grad:
            shape = (b, f, self.ctx.store.dim)
            out = _PaddedLookup.apply(self.anchor, self.stepper, values, batch, shape)
            if ahead is not None and ahead.next_ids is not None:
                ahead.launch(lambda: self._step_ahead(ahead, batch))
        else:
            out = self._gather(values, batch, (b, f), grad)
        self.ctx.timer.mark("gather")
        return out

    def _step_ahead(self, ahead: ReadAhead, trained: Batch) -> Primed:
        """The next batch's plan (its ids from ``ahead.next_ids``) and, when reading ahead, its
        exchange, run while ``trained`` computes (:mod:`.padded.ahead`): the exchange pushes
        the gradient pending now, the one before ``trained``'s."""
        assert ahead.next_ids is not None
        prep = self._plan(ahead.next_ids(), True)
        if not ahead.values:
            count_early = getattr(self.stepper, "count_early", None)
            if ahead.early and count_early is not None:  # (its exchange's counts phase too)
                count_early(prep, trained)
            return Primed(prep, None, None, trained)
        values, batch = self.stepper.step(prep, op=OP_FORWARD, error=None, training=True)
        return Primed(prep, values, batch, trained)

    def prefetch(self, ids: torch.Tensor, *, training: bool) -> None:
        """The next batch's plan now (on CUDA on a side stream: it needs no host sync); input
        problems are left for :meth:`forward` to report collectively."""
        if input_problem(ids) is not None:
            self._prefetched = None
            return
        if self.device.type != "cuda":
            self._prefetched = self._plan(ids.to(self.device, non_blocking=True), training)
            return
        if self._side is None:
            self._side = torch.cuda.Stream(device=self.device)
        self._side.wait_stream(current_stream(self.device))  # ids and tables: main stream
        with torch.cuda.stream(self._side):
            dev_ids = ids.to(self.device, non_blocking=True)
            prep = self._plan(dev_ids, training)
        dev_ids.record_stream(self._side)
        self._prefetched = prep

    def send_ahead(self, ids: torch.Tensor, *, training: bool) -> None:
        """No traffic to send ahead here: :meth:`prefetch`."""
        self.prefetch(ids, training=training)

    def flush(self) -> None:
        """A flush step on an empty batch (collective)."""
        empty = torch.zeros(0, 1, dtype=torch.int64, device=self.device)
        self.stepper.step(self.planner.prepare(empty), op=OP_FLUSH, error=None, training=True)

    def apply_pending(self) -> None:
        raise RuntimeError("apply_pending is for one rank; several ranks flush() instead")

    def drop_pending(self) -> None:
        self.stepper.grads = None
        if self.padded is not None:  # (rows exchanged early: read before the state changed)
            self.padded.ahead.primed = None

    def counters(self) -> dict[str, int]:
        out = self.ctx.counters.total()
        if self.ctx.tier is not None:  # (owned rows on a host tier: its counters too)
            out.update({f"tier_{k}": v for k, v in self.ctx.tier.counters.as_dict().items()})
        return out

    def local_step(self) -> LocalStep | None:
        return None

    def whole_step(self, *, max_q: int | None = None) -> WholeStep | None:
        return None

    def release_graphs(self) -> None:
        if self.padded is not None:
            self.padded.release_graphs()

    def peers_full(self, full: bool | None) -> None:
        """(Engines with fixed-shape paths override this: :class:`CollectiveEngine`.)"""

    def close(self) -> None:
        pass

    def padded_rebuilds(self) -> list[Capacity]:
        return self.padded.rebuilds if self.padded is not None else []

    def padded_presyncs(self) -> int:
        return self.padded.presyncs if self.padded is not None else 0

    def padded_buffers(self) -> StaticExchange | None:
        return self.padded.static if self.padded is not None else None

    # ------------------------------------------------------------------ step plumbing
    def _plan(self, ids: torch.Tensor, training: bool) -> Prep:
        """The batch plan; with the padded transport (training) into a ring slot."""
        if self.padded is not None and training:
            return self.padded.prepare(ids, self.planner.prepare)
        return self.planner.prepare(ids)

    def _take_plan(self, ids: torch.Tensor, err: str | None, training: bool) -> Prep:
        """The prefetched plan of ``ids`` if there is one, else a new one (an empty one when
        the input is bad: the step still runs its sizes exchange to tell the peers)."""
        prep, self._prefetched = self._prefetched, None
        if err is not None:
            prep = self._stand_in(training) or self.planner.prepare(
                torch.zeros(0, 1, dtype=torch.int64, device=self.device)
            )
        elif prep is not None and prep.source is ids:
            if self.device.type == "cuda" and self._side is not None:
                main = current_stream(self.device)
                main.wait_stream(self._side)
                if not prep.static:  # (a captured graph's outputs live in its own pool)
                    for t in prep.tensors():  # allocated on the side stream, used on this one
                        t.record_stream(main)
        else:
            if self._side is not None:  # a discarded prefetch may still use the leader map
                current_stream(self.device).wait_stream(self._side)
            prep = self._plan(ids.to(self.device), training)
        prep.source = None
        return prep

    def _stand_in(self, training: bool) -> Prep | None:
        """(Bad input on a table told that every batch is full) the last batch's shape of
        zeros, planned into the padded ring and flagged bad: the step then takes the path its
        peers take (the pre-sync one, where they can), whose sizes exchange tells them. Else
        this rank would meet them in the exact path's exchange: a hang on CUDA."""
        told = getattr(self.stepper, "peers_full", None)  # (the collective stepper's)
        grads = self.stepper.grads
        last = grads[0].prep if grads is not None else None
        if not training or self.padded is None or told is not True or last is None:
            return None
        prep = self._plan(torch.zeros_like(last.ids), True)
        prep.bad.fill_(True)
        return prep

    def _gather(
        self, values: torch.Tensor, batch: Any, shape: tuple[int, int], grad: bool
    ) -> torch.Tensor:
        """The exact transport's ``[B, F, D]`` output (its gradient captured by a hook)."""
        st = getattr(batch, "static", None)
        if st is not None and st.from_table:  # (a padded step's stored rows: from the table)
            refresh_stored(st, batch.prep, values)
        if grad:
            leaf = values.requires_grad_()
            stepper = self.stepper

            def capture(g: torch.Tensor) -> None:
                stepper.grads = (batch, g.detach())

            leaf.register_hook(capture)
            values = leaf
        if self.ctx.kernels == "triton":
            # backward: one zero-fill and one Triton scatter-add (relaxed atomics, row tiles)
            # instead of embedding_dense_backward's sort and segment sums
            return gather_rows(values, batch.inv, "triton").view(*shape, self.ctx.store.dim)
        # F.embedding, not values[inv]: its backward reduces the gradient of repeated (hot)
        # ids by sorting, where index backward scatters with atomics that serialise on hot
        # rows (measured on an H200: 6.1 ms vs 0.1 ms per step at batch 8192 x 26 fields).
        return F.embedding(batch.inv.view(shape), values)
