"""The first layer's weight gradient computed at the end of backward, after the embedding's.

Why: the first layer over the embeddings is the last dense node backward reaches; autograd ran
its two products (the input's gradient, then the weight's) before it called the lookup's
backward, which starts the rows' gradient sum and, with several ranks, the exchange whose chain
of kernels and all-to-alls the next step waits for. Computing the weight's product after the
whole backward (an autograd callback) lets that chain start one product earlier, while the
product runs beside it (2 H100s, WDL dim 128, batch 8192: each product ~39 us of a ~830 us
step, 2026-11-26). The arithmetic is autograd's own: the same product in the same dtype, cast
to the parameter's dtype and added to its ``.grad`` in place (the gradient bucket's views).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# Defer the first layer's weight gradient (False: autograd computes it in place, before the
# embedding's backward: a diagnosis).
ENABLED = True


class _DeferredWeightGrad(torch.autograd.Function):
    """``x @ w.t()`` whose backward returns the input's gradient and queues the weight's."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, sink: Any) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.sink = sink
        return F.linear(x, w)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        x, w = ctx.saved_tensors
        sink = ctx.sink

        def weight_grad() -> None:  # (after every node of this backward ran)
            sink(grad.t().mm(x))

        torch.autograd.Variable._execution_engine.queue_callback(weight_grad)
        return (grad.mm(w) if ctx.needs_input_grad[0] else None), None, None


def first_product(
    x: torch.Tensor, w: torch.Tensor, linears: Sequence[nn.Linear], cols: int
) -> torch.Tensor:
    """``F.linear(x, w)`` for the first layer's block ``w`` (``linears``' weights' first
    ``cols`` columns stacked by rows, then zero padding rows) with the weights' gradient
    deferred to the end of backward (module docstring). Under autocast both operands are cast
    as ``F.linear`` casts them; the gradient of ``w`` reaches the parameters only through the
    callback (``w`` itself gets none)."""
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        dtype = torch.get_autocast_dtype(dev)
        x, w = x.to(dtype), w.to(dtype)
    weights = [lin.weight for lin in linears]

    def sink(gw: torch.Tensor) -> None:
        r = 0
        for p in weights:
            part = gw[r : r + p.shape[0]].to(p.dtype)
            r += p.shape[0]
            if not p.requires_grad:  # (a frozen layer: no gradient, as autograd gives none)
                continue
            if p.grad is None:
                g = torch.zeros_like(p)
                g[:, :cols] = part
                p.grad = g
            else:
                p.grad[:, :cols].add_(part)

    with torch.autocast(dev, enabled=False):
        return _DeferredWeightGrad.apply(x, w.detach(), sink)


def wanted(x: torch.Tensor, linears: Sequence[nn.Linear]) -> bool:
    """Whether the deferred product applies: on, gradients recorded, a weight that wants one."""
    return ENABLED and torch.is_grad_enabled() and any(lin.weight.requires_grad for lin in linears)
