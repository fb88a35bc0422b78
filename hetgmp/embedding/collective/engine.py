"""The collective engine as a :class:`~hetgmp.embedding.engine.StepEngine`: several ranks,
one exchange among all of them per step (:class:`~.stepper.Stepper`: exact payloads, or the
padded exchange where every rank takes it). With owned rows on a host tier
(:mod:`hetgmp.embedding.tier_owned`) a batch's owned rows are made resident right before its
plan is made (the plan reads their cache slots), never ahead."""

from __future__ import annotations

import torch

from hetgmp.embedding.batch import input_problem
from hetgmp.embedding.collective.stepper import Stepper
from hetgmp.embedding.context import EngineKind, StepContext
from hetgmp.embedding.padded.exchange import PaddedExchange
from hetgmp.embedding.padded.whole import WholeStep
from hetgmp.embedding.planned import PlannedEngine


class CollectiveEngine(PlannedEngine):
    """The collective engine (see the module docstring)."""

    kind: EngineKind = "collective"
    stepper: Stepper

    def __init__(
        self, ctx: StepContext, padded: PaddedExchange | None, anchor: torch.Tensor
    ) -> None:
        super().__init__(ctx, Stepper(ctx, padded), padded, anchor)
        self._whole: WholeStep | None = None

    def whole_step(self, *, max_q: int | None = None) -> WholeStep | None:
        """The padded exchange set up for a whole-step graph (:mod:`hetgmp.embedding.padded.whole`)."""
        if self.padded is None:
            return None
        if self._whole is None:
            self._whole = WholeStep(self.padded, self.stepper, max_q=max_q)
        return self._whole

    def async_engine(self) -> None:
        return None

    def peers_full(self, full: bool | None) -> None:
        """(The stepper takes the padded transport only where every rank can.)"""
        self.stepper.peers_full = full

    def forward(self, ids: torch.Tensor, *, training: bool) -> torch.Tensor:
        if self.ctx.owned is not None and not _capturing(ids):  # (a capture: the epoch's
            self.ctx.owned.before_plan(ids if input_problem(ids) is None else None)  # hold)
        return super().forward(ids, training=training)

    def prefetch(self, ids: torch.Tensor, *, training: bool) -> None:
        """The next batch's plan now; with a host tier nothing (its owned rows' slots are
        known only once they are made resident, at its step)."""
        if self.ctx.owned is None:
            super().prefetch(ids, training=training)

    def flush(self) -> None:
        if self.ctx.owned is not None:
            self.ctx.owned.before_plan(None)
        super().flush()
        if self.ctx.owned is not None:  # (nothing pending: an epoch's hold may go)
            self.ctx.owned.release_epoch()

    def drop_pending(self) -> None:
        super().drop_pending()
        if self.ctx.owned is not None:
            self.ctx.owned.drop()


def _capturing(ids: torch.Tensor) -> bool:
    """Whether a CUDA graph captures now (a host tier's step decisions read ids on the host:
    the whole-step graph's epoch hold stands for them, .tier_epoch)."""
    return ids.is_cuda and torch.cuda.is_current_stream_capturing()
