"""The first layer's deferred weight product held until the exchange's work after backward is
queued (``hetgmp.train.product_hold.PRODUCT_AFTER_STAGE``, off until measured; issue 30).

Only the order of two independent pieces of work moves, so a run trains bit for bit as without
it: on 2 gloo ranks of the whole-step flow (where the exchange of the next batch runs after
backward, then the held product) the rows, optimizer state and dense layers are equal, and the
product was held at every step that exchanged early. The gate itself: a held product adds
nothing until run, then exactly what the product at the end of backward adds."""

from __future__ import annotations

import torch
from test_whole_step_multi import _rank, _switched_runs_equal
from torch import nn

from hetgmp.comm.env import DistEnv
from hetgmp.models import deferred_wgrad
from hetgmp.train import product_hold
from hetgmp.train.config import TrainConfig


def _run(env: DistEnv, cfg: TrainConfig, whole: bool, on: bool) -> dict:
    product_hold.PRODUCT_AFTER_STAGE = on  # (in the spawned rank)
    released = [0]
    real = product_hold.ProductHold.release

    def counted(self) -> None:  # type: ignore[no-untyped-def]
        released[0] += len(self.runs)
        real(self)

    product_hold.ProductHold.release = counted  # type: ignore[method-assign]
    out = _rank(env, cfg, whole, None)
    out["released"] = released[0]
    return out


def test_held_product_trains_as_the_product_at_the_end_of_backward(tiny_dataset, tmp_path) -> None:
    off, on = _switched_runs_equal(
        tiny_dataset, tmp_path, _run, True, optimizer="adagrad", bound=3,
        dense_optimizer="adam", dense_lr=0.01,
    )  # fmt: skip
    for a, b in zip(off, on, strict=True):
        assert a["released"] == 0
        # (every step that exchanged the next batch after backward held its product)
        assert b["released"] == b["early"] >= 4, (b["released"], b["early"])
        for k, v in a["dense"].items():  # (bit for bit: the same arithmetic in another order)
            assert torch.equal(b["dense"][k], v), k


class _Table:
    """The two methods of the table a hold uses (no event outside a CUDA capture)."""

    def __init__(self) -> None:
        self.marks: list[bool] = []

    def mark_staged(self, on: bool) -> None:
        self.marks.append(on)

    def take_staged(self) -> None:
        return None


def test_a_held_product_adds_nothing_until_run_then_autograds_gradient() -> None:
    torch.manual_seed(0)
    first, wide = nn.Linear(12, 6), nn.Linear(12, 1)
    x, up = torch.randn(5, 12, requires_grad=True), torch.randn(5, 8)
    w = torch.cat([first.weight, wide.weight, torch.zeros(1, 12)]).detach()
    grads = []
    for held in (False, True):
        for lin in (first, wide):
            lin.weight.grad = torch.zeros_like(lin.weight)
        table = _Table()
        hold = product_hold.ProductHold(first, table) if held else None
        (deferred_wgrad.first_product(x, w, (first, wide), 12) * up).sum().backward()
        if hold is not None:
            assert len(hold.runs) == 1 and first.weight.grad.abs().sum() == 0
            assert deferred_wgrad.product_gate(first) is None  # (closed once held)
            hold.release()
            assert table.marks == [True, False]
            # (run without autograd history, as at the end of backward: no grad_fn on .grad)
            assert not first.weight.grad.requires_grad and first.weight.grad.grad_fn is None
        grads.append((first.weight.grad.clone(), wide.weight.grad.clone()))
    assert torch.equal(grads[1][0], grads[0][0]) and grads[0][0].abs().sum() > 0
    assert torch.equal(grads[1][1], grads[0][1])
