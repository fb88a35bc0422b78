"""Several ranks' owned rows held resident for an epoch (issue 33; the pieces of
docs/host_tier_plan.md's last section, not yet wired into the whole-step graph):
``epoch_requests`` gives every owner exactly its rows among every rank's ids, and
``OwnedTier.hold_epoch`` keeps them resident through the epoch's other residency decisions,
writes them back when a later epoch evicts them, and refuses a hold past the cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetgmp.comm.env import DistEnv
from hetgmp.comm.spawn import spawn_ranks
from hetgmp.embedding import DistributedEmbedding
from hetgmp.embedding.tier_epoch import epoch_requests
from hetgmp.embedding.tier_host import CacheBudgetError
from hetgmp.partition.plan import Plan

ROWS = 400


def _owner(world: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(1).integers(0, world, ROWS))


def _ids(rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, ROWS, (37, 3), generator=g)
    ids[::5, 1] = -1  # (padding)
    return ids


def _requests(env: DistEnv) -> list[int]:
    return epoch_requests(env, _ids(env.rank), _owner(env.world_size)).tolist()


def test_every_owner_gets_its_rows_among_every_ranks_ids() -> None:
    world = 3
    got = spawn_ranks(_requests, world, timeout_s=120)
    owner = _owner(world)
    every = torch.cat([_ids(r).reshape(-1) for r in range(world)])
    every = every[every >= 0]
    for r in range(world):
        want = torch.unique(every[owner[every] == r]).tolist()
        assert got[r] == want and want, (r, got[r][:5], want[:5])


def _holds(env: DistEnv) -> dict:
    w = env.world_size
    owner = _owner(w).numpy().astype(np.int32)
    plan = Plan(np.zeros(w * 4, np.int32), owner, [np.zeros(0, np.int64)] * w, {})
    emb = DistributedEmbedding(ROWS, 4, env, plan, optimizer="adagrad", lr=0.1, seed=3,
                               rows_on="host", cache_budget=0.25)  # fmt: skip
    owned, store, tier = emb.owned, emb.store, emb.tier
    assert owned is not None and tier is not None
    mine = torch.from_numpy(np.flatnonzero(owner == env.rank))
    n = tier.budget
    assert not bool((store.slot_of[mine[-n:]] >= 0).any())  # (the cold end: not resident)
    a, b, c = mine[-20:], mine[-n:-20], mine[:n]
    slots = owned.hold_epoch(torch.cat([a, a]))  # (repeats: held once)
    assert slots.numel() == 20 and bool((store.slot_of[a] >= 0).all())
    before = store.slot_of[a].clone()
    with torch.no_grad():  # (a step's update of the held rows, in the cache)
        store.weight_full[before.long()] += 1.0
    moved = store.weight_full[before.long()].clone()
    # (a step's own decision beside the hold: the rest of the cache turns over, the hold stays)
    owned.before_plan(b.view(-1, 1))
    assert any(h is owned.epoch for h in tier._held)  # noqa: SLF001 - the keep list
    assert torch.equal(store.slot_of[a], before) and bool((store.slot_of[b] >= 0).all())
    owned.step_done()
    owned.step_done()  # (nothing else held)
    owned.hold_epoch(c)  # (the whole cache: the last epoch's rows go, written back)
    out = {"evicted": bool((store.slot_of[a] < 0).all())}
    rows = owned.index[a]
    out["written_back"] = torch.equal(tier.host_weight[rows], moved)
    with pytest.raises(CacheBudgetError):
        owned.hold_epoch(mine[: tier.budget + 1])
    return out


def test_a_held_epoch_stays_resident_and_is_written_back_when_evicted() -> None:
    for out in spawn_ranks(_holds, 2, timeout_s=120):
        assert out == {"evicted": True, "written_back": True}, out
