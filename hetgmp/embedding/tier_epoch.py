"""What an epoch's (or a window's) steps read and push of each rank's owned rows (issue 33):
every rank sends each owner the distinct ids of that owner's rows among its batches and its
mirrors with pending counts, so that the owner can hold them all resident on its host tier
(:meth:`~.tier_owned.OwnedTier.hold_epoch`) and no step needs a residency decision: what a
whole-step CUDA graph of several ranks needs (docs/host_tier_plan.md, last section; the
windows: :mod:`.tier_windows`)."""

from __future__ import annotations

from typing import Any

import torch

from hetgmp.comm.env import DistEnv
from hetgmp.comm.exchange import exchange_counts, exchange_payload, pack_i64, unpack_i64


def epoch_requests(env: DistEnv, ids: torch.Tensor, owner: torch.Tensor) -> torch.Tensor:
    """(Collective) the distinct ids, ascending, that this rank owns among every rank's
    ``ids`` (any shape and order, repeats and negative padding allowed). ``owner``: the owner
    rank of every row, on ``ids``' device, the same on every rank."""
    flat = ids.reshape(-1)
    u = torch.unique(flat[flat >= 0])  # (sorted)
    o = owner.index_select(0, u).to(torch.int64)
    order = torch.argsort(o, stable=True)
    u, o = u.index_select(0, order), o.index_select(0, order)
    counts = torch.bincount(o, minlength=env.world_size).to(torch.int64)
    recv = exchange_counts(env, counts.view(-1, 1), "epoch row requests (sizes)").reshape(-1)
    payload = exchange_payload(
        env, pack_i64(u), [2 * int(c) for c in counts.tolist()],
        [2 * int(c) for c in recv.tolist()], "epoch row requests",
    )  # fmt: skip
    return torch.unique(unpack_i64(payload))


def hold_rows(env: DistEnv, ctx: Any, ids: torch.Tensor) -> int:
    """(Collective, at an epoch start or a window start of the whole-step graph, before
    anything reads ``slot_of`` for its steps) every owned row that this rank's ``ids`` (its
    batches of the window and the batch before it; any shape, negative padding allowed) or a
    peer's touch, and those of every rank's mirrors with pending counts (a due push may wait
    into the window), held resident on this rank's host tier (``ctx.owned``) until the next
    hold (:class:`.tier_windows.EpochWindows` decides the windows). Returns the rows held."""
    store, owned = ctx.store, ctx.owned
    pend = store.stored_ids[store.n_own : store.n_own + store.n_mir][store.pending > 0]
    flat = torch.cat([ids.reshape(-1).to(store.device, torch.int64), pend.to(torch.int64)])
    owner = store.block_of.to(torch.int64) % env.world_size  # (own r, mirror w+o, else 2w+o)
    mine = epoch_requests(env, flat, owner)
    return int(owned.hold_epoch(mine).numel())
