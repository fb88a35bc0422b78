"""The lookup as one autograd node per step: forward runs (or finishes) the step and returns
the ``[B, F, D]`` rows; backward hands their gradient to the step engine, to be applied at the
next step, and returns none.

Why a node of our own: a leaf + tensor hook + view (``register_hook`` costs Python work per
step; the backward then ran ViewBackward and AccumulateGrad, which stored a ``.grad`` nobody
reads) cost ~0.25 ms of host time per padded step on the H200 machine
(bench/gpu/profile_host.py). Autograd only calls a backward whose node has an input that
requires grad: that is ``anchor``, a 0-d leaf of the module that never gets a gradient (None is
returned for it). The exact transport keeps the leaf + hook (its gather's backward sums
repeated rows).
"""

from __future__ import annotations

from typing import Any

import torch

from hetgmp.embedding.batch import Batch, Occurrences
from hetgmp.embedding.collective.stepper import Stepper
from hetgmp.embedding.context import OP_FORWARD
from hetgmp.embedding.local import LocalStep, autocast_rows_dtype
from hetgmp.embedding.padded.take import take_values


class _LocalLookup(torch.autograd.Function):
    """The one-rank step (:class:`LocalStep`): forward is the whole step."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, step: LocalStep, ids: torch.Tensor) -> torch.Tensor:
        values, batch = step.step(ids, op=OP_FORWARD, error=None)
        ctx.step, ctx.batch = step, batch
        return values

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None]:
        # (a later backward through the same output replaces the gradient; with create_graph
        # the gradient has a graph, which the in-place update must not join)
        ctx.step.grads = (ctx.batch, grad.detach() if grad.requires_grad else grad)
        return None, None, None


class _PaddedLookup(torch.autograd.Function):
    """A padded training step's lookup: forward gathers the occurrences' rows from the step's
    unique values (``values[inv]``); backward hands their gradient to the stepper unsummed
    and launches nothing (the sum is part of the next step's pre-sync graph), or, for the
    whole-step graph, sums it per row into the exchange's fixed buffer at once."""

    @staticmethod
    def forward(
        ctx: Any, anchor: torch.Tensor, stepper: Stepper, values: torch.Tensor, batch: Batch,
        shape: tuple[int, int, int],
    ) -> torch.Tensor:  # fmt: skip
        ctx.stepper, ctx.batch = stepper, batch
        if stepper.padded is not None and stepper.padded.whole:
            stepper.padded.zero_grad_early(batch)  # (EARLY_ZERO: off the chain after backward)
        dtype = autocast_rows_dtype(values.device)
        k = stepper.ctx.kernels
        return take_values(batch.static, values, batch.inv, backend=k, out_dtype=dtype).view(shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, ...]:
        g = grad.detach().reshape(-1, grad.shape[-1])
        b, padded = ctx.batch, ctx.stepper.padded
        if padded is not None and padded.whole:  # summed now, into a fixed buffer (.whole)
            # (a bf16 gradient is added in float32 by the row kernel: no cast pass)
            ctx.stepper.grads = (b, padded.sum_grad_aside(b, g.contiguous()))
            return None, None, None, None, None
        if g.dtype != torch.float32 or not g.is_contiguous():
            g = g.to(torch.float32).contiguous()  # (e.g. the expanded gradient of a sum())
        ctx.stepper.grads = (b, Occurrences(g))
        return None, None, None, None, None
