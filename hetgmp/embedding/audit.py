"""Audit mode (tests): every mirror and remote read of a step checked and recorded with its lag
(host syncs are fine here)."""

from __future__ import annotations

from typing import Any

import torch

from hetgmp.embedding.batch import Batch
from hetgmp.embedding.context import StepContext
from hetgmp.embedding.errors import StalenessViolation
from hetgmp.embedding.wire import i64


def record_audit(
    ctx: StepContext, batch: Batch, r: dict[str, Any], refresh: torch.Tensor,
    values: torch.Tensor, bound: int,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """Check that no read lags its owner by a negative count and return the step's record
    (``r``: the replies, see :meth:`~hetgmp.embedding.collective.exact.ExactExchange._send_replies`)."""
    store, sw = ctx.store, ctx.opt.state_width
    n_o, n_m = batch.n_own, batch.n_mir
    n_r = batch.u.numel() - n_o - n_m
    q_lag = r["lag"]
    if bool((q_lag < 0).any()):
        raise StalenessViolation(
            f"rank {ctx.env.rank}: a mirror read lags its owner by {int(q_lag.max())} "
            f"(min {int(q_lag.min())}) with bound {bound}"
        )
    dev = store.device
    is_mirror = torch.cat([torch.ones(n_m, dtype=torch.bool), torch.zeros(n_r, dtype=torch.bool)])
    zeros_r = torch.zeros(n_r, dtype=torch.int64, device=dev)
    ext = torch.cat([r["mir_ext"], r["rem_ext"]])
    return {
        "ids": batch.u[n_o:].clone(),
        "is_mirror": is_mirror.to(dev),
        "refreshed": torch.cat([refresh, zeros_r.bool()]),
        "lag": torch.cat([torch.where(refresh, 0, q_lag), zeros_r]),
        "owner_version": i64(ext[:, sw:]),
        "owner_value": torch.cat([r["mir_vals"], r["rem_vals"]]).clone(),
        "used_value": values[n_o:].clone(),
        "pending": torch.cat([store.pending[batch.slot[n_o : n_o + n_m] - store.n_own], zeros_r]),
    }
