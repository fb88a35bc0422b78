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

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# Defer the first layer's weight gradient (False: autograd computes it in place, before the
# embedding's backward: a diagnosis).
ENABLED = True
# (products a float32 gradient adds as they are: each widens to float32 exactly)
_NARROW = (torch.bfloat16, torch.float16, torch.float32)


class _DeferredWeightGrad(torch.autograd.Function):
    """``x @ w.t()`` whose backward returns the input's gradient and queues the weight's."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, sink: Any, gate: Any) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.sink, ctx.gate = sink, gate
        return F.linear(x, w)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        x, w = ctx.saved_tensors
        sink, gate = ctx.sink, ctx.gate

        def weight_grad() -> None:  # (after every node of this backward ran)
            held = gate()
            if held is None:
                sink(grad, x)
            else:  # (the trainer runs it later: set_product_gate)
                held(lambda: sink(grad, x))

        torch.autograd.Variable._execution_engine.queue_callback(weight_grad)
        return (grad.mm(w) if ctx.needs_input_grad[0] else None), None, None, None


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
    hook = rows_hook(linears[0])

    def add(p: torch.Tensor, rows: slice, part: torch.Tensor) -> None:
        if not p.requires_grad:  # (a frozen layer: no gradient, as autograd gives none)
            return
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        # (a float32 gradient takes a lower-precision product as it is: the add widens it
        # exactly, as a cast first would, without the cast's own pass: ~5 us of the dense
        # path after backward at batch 8192 under autocast on an H100)
        widened = p.dtype == torch.float32 and part.dtype in _NARROW
        p.grad[rows, :cols].add_(part if widened else part.to(p.dtype))

    def spread(gw: torch.Tensor, ps: Sequence[torch.Tensor]) -> None:
        r = 0  # (gw's rows: the weights' stacked, then padding rows)
        for p in ps:
            add(p, slice(None), gw[r : r + p.shape[0]])
            r += p.shape[0]

    def sink(grad: torch.Tensor, x: torch.Tensor) -> None:
        late = _late_rows(weights[0], hook)
        if late is None:  # (one product for every weight)
            spread(grad.t().mm(x), weights)
            return
        # (the first weight's last rows first, handed to the hook; then its other rows, then
        # the other weights' rows: three products)
        first = weights[0]
        add(first, late, grad[:, late].t().mm(x))
        hook(first, late.start, late.stop)  # type: ignore[misc]
        add(first, slice(0, late.start), grad[:, : late.start].t().mm(x))
        if len(weights) > 1:
            spread(grad[:, late.stop :].t().mm(x), weights[1:])

    first_linear = linears[0]
    with torch.autocast(dev, enabled=False):
        return _DeferredWeightGrad.apply(x, w.detach(), sink, lambda: product_gate(first_linear))


RowsHook = Callable[[torch.Tensor, int, int], None]


def set_rows_hook(linear: nn.Linear, hook: RowsHook | None) -> None:
    """Have ``hook(weight, r0, r1)`` called once the deferred gradient of ``linear``'s weight
    rows ``[r0, r1)`` is complete (their last half, computed first for it: the trainer starts
    their all-reduce while the rest's product runs, ``train/dense_sync.py``); None: no hook.
    The model stays free of distribution: the trainer sets the hook."""
    linear.__dict__["_rows_hook"] = hook


def rows_hook(linear: nn.Linear) -> RowsHook | None:
    """The hook :func:`set_rows_hook` set on ``linear`` (None: none)."""
    return linear.__dict__.get("_rows_hook")


ProductGate = Callable[[Callable[[], None]], None]


def set_product_gate(linear: nn.Linear, gate: ProductGate | None) -> None:
    """Have the deferred product of ``linear``'s layer handed to ``gate(run)`` at the end of
    backward instead of run there: the trainer calls ``run()`` later, once its stream waits for
    what the product should follow (``train/product_hold.py``); None: run at the end of
    backward. The model stays free of distribution: the trainer sets the gate."""
    linear.__dict__["_product_gate"] = gate


def product_gate(linear: nn.Linear) -> ProductGate | None:
    """The gate :func:`set_product_gate` set on ``linear`` (None: none)."""
    return linear.__dict__.get("_product_gate")


def _late_rows(weight: torch.Tensor, hook: RowsHook | None) -> slice | None:
    rows = weight.shape[0]
    if hook is None or not weight.requires_grad or rows < 2:
        return None
    return slice(rows // 2, rows)


def wanted(x: torch.Tensor, linears: Sequence[nn.Linear]) -> bool:
    """Whether the deferred product applies: on, gradients recorded, a weight that wants one."""
    return ENABLED and torch.is_grad_enabled() and any(lin.weight.requires_grad for lin in linears)
