"""What an epoch's steps read and push of each rank's owned rows (issue 33): every rank sends
each owner the distinct ids of that owner's rows among its epoch's batches and its mirrors
with pending counts, so that the owner can hold them all resident on its host tier for the
epoch (:meth:`~.tier_owned.OwnedTier.hold_epoch`) and no step needs a residency decision:
what a whole-step CUDA graph of several ranks needs (docs/host_tier_plan.md, last section)."""

from __future__ import annotations

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
