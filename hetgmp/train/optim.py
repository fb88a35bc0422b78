"""The dense optimizer for ``--dense-optimizer``: fused kernels on CUDA, foreach on CPU.

The fused (one kernel for all parameters) and foreach (one op per parameter list) forms compute
the same update as the per-parameter loop, up to float rounding.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hetgmp.train.config import DENSE_OPTIMIZERS


def optimizer_impl(name: str, device: torch.device) -> dict[str, Any]:
    """The implementation keywords for ``name`` on ``device``: fused where torch ships a CUDA
    kernel (Adam, SGD; Adam capturable, so a CUDA graph can hold its step), else foreach
    (Adagrad on CUDA, everything on CPU)."""
    if device.type == "cuda" and name == "adam":
        return {"fused": True, "capturable": True}
    if device.type == "cuda" and name == "sgd":
        return {"fused": True}
    return {"foreach": True}


def make_dense_optimizer(
    name: str, params: list[nn.Parameter], lr: float, device: torch.device | None = None
) -> torch.optim.Optimizer:
    """The dense optimizer for ``--dense-optimizer`` over ``params`` (all on ``device``)."""
    dev = device if device is not None else (params[0].device if params else torch.device("cpu"))
    impl = optimizer_impl(name, dev) if params else {}
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, **impl)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, **impl)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, **impl)
    raise ValueError(f"--dense-optimizer {name!r}: expected one of {DENSE_OPTIMIZERS}")
