"""Finishing a read, the same for every engine that asks owners for rows (the collective
exact exchange, :mod:`.collective.exact`, and the async row service,
:mod:`.rowservice.reads`): once the owners' answers are in, stale mirrors are refreshed (the
owner's value plus the mirror's own unpushed delta, the owner's version and optimizer state),
the batch's unique rows are gathered in block order (owned, mirrors, rows not stored here),
the read counters are taken and, in audit mode, the step's record.

The rules themselves are :mod:`.protocol`'s. (The padded exchange finishes its reads inside
its fixed-shape segments, :func:`.padded.reference.finish` and its fused kernel, on the same
rules; the one-rank step reads no mirror.)
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from hetgmp.embedding import protocol
from hetgmp.embedding.audit import record_audit
from hetgmp.embedding.batch import Batch
from hetgmp.embedding.context import StepContext
from hetgmp.embedding.kernels import take_rows
from hetgmp.embedding.ops import compact


@dataclasses.dataclass
class Answers:
    """The owners' answers to a batch's reads, in block order. ``lag``: per mirror query;
    ``mir_*``: value, version (int64) and optimizer state (None without) of the mirrors an
    owner sent a value for (every mirror query when the reader asked for all, ``send_all``,
    else exactly those beyond the bound); ``rem_*``: the same of the rows not stored here
    (``rem_ver`` and ``rem_state`` are read in audit mode only)."""

    lag: torch.Tensor
    mir_vals: torch.Tensor
    mir_ver: torch.Tensor
    mir_state: torch.Tensor | None
    rem_vals: torch.Tensor
    rem_ver: torch.Tensor | None = None
    rem_state: torch.Tensor | None = None


def finish_read(
    ctx: StepContext, batch: Batch, a: Answers, bound: int, deferred: torch.Tensor,
    lock: contextlib.AbstractContextManager[object] | None = None,
) -> torch.Tensor:  # fmt: skip
    """Refresh the mirrors beyond ``bound``, then the batch's unique rows' values in block
    order; the step's read counters (``deferred``: the mirrors the write rule let keep their
    updates) and audit record. ``lock``: held while the table is read and written (the async
    engine's table lock, shared with its service thread)."""
    store = ctx.store
    n_o, n_m = batch.n_own, batch.n_own + batch.n_mir
    refresh = protocol.beyond_bound(a.lag, bound)
    values = torch.empty(batch.u.numel(), store.dim, device=store.device)
    with lock if lock is not None else contextlib.nullcontext():
        n_sent = a.mir_vals.shape[0]
        if n_sent:
            ms = batch.slot[n_o:n_m]
            if ctx.send_all:  # (a value for every mirror: the fresh ones keep their own)
                protocol.refresh_mirrors(store, ms, a.mir_vals, a.mir_ver, a.mir_state, refresh)
            else:  # (values for exactly the refreshed mirrors, in block order)
                rs = ms.index_select(0, compact(refresh, n_sent))
                protocol.refresh_mirrors(store, rs, a.mir_vals, a.mir_ver, a.mir_state, None)
        take_rows(store.weight, batch.slot[:n_m], out=values[:n_m], backend=ctx.kernels)
        values[n_m:] = a.rem_vals
    zero = store.zeros_w[0]
    ctx.counters.rows_dev_step = protocol.read_counts(a.lag, bound, refresh, deferred, zero)
    ctx.counters.accumulate_rows()
    if ctx.audit:
        assert a.rem_ver is not None  # (read in audit mode)
        ver = torch.cat([a.mir_ver, a.rem_ver])
        owner_vals = torch.cat([a.mir_vals, a.rem_vals])
        ctx.last_audit = record_audit(ctx, batch, a.lag, ver, owner_vals, refresh, values, bound)
    return values
