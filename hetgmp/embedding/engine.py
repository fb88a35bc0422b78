"""The step-engine interface: what every way of running a table's steps does.

A :class:`~hetgmp.embedding.DistributedEmbedding` holds one engine and forwards its public
calls to it without asking which kind it is. The engines (:mod:`hetgmp.embedding.engines`
builds the one a table's settings call for):

* ``local``: one rank, every row owned (:mod:`hetgmp.embedding.local`);
* ``collective``: several ranks, one exchange among all of them per step, exact or padded
  (:mod:`hetgmp.embedding.collective`, :mod:`hetgmp.embedding.padded`);
* ``async``: several ranks, rows served point to point by each rank's row service
  (:mod:`hetgmp.embedding.rowservice`).

Every engine keeps the staleness protocol of :mod:`hetgmp.embedding.protocol`: a step applies
the previous step's gradient, then reads the batch's rows. The capability accessors
(:meth:`StepEngine.local_step`, :meth:`StepEngine.whole_step`, :meth:`StepEngine.async_engine`)
are how the trainer learns what more an engine offers; each is None where it does not.

The trainer names the whole-step types through this module (``WholeStep``, its pending
gradient ``PendingGrads``, and ``GraphReleaser``, the ``env.closers`` entry that releases
CUDA graphs), not through the engines' files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from hetgmp.embedding.batch import Batch, Summed
from hetgmp.embedding.context import EngineKind
from hetgmp.embedding.padded.releaser import GraphReleaser
from hetgmp.embedding.padded.whole import WholeStep

if TYPE_CHECKING:  # pragma: no cover
    from hetgmp.embedding.local import LocalStep
    from hetgmp.embedding.padded.buffers import StaticExchange
    from hetgmp.embedding.padded.fields import Capacity
    from hetgmp.embedding.rowservice import AsyncStep

__all__ = ["EngineKind", "GraphReleaser", "PendingGrads", "StepEngine", "WholeStep"]

# A captured whole step's pending gradient: the batch and its gradient summed per row
# (restored after each replay, :meth:`WholeStep.pending`).
PendingGrads = tuple[Batch, Summed]


class StepEngine(Protocol):
    """What a table's step engine does (see the module docstring)."""

    kind: EngineKind

    def forward(self, ids: torch.Tensor, *, training: bool) -> torch.Tensor:
        """One step on ``ids [B, F]`` (int64): apply the pending gradient, read the rows and
        return ``[B, F, D]``. When ``training`` and autograd records, the output's backward
        hands the gradient to the engine, to be applied at the next step (or
        :meth:`apply_pending` / :meth:`flush`). Collective where the engine has peers."""
        ...

    def prefetch(self, ids: torch.Tensor, *, training: bool) -> None:
        """Prepare the NEXT batch ``ids`` now (its plan, on a side stream on CUDA); a following
        :meth:`forward` given this same tensor object uses it. A no-op where there is nothing
        to prepare."""
        ...

    def send_ahead(self, ids: torch.Tensor, *, training: bool) -> None:
        """After backward: start the next batch's traffic now (the async engine sends its
        push and reads); engines without such traffic :meth:`prefetch` instead."""
        ...

    def flush(self) -> None:
        """(Collective) push every pending gradient and mirror delta to the owners."""
        ...

    def apply_pending(self) -> None:
        """Apply the last backward's update now, instead of at the next step (one rank only;
        the others raise ``RuntimeError``: their updates travel with the next exchange)."""
        ...

    def drop_pending(self) -> None:
        """Forget the gradient not applied yet (rows were loaded from a checkpoint)."""
        ...

    def release_graphs(self) -> None:
        """Drop every CUDA graph the engine captured (later steps capture again)."""
        ...

    def close(self) -> None:
        """Release what the engine holds beyond memory (threads, sockets); idempotent."""
        ...

    def peers_full(self, full: bool | None) -> None:
        """Whether every rank's batch of the coming step is full and fits the fixed capacities
        (the trainer says so each step: it knows every rank's sample count and the epoch's
        verdicts). True: the padded transport's pre-sync path may run (it meets the peers
        before the sizes exchange could tell a rank that one of them has a short batch);
        False: the exact transport on every rank; None (never said, or unsaid: the trainer
        after ``fit``): the padded transport where the sizes exchange agrees, no pre-sync (safe
        for a custom loop with unequal batches, a little slower). A no-op for one rank."""
        ...

    def counters(self) -> dict[str, int]:
        """Cumulative counters of this rank (bytes by kind, rows by source, pushes)."""
        ...

    # -------------------------------------------------------------- capabilities
    def local_step(self) -> LocalStep | None:
        """The one-rank step, for a whole-step CUDA graph of one rank; else None."""
        ...

    def whole_step(self, *, max_q: int | None = None) -> WholeStep | None:
        """The padded exchange set up for a whole-step CUDA graph of several ranks (made at
        the first call, before the first step); None without a padded exchange."""
        ...

    def async_engine(self) -> AsyncStep | None:
        """The async engine (clocks, global progress, the rank's RPC service); else None."""
        ...

    # -------------------------------------------------------------- padded diagnostics
    def padded_rebuilds(self) -> list[Capacity]:
        """Every capacity the padded exchange took (empty without one)."""
        ...

    def padded_presyncs(self) -> int:
        """Steps whose pre-sync part ran in fixed shapes (0 without a padded exchange)."""
        ...

    def padded_buffers(self) -> StaticExchange | None:
        """The padded exchange's current buffers (tests look at their graphs); else None."""
        ...
