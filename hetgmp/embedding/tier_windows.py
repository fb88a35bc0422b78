"""An epoch's owned rows held window by window (issue 33, several ranks' host tier in the
whole-step flow): where the rows an epoch touches do not fit the owners' caches at once, the
epoch is cut into windows (the whole epoch first; a window that does not fit is halved, down to
one step), and each window start holds its rows (:func:`.tier_epoch.hold_rows`) before its
first step plans anything: no step inside a window decides residency.

What a window's hold covers: its steps' batches on every rank, the batch of the step before it
(the step at the window start applies that batch's gradient; for an epoch's first window the
last epoch's last batch) and the mirrors with pending counts (a due push may wait into the
window). A hold that does not fit on some rank changes nothing there (the tier refuses before
it moves a row); every rank learns it (one flag, summed), and all retry with half the window.
So the ranks cut the same windows and meet at the same holds; the length found is kept for the
epoch's later windows, and the next epoch tries twice it first (windows grow back where the
access allows, at the cost of at most one refused hold per epoch).
"""

from __future__ import annotations

from typing import Any

import torch

from hetgmp.comm.collectives import any_true
from hetgmp.comm.env import DistEnv
from hetgmp.embedding.tier_epoch import hold_rows
from hetgmp.embedding.tier_host import CacheBudgetError


def batch_rows(
    sparse: torch.Tensor, positions: torch.Tensor, batch_size: int, begin: int, end: int
) -> torch.Tensor:
    """This rank's ids (int64, flat) of the epoch's batches ``begin..end-1`` (none past its
    last sample)."""
    pos = positions[begin * batch_size : end * batch_size].to(sparse.device, torch.int64)
    return sparse.index_select(0, pos).reshape(-1).to(torch.int64)


class EpochWindows:
    """The owned rows of an epoch held window by window (see the module docstring): made at
    the epoch check (:meth:`start`), asked before each step (:meth:`before_step`)."""

    def __init__(self, env: DistEnv, ctx: Any) -> None:
        self.env, self.ctx = env, ctx
        self.epoch: tuple[torch.Tensor, torch.Tensor, int] | None = None  # (sparse, pos, bs)
        self.steps = 0
        self.length = 0  # (steps per window; 0: no epoch started)
        self.begin = 0  # (the held window's first step)
        self.tail: torch.Tensor | None = None  # (the last epoch's last batch's ids)
        self.holds = 0  # (windows held, for the logs and tests)
        self.halvings = 0  # (holds that did not fit and were tried again, halved)

    def start(self, sparse: torch.Tensor, positions: torch.Tensor, batch_size: int,
              steps: int) -> None:  # fmt: skip
        """(Collective, at an epoch start) hold the epoch's first window."""
        self.epoch, self.steps = (sparse, positions, batch_size), max(1, steps)
        # (the last epoch's length doubled: windows grow back where the access allows)
        self.length = self.steps if self.length == 0 else min(2 * self.length, self.steps)
        self._hold(0, self.tail)
        self.tail = self._rows(self.steps - 1, self.steps).clone()

    def starts_window(self, batch: int) -> bool:
        """Whether the epoch's ``batch`` is outside the held window (a window start, or the
        first step after a resume): no step before it may plan it ahead."""
        return self.length > 0 and not self.begin <= batch < self.begin + self.length

    def before_step(self, batch: int) -> None:
        """(Collective) hold the rows of the window starting at the epoch's ``batch`` where
        it is not in the held one, or where a flush (an evaluation, a checkpoint: on every
        rank) released the hold."""
        if self.epoch is None:
            return
        if not (self.starts_window(batch) or self.ctx.owned.released):
            return
        self._hold(batch, self._rows(batch - 1, batch) if batch else self.tail)

    def _rows(self, begin: int, end: int) -> torch.Tensor:
        assert self.epoch is not None
        return batch_rows(*self.epoch, begin, end)

    def _hold(self, begin: int, before: torch.Tensor | None) -> None:
        """Hold ``[begin, begin + length)`` and the batch ``before`` it, halving the length
        until every rank's hold fits (:class:`CacheBudgetError` where one step's does not)."""
        while True:
            rows = self._rows(begin, begin + self.length)
            if before is not None:
                rows = torch.cat([before.to(rows.device), rows])
            failed: Exception | None = None
            try:
                hold_rows(self.env, self.ctx, rows)
            except Exception as e:  # (agreed on below: no rank left waiting for the others)
                failed = e
            if any_true(self.env, failed is not None and not isinstance(failed, CacheBudgetError)):
                raise failed or RuntimeError("another rank failed its host-tier hold")
            if not any_true(self.env, failed is not None):
                break
            if self.length == 1:  # (nothing moved where it did not fit: try again, halved)
                raise failed or CacheBudgetError(
                    "one step's owned rows do not fit another rank's host-tier cache: raise "
                    "--cache-budget, or train smaller batches"
                )
            self.length, self.halvings = max(1, self.length // 2), self.halvings + 1
        self.begin, self.holds = begin, self.holds + 1
