"""The host tier's per-step host helpers (hetgmp/embedding/tier_host.py), which replaced torch
ops on a step's path for speed (issue 33): they give exactly the torch ops' results, and a
decision still deduplicates the protected slots when their plain total leaves no room."""

from __future__ import annotations

import pytest
import torch

from hetgmp.embedding.optim import SparseOptimizer
from hetgmp.embedding.tier_host import CacheBudgetError, distinct_sorted, positions
from hetgmp.embedding.tiered import TieredRows

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "ids",
    [
        torch.empty(0, dtype=torch.int64),
        torch.tensor([7]),
        torch.tensor([3, 3, 3, 3]),
        torch.tensor([[5, -2, 9], [9, 0, -2]]),  # (2-D, negatives: the caller checks them)
        torch.tensor([2**40, 1, 2**40, -(2**50)]),
        torch.randint(0, 1000, (64, 26), generator=torch.Generator().manual_seed(0)),
        torch.randint(0, 2**31, (5000,), dtype=torch.int32),  # (widened to int64)
    ],
)
def test_distinct_sorted_is_torch_unique(ids: torch.Tensor) -> None:
    got = distinct_sorted(ids)
    want = torch.unique(ids.to(torch.int64))
    assert got.dtype == torch.int64 and torch.equal(got, want)
    assert got.data_ptr() != ids.data_ptr() or not ids.numel()  # (never the caller's memory)


def test_distinct_sorted_leaves_the_callers_ids_alone() -> None:
    ids = torch.tensor([4, 1, 4, 0])
    distinct_sorted(ids)
    assert ids.tolist() == [4, 1, 4, 0]


@pytest.mark.parametrize("n", [0, 1, 17, 10_000])
def test_positions_is_nonzero(n: int) -> None:
    mask = torch.rand(n, generator=torch.Generator().manual_seed(n)) < 0.3
    got = positions(mask)
    assert got.dtype == torch.int64
    assert torch.equal(got, torch.nonzero(mask).reshape(-1))


def _tier(budget: int) -> TieredRows:
    opt = SparseOptimizer("sgd", 0.1, 1e-10, 0.0, "torch")
    return TieredRows(torch.zeros(100, 2), torch.zeros(0), device=CPU, budget=budget, opt=opt)


def test_repeated_held_slots_count_once_when_room_is_tight() -> None:
    """Held slot lists overlap (a batch looked up three times, never updated): 9 held entries,
    3 distinct slots. 7 more rows fit a 10-slot cache only when the held slots are counted
    distinct; 8 do not (the quick bound, their total, would refuse both)."""
    tier = _tier(10)
    batch = torch.tensor([50, 51, 52])
    for _ in range(3):
        tier.lookup(batch)
    assert sum(int(h.numel()) for h in tier._held) == 9
    with pytest.raises(CacheBudgetError):
        tier.prefetch(torch.arange(60, 68))
    assert tier.counters.misses == 3  # (the refusal changed nothing)
    slots = tier.prefetch(torch.arange(60, 67))
    resident = set(tier.resident().tolist())
    assert {50, 51, 52} <= resident and set(range(60, 67)) <= resident
    assert sorted(tier.resident()[slots].tolist()) == list(range(60, 67))
