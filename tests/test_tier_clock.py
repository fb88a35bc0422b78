"""The host tier's eviction order (hetgmp/embedding/tier_clock.py, CLOCK): the vectorized hand
takes the victims a slot-by-slot CLOCK takes, never a guarded slot, and a residency decision
touches tensor elements in proportion to its batch, not to the cache (issue 33: passes over
3.4M cache slots per step cost tens of ms). No timings: the guard counts the elements every
torch op of a decision reads or writes."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from hetgmp.embedding.optim import SparseOptimizer
from hetgmp.embedding.tier_clock import WINDOW, Clock
from hetgmp.embedding.tiered import TieredRows

CPU = torch.device("cpu")


def _by_slot(ref: list[bool], guard: set[int], hand: int, k: int) -> tuple[list[int], int]:
    """CLOCK one slot at a time: take an unreferenced, unguarded slot, else clear its bit."""
    out: list[int] = []
    while len(out) < k:
        s, hand = hand, (hand - 1) % len(ref)
        if not ref[s] and s not in guard and s not in out:
            out.append(s)
        ref[s] = False
    return out, hand


def test_the_vectorized_hand_is_the_slot_by_slot_clock() -> None:
    g = torch.Generator().manual_seed(0)
    for budget in (1, 7, 300, 1000):
        clock = Clock(budget)
        ref, hand = [False] * budget, budget - 1
        for step in range(40):
            used = torch.randint(0, budget, (int(torch.randint(0, budget + 1, (1,))),),
                                 generator=g)  # fmt: skip
            clock.used(used)
            for s in used.tolist():
                ref[s] = True
            guard = torch.randint(0, budget, (step % 5 * budget // 8,), generator=g)
            free = budget - len(set(guard.tolist()))
            k = int(torch.randint(0, free + 1, (1,), generator=g))
            got = clock.victims(k, guard)
            want, hand = _by_slot(ref, set(guard.tolist()), hand, k)
            assert got.tolist() == want, (budget, step)
            assert clock.hand == hand and clock.ref.tolist() == ref
            assert not clock.guard.any()  # (cleared by index after each decision)
            clock.loaded(got)
            for s in want:
                ref[s] = False


def test_guarded_slots_are_never_taken_even_going_round_twice() -> None:
    clock = Clock(600)
    clock.used(torch.arange(600))  # every slot referenced: one full turn clears them all
    guard = torch.arange(0, 600, 2)
    got = clock.victims(300, guard)  # every unguarded slot, after two turns
    assert sorted(got.tolist()) == list(range(1, 600, 2))
    assert clock.scanned <= 2 * 600 + 2 * 300 + WINDOW


class _Touched(TorchDispatchMode):
    """Elements read or written by torch ops: every tensor an op is given or returns, but
    the tensor an indexing op indexes (it touches the indexed elements only: counted by its
    index and values) and views (no data touched)."""

    INDEXED = ("index", "index_put", "index_put_", "_index_put_impl_", "index_select",
               "index_copy_", "index_fill_", "index_add_")  # fmt: skip

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        returns = func._schema.returns
        if any(r.alias_info is not None and not r.alias_info.is_write for r in returns):
            return out  # (a view)
        given = tree_flatten((args, kwargs or {}))[0]
        if func.overloadpacket.__name__ in self.INDEXED:
            given = given[1:]
        if not any(r.alias_info is not None for r in returns):  # (in place: counted as given)
            given += tree_flatten(out)[0]
        self.n += sum(t.numel() for t in given if isinstance(t, torch.Tensor))
        return out


def _touched_per_step(budget: int) -> tuple[float, TieredRows]:
    """Elements touched per one-rank step (expect the next batch, look this one up, stage the
    next, updated) over a table of ``budget + 4000`` rows whose batches draw a skewed head
    and a cold tail from the 4000 rows never resident at first: misses every step."""
    n = budget + 4000
    opt = SparseOptimizer("sgd", 0.1, 1e-10, 0.0, "torch")
    tier = TieredRows(torch.zeros(n, 2), torch.zeros(0), device=CPU, budget=budget, opt=opt)
    g = torch.Generator().manual_seed(1)
    ids = [budget + (torch.rand(64, 3, generator=g) ** 3 * 4000).long() for _ in range(13)]
    for i in range(4):  # (the first misses, then measured)
        tier.lookup(ids[i])
        tier.updated()
    with _Touched() as seen:
        for i in range(4, 12):
            tier.expect(ids[i + 1])
            tier.lookup(ids[i])
            tier.stage_next()
            tier.updated()
    return seen.n / 8, tier


def test_a_decision_touches_elements_in_proportion_to_the_batch_not_the_cache() -> None:
    (small, ts), (large, tl) = (_touched_per_step(b) for b in (1_000, 100_000))
    assert tl.counters.misses > 0 and tl.counters.evictions > 0 and ts.counters.evictions > 0
    # a pass over the cache per decision would add >= 99,000 elements a step at 100k slots
    assert large < 2 * small + 5_000, (small, large)
    for t in (ts, tl):  # the hand's slots: a few per row the decisions moved, plus windows
        c = t.counters
        assert c.scanned <= 4 * (c.misses + c.hits) + 2 * WINDOW * c.batches, c
