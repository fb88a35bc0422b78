"""Data-parallel dense gradients: one all-reduce over a flat buffer per step.

The trainer's loss is the SUM over local samples divided by the GLOBAL batch size, so the SUM of
the ranks' gradients is exactly the gradient of the global mean loss -- the same as one process on
the whole global batch. The dense learning rate therefore does not grow with the rank count (as it
does in HET-GMP, which sums mean-loss gradients).
"""

from __future__ import annotations

import torch
from torch import nn

from hetgmp.comm.collectives import all_reduce_sum
from hetgmp.comm.env import DistEnv


def sum_dense_grads(env: DistEnv, params: list[nn.Parameter]) -> None:
    """Replace every ``p.grad`` by its sum over ranks (collective; no-op for one process)."""
    if env.world_size <= 1 or not params:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    all_reduce_sum(env, flat)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone()
        offset += n
