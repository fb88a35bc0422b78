"""FlatAdam (hetgmp/train/flat_adam.py) steps like torch.optim.Adam, and their state dicts load
into each other (checkpoints written before it, or on CPU, resume on CUDA and back)."""

from __future__ import annotations

import torch
from torch import nn

from hetgmp.train.flat_adam import FlatAdam, flatten_parameters


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(13, 7), nn.ReLU(), nn.Linear(7, 1))


def _flat(model: nn.Module, lr: float) -> tuple[FlatAdam, torch.Tensor]:
    params = list(model.parameters())
    flat = flatten_parameters(params)
    grads = torch.zeros_like(flat)
    off = 0
    for p in params:
        p.grad = grads[off : off + p.numel()].view_as(p)
        off += p.numel()
    return FlatAdam(params, flat, grads, lr=lr), grads


def _steps(model: nn.Module, opt: torch.optim.Optimizer, seed: int, n: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x = torch.randn(32, 13, generator=g)
        model(x).pow(2).mean().backward()
        opt.step()
        for p in model.parameters():
            p.grad.zero_()


def test_flat_adam_steps_like_torch_adam_and_shares_its_state_dict() -> None:
    a, b = _model(0), _model(0)
    flat_opt, _ = _flat(a, 0.01)
    ref = torch.optim.Adam(b.parameters(), lr=0.01)
    _steps(a, flat_opt, 1, 25)
    _steps(b, ref, 1, 25)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)
    # the parameters are views of the flat buffer, which the step updated
    assert all(p.untyped_storage().data_ptr() == flat_opt.flat_params.untyped_storage()
               .data_ptr() for p in a.parameters())  # fmt: skip
    # torch's state dict -> FlatAdam, FlatAdam's -> torch's: both go on identically
    c, d = _model(5), _model(5)
    with torch.no_grad():
        for pc, pd, pb in zip(c.parameters(), d.parameters(), b.parameters(), strict=True):
            pc.copy_(pb)
            pd.copy_(pb)
    flat_c, _ = _flat(c, 0.01)
    flat_c.load_state_dict(ref.state_dict())
    ref_d = torch.optim.Adam(d.parameters(), lr=0.01)
    ref_d.load_state_dict(flat_opt.state_dict())
    assert float(flat_c.step_t) == 25
    _steps(c, flat_c, 2, 10)
    _steps(d, ref_d, 2, 10)
    for pc, pd in zip(c.parameters(), d.parameters(), strict=True):
        torch.testing.assert_close(pc, pd, rtol=1e-5, atol=1e-6)
