"""models/deferred_wgrad: the first layer's weight gradient computed at the end of backward
equals autograd's own, lands in ``.grad`` in place (the gradient bucket's views), and skips a
frozen weight."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hetgmp.models import deferred_wgrad
from hetgmp.models.layers import first_layer


def _grads(
    enabled: bool, *, views: bool = False, frozen: bool = False, amp: bool = False
) -> list[torch.Tensor]:
    torch.manual_seed(0)
    deep, wide = nn.Linear(3 * 4 + 5, 6), nn.Linear(3 * 4 + 5, 1)
    wide.weight.requires_grad_(not frozen)
    params = [deep.weight, deep.bias, wide.weight, wide.bias]
    flat = torch.zeros(sum(p.numel() for p in params))
    if views:  # (the gradient bucket: every .grad a view of one flat buffer)
        at = 0
        for p in params:
            p.grad = flat[at : at + p.numel()].view_as(p)
            at += p.numel()
    emb = torch.randn(8, 3, 4, requires_grad=True)
    dense = torch.randn(8, 5)
    old, deferred_wgrad.ENABLED = deferred_wgrad.ENABLED, enabled
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            out = first_layer(emb, dense, (deep, wide))
        (out[:, :7].float() * torch.randn(8, 7)).sum().backward()
    finally:
        deferred_wgrad.ENABLED = old
    if views:  # (still the bucket's views, written in place)
        assert deep.weight.grad.data_ptr() == flat.data_ptr()
    return [emb.grad] + [torch.zeros(0) if p.grad is None else p.grad.clone() for p in params]


@pytest.mark.parametrize("views", [False, True])
def test_deferred_weight_gradient_equals_autograds(views: bool) -> None:
    got, want = _grads(True, views=views), _grads(False, views=views)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-7)
    assert got[1].abs().sum() > 0  # (the deep weight got its gradient: not a no-op)


def test_a_frozen_weight_gets_no_gradient() -> None:
    got, want = _grads(True, frozen=True), _grads(False, frozen=True)
    assert got[3].numel() == 0 and want[3].numel() == 0  # (wide.weight: frozen)
    torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=1e-7)


def test_under_autocast_the_bf16_product_adds_into_float32_as_autograd_casts_it() -> None:
    """Under autocast the product is bf16 and the weight's gradient float32: added as it is
    (widened exactly by the add), it equals autograd's cast-then-accumulate bit for bit."""
    got, want = _grads(True, amp=True), _grads(False, amp=True)
    assert got[1].dtype == torch.float32 and got[1].abs().sum() > 0
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
