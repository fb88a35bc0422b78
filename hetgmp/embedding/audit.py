"""Audit mode (tests): every mirror and remote read of a step checked and recorded with its lag
(host syncs are fine here)."""

from __future__ import annotations

import torch

from hetgmp.embedding.batch import Batch
from hetgmp.embedding.context import StepContext
from hetgmp.embedding.errors import StalenessViolation


def record_audit(
    ctx: StepContext, batch: Batch, lag: torch.Tensor, owner_version: torch.Tensor,
    owner_value: torch.Tensor, refresh: torch.Tensor, values: torch.Tensor, bound: int,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """Check that no read lags its owner by a negative count and return the step's record.
    ``lag``: per mirror query; ``owner_version`` / ``owner_value``: what the owners answered
    for every mirror query, then for every row not stored here (audit asks for every value);
    ``values``: the rows the step used, in block order (see :func:`.reads.finish_read`)."""
    store = ctx.store
    n_o, n_m = batch.n_own, batch.n_mir
    n_r = batch.u.numel() - n_o - n_m
    if bool((lag < 0).any()):
        raise StalenessViolation(
            f"rank {ctx.env.rank}: a mirror read lags its owner by {int(lag.max())} "
            f"(min {int(lag.min())}) with bound {bound}"
        )
    dev = store.device
    is_mirror = torch.cat([torch.ones(n_m, dtype=torch.bool), torch.zeros(n_r, dtype=torch.bool)])
    zeros_r = torch.zeros(n_r, dtype=torch.int64, device=dev)
    return {
        "ids": batch.u[n_o:].clone(),
        "is_mirror": is_mirror.to(dev),
        "refreshed": torch.cat([refresh, zeros_r.bool()]),
        "lag": torch.cat([torch.where(refresh, 0, lag), zeros_r]),
        "owner_version": owner_version,
        "owner_value": owner_value.clone(),
        "used_value": values[n_o:].clone(),
        "pending": torch.cat([store.pending[batch.slot[n_o : n_o + n_m] - store.n_own], zeros_r]),
    }
