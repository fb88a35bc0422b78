"""Which step engine a table runs, from its settings (:func:`make_engine`), and the one-rank
engine (:class:`LocalEngine`); the engines of several ranks are
:class:`~.collective.engine.CollectiveEngine` and :class:`~.rowservice.AsyncEngine`."""

from __future__ import annotations

import torch

from hetgmp.embedding.batch import input_problem
from hetgmp.embedding.collective.engine import CollectiveEngine
from hetgmp.embedding.context import OP_FLUSH, OP_FORWARD, EngineKind, StepContext
from hetgmp.embedding.engine import StepEngine
from hetgmp.embedding.local import LocalStep
from hetgmp.embedding.lookup import _LocalLookup
from hetgmp.embedding.options import concrete
from hetgmp.embedding.padded.buffers import StaticExchange
from hetgmp.embedding.padded.exchange import PaddedExchange
from hetgmp.embedding.padded.fields import Capacity
from hetgmp.embedding.padded.whole import WholeStep
from hetgmp.embedding.rowservice import AsyncConfig, AsyncEngine, AsyncStep


def make_engine(
    ctx: StepContext, anchor: torch.Tensor, *, exchange: str, audit: bool, sync: str,
    cuda_graphs: bool, graph_collectives: bool, async_config: AsyncConfig | None,
) -> StepEngine:  # fmt: skip
    """The engine for these settings. One rank takes its own step (no audit; it needs slot ==
    id: rank 0 owns every row and mirrors nothing) whatever ``sync`` says (nothing to sync);
    several ranks the async engine or the collective one (padded where ``exchange`` says)."""
    env, store = ctx.env, ctx.store
    local = env.world_size == 1 and not audit and store.n_own == store.num_rows
    if local and store.n_mir == 0:
        return LocalEngine(ctx, anchor)
    if sync == "async":
        return AsyncEngine(ctx, AsyncStep(ctx, async_config or AsyncConfig()), anchor)
    padded = None
    if exchange == "padded":
        graphs = bool(cuda_graphs) and env.device.type == "cuda"
        padded = PaddedExchange(ctx, graphs=graphs, graph_collectives=bool(graph_collectives))
    return CollectiveEngine(ctx, padded, anchor)


class LocalEngine:
    """One rank (:class:`~hetgmp.embedding.local.LocalStep`): no plan, no exchange, no host
    sync. ``one``: the step (tests set it to None to stand for a table without one)."""

    kind: EngineKind = "local"
    padded: PaddedExchange | None = None  # (no exchange: as the other engines' attribute)

    def __init__(self, ctx: StepContext, anchor: torch.Tensor) -> None:
        self.ctx, self.anchor = ctx, anchor
        self.one: LocalStep | None = LocalStep(ctx)
        # (with a host tier the store is in host memory and the step on the tier's device)
        self.device = ctx.tier.device if ctx.tier is not None else ctx.store.device
        self._ids_device = concrete(self.device)  # (ids already there are not moved)

    def forward(self, ids: torch.Tensor, *, training: bool) -> torch.Tensor:
        """``[B, F, D]`` rows, one per occurrence in input order (through
        :class:`~.lookup._LocalLookup` when training, so the gradient comes back)."""
        one = self.one
        assert one is not None
        err = input_problem(ids)
        self.ctx.timer.start()
        if err is not None:  # (raises, after reporting any earlier bad batch)
            one.step(self.ctx.store.zeros_w[:0], op=OP_FORWARD, error=err)
        if ids.device != self._ids_device:
            ids = ids.to(self.device)
        if training and torch.is_grad_enabled():
            out = _LocalLookup.apply(self.anchor, one, ids)
        else:
            out = one.step(ids, op=OP_FORWARD, error=None)[0]
        if self.ctx.tier is not None:  # (the next batch's rows made resident: its copies
            self.ctx.tier.stage_next()  # overlap the rest of this step)
        self.ctx.timer.mark("gather")
        return out

    def prefetch(self, ids: torch.Tensor, *, training: bool) -> None:
        """Nothing to prepare (the step's own kernels clamp and check the ids), except on a
        host tier: the next batch's rows are made resident ahead (:meth:`.TieredRows.expect`)."""
        if self.ctx.tier is not None:
            self.ctx.tier.expect(ids)

    def send_ahead(self, ids: torch.Tensor, *, training: bool) -> None:
        """Nothing to send."""

    def flush(self) -> None:
        assert self.one is not None
        empty = torch.zeros(0, 1, dtype=torch.int64, device=self.device)
        self.one.step(empty, op=OP_FLUSH, error=None)

    def apply_pending(self) -> None:
        if self.one is None:
            raise RuntimeError("apply_pending is for one rank; several ranks flush() instead")
        self.one.apply_pending()

    def drop_pending(self) -> None:
        if self.one is not None:
            self.one.grads = None
        if self.ctx.tier is not None:
            self.ctx.tier.release()

    def counters(self) -> dict[str, int]:
        out = self.ctx.counters.total()
        if self.ctx.tier is not None:  # (the host tier's, summed and reported as the others)
            out.update({f"tier_{k}": v for k, v in self.ctx.tier.counters.as_dict().items()})
        return out

    def local_step(self) -> LocalStep | None:
        return self.one

    def whole_step(self, *, max_q: int | None = None) -> WholeStep | None:
        return None

    def async_engine(self) -> AsyncStep | None:
        return None

    def release_graphs(self) -> None:
        """(The one-rank whole-step graph is the trainer's, :mod:`hetgmp.train.graphed`.)"""

    def peers_full(self, full: bool | None) -> None:
        """(No peers.)"""

    def close(self) -> None:
        pass

    def padded_rebuilds(self) -> list[Capacity]:
        return []

    def padded_presyncs(self) -> int:
        return 0

    def padded_buffers(self) -> StaticExchange | None:
        return None
