"""The async engine as a :class:`~hetgmp.embedding.engine.StepEngine`: several ranks at their
own pace, rows served point to point by each rank's row service (:class:`~.step.AsyncStep`)."""

from __future__ import annotations

import torch

from hetgmp.embedding.batch import input_problem
from hetgmp.embedding.context import EngineKind, StepContext
from hetgmp.embedding.planned import PlannedEngine
from hetgmp.embedding.rowservice.step import AsyncStep


class AsyncEngine(PlannedEngine):
    """Several ranks at their own pace (:class:`AsyncStep`: each rank's row service)."""

    kind: EngineKind = "async"
    stepper: AsyncStep

    def __init__(self, ctx: StepContext, step: AsyncStep, anchor: torch.Tensor) -> None:
        super().__init__(ctx, step, None, anchor)
        ctx.env.closers.append(self.close)  # (its thread and sockets go before the env does)

    def send_ahead(self, ids: torch.Tensor, *, training: bool) -> None:
        """Push this step's gradient and send the next batch's reads now
        (:meth:`~hetgmp.embedding.rowservice.AsyncStep.send_ahead`)."""
        if not training or input_problem(ids) is not None:
            return self.prefetch(ids, training=training)
        self._prefetched = prep = self._plan(ids.to(self.device), training)
        prep.source = ids
        self.stepper.send_ahead(prep)

    def counters(self) -> dict[str, int]:
        """With what this rank's service moved, and the bad messages it refused
        (``rpc_refused``, by reason ``rpc_refused_<reason>``: :mod:`hetgmp.comm.rpc.schema`)."""
        total = self.ctx.counters.total()
        for k, v in self.stepper.service_bytes().items():
            total[k] += v
        total.update(self.stepper.service.refusals())
        return total

    def async_engine(self) -> AsyncStep | None:
        return self.stepper

    def close(self) -> None:
        self.stepper.close()
